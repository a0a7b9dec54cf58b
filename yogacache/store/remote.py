"""RemoteCacheStore: caches published to an object store and synced to node-local copies.

Remote layout: ``<prefix>/<id>/<version>/manifest.json`` plus the part objects
``<id>/<version>/<build id>-part-NNNNN.mdb`` (named by build, so a zombie builder can never
overwrite the parts a published manifest points to). Local copies live under
``<local root>/yogadl_local_cache/<id>/<version>/``.

- Publish: upload the parts, then create the manifest conditionally: exactly one builder wins.
- Sync: compare the local manifest's (created_at, build_id) with the remote one's. Equal: use
  the local copy (one small request). Different: download into a temporary sibling, verify
  every part's SHA-256, swap atomically; readers of the old copy keep reading it.
- Coordination: a node-local file lock lets one process per node build or download; a build
  lease in the bucket lets one node build while the others wait for its manifest.
"""

from __future__ import annotations

import builtins
import logging
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from yogacache.backends.base import ObjectStore
from yogacache.errors import CacheNotFoundError, CorruptCacheError, YogaCacheError
from yogacache.format.durability import fsync_path, replace_directory, temp_dir_for, write_file_durably
from yogacache.format.integrity import Verify, sha256_file, stamp_verified
from yogacache.format.manifest import MANIFEST_NAME, Manifest, PartInfo
from yogacache.format.sources import source_for
from yogacache.format.writer import BuildLimits
from yogacache.locks import FileLock
from yogacache.progress import TransferProgress
from yogacache.read.reader import CacheReader
from yogacache.store.base import CacheEntry
from yogacache.store.lease import Lease
from yogacache.store.local import CacheStore

log = logging.getLogger(__name__)

LOCAL_CACHE_DIR = "yogadl_local_cache"
LEASE_NAME = "build-lease.json"
REMOTE_PART_SIZE = 256 << 20  # smaller parts let downloads, uploads and hashing overlap


class BuildWaitTimeoutError(YogaCacheError, TimeoutError):
    """Waited too long for another node to publish a cache."""


