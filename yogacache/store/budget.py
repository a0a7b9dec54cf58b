"""The byte budget of a node's local data: leases of live readers, usage, and eviction.

Under a local root (``<local_cache_path>/yogadl_local_cache``) live whole local copies
(``<id>/<version>/``) and streamed parts (``.parts/<id>/<version>/<build>-part-NNNNN.mdb``).
Every process that reads some of them holds a *lease*: ``.leases/<pid>-<random>.lock``, locked
with ``flock`` for the life of the process, beside a ``.json`` file naming what it reads and the
parts it will need next, in order. A lease whose lock can be taken belongs to a dead process
(also after SIGKILL: the kernel drops the lock) and protects nothing; its files are removed by
the next scan, and by the next process that takes a lease there.

Every process that opens a remote cache's whole local copy takes a lease, also without a budget
or streaming: ``yogacache gc --limit`` and processes with a budget that share the local root may
evict whole copies, and only the lease keeps them from the copy a live process reads (and
makes ``ls`` show it in use). A shared_fs or local store takes none: it holds only copies that
are the only ones, which nothing evicts.

Eviction (``make_room``, ``collect``) runs under one node-wide lock (``.budget.lock``) and never
removes what a live lease holds, nor a local copy that is the only copy (see
``RemoteCacheStore``'s ``copy_is_evictable``). Among the rest it removes what is needed furthest
in the future -- the readers' announced read orders say when each part is needed next --
and, among what no reader will need, the least recently used first. A fetch *ahead* takes room
only from what no reader needs in the epoch it reads now (each announced order says how many of
its parts are of that epoch): what it fetches early must not cost a part the reader comes back to
before the epoch ends; and none while a fetch of the node waits for room.

No reader waits while it holds what another waiter needs (hold-and-wait is impossible by
construction): a streamed reader holds the part it reads now and, between reads, at most the one
it read last; a process whose fetch waits for room (or for another process's download) first
gives up every part its readers hold between reads. Each lease names its streamed readers (their
cache, largest part and budget), so that the node's budget is the smallest any live reader names,
and a reader whose node cannot hold what its readers keep is refused up front
(``check_node_minimum``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import threading
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from yogacache import redaction
from yogacache.errors import ConfigError
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.locks import FileLock, LockTimeoutError
from yogacache.safefs import PUBLIC_FILE_MODE, make_directories
from yogacache.sizes import format_size

log = redaction.get_logger(__name__)

PARTS_DIR = ".parts"
LEASES_DIR = ".leases"
BUDGET_LOCK = ".budget.lock"
TEMP_MARK = ".tmp-"  # ``.<part>.tmp-<pid>-<bytes>-<random>``: a part being downloaded
UPCOMING_LIMIT = 1024  # parts of its read order a lease announces


def part_item(dataset_id: str, dataset_version: str, file_name: str) -> str:
    """A streamed part's name in leases: its path under the local root."""
    return f"{PARTS_DIR}/{dataset_id}/{dataset_version}/{file_name}"


def copy_item(dataset_id: str, dataset_version: str) -> str:
    """A whole local copy's name in leases."""
    return f"{dataset_id}/{dataset_version}"


# -- this process's lease ---------------------------------------------------------------------


