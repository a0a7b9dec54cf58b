"""Byte sizes as people write them: ``"200Gi"``, ``"1.5T"``, ``"512M"``, or a plain number.

Decimal units (``K M G T``, powers of 1000) and binary ones (``Ki Mi Gi Ti``, powers of 1024),
with an optional trailing ``B``; what ``local_cache_limit`` and ``yogacache gc --limit`` take.
"""

from __future__ import annotations

import re
from typing import Any

from yogacache.errors import ConfigError

__all__ = ["MIN_PART_BYTES", "format_size", "parse_part_bytes", "parse_size"]

#: The smallest part size a build takes: every part is a file, an object, a request and a hash
#: of its own, and below 1 MiB that overhead outweighs the records a part holds.
MIN_PART_BYTES = 1 << 20

_UNITS = {
    "": 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "KI": 2**10,
    "MI": 2**20,
    "GI": 2**30,
    "TI": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?\s*$", re.IGNORECASE)


def parse_size(value: Any, what: str = "size") -> int:
    """``value`` in bytes: an int, or a string such as ``"200Gi"`` / ``"1.5T"``; ConfigError
    (naming ``what`` and the accepted units) for anything else."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a byte size such as '200Gi', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{what} must not be negative, got {value}")
        return value
    match = _SIZE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigError(
            f"{what} must be a byte size such as '200Gi' or '500G' (units K M G T, Ki Mi Gi Ti), got {value!r}"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[(unit or "").upper()])


def parse_part_bytes(value: Any, what: str = "part_bytes") -> int:
    """``value`` (an int or a size such as ``"64Mi"``) as a part size in bytes: a build rolls to a
    new part past it. ConfigError, naming ``what``, for anything that is not a size of at least
    ``MIN_PART_BYTES``."""
    size = parse_size(value, what)
    if size < MIN_PART_BYTES:
        raise ConfigError(
            f"{what} must be at least 1 MiB ({MIN_PART_BYTES} bytes), got {value!r}: every part is a file, "
            "an object and a request of its own, and smaller parts cost more in that overhead than they hold"
        )
    return size


def format_size(size: int) -> str:
    """``size`` bytes in binary units, e.g. ``"1.5 GiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover
