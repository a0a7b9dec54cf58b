"""Integrity of sealed caches: part hashes, and stamps that spare re-hashing unchanged files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Optional

from yogacache.errors import CorruptCacheError
from yogacache.format.manifest import Manifest

VERIFIED_STAMP = ".verified.json"
Verify = Literal["auto", "full", "size"]


def _file_identity(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def verify_parts(
    directory: Path,
    manifest: Manifest,
    mode: Verify = "full",
    opened: Optional[dict[str, Path]] = None,
) -> None:
    """Raises CorruptCacheError unless every part has its manifest size (and hash).

    ``size`` checks sizes only; ``full`` re-hashes every part; ``auto`` re-hashes the parts
    whose size, times or inode changed since the stamp written when they were last hashed.
    """
    stamp_path = directory / VERIFIED_STAMP
    stamp: dict[str, Any] = {}
    if mode == "auto":
        try:
            stamp = json.loads(stamp_path.read_text())
        except (OSError, ValueError):
            stamp = {}
    new_stamp: dict[str, Any] = {}
    for part in manifest.parts:
        shown = directory / part.name  # what messages name
        path = (opened or {}).get(part.name, shown)
        try:
            identity = _file_identity(path)
        except FileNotFoundError as error:
            raise CorruptCacheError(f"cache part {shown} is missing") from error
        if identity[0] != part.size_bytes:
            raise CorruptCacheError(
                f"cache part {shown} is {identity[0]} bytes, the manifest says {part.size_bytes} "
                "(truncated or replaced); remove the cache and rebuild it"
            )
        if mode == "size":
            continue
        if mode == "auto" and stamp.get(part.name) == [part.sha256, *identity]:
            new_stamp[part.name] = stamp[part.name]
            continue
        digest = sha256_file(path)
        if digest != part.sha256:
            raise CorruptCacheError(
                f"cache part {shown} does not match its manifest hash (altered or damaged); "
                "remove the cache and rebuild it"
            )
        new_stamp[part.name] = [part.sha256, *identity]
    if mode != "size" and new_stamp != stamp:
        write_stamp(directory, new_stamp)


def write_stamp(directory: Path, stamp: dict[str, Any]) -> None:
    """Records which part files were verified, best effort (a read-only cache just re-hashes)."""
    tmp = directory / f"{VERIFIED_STAMP}.{os.getpid()}"
    try:
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, directory / VERIFIED_STAMP)
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass


def stamp_verified(directory: Path, manifest: Manifest) -> None:
    """Writes the stamp for parts the writer just hashed."""
    write_stamp(
        directory,
        {part.name: [part.sha256, *_file_identity(directory / part.name)] for part in manifest.parts},
    )


def sha256_file(path: Path, chunk_size: int = 8 << 20) -> str:
    """The hex SHA-256 of a file's bytes."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as handle:
        buffer = bytearray(chunk_size)
        view = memoryview(buffer)
        while True:
            read = handle.readinto(buffer)
            if not read:
                break
            digest.update(view[:read])
    return digest.hexdigest()
