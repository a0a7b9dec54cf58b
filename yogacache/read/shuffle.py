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
from yogacache.read.state import MAX_EPOCH, ResumeStateError, check_state, parse_settings

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
# The order-deciding settings every state records (``yogacache.read.state``); a mode adds its
# own (``ShuffleMode.setting_keys``). States of earlier releases lack them.
STATE_SETTINGS = ("build", "shuffle", "reshuffle_each_epoch")


@dataclass(frozen=True)
class ResumeState:
    """Where reading resumes; ``to_dict()`` is what goes into a checkpoint (well under 1 KiB).

    ``consumed`` is the position in the epoch, which the mode defines: records read by all ranks
    together in global mode, by this rank (of its shard) in shard mode, whose states also name
    the shard they belong to. ``fields`` holds the keys a mode adds (``ShuffleMode.state_keys``,
    integers or None): the parts mode's split and window (``yogacache.read.parts_shuffle``).
    ``settings`` holds the order-deciding settings it was saved with (``STATE_SETTINGS`` and the
    mode's ``setting_keys``; a state of an earlier release lacks them), which
    ``yogacache.read.state.check_state`` compares with the resuming reader's.
    """

    mode: str
    epoch: int
    consumed: int
    seed: Optional[int]
    num_records: int
    shard_rank: Optional[int] = None
    num_shards: Optional[int] = None
    fields: Mapping[str, Optional[int]] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str) -> Optional[int]:
        """The value of state key ``key`` (common or the mode's), None where it has none."""
        if key in ("shard_rank", "num_shards"):
            return getattr(self, key)  # type: ignore[no-any-return]
        return self.fields.get(key)

    def updated(self, values: Mapping[str, Any]) -> ResumeState:
        """This state with ``values`` (common keys and the mode's) replaced."""
        common = {f.name for f in dataclasses.fields(self)} - {"fields", "settings"}
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
        for key in (*STATE_SETTINGS, *mode.setting_keys):
            if key in self.settings:
                state[key] = self.settings[key]
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> ResumeState:
        if not isinstance(state, Mapping):
            raise TypeError(f"a resume state is a dict, not {type(state).__name__}")
        if state.get("version", STATE_VERSION) != STATE_VERSION:
            raise ValueError(f"resume state version {state.get('version')!r} is not {STATE_VERSION}")
        mode_keys = {key for mode in SHUFFLE_MODES.values() for key in mode.state_keys} - set(STATE_KEYS)
        setting_keys = {key for mode in SHUFFLE_MODES.values() for key in mode.setting_keys} | set(STATE_SETTINGS)
        unknown = set(state) - set(STATE_KEYS) - mode_keys - setting_keys
        if unknown:
            raise ValueError(f"resume state has unknown keys {sorted(unknown)}")
        try:
            mode = state["mode"]
            required = {key: state[key] for key in ("epoch", "consumed", "num_records")}
        except KeyError as error:
            raise ValueError(f"resume state lacks {error.args[0]!r}") from None
        own = shuffle_mode(mode, "resume state mode")
        values = {key: as_int(value, f"resume state {key}") for key, value in required.items()}
        if min(values.values()) < 0:
            raise ResumeStateError(f"resume state fields must not be negative: {dict(state)}")
        settings = parse_settings(state, (*STATE_SETTINGS, *own.setting_keys))
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
            settings=settings,
        )


MIXTURE_MODE = "mixture"
MIXTURE_STATE_VERSION = 1
# The order-deciding settings a mixture's state records beyond its components (states of
# earlier releases lack them).
MIXTURE_SETTINGS = ("shuffle", "reshuffle_each_epoch", "rotate", "parts_window")
# (last pass, window) runs of one component: the windows its passes are read with.
WindowRuns = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class MixtureState:
    """A mixture's resume state: where the epoch stands (``epoch``, ``consumed`` by all ranks)
    and what it mixed, so that resuming another mixture is refused, naming what changed.

    ``settings`` holds the order-deciding settings it was saved with (``MIXTURE_SETTINGS``),
    ``builds`` each component's build id and ``windows`` the window each component's
    ``"parts"`` passes were read with from the state on to the end of its epoch (``(last pass,
    window)`` runs: values fitted to the node budget); a state of an earlier release lacks them.
    """

    epoch: int
    consumed: int
    seed: Optional[int]
    order: str
    components: tuple[tuple[str, int, int], ...]  # (name, records, records per epoch)
    settings: Mapping[str, Any] = field(default_factory=dict)
    builds: Optional[tuple[Optional[str], ...]] = None
    windows: Optional[tuple[WindowRuns, ...]] = None

    def to_dict(self) -> dict[str, Any]:
        state = {
            "version": MIXTURE_STATE_VERSION,
            "mode": MIXTURE_MODE,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "seed": self.seed,
            "order": self.order,
            "num_records": sum(count for _, _, count in self.components),
            "components": [list(each) for each in self.components],
        }
        state.update({key: self.settings[key] for key in MIXTURE_SETTINGS if key in self.settings})
        if self.builds is not None:
            state["builds"] = list(self.builds)
        if self.windows is not None:
            state["windows"] = [[list(run) for run in runs] for runs in self.windows]
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> MixtureState:
        if not isinstance(state, Mapping):
            raise TypeError(f"a resume state is a dict, not {type(state).__name__}")
        if state.get("mode") != MIXTURE_MODE:
            raise ValueError(f"the resume state is for one cache (shuffle_mode={state.get('mode')!r}), not a mixture")
        if state.get("version", MIXTURE_STATE_VERSION) != MIXTURE_STATE_VERSION:
            raise ValueError(f"mixture resume state version {state.get('version')!r} is not {MIXTURE_STATE_VERSION}")
        known = {"version", "mode", "epoch", "consumed", "seed", "order", "num_records", "components"}
        unknown = sorted(set(state) - known - set(MIXTURE_SETTINGS) - {"builds", "windows"})
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
            raise ResumeStateError(
                f"mixture resume state fields must not be negative: epoch {epoch}, consumed {consumed}"
            )
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
        builds = state.get("builds")
        if builds is not None and (
            not isinstance(builds, (list, tuple))
            or len(builds) != len(components)
            or not all(build is None or isinstance(build, str) for build in builds)
        ):
            raise ResumeStateError(f"mixture resume state builds must be one build id per component, got {builds!r}")
        seed = state.get("seed")
        return cls(
            epoch,
            consumed,
            None if seed is None else as_int(seed, "resume state seed"),
            order,
            components,
            settings=parse_settings(state, MIXTURE_SETTINGS, "mixture resume state"),
            builds=None if builds is None else tuple(builds),
            windows=_window_runs(state.get("windows"), len(components)),
        )


