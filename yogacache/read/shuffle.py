"""Shuffle modes: how one rank's records are ordered epoch after epoch, looked up by name.

Each mode is a ``ShuffleMode`` subclass registered in ``SHUFFLE_MODES`` under the name users
pass as ``shuffle_mode``. A mode owns its settings (``options_type``: the keywords users pass
for it) and the keys its resume states add (``state_keys``): adding a mode, settings included,
is one class plus one entry in that table.
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
import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Optional, Protocol

from yogacache.arguments import as_int
from yogacache.read.layout import PartLayout, PartUse, parts_read_in_order
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.plans import ArrayPlan, EpochPlan, GlobalPlan, Point, StridedPlan
from yogacache.read.sampler import ShardOrder, check_shuffle, shard_indices

__all__ = [
    "ArrayPlan",
    "EpochPlan",
    "GlobalMode",
    "GlobalPlan",
    "MIXTURE_MODE",
    "MixtureState",
    "OrderOptions",
    "ResumeState",
    "SHUFFLE_MODES",
    "STATE_VERSION",
    "ShardMode",
    "ShuffleMode",
    "StridedPlan",
    "is_mixture_state",
    "shuffle_mode",
]

# -- what a mode reads of the options, and what it resumes from -------------------------------


class OrderOptions(Protocol):
    """What a shuffle mode reads of ``yogacache.read.options.ReadOptions`` (which meets this)."""

    @property
    def shuffle(self) -> bool: ...
    @property
    def reshuffle_each_epoch(self) -> bool: ...
    @property
    def shuffle_seed(self) -> Optional[int]: ...
    @property
    def shard_rank(self) -> int: ...
    @property
    def num_shards(self) -> int: ...
    @property
    def drop_shard_remainder(self) -> bool: ...
    @property
    def mode_options(self) -> Any:
        """The mode's own settings: an instance of its ``options_type`` (None if it has none)."""
        ...


STATE_VERSION = 1
# Keys every resume state may hold; a mode adds its own (``ShuffleMode.state_keys``).
STATE_KEYS = ("version", "mode", "epoch", "consumed", "seed", "num_records", "shard_rank", "num_shards")


@dataclass(frozen=True)
class ResumeState:
    """Where reading resumes; ``to_dict()`` is what goes into a checkpoint (well under 1 KiB).

    ``consumed`` is the position in the epoch, which the mode defines: records read by all ranks
    together in global mode, by this rank (of its shard) in shard mode, whose states also name
    the shard they belong to. ``fields`` holds the keys a mode adds (``ShuffleMode.state_keys``,
    integers or None): the parts mode's split and window (``yogacache.read.parts_shuffle``).
    """

    mode: str
    epoch: int
    consumed: int
    seed: Optional[int]
    num_records: int
    shard_rank: Optional[int] = None
    num_shards: Optional[int] = None
    fields: Mapping[str, Optional[int]] = field(default_factory=dict)

    def get(self, key: str) -> Optional[int]:
        """The value of state key ``key`` (common or the mode's), None where it has none."""
        if key in ("shard_rank", "num_shards"):
            return getattr(self, key)  # type: ignore[no-any-return]
        return self.fields.get(key)

    def updated(self, values: Mapping[str, Any]) -> ResumeState:
        """This state with ``values`` (common keys and the mode's) replaced."""
        common = {f.name for f in dataclasses.fields(self)} - {"fields"}
        own = {key: value for key, value in values.items() if key not in common}
        return dataclasses.replace(
            self, **{key: value for key, value in values.items() if key in common}, fields={**self.fields, **own}
        )

    def to_dict(self) -> dict[str, Any]:
        mode = shuffle_mode(self.mode, "resume state mode")
        state: dict[str, Any] = {
            "version": STATE_VERSION,
            "mode": self.mode,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "num_records": self.num_records,
        }
        if mode.resumes_per_shard:
            state["shard_rank"] = self.shard_rank
            state["num_shards"] = self.num_shards
        for key in mode.state_keys:
            state[key] = self.get(key)
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        if not isinstance(state, Mapping):
            raise TypeError(f"a resume state is a dict, not {type(state).__name__}")
        if state.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"resume state version {state.get('version')!r} is not {STATE_VERSION}")
        mode_keys = {key for mode in SHUFFLE_MODES.values() for key in mode.state_keys} - set(STATE_KEYS)
        unknown = set(state) - set(STATE_KEYS) - mode_keys
        if unknown:
            raise ValueError(f"resume state has unknown keys {sorted(unknown)}")
        try:
            mode = state["mode"]
            required = {key: state[key] for key in ("epoch", "consumed", "num_records")}
        except KeyError as error:
            raise ValueError(f"resume state lacks {error.args[0]!r}") from None
        shuffle_mode(mode, "resume state mode")
        values = {key: as_int(value, f"resume state {key}") for key, value in required.items()}
        if min(values.values()) < 0:
            raise ValueError(f"resume state fields must not be negative: {dict(state)}")
        optional = {
            key: None if state.get(key) is None else as_int(state[key], f"resume state {key}")
            for key in ("seed", "shard_rank", "num_shards", *sorted(mode_keys))
            if key in state or key in ("seed", "shard_rank", "num_shards")
        }
        return cls(
            mode=mode,
            epoch=values["epoch"],
            consumed=values["consumed"],
            num_records=values["num_records"],
            seed=optional.pop("seed"),
            shard_rank=optional.pop("shard_rank"),
            num_shards=optional.pop("num_shards"),
            fields=optional,
        )


