"""ReadOptions: every argument of how a rank reads a cache, as one frozen, validated object.

The facade (``DataRef.stream``, the DataLayer decorators, the torch dataset's constructor) keeps
YogaDL's loose keyword arguments and converts them once with ``ReadOptions.from_stream_args``;
everything below takes a ``ReadOptions``. A shuffle mode's own settings (``parts_window``, …)
are keywords its ``options_type`` declares: they travel in ``settings`` and reach the mode as
``mode_options``, so no signature lists them.
"""

from __future__ import annotations

import dataclasses
import inspect
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from yogacache import redaction
from yogacache.arguments import as_int, skip_shuffle_flag
from yogacache.read.shuffle import SHUFFLE_MODES, MixtureState, ResumeState, ShardMode, is_mixture_state, shuffle_mode

__all__ = [
    "DEFAULT_SHUFFLE_MODE",
    "ReadOptions",
    "STREAM_ARGUMENTS",
    "checked_resume_state",
    "mode_keywords",
    "stream_arguments",
    "stream_signature",
]

log = redaction.get_logger(__name__)

DEFAULT_SHUFFLE_MODE = ShardMode.name
#: YogaDL's ``DataRef.stream`` arguments, in its positional order, with their defaults.
STREAM_ARGUMENTS: tuple[tuple[str, Any], ...] = (
    ("start_offset", 0), ("shuffle", False), ("skip_shuffle_at_epoch_end", False), ("shuffle_seed", None),
    ("shard_rank", 0), ("num_shards", 1), ("drop_shard_remainder", False),
)  # fmt: skip


def mode_keywords() -> dict[str, type[Any]]:
    """Every registered mode's setting keywords, each with the ``options_type`` declaring it."""
    declared: dict[str, type[Any]] = {}
    for mode in SHUFFLE_MODES.values():
        if mode.options_type is not None:
            for each in dataclasses.fields(mode.options_type):
                declared.setdefault(each.name, mode.options_type)
    return declared


def _default(keyword: str) -> Any:
    """The default of a mode setting keyword."""
    for each in dataclasses.fields(mode_keywords()[keyword]):
        if each.name == keyword:
            return each.default
    raise KeyError(keyword)


