"""Progress of long builds and transfers: a live line on a terminal, periodic log lines otherwise.

On a terminal the line is drawn by ``rich`` (it sizes the line to the terminal, so updates never
wrap); rich is imported only when a live line is shown. Off a terminal (CI, pipes, a notebook's
log) progress is a human-readable line every ``interval`` seconds on the ``yogacache.progress``
logger; when the program has not configured logging at all, the lines go to stderr, so a long
build is never silent by default. Sizes are always human (``1.2 GiB``), never raw byte counts.

A stretch with nothing new to report (an upload waiting on the store, a slow source filling its
first batch) still gets a line every interval: a heartbeat thread repeats the latest one, with
its elapsed time and rate brought up to date. ``$YOGACACHE_PROGRESS_INTERVAL`` sets the interval
of log lines (default 10 s). On a terminal the live line keeps its numbers (percentage, ETA)
whole and shortens the label instead.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable, Optional, TextIO

from yogacache import redaction

log = redaction.get_logger("yogacache.progress")

_ACTIVE: weakref.WeakSet[Progress] = weakref.WeakSet()  # every progress shown, for mute_all/close_all
# One live line at a time: the progress its owner updated last is in front; the one whose line
# it replaced waits (its heartbeat too) until it is updated again. Drawing takes one lock.
_DRAW_LOCK = threading.RLock()
_foremost: Optional[weakref.ref[Progress]] = None
INTERVAL_ENV = "YOGACACHE_PROGRESS_INTERVAL"
LOG_INTERVAL = 10.0  # seconds between log lines off a terminal (README: "a line every 10 s")
LIVE_INTERVAL = 0.2  # seconds between redraws of a live line
_LIVE_HEARTBEAT = 1.0  # a live line standing still is redrawn (elapsed, ETA) this often
_LABEL_MIN = 20  # a live line's label is shortened to no less than this
_BAR_WIDTH = 10


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


def _log_interval() -> float:
    """Seconds between log lines: ``$YOGACACHE_PROGRESS_INTERVAL``, else 10."""
    try:
        return max(0.0, float(os.environ.get(INTERVAL_ENV, LOG_INTERVAL)))
    except ValueError:
        return LOG_INTERVAL


_heartbeat_pid: Optional[int] = None
_heartbeat_lock = threading.Lock()


def _start_heartbeat() -> None:
    """Starts the thread that repeats every silent progress's latest line (once per process:
    a forked child starts its own)."""
    global _heartbeat_pid
    with _heartbeat_lock:
        if _heartbeat_pid == os.getpid():
            return
        _heartbeat_pid = os.getpid()
    threading.Thread(target=_heartbeat, name="yogacache-progress", daemon=True).start()


def _heartbeat() -> None:
    while True:
        active = list(_ACTIVE)
        shortest = min((p.heartbeat_period for p in active if p.heartbeat_period > 0), default=4.0)
        time.sleep(min(1.0, max(0.05, shortest / 4)))
        for progress in active:
            try:
                progress.beat()
            except Exception:  # a progress line must never take a program down
                log.debug("progress heartbeat failed", exc_info=True)


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``interval``: seconds between lines (default: 0.2 on a terminal, else
        ``$YOGACACHE_PROGRESS_INTERVAL`` or 10); ``clock``: the time source (tests)."""
        self.label = label
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.total = total if total is not None and total > 0 else None
        self.tty = enabled and _is_terminal(self.stream)
        self.interval = interval if interval is not None else (LIVE_INTERVAL if self.tty else _log_interval())
        self.clock = clock
        self.start = clock()
        self._last = self.start
        self._live: Any = None  # the rich Progress drawing the line, once shown
        self._task: Any = None
        self._closed = False
        self._said = False  # a log line was emitted
        self.muted = False  # set by mute_all(): nothing more is shown
        self._lock = _DRAW_LOCK  # one update drawn at a time; close waits for it
        # What the heartbeat repeats: the latest line asked for, held without a reference back
        # to this object (a progress its owner dropped is freed, and repeated no more).
        self._pid = os.getpid()
        self._counts: Optional[tuple[int, int]] = None  # the latest update(): records, bytes
        self._latest: Optional[Callable[[], Optional[Callable[..., str]]]] = None  # None: the build's line
        self._latest_options: dict[str, Any] = {"completed": 0, "total": self.total}
        if enabled:
            _ACTIVE.add(self)
            if clock is time.monotonic:
                _start_heartbeat()

    @property
    def heartbeat_period(self) -> float:
        """How long a line may stand still before it is repeated (0: never)."""
        if not self.enabled:
            return 0.0
        return _LIVE_HEARTBEAT if self.tty else self.interval

    def beat(self) -> None:
        """Repeats the latest line (elapsed time, rate and ETA brought up to date) when nothing
        was shown for a heartbeat period; the heartbeat thread calls this."""
        period = self.heartbeat_period
        if period <= 0 or self._closed or self.muted or self._pid != os.getpid():
            return  # a forked child never repeats its parent's lines
        if self.clock() - self._last < period:
            return
        if self._latest is None:
            counts = self._counts
            line: Optional[Callable[..., str]] = self._idle_line
            if counts is not None:
                line = lambda short=False: self._line(counts[0], counts[1], short)  # noqa: E731
        else:
            line = self._latest()
        if line is None:  # its owner is gone: nothing to repeat
            self.close()
            return
        front = _foremost() if _foremost is not None else None
        if front is not None and front is not self and front.enabled and not front._closed:
            return  # another progress is in front: its line is the one repeated
        self.emit(line, _remember=False, _heartbeat=True, **self._latest_options)

    # -- what is shown ----------------------------------------------------------------------
    def _rate_and_eta(self, done: float, total: Optional[float]) -> tuple[float, Optional[float]]:
        elapsed = max(self.clock() - self.start, 1e-9)
        rate = done / elapsed
        if total is None or rate <= 0 or done >= total:
            return rate, None
        return rate, (total - done) / rate

    def _line(self, records: int, size: int, short: bool = False) -> str:
        rate, eta = self._rate_and_eta(records, self.total)
        elapsed = max(self.clock() - self.start, 1e-9)
        eta_text = f"ETA {format_duration(eta)}" if eta is not None else ""
        if short:  # the live line: percentage and ETA are drawn beside the bar
            if self.total is None:
                return f"{records:,} records, {format_bytes(size)}, {records / elapsed:,.0f}/s"
            return f"{records:,}/{self.total:,}"
        if self.total is None:
            count = f"{records:,} records"
        else:
            count = f"{records:,} of {self.total:,} records ({100 * records / self.total:.0f}%)"
        text = f"{count}, {format_bytes(size)} ({records / elapsed:,.0f} records/s, {format_bytes(size / elapsed)}/s"
        return text + (f", {eta_text})" if eta_text else ")")

    def _idle_line(self, short: bool = False) -> str:
        """Before anything was counted (a slow source filling its first batch)."""
        elapsed = format_duration(self.clock() - self.start)
        count = "0 records" if self.total is None else f"0 of {self.total:,} records"
        # Records are counted a batch at a time, as they are written: say what is awaited.
        return f"{count} written, {elapsed} elapsed: waiting for the source's first batch of records"

    def _finish_line(self, records: int, size: int, short: bool = False) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
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
        _remember: bool = True,
        _heartbeat: bool = False,
    ) -> None:
        """Shows ``line()`` (a live line on a terminal, a log line otherwise), at most once per
        interval; ``final`` ends the live line. On a terminal the line is ``line(short=True)``
        when ``line`` takes that argument, and ``completed``/``total`` draw a bar, a percentage
        and an ETA. Safe from several threads; nothing is drawn once muted or closed."""
        if not self.enabled or self._closed or self.muted:
            return
        with self._lock:
            if not _heartbeat:
                self._to_front()
            if not final and _remember:
                self._latest = _weak_getter(line)
                self._latest_options = {"log_prefix": log_prefix, "completed": completed, "total": total}
            now = self.clock()
            if not final and now - self._last < self.interval:
                return
            if self.tty:
                if final and self._live is None:
                    self._close_locked()
                    return
                try:
                    text = line(short=True)
                except TypeError:
                    text = line()
                if self._closed or self.muted:  # Ctrl-C came while the line was made
                    return
                self._last = now
                self._draw(text, completed, total, final, log_prefix)
                if final:
                    self._close_locked()
            else:
                if final and not self._said and not log.hasHandlers() and now - self.start < self.interval:
                    self._close_locked()
                    return  # logging not configured: a quick build or transfer stays quiet
                text = line()
                if self._closed or self.muted:
                    return
                self._last = now
                self._said = True
                say(f"{log_prefix}{self.label}: {text}")
                if final:
                    self._close_locked()  # the heartbeat repeats nothing after the last line

    def _to_front(self) -> None:
        """Puts this progress in front; on a terminal another one's live line ends (its owner
        went on to something else, such as the upload after a build)."""
        global _foremost
        front = _foremost() if _foremost is not None else None
        if front is self:
            return
        _foremost = weakref.ref(self)
        if self.tty:
            for other in list(_ACTIVE):
                if other is not self and other._live is not None and other.stream is self.stream:
                    live, other._live, other._task = other._live, None, None
                    live.stop()  # its last line stays, ended

    def _numbers(self, completed: Optional[float], total: Optional[float], final: bool) -> str:
        """``42% ETA 1 min 05 s`` from ``completed`` of ``total`` (empty when unknown or final)."""
        if final or completed is None or not total:
            return ""
        percent = f"{min(100, int(100 * completed / total))}%"
        _, eta = self._rate_and_eta(completed, total)
        return percent + (f" ETA {format_duration(eta)}" if eta is not None else "")

    def _draw(
        self, text: str, completed: Optional[float], total: Optional[float], final: bool = False, prefix: str = ""
    ) -> None:
        """Draws the live line: label, bar, percentage and ETA, then ``text``, fitted to the
        terminal: the label is shortened first, then the end of ``text``; the numbers stay."""
        numbers = self._numbers(completed, total, final)
        label = f"{prefix}{self.label}"
        if self._live is None:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn
            from rich.progress import Progress as RichProgress
            from rich.table import Column

            console = Console(file=self.stream, highlight=False)
            self._live = RichProgress(
                TextColumn("{task.description}", table_column=Column(no_wrap=True)),
                BarColumn(bar_width=_BAR_WIDTH),
                TextColumn("{task.fields[text]}", table_column=Column(no_wrap=True)),
                console=console,
                auto_refresh=False,  # no drawing thread: every update draws, throttled above
                redirect_stdout=False,
                redirect_stderr=False,
            )
        width = self._live.console.width - 1  # the last column stays empty: no wrap
        right = " ".join(filter(None, [numbers, text]))
        room = max(width - _BAR_WIDTH - 2 - len(right), _LABEL_MIN)
        if len(label) > room:
            label = self.label  # the verb goes first, then the end of the name
        if len(label) > room:
            label = label[: room - 1] + "…"
        room = width - _BAR_WIDTH - 2 - len(label)
        if len(right) > room:
            right = right[: max(room - 1, len(numbers))] + "…"
        if self._task is None:
            self._task = self._live.add_task(label, total=total, completed=completed or 0, text=right)
            self._live.start()  # draws the first line
            return
        self._live.update(self._task, description=label, total=total, completed=completed or 0, text=right)
        if not final:
            self._live.refresh()  # a final line is drawn by close()

    def close(self) -> None:
        """Ends the live line (idempotent); later updates are ignored. An update being drawn
        by another thread (a transfer) is finished first, so nothing is drawn after this."""
        self._closed = True
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        self._closed = True
        live, self._live = self._live, None
        if live is not None:
            live.stop()
        _ACTIVE.discard(self)

    def update(self, records: int, size: int) -> None:
        self._counts = (records, size)
        self._latest = None  # the heartbeat repeats the build's line from _counts
        self._latest_options = {"log_prefix": "building ", "completed": records, "total": self.total}
        self.emit(
            lambda short=False: self._line(records, size, short),
            log_prefix="building ",
            completed=records,
            total=self.total,
            _remember=False,
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
        self._progress._latest = _weak_getter(self._line)  # what a heartbeat repeats before any byte

    def _line(self, short: bool = False) -> str:
        rate, eta = self._progress._rate_and_eta(self.done, self.total)
        done, total = format_bytes(self.done), format_bytes(self.total)
        if self.done >= self.total:
            waited = format_duration(self._progress.clock() - self._progress.start)
            if short:
                return f"finishing ({waited})"
            return f"{done} of {total} transferred, finishing ({waited})"
        eta_text = format_duration(eta) if eta is not None else "?"
        if short:  # the bar, percentage and ETA show how far; the final line the size
            return f"{format_bytes(rate)}/s"
        return f"{done} of {total} ({format_bytes(rate)}/s, ETA {eta_text})"

    def _finish_line(self, short: bool = False) -> str:
        elapsed = max(self._progress.clock() - self._progress.start, 1e-9)
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


def _weak_getter(line: Callable[..., str]) -> Callable[[], Optional[Callable[..., str]]]:
    """What the heartbeat keeps of ``line``: a bound method weakly (it must not keep its object,
    which holds the progress, alive), any other callable as it is."""
    if inspect.ismethod(line):
        method = weakref.WeakMethod(line)
        return method
    return lambda: line


def _is_terminal(stream: Any) -> bool:
    if os.environ.get("TERM") == "dumb":
        return False
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
