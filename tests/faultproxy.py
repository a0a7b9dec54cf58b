"""A small fault-injecting HTTP/1.1 reverse proxy for the remote-storage fault tests.

``FaultProxy(upstream_url)`` listens on a free port of 127.0.0.1 and forwards every request to
the upstream server (moto's S3 server, fake-gcs-server) unchanged -- except where a rule says
otherwise. Rules match a method and/or a substring of the request target and act on the first
``times`` matching requests (or on all of them):

- ``status``: answer with that HTTP status and an S3-style XML error body (or a given body);
  the request never reaches the upstream server.
- ``delay``: wait ``seconds`` before forwarding. If the client hangs up meanwhile (it timed out,
  or was SIGKILLed) the request is dropped, never forwarded: a dead client's request does not
  land late.
- ``truncate``: forward, then send the upstream status and headers (with the full
  Content-Length) but only the first ``after_bytes`` bytes of the body, and close.
- ``reset``: close the client's connection with SO_LINGER 0 (a TCP RST) without forwarding.

Every request is recorded in ``proxy.log`` (method, target, what was done, status sent) *before*
the response goes out, so a client that has seen a response always finds its request in the log
(recording after sending raced the client's next step under load).
Standard library only; one thread per client connection, one upstream connection per request.
"""

from __future__ import annotations

import http.client
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Optional
from urllib.parse import urlsplit

ACTIONS = ("status", "delay", "truncate", "reset")
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "expect", "upgrade", "te"}
_S3_CODES = {
    400: "BadRequest",
    403: "AccessDenied",
    404: "NoSuchKey",
    409: "Conflict",
    412: "PreconditionFailed",
    429: "SlowDown",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}


def s3_error_body(status: int) -> bytes:
    code = _S3_CODES.get(status, "InjectedFault")
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>injected by faultproxy</Message>"
        "<RequestId>faultproxy</RequestId></Error>"
    ).encode()


def gcs_error_body(status: int) -> bytes:
    """A JSON API error body, as GCS sends it."""
    return (
        f'{{"error": {{"code": {status}, "message": "injected by faultproxy", '
        f'"errors": [{{"message": "injected by faultproxy", "reason": "injected"}}]}}}}'
    ).encode()


@dataclass
class Rule:
    """One fault: which requests it matches, what it does, and how often it has fired."""

    action: str
    method: Optional[str] = None
    path_contains: Optional[str] = None
    times: Optional[int] = None  # None: every matching request
    status: int = 500
    body: Optional[bytes] = None
    content_type: str = "application/xml"
    seconds: float = 0.0
    after_bytes: int = 0
    hits: int = 0

    def matches(self, method: str, target: str) -> bool:
        if self.method is not None and method.upper() != self.method.upper():
            return False
        if self.path_contains is not None and self.path_contains not in target:
            return False
        return self.times is None or self.hits < self.times


@dataclass(frozen=True)
class Logged:
    """One request the proxy saw: ``action`` is ``forwarded`` or the rule's action."""

    method: str
    target: str
    action: str
    status: Optional[int]  # the status sent to the client; None for resets and dropped requests
    time: float
    size: int = 0  # bytes of the response body sent (forwarded responses)