def _window_runs(raw: Any, components: int) -> Optional[tuple[WindowRuns, ...]]:
    """A mixture state's ``windows``, checked: per component, ``[last pass, window]`` runs with
    increasing passes and windows of at least 1."""
    if raw is None:
        return None
    wrong = ResumeStateError(
        "mixture resume state windows must be one list of [last pass, window] runs per component "
        f"(passes increasing, windows at least 1), got {raw!r}"
    )
    if not isinstance(raw, (list, tuple)) or len(raw) != components:
        raise wrong
    checked = []
    for runs in raw:
        if not isinstance(runs, (list, tuple)):
            raise wrong
        found: list[tuple[int, int]] = []
        for run in runs:
            if not isinstance(run, (list, tuple)) or len(run) != 2:
                raise wrong
            try:
                last, window = as_int(run[0], "pass"), as_int(run[1], "window")
            except TypeError:
                raise wrong from None
            if last < 0 or last > MAX_EPOCH or window < 1 or (found and last <= found[-1][0]):
                raise wrong
            found.append((last, window))
        checked.append(tuple(found))
    return tuple(checked)


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
    #: The mode's order-deciding settings its states record beyond ``STATE_SETTINGS`` (their
    #: types in ``yogacache.read.state.SETTING_TYPES``), compared on resume.
    setting_keys: ClassVar[tuple[str, ...]] = ()
    #: What to do about a setting of this mode that differs on resume (``check_state``'s hints).
    state_hints: ClassVar[Mapping[str, str]] = {}
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

    # -- the state contract (``yogacache.read.state``) ------------------------------------------
    def order_settings(self) -> dict[str, Any]:
        """What decides this reader's order from a state on, as states record it, in the order
        ``check_state`` compares them: the mode, the cache's build and records, the shuffle flags
        and seed (those two only where it shuffles) and the mode's ``setting_keys``."""
        options = self.options
        settings: dict[str, Any] = {"mode": self.name}
        build = self.layout.build if self.layout is not None else None
        if build is not None:
            settings["build"] = build
        settings["num_records"] = self.num_records
        settings["shuffle"] = options.shuffle
        if options.shuffle:
            settings["seed"] = options.shuffle_seed
            settings["reshuffle_each_epoch"] = options.reshuffle_each_epoch
        return settings

    def state_settings(self) -> dict[str, Any]:
        """The settings a state of this reader records (``ResumeState.settings``)."""
        settings = self.order_settings()
        keys = (*STATE_SETTINGS, *self.setting_keys)
        return {key: settings[key] for key in keys if key in settings}

    def reader_settings(self) -> dict[str, Any]:
        """What else decides this rank's order, which a resume honours rather than compares: the
        values fitted to the node's budget (``fit_budget``), how ranks share nodes."""
        return {}

    def state_limits(self, state: ResumeState) -> dict[str, tuple[int, int]]:
        """The range of each number of ``state`` this reader resumes from (``check_state``)."""
        return {"epoch": (0, MAX_EPOCH), "consumed": (0, self.num_records)}

    def check_state(self, state: ResumeState) -> None:
        """Refuses ``state`` unless it was saved in this reader's order with numbers in range:
        the one check (``yogacache.read.state.check_state``) before ``resume_point``."""
        check_state(state.to_dict(), self.order_settings(), self.state_limits(state), hints=self.state_hints)

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
                f"shuffle_mode={cls.name!r} with shuffle=True needs shuffle_seed: every rank must compute {order}"
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
        """The point a resume state of this mode names (``check_state`` passed)."""
        return self.advance((state.epoch, 0), state.consumed)


class ShardMode(ShuffleMode):
    """YogaDL's order: each rank shuffles its own fixed strided shard."""

    name = "shard"
    resumes_per_shard = True
    setting_keys: ClassVar[tuple[str, ...]] = ("drop_shard_remainder",)
    state_hints: ClassVar[Mapping[str, str]] = {
        key: (
            "a shard-mode resume state is valid only for its own shard (the same shard_rank, num_shards "
            "and drop_shard_remainder): use shuffle_mode='global' to resume with another number of ranks"
        )
        for key in ("shard_rank", "num_shards", "drop_shard_remainder")
    }

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

    def order_settings(self) -> dict[str, Any]:
        options = self.options
        return {
            **super().order_settings(),
            "shard_rank": options.shard_rank,
            "num_shards": options.num_shards,
            "drop_shard_remainder": options.drop_shard_remainder,
        }

    def state_limits(self, state: ResumeState) -> dict[str, tuple[int, int]]:
        # A position counts records of this shard: past it is no point of the epoch.
        return {**super().state_limits(state), "consumed": (0, len(self.order))}


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
