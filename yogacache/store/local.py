"""CacheStore: a directory of caches laid out as ``<root>/<dataset_id>/<version>/``.

It owns the layout, the per-cache build lock, build-once-or-wait, listing and removal. It
does not know the record format beyond the writer and reader it drives.
"""

from __future__ import annotations

import builtins
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from yogacache.errors import CacheNotFoundError, ConfigError, YogaCacheError
from yogacache.format.durability import leftovers_of
from yogacache.format.integrity import Verify, verify_parts
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import RecordSource, manifest_extra, source_for
from yogacache.format.writer import DEFAULT_PART_SIZE, BuildLimits, CacheWriter
from yogacache.locks import FileLock
from yogacache.malloc import keep_freed_memory
from yogacache.names import validate_name, validate_version
from yogacache.progress import Progress
from yogacache.read.reader import CacheReader
from yogacache.store.base import CacheEntry

log = logging.getLogger(__name__)


def default_cache_root() -> Path:
    """The local default: ``$YOGACACHE_HOME``, else ``$XDG_CACHE_HOME/yogacache``, else ``~/.cache/yogacache``."""
    if os.environ.get("YOGACACHE_HOME"):
        return Path(os.environ["YOGACACHE_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "yogacache"


class CacheStore:
    """Caches under one root directory on a local or shared filesystem."""

    remote_url: Optional[str] = None  # nothing is published beyond this directory

    def __init__(
        self,
        root: Path | str,
        *,
        verify: Verify = "auto",
        limits: BuildLimits = BuildLimits(),
        part_size_bytes: int = DEFAULT_PART_SIZE,
        show_progress: bool = True,
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        self.verify_mode = verify
        self.limits = limits
        self.part_size_bytes = part_size_bytes
        self.show_progress = show_progress

    def __repr__(self) -> str:
        return f"CacheStore({str(self.root)!r})"

    # -- layout ---------------------------------------------------------------------------
    def cache_dir(self, dataset_id: str, dataset_version: str) -> Path:
        validate_name(dataset_id, "dataset_id")
        validate_version(dataset_version)
        return self.root / dataset_id / dataset_version

    def location(self, dataset_id: str, dataset_version: str) -> str:
        return str(self.cache_dir(dataset_id, dataset_version))

    def lock_path(self, dataset_id: str, dataset_version: str) -> Path:
        directory = self.cache_dir(dataset_id, dataset_version)
        return directory.parent / f".{directory.name}.lock"

    # -- reading --------------------------------------------------------------------------
    def manifest(self, dataset_id: str, dataset_version: str) -> Manifest:
        return Manifest.load(self.cache_dir(dataset_id, dataset_version))

    def exists(self, dataset_id: str, dataset_version: str) -> bool:
        return (self.cache_dir(dataset_id, dataset_version) / MANIFEST_NAME).is_file()

    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Opens the sealed cache; CacheNotFoundError when there is none."""
        directory = self.cache_dir(dataset_id, dataset_version)
        try:
            manifest = Manifest.load(directory)
        except CacheNotFoundError:
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} under {self.root}"
            ) from None
        return CacheReader(directory, manifest, verify=self.verify_mode)

    # -- building -------------------------------------------------------------------------
    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it, replacing any existing one."""
        with FileLock(self.lock_path(dataset_id, dataset_version)):
            return self.build_locked(dataset_id, dataset_version, source_for(data))

    def get_or_build(
        self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]
    ) -> CacheReader:
        """Opens the cache, building it first if absent. ``make_data`` runs only on a miss.

        Many processes may call this at once: one builds under the cache's lock while the
        others wait on it and then read. If the builder dies, the lock is released by the
        kernel, and the next waiter cleans up and builds.
        """
        try:
            return self.open(dataset_id, dataset_version)
        except CacheNotFoundError:
            pass
        with FileLock(self.lock_path(dataset_id, dataset_version)):
            if not self.exists(dataset_id, dataset_version):
                self.build_locked(dataset_id, dataset_version, source_for(make_data()))
        return self.open(dataset_id, dataset_version)

    def build_locked(self, dataset_id: str, dataset_version: str, source: RecordSource) -> Manifest:
        """Builds and publishes a cache; the caller holds the cache's lock."""
        target = self.cache_dir(dataset_id, dataset_version)
        self.clean_leftovers(dataset_id, dataset_version)
        progress = Progress(
            f"caching {dataset_id}:{dataset_version}",
            enabled=self.show_progress,
        )
        # A dataset of unknown length (one that may never end) is bounded by default.
        limits = self.limits if source.cardinality is not None else self.limits.for_unknown_length(self.root)
        with CacheWriter(
            target,
            dataset_id,
            dataset_version,
            limits=limits,
            part_size_bytes=self.part_size_bytes,
            progress=progress,
        ) as writer:
            keep_freed_memory()  # batch buffers are reused instead of page-faulted in each time
            for batch in source.encoded_batches():
                writer.add_encoded(batch)
            manifest = writer.seal(source.spec(), source=source.kind, extra=manifest_extra(source))
        log.info(
            "cached %s:%s: %d records, %d bytes in %s",
            dataset_id,
            dataset_version,
            manifest.num_records,
            manifest.total_size_bytes,
            target,
        )
        return manifest

    def clean_leftovers(self, dataset_id: str, dataset_version: str) -> list[Path]:
        """Removes what crashed builds of this cache left (call with the build lock held)."""
        removed = leftovers_of(self.cache_dir(dataset_id, dataset_version))
        for path in removed:
            log.info("removing leftover of an interrupted build: %s", path)
            shutil.rmtree(path, ignore_errors=True)
        return removed

    # -- management -----------------------------------------------------------------------
    def list(self) -> list[CacheEntry]:
        """Every cache under the root, sorted by id and version."""
        return sorted(self._scan(), key=lambda e: (e.dataset_id, e.dataset_version))

    def _scan(self) -> Iterator[CacheEntry]:
        if not self.root.is_dir():
            return
        for id_dir in self.root.iterdir():
            if id_dir.name.startswith(".") or id_dir.is_symlink() or not id_dir.is_dir():
                continue
            for version_dir in id_dir.iterdir():
                if version_dir.name.startswith(".") or version_dir.is_symlink():
                    continue
                if not (version_dir / MANIFEST_NAME).is_file():
                    continue
                try:
                    manifest: Optional[Manifest] = Manifest.load(version_dir)
                    error = None
                except YogaCacheError as exc:
                    manifest, error = None, str(exc)
                yield CacheEntry(id_dir.name, version_dir.name, version_dir, manifest, error=error)


    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        raise ConfigError("pull needs a remote storage (s3://, gs:// or an s3/gcs config file)")

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        raise ConfigError("push needs a remote storage (s3://, gs:// or an s3/gcs config file)")

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes every part of the cache; raises CorruptCacheError on any mismatch."""
        directory = self.cache_dir(dataset_id, dataset_version)
        manifest = Manifest.load(directory)
        verify_parts(directory, manifest, "full")
        CacheReader(directory, manifest, verify="size")._environments()
        return manifest

    verify_cache = verify  # the name before the Store protocol

    def remove(
        self, dataset_id: str, dataset_version: str, *, remote: bool = False, local: bool = True
    ) -> builtins.list[str]:
        """Deletes exactly one cache; refuses symlinks and anything outside the root."""
        if remote:
            raise ConfigError("--remote needs a remote storage (s3://, gs:// or an s3/gcs config)")
        return [str(self.remove_directory(dataset_id, dataset_version))] if local else []

    def remove_directory(self, dataset_id: str, dataset_version: str) -> Path:
        """Deletes exactly one cache directory; refuses symlinks and anything outside the root."""
        directory = self.cache_dir(dataset_id, dataset_version)
        for path in (directory.parent, directory):
            if path.is_symlink():
                raise YogaCacheError(f"refusing to remove {path}: it is a symbolic link")
        if not directory.is_dir() or not (directory / MANIFEST_NAME).is_file():
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} under {self.root}"
            )
        real_root = self.root.resolve()
        real = directory.resolve()
        if real.parent.parent != real_root:
            raise YogaCacheError(f"refusing to remove {directory}: it is outside {self.root}")
        with FileLock(self.lock_path(dataset_id, dataset_version)):
            # Unpublish first (the manifest makes a cache exist), then delete the rest.
            trash = directory.parent / f".{directory.name}.trash-rm-{os.getpid()}"
            os.rename(directory, trash)
            shutil.rmtree(trash)
        try:
            directory.parent.rmdir()  # only succeeds when no other version is left
        except OSError:
            pass
        return directory


