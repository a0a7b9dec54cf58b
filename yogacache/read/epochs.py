"""EpochReader: one rank's epochs of a cache, as plans and LMDB reads; what every adapter reads by.

Given a ``CacheReader`` and ``ReadOptions``, an ``EpochReader`` fits a ``ReadSchedule`` to the
cache (its parts, the node's byte budget, once), says once when a random order streams a cache
larger than the budget, and hands out: the start point (``start_offset``, a resume state, or
whole batches skipped), each epoch's plan (telling a streamed cache which parts to fetch
ahead), that plan cut into reads for one of ``W`` workers, lengths and resume states. It holds
no position: the TensorFlow stream (``yogacache.read.pipeline``) and the torch dataset each keep
their own, and a Grain or Ray Data adapter would too.

``plan_reads`` cuts a plan into reads, each one LMDB transaction over many records, sized by
``ReadSizes`` (the first read of an epoch small, so the first element comes quickly, then
doubling up to the full read size, for throughput) and, for DataLoader workers, dealt out in
blocks (worker ``w`` of ``W`` reads blocks ``w, w+W, …``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from yogacache import redaction
from yogacache.format.manifest import Manifest
from yogacache.read.layout import PartLayout
from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import shuffle_budget_warning
from yogacache.read.plans import EpochPlan, Point
from yogacache.read.reader import CacheReader
from yogacache.read.schedule import ReadSchedule

log = redaction.get_logger(__name__)

__all__ = [
    "EpochReader",
    "FIRST_READ_BYTES",
    "FIRST_READ_RECORDS",
    "FULL_READ_BYTES",
    "FULL_READ_RECORDS",
    "Point",
    "ReadSizes",
    "plan_reads",
    "warn_random_streaming",
]

# Records per read from LMDB; reads of large records are capped by bytes instead.
FULL_READ_RECORDS = 1024
FULL_READ_BYTES = 8 << 20
# The first read of an epoch is small, so the first element arrives quickly: 32 records, or
# more while they fit in 1 MiB (a first consumer batch of small records takes one read).
FIRST_READ_RECORDS = 32
FIRST_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class ReadSizes:
    """Records per read in an epoch: ``first``, doubling up to ``full``, then ``full`` for good."""

    full: int
    first: int

    @classmethod
    def for_manifest(cls, manifest: Manifest) -> ReadSizes:
        """``for_records`` of a cache's manifest."""
        return cls.for_records(manifest.num_records, manifest.average_record_bytes)

    @classmethod
    def for_records(cls, num_records: int, record_bytes: int) -> ReadSizes:
        """Full reads of ``FULL_READ_RECORDS`` capped at ``FULL_READ_BYTES``; a first read of
        ``FIRST_READ_RECORDS``, more while they fit in ``FIRST_READ_BYTES`` (records of
        ``record_bytes`` on average)."""
        record = max(1, record_bytes)
        full = FULL_READ_RECORDS
        if num_records:
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
    layout = layout_of(reader)
    records = len(schedule) * max(1, schedule.options.ranks_per_node or 1)
    warning = shuffle_budget_warning(mode, layout, budget, records, sizes.full) if schedule.options.shuffle else None
    if warning is not None:
        _WARNED_RANDOM_STREAMS.add(key)
        log.warning("%s", warning)


def refetch_announced(directory: Any) -> bool:
    """Whether this process already warned that the streamed cache in ``directory`` is read in
    an order that fetches parts again each epoch (``warn_random_streaming``): the provider
    then does not warn about the same refetches a second time (one warning per cause)."""
    return any(key[0] == str(directory) for key in _WARNED_RANDOM_STREAMS)


def schedule_of(reader: Any, options: ReadOptions) -> ReadSchedule:
    """The read order of one rank of ``reader``'s records as ``options`` say, fitted to the
    node's byte budget where they are streamed: a reader that orders its records itself says it
    (``read_schedule``: a mixture's, ``yogacache.read.mixture_reader``); a cache's is its
    ``ReadSchedule``."""
    own = getattr(reader, "read_schedule", None)
    if own is not None:
        return own(options)  # type: ignore[no-any-return]
    return ReadSchedule(len(reader), options, layout_of(reader), budget_bytes=reader.streaming_budget)


