"""Build leases: a conditional object in the bucket says which node is building a cache.

A lease is created with a conditional write, so one node holds it; its holder rewrites it
(renews it) every third of its duration, which changes its version token. Expiry is decided
from what one clock can measure, never by comparing clocks across nodes: a waiter takes a
lease over once it has itself watched the lease's version token stay the same for the lease's
duration on its own monotonic clock (the holder stopped renewing: it died). The takeover is a
write conditional on that stale version, so exactly one node takes it over. A released lease
says so in its body and is free at once. ``expires_at`` in the body is the holder's wall-clock
guess, for people reading the object; no decision uses it.

A lease's duration has a ceiling, ``MAX_LEASE_SECONDS``: a lease that claims more (``1e300``,
infinity: a foreign or broken writer) is taken over once it stayed unchanged that long, and a
lease this process holds may not claim more (ConfigError). A lease object is read capped
(``MAX_LEASE_BYTES``) and its fields are checked in one place (``parse_lease``): one that is
larger, not JSON, or whose fields have the wrong types is unreadable, and an unreadable lease is
watched like any other (taken over once unchanged for the waiter's own duration).

A holder also names its process in a way only its own node can check (boot id, pid namespace,
pid and the process's start time, from ``/proc``). A waiter on the same node and in the same pid
namespace that finds that process gone (killed, crashed) takes the lease over at once instead
of after its duration; anywhere else (another node, another container) it waits as above.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from yogacache import redaction
from yogacache.backends.base import ObjectSizeError, ObjectStore, read_capped
from yogacache.errors import ConfigError, YogaCacheError
from yogacache.progress import waiting
from yogacache.store.keys import LEASE_NAME as LEASE_NAME  # re-exported: where the lease lives

log = redaction.get_logger(__name__)

T = TypeVar("T")
DEFAULT_LEASE_SECONDS = 120.0  # a holder renews every third of it; a waiter takes over after it
# The longest a lease lasts unrenewed, whatever it claims: a waiter takes over a lease it has
# watched unchanged this long. A holder renews every third of its duration, so no holder needs
# more; a lease claiming more (1e300 s) was written by something else, or is broken.
MAX_LEASE_SECONDS = 3600.0
# A lease object is a few hundred bytes of JSON: a larger one is not a lease, and is never read whole.
MAX_LEASE_BYTES = 64 << 10
_MAX_OWNER_CHARS = 200  # an owner is HOST:PID; a longer one is cut for messages


def check_lease_seconds(seconds: float) -> float:
    """``seconds`` if a lease may last that long unrenewed (more than 0, at most
    ``MAX_LEASE_SECONDS``); ConfigError otherwise."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_LEASE_SECONDS:
        raise ConfigError(
            f"lease_seconds must be a number of seconds above 0 and at most {MAX_LEASE_SECONDS:.0f} "
            f"(MAX_LEASE_SECONDS, past which waiters take a lease over), not {seconds!r}"
        )
    return float(seconds)


class BuildWaitTimeoutError(YogaCacheError, TimeoutError):
    """Waited too long for another node's build (or copy) of a cache."""


@dataclass(frozen=True)
class LeaseState:
    owner: str
    build_id: str
    expires_at: float
    token: str
    duration: Optional[float] = None  # seconds the holder promised to renew within; None: not said
    released: bool = False
    process: Optional[dict[str, object]] = None  # the holder's process_identity(), if it said
    unreadable: Optional[str] = None  # why the lease object could not be read (``parse_lease``)


def _unreadable(token: str, why: str) -> LeaseState:
    """An unreadable lease: watched like any other (it goes stale unless rewritten)."""
    return LeaseState("?", "?", 0.0, token, unreadable=why)


