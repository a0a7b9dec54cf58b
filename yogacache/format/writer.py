"""CacheWriter: appends encoded records to LMDB parts in a temporary sibling, then seals atomically.

The life of a build: ``CacheWriter(target, ...)`` creates ``.<version>.tmp-<build id>`` next to
the target; records are appended in key order with ``putmulti(append=True)`` in bounded
transactions (memory stays bounded whatever the dataset's size); a part rolls over before a
record would take its file past ``part_size_bytes`` (LMDB's pages counted: ``pages.append_bytes``),
so that a part file is never larger, unless a single record is. ``seal()`` syncs every part,
hashes it, writes ``manifest.json`` last, fsyncs files and directory and renames the directory
into place. Leaving the ``with`` block with an exception discards the temporary directory
instead: nothing partial is ever visible.
"""

from __future__ import annotations

import contextlib
import datetime
import queue
import shutil
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Iterable, Optional

import lmdb
import numpy as np

from yogacache import redaction
from yogacache.errors import BuildError, CacheLimitExceededError
from yogacache.format.codec import CODEC_NAME
from yogacache.format.durability import (
    can_start_writeback,
    fsync_path,
    replace_directory,
    start_writeback,
    temp_dir_for,
    write_file_durably,
)
from yogacache.format.integrity import seal_hashes, stamp_verified
from yogacache.format.manifest import MANIFEST_NAME, Manifest, PartInfo, part_name
from yogacache.format.pages import append_bytes, transaction_bytes, widest_leaf_node
from yogacache.format.spec import Spec
from yogacache.malloc import frozen_heap
from yogacache.progress import Progress
from yogacache.version import __version__

log = redaction.get_logger(__name__)

DEFAULT_PART_SIZE = 1 << 30
_TXN_BYTES = 32 << 20
_TXN_RECORDS = 8192
# Records smaller than this (on average, in the first transaction) are committed on the caller's
# thread. py-lmdb takes the interpreter lock back after every record it stores, so a writer
# thread storing small records fights the producing thread for the lock on each one and both
# slow down (measured: a tf.data source of 3 KB records built 1.3x faster inline, its own
# prefetch threads still overlapping); large records spend their time in copies that run
# without the lock, and there the writer thread overlaps them with the producer.
_INLINE_RECORD_BYTES = 16 << 10
# Bytes handed to the writer thread and not yet committed (queued or being written). A batch
# this large is committed on the caller's thread once the writer thread is idle: the source
# then reads its next record only after this one is stored, so a member of hundreds of MiB is
# in memory about twice (the record and its encoding), not four times (three batches behind).
_IN_FLIGHT_BYTES = 2 * _TXN_BYTES
_WRITEBACK_EVERY_BYTES = 64 << 20
_INITIAL_MAP_SIZE = 1 << 30
# Parts are LMDB 0.9 files (data format v1), which every py-lmdb and YogaDL opens. py-lmdb 3
# bundles LMDB 1.0 too and writes its format where LMDB_DEFAULT_LIB_VERSION asks: name 0.9.
_LMDB_FORMAT: dict[str, Any] = {"lib_version": 0} if int(lmdb.__version__.split(".")[0]) >= 3 else {}


@dataclass(frozen=True)
class BuildLimits:
    """Upper bounds on one build; ``None`` means unbounded (the free disk space still applies)."""

    max_records: Optional[int] = None
    max_bytes: Optional[int] = None

    def for_unknown_length(self, directory: Path) -> BuildLimits:
        """These limits for a dataset whose length is unknown until it ends: without a
        ``max_bytes``, one that keeps a reserve of the disk under ``directory`` free (see
        ``unknown_length_bound``), so that a dataset that never ends stops there."""
        if self.max_bytes is not None:
            return self
        existing = next((p for p in (directory, *directory.parents) if p.exists()), directory)
        usage = shutil.disk_usage(existing)
        bound = unknown_length_bound(usage.free, usage.total)
        return self if bound is None else BuildLimits(self.max_records, bound)


UNKNOWN_LENGTH_RESERVE_FRACTION = 0.05
UNKNOWN_LENGTH_RESERVE_MIN = 1 << 30


