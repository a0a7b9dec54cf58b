"""CacheReader: random access to the records of one sealed cache, checked before LMDB touches it.

Opening checks the manifest, the part files' exact sizes and (unless a stamp shows the files
are unchanged since they were last hashed) their SHA-256, so that a truncated or altered part
raises CorruptCacheError instead of reaching LMDB, which may crash on a damaged file. LMDB
environments open read-only and lazily per process: a reader that crosses ``fork()`` reopens.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar

import lmdb
import numpy as np

from yogacache.errors import CorruptCacheError
from yogacache.format.codec import RecordCodec
from yogacache.format.integrity import Verify, verify_parts
from yogacache.format.manifest import Manifest, PartInfo
from yogacache.format.spec import unflatten

log = logging.getLogger(__name__)
T = TypeVar("T")
_PROC_FDS = Path("/proc/self/fd")
# Records this large span several pages: reading ahead beats faulting page by page.
LARGE_RECORD_BYTES = 32 << 10

# LMDB refuses to open one file twice in a process, and an environment must never cross
# fork(): readers of the same part share one environment per process, keyed by file identity.
_open_environments: weakref.WeakValueDictionary[tuple[int, int], Any] = weakref.WeakValueDictionary()
_open_environments_pid = os.getpid()
_open_environments_lock = threading.Lock()


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def shared_environment(path: Path, readahead: bool = False) -> Any:
    """This process's read-only environment for the sealed part at ``path``.

    ``readahead`` suits records that span many pages; without it (MADV_RANDOM) a random read
    of a small record faults in only the pages it needs.
    """
    global _open_environments, _open_environments_pid
    with _open_environments_lock:
        if _open_environments_pid != os.getpid():
            # Inherited across fork(): never use the parent's environments. py-lmdb remembers
            # every open file process-wide (fork included) and refuses to open it again, so
            # close this process's copies (read-only, lock-free: the parent's stay untouched).
            for inherited in list(_open_environments.values()):
                inherited.close()
            _open_environments = weakref.WeakValueDictionary()
            _open_environments_pid = os.getpid()
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        env = _open_environments.get(key)
        if env is None:
            env = lmdb.open(
                str(path),
                subdir=False,
                readonly=True,
                lock=False,  # sealed files never change
                readahead=readahead,
                max_readers=1024,
            )
            _open_environments[key] = env
        return env

class CacheReader:
    """Reads records of a sealed cache by index."""

    def __init__(
        self, directory: Path, manifest: Optional[Manifest] = None, verify: Verify = "auto"
    ) -> None:
        self.directory = Path(directory)
        self.manifest = manifest or Manifest.load(self.directory)
        # Hold each part open: if the cache is replaced later (a rebuild, a sync), this
        # reader keeps reading the files it verified, never the new build's.
        self._fds: dict[str, int] = {}
        self._fds_pid = os.getpid()
        try:
            for part in self.manifest.parts:
                path = self.directory / part.name
                try:
                    self._fds[part.name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise CorruptCacheError(f"cache part {path} is missing") from None
            verify_parts(self.directory, self.manifest, verify, opened=self._part_paths())
        except BaseException:
            self._close_fds()
            raise
        self.codec = RecordCodec(self.manifest.element_spec)
        # Read ahead when records span pages, or when the whole cache fits easily in memory
        # (cold passes then fill the page cache in large reads); a cache larger than memory
        # read at random is better served page by page.
        self._readahead = self.manifest.average_record_bytes >= LARGE_RECORD_BYTES or (
            self.manifest.total_size_bytes < _physical_memory() // 2
        )
        self._starts = np.array([p.first_record for p in self.manifest.parts], dtype=np.int64)
        self._envs: list[Any] = []
        self._pid = -1

    def _part_paths(self) -> dict[str, Path]:
        """Paths that reach the held files (through /proc), where the platform has them."""
        if not self._fds or not _PROC_FDS.is_dir():
            return {}
        return {name: _PROC_FDS / str(fd) for name, fd in self._fds.items()}

    def _close_fds(self, _getpid: Callable[[], int] = os.getpid, _close: Callable[[int], None] = os.close) -> None:
        # The functions are bound at definition: at interpreter exit (TensorFlow's function
        # registry can keep a reader alive until then) the ``os`` global may already be None.
        if self._fds_pid == _getpid():
            for fd in self._fds.values():
                try:
                    _close(fd)
                except OSError:
                    pass
        self._fds = {}

    def __del__(self) -> None:
        self._close_fds()

    def __len__(self) -> int:
        return self.manifest.num_records

    @property
    def spec(self) -> Any:
        return self.manifest.element_spec

    def _environments(self) -> list[Any]:
        if self._pid != os.getpid():
            # Never reuse an environment opened before fork(): open our own.
            self._envs = [self._open_part(part) for part in self.manifest.parts]
            self._pid = os.getpid()
        return self._envs

    def _open_part(self, part: PartInfo) -> Any:
        # Forked children inherit the held descriptors; spawned ones reopen by name.
        shown = self.directory / part.name
        path = self._part_paths().get(part.name, shown)
        try:
            env = shared_environment(path, readahead=self._readahead)
            entries = env.stat()["entries"]
        except (lmdb.Error, OSError) as error:
            raise CorruptCacheError(f"cache part {shown} cannot be opened by LMDB: {error}") from error
        path = shown
        if entries != part.num_records:
            raise CorruptCacheError(
                f"cache part {path} holds {entries} records, the manifest says {part.num_records}"
            )
        return env

    def read_values(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """The encoded records at ``indices``, in that order."""
        return self._read(indices, lambda values: [bytes(value) for value in values])

    def _read(self, indices: Sequence[int] | np.ndarray, consume: Callable[[list[Any]], T]) -> T:
        """Calls ``consume`` with the records at ``indices`` (as buffers valid during the call)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.manifest.num_records):
            raise IndexError(f"record index out of range [0, {self.manifest.num_records})")
        envs = self._environments()
        if len(envs) == 1 or len(indices) == 0:
            return self._read_parts([(envs[0], indices, None)], len(indices), consume) if envs else consume([])
        owner = np.searchsorted(self._starts, indices, side="right") - 1
        reads: list[tuple[Any, np.ndarray, Optional[np.ndarray]]] = []
        for part_index in np.unique(owner):
            positions = np.nonzero(owner == part_index)[0]
            reads.append((envs[part_index], indices[positions], positions))
        return self._read_parts(reads, len(indices), consume)

    def _read_parts(
        self,
        reads: list[tuple[Any, np.ndarray, Optional[np.ndarray]]],
        count: int,
        consume: Callable[[list[Any]], T],
    ) -> T:
        """Gathers buffers from one read transaction per part (all open at once, so no record
        is copied) and hands them to ``consume`` in the order of the request."""
        try:
            with contextlib.ExitStack() as stack:
                values: list[Any] = [None] * count if reads[0][2] is not None else []
                for env, indices, positions in reads:
                    get = stack.enter_context(env.begin(buffers=True)).get
                    keys = indices.astype(">u8").view("V8").tolist()  # 8-byte big-endian keys
                    if positions is None:
                        values = [get(key) for key in keys]
                    else:
                        for position, key in zip(positions.tolist(), keys):
                            values[position] = get(key)
                if None in values:
                    raise CorruptCacheError(
                        f"cache {self.directory} is missing records its manifest lists"
                    )
                # Buffers point into the maps and die with the transactions: consume them here.
                return consume(values)
        except lmdb.Error as error:
            raise CorruptCacheError(f"reading {self.directory} failed: {error}") from error

    def __getitem__(self, index: int) -> Any:
        (value,) = self.read_values([index])
        return unflatten(self.codec.decode(value), self.spec)

    def read_elements(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        """Decoded nested elements at ``indices``."""
        spec = self.spec
        decode = self.codec.decode
        return self._read(
            indices, lambda values: [unflatten(decode(bytes(value)), spec) for value in values]
        )

    def read_columns(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """One stacked array per leaf for the records at ``indices`` (fixed-shape specs only)."""
        return self._read(indices, self.codec.decode_columns)

    def close(self) -> None:
        """Drops this reader's environments (closed once no reader in the process uses them)."""
        self._envs = []
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        # Sending a reader to another process (DataLoader spawn) sends its location only.
        state = dict(self.__dict__)
        state["_envs"] = []
        state["_pid"] = -1
        state["_fds"] = {}
        del state["codec"]  # holds a msgpack Packer, which does not pickle: rebuilt on arrival
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.codec = RecordCodec(self.manifest.element_spec)
