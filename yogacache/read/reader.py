"""CacheReader: random access to the records of one sealed cache, checked before LMDB touches it.

Opening checks the manifest, the part files' exact sizes and (unless a stamp shows the files
are unchanged since they were last hashed) their content hash, so that a truncated or altered part
raises CorruptCacheError instead of reaching LMDB, which may crash on a damaged file. Each part's
LMDB environment is opened through the very descriptor that was checked and holds the part's
only descriptor: a rebuild or sync that replaces the cache later never reaches the reader, and a
cache of N parts costs N open files.

A reader reads the build it was opened on in every process, or raises CacheReplacedError.
Environments open read-only, once per process, and never cross ``fork()``: a forked child
reopens each part through the descriptor it inherited; a reader sent to another process
(pickled for a spawned DataLoader worker) reopens each part through the opening process's
descriptor while that process holds it, else by name, and then only if the file is the one it
opened, or a file of the same build that passes verification.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import functools
import operator
import os
import threading
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Iterator, Optional, Protocol, Sequence, TypeVar

import lmdb
import numpy as np

from yogacache import redaction
from yogacache.errors import CacheNotFoundError, CacheReplacedError, CorruptCacheError
from yogacache.format.codec import RecordCodec
from yogacache.format.integrity import VERIFY_MODES, Verify, verify_parts
from yogacache.format.layout import FixedLayout
from yogacache.format.manifest import Manifest, PartInfo
from yogacache.format.pages import PartTree, map_file, part_tree
from yogacache.format.spec import unflatten

log = redaction.get_logger(__name__)
T = TypeVar("T")
_PROC_FDS = Path("/proc/self/fd")
# Records this large span several pages: reading ahead beats faulting page by page.
LARGE_RECORD_BYTES = 32 << 10
# Reads of at least this many fixed-layout records are gathered from the parts' maps with numpy
# (a fixed cost of a few dozen numpy calls); smaller ones cost less as LMDB gets.
GATHER_RECORDS = 32
_TOO_MANY_FILES = (errno.EMFILE, errno.ENFILE)


class PartProvider(Protocol):
    """Where a lazily opened reader gets its parts (streaming reads, ``yogacache.store.streaming``).

    ``acquire(i)`` returns the local path of part ``i``, fetched if need be and verified against
    the manifest (size and content hash), and keeps it from eviction until ``release(i)``.
    ``expect(order)`` announces the parts the reader will need next, in order of first use, so
    that they can be fetched ahead. ``prefetch(i)`` starts fetching part ``i`` in the background
    without announcing anything (for a process that reads nothing itself). ``keep_open`` is how
    many parts the reader keeps between reads (parts being read are held besides). ``on_idle(f)``
    hands the provider the reader's method that gives up the parts it keeps between reads, which
    the provider calls while a fetch waits; ``close()`` releases whatever the reader still holds.
    """

    keep_open: int
    # How long the reader reads each part against the node's other readers (``set_part_pace``).
    scale: float
    # How many streamed readers of the process share the budget's room for fetches ahead (``set_part_pace``).
    sharing: int

    def acquire(self, index: int) -> Path: ...

    def release(self, index: int) -> None: ...

    def expect(self, order: Sequence[int]) -> None: ...

    def prefetch(self, index: int) -> None: ...

    def on_idle(self, give_up: Callable[[], None]) -> None: ...

    def close(self) -> None: ...


def _close_provider(provider: PartProvider) -> None:
    """A streamed reader was collected without ``close()``: its provider releases the parts it
    holds in this process (a provider used only in another process does nothing here)."""
    provider.close()


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class _PartEnvironment:
    """One part's read-only LMDB environment, and the process that opened it.

    Reads go through a read-only transaction per thread, begun on the first read and reused
    by every later one (a sealed file never changes, so a transaction never goes stale):
    single records cost one B-tree search in LMDB, no transaction each. The part file is also
    mapped read-only (``data``): batches of fixed-layout records are gathered from the map with
    numpy (``format.pages.PartTree``: the B-tree's shape, a few numbers, read on the first
    batch), not one LMDB ``get`` each. Nothing is kept per record: a process's memory does not
    grow with the part's record count. If the part is not laid out as expected, reads go
    through LMDB.
    """

    __slots__ = ("env", "pid", "data", "_tree", "_lock", "_local", "__weakref__")

    def __init__(self, env: Any, pid: int, data: Optional[np.ndarray] = None) -> None:
        self.env = env
        self.pid = pid
        self.data = data
        self._tree: Optional[PartTree] = None
        self._lock = threading.Lock()
        self._local = threading.local()

    def reading(self) -> Any:
        """This thread's read-only transaction of the part (buffers valid while it lives)."""
        txn = getattr(self._local, "txn", None)
        if txn is None:
            txn = self._local.txn = self.env.begin(buffers=True)
        return txn

    def tree(self, record_size: int, entries: int) -> Optional[PartTree]:
        """The part's B-tree shape for records of ``record_size`` bytes, read on first use;
        None for good if the part cannot be read that way (the map is then released)."""
        found = self._tree
        if found is not None and found.record_size == record_size:
            return found
        with self._lock:
            data = self.data
            if data is None:
                return None
            found = part_tree(data, record_size, entries)
            if found is None:
                self.data = None  # not laid out as expected: LMDB reads it, the map is released
            self._tree = found
        return found

    def not_gathered(self) -> None:
        """A gather found a record elsewhere than the tree's shape puts it: LMDB reads the part
        from now on (its map is released)."""
        with self._lock:
            self.data = None
            self._tree = None


