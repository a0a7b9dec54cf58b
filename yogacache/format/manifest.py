"""The cache manifest: what a sealed cache holds, written last so its presence means "complete"."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from yogacache.errors import (
    CacheNotFoundError,
    CorruptCacheError,
    IncompatibleCacheError,
    InvalidNameError,
    YogaCacheError,
)
from yogacache.format.codec import CODEC_NAME
from yogacache.format.spec import Spec, spec_from_json, spec_to_json
from yogacache.locks import busy_note
from yogacache.names import MAX_NAME_LENGTH, SAFE_NAME, validate_name, validate_version

FORMAT_NAME = "yogacache"
FORMAT_VERSION = 1
# Format 2 is format 1 whose parts may say which key their first record has (``first_key``: a
# parallel build's shard keys its records from 0); this version reads both.
READ_FORMAT_VERSION = 2
MANIFEST_NAME = "manifest.json"
# A manifest of 100,000 parts is about 20 MB: anything larger is not one of ours.
MAX_MANIFEST_BYTES = 64 << 20
# The record codecs this version reads. A manifest without a ``codec`` field was written by
# yogacache 0.1.0, whose records are all msgpack-leaves-v1.
KNOWN_CODECS = frozenset({CODEC_NAME})
LEGACY_CODEC = "msgpack-leaves-v1"


def part_name(index: int) -> str:
    return f"part-{index:05d}.mdb"


# The content hashes a part may carry, strongest-known first. Builds since 0.2 write BLAKE3
# (about 2.4x SHA-256's speed here, also cryptographic); earlier caches carry SHA-256 and keep
# verifying with it.
PART_HASHES = ("blake3", "sha256")
BUILD_HASH = "blake3"


@dataclass(frozen=True)
class PartInfo:
    """One LMDB part file: which records it holds, its exact size and its content hash
    (``blake3`` for caches built since 0.2, ``sha256`` before; at least one is set).

    ``crc32c`` (optional; a copy adds it) is the part's CRC32C as S3 and GCS report it (base64
    of four big-endian bytes): a copy in a bucket is checked against the checksum the cloud
    computed, without reading the bytes back.
    """

    name: str
    first_record: int
    num_records: int
    size_bytes: int
    sha256: Optional[str] = None
    blake3: Optional[str] = None
    crc32c: Optional[str] = None
    first_key: Optional[int] = None  # the key of the part's first record; None: first_record

    @property
    def key_shift(self) -> int:
        """What to subtract from a record's index to get its key in this part."""
        return 0 if self.first_key is None else self.first_record - self.first_key

    @property
    def hash_name(self) -> str:
        """The algorithm of the hash that vouches for this part's bytes."""
        return "blake3" if self.blake3 is not None else "sha256"

    @property
    def digest(self) -> str:
        """The part's hex content hash (of ``hash_name``)."""
        value = self.blake3 if self.blake3 is not None else self.sha256
        if value is None:
            raise CorruptCacheError(f"part {self.name} carries no content hash")
        return value

    @property
    def hash_label(self) -> str:
        """``digest`` as stamps and messages name it: bare hex for SHA-256 (as before 0.2), else
        ``<algorithm>:<hex>``."""
        return self.digest if self.hash_name == "sha256" else f"{self.hash_name}:{self.digest}"

    def to_json(self) -> dict[str, Any]:
        return {key: value for key, value in vars(self).items() if value is not None}


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a sealed cache."""

    dataset_id: str
    dataset_version: str
    num_records: int
    num_bytes: int
    element_spec: Spec
    parts: tuple[PartInfo, ...]
    created_at: str
    build_id: str
    writer_version: str
    source: str = "python"
    codec: str = CODEC_NAME
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total_size_bytes(self) -> int:
        return sum(part.size_bytes for part in self.parts)

    @property
    def average_record_bytes(self) -> int:
        """The mean encoded size of a record (at least 1): what read sizes and readahead go by."""
        return max(1, self.num_bytes // max(1, self.num_records))

    @property
    def freshness(self) -> tuple[str, str]:
        """What identifies this build: two caches are the same build iff these are equal."""
        return (self.created_at, self.build_id)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "dataset_id": self.dataset_id,
            "dataset_version": self.dataset_version,
            "num_records": self.num_records,
            "num_bytes": self.num_bytes,
            "element_spec": spec_to_json(self.element_spec),
            "parts": [part.to_json() for part in self.parts],
            "created_at": self.created_at,
            "build_id": self.build_id,
            "writer_version": self.writer_version,
            "source": self.source,
            "codec": self.codec,
            "extra": self.extra,
        }

    def content_json(self) -> dict[str, Any]:
        """``to_json`` without the per-part CRC32C: two manifests describe the same cache, part for
        part, iff these are equal (a copy adds CRC32Cs to a manifest; the bytes are the same)."""
        raw = self.to_json()
        raw["parts"] = [{k: v for k, v in part.items() if k != "crc32c"} for part in raw["parts"]]
        return raw

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Parses a manifest; ``where`` names its location in error messages.

        Every malformed input (bad JSON, non-finite or oversized numbers, a field of the wrong
        type, a name that is not one safe path component) raises CorruptCacheError.
        """
        try:
            raw = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
        except (UnicodeDecodeError, ValueError, RecursionError) as error:  # JSONDecodeError is a ValueError
            raise CorruptCacheError(f"manifest {where} is not valid JSON: {error}") from error
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise CorruptCacheError(f"manifest {where} is not a yogacache manifest")
        version = raw.get("format_version")
        if type(version) is not int or version < 1:
            raise CorruptCacheError(f"manifest {where} has no valid format_version")
        if version > READ_FORMAT_VERSION:
            raise IncompatibleCacheError(
                f"cache at {where} was written in format version {version}; this yogacache "
                f"reads up to version {READ_FORMAT_VERSION}: upgrade yogacache to read it"
            )
        codec = raw.get("codec", LEGACY_CODEC)
        if not isinstance(codec, str):
            raise CorruptCacheError(f"manifest {where} has a codec that is not a name: {type(codec).__name__}")
        if codec not in KNOWN_CODECS:
            raise IncompatibleCacheError(
                f"cache at {where} holds records written with codec {codec!r:.80}; this yogacache "
                f"reads {', '.join(sorted(KNOWN_CODECS))}: upgrade yogacache to read it"
            )
        fields = _Fields(raw, where)
        parts = _parts_from_json(fields.get("parts", list), where)
        extra = raw.get("extra") or {}
        if not isinstance(extra, dict):
            raise CorruptCacheError(f"manifest {where}: field 'extra' must be an object, not {type(extra).__name__}")
        try:
            element_spec = spec_from_json(raw.get("element_spec"))
        except _SPEC_ERRORS as error:
            raise CorruptCacheError(f"manifest {where} has a malformed element_spec: {error}") from error
        manifest = cls(
            dataset_id=fields.text("dataset_id"),
            dataset_version=fields.text("dataset_version"),
            num_records=fields.count("num_records"),
            num_bytes=fields.count("num_bytes"),
            element_spec=element_spec,
            parts=parts,
            created_at=fields.text("created_at"),
            build_id=fields.text("build_id"),
            writer_version=fields.text("writer_version"),
            source=fields.text("source", default="python"),
            codec=codec,
            format_version=version,
            extra=extra,
        )
        manifest.check_consistent(where)
        return manifest

    def check_consistent(self, where: str) -> None:
        """Raises CorruptCacheError unless every name that becomes a path is one safe component
        (ids, build id, part names) and the parts tile the records exactly."""
        for what, value in (
            ("dataset_id", self.dataset_id),
            ("dataset_version", self.dataset_version),
            ("build_id", self.build_id),
        ):
            _check_component(value, what, where)
        if not _parts_plainly_valid(self.parts, self.num_records):
            _check_parts(self.parts, self.num_records, where)  # one by one: says what is wrong

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST_NAME
        try:
            with open(path, "rb") as handle:
                # Read what is there (up to the cap): read(cap) would allocate the whole cap.
                size = os.fstat(handle.fileno()).st_size
                data = handle.read(min(size, MAX_MANIFEST_BYTES) + 1)
        except FileNotFoundError as error:
            raise CacheNotFoundError(f"no cache at {directory} (no {MANIFEST_NAME}){busy_note(directory)}") from error
        except (IsADirectoryError, NotADirectoryError) as error:
            raise CorruptCacheError(f"manifest {path} is not a file") from error
        if len(data) > MAX_MANIFEST_BYTES:
            raise CorruptCacheError(f"manifest {path} is larger than {MAX_MANIFEST_BYTES} bytes")
        return cls.from_bytes(data, str(path))


