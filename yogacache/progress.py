"""Progress of long builds and transfers: a live line on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Callable, Optional, TextIO

log = logging.getLogger("yogacache.progress")


def format_bytes(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover


class Progress:
    """Reports records, bytes and rate of a build, throttled to a few updates per second."""

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        stream: Optional[TextIO] = None,
        interval: Optional[float] = None,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = interval if interval is not None else (0.5 if self.tty else 10.0)
        self.start = time.monotonic()
        self._last = self.start
        self._shown = False

    def _line(self, records: int, size: int) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        return (
            f"{self.label}: {records:,} records, {format_bytes(size)} "
            f"({records / elapsed:,.0f} records/s, {format_bytes(size / elapsed)}/s)"
        )

    def emit(self, line: Callable[[], str], final: bool = False, log_prefix: str = "") -> None:
        """Shows ``line()`` (a live line on a terminal, a log line otherwise), at most once per
        interval; ``final`` ends the live line."""
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return
        self._last = now
        if self.tty:
            if final and not self._shown:
                return
            self.stream.write("\r" + line() + "\x1b[K" + ("\n" if final else ""))
            self.stream.flush()
            self._shown = True
        else:
            log.info("%s%s", log_prefix, line())

    def update(self, records: int, size: int) -> None:
        self.emit(lambda: self._line(records, size), log_prefix="building ")

    def finish(self, records: int, size: int) -> None:
        self.emit(lambda: self._line(records, size), final=True, log_prefix="built ")


class TransferProgress:
    """Bytes, rate and ETA of an upload or download; safe to update from transfer threads."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream: Optional[TextIO] = None) -> None:
        import threading

        self.label = label
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self._progress = Progress(label, enabled=enabled, stream=stream)

    def _line(self) -> str:
        elapsed = max(time.monotonic() - self._progress.start, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_text = f"{eta:.0f} s" if eta != float("inf") else "?"
        return (
            f"{self.label}: {format_bytes(self.done)} of {format_bytes(self.total)} "
            f"({format_bytes(rate)}/s, ETA {eta_text})"
        )

    def add(self, count: int) -> None:
        with self._lock:
            self.done += count
            self._progress.emit(self._line)

    def finish(self) -> None:
        with self._lock:
            self._progress.emit(self._line, final=True)
