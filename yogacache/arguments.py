"""Checks of loose user arguments before they are used: integers are integers, never bools."""

from __future__ import annotations

import operator


def as_int(value: object, what: str) -> int:
    """``value`` as an ``int`` (anything with ``__index__``, numpy integers included); a bool
    or a non-integer raises TypeError naming ``what``."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


def skip_shuffle_flag(skip_shuffle_at_epoch_end: object, skip_shuffle_end_of_epoch: object = None) -> bool:
    """YogaDL's ``skip_shuffle_at_epoch_end``, also accepted under Determined's documented
    spelling ``skip_shuffle_end_of_epoch``; giving both with different values is a ValueError."""
    if skip_shuffle_end_of_epoch is None:
        return bool(skip_shuffle_at_epoch_end)
    if skip_shuffle_at_epoch_end and not skip_shuffle_end_of_epoch:
        raise ValueError(
            "skip_shuffle_end_of_epoch is another name for skip_shuffle_at_epoch_end: "
            f"pass one of them, not both with different values ({skip_shuffle_at_epoch_end!r} "
            f"and {skip_shuffle_end_of_epoch!r})"
        )
    return bool(skip_shuffle_end_of_epoch)
