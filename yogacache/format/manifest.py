"""The cache manifest: what a sealed cache holds, written last so its presence means "complete"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yogacache.errors import (
    CacheNotFoundError,
    CorruptCacheError,
    IncompatibleCacheError,
    YogaCacheError,
)
from yogacache.format.codec import CODEC_NAME
from yogacache.format.spec import Spec, spec_from_json, spec_to_json

FORMAT_NAME = "yogacache"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The record codecs this version reads. A manifest without a ``codec`` field was written by
# yogacache 0.1.0, whose records are all msgpack-leaves-v1.
KNOWN_CODECS = frozenset({CODEC_NAME})
LEGACY_CODEC = "msgpack-leaves-v1"


def part_name(index: int) -> str:
    return f"part-{index:05d}.mdb"


@dataclass(frozen=True)
class PartInfo:
    """One LMDB part file: which records it holds, its exact size and its SHA-256."""

    name: str
    first_record: int
    num_records: int
    size_bytes: int
    sha256: str


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
            "parts": [vars(part) for part in self.parts],
            "created_at": self.created_at,
            "build_id": self.build_id,
            "writer_version": self.writer_version,
            "source": self.source,
            "codec": self.codec,
            "extra": self.extra,
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Parses a manifest; ``where`` names its location in error messages."""
        try:
            raw = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise CorruptCacheError(f"manifest {where} is not valid JSON: {error}") from error
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise CorruptCacheError(f"manifest {where} is not a yogacache manifest")
        version = raw.get("format_version")
        if not isinstance(version, int):
            raise CorruptCacheError(f"manifest {where} has no format_version")
        if version > FORMAT_VERSION:
            raise IncompatibleCacheError(
                f"cache at {where} was written in format version {version}; this yogacache "
                f"reads up to version {FORMAT_VERSION}: upgrade yogacache to read it"
            )
        codec = raw.get("codec", LEGACY_CODEC)
        if not isinstance(codec, str):
            raise CorruptCacheError(f"manifest {where} has a codec that is not a name: {codec!r}")
        if codec not in KNOWN_CODECS:
            raise IncompatibleCacheError(
                f"cache at {where} holds records written with codec {codec!r}; this yogacache "
                f"reads {', '.join(sorted(KNOWN_CODECS))}: upgrade yogacache to read it"
            )
        try:
            parts = tuple(
                PartInfo(
                    name=str(p["name"]),
                    first_record=int(p["first_record"]),
                    num_records=int(p["num_records"]),
                    size_bytes=int(p["size_bytes"]),
                    sha256=str(p["sha256"]),
                )
                for p in raw["parts"]
            )
            manifest = cls(
                dataset_id=str(raw["dataset_id"]),
                dataset_version=str(raw["dataset_version"]),
                num_records=int(raw["num_records"]),
                num_bytes=int(raw["num_bytes"]),
                element_spec=spec_from_json(raw["element_spec"]),
                parts=parts,
                created_at=str(raw["created_at"]),
                build_id=str(raw["build_id"]),
                writer_version=str(raw["writer_version"]),
                source=str(raw.get("source", "python")),
                codec=codec,
                format_version=version,
                extra=dict(raw.get("extra") or {}),
            )
        except (KeyError, TypeError, ValueError, RecursionError, YogaCacheError) as error:
            raise CorruptCacheError(f"manifest {where} is missing or has a bad field: {error}") from error
        manifest.check_consistent(where)
        return manifest

    def check_consistent(self, where: str) -> None:
        """Raises CorruptCacheError unless the parts tile the records exactly."""
        expected_first = 0
        for part in self.parts:
            if (
                part.first_record != expected_first
                or part.num_records < 0
                or part.size_bytes < 0
                or "/" in part.name
                or part.name in ("", ".", "..")
            ):
                raise CorruptCacheError(f"manifest {where} lists an invalid part {part.name!r}")
            expected_first += part.num_records
        if expected_first != self.num_records:
            raise CorruptCacheError(
                f"manifest {where} counts {self.num_records} records but its parts hold {expected_first}"
            )

    @classmethod
    def load(cls, directory: Path) -> Manifest:
        path = directory / MANIFEST_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError as error:
            raise CacheNotFoundError(f"no cache at {directory} (no {MANIFEST_NAME})") from error
        return cls.from_bytes(data, str(path))