# Counts and sizes beyond a signed 64-bit integer are no real cache's.
_MAX_COUNT = (1 << 63) - 1
_HEX_256 = re.compile(r"[0-9a-f]{64}")  # SHA-256 and BLAKE3 (256-bit)
_HASH_TITLES = {"sha256": "SHA-256", "blake3": "BLAKE3"}
_CRC32C = re.compile(r"[A-Za-z0-9+/]{6}==")
# What a malformed element spec can raise while it is parsed.
_SPEC_ERRORS = (
    KeyError, IndexError, TypeError, ValueError, ArithmeticError, AttributeError, RecursionError, YogaCacheError
)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a manifest may hold")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range")
    return value


def _check_component(value: str, what: str, where: str) -> None:
    """CorruptCacheError unless ``value`` is one safe path component (see yogacache.names)."""
    try:
        validate_version(value, what) if what == "dataset_version" else validate_name(value, what)
    except InvalidNameError as error:
        raise CorruptCacheError(f"manifest {where}: {error}") from None


class _Fields:
    """Typed reads of one JSON object of a manifest: a missing or mistyped field is a CorruptCacheError."""

    def __init__(self, raw: dict[str, Any], where: str) -> None:
        self.raw = raw
        self.where = where

    def get(self, key: str, kind: type, default: Any = None) -> Any:
        value = self.raw.get(key, default)
        if value is None:
            raise CorruptCacheError(f"manifest {self.where} is missing the field {key!r}")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorruptCacheError(
                f"manifest {self.where}: field {key!r} must be {_KIND_NAMES.get(kind, kind.__name__)}, "
                f"not {type(value).__name__}"
            )
        return value

    def text(self, key: str, default: Optional[str] = None) -> str:
        return str(self.get(key, str, default))

    def count(self, key: str) -> int:
        value = int(self.get(key, int))
        if not 0 <= value <= _MAX_COUNT:
            raise CorruptCacheError(f"manifest {self.where}: field {key!r} is out of range ({value})")
        return value


