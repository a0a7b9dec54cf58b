"""A read-only S3-compatible server over a directory, for benchmarks that measure the client's CPU.

moto copies a whole object into memory for every GET, ranged or not, and spends more CPU per
byte than the client it serves; this server sends object bodies from the page cache with
``os.sendfile`` (through ``socket.sendfile``: zero copy, no byte passes through Python), so that
what a benchmark measures is the client's cost.

It answers, path-style, ``/<bucket>/<key>`` from ``<directory>/<key>`` (the layout of a
``FileObjectStore`` rooted at ``<directory>/<prefix>`` when the client is an ``S3ObjectStore``
with that prefix): GET (one range ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n``: 206 with
Content-Range; an unsatisfiable one: 416 InvalidRange) and HEAD, with ETag (of the file's size,
modification time and inode, as nginx's: no byte is hashed), Content-Length and Last-Modified,
and ``If-Match`` (412 PreconditionFailed when it names another ETag). A missing key is 404
NoSuchKey, another bucket 404 NoSuchBucket; files whose name starts with ``.`` (a
``FileObjectStore``'s temporary files) are no objects. Every other request (LIST, PUT, DELETE)
is 501 NotImplemented: a streamed read of a published cache sends none. Signatures are not
checked.

``StaticS3(directory, bucket)`` runs the server in a process of its own (``ThreadingHTTPServer``
on a free port of 127.0.0.1) and gives its ``url`` and ``pid``; ``stop()`` (or leaving a ``with``
block) ends it. With ``log=PATH`` the server appends one line per request, ``METHOD KEY RANGE
IF-MATCH STATUS``, which ``requests()`` reads back.

Run alone: ``.venv/bin/python benchmarks/_static_s3.py DIRECTORY BUCKET [--port 0] [--log PATH]``
(prints its URL, serves until interrupted).
"""

from __future__ import annotations

import argparse
import email.utils
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Optional
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape


class ObjectHandler(BaseHTTPRequestHandler):
    """GET and HEAD of the objects of one bucket (see the module docstring)."""

    protocol_version = "HTTP/1.1"  # keep-alive: a client's connection serves request after request
    server: ObjectServer

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_PUT(self) -> None:
        self._refuse()

    def do_POST(self) -> None:
        self._refuse()

    def do_DELETE(self) -> None:
        self._refuse()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass  # one line per request goes to the request log, when there is one

    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self._error(501, "NotImplemented", "this benchmark server only reads objects")

    def _answer(self, body: bool) -> None:
        url = urlsplit(self.path)
        bucket, _, key = unquote(url.path).lstrip("/").partition("/")
        if bucket != self.server.bucket:
            self._error(404, "NoSuchBucket", f"no bucket {bucket!r}", body=body)
            return
        asked_for = set(parse_qs(url.query, keep_blank_values=True)) - {"x-id"}  # x-id: botocore's name of the call
        if not key or asked_for:  # the bucket itself (a LIST), or a subresource (versions, tags, uploads)
            self._error(501, "NotImplemented", f"only GET and HEAD of objects: {self.path}", body=body)
            return
        path = self.server.object_path(key)
        try:
            handle = open(path, "rb") if path is not None else None
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            handle = None
        if handle is None:
            self._error(404, "NoSuchKey", f"no object {key!r}", key=key, body=body)
            return
        with handle:
            self._send_object(handle, key, body)

    def _send_object(self, handle: IO[bytes], key: str, body: bool) -> None:
        stat = os.fstat(handle.fileno())
        size = stat.st_size
        etag = f'"{stat.st_mtime_ns:x}-{size:x}-{stat.st_ino:x}"'
        wanted = self.headers.get("If-Match")
        if wanted is not None and wanted.strip() not in ("*", etag):
            self._error(412, "PreconditionFailed", f"{key!r} has ETag {etag}, not {wanted}", key=key, body=body)
            return
        status, start, stop = 200, 0, size
        asked = self.headers.get("Range")
        if asked is not None:
            span = parse_range(asked, size)
            if span is None:
                self._error(416, "InvalidRange", f"range {asked!r} of {size} bytes", key=key, body=body)
                return
            status, (start, stop) = 206, span
        self.send_response(status)
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(stat.st_mtime, usegmt=True))
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.end_headers()
        self.server.record(self.command, key, asked, wanted, status)
        if body and stop > start:
            self.connection.sendfile(handle, start, stop - start)  # os.sendfile: page cache to socket

    def _error(self, status: int, code: str, message: str, *, key: str = "", body: bool = True) -> None:
        text = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{escape(message)}</Message>'
            f"<Key>{escape(key)}</Key><BucketName>{escape(self.server.bucket)}</BucketName></Error>"
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.server.record(
            self.command, key or self.path, self.headers.get("Range"), self.headers.get("If-Match"), status
        )
        if body:
            self.wfile.write(text)


