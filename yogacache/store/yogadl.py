"""YogaDL 0.1.4 caches where a yogacache cache would be: found, converted, kept, and followed.

YogaDL kept a cache as one file, ``<id>/<version>/cache.mdb`` (under an LFS directory, or under
``bucket_directory_path`` in S3/GCS). yogacache never builds over one: a call that finds only
a cache.mdb converts it into format v1 (``yogacache.format.yogadl_legacy``: its pickles are
decoded by a restricted unpickler, never executed) and serves that; the cache.mdb itself stays
where it was, byte for byte. The converted cache records which version of the cache.mdb it
came from (manifest ``extra["yogadl_source"]``), so it follows YogaDL's rules: deleting the
cache.mdb (how YogaDL invalidates a cache) makes the next ``cacheable`` call build afresh, and
a cache.mdb rewritten by YogaDL is converted again.

``fetch`` and ``get_or_build`` here are what the YogaDL facade, the DataLayer decorators and
``yogacache migrate`` call instead of the store's own.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from yogacache import redaction
from yogacache.backends.base import ObjectSizeError
from yogacache.errors import CacheNotFoundError, CorruptCacheError, YogaCacheError
from yogacache.format.durability import fsync_path
from yogacache.format.manifest import Manifest
from yogacache.format.sources import AnnotatedSource
from yogacache.format.writer import CacheWriter
from yogacache.format.yogadl_legacy import (
    LEGACY_CACHE_NAME,
    LEGACY_EXTRA_KEY,
    LegacyFileState,
    YogaDLSource,
    carry_over,
    legacy_state_of,
)
from yogacache.locks import FileLock, busy_note
from yogacache.progress import Progress
from yogacache.read.reader import CacheReader
from yogacache.store.base import RemoteStore, Store
from yogacache.store.local import CacheStore

log = redaction.get_logger(__name__)

__all__ = ["fetch", "get_or_build", "legacy_location", "legacy_state", "migrate"]


def legacy_location(store: Store, dataset_id: str, dataset_version: str) -> str:
    """Where a YogaDL cache of (dataset_id, dataset_version) would be: a path or a URL."""
    remote = store.remote
    if remote is not None:
        return remote.objects.url(remote.key(dataset_id, dataset_version, LEGACY_CACHE_NAME))
    return str(store.local.cache_dir(dataset_id, dataset_version) / LEGACY_CACHE_NAME)


def legacy_state(store: Store, dataset_id: str, dataset_version: str) -> Optional[LegacyFileState]:
    """The version of the YogaDL cache.mdb of (dataset_id, dataset_version), None when there is none.

    A local file is identified by size and modification time; an object by its size (what
    listing tells without downloading it).
    """
    remote = store.remote
    if remote is None:
        return LegacyFileState.of_file(store.local.cache_dir(dataset_id, dataset_version) / LEGACY_CACHE_NAME)
    key = remote.key(dataset_id, dataset_version, LEGACY_CACHE_NAME)
    for info in remote.objects.list(key):
        if info.key == key:
            return LegacyFileState(size=info.size, version="object")
    return None


def _manifest(store: Store, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
    try:
        return store.manifest(dataset_id, dataset_version)
    except CacheNotFoundError:
        return None


def _converted_state(manifest: Optional[Manifest]) -> Optional[LegacyFileState]:
    return None if manifest is None else legacy_state_of(manifest.extra)


def migrate(store: Store, dataset_id: str, dataset_version: str, *, force: bool = False) -> Manifest:
    """Converts the YogaDL cache of (dataset_id, dataset_version) into a yogacache cache (and,
    for a remote store, publishes it); the cache.mdb is left as it was.

    Returns the manifest of the cache now in place: that of an earlier conversion of the same
    cache.mdb, unless ``force``. CacheNotFoundError when there is no YogaDL cache;
    ``RefusedPickleError`` when the cache.mdb holds a pickle YogaDL never wrote.
    """
    if store.remote is not None:
        return _migrate_remote(store.remote, dataset_id, dataset_version, force)
    local = store.local
    with FileLock(local.lock_path(dataset_id, dataset_version)):
        state, current = _check_migration(store, dataset_id, dataset_version, force)
        if current is not None and not force and _converted_state(current) == state:
            return current
        path = local.cache_dir(dataset_id, dataset_version) / LEGACY_CACHE_NAME
        return _convert(local, dataset_id, dataset_version, path, state)


def _check_migration(
    store: Store, dataset_id: str, dataset_version: str, force: bool
) -> tuple[LegacyFileState, Optional[Manifest]]:
    """The YogaDL cache's version and the cache in place (if any); raises when there is nothing
    to convert or a yogacache build would be replaced without ``force``."""
    state = legacy_state(store, dataset_id, dataset_version)
    if state is None:
        raise CacheNotFoundError(
            f"no YogaDL cache of {dataset_id}:{dataset_version} at "
            f"{legacy_location(store, dataset_id, dataset_version)}"
        )
    current = _manifest(store, dataset_id, dataset_version)
    if current is not None and not force and _converted_state(current) is None:
        raise YogaCacheError(
            f"a yogacache cache of {dataset_id}:{dataset_version} is already in place at "
            f"{store.location(dataset_id, dataset_version)} (it is what is served); "
            "convert with force (yogacache migrate --force) to replace it with the YogaDL cache"
        )
    return state, current


def _migrate_remote(store: RemoteStore, dataset_id: str, dataset_version: str, force: bool) -> Manifest:
    """Builds the published cache from the cache.mdb object through the store (its lease lets
    one node convert while the others wait; its build replaces a published cache); the object
    stays."""
    state, current = _check_migration(store, dataset_id, dataset_version, force)
    if current is not None and not force and _converted_state(current) == state:
        return current
    if current is None:
        reader = store.get_or_build(
            dataset_id, dataset_version, lambda: _legacy_source(store, dataset_id, dataset_version, state)
        )
        return reader.manifest
    # Converted from an older cache.mdb, or replaced on request.
    return store.build(
        dataset_id, dataset_version, _legacy_source(store, dataset_id, dataset_version, state)
    )


class _DownloadedYogaDLSource:
    """A remote store's cache.mdb object, downloaded to a scratch file beside the local copies,
    as a record source; the file is deleted once it has been read."""

    kind = YogaDLSource.kind

    def __init__(self, store: RemoteStore, dataset_id: str, dataset_version: str, state: LegacyFileState) -> None:
        key = store.key(dataset_id, dataset_version, LEGACY_CACHE_NAME)
        self.path = store.local.root / dataset_id / f".{dataset_version}.yogadl-{uuid.uuid4().hex[:8]}.mdb"
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        try:
            try:
                store.objects.download_file(key, self.path, size=state.size)  # never more than listed
            except ObjectSizeError:
                raise CorruptCacheError(
                    f"{store.objects.url(key)} changed while it was downloaded; try again"
                ) from None
            downloaded = LegacyFileState.of_file(self.path)
            if downloaded is None or downloaded.size != state.size:
                raise CorruptCacheError(f"{store.objects.url(key)} changed while it was downloaded; try again")
            self.source = YogaDLSource(self.path)
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise
        self.cardinality = self.source.cardinality

    def spec(self) -> Any:
        return self.source.spec()

    def encoded_batches(self) -> Iterator[list[bytes]]:
        try:
            yield from self.source.encoded_batches()
        finally:
            self.path.unlink(missing_ok=True)


def _legacy_source(
    store: RemoteStore, dataset_id: str, dataset_version: str, state: LegacyFileState
) -> AnnotatedSource:
    """What a remote store builds a converted cache from (the conversion recorded in its manifest)."""
    return AnnotatedSource(
        _DownloadedYogaDLSource(store, dataset_id, dataset_version, state), {LEGACY_EXTRA_KEY: state.to_json()}
    )


def _convert(local: CacheStore, dataset_id: str, dataset_version: str, path: Path, state: LegacyFileState) -> Manifest:
    """Writes the yogacache cache of the cache.mdb at ``path`` into the directory that holds
    it, which keeps the cache.mdb (the caller holds the cache's lock)."""
    source = YogaDLSource(path)
    target = local.cache_dir(dataset_id, dataset_version)
    local.clean_leftovers(dataset_id, dataset_version)
    progress = Progress(f"converting YogaDL cache {dataset_id}:{dataset_version}", enabled=local.show_progress)
    with CacheWriter(
        target, dataset_id, dataset_version, limits=local.limits, part_size_bytes=local.part_size_bytes,
        progress=progress,
    ) as writer:
        writer.add_batches(source.encoded_batches())
        if not source.unchanged():
            raise CorruptCacheError(f"{path} changed while it was converted; nothing was cached, try again")
        # The new cache replaces the directory that holds the cache.mdb: it goes along.
        carry_over(path, writer.directory)
        fsync_path(writer.directory / LEGACY_CACHE_NAME)
        manifest = writer.seal(source.spec(), source=source.kind, extra={LEGACY_EXTRA_KEY: state.to_json()})
    log.info(
        "converted the YogaDL cache %s into a yogacache cache of %d records at %s (the cache.mdb is kept)",
        path, manifest.num_records, target,
    )
    return manifest


def _drop_stale(store: Store, dataset_id: str, dataset_version: str, manifest: Manifest) -> None:
    """Removes a cache converted from a cache.mdb that no longer exists (YogaDL's way of
    invalidating a cache), so that it is built afresh."""
    log.info(
        "the YogaDL cache %s this cache of %s:%s was converted from is gone: building it afresh",
        legacy_location(store, dataset_id, dataset_version), dataset_id, dataset_version,
    )
    current = _manifest(store, dataset_id, dataset_version)
    if current is None or current.build_id != manifest.build_id:
        return  # another process removed (and perhaps rebuilt) it meanwhile
    try:
        store.remove(dataset_id, dataset_version, remote=store.remote is not None, local=True)
    except CacheNotFoundError:
        pass  # another process removed it first


def _resolve(store: Store, dataset_id: str, dataset_version: str) -> Optional[bool]:
    """Brings a YogaDL cache into line: True when a usable cache is in place (converted now,
    earlier, or a yogacache build), None when there is neither (a stale conversion removed)."""
    manifest = _manifest(store, dataset_id, dataset_version)
    converted = _converted_state(manifest)
    if manifest is not None and converted is None:
        return True  # a yogacache build: the YogaDL cache, if any, is not consulted
    state = legacy_state(store, dataset_id, dataset_version)
    if state is None:
        if manifest is not None:
            _drop_stale(store, dataset_id, dataset_version, manifest)
        return None
    if converted != state:
        migrate(store, dataset_id, dataset_version, force=manifest is not None)
    return True


def fetch(store: Store, dataset_id: str, dataset_version: str) -> CacheReader:
    """``store.open``, where a YogaDL cache counts as a cache (converted on first use)."""
    if store.remote is None:
        if _resolve(store, dataset_id, dataset_version) is None:
            where = store.location(dataset_id, dataset_version)
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} at {where}{busy_note(Path(where))}"
            )
        return store.open(dataset_id, dataset_version)
    # Remote: a cache hit costs what store.open costs; the cache.mdb object is listed only on a
    # miss, or for a cache converted from one.
    try:
        reader = store.open(dataset_id, dataset_version)
    except CacheNotFoundError:
        if legacy_state(store, dataset_id, dataset_version) is None:
            raise
        migrate(store, dataset_id, dataset_version)
        return store.open(dataset_id, dataset_version)
    if _follow_remote(store, dataset_id, dataset_version, reader.manifest):
        return reader
    return fetch(store, dataset_id, dataset_version)


