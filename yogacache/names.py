"""Validation of dataset ids and versions before they become path components or object keys."""

from __future__ import annotations

import re

from yogacache.errors import InvalidNameError

MAX_NAME_LENGTH = 128
# DataLayer stores a user's version V as V + "_train" or V + "_val".
VERSION_SUFFIXES = ("_train", "_val")

# One safe path component (``validate_name``; a manifest checks its part names against it at once).
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def validate_name(value: object, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    """Returns ``value`` if it is a safe dataset id or version, else raises InvalidNameError.

    A safe name is one path component: it starts with a letter or digit, continues with
    letters, digits, ``_``, ``.`` or ``-``, and is at most ``max_length`` characters. This
    rules out ``.``, ``..``, separators, absolute paths, NUL and hidden names.
    """
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidNameError(f"{what} must not be empty")
    if len(value) > max_length:
        raise InvalidNameError(f"{what} is {len(value)} characters long; the limit is {max_length}")
    if not SAFE_NAME.fullmatch(value):
        raise InvalidNameError(
            f"{what} {value!r} is not allowed: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit (no path separators, no '.' or '..')"
        )
    return value


def validate_version(value: object, what: str = "dataset_version") -> str:
    """Validates a cache version: a safe name of at most 128 characters, optionally
    followed by one of DataLayer's suffixes (``_train``, ``_val``)."""
    limit = MAX_NAME_LENGTH
    if isinstance(value, str):
        for suffix in VERSION_SUFFIXES:
            if value.endswith(suffix) and len(value) > len(suffix):
                limit += len(suffix)
                break
    return validate_name(value, what, limit)