_KIND_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object"}


def _parts_from_json(parts: list[Any], where: str) -> tuple[PartInfo, ...]:
    """The parts of a manifest's ``parts`` list. Parts whose fields are all as a writer writes
    them are taken with plain type checks per part and one regular-expression pass over all
    their hashes (a 100,000-part manifest decodes in a fraction of a second); otherwise every
    part goes through ``_part_from_json``, which says what is wrong with the first wrong one, so
    both paths accept exactly the same manifests."""
    found = []
    digests: list[str] = []
    checksums: list[str] = []
    top = _MAX_COUNT
    for raw in parts:
        if type(raw) is not dict:
            break
        get = raw.get
        name, first, count, size = get("name"), get("first_record"), get("num_records"), get("size_bytes")
        sha256, blake3, crc32c, first_key = get("sha256"), get("blake3"), get("crc32c"), get("first_key")
        if not (
            type(name) is str
            and type(first) is int
            and type(count) is int
            and type(size) is int
            and 0 <= first <= top
            and 0 <= count <= top
            and 0 <= size <= top
            and (sha256 is None) is ("sha256" not in raw)  # present means a string (checked below)
            and (blake3 is None) is ("blake3" not in raw)
            and (sha256 is not None or blake3 is not None)
            and (first_key is None or (type(first_key) is int and 0 <= first_key <= top))
        ):
            break
        if sha256 is not None:
            digests.append(sha256)
        if blake3 is not None:
            digests.append(blake3)
        if crc32c is not None:
            checksums.append(crc32c)
        found.append(PartInfo(name, first, count, size, sha256, blake3, crc32c, first_key))
    else:
        if _all_match(_HEX_256, digests) and _all_match(_CRC32C, checksums):
            return tuple(found)
    return tuple(_part_from_json(raw, f"{where} (parts[{index}])") for index, raw in enumerate(parts))


