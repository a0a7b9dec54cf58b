"""A bandwidth-limited, byte-counting HTTP/1.1 reverse proxy for ``bench_stream.py``.

``ThrottleProxy(upstream, bytes_per_second)`` listens on 127.0.0.1 and forwards every request to
the upstream server (moto's S3 server), streaming response bodies in 256 KiB chunks paced on one
shared timeline, so that all connections together get at most ``bytes_per_second``: a node's
network link. A chunk occupies the link for ``size / bytes_per_second`` from the start of its
slot, and is handed to the client's socket at that start, so that the proxy's own work on the
next chunk overlaps the transmission, as a network card's does. (Sleeping until the slot's end
before sending, in 64 KiB chunks, added the proxy's Python time to every chunk's: one connection
got about 90 MB/s of a 200 MB/s link, four together about 170.) It records ``(time, body
bytes)`` for every chunk sent, so that a benchmark can count the bytes a reader fetched between
two instants. Standard library only.
"""

from __future__ import annotations

import bisect
import http.client
import socket
import threading
import time
from typing import BinaryIO, Optional
from urllib.parse import urlsplit

CHUNK = 256 << 10
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "upgrade", "te", "transfer-encoding"}


class ThrottleProxy:
    """See the module docstring."""

    def __init__(self, upstream_url: str, bytes_per_second: float) -> None:
        parts = urlsplit(upstream_url)
        assert parts.hostname is not None and parts.port is not None
        self.upstream = (parts.hostname, parts.port)
        self.rate = float(bytes_per_second)
        self._lock = threading.Lock()
        self._timeline = 0.0  # when the link is free again (monotonic)
        self._times: list[float] = []  # wall-clock time of each chunk sent
        self._totals: list[int] = []  # cumulative body bytes after each chunk
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    # -- counting ---------------------------------------------------------------------------
    def bytes_between(self, start: float, end: float) -> int:
        """Body bytes sent between wall-clock instants ``start`` and ``end``."""
        with self._lock:
            def total_at(moment: float) -> int:
                i = bisect.bisect_right(self._times, moment)
                return self._totals[i - 1] if i else 0

            return total_at(end) - total_at(start)

    def total(self) -> int:
        with self._lock:
            return self._totals[-1] if self._totals else 0

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._listener.close()
        except OSError:
            pass

    # -- serving ----------------------------------------------------------------------------
    def _pace(self, size: int) -> None:
        """Waits for the start of the next free slot of ``size`` bytes on the link."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._timeline)
            self._timeline = start + size / self.rate
            wait = start - now
        if wait > 0:
            time.sleep(wait)

    def _count(self, size: int) -> None:
        with self._lock:
            self._times.append(time.time())
            self._totals.append((self._totals[-1] if self._totals else 0) + size)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while self._serve_one(conn, reader):
                pass
        except (OSError, http.client.HTTPException, ValueError):
            pass
        finally:
            try:
                reader.close()
                conn.close()
            except OSError:
                pass

    def _serve_one(self, conn: socket.socket, reader: BinaryIO) -> bool:
        line = reader.readline(65537)
        if not line:
            return False
        method, target, _ = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        headers = []
        while True:
            header = reader.readline(65537)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        lower = {name.lower(): value for name, value in headers}
        if lower.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        length = int(lower.get("content-length", "0") or 0)
        body = reader.read(length) if length else b""
        upstream = http.client.HTTPConnection(*self.upstream, timeout=300)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP | {"expect"}:
                    upstream.putheader(name, value)
            upstream.putheader("Connection", "close")
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            size: Optional[str] = response.getheader("Content-Length")
            data = None
            if size is None and method != "HEAD":
                data = response.read()
                size = str(len(data))
            head = [f"HTTP/1.1 {response.status} {response.reason}"]
            head += [f"{n}: {v}" for n, v in response.getheaders() if n.lower() not in _HOP_BY_HOP | {"content-length"}]
            if size is not None:
                head.append(f"Content-Length: {size}")
            conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if method == "HEAD":
                return True
            if data is not None:
                chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
                for chunk in chunks:
                    self._pace(len(chunk))
                    conn.sendall(chunk)
                    self._count(len(chunk))
                return True
            buffer = memoryview(bytearray(CHUNK))
            while True:
                got = response.readinto(buffer)
                if not got:
                    return True
                self._pace(got)
                conn.sendall(buffer[:got])
                self._count(got)
        finally:
            upstream.close()