class ProcessLease:
    """This process's lease under one local root: what it reads, and what it reads next."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pid = os.getpid()
        directory = root / LEASES_DIR
        make_directories(directory)
        stem = f"{self.pid}-{uuid.uuid4().hex[:8]}"
        self.lock_path = directory / f"{stem}.lock"
        self.json_path = directory / f"{stem}.json"
        # Locked under a name no one looks at, then renamed into place: a lease file is never
        # seen unlocked (which would read as "its process died") while its process lives.
        hidden = directory / f".{stem}.lock.new"
        self._fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # held until this process exits
        os.rename(hidden, self.lock_path)
        # Leases of processes gone since the last scan: a node where nothing evicts (no budget)
        # would otherwise keep two files per process that ever read there.
        remove_dead_leases(directory)
        self._held: dict[str, int] = {}  # item -> how many holders in this process
        self._upcoming: dict[str, list[str]] = {}  # reader -> its next parts, in order
        self._now: dict[str, int] = {}  # reader -> how many of those its current epoch reads
        # reader -> how long it reads each part, relative to the process's other readers (a
        # mixture's components: a part of a component the mixture reads little of lasts longer)
        self._scale: dict[str, float] = {}
        # reader -> (its cache, its largest part, its budget, whether it reads in this process)
        self._readers: dict[str, tuple[str, int, Optional[int], bool]] = {}
        # reader -> gives up the parts it holds between reads (called while a fetch waits; held
        # weakly: a reader collected without closing leaves nothing behind here)
        self._idle: dict[str, weakref.WeakMethod[Callable[[], None]]] = {}
        self._waiting = 0  # fetches of this process waiting for room now
        # Re-entrant: a reader collected on a thread that holds it releases its parts there.
        self._lock = threading.RLock()

    def hold(self, item: str) -> None:
        with self._lock:
            self._held[item] = self._held.get(item, 0) + 1
            if self._held[item] == 1:
                self._write()

    def drop(self, item: str) -> None:
        with self._lock:
            count = self._held.get(item, 0) - 1
            if count > 0:
                self._held[item] = count
                return
            self._held.pop(item, None)
            self._write()

    def announce(self, reader: str, upcoming: list[str], now: Optional[int] = None, scale: float = 1.0) -> None:
        """Records the next parts ``reader`` (a reader of this process) will need, in order;
        the first ``now`` of them (all, if None) are what its current epoch still reads.
        ``scale``: how many steps of the node's common clock one part of this reader lasts (its
        ``k``-th part is needed at ``k · scale``), so that orders of readers that move through
        their parts at other paces (a mixture's components) compare by when, not by place."""
        with self._lock:
            self._upcoming[reader] = upcoming[:UPCOMING_LIMIT]
            self._now[reader] = min(len(upcoming), UPCOMING_LIMIT) if now is None else min(now, UPCOMING_LIMIT)
            self._scale[reader] = float(scale)
            self._write()

    def holds(self, item: str) -> bool:
        with self._lock:
            return item in self._held

    def register(
        self,
        reader: str,
        cache: str,
        part: int,
        limit: Optional[int],
        *,
        reads: bool,
        give_up: Optional[Callable[[], None]] = None,
    ) -> None:
        """Names a streamed reader of this process in the lease: its cache, its largest part and
        its budget; ``reads``: it reads here (it holds parts: it counts in the node's minimum).
        ``give_up`` gives up the parts it holds between reads (``give_up_idle``)."""
        with self._lock:
            self._readers[reader] = (cache, int(part), limit, reads)
            if give_up is not None:
                self._idle[reader] = weakref.WeakMethod(give_up)
            self._write()

    def forget(self, reader: str) -> None:
        """A reader closed: its order, its registration and its hook leave the lease."""
        with self._lock:
            found = [table.pop(reader, None) for table in (self._upcoming, self._now, self._scale, self._readers)]
            self._idle.pop(reader, None)
            if any(value is not None for value in found):
                self._write()

    def give_up_idle(self) -> None:
        """Makes every reader of this process give up the parts it holds between reads (a fetch
        of the process waits: it must not wait while the process holds room it could free)."""
        with self._lock:
            hooks = [found() for found in self._idle.values()]
        for hook in hooks:
            if hook is not None:
                hook()

    def set_waiting(self, change: int) -> None:
        """Counts a fetch of this process that starts (+1) or stops (-1) waiting for room; while
        one waits, fetches ahead on the node take no room."""
        with self._lock:
            before = self._waiting
            self._waiting = max(0, self._waiting + change)
            if (before > 0) != (self._waiting > 0):
                self._write()

    def _write(self) -> None:
        readers = list(self._upcoming)
        data = {
            "pid": self.pid,
            "held": sorted(self._held),
            "readers": [
                {"cache": cache, "part": part, "limit": limit, "reads": reads}
                for cache, part, limit, reads in self._readers.values()
            ],
            "waiting": self._waiting,
            "upcoming": [self._upcoming[reader] for reader in readers],
            "now": [self._now.get(reader, len(self._upcoming[reader])) for reader in readers],
            "scale": [self._scale.get(reader, 1.0) for reader in readers],
        }
        temp = self.json_path.with_name(f".{self.json_path.name}.{uuid.uuid4().hex[:8]}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(data))
        os.replace(temp, self.json_path)


_leases: dict[Path, ProcessLease] = {}
_leases_lock = threading.Lock()


def _forget_leases_after_fork() -> None:
    global _leases_lock
    _leases.clear()  # the parent's leases are the parent's: a child takes its own
    _leases_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_leases_after_fork)


def existing_lease(root: Path) -> Optional[ProcessLease]:
    """This process's lease under ``root`` if it took one (no lock taken: a reader collected on
    a thread that is taking a lease releases its parts through this)."""
    lease = _leases.get(root)
    return lease if lease is not None and lease.pid == os.getpid() else None


def process_lease(root: Path) -> ProcessLease:
    """This process's lease under ``root`` (one per process and root, taken on first use)."""
    with _leases_lock:
        lease = _leases.get(root)
        if lease is None or lease.pid != os.getpid():
            lease = _leases[root] = ProcessLease(root)
        return lease


def hold_copy(root: Path, dataset_id: str, dataset_version: str) -> None:
    """Marks the whole local copy as read by this process, for the rest of its life (a root
    this process cannot write to just goes unmarked: nothing evicts there either)."""
    try:
        process_lease(root).hold(copy_item(dataset_id, dataset_version))
    except OSError as error:
        log.debug("cannot take a lease under %s: %s", root, error)


@dataclass(frozen=True)
class NodeReader:
    """A streamed reader named in a live lease."""

    pid: int
    cache: str  # ``<id>:<version>``
    part: int  # its largest part: what it holds between reads
    limit: Optional[int]  # the budget it was opened with
    reads: bool  # it reads in that process (a DataLoader's main process may only open it)


@dataclass(frozen=True)
class LiveLeases:
    """What the live processes of a node hold, and when they need each part next."""

    held: frozenset[str]
    next_use: dict[str, float]  # item -> the earliest position in any live reader's order, scaled
    processes: int
    # Items some live reader still reads in the epoch it reads now (a fetch ahead leaves them).
    needed_now: frozenset[str] = frozenset()
    readers: tuple[NodeReader, ...] = ()
    waiting: int = 0  # fetches of the node waiting for room now

    def rank(self, item: str) -> float:
        return self.next_use.get(item, math.inf)

    @property
    def limit(self) -> Optional[int]:
        """The node's budget: the smallest any live streamed reader was opened with."""
        limits = [reader.limit for reader in self.readers if reader.limit is not None]
        return min(limits) if limits else None


def node_minimum(readers: Sequence[NodeReader]) -> int:
    """The smallest budget in which ``readers`` (of one node) never wait on each other: between
    reads each holds one part (its largest), and a process whose fetch waits gives up its own
    and needs room for the part it fetches. So: the most, over the processes, of the other
    processes' readers' parts plus its own largest part. (Each cache also needs two of its
    largest parts by itself: ``store.streaming.check_budget``.)"""
    reading = [reader for reader in readers if reader.reads]
    total = sum(reader.part for reader in reading)
    need = 0
    for pid in {reader.pid for reader in reading}:
        own = [reader.part for reader in reading if reader.pid == pid]
        need = max(need, total - sum(own) + max(own))
    return need


def describe_readers(readers: Sequence[NodeReader]) -> str:
    """``pid 12: web:v1 (1.1 MiB), code:v1 (1.0 MiB); pid 13: …`` (the readers that count)."""
    by_pid: dict[int, list[str]] = {}
    for reader in readers:
        if reader.reads:
            by_pid.setdefault(reader.pid, []).append(f"{reader.cache} ({format_size(reader.part)})")
    return "; ".join(f"pid {pid}: {', '.join(names)}" for pid, names in sorted(by_pid.items()))


def check_node_minimum(root: Path, joining: NodeReader, limit: int) -> None:
    """ConfigError when the node's budget (the smallest of ``limit`` and the live readers'
    budgets) cannot hold what its streamed readers, ``joining`` among them, keep between reads
    (``node_minimum``): the error names the minimum, the budget and every reader, so that a node
    with too many readers for its budget is refused when a reader opens or first reads instead of
    stalling."""
    live = live_leases(root)
    readers = [*live.readers, joining]
    budget = min(limit, live.limit) if live.limit is not None else limit
    need = node_minimum(readers)
    if need <= budget:
        return
    count = sum(1 for reader in readers if reader.reads)
    processes = len({reader.pid for reader in readers if reader.reads})
    raise ConfigError(
        f"local_cache_limit {format_size(budget)} ({budget} bytes) is too small for the {count} streamed "
        f"readers of {processes} process(es) on this node ({root}): between reads each holds the part it "
        f"read last, and a process waiting for room needs room for the part it fetches, so they need at least "
        f"{format_size(need)} ({need} bytes). Readers: {describe_readers(readers)}. Raise local_cache_limit "
        "to at least that, or run fewer readers on this node (ranks, DataLoader workers, mixture components)"
    )


def remove_dead_leases(directory: Path) -> list[Path]:
    """Removes the lease files of dead processes in ``directory`` (a ``.leases``); the ``.json``
    paths of the live leases."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    live = []
    for name in names:
        if not name.endswith(".lock") or name.startswith("."):
            continue
        lock_path = directory / name
        json_path = directory / (name[: -len(".lock")] + ".json")
        try:
            fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                live.append(json_path)
            else:  # nobody holds it: its process is gone
                json_path.unlink(missing_ok=True)
                lock_path.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return live


def live_leases(root: Path) -> LiveLeases:
    """The leases of live processes under ``root``; a dead process's lease files are removed."""
    held: set[str] = set()
    next_use: dict[str, float] = {}
    needed_now: set[str] = set()
    readers: list[NodeReader] = []
    waiting = 0
    processes = 0
    for json_path in remove_dead_leases(root / LEASES_DIR):
        processes += 1
        try:
            data = json.loads(json_path.read_text())
        except (OSError, ValueError):
            continue  # a lease being written for the first time holds nothing yet
        if not isinstance(data, dict):
            continue
        held.update(str(item) for item in data.get("held", []))
        readers.extend(_readers_of(data))
        if isinstance(data.get("waiting"), int) and data["waiting"] > 0:
            waiting += data["waiting"]
        orders = data.get("upcoming", [])
        nows = data.get("now", [])
        scales = data.get("scale", [])
        for number, order in enumerate(orders):
            # A lease without "now" (an older yogacache): its whole order counts as current.
            now = nows[number] if number < len(nows) and isinstance(nows[number], int) else len(order)
            scale = scales[number] if number < len(scales) and isinstance(scales[number], (int, float)) else 1.0
            for position, item in enumerate(order):
                if position * scale < next_use.get(item, math.inf):
                    next_use[item] = position * scale
                if position < now:
                    needed_now.add(item)
    return LiveLeases(frozenset(held), next_use, processes, frozenset(needed_now), tuple(readers), waiting)


def _readers_of(data: dict[str, object]) -> list[NodeReader]:
    """The streamed readers a lease names (entries that are not well formed are left out)."""
    pid = data.get("pid")
    found = data.get("readers")
    if not isinstance(pid, int) or not isinstance(found, list):
        return []
    readers = []
    for entry in found:
        if not isinstance(entry, dict):
            continue
        part, limit = entry.get("part"), entry.get("limit")
        if not isinstance(part, int) or part < 0 or not (limit is None or (isinstance(limit, int) and limit > 0)):
            continue
        readers.append(NodeReader(pid, str(entry.get("cache", "?")), part, limit, bool(entry.get("reads", True))))
    return readers


# -- what is on the node ----------------------------------------------------------------------


@dataclass(frozen=True)
class LocalItem:
    """A whole local copy or a streamed part under a local root."""

    item: str  # its name in leases
    path: Path
    size: int
    atime: float
    kind: str  # "copy" or "part"
    dataset_id: str
    dataset_version: str


def _tree_size(path: Path) -> tuple[int, float]:
    size, newest = 0, 0.0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_atime)
    return size, newest