def get_or_build(
    store: Store, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]
) -> CacheReader:
    """``store.get_or_build``, where a YogaDL cache counts as a cache (converted on first use)."""
    remote = store.remote
    if remote is None:
        _resolve(store, dataset_id, dataset_version)
        return store.get_or_build(dataset_id, dataset_version, make_data)

    def build() -> Any:  # on a miss, under the store's build lease
        state = legacy_state(remote, dataset_id, dataset_version)
        return make_data() if state is None else _legacy_source(remote, dataset_id, dataset_version, state)

    reader = store.get_or_build(dataset_id, dataset_version, build)
    if _follow_remote(store, dataset_id, dataset_version, reader.manifest):
        return reader
    return store.get_or_build(dataset_id, dataset_version, build)


def _follow_remote(store: Store, dataset_id: str, dataset_version: str, manifest: Manifest) -> bool:
    """True when ``manifest`` is a yogacache build or the conversion of the cache.mdb object as it
    is now; else brings the published cache into line (removes it when the cache.mdb is gone,
    converts again when it changed) and returns False: the caller opens the cache again."""
    converted = _converted_state(manifest)
    if converted is None:
        return True
    state = legacy_state(store, dataset_id, dataset_version)
    if state == converted:
        return True
    if state is None:
        _drop_stale(store, dataset_id, dataset_version, manifest)
    else:
        migrate(store, dataset_id, dataset_version, force=True)
    return False
