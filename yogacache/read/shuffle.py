"""Shuffle modes: how one rank's records are ordered epoch after epoch, looked up by name.

Each mode is a ``ShuffleMode`` subclass registered in ``SHUFFLE_MODES`` under the name users
pass as ``shuffle_mode``; adding a mode is one class plus one entry in that table.
``ReadSchedule`` (``yogacache.read.schedule``) dispatches everything mode-specific to the
instance it looks up here, and never branches on the name.

``"shard"`` (the default)
    YogaDL 0.1.4's order (``yogacache.read.sampler``): rank ``r`` of ``S`` owns the fixed
    strided shard ``r, r+S, …`` and shuffles it within itself. A position counts records of that
    shard, so a resume state is valid only for the same rank and number of shards.

``"global"``
    Epoch ``e`` reads the whole dataset in the order of the keyed permutation of ``(seed, e)``
    (``yogacache.read.permutation``); global position ``p`` goes to rank ``p % S``. A rank's
    records change every epoch. An epoch may start part-way, at ``c`` records already consumed:
    rank ``r`` then reads positions ``c+r, c+r+S, …``. Once every rank has read ``k`` of them the
    global prefix ``[0, c+kS)`` is consumed, so the resume state, ``(epoch, c+kS)``, holds at any
    world size: resuming with ``S'`` ranks deals the rest of the epoch out to them, and later
    epochs are exactly those of an uninterrupted run. With ``drop_shard_remainder`` an epoch ends
    at the last multiple of S positions, so every rank reads as many records as the others.

``"parts"`` (``yogacache.read.parts_shuffle``)
    Each epoch permutes the cache's parts, cuts them into one run per node and mixes records
    across a window of a few parts at a time: made for streaming, a rank needs few parts at a
    time and a node its share of them per epoch. Resumes at any world size.

Every mode also answers ``parts_needed(epoch, position)``: the parts a rank reads from a point
on, in order of first use (what a streaming reader prefetches, and evicts last).

Pure numpy, no I/O. Nothing is stored per record in global mode: a plan maps a slice of
positions to record indices on demand.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional, Protocol

import numpy as np

from yogacache.arguments import as_int
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.sampler import ShardOrder, check_shuffle, shard_indices

if TYPE_CHECKING:
    from yogacache.read.options import ReadOptions
    from yogacache.read.parts_shuffle import PartLayout, PartUse
    from yogacache.read.schedule import ResumeState

__all__ = [
    "ArrayPlan",
    "EpochPlan",
    "GlobalMode",
    "GlobalPlan",
    "SHUFFLE_MODES",
    "ShardMode",
    "ShuffleMode",
    "StridedPlan",
    "shuffle_mode",
]

Point = tuple[int, int]  # (epoch, position)


# -- plans --------------------------------------------------------------------------------------


class EpochPlan(Protocol):
    """The records one rank reads in (the rest of) one epoch, in order."""

    @property
    def epoch(self) -> int: ...

    def __len__(self) -> int: ...

    def indices(self, start: int, stop: int) -> np.ndarray:
        """Record indices at plan positions ``[start, stop)`` (clipped to the plan)."""
        ...

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Record indices at the plan positions ``positions`` (each in ``[0, len)``)."""
        ...


@dataclass(frozen=True)
class ArrayPlan:
    """A plan held as an index array (YogaDL's shard order)."""

    epoch: int
    order: np.ndarray

    def __len__(self) -> int:
        return len(self.order)

    def indices(self, start: int, stop: int) -> np.ndarray:
        return self.order[start:stop]

    def take(self, positions: np.ndarray) -> np.ndarray:
        return self.order[positions]