MIXTURE_MODE = "mixture"
MIXTURE_STATE_VERSION = 1


@dataclass(frozen=True)
class MixtureState:
    """A mixture's resume state: where the epoch stands (``epoch``, ``consumed`` by all ranks)
    and what it mixed, so that resuming another mixture is refused, naming what changed."""

    epoch: int
    consumed: int
    seed: Optional[int]
    order: str
    components: tuple[tuple[str, int, int], ...]  # (name, records, records per epoch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MIXTURE_STATE_VERSION,
            "mode": MIXTURE_MODE,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "order": self.order,
            "num_records": sum(count for _, _, count in self.components),
            "components": [list(each) for each in self.components],
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> MixtureState:
        if not isinstance(state, Mapping):
            raise TypeError(f"a resume state is a dict, not {type(state).__name__}")
        if state.get("mode") != MIXTURE_MODE:
            raise ValueError(f"the resume state is for one cache (shuffle_mode={state.get('mode')!r}), not a mixture")
        if state.get("version", MIXTURE_STATE_VERSION) != MIXTURE_STATE_VERSION:
            raise ValueError(f"mixture resume state version {state.get('version')!r} is not {MIXTURE_STATE_VERSION}")
        known = {"version", "mode", "epoch", "consumed", "seed", "order", "num_records", "components"}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"mixture resume state has unknown keys {unknown}")
        try:
            epoch = as_int(state["epoch"], "resume state epoch")
            consumed = as_int(state["consumed"], "resume state consumed")
            raw = state["components"]
            order = state["order"]
        except KeyError as error:
            raise ValueError(f"mixture resume state lacks {error.args[0]!r}") from None
        if epoch < 0 or consumed < 0:
            raise ValueError(f"mixture resume state fields must not be negative: epoch {epoch}, consumed {consumed}")
        if not isinstance(order, str):
            raise ValueError(f"mixture resume state order must be a shuffle mode name, got {order!r}")
        try:
            components = tuple(
                (str(name), as_int(records, "records"), as_int(count, "count")) for name, records, count in raw
            )
        except (TypeError, ValueError):
            raise ValueError(
                "mixture resume state components must be [name, records, records per epoch] lists"
            ) from None
        seed = state.get("seed")
        return cls(epoch, consumed, None if seed is None else as_int(seed, "resume state seed"), order, components)


def is_mixture_state(state: Any) -> bool:
    return isinstance(state, Mapping) and state.get("mode") == MIXTURE_MODE


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
    #: The mode's own settings: a frozen dataclass whose fields are the keywords users pass
    #: (``ReadOptions(**keywords)``, ``DataRef.stream``, the decorators, the torch dataset),
    #: validated when it is made; ``options.mode_options`` is one. None: the mode has none.
    options_type: ClassVar[Optional[type[Any]]] = None
    #: The cache's part layout, where the reader gave it (``with_layout``).
    layout: Optional[PartLayout] = None

    def __init__(self, num_records: int, options: OrderOptions) -> None:
        self.num_records = num_records
        self.options = options

    @classmethod
    def with_layout(cls, num_records: int, options: OrderOptions, layout: Optional[PartLayout] = None) -> ShuffleMode:
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
        return parts_read_in_order(self.plan(epoch, position), self.layout)

    @classmethod
    def check(cls, options: OrderOptions) -> None:
        """Raises ValueError unless this mode can compute an order from ``options`` (called
        by ``ReadOptions`` once its generic checks passed; by default every set is valid)."""
        return None

    @classmethod
    def check_seeded(cls, options: OrderOptions, order: str) -> None:
        """The check of a mode whose ranks must all compute ``order``: a shuffle needs a seed."""
        if options.shuffle and options.shuffle_seed is None:
            raise ValueError(
                f"shuffle_mode={cls.name!r} with shuffle=True needs shuffle_seed: every rank must "
                f"compute {order}"
            )
        if options.reshuffle_each_epoch and not options.shuffle:
            raise ValueError("reshuffling at epoch end needs shuffle=True")

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

    def __init__(self, num_records: int, options: OrderOptions) -> None:
        super().__init__(num_records, options)
        shard = shard_indices(num_records, options.shard_rank, options.num_shards, options.drop_shard_remainder)
        self.order = ShardOrder(
            shard,
            shuffle=options.shuffle,
            reshuffle_each_epoch=options.reshuffle_each_epoch,
            seed=options.shuffle_seed,
        )

    @classmethod
    def check(cls, options: OrderOptions) -> None:
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

    def __init__(self, num_records: int, options: OrderOptions) -> None:
        super().__init__(num_records, options)
        self.position_step = options.num_shards  # a record of this rank is S global positions

    @classmethod
    def check(cls, options: OrderOptions) -> None:
        cls.check_seeded(options, "the same permutation of the dataset")

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


def shuffle_mode(name: object, what: str = "shuffle_mode") -> type[ShuffleMode]:
    """The mode class registered as ``name``; ValueError naming the registered ones otherwise."""
    mode = SHUFFLE_MODES.get(name) if isinstance(name, str) else None
    if mode is None:
        raise ValueError(f"{what} must be one of {tuple(SHUFFLE_MODES)}, got {name!r}")
    return mode
