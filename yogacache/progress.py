"""Progress of long builds and transfers: a live line on a terminal, periodic log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import Optional, TextIO

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

    def update(self, records: int, size: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r" + self._line(records, size) + "\x1b[K")
            self.stream.flush()
            self._shown = True
        else:
            log.info("building %s", self._line(records, size))

    def finish(self, records: int, size: int) -> None:
        if not self.enabled:
            return
        if self.tty:
            if self._shown:
                self.stream.write("\r" + self._line(records, size) + "\x1b[K\n")
                self.stream.flush()
        else:
            log.info("built %s", self._line(records, size))
