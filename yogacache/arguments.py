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
