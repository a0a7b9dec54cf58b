"""Streaming reads of a published cache: parts fetched on demand and ahead, into a node-local
part cache shared by every process of the node.

``stream_cache(store, manifest)`` returns a ``CacheReader`` that opens each part lazily through
a ``StreamingParts`` provider. A part is downloaded once per node (under its ``flock`` fetch
lock, ``store.budget.fetch_lock``), into a temporary file that reserves its bytes, checked
against the manifest's size and content hash, and only then renamed to its name,
``.parts/<id>/<version>/<build id>-part-NNNNN.mdb``: a download killed midway leaves a
temporary file that no reader opens and that the next fetch removes. Parts are named by build,
so a new build published meanwhile never mixes with the old one: parts of the old build already
on the node stay readable; a part of the old build that is gone from the bucket gives
``CacheReplacedError``.

Readers announce their read order (``expect``): this epoch's parts in order of first use, then
the next epoch's. The provider follows where the reader is *in the current epoch* (a part read
again is not a step into the next epoch) and which parts it still reads there (the ones it came
back to lately), announces both in its lease, and fetches the parts ahead of the reader, in
that order, in parallel, as far as the byte budget allows without evicting anything the current
epoch still reads; at most one part of the next epoch is fetched before the current one ends.
A reader that fetches more than its epoch's parts and one more in an epoch warns once, naming
the settings to change. See docs/streaming.md.

No silent stall: a fetch that waits (for room, or for another process's download of its part)
first makes every reader of its process give up the parts it holds between reads, and a reader
names itself in its process's lease (its cache, largest part and budget) when it opens and when
it first reads, refused with a ConfigError when the node's readers need more than the node's
budget (``budget.check_node_minimum``). A reader closed or garbage-collected releases its parts.

What a reader keeps and does per step is flat in the cache's number of parts: a part's file
name, key and URL are made when it is fetched (not a list of every part's, in each process the
reader is sent to), and each step announces and fetches from the next parts of its order only
(``ReadOrder.needed``), listing the part directory at most once per fetch.
"""

from __future__ import annotations

import heapq
import math
import os
import threading
import time
import uuid
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, overload

from yogacache import redaction
from yogacache.backends.base import (
    DEFAULT_TRANSFER_THREADS,
    ObjectStore,
    TransferCancelled,
    read_capped,
    stop_retries_when,
)
from yogacache.config import PARTS_IN_FLIGHT
from yogacache.errors import CacheReplacedError, ConfigError, CorruptCacheError, NoSpaceError
from yogacache.format.durability import fsync_path
from yogacache.format.integrity import file_identity, part_file_verified, write_stamp
from yogacache.format.manifest import MAX_MANIFEST_BYTES, Manifest
from yogacache.read.epochs import refetch_announced
from yogacache.read.reader import CacheReader
from yogacache.safefs import make_directories
from yogacache.sizes import format_size
from yogacache.store import budget, keys
from yogacache.store.readorder import ReadOrder
from yogacache.store.transfers import download_part

log = redaction.get_logger(__name__)

# How long a reader waits for room in the budget (other processes of the node hold the rest)
# before it says why it cannot go on.
ROOM_WAIT_SECONDS = 300.0
_ROOM_POLL_SECONDS = 0.05
# Parts fetched ahead of the reader at most (the budget may allow fewer).
MAX_AHEAD = 16
# ... and under a byte budget (see StreamingParts._ahead_count).
BUDGET_AHEAD = 2


def minimum_budget(manifest: Manifest) -> int:
    """The smallest budget a streamed read of ``manifest`` works in: the part being read and the
    next one being fetched (the two largest parts; before a manifest is known, the configured
    part size is checked the same way: ``config.check_part_budget``)."""
    return sum(heapq.nlargest(PARTS_IN_FLIGHT, (part.size_bytes for part in manifest.parts)))