class StridedPlan:
    """A plan whose positions ``j`` are line positions ``first + j·step``; ``_records`` says
    which records a line's positions hold."""

    first: int
    step: int
    length: int

    def __len__(self) -> int:
        return self.length

    def indices(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(stop, self.length)
        return self.take(np.arange(start, max(start, stop), dtype=np.int64))

    def take(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"plan positions must lie in [0, {self.length})")
        return self._records(self.first + self.step * positions)

    def _records(self, line: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class GlobalPlan(StridedPlan):
    """Plan positions ``j`` are global positions ``first + j·step`` of a (permuted) epoch."""

    epoch: int
    first: int
    step: int
    length: int
    permutation: Optional[KeyedPermutation]  # None: dataset order

    def _records(self, line: np.ndarray) -> np.ndarray:
        return line if self.permutation is None else self.permutation.map(line)


# -- modes --------------------------------------------------------------------------------------


class ShuffleMode(abc.ABC):
    """The read order of one rank over ``num_records`` records, as ``options`` define it.

    A point is ``(epoch, position)``; what a position counts is the mode's choice (records of
    this rank's shard, or records of the epoch consumed by all ranks), and ``position_step`` is
    how far one record of this rank moves it.
    """

    #: The name users pass as ``shuffle_mode`` (and the ``mode`` of its resume states).
    name: ClassVar[str]
    #: Whether a resume state names the shard it belongs to (and is valid for it only).
    resumes_per_shard: ClassVar[bool] = False
    position_step: int = 1

    #: Keys beyond the common ones that this mode's resume states hold (``ResumeState`` fields).
    state_keys: ClassVar[tuple[str, ...]] = ()
    #: The cache's part layout, where the reader gave it (``with_layout``).
    layout: Optional[PartLayout] = None

    def __init__(self, num_records: int, options: ReadOptions) -> None:
        self.num_records = num_records
        self.options = options

    @classmethod
    def with_layout(cls, num_records: int, options: ReadOptions, layout: Optional[PartLayout] = None) -> ShuffleMode:
        """The mode over a cache whose parts ``layout`` describes (None: unknown; modes that
        order parts need it)."""
        mode = cls(num_records, options)
        mode.layout = layout
        return mode

    def fit_budget(self, budget_bytes: Optional[int]) -> Optional[str]:
        """Fits the order to the node-local byte budget a streamed cache is read under (None: no
        budget); returns what it changed, for the reader to say once, or None. Before any plan
        is made. By default nothing changes."""
        return None

    def state_fields(self, epoch: int, position: int) -> dict[str, Any]:
        """``ResumeState`` fields of the state at ``(epoch, position)`` beyond the common ones
        (and ``consumed`` where it is not ``position``)."""
        return {}

    def parts_needed(self, epoch: int, position: int = 0) -> list[PartUse]:
        """The parts this rank reads of ``epoch`` from ``position`` on, in order of first use,
        each with the plan positions (records from ``position``) of its first and last read.

        What a streaming reader fetches ahead, and what it evicts last (the part needed
        furthest in the future). This default reads the plan's indices: O(records) time and
        O(parts) memory; modes that order parts answer from their part order. Needs the layout.
        """
        if self.layout is None:
            raise ValueError("parts_needed needs the cache's part layout: build the mode with_layout")
        from yogacache.read.parts_shuffle import parts_read_in_order

        return parts_read_in_order(self.plan(epoch, position), self.layout)

    @classmethod
    def check(cls, options: ReadOptions) -> None:
        """Raises ValueError unless this mode can compute an order from ``options`` (called
        by ``ReadOptions`` once its generic checks passed; by default every set is valid)."""
        return None

    @abc.abstractmethod
    def remaining(self, position: int) -> int:
        """Records this rank reads in an epoch that starts at ``position``."""

    @abc.abstractmethod
    def plan(self, epoch: int, position: int) -> EpochPlan:
        """What this rank reads of ``epoch`` from ``position`` on."""

    def __len__(self) -> int:
        """Records this rank reads in a whole epoch."""
        return self.remaining(0)

    def start(self, start_offset: int) -> Point:
        """The point after this rank read ``start_offset`` records from the very start."""
        return self.advance((0, 0), start_offset)

    def advance(self, point: Point, records: int) -> Point:
        """The point after this rank read ``records`` more records from ``point``."""
        epoch, position = point
        records = as_int(records, "records")
        if records < 0:
            raise ValueError(f"records must not be negative, got {records}")
        if records == 0:
            return point
        left = self.remaining(position)
        if records < left:
            return epoch, position + records * self.position_step
        records -= left
        full = len(self)
        if full == 0:
            return epoch + 1, 0
        return epoch + 1 + records // full, (records % full) * self.position_step

    def resume_point(self, state: ResumeState) -> Point:
        """The point a resume state of this mode names (its mode, dataset size and seed are
        already checked against this reader's)."""
        return self.advance((state.epoch, 0), state.consumed)


class ShardMode(ShuffleMode):
    """YogaDL's order: each rank shuffles its own fixed strided shard."""

    name = "shard"
    resumes_per_shard = True

    def __init__(self, num_records: int, options: ReadOptions) -> None:
        super().__init__(num_records, options)
        shard = shard_indices(num_records, options.shard_rank, options.num_shards, options.drop_shard_remainder)
        self.order = ShardOrder(
            shard,
            shuffle=options.shuffle,
            reshuffle_each_epoch=options.reshuffle_each_epoch,
            seed=options.shuffle_seed,
        )

    @classmethod
    def check(cls, options: ReadOptions) -> None:
        check_shuffle(options.shuffle, options.reshuffle_each_epoch, options.shuffle_seed)

    def remaining(self, position: int) -> int:
        return max(0, len(self.order) - position)

    def plan(self, epoch: int, position: int) -> EpochPlan:
        return ArrayPlan(epoch, self.order.epoch(epoch)[position:])

    def start(self, start_offset: int) -> Point:
        return self.order.start(start_offset)  # exactly YogaDL's

    def resume_point(self, state: ResumeState) -> Point:
        options = self.options
        if (state.shard_rank, state.num_shards) != (options.shard_rank, options.num_shards):
            raise ValueError(
                f"a shard-mode resume state is valid only for its own shard (rank {state.shard_rank} "
                f"of {state.num_shards}), not rank {options.shard_rank} of {options.num_shards}: use "
                "shuffle_mode='global' to resume with another number of ranks"
            )
        return super().resume_point(state)


class GlobalMode(ShuffleMode):
    """Each epoch one keyed permutation of the whole dataset, dealt out to the ranks in turn."""

    name = "global"

    def __init__(self, num_records: int, options: ReadOptions) -> None:
        super().__init__(num_records, options)
        self.position_step = options.num_shards  # a record of this rank is S global positions

    @classmethod
    def check(cls, options: ReadOptions) -> None:
        if options.shuffle and options.shuffle_seed is None:
            raise ValueError(
                "shuffle_mode='global' with shuffle=True needs shuffle_seed: every rank must compute "
                "the same permutation of the dataset"
            )
        if options.reshuffle_each_epoch and not options.shuffle:
            raise ValueError("reshuffling at epoch end needs shuffle=True")

    def _segment(self, consumed: int) -> tuple[int, int]:
        """(first global position, count) of this rank's part of an epoch after ``consumed``."""
        shards = self.options.num_shards
        left = max(0, self.num_records - consumed)
        end = consumed + (left - left % shards if self.options.drop_shard_remainder else left)
        first = consumed + self.options.shard_rank
        return first, max(0, -(-(end - first) // shards))

    def remaining(self, position: int) -> int:
        return self._segment(position)[1]

    def plan(self, epoch: int, position: int) -> EpochPlan:
        options = self.options
        first, length = self._segment(position)
        permutation = None
        if options.shuffle and self.num_records and options.shuffle_seed is not None:  # see check
            key_epoch = epoch if options.reshuffle_each_epoch else 0
            permutation = KeyedPermutation(self.num_records, options.shuffle_seed, key_epoch)
        return GlobalPlan(epoch, first, options.num_shards, length, permutation)

    def resume_point(self, state: ResumeState) -> Point:
        if state.consumed > self.num_records:
            raise ValueError(
                f"the resume state consumed {state.consumed} records of an epoch of {self.num_records}"
            )
        # The same for every rank: an epoch that no rank has anything left of is over.
        shards = self.options.num_shards
        left = self.num_records - state.consumed
        if (left - left % shards if self.options.drop_shard_remainder else left) == 0:
            return state.epoch + 1, 0
        return state.epoch, state.consumed


#: Every shuffle mode, by the name users pass as ``shuffle_mode``. Modes defined in their own
#: modules add themselves when imported (``parts_shuffle``; ``yogacache.read`` imports it first).
SHUFFLE_MODES: dict[str, type[ShuffleMode]] = {
    ShardMode.name: ShardMode,
    GlobalMode.name: GlobalMode,
}


def __getattr__(name: str) -> Any:
    """``PartsMode`` lives in ``parts_shuffle`` (which imports this module): resolved on use."""
    if name == "PartsMode":
        from yogacache.read.parts_shuffle import PartsMode

        return PartsMode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def shuffle_mode(name: object, what: str = "shuffle_mode") -> type[ShuffleMode]:
    """The mode class registered as ``name``; ValueError naming the registered ones otherwise."""
    mode = SHUFFLE_MODES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ValueError(f"{what} must be one of {tuple(SHUFFLE_MODES)}, got {name!r}")
    return mode
