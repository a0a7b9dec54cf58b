"""CRC32C, the checksum S3 and GCS compute themselves, in the form both report it.

Both clouds give an object's CRC32C as the base64 of its four big-endian bytes (S3's
``ChecksumCRC32C``, GCS's ``crc32c``); manifests keep it in that form too, so that a value read
from either cloud compares with a string equality. ``google-crc32c`` (already a dependency of
google-cloud-storage) computes it, in C where its wheel has the extension.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any, Optional

CRC32C_PATTERN = re.compile(r"[A-Za-z0-9+/]{6}==")
_FILE_CHUNK = 8 << 20


def _module() -> Any:
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - exercised only without the library
        raise ImportError(
            "CRC32C checksums need google-crc32c: pip install 'yogacache[s3]' or 'yogacache[gcs]'"
        ) from None
    return google_crc32c


def encode_crc32c(value: int) -> str:
    """``value`` as S3 and GCS write a CRC32C: base64 of the four big-endian bytes."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


class Crc32c:
    """A running CRC32C: ``update`` with consecutive chunks, then ``value`` (base64)."""

    def __init__(self) -> None:
        self._checksum = _module().Checksum()

    def update(self, data: bytes | memoryview) -> None:
        self._checksum.update(data)

    @property
    def value(self) -> str:
        return encode_crc32c(int.from_bytes(self._checksum.digest(), "big"))


def crc32c_of(data: bytes | memoryview) -> str:
    """The CRC32C of ``data`` (base64)."""
    return encode_crc32c(int(_module().value(bytes(data))))


def crc32c_file(path: Path) -> str:
    """The CRC32C of a file's bytes (base64), read in chunks."""
    checksum = Crc32c()
    with open(path, "rb") as handle:
        while chunk := handle.read(_FILE_CHUNK):
            checksum.update(chunk)
    return checksum.value


def is_crc32c(value: Optional[str]) -> bool:
    """Whether ``value`` has the form of a CRC32C as written above (not a composite ``...-N``)."""
    return value is not None and CRC32C_PATTERN.fullmatch(value) is not None
