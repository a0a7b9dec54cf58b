"""Validation of dataset ids and versions before they become path components or object keys."""

from __future__ import annotations

import re

from yogacache.errors import InvalidNameError

MAX_NAME_LENGTH = 128
# Internal names extend a user's version with a suffix such as "_train".
MAX_INTERNAL_NAME_LENGTH = MAX_NAME_LENGTH + 16

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


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
    if not _SAFE_NAME.fullmatch(value):
        raise InvalidNameError(
            f"{what} {value!r} is not allowed: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit (no path separators, no '.' or '..')"
        )
    return value