class _ClientGone(Exception):
    pass


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1 with programmable faults; see the module doc."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, not {upstream_url!r}")
        self.upstream_host = parts.hostname
        self.upstream_port = parts.port
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: list[Logged] = []
        self._clients: set[socket.socket] = set()
        self.body_bytes_in = 0  # request body bytes received from clients
        self.body_bytes_out = 0  # response body bytes forwarded to clients
        self._forwarded_bytes: list[tuple[str, int]] = []  # (target, request + response body bytes)
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._acceptor = threading.Thread(target=self._accept_loop, name="faultproxy-accept", daemon=True)
        self._acceptor.start()

    # -- control --------------------------------------------------------------------------
    def add_rule(
        self,
        *,
        action: str,
        method: Optional[str] = None,
        path_contains: Optional[str] = None,
        times: Optional[int] = None,
        status: int = 500,
        body: Optional[bytes] = None,
        content_type: str = "application/xml",
        seconds: float = 0.0,
        after_bytes: int = 0,
    ) -> Rule:
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}; one of {ACTIONS}")
        rule = Rule(
            action=action,
            method=method,
            path_contains=path_contains,
            times=times,
            status=status,
            body=body,
            content_type=content_type,
            seconds=seconds,
            after_bytes=after_bytes,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def body_bytes(self, path_contains: Optional[str] = None) -> int:
        """Request and response body bytes that passed through the proxy (both directions): of
        every request, or of the forwarded requests whose target contains ``path_contains``."""
        with self._lock:
            if path_contains is None:
                return self.body_bytes_in + self.body_bytes_out
            return sum(count for target, count in self._forwarded_bytes if path_contains in target)

    def clear_body_bytes(self) -> None:
        with self._lock:
            self.body_bytes_in = self.body_bytes_out = 0
            self._forwarded_bytes.clear()

    @property
    def log(self) -> list[Logged]:
        with self._lock:
            return list(self._log)

    def requests(
        self, method: Optional[str] = None, path_contains: Optional[str] = None, action: Optional[str] = None
    ) -> list[Logged]:
        """The logged requests matching all the given filters."""
        return [
            entry
            for entry in self.log
            if (method is None or entry.method == method.upper())
            and (path_contains is None or path_contains in entry.target)
            and (action is None or entry.action == action)
        ]

    def bytes_sent(self, method: Optional[str] = None, path_contains: Optional[str] = None) -> int:
        """Response body bytes forwarded to clients for the matching requests."""
        return sum(entry.size for entry in self.requests(method, path_contains))

    def stop(self) -> None:
        """Stops accepting, cuts every open connection and wakes delayed requests (idempotent)."""
        self._stopping.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        except OSError:
            pass
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            clients = list(self._clients)
        for conn in clients:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving --------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._clients.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="faultproxy-conn", daemon=True).start()

    def _record(self, method: str, target: str, action: str, status: Optional[int], size: int = 0) -> None:
        with self._lock:
            self._log.append(Logged(method, target, action, status, time.time(), size))

    def _match(self, method: str, target: str) -> Optional[Rule]:
        with self._lock:
            for rule in self._rules:
                if rule.matches(method, target):
                    rule.hits += 1
                    return rule
        return None

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(120)
        reader = conn.makefile("rb")
        try:
            while not self._stopping.is_set():
                if not self._serve_one(conn, reader):
                    break
        except (OSError, ValueError, _ClientGone, http.client.HTTPException):
            pass
        finally:
            with self._lock:
                self._clients.discard(conn)
            try:
                reader.close()
                conn.close()
            except OSError:
                pass

    def _serve_one(self, conn: socket.socket, reader: BinaryIO) -> bool:
        """Serves one request; False when the connection is to be closed."""
        line = reader.readline(65537)
        while line in (b"\r\n", b"\n"):
            line = reader.readline(65537)
        if not line:
            return False
        method, target, _version = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        headers: list[tuple[str, str]] = []
        while True:
            header = reader.readline(65537)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        lower = {name.lower(): value for name, value in headers}
        if lower.get("expect", "").lower() == "100-continue":
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self._read_body(reader, lower)
        with self._lock:
            self.body_bytes_in += len(body)
        keep_alive = lower.get("connection", "").lower() != "close"

        rule = self._match(method, target)
        if rule is not None and rule.action == "reset":
            self._record(method, target, "reset", None)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
            return False
        if rule is not None and rule.action == "status":
            payload = rule.body if rule.body is not None else s3_error_body(rule.status)
            self._record(method, target, "status", rule.status)
            self._send(
                conn,
                method,
                rule.status,
                http.client.responses.get(rule.status, "Injected"),
                [("Content-Type", rule.content_type), ("Content-Length", str(len(payload)))],
                payload,
            )
            return keep_alive
        if rule is not None and rule.action == "delay":
            if not self._wait_or_client_gone(conn, rule.seconds):
                self._record(method, target, "delay-dropped", None)
                return False

        status, reason, response_headers, data = self._forward(method, target, headers, body)
        if rule is not None and rule.action == "truncate":
            cut = data[: rule.after_bytes]
            self._record(method, target, "truncate", status)
            self._send(conn, method, status, reason, response_headers, cut)
            conn.shutdown(socket.SHUT_RDWR)
            return False
        sent = 0 if method.upper() == "HEAD" else len(data)
        self._record(method, target, "delay" if rule is not None else "forwarded", status, len(data))
        with self._lock:
            self.body_bytes_out += sent
            self._forwarded_bytes.append((target, len(body) + sent))
        self._send(conn, method, status, reason, response_headers, data)
        return keep_alive

    @staticmethod
    def _read_body(reader: BinaryIO, lower: dict[str, str]) -> bytes:
        """The request body exactly as sent (chunked bodies stay chunked)."""
        if "chunked" in lower.get("transfer-encoding", "").lower():
            raw = bytearray()
            while True:
                size_line = reader.readline(65537)
                if not size_line:
                    raise _ClientGone()
                raw += size_line
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, then the blank line
                        trailer = reader.readline(65537)
                        if not trailer:
                            raise _ClientGone()
                        raw += trailer
                        if trailer in (b"\r\n", b"\n"):
                            return bytes(raw)
                chunk = reader.read(size + 2)
                if len(chunk) != size + 2:
                    raise _ClientGone()
                raw += chunk
        length = int(lower.get("content-length", "0") or 0)
        data = reader.read(length) if length else b""
        if len(data) != length:
            raise _ClientGone()
        return data

    def _wait_or_client_gone(self, conn: socket.socket, seconds: float) -> bool:
        """Waits ``seconds``; False as soon as the client hangs up (or the proxy stops)."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if self._stopping.is_set():
                return False
            readable, _, _ = select.select([conn], [], [], min(0.05, left))
            if readable:
                try:
                    peeked = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    return False
                if not peeked:
                    return False
                time.sleep(min(0.05, max(0.0, left)))  # pipelined bytes: keep waiting

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        upstream = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in _HOP_BY_HOP:
                    upstream.putheader(name, value)
            upstream.putheader("Connection", "close")
            upstream.endheaders()
            if body:
                upstream.send(body)
            response = upstream.getresponse()
            data = response.read()
            response_headers = [
                (name, value)
                for name, value in response.getheaders()
                if name.lower() not in _HOP_BY_HOP | {"transfer-encoding", "content-length"}
            ]
            if method.upper() == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200:
                length = response.getheader("Content-Length")
                if length is not None:
                    response_headers.append(("Content-Length", length))
            else:
                response_headers.append(("Content-Length", str(len(data))))
            return response.status, response.reason, response_headers, data
        finally:
            upstream.close()

    @staticmethod
    def _send(
        conn: socket.socket,
        method: str,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> None:
        head = [f"HTTP/1.1 {status} {reason}"]
        head += [f"{name}: {value}" for name, value in headers]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        if method.upper() != "HEAD":
            payload += body
        conn.sendall(payload)