@dataclass(frozen=True, init=False)
class ReadOptions:
    """How one rank reads a cache (see docs/design.md, "Reading").

    ``ReadOptions(**arguments)`` takes the attributes below by name, and any shuffle mode's
    setting keywords (``parts_window=``, ``ranks_per_node=``: ``PartsOptions``) for every mode;
    the mode in use gets its own as ``mode_options``.

    Attributes:
        start_offset: records of this rank already consumed (YogaDL's meaning): reading starts
            in epoch ``start_offset // len(shard)`` at ``start_offset % len(shard)``.
        shuffle: shuffle the records (otherwise dataset order).
        reshuffle_each_epoch: epoch ``e`` uses its own order derived from ``shuffle_seed`` and
            ``e``; otherwise every epoch uses the order of ``shuffle_seed`` (YogaDL's
            ``skip_shuffle_at_epoch_end=True``).
        shuffle_seed: the seed every shuffled order derives from.
        shard_rank: this rank, in ``[0, num_shards)``.
        num_shards: how many ranks share the dataset.
        drop_shard_remainder: read only the first ``N - N % num_shards`` records (shard mode), or
            end each epoch at a multiple of ``num_shards`` positions (global mode), so that every
            rank reads as many records as the others.
        shuffle_mode: the name of a mode in ``yogacache.read.shuffle.SHUFFLE_MODES``.
        resume_state: a resume state dict (``Stream.state_dict``), instead of ``start_offset``.
        settings: the mode setting keywords given that differ from their defaults, checked.
        mode_options: the settings of the mode in use (its ``options_type``; None if none).
    """

    start_offset: int = 0
    shuffle: bool = False
    reshuffle_each_epoch: bool = False
    shuffle_seed: Optional[int] = None
    shard_rank: int = 0
    num_shards: int = 1
    drop_shard_remainder: bool = False
    shuffle_mode: str = DEFAULT_SHUFFLE_MODE
    resume_state: Optional[Mapping[str, Any]] = None
    settings: Mapping[str, Any] = field(default_factory=dict, hash=False)
    mode_options: Any = field(default=None, init=False, compare=False, repr=False)

    def __init__(self, *args: Any, **arguments: Any) -> None:
        names = [each.name for each in dataclasses.fields(self) if each.init]
        if len(args) > len(names):
            raise TypeError(f"ReadOptions takes at most {len(names)} positional arguments, got {len(args)}")
        for name, value in zip(names, args):
            if name in arguments:
                raise TypeError(f"ReadOptions got multiple values for argument {name!r}")
            arguments[name] = value
        for each in dataclasses.fields(self):
            if each.init:
                default = each.default_factory() if each.default_factory is not dataclasses.MISSING else each.default
                object.__setattr__(self, each.name, arguments.pop(each.name, default))
        # What is left are mode settings: with ``settings`` (as ``dataclasses.replace`` passes it).
        object.__setattr__(self, "settings", {**self.settings, **arguments})
        self._check()

    def _check(self) -> None:
        def normalize(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for flag in ("shuffle", "reshuffle_each_epoch", "drop_shard_remainder"):
            normalize(flag, bool(getattr(self, flag)))
        num_shards = as_int(self.num_shards, "num_shards")
        if num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, got {num_shards}")
        shard_rank = as_int(self.shard_rank, "shard_rank")
        if not 0 <= shard_rank < num_shards:
            raise ValueError(f"shard_rank must be in [0, {num_shards}), got {shard_rank}")
        start_offset = as_int(self.start_offset, "start_offset")
        if start_offset < 0:
            raise ValueError(f"start_offset must not be negative, got {start_offset}")
        normalize("num_shards", num_shards)
        normalize("shard_rank", shard_rank)
        normalize("start_offset", start_offset)
        if self.shuffle_seed is not None:
            normalize("shuffle_seed", as_int(self.shuffle_seed, "shuffle_seed"))
        mode = shuffle_mode(self.shuffle_mode)
        settings, mode_options = self._mode_settings(mode.options_type)
        normalize("settings", settings)
        normalize("mode_options", mode_options)
        if self.resume_state is not None:
            if start_offset:
                raise ValueError("pass either start_offset or resume_state, not both")
            # A checked copy: the caller's dict may change later, these options may not.
            normalize("resume_state", checked_resume_state(self.resume_state))
        mode.check(self)
        if self.shuffle and self.shuffle_seed is None and self.resume_state is None:
            # A seedless shuffle (allowed: one order for every epoch) gets one concrete seed
            # here, so every reader of these options (DataLoader workers included) computes the
            # same order, and the log says how to reproduce it.
            seed = secrets.randbelow(2**31)
            normalize("shuffle_seed", seed)
            log.warning(
                "shuffle=True without shuffle_seed: shuffling with shuffle_seed=%d (pass it to "
                "reproduce this order)",
                seed,
            )

    def _mode_settings(self, own: Optional[type[Any]]) -> tuple[dict[str, Any], Any]:
        """(the settings, checked, that differ from their defaults; the settings of the mode in
        use). Every mode's keywords are accepted and checked, whichever mode reads."""
        declared = mode_keywords()
        unknown = sorted(set(self.settings) - set(declared))
        if unknown:
            raise TypeError(f"ReadOptions got unexpected keyword arguments {unknown}")
        by_type: dict[type[Any], dict[str, Any]] = {}
        for keyword, value in self.settings.items():
            by_type.setdefault(declared[keyword], {})[keyword] = value
        settings: dict[str, Any] = {}
        mode_options = own() if own is not None else None
        for options_type, given in by_type.items():
            checked = options_type(**given)
            defaults = options_type()
            settings.update(
                {key: getattr(checked, key) for key in given if getattr(checked, key) != getattr(defaults, key)}
            )
            if options_type is own:
                mode_options = checked
        return settings, mode_options

    def setting(self, keyword: str) -> Any:
        """The value of a mode setting keyword (its default when not given)."""
        if keyword not in mode_keywords():
            raise KeyError(f"no shuffle mode has a setting {keyword!r}")
        return self.settings.get(keyword, _default(keyword))

    @property
    def parts_window(self) -> int:
        """The ``"parts"`` mode's window (``PartsOptions.parts_window``), whatever the mode."""
        return self.setting("parts_window")  # type: ignore[no-any-return]

    @property
    def ranks_per_node(self) -> Optional[int]:
        """Consecutive ranks sharing a node (``PartsOptions.ranks_per_node``), whatever the mode."""
        return self.setting("ranks_per_node")  # type: ignore[no-any-return]

    @classmethod
    def from_stream_args(cls, *args: Any, **kwargs: Any) -> ReadOptions:
        """The options YogaDL's ``DataRef.stream(...)`` arguments stand for: ``STREAM_ARGUMENTS``
        (by position or name), and by name ``shuffle_mode``, ``resume_state``, Determined's
        ``skip_shuffle_end_of_epoch`` and any mode's setting keywords (``parts_window=``, …)."""
        named = {**dict(STREAM_ARGUMENTS), **stream_arguments(args, kwargs)}
        if "reshuffle_each_epoch" in named:
            raise TypeError("from_stream_args takes skip_shuffle_at_epoch_end, not reshuffle_each_epoch")
        shuffle = bool(named.pop("shuffle"))
        skip = skip_shuffle_flag(named.pop("skip_shuffle_at_epoch_end"), named.pop("skip_shuffle_end_of_epoch", None))
        return cls(shuffle=shuffle, reshuffle_each_epoch=shuffle and not skip, **named)


def checked_resume_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A checked copy of a resume state: one cache's (``ResumeState``) or a mixture's."""
    if is_mixture_state(state):
        return MixtureState.from_dict(state).to_dict()
    return ResumeState.from_dict(state).to_dict()


def stream_arguments(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``kwargs`` with YogaDL's positional ``stream`` arguments ``args`` added by name
    (``STREAM_ARGUMENTS`` order): what the facades pass on to ``ReadOptions.from_stream_args``."""
    if len(args) > len(STREAM_ARGUMENTS):
        raise TypeError(f"stream takes at most {len(STREAM_ARGUMENTS)} positional arguments, got {len(args)}")
    named = dict(kwargs)
    for (name, _), value in zip(STREAM_ARGUMENTS, args):
        if name in named:
            raise TypeError(f"stream got multiple values for argument {name!r}")
        named[name] = value
    return named


def stream_signature(leading: tuple[str, ...] = ("self",), **keywords: Any) -> inspect.Signature:
    """The signature of a facade taking ``leading`` arguments, YogaDL's stream arguments, then
    ``keywords`` (name: default), ours (``shuffle_mode``, ``resume_state``,
    ``skip_shuffle_end_of_epoch``) and every registered mode's settings, by name: what
    ``help()`` shows for the ``*args, **kwargs`` it passes on to ``from_stream_args``."""
    first = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in leading]
    positional = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=value)
        for name, value in STREAM_ARGUMENTS
    ]
    ours = {**keywords, "shuffle_mode": DEFAULT_SHUFFLE_MODE, "resume_state": None, "skip_shuffle_end_of_epoch": None}
    ours.update({keyword: _default(keyword) for keyword in mode_keywords()})
    named = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=value) for name, value in ours.items()]
    return inspect.Signature([*first, *positional, *named])
