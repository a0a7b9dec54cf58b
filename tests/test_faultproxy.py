"""The fault proxy itself: a request is in its log before the client sees the response.

The remote fault tests count the proxy's log right after the client returns (for example
``RetryPolicy(attempts=3)`` makes exactly 3 requests). If the proxy recorded after responding, a
loaded machine could run the test's assertion between the response and the record. A proxy whose
bookkeeping is slow makes that race certain, so these tests fail whenever recording comes second.
"""

from __future__ import annotations

import http.client
import http.server
import threading
import time
from typing import Iterator, Optional

import pytest

from tests.faultproxy import FaultProxy


class _SlowBookkeepingProxy(FaultProxy):
    """Takes its time to record: any response sent before the record is seen before it."""

    def _record(self, method: str, target: str, action: str, status: Optional[int], size: int = 0) -> None:
        time.sleep(0.5)
        super()._record(method, target, action, status, size)


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        body = b"upstream says hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def upstream() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _get(proxy: FaultProxy, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_injected_status_is_logged_before_the_response(upstream: str) -> None:
    with _SlowBookkeepingProxy(upstream) as proxy:
        proxy.add_rule(action="status", status=500, path_contains="manifest")
        for attempt in range(1, 4):
            status, _ = _get(proxy, "/bucket/manifest.json")
            assert status == 500
            # No waiting: the client has its answer, so the proxy has its record.
            assert len(proxy.requests("GET", "manifest.json", action="status")) == attempt


def test_forwarded_and_truncated_requests_are_logged_before_the_response(upstream: str) -> None:
    with _SlowBookkeepingProxy(upstream) as proxy:
        status, body = _get(proxy, "/plain")
        assert (status, body) == (200, b"upstream says hello")
        assert [(e.action, e.status) for e in proxy.requests("GET", "/plain")] == [("forwarded", 200)]

        proxy.add_rule(action="truncate", path_contains="/cut", after_bytes=3, times=1)
        with pytest.raises(http.client.IncompleteRead):
            _get(proxy, "/cut")
        assert [(e.action, e.status) for e in proxy.requests("GET", "/cut")] == [("truncate", 200)]
