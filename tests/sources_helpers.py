"""Builders of archives and shards for the yogacache.sources tests (real tarfile, zipfile, zstandard)."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import zstandard

import yogacache

TAR_MODES = {
    ".tar": "w",
    ".tar.gz": "w:gz",
    ".tgz": "w:gz",
    ".tar.gz2": "w:gz",
    ".tar.bz2": "w:bz2",
    ".tbz": "w:bz2",
    ".tbz2": "w:bz2",
    ".tar.xz": "w:xz",
    ".txz": "w:xz",
}
ARCHIVE_EXTENSIONS = [*TAR_MODES, ".tar.zst", ".zip"]


def tar_bytes(members: dict[str, bytes], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:  # type: ignore[call-overload]
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def archive_bytes(members: dict[str, bytes], extension: str) -> bytes:
    """``members`` as an archive of the kind ``extension`` names."""
    if extension == ".zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in members.items():
                archive.writestr(name, data)
        return buffer.getvalue()
    if extension == ".tar.zst":
        return zstandard.ZstdCompressor().compress(tar_bytes(members))
    return tar_bytes(members, TAR_MODES[extension])


def read_back(ref: Any) -> list[dict[str, Any]]:
    """Every record of a cache, in order, with string leaves as bytes."""
    return [dict(record) for record in ref.stream()]


def cache_from(storage: Path, source: Any, dataset_id: str = "src", version: str = "v1", **layer: Any) -> Any:
    """The CacheDataRef of ``source`` cached under ``storage`` (a shared_fs store)."""
    data_layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(storage)},
                                     show_progress=False, **layer)

    @data_layer.cache_dataset(dataset_id, version)
    def make() -> Any:
        return source

    return make()


def cache_files(storage: Path) -> list[Path]:
    """What a build left under ``storage``: part files, manifests, temporary directories."""
    if not storage.exists():
        return []
    return [p for p in storage.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
