"""Publishing builds to an object store and cleaning up after publishes, under the build lease.

- Publish: upload the parts, then write the manifest conditionally: created only where none
  exists (``If-None-Match: *``, ``ifGenerationMatch=0``: exactly one builder wins), or replacing
  exactly the version a builder saw. A one-process build (``store.remote``), a copy
  (``store.copy``) and a Ray build (``parallel.ray``) all commit through ``commit_manifest``.
- Clean up: the parts of a build that lost or was replaced, the parts no published manifest
  names (killed builders, interrupted publishes), a cache's objects when it has no manifest.
  Every writer of a cache's objects holds its build lease (``store.lease``), so that none of
  them deletes what another is writing.
- A local build says it was never published (``origin.json``) until its publish finished:
  ``publish_new_build`` marks it, and removes it on Ctrl-C (nothing was cached).
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Callable, ContextManager, Optional

from yogacache import redaction
from yogacache.backends.base import ObjectSizeError, ObjectStore, read_capped
from yogacache.errors import (
    CacheNotFoundError,
    CorruptCacheError,
    IncompatibleCacheError,
    InvalidNameError,
    YogaCacheError,
)
from yogacache.format.durability import TRASH_MARK
from yogacache.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest
from yogacache.progress import TransferProgress
from yogacache.store import keys
from yogacache.store.lease import Lease, LeaseTimes, holding
from yogacache.store.local import CacheStore
from yogacache.store.localroot import is_unpublished, read_origin, write_origin
from yogacache.store.transfers import upload_files

log = redaction.get_logger(__name__)


# What reading a listed cache's manifest raises when it cannot be read: which parts it needs is
# unknown, so nothing of it is deleted, and a listing shows the error instead of failing.
UNREADABLE = (CorruptCacheError, IncompatibleCacheError, InvalidNameError)


class ConcurrentPublishError(YogaCacheError):
    """Another process published the same cache while this one built it; this build lost."""


def where(objects: ObjectStore, dataset_id: str, dataset_version: str) -> str:
    """The URL of a cache in ``objects`` (its prefix)."""
    return objects.url(keys.cache_key(dataset_id, dataset_version))


# -- reading the published manifest ---------------------------------------------------------
def read_published(objects: ObjectStore, dataset_id: str, dataset_version: str) -> Optional[tuple[Manifest, str]]:
    """The published manifest and its version token (one GET), or None when the cache is not
    published; CorruptCacheError when it is larger than any real manifest (``read_capped``: it
    never sits whole in memory) or describes another cache."""
    key = keys.manifest_key(dataset_id, dataset_version)
    try:
        found = read_capped(objects, key, MAX_MANIFEST_BYTES)
    except ObjectSizeError:
        raise CorruptCacheError(
            f"manifest {objects.url(key)} is larger than {MAX_MANIFEST_BYTES} bytes, more than any manifest; "
            f"refused unread. Publish {dataset_id}:{dataset_version} again (it replaces the object)"
        ) from None
    if found is None:
        return None
    manifest = Manifest.from_bytes(found[0], objects.url(key))
    if (manifest.dataset_id, manifest.dataset_version) != (dataset_id, dataset_version):
        raise CorruptCacheError(
            f"{objects.url(key)} describes {manifest.dataset_id}:{manifest.dataset_version}, "
            f"not {dataset_id}:{dataset_version} (swapped or copied); refused"
        )
    return manifest, found[1]


def remote_manifest(objects: ObjectStore, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
    """The published manifest (``read_published``), or None when the cache is not published."""
    found = read_published(objects, dataset_id, dataset_version)
    return None if found is None else found[0]


def published(objects: ObjectStore, dataset_id: str, dataset_version: str) -> tuple[Optional[str], Optional[Manifest]]:
    """(version token, manifest) of the published manifest; (None, None) when there is none;
    (token, None) when one is there but cannot be read (oversized, corrupt, of a newer format,
    or describing another cache): it can still be replaced."""
    key = keys.manifest_key(dataset_id, dataset_version)
    try:
        found = read_capped(objects, key, MAX_MANIFEST_BYTES)
    except ObjectSizeError as oversized:
        return oversized.token, None
    if found is None:
        return None, None
    data, token = found
    try:
        manifest = Manifest.from_bytes(data, objects.url(key))
    except YogaCacheError:
        return token, None
    if (manifest.dataset_id, manifest.dataset_version) != (dataset_id, dataset_version):
        return token, None
    return token, manifest


# -- publishing -------------------------------------------------------------------------------
def commit_manifest(objects: ObjectStore, manifest: Manifest, *, replacing: Optional[str]) -> bool:
    """Writes ``manifest`` conditionally: created only if none exists (``replacing`` None), else
    replacing only the published version ``replacing``. False when that precondition failed."""
    key = keys.manifest_key(manifest.dataset_id, manifest.dataset_version)
    if replacing is None:
        token = objects.write(key, manifest.to_bytes(), if_absent=True)
    else:
        token = objects.write(key, manifest.to_bytes(), if_token=replacing)
    return token is not None


def upload_and_commit(
    objects: ObjectStore,
    local: CacheStore,
    manifest: Manifest,
    *,
    replacing: Optional[str],
    threads: int,
    show_progress: bool,
) -> bool:
    """Uploads the parts of the local copy of ``manifest``, then ``commit_manifest``; once
    published, the local copy says where it was published (``origin.json``)."""
    dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
    directory = local.cache_dir(dataset_id, dataset_version)
    progress = TransferProgress(
        f"uploading {dataset_id}:{dataset_version}", manifest.total_size_bytes, enabled=show_progress
    )
    files = [(directory / part.name, keys.part_key(manifest, part)) for part in manifest.parts]
    upload_files(objects, files, threads=threads, add_bytes=progress.add)
    progress.finish()
    if not commit_manifest(objects, manifest, replacing=replacing):
        return False
    remote_url = objects.url()
    if remote_url is not None and (directory / MANIFEST_NAME).is_file():
        write_origin(directory, remote_url)
    return True


def publish_manifest(objects: ObjectStore, manifest: Manifest) -> bool:
    """Creates the manifest of a build whose parts are uploaded (a Ray build), then deletes the
    part objects it does not name (killed attempts); False, deleting nothing, when the cache is
    published already."""
    if not commit_manifest(objects, manifest, replacing=None):
        return False
    delete_unreferenced(objects, manifest.dataset_id, manifest.dataset_version)
    return True


def publish_replacing(
    objects: ObjectStore,
    local: CacheStore,
    manifest: Manifest,
    seen_token: Optional[str],
    seen: Optional[Manifest],
    *,
    threads: int,
    show_progress: bool,
) -> None:
    """Publishes the local build ``manifest`` if the published manifest is still the version
    ``seen_token``; then deletes the replaced build's parts. Raises ConcurrentPublishError when
    another process published first (this build's uploaded parts are deleted again)."""
    dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
    if not upload_and_commit(
        objects, local, manifest, replacing=seen_token, threads=threads, show_progress=show_progress
    ):
        delete_build_parts(objects, dataset_id, dataset_version, manifest.build_id)
        raise ConcurrentPublishError(
            f"another process published {where(objects, dataset_id, dataset_version)} while "
            f"this build of {dataset_id}:{dataset_version} ran; the other build stays published "
            "and this one was not published"
        )
    if seen is not None and seen.build_id != manifest.build_id:
        delete_build_parts(objects, dataset_id, dataset_version, seen.build_id)


def holding_lease(
    objects: ObjectStore,
    dataset_id: str,
    dataset_version: str,
    times: LeaseTimes,
    *,
    build_id: Optional[str] = None,
    doing: str = "publishing",
    remove_on_failure: bool = False,
) -> ContextManager[Lease]:
    """The cache's build lease, held while this process writes the cache's objects
    (``remove_on_failure``: see ``lease.holding``)."""
    return holding(
        objects,
        keys.lease_key(dataset_id, dataset_version),
        times.seconds,
        what=f"{dataset_id}:{dataset_version}",
        build_id=build_id,
        poll_seconds=times.poll_seconds,
        timeout=times.wait_timeout,
        doing=doing,
        remove_on_failure=remove_on_failure,
    )


def new_lease(objects: ObjectStore, dataset_id: str, dataset_version: str, seconds: float) -> Lease:
    """A lease object on the cache's build lease, to try or to watch."""
    return Lease(objects, keys.lease_key(dataset_id, dataset_version), uuid.uuid4().hex, seconds)


# -- the local build until it is published ----------------------------------------------------
def publish_new_build(
    local: CacheStore, manifest: Manifest, remote_url: Optional[str], publish: Callable[[Manifest], bool]
) -> bool:
    """Runs ``publish(manifest)`` for the local build ``manifest`` (the caller holds the local lock).

    Until it is published, the local copy says so (``is_unpublished``): it is not the remote's
    cache, and a later build or ``push`` publishes. Interrupted (Ctrl-C), the local copy goes
    too: nothing was cached. The parts uploaded so far are removed by the next publish of the
    cache, or by ``rm --remote``.
    """
    directory = local.cache_dir(manifest.dataset_id, manifest.dataset_version)
    if remote_url is not None:
        write_origin(directory, remote_url, published=False)
    try:
        return publish(manifest)
    except KeyboardInterrupt:
        trash = directory.parent / f".{directory.name}{TRASH_MARK}interrupted-{os.getpid()}"
        try:
            os.rename(directory, trash)
        except OSError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
        raise


def unpublished_build(
    local: CacheStore, dataset_id: str, dataset_version: str, remote_url: Optional[str]
) -> Optional[Manifest]:
    """The local copy built for ``remote_url`` whose publish failed or was cut short (it says
    so: ``is_unpublished``), once it verifies; None when there is none. ``get_or_build``
    publishes it rather than building the same id and version again."""
    directory = local.cache_dir(dataset_id, dataset_version)
    if not is_unpublished(directory) or read_origin(directory) != remote_url:
        return None
    try:
        manifest = local.verify(dataset_id, dataset_version)
    except (CacheNotFoundError, CorruptCacheError, IncompatibleCacheError) as error:
        log.warning("the unpublished local build %s cannot be published (%s); building again", directory, error)
        return None
    log.info("publishing the local build %s, whose publish did not finish", directory)
    return manifest


# -- cleaning up -------------------------------------------------------------------------------
def delete_build_parts(objects: ObjectStore, dataset_id: str, dataset_version: str, build_id: str) -> None:
    """Deletes the part objects of one build (a replaced one, one that lost, a failed Ray job)."""
    for info in objects.list(keys.build_prefix(dataset_id, dataset_version, build_id)):
        objects.delete(info.key)


def delete_unreferenced(objects: ObjectStore, dataset_id: str, dataset_version: str) -> None:
    """Deletes part objects the published manifest does not name (losers, killed builders); the
    caller holds the build lease, or has just created the manifest."""
    try:
        remote = remote_manifest(objects, dataset_id, dataset_version)
    except (CorruptCacheError, IncompatibleCacheError):
        return  # unreadable: which parts it needs is unknown, so nothing is deleted
    if remote is None:
        return
    keep = {keys.part_key(remote, part) for part in remote.parts} | keys.kept_keys(dataset_id, dataset_version)
    for info in objects.list(keys.cache_key(dataset_id, dataset_version)):
        if info.key not in keep:
            objects.delete(info.key)


def remove_published(objects: ObjectStore, dataset_id: str, dataset_version: str, times: LeaseTimes) -> bool:
    """Removes the cache's objects: the manifest first (unpublished), then the rest; a cache
    without a manifest (stranded parts) under its build lease. False when there is nothing."""
    prefix = keys.cache_key(dataset_id, dataset_version)
    manifest_key = keys.manifest_key(dataset_id, dataset_version)
    if objects.read(manifest_key, max_bytes=0) is not None:  # whether it exists, not its bytes
        objects.delete(manifest_key)  # unpublish first
        for info in objects.list(prefix):
            objects.delete(info.key)
        return True
    return _remove_stranded_cache(objects, dataset_id, dataset_version, times)


def _remove_stranded_cache(objects: ObjectStore, dataset_id: str, dataset_version: str, times: LeaseTimes) -> bool:
    """Deletes the objects of a cache that has no manifest (the parts of an interrupted or
    failed publish), holding its build lease so that no publish under way loses its parts;
    False when there is nothing to delete."""
    lease_key = keys.lease_key(dataset_id, dataset_version)
    prefix = keys.cache_key(dataset_id, dataset_version)
    if not [info for info in objects.list(prefix) if info.key != lease_key]:
        return False
    with holding_lease(objects, dataset_id, dataset_version, times):
        if remote_manifest(objects, dataset_id, dataset_version) is not None:
            raise YogaCacheError(
                f"{objects.url(prefix)} was published meanwhile; run rm again to remove it"
            )
        for info in objects.list(prefix):
            if info.key != lease_key:
                objects.delete(info.key)
    objects.delete(lease_key)  # released above: free, and no cache is left to build
    return True


def remove_stranded(objects: ObjectStore, lease_seconds: float, *, dry_run: bool = False) -> list[str]:
    """Deletes the part objects no published manifest names (what interrupted or failed
    publishes and copies left), cache by cache under its build lease; a cache whose lease
    another process holds is being written and is left alone. Returns the objects' URLs."""
    found: dict[tuple[str, str], list[str]] = {}
    for info in objects.list(""):
        cache = keys.part_cache(info.key)
        if cache is not None:
            found.setdefault(cache, []).append(info.key)
    removed: list[str] = []
    for (dataset_id, dataset_version), part_keys in sorted(found.items()):
        try:
            stranded = _stranded(objects, dataset_id, dataset_version, part_keys)
        except UNREADABLE:
            continue  # which parts an unreadable manifest needs is unknown: nothing goes
        if not stranded or dry_run:
            removed.extend(objects.url(key) for key in stranded)
            continue
        lease = new_lease(objects, dataset_id, dataset_version, lease_seconds)
        if not lease.try_acquire()[0]:
            busy = where(objects, dataset_id, dataset_version)
            log.info("%s is being written (its build lease is held); left alone", busy)
            continue
        try:
            for key in _stranded(objects, dataset_id, dataset_version, stranded):  # published meanwhile?
                if objects.delete(key):
                    removed.append(objects.url(key))
        finally:
            lease.release()
    return removed


def _stranded(objects: ObjectStore, dataset_id: str, dataset_version: str, part_keys: list[str]) -> list[str]:
    """Those of the part objects ``part_keys`` of one cache that its published manifest does not name."""
    current = remote_manifest(objects, dataset_id, dataset_version)
    named = {keys.part_key(current, part) for part in current.parts} if current is not None else set()
    return [key for key in part_keys if key not in named]