def _visible_dirs(directory: Path) -> Iterator[Path]:
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def local_items(root: Path) -> list[LocalItem]:
    """Every whole copy and every complete streamed part under ``root``."""
    items = []
    for id_dir in _visible_dirs(root):
        for version_dir in _visible_dirs(id_dir):
            if (version_dir / MANIFEST_NAME).is_file():
                size, atime = _tree_size(version_dir)
                item = copy_item(id_dir.name, version_dir.name)
                items.append(LocalItem(item, version_dir, size, atime, "copy", id_dir.name, version_dir.name))
    for id_dir in _visible_dirs(root / PARTS_DIR):
        for version_dir in _visible_dirs(id_dir):
            for entry in sorted(os.scandir(version_dir), key=lambda e: e.name):
                if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
                item = part_item(id_dir.name, version_dir.name, entry.name)
                items.append(
                    LocalItem(item, Path(entry.path), st.st_size, st.st_atime, "part", id_dir.name, version_dir.name)
                )
    return items


def in_flight_bytes(root: Path) -> int:
    """Bytes reserved by downloads of parts under way (their temporary files' final sizes);
    temporary files of dead downloaders are removed."""
    total = 0
    for id_dir in _visible_dirs(root / PARTS_DIR):
        for version_dir in _visible_dirs(id_dir):
            for entry in os.scandir(version_dir):
                name = entry.name
                if not (name.startswith(".") and TEMP_MARK in name):
                    continue
                part_name = name[1 : name.index(TEMP_MARK)]
                fields = name[name.index(TEMP_MARK) + len(TEMP_MARK) :].split("-")
                if fetch_lock_free(version_dir, part_name):
                    Path(entry.path).unlink(missing_ok=True)  # its downloader died
                    continue
                if len(fields) != 3 or len(fields[2]) != 8 or not fields[1].isdigit():
                    continue  # not a reservation (a client library's own temporary file)
                total += int(fields[1])
    return total


