"""Progress of long builds and transfers: a live line on a terminal, periodic log lines otherwise.

On a terminal the line is drawn by ``rich`` (it sizes the line to the terminal, so updates never
wrap); rich is imported only when a live line is shown. Off a terminal (CI, pipes, a notebook's
log) progress is a human-readable line every ``interval`` seconds on the ``yogacache.progress``
logger; when the program has not configured logging at all, the lines go to stderr, so a long
build is never silent by default. Sizes are always human (``1.2 GiB``), never raw byte counts.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional, TextIO

log = logging.getLogger("yogacache.progress")

_ACTIVE: weakref.WeakSet[Progress] = weakref.WeakSet()  # every progress shown, for mute_all/close_all


def format_bytes(count: float) -> str:
    """``1.2 GiB``: binary units, one decimal (whole bytes below 1 KiB)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"  # pragma: no cover


def format_duration(seconds: float) -> str:
    """``45 s``, ``3 min 05 s``, ``2 h 07 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds + 0.5), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def say(line: str) -> None:
    """One progress-like message (a log line, or a stderr line when logging is not configured).

    Where the program configured logging, its handlers and levels decide (the lines are INFO
    records of ``yogacache.progress``); where it configured nothing, the line goes to stderr.
    """
    if log.hasHandlers():
        log.info("%s", line)
    else:
        print(f"yogacache: {line}", file=sys.stderr, flush=True)


def waiting(
    what: str,
    owner: Optional[str] = None,
    *,
    pid: Optional[int] = None,
    host: Optional[str] = None,
    doing: str = "building",
) -> str:
    """Says that this process waits for another one's build of ``what`` (``ID:VERSION``).

    ``owner`` is ``HOST:PID`` (what build leases record); ``pid``/``host`` may be given instead.
    Returns the line said: ``waiting for pid N on HOST building ID:VERSION`` (``doing`` may say
    ``downloading`` instead).
    """
    if owner and (pid is None or host is None):
        owner_host, _, owner_pid = owner.rpartition(":")
        if owner_pid.isdigit():
            pid = int(owner_pid) if pid is None else pid
            host = (owner_host or None) if host is None else host
        elif host is None:
            host = owner
    if pid is None and host is None:
        line = f"waiting for another process {doing} {what}"
    elif pid is None:
        line = f"waiting for {host} {doing} {what}"
    else:
        where = host or socket.gethostname()
        line = f"waiting for pid {pid} on {where} {doing} {what}"
    say(line)
    return line


def waiter(dataset_id: str, dataset_version: str, doing: str = "building") -> Callable[[Optional[str]], None]:
    """A lock's ``on_wait``: ``waiter(id, version)(holder)`` says whom this process waits for."""

    def say_waiting(holder: Optional[str]) -> None:
        waiting(f"{dataset_id}:{dataset_version}", holder, doing=doing)

    return say_waiting


def mute_all() -> None:
    """Silences every progress display at once (safe in a signal handler: it only sets flags),
    so that transfers winding down after Ctrl-C print nothing more."""
    for progress in list(_ACTIVE):
        progress.muted = True


def close_all() -> None:
    """Silences every progress display and ends live terminal lines (before printing a message
    after Ctrl-C or an error)."""
    mute_all()
    for progress in list(_ACTIVE):
        progress.close()