def _number(value: object) -> Optional[float]:
    """``value`` as a float if it is a JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        return math.inf if value > 0 else -math.inf  # type: ignore[operator]


_PROCESS_FIELDS = {"boot_id": str, "pid_ns": int, "pid": int, "start": str}


def parse_lease(data: bytes, token: str) -> LeaseState:
    """The lease in ``data`` (version ``token``), every field checked here and only here.

    ``owner`` and ``build_id`` are strings, ``expires_at`` a finite number (informational),
    ``released`` a bool (absent: whether ``expires_at`` is 0), ``process`` a dict of the fields
    ``process_identity`` writes (else it is ignored). ``duration``: missing, not a number, or not
    above 0 means "not said" (the waiter's own duration applies); more than ``MAX_LEASE_SECONDS``
    (infinity included) is read as that ceiling. Anything else makes the lease unreadable."""
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return _unreadable(token, "not JSON")
    if not isinstance(raw, dict):
        return _unreadable(token, "not a JSON object")
    owner, build_id = raw.get("owner"), raw.get("build_id")
    expires_at = _number(raw.get("expires_at"))
    released = raw.get("released", expires_at == 0.0)
    if not isinstance(owner, str) or not isinstance(build_id, str):
        return _unreadable(token, "owner and build_id must be strings")
    if expires_at is None or not math.isfinite(expires_at):
        return _unreadable(token, "expires_at must be a finite number")
    if not isinstance(released, bool):
        return _unreadable(token, "released must be true or false")
    duration = _number(raw.get("duration"))
    if duration is not None and not duration > 0:  # NaN and negative durations say nothing
        duration = None
    if duration is not None:
        duration = min(duration, MAX_LEASE_SECONDS)
    process = raw.get("process")
    if not isinstance(process, dict) or any(
        type(process.get(name)) is not kind for name, kind in _PROCESS_FIELDS.items()
    ):
        process = None
    return LeaseState(owner[:_MAX_OWNER_CHARS], build_id, expires_at, token, duration, released, process)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def _start_time(pid: int) -> Optional[str]:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22); None if
    there is no such process."""
    stat = _read_text(f"/proc/{pid}/stat")
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # after the command name, which may hold spaces
    return fields[19] if len(fields) > 19 else None


def _namespace() -> Optional[dict[str, object]]:
    """This node's boot and this process's pid namespace, as /proc says (None off Linux)."""
    boot = _read_text("/proc/sys/kernel/random/boot_id")
    try:
        pid_ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return {"boot_id": boot.strip(), "pid_ns": pid_ns} if boot else None


def process_identity() -> Optional[dict[str, object]]:
    """What names this process for a waiter on the same node: boot id, pid namespace, pid and
    start time (a pid reused by a later process has another start time)."""
    namespace = _namespace()
    start = _start_time(os.getpid())
    if namespace is None or start is None:
        return None
    return {**namespace, "pid": os.getpid(), "start": start}


def holder_exited(process: Optional[dict[str, object]]) -> bool:
    """Whether the process ``process`` (a ``process_identity()``) certainly no longer runs: it
    ran on this boot of this node in this pid namespace, and its pid is gone or now names a
    process that started at another time. False whenever this process cannot tell."""
    if not isinstance(process, dict):
        return False
    namespace = _namespace()
    if namespace is None or any(process.get(key) != value for key, value in namespace.items()):
        return False
    pid = process.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    return _start_time(pid) != process.get("start")


class Lease:
    """A build lease, held (renewed in the background until released) or watched while waiting."""

    def __init__(
        self,
        objects: ObjectStore,
        key: str,
        build_id: str,
        duration: float,
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects = objects
        self.key = key
        self.build_id = build_id
        self.duration = check_lease_seconds(duration)
        self.wall_clock = wall_clock  # only for the informational expires_at
        self.monotonic = monotonic
        self.token: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._renewals = 0
        self._watched: Optional[tuple[str, float]] = None  # (token, monotonic time first seen)
        self.lost = False

    def _payload(self, released: bool = False) -> bytes:
        self._renewals += 1  # every write differs, so that content-hash tokens (ETags) change too
        return json.dumps(
            {
                "owner": _owner(),
                "build_id": self.build_id,
                "expires_at": 0.0 if released else self.wall_clock() + self.duration,
                "duration": self.duration,
                "released": released,
                "renewal": self._renewals,
                "process": process_identity(),
            }
        ).encode()

    @staticmethod
    def read(objects: ObjectStore, key: str) -> Optional[LeaseState]:
        """The lease at ``key`` (``parse_lease``), None when there is none; read capped at
        ``MAX_LEASE_BYTES`` (a larger object is unreadable, never read whole)."""
        try:
            found = read_capped(objects, key, MAX_LEASE_BYTES)
        except ObjectSizeError as oversized:
            return _unreadable(oversized.token or "", f"larger than {MAX_LEASE_BYTES} bytes")
        if found is None:
            return None
        return parse_lease(*found)

    def _is_stale(self, current: LeaseState) -> bool:
        """Whether this waiter has watched ``current``'s version stay unchanged for its duration."""
        if current.released or holder_exited(current.process):
            return True
        now = self.monotonic()
        if self._watched is None or self._watched[0] != current.token:
            self._watched = (current.token, now)  # renewed (or new): start watching again
            if current.unreadable is not None:
                log.warning(
                    "the build lease %s is unreadable (%s); it is taken over once unchanged for %.0f s",
                    self.objects.url(self.key),
                    current.unreadable,
                    self.duration,
                )
            return False
        duration = current.duration if current.duration is not None else self.duration
        return now - self._watched[1] >= duration

    def try_acquire(self) -> tuple[bool, Optional[LeaseState]]:
        """(True, previous) when acquired (``previous`` is the stale lease taken over, if any);
        (False, current holder) otherwise. Call it again (on the same Lease) to keep watching."""
        token = self.objects.write(self.key, self._payload(), if_absent=True)
        if token is not None:
            self._acquired(token)
            return True, None
        current = self.read(self.objects, self.key)
        if current is None:
            return False, None  # released meanwhile: the caller retries
        if not self._is_stale(current):
            return False, current
        token = self.objects.write(self.key, self._payload(), if_token=current.token)
        if token is None:
            return False, None  # someone else took it over first
        if not current.released and holder_exited(current.process):
            log.warning(
                "took over the build lease of %s (%s): its process on this node has exited",
                current.owner,
                self.objects.url(self.key),
            )
        elif not current.released:
            log.warning(
                "took over the stale build lease of %s (%s): not renewed for %.0f s",
                current.owner,
                self.objects.url(self.key),
                current.duration if current.duration is not None else self.duration,
            )
        self._acquired(token)
        return True, current

    def _acquired(self, token: str) -> None:
        self.token = token
        self.lost = False
        self._watched = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, name="yogacache-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                token = self.objects.write(self.key, self._payload(), if_token=self.token)
            except Exception as error:  # keep trying until the lease would expire
                log.warning("renewing build lease %s failed: %s", self.objects.url(self.key), error)
                continue
            if token is None:
                log.error("lost build lease %s to another node", self.objects.url(self.key))
                self.lost = True
                return
            self.token = token

    def release(self, *, remove: bool = False) -> None:
        """Releases the lease. ``remove``: deletes the lease object instead, where what it
        guarded came to nothing (a failed copy): no object of the cache is left behind."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.token is not None and not self.lost:
            # Released is written conditionally on our own version: this needs no
            # conditional delete (which not every server enforces) and never clobbers a
            # lease someone else holds. A removal is conditional too, where the server checks.
            try:
                if remove:
                    self.objects.delete(self.key, if_token=self.token)
                else:
                    self.objects.write(self.key, self._payload(released=True), if_token=self.token)
            except Exception as error:  # an unreleased lease simply goes stale
                log.warning("releasing build lease %s failed: %s", self.objects.url(self.key), error)
        self.token = None


@dataclass(frozen=True)
class LeaseTimes:
    """How long a lease lasts unrenewed, how often a waiter looks again, and how long it waits
    in all (None: for ever)."""

    seconds: float = DEFAULT_LEASE_SECONDS
    poll_seconds: float = 1.0
    wait_timeout: Optional[float] = None


class _Waiting:
    """A waiter's side of a lease: its deadline, and whether it named the holder yet."""

    def __init__(self, what: str, doing: str, poll_seconds: float, timeout: Optional[float]) -> None:
        self.what, self.doing, self.poll_seconds = what, doing, poll_seconds
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.announced = False

    def turn(
        self, lease: Lease, ready: Callable[[], Optional[T]], timed_out: Callable[[Optional[LeaseState]], str]
    ) -> Optional[T]:
        """None once ``lease`` is held; else the first thing ``ready()`` finds meanwhile."""
        while True:
            found = ready()
            if found is not None:
                return found
            acquired, holder = lease.try_acquire()
            if acquired:
                return None
            if holder is not None and not self.announced:
                waiting(self.what, holder.owner, doing=self.doing)
                self.announced = True
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise BuildWaitTimeoutError(timed_out(holder))
            time.sleep(self.poll_seconds)


def build_or_wait(
    lease: Lease,
    ready: Callable[[], Optional[T]],
    build: Callable[[], Optional[T]],
    times: LeaseTimes,
    *,
    what: str,
    waiting_for: str,
) -> T:
    """The first of: what ``ready()`` finds (another process built it), or what ``build()``
    makes while this process holds ``lease`` (released after). ``ready`` is asked before every
    try of the lease and again once it is held (built meanwhile); ``build`` returning None
    (another process won) means looking again. While another process holds the lease, its holder
    is named once (``what``); BuildWaitTimeoutError after ``times.wait_timeout`` seconds, saying
    it waited for another node to do ``waiting_for``."""
    waiter = _Waiting(what, "building", times.poll_seconds, times.wait_timeout)
    timed_out = f"waited {times.wait_timeout} s for another node to {waiting_for}"
    while True:
        found = waiter.turn(lease, ready, lambda holder: timed_out)
        if found is not None:
            return found
        try:
            found = ready()
            if found is None:
                found = build()
        finally:
            lease.release()
        if found is not None:
            return found


@contextlib.contextmanager
def holding(
    objects: ObjectStore,
    key: str,
    duration: float,
    *,
    what: str,
    build_id: Optional[str] = None,
    poll_seconds: float = 1.0,
    timeout: Optional[float] = None,
    doing: str = "building",
    remove_on_failure: bool = False,
) -> Iterator[Lease]:
    """Holds the build lease at ``key`` for the block (renewed meanwhile, released after;
    ``remove_on_failure``: deleted when the block fails with an Exception),
    waiting while another process holds it. Every writer of a cache's objects (a build's publish,
    a push, a copy to it, the removal of parts no manifest names) holds it, so that none of them
    deletes or replaces what another is writing. ``what`` (``ID:VERSION``) names the cache in the
    waiting line; BuildWaitTimeoutError after ``timeout`` seconds of waiting."""
    lease = Lease(objects, key, build_id or uuid.uuid4().hex, duration)
    _Waiting(what, doing, poll_seconds, timeout).turn(
        lease,
        lambda: None,
        lambda holder: (
            f"waited {timeout} s for the build lease {objects.url(key)} "
            f"({holder.owner if holder else 'another process'} holds it)"
        ),
    )
    try:
        yield lease
    except BaseException as error:
        # Failed (not interrupted, which may resume): the lease object goes, if asked.
        lease.release(remove=remove_on_failure and isinstance(error, Exception))
        raise
    lease.release()
