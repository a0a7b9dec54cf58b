"""Source URLs: brace expansion (``train-{000000..000146}.tar``) and splitting into scheme, bucket, key.

The schemes are the backend registry's (``backends.registry``), aliases included: a backend
registered there reads sources too.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from yogacache import redaction
from yogacache.backends.registry import ALIASES, BACKENDS
from yogacache.sources.errors import SourceError

MAX_EXPANSION = 1_000_000
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Every string ``pattern`` stands for, in order, as the ``braceexpand`` package (and so
    webdataset) expands it: ``{000..002}`` is a zero-padded integer range, ``{a,b}`` a list;
    several groups multiply. A group without ``..`` or ``,`` is kept as written."""
    match = next((m for m in _BRACE.finditer(pattern) if _RANGE.match(m.group(1)) or "," in m.group(1)), None)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    body = match.group(1)
    numbers = _RANGE.match(body)
    if numbers:
        first, last = numbers.group(1), numbers.group(2)
        start, stop = int(first), int(last)
        width = len(first) if first.lstrip("-").startswith("0") and len(first) > 1 else 0
        step = 1 if stop >= start else -1
        if abs(stop - start) + 1 > MAX_EXPANSION:
            raise SourceError(f"{pattern!r} stands for more than {MAX_EXPANSION} names")
        items = [str(n).zfill(width) for n in range(start, stop + step, step)]
    else:
        items = body.split(",")
    return [head + item + rest for item in items for rest in expand_braces(tail)]


@dataclass(frozen=True)
class Location:
    """Where one source URL points: ``scheme`` (a registry scheme: s3, gs, file, ...), ``bucket``
    (empty for files), ``key`` (a key or key prefix; an absolute path for files)."""

    scheme: str
    bucket: str
    key: str

    @property
    def url(self) -> str:
        if self.scheme == "file":
            return self.key
        return f"{self.scheme}://{self.bucket}/{self.key}"

    @property
    def store_url(self) -> str:
        """The URL of the backend this object is read through: its bucket's root (the
        filesystem's root for files)."""
        return "file:///" if self.scheme == "file" else f"{self.scheme}://{self.bucket}/"

    @property
    def store_key(self) -> str:
        """The key in the backend at ``store_url`` (a path without its leading ``/`` for files)."""
        return self.key.lstrip("/") if self.scheme == "file" else self.key

    def child(self, key: str) -> Location:
        return Location(self.scheme, self.bucket, key)

    def at_store_key(self, key: str) -> Location:
        """The location of ``key`` of the backend at ``store_url`` (``store_key``'s inverse)."""
        return self.child("/" + key if self.scheme == "file" else key)


def parse_location(url: str) -> Location:
    """``s3://bucket/key``, ``gs://bucket/key`` (``gcs://`` too), any other scheme of the backend
    registry, ``file:///path`` or a local path."""
    parsed = urlparse(url)
    scheme = ALIASES.get(parsed.scheme, parsed.scheme)
    if scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt"):
        path = parsed.path if scheme == "file" else url
        return Location("file", "", str(Path(path).expanduser().absolute()))
    if scheme not in BACKENDS:
        known = ", ".join(f"{name}://" for name in sorted(BACKENDS) if name != "file")
        raise SourceError(f"unsupported source URL {redaction.describe(url)}: use {known}, file:// or a local path")
    if not parsed.netloc:
        raise SourceError(f"source URL {redaction.describe(url)} names no bucket")
    return Location(scheme, parsed.netloc, parsed.path.lstrip("/"))
