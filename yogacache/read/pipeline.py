"""The read pipeline: a rank's epochs cut into LMDB reads, the one path every adapter reads by.

Top to bottom: a ``ReadSchedule`` (``ReadOptions`` over a cache) hands out each epoch's plan in
turn (``EpochReads``); ``plan_reads`` cuts a plan into reads, each one LMDB transaction over
many records, sized by ``ReadSizes`` (the first read of an epoch small, so the first element
comes quickly, then doubling up to the full read size, for throughput) and, for DataLoader
workers, dealt out in blocks (worker ``w`` of ``W`` reads blocks ``w, w+W, …``); ``read_stream``
turns that into YogaDL's ``Stream``. The TensorFlow adapter reads Streams, the torch adapter
calls ``plan_reads`` from its workers; a JAX or Grain adapter would do one or the other.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Protocol

import numpy as np

from yogacache.format.manifest import Manifest
from yogacache.format.spec import Spec
from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import PartLayout, shuffle_budget_warning
from yogacache.read.reader import CacheReader
from yogacache.read.schedule import ReadSchedule
from yogacache.read.shuffle import EpochPlan

log = logging.getLogger(__name__)

__all__ = [
    "EpochReads",
    "FIRST_READ_BYTES",
    "FIRST_READ_RECORDS",
    "FULL_READ_BYTES",
    "FULL_READ_RECORDS",
    "ReadSizes",
    "ReaderSource",
    "Stream",
    "plan_reads",
    "read_stream",
]

# Records per read from LMDB; reads of large records are capped by bytes instead.
FULL_READ_RECORDS = 1024
FULL_READ_BYTES = 8 << 20
# The first read of an epoch is small, so the first element arrives quickly: 32 records, or
# more while they fit in 1 MiB (a first consumer batch of small records takes one read).
FIRST_READ_RECORDS = 32
FIRST_READ_BYTES = 1 << 20


class ReaderSource(Protocol):
    """Anything that holds a cache's reader, such as ``yogacache.dataref.CacheDataRef``."""

    @property
    def reader(self) -> CacheReader: ...


class Stream:
    """An iterable of elements; each new iteration is the next epoch. ``len()`` is the shard length.

    Compatible with ``yogadl.Stream(iterator_fn, length, output_types, output_shapes)``; streams
    made by yogacache also know their framework-neutral ``element_spec`` and can yield each
    read whole, as stacked columns (``batch_iterator_fn``, at most ``max_batches`` per epoch),
    which is how the TensorFlow adapter avoids per-record overhead.
    ``spec_converter(element_spec, "dtype" | "shape")`` derives ``output_types`` and
    ``output_shapes`` when they are first asked for (it may import a framework then).
    """

    def __init__(
        self,
        iterator_fn: Callable[[], Iterator[Any]],
        length: int,
        output_types: Any = None,
        output_shapes: Any = None,
        *,
        element_spec: Optional[Spec] = None,
        batch_iterator_fn: Optional[Callable[[], Iterator[list[np.ndarray]]]] = None,
        uniform_epochs: bool = False,
        state_fn: Optional[Callable[[int], dict[str, Any]]] = None,
        max_batches: Optional[int] = None,
        spec_converter: Optional[Callable[[Spec, str], Any]] = None,
        epoch_reads: Optional[EpochReads] = None,
    ) -> None:
        self.iterator_fn = iterator_fn
        self.length = length
        # True when every epoch, the first included, yields exactly ``length`` elements.
        self.uniform_epochs = uniform_epochs
        self._output_types = output_types
        self._output_shapes = output_shapes
        self.element_spec = element_spec
        self.batch_iterator_fn = batch_iterator_fn
        # How many reads ``batch_iterator_fn`` yields per epoch at most (None: unknown).
        self.max_batches = max_batches
        self.state_fn = state_fn
        self.spec_converter = spec_converter
        # Random access to the same reads, by (epoch, read number): what a framework whose
        # iterators checkpoint (tf.data) maps over, holding no reader state of its own.
        self.epoch_reads = epoch_reads

    def state_dict(self, records_consumed: int) -> dict[str, Any]:
        """The resume state after this rank consumed ``records_consumed`` records of the stream.

        Counted from the stream's start, across epochs. Pass it back as ``resume_state`` to
        ``CacheDataRef.stream`` (in global shuffle mode, with any number of ranks).
        """
        if self.state_fn is None:
            raise TypeError("this stream was not made by yogacache and cannot report a resume state")
        return self.state_fn(records_consumed)

    def __iter__(self) -> Iterator[Any]:
        return self.iterator_fn()

    def __len__(self) -> int:
        return self.length

    def _derived(self, what: str) -> Any:
        if self.element_spec is None or self.spec_converter is None:
            return None
        return self.spec_converter(self.element_spec, what)

    @property
    def output_types(self) -> Any:
        """The element's ``tf.DType`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_types is None:
            self._output_types = self._derived("dtype")
        return self._output_types

    @output_types.setter
    def output_types(self, value: Any) -> None:
        self._output_types = value

    @property
    def output_shapes(self) -> Any:
        """The element's ``tf.TensorShape`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_shapes is None:
            self._output_shapes = self._derived("shape")
        return self._output_shapes

    @output_shapes.setter
    def output_shapes(self, value: Any) -> None:
        self._output_shapes = value