def layout_of(reader: Any) -> PartLayout:
    """How ``reader``'s records lie in parts: a mixture's ``layout``, a cache's manifest's."""
    own = getattr(reader, "layout", None)
    return own if isinstance(own, PartLayout) else PartLayout.from_manifest(reader.manifest)


class EpochReader:
    """One rank's epochs of ``reader``'s cache as ``options`` define them (see the module)."""

    def __init__(self, reader: CacheReader, options: ReadOptions) -> None:
        self.reader = reader
        self.options = options
        self.schedule = schedule_of(reader, options)
        self.sizes = ReadSizes.for_records(len(reader), reader.average_record_bytes)
        warn_random_streaming(reader, self.schedule, self.sizes)

    # -- points -------------------------------------------------------------------------------
    @property
    def start(self) -> Point:
        """Where reading starts: ``options.start_offset`` or ``options.resume_state``."""
        return self.schedule.start

    def first_position(self, epoch: int) -> int:
        """Where epoch ``epoch`` is read from when it is read from the start point on."""
        start_epoch, start_position = self.schedule.start
        return start_position if epoch == start_epoch else 0

    def resume_point(self, state: Mapping[str, Any]) -> Point:
        """The point a resume state (``state``) names, checked against these options."""
        return self.schedule.resume_point(state)

    def state(self, point: Point, records: int = 0) -> dict[str, Any]:
        """The resume state after reading ``records`` more records from ``point``."""
        return self.schedule.state(point, records)

    def after_batches(self, batches: int, batch_size: Optional[int], *, drop_last: bool = False) -> Point:
        """The point after ``batches`` batches of ``batch_size`` records, counted from the start
        of epoch 0 and batched epoch by epoch (each epoch's last batch short, or dropped with
        ``drop_last``), as a DataLoader batches them."""
        if batches < 0:
            raise ValueError(f"batches must not be negative, got {batches}")
        if batch_size is None or batch_size < 1:
            raise ValueError(f"skip_batches needs a positive batch_size, got {batch_size}")
        records = len(self)
        per_epoch = records // batch_size if drop_last else -(-records // batch_size)
        if per_epoch == 0:  # an empty epoch (or one short batch dropped): nothing to skip
            return 0, 0
        epoch, batch = divmod(batches, per_epoch)
        # Moved on by records of this rank: a position counts all ranks' records in global
        # order and in a mixture (``position_step``).
        return self.schedule.advance((epoch, 0), batch * batch_size)

    # -- lengths ------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Records this rank reads in a whole epoch."""
        return len(self.schedule)

    def remaining(self, position: int) -> int:
        """Records this rank reads in an epoch that starts at ``position``."""
        return self.schedule.remaining(position)

    # -- plans and reads ----------------------------------------------------------------------
    def plan(self, epoch: int, position: int) -> EpochPlan:
        """What this rank reads of ``epoch`` from ``position`` on; a streamed cache is told to
        fetch its parts ahead, then those the next epoch starts with (from the mode's
        ``parts_needed``: O(parts) for ``"parts"``, where reading the plan's indices cost every
        DataLoader worker O(records) before its first fetch)."""
        plan = self.schedule.plan(epoch, position)
        schedule = self.schedule
        self.reader.expect_parts(
            lambda: [
                [use.part for use in schedule.parts_needed(epoch, position)],
                [use.part for use in schedule.parts_needed(epoch + 1)],
            ]
        )
        return plan

    def prefetch(self, point: Point) -> None:
        """Starts fetching the first part read from ``point`` (a streamed cache), announcing no
        order: for a process that hands the reading to others (a DataLoader's main process)."""
        if self.reader.streamed:
            needed = self.schedule.parts_needed(*point)
            if needed:
                self.reader.prefetch_part(needed[0].part)

    def reads(self, point: Point, **dealing: Any) -> Iterator[np.ndarray]:
        """The record indices of each read of the epoch from ``point`` on: ``plan_reads`` of
        ``plan(*point)``, dealt as ``dealing`` says (``block_size``, ``worker`` of ``workers``,
        ``drop_partial``)."""
        return plan_reads(self.plan(*point), self.sizes, **dealing)