# LMDB refuses to open one file twice in a process, and an environment must never cross
# fork(): readers of the same part share one environment per process, keyed by the file's
# (st_dev, st_ino). A slot of another process was inherited across fork().
#
# The registry owns each environment and closes it itself, under its lock, once no reader of
# the process holds the part (its ``_PartEnvironment`` is gone). Were the environment closed by
# its last reference instead, that could happen on any thread (a finished offsets builder, a
# collected reader) with the interpreter lock released inside LMDB's close, while py-lmdb still
# counts the file as open: a reader opened meanwhile on another thread would be refused.
class _Slot:
    __slots__ = ("holder", "env")

    def __init__(self, holder: weakref.ref[_PartEnvironment], env: Any) -> None:
        self.holder = holder
        self.env = env  # outlives the holder until the registry closes it


_environments: dict[tuple[int, int], _Slot] = {}
_environments_lock = threading.RLock()  # re-entered when a collection releases a part meanwhile


def _close(key: tuple[int, int], slot: _Slot) -> None:
    """Closes ``slot``'s environment, and takes it out of the registry if it is still there
    (the caller holds the lock)."""
    if _environments.get(key) is slot:
        del _environments[key]
    slot.env.close()


def _released(key: tuple[int, int], holder: weakref.ref[_PartEnvironment]) -> None:
    """Closes the environment of ``key`` once its last holder is gone (unless it was replaced)."""
    with _environments_lock:
        slot = _environments.get(key)
        if slot is not None and slot.holder is holder:
            _close(key, slot)


def _reset_lock_after_fork() -> None:
    global _environments_lock
    _environments_lock = threading.RLock()  # another thread may have held it at fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock_after_fork)


def _reach(fd: int) -> Optional[Path]:
    """A path that opens the file held by ``fd`` itself (None where /proc is missing)."""
    return _PROC_FDS / str(fd) if _PROC_FDS.is_dir() else None


# (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of a part as this reader opened it.
FileIdentity = tuple[int, int, int, int, int]


def _identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _same_file(fd: int, identity: FileIdentity) -> bool:
    """Whether ``fd`` holds the file ``identity`` describes, unchanged, at its name. The device
    is left out: it differs between clients of one network filesystem."""
    return _identity(os.fstat(fd))[1:] == identity[1:]


def _held_file(fd: int, identity: FileIdentity) -> bool:
    """Whether ``fd`` holds the very file ``identity`` describes, reached through a descriptor
    that a process of this reader still holds. Its ctime is left out: removing the file's name
    (a rebuild deletes the old build) moves it, while its bytes stay what was verified."""
    return _identity(os.fstat(fd))[:4] == identity[:4]