# -- read sizes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadSizes:
    """Records per read in an epoch: ``first``, doubling up to ``full``, then ``full`` for good."""

    full: int
    first: int

    @classmethod
    def for_manifest(cls, manifest: Manifest) -> ReadSizes:
        """Full reads of ``FULL_READ_RECORDS`` capped at ``FULL_READ_BYTES``; a first read of
        ``FIRST_READ_RECORDS``, more while they fit in ``FIRST_READ_BYTES``."""
        record = manifest.average_record_bytes
        full = FULL_READ_RECORDS
        if manifest.num_records:
            full = max(1, min(FULL_READ_RECORDS, FULL_READ_BYTES // record))
        return cls(full=full, first=min(full, max(FIRST_READ_RECORDS, FIRST_READ_BYTES // record)))

    def __iter__(self) -> Iterator[int]:
        size = self.first
        while True:
            yield size
            size = min(self.full, size * 2)

    def bounds(self, read: int) -> tuple[int, int]:
        """The epoch positions ``[begin, end)`` of read number ``read`` (one worker)."""
        begin, size, done = 0, self.first, 0
        while done < read and size < self.full:
            begin += size
            size = min(self.full, size * 2)
            done += 1
        begin += (read - done) * size
        return begin, begin + size

    def count(self, records: int) -> int:
        """How many reads an epoch of ``records`` records takes (one worker, blocks of one)."""
        count = begin = 0
        size = self.first
        while begin < records and size < self.full:
            count += 1
            begin += size
            size = min(self.full, size * 2)
        # Only full reads from here on.
        return count if begin >= records else count - (-(records - begin) // self.full)


def plan_reads(
    plan: EpochPlan,
    sizes: ReadSizes,
    *,
    block_size: int = 1,
    worker: int = 0,
    workers: int = 1,
    drop_partial: bool = False,
) -> Iterator[np.ndarray]:
    """The record indices of each read of ``plan`` that ``worker`` of ``workers`` makes, in order.

    The plan is dealt out in blocks of ``block_size`` positions: the worker reads blocks
    ``worker, worker + workers, …`` (a DataLoader with that batch size then yields the plan in
    order), whole blocks per read, as many as fit in the read's size (at least one).
    ``drop_partial`` leaves out a last block shorter than ``block_size``.
    """
    total = len(plan)
    end = total - total % block_size if drop_partial else total
    blocks = range(worker, -(-end // block_size), workers)
    within = np.arange(block_size, dtype=np.int64)
    done = 0
    for size in sizes:
        if done >= len(blocks):
            return
        read = blocks[done : done + max(1, size // block_size)]  # the blocks of this read
        done += len(read)
        if workers == 1:  # consecutive blocks: one slice of the plan
            yield plan.indices(read[0] * block_size, min((read[-1] + 1) * block_size, end))
            continue
        positions = (np.asarray(read, dtype=np.int64)[:, None] * block_size + within).ravel()
        if (read[-1] + 1) * block_size > end:
            positions = positions[positions < end]
        yield plan.take(positions)


# -- epochs and streams -------------------------------------------------------------------------


class EpochReads:
    """The reads of every epoch by number: read ``i`` of epoch ``e`` depends on ``(e, i)`` alone.

    The same reads, in the same order, as ``plan_reads`` with one worker. ``count`` reads cover a
    whole epoch (the last one takes whatever is left); a shorter, resumed first epoch gives
    empty reads past its end. ``next_epoch`` hands out epoch numbers to successive iterations,
    starting at the schedule's start; a read of epoch ``e`` moves that on past ``e``, so that an
    iterator restored from a checkpoint is followed by the epoch after its own.
    """

    def __init__(self, reader: CacheReader, schedule: ReadSchedule, sizes: ReadSizes) -> None:
        self._reader = reader
        self._schedule = schedule
        self._sizes = sizes
        self.count = sizes.count(len(schedule))
        self._next_epoch = schedule.start[0]
        self._plans: dict[int, EpochPlan] = {}  # the latest epochs' plans, computed once each
        self._lock = threading.Lock()

    def next_epoch(self) -> int:
        with self._lock:
            epoch = self._next_epoch
            self._next_epoch += 1
        return epoch

    def enter(self, epoch: int) -> int:
        """Notes that ``epoch`` is being read (the next new one is later); returns ``count``."""
        with self._lock:
            self._next_epoch = max(self._next_epoch, epoch + 1)
        return self.count

    def plan(self, epoch: int) -> EpochPlan:
        self.enter(epoch)
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is None:
                start_epoch, start_position = self._schedule.start
                plan = self._schedule.plan(epoch, start_position if epoch == start_epoch else 0)
                while len(self._plans) >= 2:  # iterators of neighbouring epochs may overlap
                    del self._plans[min(self._plans)]
                self._plans[epoch] = plan
                # A streamed cache fetches this epoch's parts ahead, then the next epoch's.
                self._reader.expect_plan(plan, lambda: self._schedule.plan(epoch + 1))
        return plan

    def indices(self, epoch: int, read: int) -> np.ndarray:
        """The record indices of read ``read`` of ``epoch`` (empty past the epoch's end)."""
        plan = self.plan(epoch)
        begin, end = self._sizes.bounds(read)
        if read >= self.count - 1:
            end = len(plan)
        return plan.indices(begin, end) if begin < len(plan) else np.empty(0, dtype=np.int64)

    def read(self, epoch: int, read: int) -> list[np.ndarray]:
        """One stacked array per leaf: the records of read ``read`` of ``epoch`` (``[]`` if none)."""
        indices = self.indices(epoch, read)
        return self._reader.read_columns(indices) if len(indices) else []


_WARNED_RANDOM_STREAMS: set[tuple[str, str]] = set()


def warn_random_streaming(reader: CacheReader, schedule: ReadSchedule, sizes: ReadSizes) -> None:
    """Warns once per process and cache when a mode that reads every part at random (``shard``,
    ``global``) streams a cache larger than the node's byte budget: it says the re-download
    volume per epoch this implies, and that ``shuffle_mode="parts"`` avoids it. The schedule
    was fitted to the budget when it was made (``ReadSchedule(budget_bytes=...)``)."""
    budget = reader.streaming_budget
    mode = schedule.options.shuffle_mode if schedule.options.shuffle else "sequential"
    key = (str(reader.directory), mode)
    if budget is None or key in _WARNED_RANDOM_STREAMS:
        return
    layout = PartLayout.from_manifest(reader.manifest)
    records = len(schedule) * max(1, schedule.options.ranks_per_node or 1)
    warning = shuffle_budget_warning(mode, layout, budget, records, sizes.full) if schedule.options.shuffle else None
    if warning is not None:
        _WARNED_RANDOM_STREAMS.add(key)
        log.warning("%s", warning)


def read_stream(
    reader: CacheReader, options: ReadOptions, *, spec_converter: Optional[Callable[[Spec, str], Any]] = None
) -> Stream:
    """The stream of ``reader``'s records that ``options`` define: each iteration the next epoch."""
    schedule = ReadSchedule(
        len(reader), options, PartLayout.from_manifest(reader.manifest), budget_bytes=reader.streaming_budget
    )
    sizes = ReadSizes.for_manifest(reader.manifest)
    warn_random_streaming(reader, schedule, sizes)
    # One epoch counter and one set of reads, whichever way the stream is iterated.
    reads = EpochReads(reader, schedule, sizes)

    def epoch_indices() -> Iterator[np.ndarray]:
        epoch = reads.next_epoch()
        for read in range(reads.count):
            indices = reads.indices(epoch, read)
            if len(indices):
                yield indices

    def iterate_elements() -> Iterator[Any]:
        for indices in epoch_indices():
            yield from reader.read_elements(indices)

    def iterate_batches() -> Iterator[list[np.ndarray]]:
        for indices in epoch_indices():
            yield reader.read_columns(indices)

    stackable = reader.codec.stackable
    return Stream(
        iterate_elements,
        len(schedule),
        element_spec=reader.spec,
        batch_iterator_fn=iterate_batches if stackable else None,
        uniform_epochs=schedule.start[1] == 0,
        state_fn=lambda records: schedule.state(schedule.start, records),
        max_batches=reads.count if stackable else None,
        spec_converter=spec_converter,
        epoch_reads=reads if stackable else None,
    )