def unknown_length_bound(free: int, total: int) -> Optional[int]:
    """The default ``max_bytes`` of a build of unknown length: the free space less a reserve of
    5% of the filesystem (at least 1 GiB). None where less than twice the reserve is free: there
    the writer's own free-space check (every build's) is the bound."""
    reserve = max(int(total * UNKNOWN_LENGTH_RESERVE_FRACTION), UNKNOWN_LENGTH_RESERVE_MIN)
    return free - reserve if free > 2 * reserve else None


class CacheWriter:
    """Writes one cache; use as a context manager and call ``add_encoded`` with record batches."""

    def __init__(
        self,
        target: Path,
        dataset_id: str,
        dataset_version: str,
        *,
        limits: BuildLimits = BuildLimits(),
        part_size_bytes: int = DEFAULT_PART_SIZE,
        progress: Optional[Progress] = None,
        initial_map_size: int = _INITIAL_MAP_SIZE,
        first_key: int = 0,
        deterministic: bool = False,
        sync_parts: bool = True,
    ) -> None:
        """``first_key``: the key of the first record (a build shard's part may start past 0);
        ``deterministic``: zero LMDB's unused page space, so the same records give the same bytes
        (a parallel build's parts hash the same whatever the number of workers);
        ``sync_parts=False``: a closed part's write-back is started, not waited for: the caller
        syncs the parts ``finish_parts`` returns before anything names them (a parallel build's
        driver does, while its workers go on with the next shard)."""
        self.first_key = first_key
        self.deterministic = deterministic
        self.sync_parts = sync_parts
        self.target = target
        self.initial_map_size = initial_map_size
        self.dataset_id = dataset_id
        self.dataset_version = dataset_version
        self.build_id = uuid.uuid4().hex
        self.limits = limits
        self.part_size_bytes = max(1, part_size_bytes)
        self._txn_bytes = min(_TXN_BYTES, max(1, self.part_size_bytes // 8))
        self.progress = progress or Progress(f"{dataset_id}:{dataset_version}", enabled=False)
        self.num_records = 0
        self.num_bytes = 0
        self._parts: list[PartInfo] = []
        self._env: Any = None
        self._part_first = 0
        self._page_size = 4096  # the open part's (LMDB's page size is the system's)
        self._widest_leaf = 0  # the widest leaf node of the open part (pages.append_bytes)
        self._unsynced = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._closed = False
        self._written = 0  # records committed by the writer thread
        self._queue: queue.Queue[Optional[tuple[list[tuple[bytes, bytes]], int]]] = queue.Queue(maxsize=2)
        self._thread: Optional[threading.Thread] = None
        self._in_flight = 0  # bytes handed to the writer thread, not yet committed
        self._landed = threading.Condition()
        self._inline: Optional[bool] = None  # decided by the first transaction's record sizes
        self._heap = contextlib.ExitStack()
        self._writeback: Optional[Future[bool]] = None
        self._writeback_pool: Optional[ThreadPoolExecutor] = None
        self._error: Optional[BaseException] = None
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        self.directory = temp_dir_for(target, self.build_id)
        self.directory.mkdir(mode=0o755)
        free = shutil.disk_usage(self.directory).free
        # Leave headroom for LMDB's page overhead and the rest of the system.
        self._disk_budget = int(free * 0.95)

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> CacheWriter:
        self._heap.enter_context(frozen_heap())  # collections walk only what the build makes
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        try:
            if exc_type is not None:
                self.discard()
        finally:
            self._heap.close()

    # -- appending ------------------------------------------------------------------------
    def add_batches(self, batches: Iterable[list[bytes]]) -> None:
        """Appends every batch of encoded records (``RecordSource.encoded_batches``), letting
        each go before the next is made: a source of large records (archive members of
        hundreds of MiB) then holds one batch at a time, not the last one beside the next."""
        for batch in batches:
            self.add_encoded(batch)
            del batch

    def add_encoded(self, values: Iterable[bytes]) -> None:
        """Appends already-encoded records in order (the limits are checked per batch)."""
        if self._closed:
            raise BuildError(f"writer for {self.dataset_id}:{self.dataset_version} is closed")
        batch = values if isinstance(values, list) else list(values)
        if not batch:
            return
        count = len(batch)
        sizes = list(map(len, batch))
        size = sum(sizes)
        max_records = self.limits.max_records
        max_bytes = self.limits.max_bytes
        if max_records is not None and self.num_records + count > max_records:
            raise CacheLimitExceededError(
                f"dataset {self.dataset_id}:{self.dataset_version} has more than "
                f"{max_records} records (max_records); nothing was cached. Raise the "
                "limit or make the dataset finite (take(n))"
            )
        if max_bytes is not None and self.num_bytes + size > max_bytes:
            raise CacheLimitExceededError(
                f"dataset {self.dataset_id}:{self.dataset_version} exceeds {max_bytes} bytes "
                "(max_bytes); nothing was cached. Raise the limit or make the dataset smaller"
            )
        if self.num_bytes + size > self._disk_budget:
            raise BuildError(
                f"dataset {self.dataset_id}:{self.dataset_version} would not fit in the free "
                f"space under {self.target.parent} ({self._disk_budget} bytes usable); "
                "nothing was cached"
            )
        first = self.num_records + self.first_key
        # 8-byte big-endian keys for the whole batch in one numpy call.
        keys = np.arange(first, first + count, dtype=">u8").view("V8").tolist()
        self.num_records += count
        self.num_bytes += size
        position = 0
        while position < count:
            # Up to the record that fills the transaction (parts roll at transaction ends).
            take = min(count - position, _TXN_RECORDS - len(self._pending))
            taken = sum(sizes[position : position + take])
            if self._pending_bytes + taken >= self._txn_bytes:
                taken, end = 0, position
                while self._pending_bytes + taken < self._txn_bytes:
                    taken += sizes[end]
                    end += 1
                take = end - position
            self._pending.extend(zip(keys[position : position + take], batch[position : position + take]))
            self._pending_bytes += taken
            position += take
            if self._pending_bytes >= self._txn_bytes or len(self._pending) >= _TXN_RECORDS:
                self._flush()
        self.progress.update(self.num_records, self.num_bytes)

    def _open_part(self) -> None:
        path = self.directory / part_name(len(self._parts))
        self._env = lmdb.open(
            str(path),
            subdir=False,
            map_size=self.initial_map_size,
            lock=False,  # the build lock and the private directory exclude other writers
            sync=False,  # one explicit sync at seal time
            metasync=False,
            meminit=self.deterministic,
            max_dbs=0,
            **_LMDB_FORMAT,
        )
        self._part_first = self._written
        self._page_size = int(self._env.stat()["psize"])
        self._widest_leaf = 0
        self._unsynced = 0

    def _flush(self) -> None:
        """Commits the pending records: small ones here, large ones on the LMDB thread (this
        blocks while it is two batches behind); see ``_INLINE_RECORD_BYTES``."""
        self._raise_thread_error()
        if not self._pending:
            return
        pending, size = self._pending, self._pending_bytes
        self._pending = []
        self._pending_bytes = 0
        if self._inline is None:
            self._inline = size < _INLINE_RECORD_BYTES * len(pending)
        with self._landed:  # wait for room in the bytes handed to the writer thread
            large = size >= _IN_FLIGHT_BYTES
            while self._in_flight and (large or self._in_flight + size > _IN_FLIGHT_BYTES):
                self._landed.wait()
            self._raise_thread_error()
            if not (self._inline or large):
                self._in_flight += size
        if self._inline or large:
            try:
                self._write_batch(pending, size)
            except Exception as error:  # reported as the writer thread's errors are
                self._error = error
                self._raise_thread_error()
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._write_loop, name=f"yogacache-writer-{self.build_id[:8]}", daemon=True
            )
            self._thread.start()
        self._queue.put((pending, size))

    def _write_loop(self) -> None:
        """Runs in the writer thread: commits batches so that encoding and I/O overlap."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self._error is None:  # after an error, drain so the producer never blocks
                    self._write_batch(*item)
            except BaseException as error:  # handed to the producer thread
                self._error = error
            finally:
                with self._landed:
                    self._in_flight -= item[1]
                    self._landed.notify_all()

    def _write_batch(self, pending: list[tuple[bytes, bytes]], size: int) -> None:
        """Commits ``pending`` (``size`` bytes of values) to the open part, rolling to a new part
        before a record would take the part's file past ``part_size_bytes`` (``_fitting``); a
        record too large for any part of that size gets a part of its own."""
        sizes = np.fromiter((len(value) for _, value in pending), dtype=np.int64, count=len(pending))
        start = 0
        while start < len(pending):
            if self._env is None:
                self._open_part()
            take = self._fitting(sizes[start:])
            if take == 0:
                if self._written > self._part_first:
                    self._close_part()
                    continue
                take = 1
            self._commit(pending[start : start + take] if take < len(pending) else pending)
            taken = sizes[start : start + take]
            self._widest_leaf = max(self._widest_leaf, widest_leaf_node(taken, self._page_size))
            self._written += take
            self._unsynced += int(taken.sum())
            start += take
        if self._unsynced >= _WRITEBACK_EVERY_BYTES:
            # Start writing back while the source keeps producing, so sealing waits for little.
            self._start_writeback()
            self._unsynced = 0

    def _fitting(self, sizes: np.ndarray[Any, Any]) -> int:
        """How many of the records of ``sizes`` the open part takes in one transaction without
        its file growing past ``part_size_bytes``: the file's size now, plus what each record
        adds at most (``pages.append_bytes``) and what a transaction adds besides."""
        page, depth = self._page_size, self._env.stat()["depth"]
        room = self.part_size_bytes - (self._env.info()["last_pgno"] + 1) * page - transaction_bytes(page, depth)
        if room <= 0:
            return 0
        costs = np.cumsum(append_bytes(sizes, page, self._widest_leaf))
        return int(np.searchsorted(costs, room, side="right"))

    def _commit(self, records: list[tuple[bytes, bytes]]) -> None:
        """One transaction appending ``records`` to the open part; the map grows as needed."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    added, _ = txn.cursor().putmulti(records, append=True)
                if added != len(records):
                    raise BuildError(f"LMDB stored {added} of {len(records)} records")
                return
            except lmdb.MapFullError:
                # The aborted transaction wrote nothing; grow the map and retry the same batch.
                new_size = self._env.info()["map_size"] * 2
                log.debug("growing LMDB map of %s to %d bytes", self.directory, new_size)
                self._env.set_mapsize(new_size)
            except lmdb.Error as error:
                raise self._write_error(error) from error

    def _start_writeback(self) -> None:
        """Starts writing the part's dirty pages back while the source keeps producing, so
        sealing waits for little (the seal's sync still decides). A helper thread asks the
        kernel, which blocks the call while the disk's queue is full; where the kernel cannot,
        this syncs."""
        if not can_start_writeback():
            try:
                self._env.sync(True)
            except lmdb.Error as error:
                raise self._write_error(error) from error
            return
        if self._writeback is not None and not self._writeback.done():
            return  # the last request is still being queued: it covers these pages too
        if self._writeback_pool is None:
            self._writeback_pool = ThreadPoolExecutor(1, thread_name_prefix="yogacache-writeback")
        self._writeback = self._writeback_pool.submit(start_writeback, self.directory / part_name(len(self._parts)))

    def _end_writeback(self, shutdown: bool = False) -> None:
        """Waits for the write-back request in flight (before its part is closed or renamed)."""
        if self._writeback is not None:
            self._writeback.exception()  # its outcome only speeds the sync up; the sync decides
            self._writeback = None
        if shutdown and self._writeback_pool is not None:
            self._writeback_pool.shutdown(wait=True)
            self._writeback_pool = None

    def _write_error(self, error: BaseException) -> BuildError:
        return BuildError(
            f"writing {self.dataset_id}:{self.dataset_version} to {self.directory} "
            f"failed: {self._explain(error)}; nothing was cached"
        )

    def _explain(self, error: BaseException) -> str:
        """LMDB reports a short write as EIO: say when the disk or the file-size limit is the cause."""
        import resource

        causes = []
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = None
        if free is not None and free < 64 << 20:
            causes.append(f"No space left on device ({free} bytes free under {self.target.parent})")
        limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if limit != resource.RLIM_INFINITY:
            largest = max((p.stat().st_size for p in self.directory.glob("*.mdb")), default=0)
            if largest + (64 << 20) >= limit:
                causes.append(f"File too large (the process's file size limit is {limit} bytes)")
        return f"{'; '.join(causes)} ({error})" if causes else str(error)

    def _join_thread(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._end_writeback(shutdown=True)

    def _raise_thread_error(self) -> None:
        if self._error is not None:
            error = self._error
            if isinstance(error, (BuildError, OSError)):
                raise error
            raise BuildError(
                f"writing {self.dataset_id}:{self.dataset_version} failed: {error}; nothing was cached"
            ) from error

    def _close_part(self) -> None:
        if self._env is None:
            return
        self._end_writeback()
        env, self._env = self._env, None
        path = self.directory / part_name(len(self._parts))
        # The last commit has written every byte of the part (LMDB writes as it commits; a sync
        # only makes it durable): hash it from the page cache while the disk syncs it. Leaving the
        # block waits for the hashing, also on an error (done reading before the part is discarded).
        with ThreadPoolExecutor(1, thread_name_prefix="yogacache-seal-hash") as pool:
            hashing = pool.submit(seal_hashes, path)
            try:
                if self.sync_parts:
                    env.sync(True)
                entries = env.stat()["entries"]
            except lmdb.Error as error:
                raise BuildError(
                    f"syncing {self.dataset_id}:{self.dataset_version} in {self.directory} failed: "
                    f"{self._explain(error)}; nothing was cached"
                ) from error
            finally:
                env.close()
            count = self._written - self._part_first
            if entries != count:
                raise BuildError(f"part {path} holds {entries} records, expected {count}")
            if self.sync_parts:
                fsync_path(path)
            else:
                start_writeback(path)
            content_hash, crc32c = hashing.result()
        self._parts.append(
            PartInfo(
                name=path.name,
                first_record=self._part_first,
                num_records=count,
                size_bytes=path.stat().st_size,
                blake3=content_hash,
                crc32c=crc32c,
            )
        )

    # -- sealing --------------------------------------------------------------------------
    def seal(self, spec: Spec, source: str = "python", extra: Optional[dict[str, Any]] = None) -> Manifest:
        """Syncs, hashes and publishes the cache atomically; returns its manifest (whose
        ``extra`` is ``extra``: what the caller records about the build's origin)."""
        if self._closed:
            raise BuildError(f"writer for {self.dataset_id}:{self.dataset_version} is closed")
        try:
            self._flush()
            self._join_thread()
            self._raise_thread_error()
            if self._env is None and not self._parts:
                self._open_part()  # an empty dataset still gets one (empty) part
            self._close_part()
            manifest = Manifest(
                dataset_id=self.dataset_id,
                dataset_version=self.dataset_version,
                num_records=self.num_records,
                num_bytes=self.num_bytes,
                element_spec=spec,
                parts=tuple(self._parts),
                created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
                build_id=self.build_id,
                writer_version=f"yogacache {__version__}",
                source=source,
                codec=CODEC_NAME,
                extra=dict(extra or {}),
            )
            # Stamps go to this user's state directory, never into the cache.
            stamp_verified(self.directory, manifest)
            write_file_durably(self.directory / MANIFEST_NAME, manifest.to_bytes())
            fsync_path(self.directory)
            replace_directory(self.directory, self.target)
        except OSError as error:
            self.discard()
            raise BuildError(
                f"sealing {self.dataset_id}:{self.dataset_version} failed: {error}; nothing was cached"
            ) from error
        except BaseException:
            self.discard()
            raise
        self._closed = True
        self.progress.finish(self.num_records, self.num_bytes)
        return manifest

    def finish_parts(self) -> list[PartInfo]:
        """Syncs and hashes the parts written so far and returns them (``first_record`` counts
        from this writer's first record), without a manifest or a rename: the parts of one build
        shard, which a parallel build's driver assembles (see ``yogacache.parallel``). Nothing is
        written for a writer that got no record."""
        if self._closed:
            raise BuildError(f"writer for {self.dataset_id}:{self.dataset_version} is closed")
        self._flush()
        self._join_thread()
        self._raise_thread_error()
        self._close_part()
        self._closed = True
        return list(self._parts)

    def discard(self) -> None:
        """Drops everything written so far; idempotent."""
        self._closed = True
        self._pending = []
        self._join_thread()
        if self._env is not None:
            env, self._env = self._env, None
            try:
                env.close()
            except lmdb.Error:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)