def _all_match(pattern: re.Pattern[str], values: list[str]) -> bool:
    """Whether every one of ``values`` is a string that ``pattern`` (which matches no newline)
    matches whole: one pass of the regular-expression engine per 4,096 of them (joined by
    newlines: a few hundred kilobytes at a time, whatever the manifest's size)."""
    lines = re.compile(f"(?:{pattern.pattern})(?:\n(?:{pattern.pattern}))*")
    for start in range(0, len(values), 4096):
        try:
            joined = "\n".join(values[start : start + 4096])
        except TypeError:  # not all strings
            return False
        if lines.fullmatch(joined) is None:
            return False
    return True


def _parts_plainly_valid(parts: tuple[PartInfo, ...], num_records: int) -> bool:
    """Whether ``parts`` pass ``_check_parts``, checked at once for a whole manifest (its part
    names in one regular-expression pass): False sends them through ``_check_parts``."""
    names = [part.name for part in parts]
    unique = set(names)
    if len(unique) != len(names) or MANIFEST_NAME in unique:
        return False
    if names and max(map(len, names)) > MAX_NAME_LENGTH or not _all_match(SAFE_NAME, names):
        return False
    counted = 0
    for part in parts:
        if part.first_record != counted or part.num_records < 0 or part.size_bytes < 0:
            return False
        counted += part.num_records
    return counted == num_records


def _check_parts(parts: tuple[PartInfo, ...], num_records: int, where: str) -> None:
    """CorruptCacheError naming the first part whose name is not one safe path component, is
    named twice, or does not start where the one before ends; or saying that the parts do not
    hold ``num_records`` records."""
    expected_first = 0
    seen: set[str] = set()
    for part in parts:
        _check_component(part.name, "part name", where)
        if part.name == MANIFEST_NAME or part.name in seen:
            raise CorruptCacheError(f"manifest {where} lists an invalid part {part.name!r}")
        seen.add(part.name)
        if part.first_record != expected_first or part.num_records < 0 or part.size_bytes < 0:
            raise CorruptCacheError(f"manifest {where} lists an invalid part {part.name!r}")
        expected_first += part.num_records
    if expected_first != num_records:
        raise CorruptCacheError(f"manifest {where} counts {num_records} records but its parts hold {expected_first}")


def _part_from_json(raw: Any, where: str) -> PartInfo:
    if not isinstance(raw, dict):
        raise CorruptCacheError(f"manifest {where} is not an object")
    fields = _Fields(raw, where)
    hashes: dict[str, Optional[str]] = {}
    for name in PART_HASHES:
        if name in raw:
            value = fields.text(name)
            if not _HEX_256.fullmatch(value):
                raise CorruptCacheError(f"manifest {where}: field {name!r} is not a hex {_HASH_TITLES[name]}")
            hashes[name] = value
    if not hashes:
        raise CorruptCacheError(f"manifest {where} has no content hash ('sha256' or 'blake3')")
    crc32c = raw.get("crc32c")
    if crc32c is not None and not (isinstance(crc32c, str) and _CRC32C.fullmatch(crc32c)):
        raise CorruptCacheError(f"manifest {where}: field 'crc32c' is not a base64 CRC32C")
    return PartInfo(
        name=fields.text("name"),
        first_record=fields.count("first_record"),
        num_records=fields.count("num_records"),
        size_bytes=fields.count("size_bytes"),
        crc32c=crc32c,
        **hashes,
        first_key=fields.count("first_key") if raw.get("first_key") is not None else None,
    )

