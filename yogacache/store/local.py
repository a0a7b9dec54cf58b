"""CacheStore: a directory of caches laid out as ``<root>/<dataset_id>/<version>/``.

It owns the layout, the per-cache build lock, build-once-or-wait, listing and removal. It
does not know the record format beyond the writer and reader it drives.
"""

from __future__ import annotations

import builtins
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from yogacache import redaction
from yogacache.errors import CacheNotFoundError, ConfigError, CorruptCacheError, YogaCacheError
from yogacache.format.durability import TRASH_MARK, leftovers_of
from yogacache.format.integrity import Verify
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import RecordSource, manifest_extra, sharded_build_of, source_for
from yogacache.format.writer import DEFAULT_PART_SIZE, BuildLimits, CacheWriter
from yogacache.locks import FileLock, busy_note, cache_lock_path
from yogacache.malloc import keep_freed_memory
from yogacache.names import validate_name, validate_version
from yogacache.progress import Progress, waiter
from yogacache.read.reader import CacheReader
from yogacache.store.entry import CacheEntry
from yogacache.store.localroot import LocalRoot, check_root

log = redaction.get_logger(__name__)

# How many times ``open`` starts again when a rebuild replaced the cache while it was opening it.
OPEN_ATTEMPTS = 10
# Holding a directory open (O_PATH where there is one: it needs no read permission) keeps its
# inode from being reused while ``open`` compares it with what the cache's path names.
_HOLD_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


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
        private_root: bool = False,
    ) -> None:
        """``private_root``: the root is this user's alone (a node-local root in a directory
        every user may write to, see ``store.localroot``): it is used only while it is a
        directory this user owns, and created 0700."""
        self.root = Path(root).expanduser().absolute()
        self.private_root = private_root
        self.verify_mode = verify
        self.limits = limits
        self.part_size_bytes = part_size_bytes
        self.show_progress = show_progress

    def __repr__(self) -> str:
        return f"CacheStore({str(self.root)!r})"

    @property
    def local(self) -> CacheStore:
        """This store: its directory holds this node's caches (the ``Store`` protocol)."""
        return self

    @property
    def remote(self) -> None:
        """None: nothing is published beyond this directory (the ``Store`` protocol)."""
        return None

    # -- layout ---------------------------------------------------------------------------
    def cache_dir(self, dataset_id: str, dataset_version: str) -> Path:
        validate_name(dataset_id, "dataset_id")
        validate_version(dataset_version)
        return self.root / dataset_id / dataset_version

    def location(self, dataset_id: str, dataset_version: str) -> str:
        return str(self.cache_dir(dataset_id, dataset_version))

    def lock_path(self, dataset_id: str, dataset_version: str) -> Path:
        return cache_lock_path(self.cache_dir(dataset_id, dataset_version))

    def lock(
        self, dataset_id: str, dataset_version: str, on_wait: Optional[Callable[[Optional[str]], None]] = None
    ) -> FileLock:
        """The cache's build lock, its root checked and created first. Everything that writes
        under the root holds it; releasing it removes the lock file, and the id's directory
        when no version is left in it. ``on_wait(holder)`` runs once if it has to wait."""
        self.check_root(create=True)
        return FileLock(self.lock_path(dataset_id, dataset_version), on_wait=on_wait, prune_parent=True)

    def check_root(self, *, create: bool = False) -> bool:
        """Whether the root exists, creating it first if ``create``; ConfigError when it is
        unsafe to use (see ``store.localroot.check_root``). A shared root is checked only
        before writing: reading another user's caches is what it is for."""
        if create or self.private_root:
            return check_root(LocalRoot(self.root, self.private_root), create=create)
        return self.root.is_dir()

    # -- reading --------------------------------------------------------------------------
    def manifest(self, dataset_id: str, dataset_version: str) -> Manifest:
        directory = self.cache_dir(dataset_id, dataset_version)
        self.check_root()
        return Manifest.load(directory)

    def exists(self, dataset_id: str, dataset_version: str) -> bool:
        directory = self.cache_dir(dataset_id, dataset_version)
        return self.check_root() and (directory / MANIFEST_NAME).is_file()

    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Opens the sealed cache; CacheNotFoundError when there is none.

        The manifest and the parts are of one build even while rebuilds replace the cache:
        the cache directory is held open from before the manifest is read until every part
        is open, and when the directory at the cache's path is no longer the one held (a
        rebuild swapped it in between), opening starts again.
        """
        return self._open(dataset_id, dataset_version, self.verify_mode)

    def _open(self, dataset_id: str, dataset_version: str, verify: Verify) -> CacheReader:
        directory = self.cache_dir(dataset_id, dataset_version)
        self.check_root()
        for attempt in range(OPEN_ATTEMPTS):
            reader = self._open_one_build(dataset_id, dataset_version, directory, verify, attempt + 1 == OPEN_ATTEMPTS)
            if reader is not None:
                return reader
            time.sleep(0.005 * attempt)  # let a swap in progress finish
        raise YogaCacheError(
            f"the cache at {directory} was replaced {OPEN_ATTEMPTS} times while it was being opened "
            "(it is being rebuilt again and again); try again when its builds are done"
        )

    def _open_one_build(
        self, dataset_id: str, dataset_version: str, directory: Path, verify: Verify, last: bool
    ) -> Optional[CacheReader]:
        """A reader, or None when a rebuild replaced the directory while it was being opened
        (or, on a filesystem without an atomic exchange, is between its two renames)."""
        try:
            held = os.open(directory, _HOLD_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            if not last and _being_replaced(directory):
                return None
            raise self._not_found(dataset_id, dataset_version) from None
        try:
            try:
                manifest = Manifest.load(directory)
                reader = CacheReader(directory, manifest, verify=verify)
            except (CacheNotFoundError, CorruptCacheError):
                if _same_directory(held, directory):
                    raise  # really absent or damaged, not replaced under us
                return None
            if _same_directory(held, directory):
                return reader
            reader.close()
            return None
        except CacheNotFoundError:
            raise self._not_found(dataset_id, dataset_version) from None
        finally:
            os.close(held)

    def _not_found(self, dataset_id: str, dataset_version: str) -> CacheNotFoundError:
        """"No cache", and who is building it when a process holds its lock (``busy_note``)."""
        note = busy_note(self.cache_dir(dataset_id, dataset_version))
        return CacheNotFoundError(
            f"no cache for dataset {dataset_id!r} version {dataset_version!r} under {self.root}{note}"
        )

    # -- building -------------------------------------------------------------------------
    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it, replacing any existing one (after
        another process's build of it, which it waits for, saying whose)."""
        with self.lock(dataset_id, dataset_version, on_wait=waiter(dataset_id, dataset_version)):
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
        with self.lock(dataset_id, dataset_version, on_wait=waiter(dataset_id, dataset_version)):
            if not self.exists(dataset_id, dataset_version):
                self.build_locked(dataset_id, dataset_version, source_for(make_data()))
        return self.open(dataset_id, dataset_version)

    def build_locked(self, dataset_id: str, dataset_version: str, source: RecordSource) -> Manifest:
        """Builds and publishes a cache; the caller holds the cache's lock."""
        target = self.cache_dir(dataset_id, dataset_version)
        self.clean_leftovers(dataset_id, dataset_version)
        progress = Progress(
            f"{dataset_id}:{dataset_version}",
            enabled=self.show_progress,
            total=source.cardinality,
        )
        try:
            return self._write(target, dataset_id, dataset_version, source, progress)
        finally:
            progress.close()  # also when the build failed: nothing repeats its line

    def _write(
        self, target: Path, dataset_id: str, dataset_version: str, source: RecordSource, progress: Progress
    ) -> Manifest:
        # A dataset of unknown length (one that may never end) is bounded by default.
        limits = self.limits if source.cardinality is not None else self.limits.for_unknown_length(self.root)
        sharded = sharded_build_of(source)
        if sharded is not None:  # build shards written by worker processes (yogacache.parallel)
            return sharded.write_cache(  # type: ignore[no-any-return]
                target,
                dataset_id,
                dataset_version,
                limits=limits,
                part_size_bytes=self.part_size_bytes,
                progress=progress,
                extra=manifest_extra(source),
            )
        with CacheWriter(
            target,
            dataset_id,
            dataset_version,
            limits=limits,
            part_size_bytes=self.part_size_bytes,
            progress=progress,
        ) as writer:
            keep_freed_memory()  # batch buffers are reused instead of page-faulted in each time
            writer.add_batches(source.encoded_batches())
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
        """Every ``<id>/<version>/`` holding a manifest; one that cannot be read is an entry
        with its ``error`` set, never the end of the listing."""
        if not self.check_root():
            return
        for id_dir in _subdirectories(self.root):
            for version_dir in _subdirectories(id_dir):
                if not os.path.lexists(version_dir / MANIFEST_NAME):
                    continue
                try:
                    manifest: Optional[Manifest] = Manifest.load(version_dir)
                    error = None
                except (YogaCacheError, OSError) as exc:
                    manifest, error = None, str(exc)
                yield CacheEntry(id_dir.name, version_dir.name, version_dir, manifest, error=error)

    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        raise ConfigError("pull needs a remote storage (s3://, gs:// or an s3/gcs config file)")

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        raise ConfigError("push needs a remote storage (s3://, gs:// or an s3/gcs config file)")

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes every part of the cache and opens it in LMDB; CorruptCacheError on any mismatch."""
        reader = self._open(dataset_id, dataset_version, "full")
        try:
            reader._environments()
            return reader.manifest
        finally:
            reader.close()

    verify_cache = verify  # the name before the Store protocol

    def remove(
        self, dataset_id: str, dataset_version: str, *, remote: bool = False, local: bool = True
    ) -> builtins.list[str]:
        """Deletes exactly one cache; refuses symlinks and anything outside the root."""
        if remote:
            raise ConfigError("--remote needs a remote storage (s3://, gs:// or an s3/gcs config)")
        return [str(self.remove_directory(dataset_id, dataset_version))] if local else []

    def remove_directory(self, dataset_id: str, dataset_version: str) -> Path:
        """Deletes exactly one cache directory; refuses symlinks and anything outside the root.

        A cache whose manifest is empty or corrupt is removed like any other (it is the one a
        user most wants gone). What crashed builds of it left goes too, and so do the lock
        file and the id's directory when no other version is left in it.
        """
        directory = self.cache_dir(dataset_id, dataset_version)
        self.check_root()
        self._check_removable(dataset_id, dataset_version)
        with self.lock(dataset_id, dataset_version):
            self._check_removable(dataset_id, dataset_version)  # another rm may have come first
            # Unpublish first (the manifest makes a cache exist), then delete the rest.
            trash = directory.parent / f".{directory.name}{TRASH_MARK}rm-{os.getpid()}"
            os.rename(directory, trash)
            shutil.rmtree(trash)
            self.clean_leftovers(dataset_id, dataset_version)
        return directory

    def _check_removable(self, dataset_id: str, dataset_version: str) -> None:
        directory = self.cache_dir(dataset_id, dataset_version)
        for path in (directory.parent, directory):
            if path.is_symlink():
                raise YogaCacheError(f"refusing to remove {path}: it is a symbolic link")
        if not directory.is_dir() or not os.path.lexists(directory / MANIFEST_NAME):
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} under {self.root}"
            )
        if directory.resolve().parent.parent != self.root.resolve():
            raise YogaCacheError(f"refusing to remove {directory}: it is outside {self.root}")


def _subdirectories(directory: Path) -> Iterator[Path]:
    """The visible subdirectories of ``directory`` (no hidden names, no links), sorted; nothing
    when it cannot be listed."""
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as error:
        log.warning("cannot list %s: %s", directory, error)
        return
    for entry in entries:
        if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
            yield Path(entry.path)


def _being_replaced(directory: Path) -> bool:
    """Whether the old copy of ``directory`` sits aside as trash: a replacement that could not
    swap atomically (see ``durability.replace_directory``) is between its two renames, or an
    earlier one crashed there."""
    return any(path.name.startswith(f".{directory.name}{TRASH_MARK}") for path in leftovers_of(directory))


def _same_directory(held: int, path: Path) -> bool:
    """Whether ``path`` still names the directory open as ``held``."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    opened = os.fstat(held)
    return (st.st_dev, st.st_ino) == (opened.st_dev, opened.st_ino)