def parse_range(header: str, size: int) -> Optional[tuple[int, int]]:
    """The byte span ``[start, stop)`` that one HTTP range (``bytes=a-b``, ``bytes=a-``,
    ``bytes=-n``) asks of an object of ``size`` bytes, its end clamped to the object's as S3 does;
    None when it is malformed, holds several ranges, or starts past the end (416)."""
    unit, _, spec = header.strip().partition("=")
    first, dash, last = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec:
        return None
    try:
        if not first:  # the last n bytes
            count = int(last)
            return (max(0, size - count), size) if 0 < count and size else None
        start = int(first)
        stop = size if not last else min(size, int(last) + 1)
    except ValueError:
        return None
    return (start, stop) if 0 <= start < stop else None


class ObjectServer(ThreadingHTTPServer):
    """The bucket ``bucket`` over ``directory``, one thread per connection."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], directory: Path, bucket: str, log: Optional[Path]) -> None:
        super().__init__(address, ObjectHandler)
        self.directory = directory.resolve()
        self.bucket = bucket
        self._log = open(log, "a", buffering=1) if log is not None else None
        self._log_lock = threading.Lock()

    def object_path(self, key: str) -> Optional[Path]:
        """The file of ``key``; None for a key that leaves the directory or names a hidden file."""
        names = key.split("/")
        if any(name in ("", ".", "..") or name.startswith(".") for name in names):
            return None
        return self.directory.joinpath(*names)

    def record(self, method: str, key: str, asked: Optional[str], pin: Optional[str], status: int) -> None:
        """Logs one request: ``METHOD KEY RANGE IF-MATCH STATUS`` (``-`` for a header not sent)."""
        if self._log is not None:
            shown = [(value or "-").replace(" ", "") for value in (asked, pin)]
            with self._log_lock:
                self._log.write(f"{method} {key} {shown[0]} {shown[1]} {status}\n")


class StaticS3:
    """The server in a process of its own, on a free port of 127.0.0.1."""

    def __init__(self, directory: Path | str, bucket: str, *, log: Optional[Path | str] = None) -> None:
        self.log = Path(log) if log is not None else None
        command = [sys.executable, str(Path(__file__).resolve()), str(directory), bucket]
        if self.log is not None:
            self.log.touch()
            command += ["--log", str(self.log)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()  # the URL, once it listens
        if not line.startswith("http://"):
            self.process.kill()
            raise RuntimeError(f"the static S3 server did not start (exit status {self.process.wait()})")
        self.url = line

    @property
    def pid(self) -> int:
        return self.process.pid

    def requests(self) -> list[str]:
        """The request log's lines so far (empty without a log)."""
        return self.log.read_text().splitlines() if self.log is not None else []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()

    def __enter__(self) -> StaticS3:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directory", type=Path, help="the bucket's directory: key K is the file DIRECTORY/K")
    parser.add_argument("bucket", help="the bucket's name (path-style: /BUCKET/KEY)")
    parser.add_argument("--port", type=int, default=0, help="port of 127.0.0.1 (default: a free one)")
    parser.add_argument("--log", type=Path, help="append one line per request to this file")
    args = parser.parse_args()
    server = ObjectServer(("127.0.0.1", args.port), args.directory, args.bucket, args.log)
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
