"""ReadSchedule: which records one rank reads, epoch after epoch, from a resume point.

Two orders, chosen by ``shuffle_mode``:

``"shard"`` (the default)
    YogaDL 0.1.4's order (``yogacache.sampler``): rank ``r`` of ``S`` owns the fixed strided
    shard ``r, r+S, …`` and shuffles it within itself. A resume point counts records of that
    shard, so it is valid only for the same rank and number of shards.

``"global"``
    Epoch ``e`` reads the whole dataset in the order of the keyed permutation of ``(seed, e)``
    (``yogacache.permutation``); global position ``p`` goes to rank ``p % S``. A rank's records
    change every epoch. An epoch may start part-way, at ``c`` records already consumed: rank
    ``r`` then reads positions ``c+r, c+r+S, …``. Once every rank has read ``k`` of them the
    global prefix ``[0, c+kS)`` is consumed, so the resume state, ``(epoch, c+kS)``, holds at any
    world size: resuming with ``S'`` ranks deals the rest of the epoch out to them, and later
    epochs are exactly those of an uninterrupted run. With ``drop_remainder`` an epoch ends at
    the last multiple of S positions, so every rank reads as many records as the others.

Pure numpy, no I/O. Nothing is stored per record in global mode: a plan maps a slice of
positions to record indices on demand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

import numpy as np

from yogacache.arguments import as_int
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.sampler import ShardOrder, shard_indices

SHARD = "shard"
GLOBAL = "global"
SHUFFLE_MODES = (SHARD, GLOBAL)
STATE_VERSION = 1
STATE_KEYS = frozenset({"version", "mode", "epoch", "consumed", "seed", "num_records", "shard_rank", "num_shards"})


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


@dataclass(frozen=True)
class GlobalPlan:
    """Plan positions ``j`` are global positions ``first + j·step`` of a (permuted) epoch."""

    epoch: int
    first: int
    step: int
    length: int
    permutation: Optional[KeyedPermutation]  # None: dataset order

    def __len__(self) -> int:
        return self.length

    def indices(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(stop, self.length)
        return self.take(np.arange(start, max(start, stop), dtype=np.int64))

    def take(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"plan positions must lie in [0, {self.length})")
        global_positions = self.first + self.step * positions
        return global_positions if self.permutation is None else self.permutation.map(global_positions)


@dataclass(frozen=True)
class ResumeState:
    """Where reading resumes; ``to_dict()`` is what goes into a checkpoint (well under 1 KiB).

    ``consumed`` counts records of the epoch already read: by all ranks together in global
    mode, by this rank (of its shard) in shard mode, which also records the shard it belongs to.
    """

    mode: str
    epoch: int
    consumed: int
    seed: Optional[int]
    num_records: int
    shard_rank: Optional[int] = None
    num_shards: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "mode": self.mode,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "num_records": self.num_records,
        }
        if self.mode == SHARD:
            state["shard_rank"] = self.shard_rank
            state["num_shards"] = self.num_shards
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        if not isinstance(state, Mapping):
            raise TypeError(f"a resume state is a dict, not {type(state).__name__}")
        if state.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"resume state version {state.get('version')!r} is not {STATE_VERSION}")
        unknown = set(state) - STATE_KEYS
        if unknown:
            raise ValueError(f"resume state has unknown keys {sorted(unknown)}")
        try:
            mode = state["mode"]
            fields = {key: state[key] for key in ("epoch", "consumed", "num_records")}
        except KeyError as error:
            raise ValueError(f"resume state lacks {error.args[0]!r}") from None
        if mode not in SHUFFLE_MODES:
            raise ValueError(f"resume state mode must be one of {SHUFFLE_MODES}, got {mode!r}")
        values = {key: as_int(value, f"resume state {key}") for key, value in fields.items()}
        if min(values.values()) < 0:
            raise ValueError(f"resume state fields must not be negative: {dict(state)}")
        optional = {
            key: None if state.get(key) is None else as_int(state[key], f"resume state {key}")
            for key in ("seed", "shard_rank", "num_shards")
        }
        return cls(
            mode=mode,
            epoch=values["epoch"],
            consumed=values["consumed"],
            num_records=values["num_records"],
            seed=optional["seed"],
            shard_rank=optional["shard_rank"],
            num_shards=optional["num_shards"],
        )


class ReadSchedule:
    """The read order of one rank, from a start point, in shard or global mode.

    Args mirror ``DataRef.stream``. ``start_offset`` counts records of this rank (YogaDL's
    meaning, in either mode); ``resume_state`` (a ``ResumeState`` dict) is the exact alternative,
    valid at any world size in global mode. ``start`` is the resulting ``(epoch, position)``,
    where ``position`` counts records of this rank's shard (shard mode) or records of the epoch
    consumed by all ranks together (global mode).
    """

    def __init__(
        self,
        num_records: int,
        *,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_remainder: bool = False,
        shuffle: bool = False,
        reshuffle_each_epoch: bool = False,
        seed: Optional[int] = None,
        shuffle_mode: str = SHARD,
        start_offset: int = 0,
        resume_state: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if shuffle_mode not in SHUFFLE_MODES:
            raise ValueError(f"shuffle_mode must be one of {SHUFFLE_MODES}, got {shuffle_mode!r}")
        self.num_records = as_int(num_records, "num_records")
        self.mode = shuffle_mode
        self.drop_remainder = bool(drop_remainder)
        self.shuffle = bool(shuffle)
        self.reshuffle_each_epoch = bool(reshuffle_each_epoch)
        self.seed = None if seed is None else as_int(seed, "shuffle_seed")
        # Validates rank, shard count and record count the way YogaDL does (nothing per record).
        shard_indices(0, shard_rank, num_shards, self.drop_remainder)
        if self.num_records < 0:
            raise ValueError(f"num_records must not be negative, got {self.num_records}")
        self.shard_rank, self.num_shards = as_int(shard_rank, "shard_rank"), as_int(num_shards, "num_shards")
        self._shard_order: Optional[ShardOrder] = None
        if self.mode == SHARD:
            shard = shard_indices(self.num_records, shard_rank, num_shards, self.drop_remainder)
            self._shard_order = ShardOrder(
                shard, shuffle=self.shuffle, reshuffle_each_epoch=self.reshuffle_each_epoch, seed=self.seed
            )
        elif self.shuffle and self.seed is None:
            raise ValueError(
                "shuffle_mode='global' with shuffle=True needs shuffle_seed: every rank must compute "
                "the same permutation of the dataset"
            )
        elif self.reshuffle_each_epoch and not self.shuffle:
            raise ValueError("reshuffling at epoch end needs shuffle=True")
        start_offset = as_int(start_offset, "start_offset")
        if start_offset < 0:
            raise ValueError(f"start_offset must not be negative, got {start_offset}")
        self.start: tuple[int, int]
        if resume_state is not None:
            if start_offset:
                raise ValueError("pass either start_offset or resume_state, not both")
            self.start = self.resume_point(resume_state)
        elif self._shard_order is not None:
            self.start = self._shard_order.start(start_offset)  # exactly YogaDL's
        else:
            self.start = self.advance((0, 0), start_offset)

    # -- lengths --------------------------------------------------------------------------
    def __len__(self) -> int:
        """Records this rank reads in a whole epoch."""
        return self.remaining(0)

    def remaining(self, position: int) -> int:
        """Records this rank reads in an epoch that starts at ``position``."""
        if self._shard_order is not None:
            return max(0, len(self._shard_order) - position)
        return self._global_segment(position)[1]

    def _global_segment(self, consumed: int) -> tuple[int, int]:
        """(first global position, count) of this rank's part of an epoch after ``consumed``."""
        left = max(0, self.num_records - consumed)
        end = consumed + (left - left % self.num_shards if self.drop_remainder else left)
        first = consumed + self.shard_rank
        return first, max(0, -(-(end - first) // self.num_shards))

    # -- plans ----------------------------------------------------------------------------
    def plan(self, epoch: int, position: int = 0) -> EpochPlan:
        """What this rank reads of ``epoch`` from ``position`` (see ``start``) on."""
        if self._shard_order is not None:
            return ArrayPlan(epoch, self._shard_order.epoch(epoch)[position:])
        first, length = self._global_segment(position)
        permutation = None
        if self.shuffle and self.num_records and self.seed is not None:  # a seed: checked in __init__
            permutation = KeyedPermutation(self.num_records, self.seed, epoch if self.reshuffle_each_epoch else 0)
        return GlobalPlan(epoch, first, self.num_shards, length, permutation)

    # -- resume points --------------------------------------------------------------------
    def advance(self, point: tuple[int, int], records: int) -> tuple[int, int]:
        """The ``(epoch, position)`` after this rank read ``records`` more records from ``point``."""
        epoch, position = point
        records = as_int(records, "records")
        if records < 0:
            raise ValueError(f"records must not be negative, got {records}")
        if records == 0:
            return point
        left = self.remaining(position)
        if records < left:
            return epoch, position + records * self._position_step
        records -= left
        full = len(self)
        if full == 0:
            return epoch + 1, 0
        return epoch + 1 + records // full, (records % full) * self._position_step

    @property
    def _position_step(self) -> int:
        # A record of this rank moves the shard position by one, the global position by S.
        return 1 if self._shard_order is not None else self.num_shards

    def state(self, point: tuple[int, int], records: int = 0) -> dict[str, Any]:
        """The resume state (a small dict) after reading ``records`` more records from ``point``."""
        epoch, position = self.advance(point, records)
        return ResumeState(
            mode=self.mode,
            epoch=epoch,
            consumed=position,
            seed=self.seed,
            num_records=self.num_records,
            shard_rank=self.shard_rank if self.mode == SHARD else None,
            num_shards=self.num_shards if self.mode == SHARD else None,
        ).to_dict()

    def resume_point(self, resume_state: Mapping[str, Any]) -> tuple[int, int]:
        """The ``(epoch, position)`` a resume state names, checked against this schedule."""
        state = ResumeState.from_dict(resume_state)
        if state.mode != self.mode:
            raise ValueError(f"the resume state is for shuffle_mode={state.mode!r}, this reader uses {self.mode!r}")
        if state.num_records != self.num_records:
            raise ValueError(
                f"the resume state is for a dataset of {state.num_records} records, this one has "
                f"{self.num_records}"
            )
        if self.shuffle and state.seed != self.seed:
            raise ValueError(f"the resume state was taken with seed {state.seed}, this reader uses {self.seed}")
        if self.mode == SHARD:
            if (state.shard_rank, state.num_shards) != (self.shard_rank, self.num_shards):
                raise ValueError(
                    f"a shard-mode resume state is valid only for its own shard (rank {state.shard_rank} "
                    f"of {state.num_shards}), not rank {self.shard_rank} of {self.num_shards}: use "
                    "shuffle_mode='global' to resume with another number of ranks"
                )
            return self.advance((state.epoch, 0), state.consumed)
        if state.consumed > self.num_records:
            raise ValueError(
                f"the resume state consumed {state.consumed} records of an epoch of {self.num_records}"
            )
        # The same for every rank: an epoch that no rank has anything left of is over.
        left = self.num_records - state.consumed
        if (left - left % self.num_shards if self.drop_remainder else left) == 0:
            return state.epoch + 1, 0
        return state.epoch, state.consumed