def downloads_of(directory: Path, part_names: Sequence[str]) -> list[Path]:
    """The temporary files of downloads of the parts ``part_names`` in ``directory`` (under way,
    or left by a killed downloader): one listing of the directory, however many names."""
    marks = tuple(f".{name}{TEMP_MARK}" for name in part_names)
    if not marks:
        return []
    try:
        with os.scandir(directory) as entries:
            return [Path(entry.path) for entry in entries if entry.name.startswith(marks)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def fetch_lock(
    directory: Path,
    part_name: str,
    timeout: Optional[float] = None,
    on_wait: Optional[Callable[[Optional[str]], None]] = None,
) -> FileLock:
    """The node-wide lock of downloading one part (one download per part per node);
    ``on_wait`` runs once before waiting for another process's download."""
    return FileLock(directory / f".{part_name}.lock", timeout=timeout, on_wait=on_wait)


def fetch_lock_free(directory: Path, part_name: str) -> bool:
    """Whether nobody downloads ``part_name`` now (its lock is free)."""
    lock = fetch_lock(directory, part_name, timeout=0)
    try:
        lock.acquire()
    except LockTimeoutError:
        return False
    lock.release()
    return True


def budget_lock(root: Path) -> FileLock:
    """The node-wide lock under which room is made and leases are taken."""
    return FileLock(root / BUDGET_LOCK)


# -- eviction ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Eviction:
    """One removal the policy chose (or would choose, for ``--dry-run``)."""

    item: LocalItem
    reason: str


def choose_evictions(
    items: list[LocalItem],
    leases: LiveLeases,
    need: int,
    limit: int,
    *,
    in_flight: int = 0,
    copy_is_evictable: Callable[[LocalItem], bool] = lambda item: False,
    sooner_than: float = 0,
    ahead: bool = False,
) -> tuple[list[Eviction], int]:
    """Which items to remove so that ``need`` more bytes fit under ``limit``, and the usage
    after removing them (it may still be over: nothing more may be removed).

    Never an item a live lease holds; never a whole copy ``copy_is_evictable`` refuses (the
    only copy); never a part needed sooner than position ``sooner_than`` of a reader's order;
    for a fetch ``ahead``, never a part a reader still reads in its current epoch (fetching
    early must not cost a part the reader comes back to: the fetch waits until the reader needs
    it instead). Furthest next use first; among items no reader needs, least recently used first.
    """
    usage = sum(item.size for item in items) + in_flight
    if usage + need <= limit:
        return [], usage
    candidates = []
    for item in items:
        if item.item in leases.held:
            continue
        rank = leases.rank(item.item)
        if rank < sooner_than and rank != math.inf:
            continue
        if ahead and item.item in leases.needed_now:
            continue
        if item.kind == "copy" and not copy_is_evictable(item):
            continue
        candidates.append((-rank, item.atime, item))
    candidates.sort(key=lambda entry: (entry[0], entry[1]))
    chosen = []
    for negative_rank, _atime, item in candidates:
        if usage + need <= limit:
            break
        reason = "not in any reader's order" if negative_rank == -math.inf else f"needed again at {int(-negative_rank)}"
        chosen.append(Eviction(item, reason))
        usage -= item.size
    return chosen, usage


def remove_item(root: Path, item: LocalItem, remove_copy: Callable[[LocalItem], bool]) -> bool:
    """Removes one evicted item; False when it could not be (a copy whose lock is busy)."""
    if item.kind == "part":
        try:
            os.unlink(item.path)
        except FileNotFoundError:
            pass
        return True
    return remove_copy(item)


def make_room(
    root: Path,
    need: int,
    limit: int,
    *,
    copy_is_evictable: Callable[[LocalItem], bool] = lambda item: False,
    remove_copy: Callable[[LocalItem], bool] = lambda item: False,
    sooner_than: float = 0,
    ahead: bool = False,
    before_release: Optional[Callable[[], None]] = None,
) -> bool:
    """Evicts (under the node's budget lock) until ``need`` more bytes fit under ``limit``;
    False when they cannot fit now (what remains is in use, needed sooner, or the only copy).
    ``ahead``: the room is for a fetch ahead (see ``choose_evictions``).

    ``before_release`` runs under the lock after room was made (to reserve it, e.g. by
    creating a download's temporary file) so that no other process takes the same room.
    """
    with budget_lock(root):
        # Reservations first, parts second: a download that finishes between the two scans
        # (renaming its temporary file to the part, outside this lock) is then counted twice,
        # never zero times.
        in_flight = in_flight_bytes(root)
        items = local_items(root)
        leases = live_leases(root)
        if leases.limit is not None:
            limit = min(limit, leases.limit)  # the node's budget: the smallest a live reader names
        if ahead and leases.waiting:
            return False  # a fetch of the node waits for room: nothing is fetched ahead of it
        chosen, usage = choose_evictions(
            items,
            leases,
            need,
            limit,
            in_flight=in_flight,
            copy_is_evictable=copy_is_evictable,
            sooner_than=sooner_than,
            ahead=ahead,
        )
        for eviction in chosen:
            if remove_item(root, eviction.item, remove_copy):
                log.info("evicted %s (%d bytes): %s", eviction.item.item, eviction.item.size, eviction.reason)
            else:
                usage += eviction.item.size
        if usage + need > limit:
            return False
        if before_release is not None:
            before_release()
        return True


def create_reservation(directory: Path, part_name: str, size: int) -> Path:
    """The temporary file a part downloads into; its name carries the bytes it reserves."""
    path = directory / f".{part_name}{TEMP_MARK}{os.getpid()}-{size}-{uuid.uuid4().hex[:8]}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, PUBLIC_FILE_MODE)
    os.close(fd)
    return path