class RemoteCacheStore:
    """Caches in an object store (S3, GCS, a shared directory), read through local copies."""

    def __init__(
        self,
        objects: ObjectStore,
        local_root: Path | str,
        *,
        verify: Verify = "auto",
        limits: BuildLimits = BuildLimits(),
        part_size_bytes: int = REMOTE_PART_SIZE,
        lease_seconds: float = 120.0,
        poll_seconds: float = 1.0,
        wait_timeout: Optional[float] = None,
        transfer_threads: int = 4,
        show_progress: bool = True,
    ) -> None:
        self.objects = objects
        self.local = CacheStore(
            Path(local_root) / LOCAL_CACHE_DIR,
            verify=verify,
            limits=limits,
            part_size_bytes=part_size_bytes,
            show_progress=show_progress,
        )
        self.lease_seconds = lease_seconds
        self.poll_seconds = poll_seconds
        self.wait_timeout = wait_timeout
        self.transfer_threads = transfer_threads
        self.show_progress = show_progress

    def __repr__(self) -> str:
        return f"RemoteCacheStore({self.objects.url()!r}, local={str(self.local.root)!r})"

    @property
    def root(self) -> Path:
        return self.local.root

    @property
    def remote_url(self) -> Optional[str]:
        return self.objects.url()

    def location(self, dataset_id: str, dataset_version: str) -> str:
        return self.objects.url(self.key(dataset_id, dataset_version))

    # -- keys -----------------------------------------------------------------------------
    def key(self, dataset_id: str, dataset_version: str, name: str = "") -> str:
        self.local.cache_dir(dataset_id, dataset_version)  # validates both names
        return f"{dataset_id}/{dataset_version}/{name}"

    def part_key(self, manifest: Manifest, part: PartInfo) -> str:
        return self.key(manifest.dataset_id, manifest.dataset_version, f"{manifest.build_id}-{part.name}")

    # -- manifests ------------------------------------------------------------------------
    def remote_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The published manifest (one GET), or None when the cache is not published."""
        key = self.key(dataset_id, dataset_version, MANIFEST_NAME)
        found = self.objects.read(key)
        if found is None:
            return None
        manifest = Manifest.from_bytes(found[0], self.objects.url(key))
        if (manifest.dataset_id, manifest.dataset_version) != (dataset_id, dataset_version):
            raise CorruptCacheError(
                f"{self.objects.url(key)} describes {manifest.dataset_id}:{manifest.dataset_version}, "
                f"not {dataset_id}:{dataset_version} (swapped or copied); refused"
            )
        return manifest

    def manifest(self, dataset_id: str, dataset_version: str) -> Manifest:
        """The published manifest, else the local copy's; CacheNotFoundError when neither exists."""
        return self.remote_manifest(dataset_id, dataset_version) or self.local.manifest(dataset_id, dataset_version)

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes the local copy's parts; CorruptCacheError on any mismatch."""
        return self.local.verify(dataset_id, dataset_version)

    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Makes the local copy current with the published cache."""
        return self.open(dataset_id, dataset_version)

    def local_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        try:
            return self.local.manifest(dataset_id, dataset_version)
        except (CacheNotFoundError, CorruptCacheError):
            return None

    # -- reading --------------------------------------------------------------------------
    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Syncs the local copy with the published cache and opens it."""
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is None:
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} at "
                f"{self.objects.url(self.key(dataset_id, dataset_version))}"
            )
        return self.sync(dataset_id, dataset_version, remote)

    def sync(self, dataset_id: str, dataset_version: str, remote: Manifest) -> CacheReader:
        local = self.local_manifest(dataset_id, dataset_version)
        if local is None or local.freshness != remote.freshness:
            with FileLock(self.local.lock_path(dataset_id, dataset_version)):
                self._sync_locked(dataset_id, dataset_version, remote)
        return self.local.open(dataset_id, dataset_version)

    def _sync_locked(self, dataset_id: str, dataset_version: str, remote: Manifest) -> None:
        local = self.local_manifest(dataset_id, dataset_version)
        if local is not None and local.freshness == remote.freshness:
            return  # another process of this node downloaded it meanwhile
        self.download_locked(remote)

    def download_locked(self, remote: Manifest) -> None:
        """Downloads and verifies every part, then swaps the local copy atomically."""
        dataset_id, dataset_version = remote.dataset_id, remote.dataset_version
        target = self.local.cache_dir(dataset_id, dataset_version)
        self.local.clean_leftovers(dataset_id, dataset_version)
        temp = temp_dir_for(target, f"{remote.build_id}-{uuid.uuid4().hex[:8]}")
        temp.mkdir(parents=True, mode=0o755)
        progress = TransferProgress(
            f"downloading {dataset_id}:{dataset_version}",
            remote.total_size_bytes,
            enabled=self.show_progress,
        )
        try:

            def fetch(part: PartInfo) -> None:
                key = self.part_key(remote, part)
                path = temp / part.name
                try:
                    self.objects.download_file(key, path, progress.add)
                except FileNotFoundError:
                    raise CorruptCacheError(
                        f"{self.objects.url(key)} is missing although its manifest is published"
                    ) from None
                size = path.stat().st_size
                if size != part.size_bytes or sha256_file(path) != part.sha256:
                    raise CorruptCacheError(
                        f"{self.objects.url(key)} does not match its manifest's size and hash "
                        "(altered or swapped); refused"
                    )
                fsync_path(path)

            self._parallel(fetch, remote.parts)
            stamp_verified(temp, remote)
            write_file_durably(temp / MANIFEST_NAME, remote.to_bytes())
            fsync_path(temp)
            replace_directory(temp, target)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        progress.finish()

    def _parallel(self, work: Callable[[PartInfo], None], parts: tuple[PartInfo, ...]) -> None:
        if len(parts) <= 1:
            for part in parts:
                work(part)
            return
        with ThreadPoolExecutor(max_workers=self.transfer_threads) as pool:
            for future in [pool.submit(work, part) for part in parts]:
                future.result()

    # -- building and publishing ----------------------------------------------------------
    def get_or_build(
        self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]
    ) -> CacheReader:
        """Opens the published cache, building and publishing it first when nobody has.

        Processes of one node serialize on a local lock; nodes coordinate through a build
        lease in the bucket, so that one node builds and the others wait for its manifest.
        ``make_data`` runs only on the node that builds.
        """
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is not None:
            return self.sync(dataset_id, dataset_version, remote)
        with FileLock(self.local.lock_path(dataset_id, dataset_version)):
            self._build_or_wait_locked(dataset_id, dataset_version, make_data)
        return self.local.open(dataset_id, dataset_version)

    def _build_or_wait_locked(
        self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]
    ) -> None:
        lease_key = self.key(dataset_id, dataset_version, LEASE_NAME)
        deadline = None if self.wait_timeout is None else time.monotonic() + self.wait_timeout
        announced = False
        while True:
            remote = self.remote_manifest(dataset_id, dataset_version)
            if remote is not None:
                self._sync_locked(dataset_id, dataset_version, remote)
                return
            lease = Lease(self.objects, lease_key, uuid.uuid4().hex, self.lease_seconds)
            acquired, holder = lease.try_acquire()
            if acquired:
                try:
                    if self.remote_manifest(dataset_id, dataset_version) is not None:
                        continue  # published between our check and the lease
                    manifest = self.local.build_locked(
                        dataset_id, dataset_version, source_for(make_data())
                    )
                    if self.publish_locked(manifest):
                        return
                    log.info("another node published %s:%s first; using its cache", dataset_id, dataset_version)
                finally:
                    lease.release()
                continue
            if holder is not None and not announced:
                log.info(
                    "waiting for %s to finish building %s:%s", holder.owner, dataset_id, dataset_version
                )
                announced = True
            if deadline is not None and time.monotonic() > deadline:
                raise BuildWaitTimeoutError(
                    f"waited {self.wait_timeout} s for another node to publish "
                    f"{self.objects.url(self.key(dataset_id, dataset_version))}"
                )
            time.sleep(self.poll_seconds)

    def publish_locked(self, manifest: Manifest) -> bool:
        """Uploads the local copy's parts, then creates the manifest; False if one already exists."""
        dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
        directory = self.local.cache_dir(dataset_id, dataset_version)
        progress = TransferProgress(
            f"uploading {dataset_id}:{dataset_version}",
            manifest.total_size_bytes,
            enabled=self.show_progress,
        )
        self._parallel(
            lambda part: self.objects.upload_file(
                directory / part.name, self.part_key(manifest, part), progress.add
            ),
            manifest.parts,
        )
        progress.finish()
        manifest_key = self.key(dataset_id, dataset_version, MANIFEST_NAME)
        if self.objects.write(manifest_key, manifest.to_bytes(), if_absent=True) is None:
            self._delete_unreferenced(dataset_id, dataset_version)
            return False
        self._delete_unreferenced(dataset_id, dataset_version)
        return True

    def _delete_unreferenced(self, dataset_id: str, dataset_version: str) -> None:
        """Deletes part objects the published manifest does not name (losers, killed builders)."""
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is None:
            return
        keep = {self.part_key(remote, part) for part in remote.parts}
        # A YogaDL cache.mdb beside the cache is not ours to delete (yogacache.store.yogadl).
        from yogacache.format.yogadl_legacy import LEGACY_CACHE_NAME

        keep |= {self.key(dataset_id, dataset_version, n) for n in (MANIFEST_NAME, LEASE_NAME, LEGACY_CACHE_NAME)}
        for info in self.objects.list(self.key(dataset_id, dataset_version)):
            if info.key not in keep:
                self.objects.delete(info.key)

    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it; refuses to replace a published one."""
        with FileLock(self.local.lock_path(dataset_id, dataset_version)):
            if self.remote_manifest(dataset_id, dataset_version) is not None:
                raise YogaCacheError(
                    f"{self.objects.url(self.key(dataset_id, dataset_version))} is already "
                    "published; remove it first (yogacache rm --remote) to replace it"
                )
            manifest = self.local.build_locked(dataset_id, dataset_version, source_for(data))
            if not self.publish_locked(manifest):
                raise YogaCacheError(
                    f"another process published {dataset_id}:{dataset_version} concurrently"
                )
            return manifest

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Publishes the local copy of a cache."""
        with FileLock(self.local.lock_path(dataset_id, dataset_version)):
            manifest = self.local.manifest(dataset_id, dataset_version)
            remote = self.remote_manifest(dataset_id, dataset_version)
            if remote is not None:
                if remote.freshness == manifest.freshness:
                    return manifest
                raise YogaCacheError(
                    f"{self.objects.url(self.key(dataset_id, dataset_version))} holds another "
                    "build; remove it first (yogacache rm --remote) to replace it"
                )
            self.local.verify(dataset_id, dataset_version)
            if not self.publish_locked(manifest):
                raise YogaCacheError(
                    f"another process published {dataset_id}:{dataset_version} concurrently"
                )
            return manifest

    # -- management -----------------------------------------------------------------------
    def list(self) -> list[CacheEntry]:
        """Remote and local caches, matched by id and version."""
        remote: dict[tuple[str, str], Manifest] = {}
        for info in self.objects.list(""):
            parts = info.key.split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_NAME:
                manifest = self.remote_manifest(parts[0], parts[1])
                if manifest is not None:
                    remote[(parts[0], parts[1])] = manifest
        local = {(e.dataset_id, e.dataset_version): e for e in self.local.list()}
        entries = []
        for i, v in sorted(set(remote) | set(local)):
            copy = local.get((i, v))
            entries.append(
                CacheEntry(
                    i,
                    v,
                    local_path=copy.local_path if copy else None,
                    local=copy.local if copy else None,
                    remote=remote.get((i, v)),
                    remote_url=self.location(i, v) if (i, v) in remote else None,
                    error=copy.error if copy else None,
                )
            )
        return entries

    def remove(
        self, dataset_id: str, dataset_version: str, *, remote: bool = False, local: bool = True
    ) -> builtins.list[str]:
        """Removes the published cache (manifest first), the local copy, or both."""
        removed = []
        if remote:
            prefix = self.key(dataset_id, dataset_version)
            manifest_key = self.key(dataset_id, dataset_version, MANIFEST_NAME)
            if self.objects.read(manifest_key) is None:
                raise CacheNotFoundError(f"no published cache at {self.objects.url(prefix)}")
            self.objects.delete(manifest_key)  # unpublish first
            for info in self.objects.list(prefix):
                self.objects.delete(info.key)
            removed.append(self.objects.url(prefix))
        if local:
            if self.local.exists(dataset_id, dataset_version):
                removed.extend(self.local.remove(dataset_id, dataset_version))
            elif not remote:
                raise CacheNotFoundError(
                    f"no local copy of {dataset_id}:{dataset_version} under {self.local.root}"
                )
        return removed
