"""The resume-state contract: what a state records of the order it was saved in, and the one
validator that checks a state against the reader resuming it.

A resume state (``ResumeState`` for one cache, ``MixtureState`` for a mixture: both in
``yogacache.read.shuffle``) holds a position (``epoch``, ``consumed``, and a mode's own, such as
``"parts"``'s ``dealt``) and every setting that decides the order from there on
(``SETTING_TYPES``): the cache's build and records, the seed, the shuffle flags, the mode and each
of its settings (``parts_window``; a shard's rank and count in ``"shard"`` mode), a mixture's
components, builds and counts per epoch (what its weights, epoch size or stopping rule made), and
the values fitted from a node budget (``"parts"``'s ``window``).

``check_state`` is the one check: it compares each setting the reader names with the state's,
and each number of the state with the range the reader allows (``epoch``, ``consumed``,
``dealt``, …), refusing with a ``ResumeStateError`` that names the setting and both values
(``check_components`` first names a mixture's component that differs). A
mode supplies what it compares (``ShuffleMode.order_settings``) and the ranges
(``ShuffleMode.state_limits``); the settings it can honour exactly it leaves out of the
comparison and honours itself, saying so once (``say_once``): a ``"parts"`` window fitted to
another budget reads the rest of the saved epoch with the saved window.

A state written by an earlier release lacks the settings recorded since: it is checked on what
it carries (a setting the state does not name is not compared), so saved checkpoints keep
resuming. Grain's checkpoints are checked by ``repr``: ``fingerprint`` condenses the same
settings into the reprs of ``yogacache.grain``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, Mapping, Optional, Sequence

from yogacache import redaction
from yogacache.errors import ResumeStateError

__all__ = [
    "MAX_EPOCH",
    "ResumeStateError",
    "SETTING_TYPES",
    "check_components",
    "check_state",
    "describe_setting",
    "fingerprint",
    "parse_settings",
    "say_once",
]

log = redaction.get_logger(__name__)

#: The order-deciding settings a state records beyond its position, and their types. A state
#: from an earlier release may lack any of them.
SETTING_TYPES: dict[str, type] = {
    "build": str,
    "shuffle": bool,
    "reshuffle_each_epoch": bool,
    "drop_shard_remainder": bool,
    "rotate": bool,
    "parts_window": int,
}
#: The largest epoch a state may name (a key epoch stays far from numpy's int64 limits).
MAX_EPOCH = 1 << 48
# How settings are called where users pass them.
_SHOWN = {"mode": "shuffle_mode", "seed": "shuffle_seed", "order": "shuffle_mode"}
_DEFAULT_HINT = "resume with the settings the state was saved with, or start the epoch over without it"
_HINTS = {
    "build": (
        "the cache was rebuilt since the state was saved, so its records may differ: resume on the build "
        "it was saved of, or start the epoch over without the state"
    ),
    "num_records": "the state is of another dataset: resume the dataset it was saved of",
}
_SAID: set[str] = set()


def parse_settings(state: Mapping[str, Any], keys: Iterable[str], what: str = "resume state") -> dict[str, Any]:
    """The settings among ``keys`` that ``state`` records, type-checked (``SETTING_TYPES``)."""
    found: dict[str, Any] = {}
    for key in keys:
        if key not in state:
            continue
        value, kind = state[key], SETTING_TYPES[key]
        if key == "build" and value is None:
            found[key] = None  # a cache whose manifest names no build
            continue
        if kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        else:
            ok = isinstance(value, kind)
        if not ok:
            expected = "a positive integer" if kind is int else kind.__name__
            raise ResumeStateError(f"the {what}'s {key} must be {expected}, got {value!r}")
        found[key] = value
    return found


def describe_setting(name: str, value: Any) -> str:
    """``name=value`` as users write the setting."""
    shown = _SHOWN.get(name, name)
    if name == "reshuffle_each_epoch" and isinstance(value, bool):
        return f"reshuffle_each_epoch={value} (skip_shuffle_at_epoch_end={not value})"
    return f"{shown}={value!r}" if isinstance(value, str) else f"{shown}={value}"


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def check_state(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    limits: Optional[Mapping[str, tuple[int, int]]] = None,
    *,
    hints: Optional[Mapping[str, str]] = None,
    reader: str = "this reader",
) -> None:
    """Refuses ``saved`` (a resume state's dict) unless every setting of ``current`` (what
    decides ``reader``'s order, in the order to check them) that the state records is the same,
    and every number of the state named in ``limits`` is an integer in its ``(low, high)`` range.
    ``hints`` say what to do about a setting (a default otherwise)."""
    for name, value in current.items():
        if name not in saved:
            continue  # a state from a release that did not record it: checked on what it carries
        if not _same(saved[name], value):
            hint = (hints or {}).get(name) or _HINTS.get(name, _DEFAULT_HINT)
            raise ResumeStateError(
                f"the resume state was saved with {describe_setting(name, saved[name])}, {reader} has "
                f"{describe_setting(name, value)}: {hint}"
            )
    for name, (low, high) in (limits or {}).items():
        value = saved.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ResumeStateError(f"the resume state's {name} must be an integer, got {value!r}")
        if not low <= value <= high:
            raise ResumeStateError(
                f"the resume state's {name}={value} is out of range: {reader} takes {low} to {high}; "
                "the state is damaged or of another order"
            )


def check_components(
    saved: Sequence[tuple[str, int, int]],
    saved_builds: Optional[Sequence[Optional[str]]],
    current: Sequence[tuple[str, int, int]],
    builds: Sequence[Optional[str]],
) -> None:
    """Refuses a mixture's state unless it names this mixture's components: the same caches
    (``<dataset_id>:<dataset_version>``, records, build where both name one), then the same
    records per epoch of each (what its weights, epoch size or stopping rule made)."""
    if len(saved) != len(current):
        raise ResumeStateError(
            f"the resume state is of a mixture of {len(saved)} components, this one has {len(current)}"
        )
    recorded = list(saved_builds) if saved_builds is not None else [None] * len(saved)
    # The caches first: a changed one changes the epoch's counts of the others too.
    for i, ((name, records, _), (now, size, _), was, build) in enumerate(zip(saved, current, recorded, builds)):
        if name != now:
            raise ResumeStateError(
                f"mixture component {i} changed since the checkpoint: it was {name}, it is {now}; "
                "resume with the components the state was taken with"
            )
        if records != size:
            raise ResumeStateError(
                f"mixture component {i} ({now}) changed since the checkpoint: it had {records} records, it has {size}"
            )
        if was is not None and build is not None and was != build:
            raise ResumeStateError(
                f"mixture component {i} ({now}) was rebuilt since the checkpoint: it was build {was}, it is "
                f"build {build}; its records may differ: resume on the build the state was taken of"
            )
    for i, ((_, _, count), (now, _, share)) in enumerate(zip(saved, current)):
        if count != share:
            raise ResumeStateError(
                f"mixture component {i} ({now}) took {count} records per epoch when the state was taken, "
                f"it takes {share} now: resume with the same weights and epoch size"
            )


def fingerprint(settings: Mapping[str, Any]) -> str:
    """A short stable digest of ``settings`` (JSON values): what Grain's checkpoint check sees."""
    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def say_once(message: str) -> None:
    """Logs ``message`` (what a resume honoured differently from the reader's own settings) once
    per process."""
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)