class Progress:
    """Reports records, bytes and rate of a build (and %, ETA when ``total`` records are known),
    throttled to a few updates per second on a terminal, one line per ``interval`` otherwise."""

    def __init__(
        self,
        label: str,
        *,
        enabled: bool = True,
        stream: Optional[TextIO] = None,
        interval: Optional[float] = None,
        total: Optional[int] = None,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.total = total if total is not None and total > 0 else None
        self.tty = enabled and _is_terminal(self.stream)
        self.interval = interval if interval is not None else (0.2 if self.tty else 10.0)
        self.start = time.monotonic()
        self._last = self.start
        self._live: Any = None  # the rich Progress drawing the line, once shown
        self._task: Any = None
        self._closed = False
        self._said = False  # a log line was emitted
        self.muted = False  # set by mute_all(): nothing more is shown
        if enabled:
            _ACTIVE.add(self)

    # -- what is shown ----------------------------------------------------------------------
    def _rate_and_eta(self, done: float, total: Optional[float]) -> tuple[float, Optional[float]]:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed
        if total is None or rate <= 0 or done >= total:
            return rate, None
        return rate, (total - done) / rate

    def _line(self, records: int, size: int, short: bool = False) -> str:
        rate, eta = self._rate_and_eta(records, self.total)
        elapsed = max(time.monotonic() - self.start, 1e-9)
        eta_text = f"ETA {format_duration(eta)}" if eta is not None else ""
        if short:  # the live line: what matters first, so a narrow terminal cuts the least useful
            if self.total is None:
                return f"{records:,} records, {format_bytes(size)}, {records / elapsed:,.0f}/s"
            percent = f"{100 * records / self.total:.0f}%"
            return ", ".join(filter(None, [percent, eta_text, f"{records:,}/{self.total:,}"]))
        if self.total is None:
            count = f"{records:,} records"
        else:
            count = f"{records:,} of {self.total:,} records ({100 * records / self.total:.0f}%)"
        text = f"{count}, {format_bytes(size)} ({records / elapsed:,.0f} records/s, {format_bytes(size / elapsed)}/s"
        return text + (f", {eta_text})" if eta_text else ")")

    def _finish_line(self, records: int, size: int, short: bool = False) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        if short:
            return f"{records:,} records, {format_bytes(size)} in {format_duration(elapsed)}"
        return (
            f"{records:,} records, {format_bytes(size)} in {format_duration(elapsed)} "
            f"({records / elapsed:,.0f} records/s, {format_bytes(size / elapsed)}/s)"
        )

    # -- showing it -------------------------------------------------------------------------
    def emit(
        self,
        line: Callable[..., str],
        final: bool = False,
        log_prefix: str = "",
        completed: Optional[float] = None,
        total: Optional[float] = None,
    ) -> None:
        """Shows ``line()`` (a live line on a terminal, a log line otherwise), at most once per
        interval; ``final`` ends the live line. On a terminal the line is ``line(short=True)``
        when ``line`` takes that argument, and ``completed``/``total`` draw a bar."""
        if not self.enabled or self._closed or self.muted:
            return
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return
        self._last = now
        if self.tty:
            if final and self._live is None:
                return
            try:
                text = line(short=True)
            except TypeError:
                text = line()
            self._draw(text, completed, total, final, log_prefix)
            if final:
                self.close()
        else:
            if final and not self._said and not log.hasHandlers() and now - self.start < self.interval:
                return  # logging not configured: a quick build or transfer stays quiet
            self._said = True
            say(f"{log_prefix}{self.label}: {line()}")

    def _draw(
        self, text: str, completed: Optional[float], total: Optional[float], final: bool = False, prefix: str = ""
    ) -> None:
        description = f"{prefix}{self.label}"
        if self._live is None:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn
            from rich.progress import Progress as RichProgress
            from rich.table import Column

            console = Console(file=self.stream, highlight=False)
            self._live = RichProgress(
                TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=40)),
                BarColumn(bar_width=10),
                TextColumn("{task.fields[text]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
                console=console,
                auto_refresh=False,  # no drawing thread: every update draws, throttled above
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._task = self._live.add_task(description, total=total, completed=completed or 0, text=text)
            self._live.start()  # draws the first line
            return
        self._live.update(self._task, description=description, total=total, completed=completed or 0, text=text)
        if not final:
            self._live.refresh()  # a final line is drawn by close()

    def close(self) -> None:
        """Ends the live line (idempotent); later updates are ignored."""
        self._closed = True
        live, self._live = self._live, None
        if live is not None:
            live.stop()
        _ACTIVE.discard(self)

    def update(self, records: int, size: int) -> None:
        self.emit(
            lambda short=False: self._line(records, size, short),
            log_prefix="building ",
            completed=records,
            total=self.total,
        )

    def finish(self, records: int, size: int) -> None:
        self.emit(
            lambda short=False: self._finish_line(records, size, short),
            final=True,
            log_prefix="built ",
            completed=records,
            total=self.total or records,
        )


class TransferProgress:
    """Bytes, rate and ETA of an upload or download; safe to update from transfer threads.

    When every byte has been handed over but the transfer has not finished (an upload waiting
    for the store to confirm it), it says "finishing" rather than "ETA 0 s".
    """

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream: Optional[TextIO] = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self._lock = threading.Lock()
        self._progress = Progress(label, enabled=enabled, stream=stream)

    def _line(self, short: bool = False) -> str:
        rate, eta = self._progress._rate_and_eta(self.done, self.total)
        done, total = format_bytes(self.done), format_bytes(self.total)
        if self.done >= self.total:
            waited = format_duration(time.monotonic() - self._progress.start)
            if short:
                return f"finishing ({waited})"
            return f"{done} of {total} transferred, finishing ({waited})"
        eta_text = format_duration(eta) if eta is not None else "?"
        if short:  # the bar shows how far; the final line the size
            return f"{100 * self.done / max(self.total, 1):.0f}%, ETA {eta_text}, {format_bytes(rate)}/s"
        return f"{done} of {total} ({format_bytes(rate)}/s, ETA {eta_text})"

    def _finish_line(self, short: bool = False) -> str:
        elapsed = max(time.monotonic() - self._progress.start, 1e-9)
        if short:
            return f"{format_bytes(self.done)} in {format_duration(elapsed)}"
        return (
            f"{format_bytes(self.done)} of {format_bytes(self.total)} in {format_duration(elapsed)} "
            f"({format_bytes(self.done / elapsed)}/s, done)"
        )

    def add(self, count: int) -> None:
        with self._lock:
            was_short = self.done < self.total
            self.done += count
            if was_short and self.done >= self.total:
                self._progress._last = 0.0  # say "finishing" now, not an interval later
            self._progress.emit(self._line, completed=self.done, total=self.total)

    def finish(self) -> None:
        with self._lock:
            self._progress.emit(self._finish_line, final=True, completed=self.done, total=self.total)

    def close(self) -> None:
        """Ends the live line without a final report (the transfer failed or was cancelled)."""
        with self._lock:
            self._progress.close()


def _is_terminal(stream: Any) -> bool:
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