def check_budget(manifest: Manifest, limit: Optional[int]) -> None:
    """ConfigError, saying the minimum, when ``limit`` cannot hold the parts in flight."""
    if limit is None:
        return
    need = minimum_budget(manifest)
    if limit < need:
        raise ConfigError(
            f"local_cache_limit {format_size(limit)} ({limit} bytes) is too small to stream "
            f"{manifest.dataset_id}:{manifest.dataset_version}: the part being read and the next one "
            f"need at least {format_size(need)} ({need} bytes); raise local_cache_limit to at least that"
        )


class StreamingParts:
    """A ``PartProvider`` over the node-local part cache of one published build."""

    def __init__(
        self,
        manifest: Manifest,
        root: Path,
        *,
        objects: Optional[ObjectStore],
        objects_factory: Optional[Callable[[], ObjectStore]],
        manifest_key: str,
        limit: Optional[int],
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
    ) -> None:
        self.manifest = manifest
        self.root = root
        self.directory = root / budget.PARTS_DIR / manifest.dataset_id / manifest.dataset_version
        self.file_names = PartFileNames(manifest)
        self.limit = limit
        self.largest_part = max((part.size_bytes for part in manifest.parts), default=0)
        self.transfer_threads = max(1, transfer_threads)
        # How long the reader reads each part, against the node's other readers: 1, or more for
        # a mixture's component read less often than others (``CacheReader.set_part_pace``).
        self.scale = 1.0
        # How many streamed readers of the process share the budget's room for fetches ahead:
        # 1, or a mixture's streamed components (``CacheReader.set_part_pace``).
        self.sharing = 1
        # A reader keeps one part between reads under a budget, else every part it opened.
        self.keep_open = 1 if limit is not None else len(manifest.parts)
        self._objects = objects
        self._objects_factory = objects_factory
        self.manifest_key = manifest_key
        # The reader's function that gives up the parts it holds between reads (a weak method:
        # set by the reader, ``on_idle``), called while a fetch of this process waits.
        self._give_up: Optional[weakref.WeakMethod[Callable[[], None]]] = None
        self._init_process_state()

    def _init_process_state(self) -> None:
        # Names this reader in its process's lease: a copy (a DataLoader worker's, Ray's) is
        # another reader.
        self._key = uuid.uuid4().hex
        self._registered = False  # named in the lease as a reader that reads, in this process
        self._pid = os.getpid()
        # Re-entrant: a reader collected on a thread that holds it closes its provider there.
        self._lock = threading.RLock()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._ahead: dict[int, Future[None]] = {}
        self._reading = ReadOrder()  # where the reader is in its announced order
        self._fetched = 0  # parts downloaded since this epoch's order was announced
        self._announced: dict[int, str] = {}  # part -> its item, for the parts announced last
        self._warned = False
        self._held: dict[int, int] = {}
        # The pace: seconds a part's download takes, and seconds between the reader's steps to
        # a new part (moving averages; None until measured). See ``_ahead_count``.
        self._fetch_seconds: Optional[float] = None
        self._step_seconds: Optional[float] = None
        self._last_step: Optional[tuple[int, float]] = None  # (position, when) of the last step
        self._waited = 0.0  # seconds the reader waited for parts since its last step
        # Set by ``close``: the fetches ahead submitted until then stop (retries included).
        self._stopping = threading.Event()

    # -- pickling (a reader sent to a spawned DataLoader worker) ------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = {
            key: value
            for key, value in self.__dict__.items()
            if not key.startswith("_") or key in ("_objects_factory", "_objects")
        }
        if self._objects_factory is not None:
            state["_objects"] = None  # clients do not cross processes: the factory makes one
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._give_up = None
        self._init_process_state()

    def _process(self) -> None:
        if self._pid != os.getpid():  # forked: threads, pins and clients stay with the parent
            objects = self._objects if self._objects_factory is None else None
            self._init_process_state()
            self._objects = objects

    # -- the node's readers ---------------------------------------------------------------
    def on_idle(self, give_up: Callable[[], None]) -> None:
        """``give_up`` (a bound method of the reader, held weakly) gives up the parts the reader
        holds between reads; it is called while a fetch of this process waits."""
        self._give_up = weakref.WeakMethod(give_up)

    def _give_up_idle(self) -> None:
        found = self._give_up() if self._give_up is not None else None
        if found is not None:
            found()

    def _reader(self, reads: bool) -> budget.NodeReader:
        manifest = self.manifest
        return budget.NodeReader(
            os.getpid(), f"{manifest.dataset_id}:{manifest.dataset_version}", self.largest_part, self.limit, reads
        )

    def register(self, *, reads: bool) -> None:
        """Names this reader in its process's lease (its cache, largest part and budget), first
        checking that the node's budget holds what its streamed readers keep between reads
        with this one among them (``budget.check_node_minimum``: ConfigError otherwise).
        ``reads``: it reads in this process (opening alone names its budget, not its part). A
        reader without a budget is named as one that neither limits nor counts, so that it still
        gives up what it holds between reads while a fetch of its process waits."""
        if self.limit is None:
            reads = False
        reader = self._reader(reads)
        lease = budget.process_lease(self.root)
        with budget.budget_lock(self.root):
            if reads and self.limit is not None:
                budget.check_node_minimum(self.root, reader, self.limit)
            lease.register(self._key, reader.cache, reader.part, reader.limit, reads=reads, give_up=self._give_up_idle)

    def _register_reading(self) -> None:
        if not self._registered:
            self.register(reads=True)
            self._registered = True

    @property
    def objects(self) -> ObjectStore:
        if self._objects is None:
            if self._objects_factory is None:
                raise ConfigError("this streamed reader cannot reach its object store in this process")
            self._objects = self._objects_factory()
        return self._objects

    def path(self, index: int) -> Path:
        return self.directory / self.file_names[index]

    def item(self, index: int) -> str:
        manifest = self.manifest
        return budget.part_item(manifest.dataset_id, manifest.dataset_version, self.file_names[index])

    # -- PartProvider ----------------------------------------------------------------------
    def acquire(self, index: int) -> Path:
        """The verified local path of part ``index``, held from eviction until ``release``."""
        self._process()
        self._register_reading()
        lease = budget.process_lease(self.root)
        with budget.budget_lock(self.root):  # no eviction between the pin and the check
            lease.hold(self.item(index))
        with self._lock:
            self._held[index] = self._held.get(index, 0) + 1
            self._reading.advance(index)
            self._note_step()
            ahead = self._ahead.get(index)
        began = time.monotonic()
        try:
            if ahead is not None:
                try:
                    ahead.result()
                except Exception:  # noqa: BLE001 - fetched again below, which reports the error
                    pass
            self._fetch(index, on_demand=True)
        except BaseException:
            self.release(index)
            raise
        finally:
            with self._lock:
                self._waited += time.monotonic() - began
        self._announce()
        self._fetch_ahead()
        return self.path(index)

    def release(self, index: int) -> None:
        if self._pid != os.getpid():
            return
        with self._lock:
            count = self._held.get(index, 0) - 1
            if count < 0:
                return
            if count:
                self._held[index] = count
            else:
                self._held.pop(index, None)
        budget.process_lease(self.root).drop(self.item(index))

    def expect(self, order: Sequence[int], current: Optional[int] = None) -> None:
        """Announces the reader's order: this epoch's parts in order of first use, then the next
        epoch's; ``current`` says how many are this epoch's (None: up to the first part named
        twice, as ``CacheReader.expect_parts`` lists each epoch's parts once)."""
        self._process()
        with self._lock:
            self._reading.set([int(index) for index in order], current)
            self._fetched = 0
        self._announce()
        self._fetch_ahead()

    def prefetch(self, index: int) -> None:
        """Starts fetching part ``index`` on a transfer thread, as a fetch ahead that announces
        no order (the process reads nothing; its DataLoader workers do, and find the part on its
        way: one download per node, under its fetch lock)."""
        self._process()
        with self._lock:
            if index not in self._ahead or self._ahead[index].done():
                self._submit_ahead(index, 0)

    def close(self) -> None:
        """Stops fetching ahead (queued fetches are dropped, running ones stop at their next
        chunk or before their next retry, their temporary files removed, and close returns
        once they have), releases every part the reader still holds, and takes the reader out
        of its process's lease."""
        if self._pid != os.getpid():
            return
        with self._lock:
            pool, self._pool = self._pool, None
            self._reading.set([], 0)
            self._ahead = {}
            stopping, self._stopping = self._stopping, threading.Event()
            held, self._held = self._held, {}
            self._registered = False
        stopping.set()
        if pool is not None:
            # Running fetches stop at their next chunk; waiting for them means no request of
            # this reader reaches the store, and no temporary file of it is left, after close.
            in_pool = threading.current_thread().name.startswith("yogacache-stream")
            pool.shutdown(wait=not in_pool, cancel_futures=True)
        lease = budget.existing_lease(self.root)
        if lease is not None:
            for index, count in held.items():
                for _ in range(count):
                    lease.drop(self.item(index))
            lease.forget(self._key)

    # -- fetching --------------------------------------------------------------------------
    def _announce(self) -> None:
        with self._lock:
            upcoming, now, _start = self._reading.needed(budget.UPCOMING_LIMIT)
            # The lease names each part by its item; a step moves the list by a part or so, so
            # the names of the last announcement serve again (not rebuilt, 1024 a step).
            known = self._announced
            self._announced = names = {index: known.get(index) or self.item(index) for index in upcoming}
        budget.process_lease(self.root).announce(self._key, [names[index] for index in upcoming], now, self.scale)

    def _note_step(self) -> None:
        """Measures the reader's pace: the seconds it reads per part of its order, from one
        step forward in the order to the next, less the time it waited for parts (the caller
        holds the lock). Parts read back and forth within a window are no steps."""
        now, position = time.monotonic(), self._reading.position
        last = self._last_step
        if last is not None and position <= last[0]:
            if position < last[0]:  # a new order: start again
                self._last_step, self._waited = (position, now), 0.0
            return
        self._last_step = (position, now)
        if last is not None:
            reading = max(0.0, now - last[1] - self._waited)
            self._step_seconds = _averaged(self._step_seconds, reading / (position - last[0]))
        self._waited = 0.0

    def _ahead_count(self) -> int:
        """Parts fetched ahead: without a budget, up to ``MAX_AHEAD`` (``transfer_threads`` at
        a time). Under a budget of ``n`` parts, two where ``n >= 5`` (else one): the link carries
        the next part while the one before is checked and synced (one at a time left it idle
        that long: 0.63x of a 50 MB/s link against 0.88x), and the part the reader needs next
        shares the link with one other only (three at once bring it a third as fast).

        More where the store is slow for the reader's pace (``pace_ahead``): a part that takes
        four steps of the reader to download is fetched four parts ahead, so a mixture's
        component published in another region keeps up with the others (up to what the
        budget holds: half its parts, and the transfer threads).

        The streamed components of a mixture share the budget: each holds its part and fetches
        ahead within its share (the budget's parts over ``sharing``), so that what they all hold
        and fetch fits. Counting the whole budget, three components fetched two parts ahead each
        into a budget of eight, and a fetch ahead then evicted a part kept for later in the
        epoch: epoch 2 went one part over its promise about one run in six
        (tests/test_mixture_streaming.py)."""
        if self.limit is None:
            return MAX_AHEAD
        fits = self.limit // max(1, self.largest_part)
        room = fits // max(1, self.sharing) - 1  # the share's parts, less the one it reads
        base = max(1, min(BUDGET_AHEAD, self.transfer_threads, (fits - 1) // 2, room))
        paced = pace_ahead(self._fetch_seconds, self._step_seconds)
        return max(base, min(paced, self.transfer_threads, fits // 2, room))

    def _fetch_ahead(self) -> None:
        """Starts fetches of the next parts of the announced order (not yet on the node): this
        epoch's, and at most the first of the next epoch's."""
        with self._lock:
            start = self._reading.start
            end = min(self._reading.position + 1 + self._ahead_count(), self._reading.current + 1)
            window = self._reading.order[self._reading.position : end]
            if window and not os.path.exists(self.path(window[0])):
                # The part the reader needs now has the link to itself: the next ones start
                # when it is here (the first batch comes after one part's fetch, not several).
                window = window[:1]
            for place, index in enumerate(window, start=self._reading.position):
                if index in self._ahead and not self._ahead[index].done():
                    continue
                if os.path.exists(self.path(index)):
                    continue
                # Ahead within this epoch: never evicting what is needed before it. The next
                # epoch's first part: only into room that no reader needs (it is fetched ahead
                # to start that epoch without waiting, not at the cost of a part it reads).
                distance = place - start if place < self._reading.current else math.inf
                self._submit_ahead(index, distance)
            for index in [i for i, future in self._ahead.items() if future.done()]:
                del self._ahead[index]

    def _submit_ahead(self, index: int, distance: float) -> None:
        """Starts fetching part ``index`` ahead on the transfer threads (the caller holds the lock)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.transfer_threads, thread_name_prefix="yogacache-stream")
        self._ahead[index] = self._pool.submit(self._fetch_quietly, index, distance, self._stopping)

    def _fetch_quietly(self, index: int, distance: float, stopping: threading.Event) -> None:
        try:
            with stop_retries_when(stopping):
                self._fetch(index, on_demand=False, distance=distance, stopping=stopping)
        except Exception as error:  # noqa: BLE001 - the reader's own fetch reports it
            log.debug("fetching part %s ahead failed: %s", self.file_names[index], error)
            return
        if not stopping.is_set():
            # The next fetch starts now, not at the reader's next new part: the link stays busy.
            self._fetch_ahead()

    def _fetch(
        self, index: int, *, on_demand: bool, distance: float = 0, stopping: Optional[threading.Event] = None
    ) -> None:
        """Makes part ``index`` present and verified on the node (one download per node); a
        fetch ahead stops (TransferCancelled) once ``stopping`` is set."""
        part = self.manifest.parts[index]
        target = self.path(index)
        if part_file_verified(target, part):
            # Not touched to mark it used: setting its times moves its ctime, so the stamp that
            # vouches for its hash no longer matches, and every acquire of a part on the node
            # hashed it whole again (64 MiB per read of each part it spans). Reading it sets
            # its access time, which orders eviction among parts no reader needs.
            return
        make_directories(self.directory)
        # Waiting for another process's download of this part: the readers of this process
        # wait holding nothing between reads (that process may be waiting for room).
        on_wait = (lambda holder: budget.process_lease(self.root).give_up_idle()) if on_demand else None
        with budget.fetch_lock(self.directory, self.file_names[index], on_wait=on_wait):
            if part_file_verified(target, part):
                return
            for stale in budget.downloads_of(self.directory, [self.file_names[index]]):
                stale.unlink(missing_ok=True)  # a download killed midway (we hold its lock)
            temp = self._reserve(index, on_demand=on_demand, distance=distance)
            if temp is None:
                return  # no room to fetch ahead now; the reader fetches it when it gets there
            began = time.monotonic()
            self._download(index, temp, stopping)
            seconds = (time.monotonic() - began) * max(1, self.largest_part) / max(1, part.size_bytes)
            with self._lock:
                self._fetch_seconds = _averaged(self._fetch_seconds, seconds)
            fsync_path(self.directory)
            self._count_fetch()
            try:
                write_stamp(file_identity(target), part.hash_label)
            except OSError:
                pass

    def _nearer_missing(self, index: int) -> bool:
        """Whether a part the reader needs before part ``index`` (from its position on) is neither
        on the node nor being downloaded: a fetch ahead of ``index`` would take its room."""
        with self._lock:
            order, position = self._reading.order, self._reading.position
            end = position
            while end < len(order) and order[end] != index:
                end += 1
            nearer = order[position:end]
        missing = [self.file_names[other] for other in nearer if not os.path.exists(self.path(other))]
        if not missing:
            return False
        temps = [path.name for path in budget.downloads_of(self.directory, missing)]  # one listing
        return any(not any(temp.startswith(f".{name}{budget.TEMP_MARK}") for temp in temps) for name in missing)

    def _count_fetch(self) -> None:
        """Counts a download of this epoch; warns once when an epoch fetched more than each of
        its parts and one more (fetched ahead for the next epoch): the budget keeps too few
        parts for the read order, and parts are fetched again within the epoch."""
        with self._lock:
            self._fetched += 1
            fetched, parts = self._fetched, len(self._reading.first)
            if self._warned or not parts or fetched <= parts + 1:
                return
            self._warned = True
        if refetch_announced(self.directory):
            return  # the cost was said up front, with the mode's own advice
        manifest, limit = self.manifest, self.limit
        budget_text = "no local_cache_limit" if limit is None else f"local_cache_limit {format_size(limit)}"
        log.warning(
            "streaming %s:%s: this reader fetched %d parts in an epoch that reads %d, so it fetches "
            "parts again that it still needs: %s holds too few parts for its read order. Raise "
            "local_cache_limit, or, with shuffle_mode='parts', lower parts_window (the parts mixed "
            "at a time, each kept on the node while it is read); shuffle_mode='shard' and 'global' "
            "read every part throughout an epoch",
            manifest.dataset_id,
            manifest.dataset_version,
            fetched,
            parts,
            budget_text,
        )

    def _reserve(self, index: int, *, on_demand: bool, distance: float) -> Optional[Path]:
        """The temporary file to download part ``index`` into, its bytes reserved in the budget;
        None (fetching ahead) when there is no room without evicting what is needed sooner."""
        part = self.manifest.parts[index]
        name = self.file_names[index]
        limit = self.limit
        if limit is None:
            return budget.create_reservation(self.directory, name, part.size_bytes)
        if not on_demand and self._nearer_missing(index):
            return None  # the room goes to the parts needed first: fetched when they are here
        reserved: list[Path] = []

        def fits() -> bool:
            return budget.make_room(
                self.root,
                part.size_bytes,
                limit,
                sooner_than=distance * self.scale if not on_demand else 0,
                ahead=not on_demand,
                before_release=lambda: reserved.append(
                    budget.create_reservation(self.directory, name, part.size_bytes)
                ),
            )

        if fits():
            return reserved[0]
        if not on_demand:
            return None
        # No room: this process's readers give up what they hold between reads (no reader waits
        # holding room it could free), and fetches ahead on the node wait until this one has room.
        lease = budget.process_lease(self.root)
        lease.set_waiting(+1)
        try:
            deadline = time.monotonic() + ROOM_WAIT_SECONDS
            while True:
                lease.give_up_idle()
                if fits():
                    return reserved[0]
                if time.monotonic() > deadline:
                    raise NoSpaceError(self._no_room_message(name, part.size_bytes))
                time.sleep(_ROOM_POLL_SECONDS)
        finally:
            lease.set_waiting(-1)

    def _no_room_message(self, name: str, size: int) -> str:
        """Why a fetch found no room in ``ROOM_WAIT_SECONDS``: what the node holds, and for whom."""
        live = budget.live_leases(self.root)
        items = budget.local_items(self.root)
        held = sum(item.size for item in items if item.item in live.held)
        limit = min(self.limit, live.limit) if self.limit is not None and live.limit is not None else self.limit
        return (
            f"local_cache_limit {format_size(limit or 0)} has no room for part {name} "
            f"({format_size(size)}) of {self.manifest.dataset_id}:{self.manifest.dataset_version} after "
            f"{ROOM_WAIT_SECONDS:.0f} s: the node holds {format_size(sum(item.size for item in items))} under "
            f"{self.root}, {format_size(held)} of it held by {live.processes} live process(es) "
            f"(readers: {budget.describe_readers(live.readers) or 'none named'}) or the only copy of a cache; "
            "raise local_cache_limit, or run fewer readers on this node"
        )

    def _current_build(self) -> Optional[str]:
        """The build id published now (None: nothing is)."""
        found = read_capped(self.objects, self.manifest_key, MAX_MANIFEST_BYTES)
        if found is None:
            return None
        return Manifest.from_bytes(found[0], self.objects.url(self.manifest_key)).build_id

    def _download(self, index: int, temp: Path, stopping: Optional[threading.Event] = None) -> None:
        """Downloads part ``index`` into ``temp``, verifies it and renames it to its name
        (``transfers.download_part``); a fetch ahead stops once ``stopping`` is set."""
        key = keys.part_key(self.manifest, self.manifest.parts[index])
        url = self.objects.url(key)

        def on_bytes(count: int) -> None:
            if stopping is not None and stopping.is_set():
                raise TransferCancelled(f"fetching {url} ahead stopped: its reader was closed")

        download_part(
            self.objects,
            key,
            self.manifest.parts[index],
            temp,
            cache=f"{self.manifest.dataset_id}:{self.manifest.dataset_version}",
            on_bytes=on_bytes,
            when_missing=lambda: self._missing(url),
            target=self.path(index),
        )

    def _missing(self, url: str) -> BaseException:
        """Why a part object of this reader's build is gone: another build replaced it, or the
        bucket lost it."""
        current = self._current_build()
        if current != self.manifest.build_id:
            now = "is no longer published" if current is None else f"now holds build {current}"
            return CacheReplacedError(
                f"{url} is gone: {self.manifest.dataset_id}:{self.manifest.dataset_version} "
                f"{now}, and this reader streams build {self.manifest.build_id}; open the cache "
                "again to read the current build"
            )
        return CorruptCacheError(
            f"{url} is missing although its manifest is published (deleted from the bucket?); publish the cache again"
        )


class PartFileNames(Sequence[str]):
    """The node-local file name of each part of a build (``keys.part_object_name``), made when
    asked for: a reader of a 100,000-part cache holds (and pickles) no list of them."""

    def __init__(self, manifest: Manifest) -> None:
        self.build_id = manifest.build_id
        self.parts = manifest.parts

    def __len__(self) -> int:
        return len(self.parts)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [keys.part_object_name(self.build_id, part.name) for part in self.parts[index]]
        return keys.part_object_name(self.build_id, self.parts[index].name)


def _averaged(average: Optional[float], sample: float, weight: float = 0.3) -> float:
    """An exponential moving average (the first sample starts it)."""
    return sample if average is None else (1 - weight) * average + weight * sample


def pace_ahead(fetch_seconds: Optional[float], step_seconds: Optional[float]) -> int:
    """Parts to fetch ahead so that downloads keep up with the reader: a part's download time
    over the time the reader spends per part, rounded up (0 until both are measured)."""
    if fetch_seconds is None or step_seconds is None:
        return 0
    return min(MAX_AHEAD, math.ceil(fetch_seconds / max(step_seconds, 1e-3)))


def remove_streamed_parts(root: Path, dataset_id: str, dataset_version: str) -> list[str]:
    """Removes this node's streamed parts of one cache (``yogacache rm``); the paths removed.

    Readers that hold a part open keep reading it (LMDB maps the file); the next part they need
    is fetched again."""
    directory = root / budget.PARTS_DIR / dataset_id / dataset_version
    if not directory.is_dir() or directory.is_symlink():
        return []
    with budget.budget_lock(root):
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False) and not entry.name.endswith(".lock"):
                Path(entry.path).unlink(missing_ok=True)
    for parent in (directory, directory.parent):
        try:
            parent.rmdir()  # only when empty (a fetch lock in use keeps it)
        except OSError:
            break
    return [str(directory)]


def stream_cache(
    store: Any,
    manifest: Manifest,
    *,
    limit: Optional[int],
    objects_factory: Optional[Callable[[], ObjectStore]] = None,
) -> CacheReader:
    """A reader of the published build ``manifest`` of ``store`` (a ``RemoteCacheStore``)
    whose parts stream into the node-local part cache."""
    check_budget(manifest, limit)
    dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
    store.local.check_root(create=True)
    provider = StreamingParts(
        manifest,
        store.local.root,
        objects=store.objects,
        objects_factory=objects_factory,
        manifest_key=keys.manifest_key(dataset_id, dataset_version),
        limit=limit,
        transfer_threads=store.transfer_threads,
    )
    make_directories(provider.directory)
    # Named in this process's lease with its budget (the node's budget is the smallest a live
    # reader names); refused now when the node's readers, this one among them, need more.
    if limit is not None:
        budget.check_node_minimum(store.local.root, provider._reader(True), limit)
    provider.register(reads=False)
    return CacheReader(provider.directory, manifest, store.local.verify_mode, part_provider=provider)