def _own_descriptors() -> dict[tuple[int, int], int]:
    """This process's descriptors of regular files, by (st_dev, st_ino)."""
    found: dict[tuple[int, int], int] = {}
    try:
        names = os.listdir(_PROC_FDS)
    except OSError:
        return found
    for name in names:
        try:
            st = os.fstat(int(name))
        except (OSError, ValueError):
            continue  # the listing's own descriptor, closed by now
        if st.st_mode & 0o170000 == 0o100000:
            found.setdefault((st.st_dev, st.st_ino), int(name))
    return found


def _descriptor_limit() -> int:
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return -1
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def make_room_for_descriptors(count: int) -> None:
    """Raises this process's soft limit on open files (up to the hard limit) when ``count``
    more files would take more than half of it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not Unix
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or count <= soft // 2:
        return
    wanted = soft + count
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if wanted <= soft:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return
    log.info("raised the open files limit from %d to %d for %d cache parts", soft, wanted, count)


@contextlib.contextmanager
def _explain_descriptor_errors(parts: int, directory: Path) -> Iterator[None]:
    """Says "too many open files" (with what to do) when the descriptor limit is the cause."""
    try:
        yield
    except OSError as error:
        if error.errno not in _TOO_MANY_FILES:
            raise
        raise OSError(
            error.errno,
            f"too many open files ({parts} parts, limit {_descriptor_limit()}): raise ulimit -n "
            f"to read the cache at {directory}, which holds one open file per part",
        ) from error


def _environment(key: tuple[int, int], descriptor: Callable[[], int], readahead: bool, shown: Path) -> _PartEnvironment:
    """This process's environment for the file ``key``; ``descriptor()`` gives a new descriptor
    of that file (closed here) when the environment must be opened.

    ``readahead`` suits records that span many pages; without it (MADV_RANDOM) a random read
    of a small record faults in only the pages it needs.
    """
    pid = os.getpid()
    with _environments_lock:
        slot = _environments.get(key)
        if slot is not None:
            found = slot.holder()
            if found is not None and found.pid == pid:
                return found
        fd = descriptor()
        try:
            if slot is not None:
                # Inherited across fork() (never used here), or released and not closed yet.
                # py-lmdb refuses a second environment on a file while one is open, so close
                # this process's copy (read-only, lock-free: another process's stays
                # untouched); ``fd`` holds the file. A collection may have released it meanwhile.
                _close(key, slot)
            reach = _reach(fd)
            try:
                env = lmdb.open(
                    str(reach or shown),
                    subdir=False,
                    readonly=True,
                    lock=False,  # sealed files never change
                    readahead=readahead,
                    max_readers=1024,
                )
            except lmdb.Error as error:
                if os.strerror(errno.EMFILE) in str(error) or os.strerror(errno.ENFILE) in str(error):
                    raise OSError(errno.EMFILE, str(error)) from error
                raise CorruptCacheError(f"cache part {shown} cannot be opened by LMDB: {error}") from error
            data = map_file(fd, random_access=not readahead)
        finally:
            os.close(fd)
        entry = _PartEnvironment(env, pid, data)
        _environments[key] = _Slot(weakref.ref(entry, functools.partial(_released, key)), env)
        return entry


def _only(manifest: Manifest, part: PartInfo) -> Manifest:
    """``manifest`` narrowed to one part, to verify that part alone."""
    return dataclasses.replace(manifest, parts=(part,))


class CacheReader:
    """Reads records of a sealed cache by index; a context manager (``close()`` on exit)."""

    def __init__(
        self,
        directory: Path,
        manifest: Optional[Manifest] = None,
        verify: Verify = "auto",
        *,
        part_provider: Optional[PartProvider] = None,
    ) -> None:
        """``part_provider``: open parts lazily, on first read, at the paths the provider gives (a
        streamed cache); ``directory`` then only names the cache in messages."""
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
        self.directory = Path(directory)
        self.manifest = manifest or Manifest.load(self.directory)
        self.codec = RecordCodec(self.manifest.element_spec)
        self._verify: Verify = verify
        self._closed = False
        # Read ahead when records span pages, or when the whole cache fits easily in memory
        # (cold passes then fill the page cache in large reads); a cache larger than memory
        # read at random is better served page by page.
        self._readahead = self.manifest.average_record_bytes >= LARGE_RECORD_BYTES or (
            self.manifest.total_size_bytes < _physical_memory() // 2
        )
        self._firsts = [p.first_record for p in self.manifest.parts]
        self._starts = np.array(self._firsts, dtype=np.int64)
        # Record index - key, per part: 0 except in parallel builds whose shards key from 0.
        self._shifts = [p.key_shift for p in self.manifest.parts]
        self._key_shifts = np.array(self._shifts, dtype=np.int64) if any(self._shifts) else None
        # The process that opened the parts and its descriptor number of each, as last sent
        # to another process (see __getstate__).
        self._opener: tuple[int, dict[str, int]] = (os.getpid(), {})
        self._identities: list[FileIdentity] = []
        held: list[_PartEnvironment] = []
        self._provider = part_provider
        # Lazily opened parts (with a provider): part number -> environment, least recent first;
        # and the reads of this process in progress on each (a part being read is never given up).
        self._lazy: dict[int, _PartEnvironment] = {}
        self._using: dict[int, int] = {}
        self._lazy_lock = threading.Lock()
        if part_provider is not None:
            self._held = []
            self._pid = os.getpid()
            self._attach_provider()
            return
        parts = self.manifest.parts
        make_room_for_descriptors(len(parts))
        with _explain_descriptor_errors(len(parts), self.directory):
            for part in parts:
                path = self.directory / part.name
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise CorruptCacheError(f"cache part {path} is missing") from None
                try:
                    identity = _identity(os.fstat(fd))
                    reach = _reach(fd)
                    opened = {part.name: reach} if reach else None
                    verify_parts(self.directory, _only(self.manifest, part), verify, opened=opened)
                    held.append(self._attach(part, identity, functools.partial(os.dup, fd)))
                finally:
                    os.close(fd)
                self._identities.append(identity)
        self._held = held
        self._pid = os.getpid()

    def _attach(self, part: PartInfo, identity: FileIdentity, descriptor: Callable[[], int]) -> _PartEnvironment:
        """This process's environment of ``part``, checked against the manifest's record count."""
        shown = self.directory / part.name
        entry = _environment(identity[:2], descriptor, self._readahead, shown)
        try:
            entries = entry.env.stat()["entries"]
        except lmdb.Error as error:
            raise CorruptCacheError(f"cache part {shown} cannot be opened by LMDB: {error}") from error
        if entries != part.num_records:
            raise CorruptCacheError(f"cache part {shown} holds {entries} records, the manifest says {part.num_records}")
        return entry

    # -- reopening in another process ------------------------------------------------------------
    def _reopen(self) -> None:
        """Opens this process's environments of the parts this reader was opened on."""
        if self._closed:
            raise ValueError(f"this reader of the cache at {self.directory} is closed: open the cache again")
        parts = self.manifest.parts
        # Environments opened before fork() left their descriptors to this process.
        inherited: Optional[dict[tuple[int, int], int]] = None
        if self._pid != -1:
            inherited = _own_descriptors()
        make_room_for_descriptors(len(parts))
        held = []
        with _explain_descriptor_errors(len(parts), self.directory):
            for part, identity in zip(parts, self._identities):
                descriptor = functools.partial(self._descriptor_of, part, identity, inherited)
                held.append(self._attach(part, identity, descriptor))
        self._held = held
        self._pid = os.getpid()

    def _descriptor_of(
        self, part: PartInfo, identity: FileIdentity, inherited: Optional[dict[tuple[int, int], int]]
    ) -> int:
        """A new descriptor of ``part`` as this reader was opened on, else CacheReplacedError."""
        fd = (inherited or {}).get(identity[:2])
        if fd is not None and _held_file(fd, identity):
            return os.dup(fd)
        opener, numbers = self._opener
        number = numbers.get(part.name)
        if number is not None and opener != os.getpid():
            # The opening process (a DataLoader's main process) holds the file while it lives.
            try:
                fd = os.open(f"/proc/{opener}/fd/{number}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError as error:
                if error.errno in _TOO_MANY_FILES:
                    raise
                fd = None
            if fd is not None:
                if _held_file(fd, identity):
                    return fd
                os.close(fd)
        path = self.directory / part.name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        try:
            if fd is not None and _same_file(fd, identity):
                return fd
            self._check_same_build(part, fd)
            if fd is None:
                raise CorruptCacheError(f"cache part {path} is missing")
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return fd

    def _check_same_build(self, part: PartInfo, fd: Optional[int]) -> None:
        """The part's name reaches another file: it may serve only if the cache is still the
        same build (a sync copied it again) and the file passes verification."""
        manifest = self.manifest
        name = f"{manifest.dataset_id}:{manifest.dataset_version}"
        try:
            current = Manifest.load(self.directory)
        except CacheNotFoundError:
            raise CacheReplacedError(
                f"cache {name} at {self.directory} was removed since this reader was opened "
                f"(build {manifest.build_id}); reopen it"
            ) from None
        if current.build_id != manifest.build_id:
            raise CacheReplacedError(
                f"cache {name} at {self.directory} was rebuilt since this reader was opened "
                f"(build {manifest.build_id}, now {current.build_id}); reopen it"
            )
        if fd is None:
            return  # the caller reports the missing part
        reach = _reach(fd)
        verify_parts(self.directory, _only(manifest, part), self._verify, opened={part.name: reach} if reach else None)

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Releases this reader's part files (each closes once no reader of the process holds
        it). Idempotent; reading afterwards raises ValueError."""
        self._closed = True
        self._release_lazy()
        self._held = []
        self._pid = -1

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> CacheReader:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __len__(self) -> int:
        return self.manifest.num_records

    @property
    def spec(self) -> Any:
        return self.manifest.element_spec

    @property
    def average_record_bytes(self) -> int:
        return self.manifest.average_record_bytes

    def _environments(self) -> list[_PartEnvironment]:
        """This process's environments of the parts; a read keeps the list while it runs
        (a part's environment closes when no list holds it)."""
        if self._pid != os.getpid():
            # Never reuse an environment opened before fork(): open our own.
            self._reopen()
        return self._held

    def read_values(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The encoded records at ``indices``, in that order."""
        return self._read(indices, lambda values: [bytes(value) for value in values])

    def _read(self, indices: Sequence[int] | np.ndarray, consume: Callable[[list[Any]], T]) -> T:
        """Calls ``consume`` with the records at ``indices`` (as buffers valid during the call)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.manifest.num_records):
            raise IndexError(f"record index out of range [0, {self.manifest.num_records})")
        if self._provider is not None:
            return self._read_lazily(indices, consume)
        held = self._environments()
        if not held:
            return consume([])
        reads = [(held[part], keys, positions) for part, keys, positions in self._by_part(indices)]
        return self._read_parts(reads, len(indices), consume)

    def _by_part(
        self, indices: np.ndarray, *, request_order: bool = False
    ) -> list[tuple[int, np.ndarray, Optional[np.ndarray]]]:
        """``indices`` split by the part holding them: (part number, the records' keys in that
        part, their positions in ``indices``; None when one part holds them all). The one lookup
        of a record's part and key, for eager, gathered and lazy (streamed) reads alike: parts of
        build shards key their records from 0 (``PartInfo.key_shift``). Parts come in part order,
        or in the order ``indices`` first touch them (``request_order``)."""
        shifts = self._key_shifts
        if len(self._starts) == 1 or len(indices) == 0:
            return [(0, indices if shifts is None else indices - shifts[0], None)]
        owner = np.searchsorted(self._starts, indices, side="right") - 1
        parts, first = np.unique(owner, return_index=True)
        if request_order:
            parts = owner[np.sort(first)]
        split: list[tuple[int, np.ndarray, Optional[np.ndarray]]] = []
        for part in parts.tolist():
            positions = np.nonzero(owner == part)[0]
            keys = indices[positions] if shifts is None else indices[positions] - shifts[part]
            split.append((part, keys, positions))
        return split

    def _read_parts(
        self,
        reads: list[tuple[_PartEnvironment, np.ndarray, Optional[np.ndarray]]],
        count: int,
        consume: Callable[[list[Any]], T],
    ) -> T:
        """Gathers buffers from each part's read transaction of this thread (no record is
        copied) and hands them to ``consume`` in the order of the request."""
        try:
            values: list[Any] = [None] * count if reads[0][2] is not None else []
            for entry, indices, positions in reads:
                get = entry.reading().get
                keys = indices.astype(">u8").view("V8").tolist()  # 8-byte big-endian keys
                if positions is None:
                    values = [get(key) for key in keys]
                else:
                    for position, key in zip(positions.tolist(), keys):
                        values[position] = get(key)
            if None in values:
                raise CorruptCacheError(f"cache {self.directory} is missing records its manifest lists")
            # Buffers point into the maps, which the parts' environments (held by the caller's
            # list of them) keep: consume them here.
            return consume(values)
        except lmdb.Error as error:
            raise CorruptCacheError(f"reading {self.directory} failed: {error}") from error

    def __getitem__(self, index: int) -> Any:
        return unflatten(self.read_leaves(index), self.spec)

    def read_leaves(self, index: int) -> list[Any]:
        """The flat leaves of record ``index``, as row 0 of ``read_columns([index])`` gives them
        for fixed-shape specs (numpy scalars, arrays of their own), as ``codec.decode`` does for
        the others: one B-tree search in this thread's transaction of the part, one decode."""
        layout = self.codec.layout
        if not self.codec.stackable:
            decode: Callable[[Any], list[Any]] = self.codec.decode
        elif layout is not None:
            decode = layout.decode_record
        else:
            return [column[0] for column in self.read_columns([index])]
        index = operator.index(index)
        if not 0 <= index < self.manifest.num_records:
            raise IndexError(f"record index out of range [0, {self.manifest.num_records})")
        if self._provider is not None:
            return self._read_lazily(np.array([index], dtype=np.int64), lambda values: decode(values[0]))
        held = self._environments()
        part = bisect.bisect_right(self._firsts, index) - 1
        entry = held[part]  # held while its buffer is read
        try:
            value = entry.reading().get((index - self._shifts[part]).to_bytes(8, "big"))
        except lmdb.Error as error:
            raise CorruptCacheError(f"reading {self.directory} failed: {error}") from error
        if value is None:
            raise CorruptCacheError(f"cache {self.directory} is missing records its manifest lists")
        return decode(value if layout is not None else bytes(value))

    def read_elements(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Decoded nested elements at ``indices``."""
        spec = self.spec
        decode = self.codec.decode
        return self._read(indices, lambda values: [unflatten(decode(bytes(value)), spec) for value in values])

    def read_columns(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """One stacked array per leaf for the records at ``indices`` (fixed-shape specs only)."""
        layout = self.codec.layout
        if layout is not None and layout.by_table and len(indices) >= GATHER_RECORDS:
            table = self._gather(indices, layout)
            if table is not None:
                return layout.decode_table(table)
        return self._read(indices, self.codec.decode_columns)

    def _gather(self, indices: Sequence[int] | np.ndarray, layout: FixedLayout) -> Optional[np.ndarray]:
        """The records at ``indices`` as one table of whole records, gathered from the parts'
        maps (``_PartEnvironment.tree``); None where that path does not apply: then ``_read``
        reads them through LMDB."""
        if self._provider is not None or self._closed:
            return None
        indices = np.asarray(indices, dtype=np.int64)
        if not len(indices) or indices.min() < 0 or indices.max() >= self.manifest.num_records:
            return None  # nothing to gather, or _read reports the bad index
        held = self._environments()  # reopens after fork(); held while the read runs
        size = layout.record_size
        out: Optional[np.ndarray] = None
        for part, keys, positions in self._by_part(indices):  # only the parts this read touches
            entry = held[part]
            tree = entry.tree(size, self.manifest.parts[part].num_records)
            if tree is None:
                return None
            taken = tree.take(keys - tree.first_key)
            if taken is None:
                entry.not_gathered()
                return None
            if positions is None:
                return taken
            if out is None:
                out = np.empty((len(indices), size), dtype=np.uint8)
            out[positions] = taken
        return out

    # -- lazily opened parts (streamed caches) -----------------------------------------------------
    @property
    def streamed(self) -> bool:
        """Whether this reader's parts arrive through a part provider (a streamed cache)."""
        return self._provider is not None

    @property
    def streaming_budget(self) -> Optional[int]:
        """The node's byte budget for this streamed cache's parts; None for local files or no budget."""
        limit = getattr(self._provider, "limit", None) if self._provider is not None else None
        return limit if isinstance(limit, int) else None

    def prefetch_part(self, index: int) -> None:
        """Starts fetching part ``index`` in the background (a streamed reader; a no-op for local
        files), announcing no read order: what a DataLoader's main process, which reads nothing,
        does once its workers are started, so that they find the part they start with on its
        way instead of starting its fetch after their own start-up."""
        if self._provider is not None and not self._closed:
            self._provider.prefetch(index)

    def set_part_pace(self, scale: float, sharing: int = 1) -> None:
        """How long this reader reads each of its parts against the node's other readers (1: as
        long; a mixture's component read half as often as the fastest: 2), so that eviction
        compares read orders by when parts are needed (``budget.ProcessLease.announce``), and
        how many streamed readers of this process (a mixture's streamed components) share the
        budget's room for fetches ahead. A no-op for local files."""
        if self._provider is not None:
            self._provider.scale = float(scale)
            self._provider.sharing = max(1, int(sharing))

    def expect_parts(self, epochs: Callable[[], Sequence[Sequence[int]]]) -> None:
        """Tells the part provider (if any) which parts the reader reads, in order of first use:
        ``epochs()`` lists this epoch's, then the next epoch's (each part once per epoch), so
        that it fetches them ahead and, at the end of an epoch, keeps what the next one starts
        with. ``epochs`` is called only for a streamed reader: a no-op for local files."""
        if self._provider is None or self._closed:
            return
        self._provider.expect([int(part) for parts in epochs() for part in parts])

    def _attach_provider(self) -> None:
        """Gives the provider this reader's ``release_idle`` (held weakly) and, should the reader
        be collected without ``close()``, releases its parts then."""
        provider = self._provider
        if provider is None:
            return
        on_idle = getattr(provider, "on_idle", None)
        if on_idle is not None:
            on_idle(self.release_idle)
        if getattr(provider, "close", None) is not None:
            finalizer = weakref.finalize(self, _close_provider, provider)
            finalizer.atexit = False

    def _read_lazily(self, indices: np.ndarray, consume: Callable[[list[Any]], T]) -> T:
        """``_read`` through the provider: one part at a time, its records copied out, so that
        a read holds one part at a time whatever the number of parts it spans, and never waits
        for a part while it holds another. Reads on several threads share the reader's parts."""
        if self._closed:
            raise ValueError(f"this reader of the cache at {self.directory} is closed: open the cache again")
        if self._pid != os.getpid():
            # Environments never cross fork(); the parent's pins are its own.
            self._lazy, self._using, self._lazy_lock = {}, {}, threading.Lock()
            self._pid = os.getpid()
        values: list[Any] = [None] * len(indices)
        try:
            for part, keys, positions in self._by_part(indices, request_order=True):
                entry = self._use_part(part)  # held while its part is read
                try:
                    at = range(len(indices)) if positions is None else positions.tolist()
                    get = entry.reading().get
                    for position, key in zip(at, keys.astype(">u8").view("V8").tolist()):
                        value = get(key)
                        values[position] = None if value is None else bytes(value)
                finally:
                    self._done_with_part(part)
        except lmdb.Error as error:
            raise CorruptCacheError(f"reading {self.directory} failed: {error}") from error
        if None in values:
            raise CorruptCacheError(f"cache {self.directory} is missing records its manifest lists")
        return consume(values)

    def _use_part(self, index: int) -> _PartEnvironment:
        """This process's environment of part ``index``, held for one read until
        ``_done_with_part``; acquired from the provider when the reader does not hold it (which
        may wait for the part: the reader then holds only parts other reads are reading)."""
        provider = self._provider
        if provider is None:
            raise ValueError(f"the reader of {self.directory} opens its parts eagerly: it has no part provider")
        with self._lazy_lock:
            entry = self._lazy.pop(index, None)
            if entry is not None:
                self._lazy[index] = entry  # the most recent
                self._using[index] = self._using.get(index, 0) + 1
                return entry
        entry = self._open_part(index)
        with self._lazy_lock:
            found = self._lazy.pop(index, None)  # another read opened it meanwhile: one hold
            self._lazy[index] = found if found is not None else entry
            self._using[index] = self._using.get(index, 0) + 1
            released = self._trim(max(1, provider.keep_open))
        if found is not None:
            released.append(index)
            entry = found
        for part in released:
            provider.release(part)
        return entry

    def _open_part(self, index: int) -> _PartEnvironment:
        """Acquires part ``index`` from the provider and opens its environment (released again
        when that fails)."""
        provider = self._provider
        if provider is None:
            raise RuntimeError(f"part {index} of {self.directory}: this reader reads its parts in place (no provider)")
        part = self.manifest.parts[index]
        path = provider.acquire(index)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if st.st_size != part.size_bytes:
                    raise CorruptCacheError(
                        f"cache part {path} holds {st.st_size} bytes, the manifest says {part.size_bytes}"
                    )
                return self._attach(part, _identity(st), functools.partial(os.dup, fd))
            finally:
                os.close(fd)
        except BaseException:
            provider.release(index)
            raise

    def _done_with_part(self, index: int) -> None:
        """A read of part ``index`` is done: the reader keeps at most ``keep_open`` parts that
        no read is reading; the least recently used beyond that are closed and released."""
        provider = self._provider
        if provider is None:
            return
        with self._lazy_lock:
            count = self._using.get(index, 0) - 1
            if count > 0:
                self._using[index] = count
            else:
                self._using.pop(index, None)
            released = self._trim(max(1, provider.keep_open))
        for part in released:
            provider.release(part)

    def _trim(self, keep: int) -> list[int]:
        """Takes the least recently used parts no read is reading out of the reader until it
        holds ``keep`` (or only parts being read); the caller holds the lock and releases them."""
        released = []
        for part in list(self._lazy):
            if len(self._lazy) <= keep:
                break
            if part not in self._using:
                del self._lazy[part]
                released.append(part)
        return released

    def release_idle(self) -> None:
        """Gives up every part no read of this reader is reading now (the provider calls it
        while a fetch of this process waits: no reader waits holding room it could free)."""
        provider = self._provider
        if provider is None or self._pid != os.getpid():
            return
        with self._lazy_lock:
            released = self._trim(0)
        for part in released:
            provider.release(part)

    def _release_lazy(self) -> None:
        lazy, self._lazy = getattr(self, "_lazy", {}), {}
        self._using = {}
        provider = getattr(self, "_provider", None)
        if provider is not None and getattr(self, "_pid", None) == os.getpid():
            for index in lazy:
                provider.release(index)
            stop = getattr(provider, "close", None)
            if stop is not None:
                stop()  # no more fetching ahead for this reader; it leaves the node's lease

    def __getstate__(self) -> dict[str, Any]:
        # Sending a reader to another process (DataLoader spawn) sends what it was opened on:
        # the manifest, each part's identity, and where this process holds each part.
        state = dict(self.__dict__)
        state["_held"] = []
        state["_pid"] = -1
        state["_lazy"] = {}
        state["_using"] = {}
        del state["_lazy_lock"]
        del state["codec"]  # holds a msgpack Packer, which does not pickle: rebuilt on arrival
        if self._pid == os.getpid():
            held = _own_descriptors()
            numbers = {
                part.name: held[identity[:2]]
                for part, identity in zip(self.manifest.parts, self._identities)
                if identity[:2] in held
            }
            state["_opener"] = (os.getpid(), numbers)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.codec = RecordCodec(self.manifest.element_spec)
        self._lazy_lock = threading.Lock()
        self._attach_provider()
