"""RemoteCacheStore: caches published to an object store and synced to node-local copies.

Remote layout: ``<prefix>/<id>/<version>/manifest.json`` plus the part objects
``<id>/<version>/<build id>-part-NNNNN.mdb`` (named by build, so a zombie builder can never
overwrite the parts a published manifest points to). Local copies live under
``<local root>/yogadl_local_cache/<id>/<version>/`` (``yogadl_local_cache-<uid>`` under a directory
every user may write to, such as ``/tmp``: see ``store.localroot``).

- Publish: upload the parts, then create the manifest conditionally: exactly one builder wins.
- Sync: compare the local manifest's (created_at, build_id) with the remote one's. Equal: use
  the local copy (one small request). Different: download into a temporary sibling, verify
  every part's content hash, swap atomically; readers of the old copy keep reading it.
- Coordination: a node-local file lock lets one process per node build or download; a build
  lease in the bucket lets one node build while the others wait for its manifest. Every writer of
  a cache's objects holds that lease: a build's or a push's publish, a copy to it, gc.
- A publish that fails or is interrupted leaves a local build that says it was never published
  (``origin.json``): it is not the remote's cache. ``get_or_build`` and ``push`` publish it, an
  import builds and publishes again; Ctrl-C removes it (nothing was cached). The parts it
  uploaded are removed by the next publish of the cache, by ``rm --remote`` and by ``gc``.
"""

from __future__ import annotations

import builtins
import logging
import os
import shutil
import stat
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from yogacache.backends.base import (
    DEFAULT_TRANSFER_THREADS,
    ObjectStore,
    ProgressCallback,
    is_disk_full,
)
from yogacache.errors import (
    CacheNotFoundError,
    CorruptCacheError,
    IncompatibleCacheError,
    InvalidNameError,
    NoSpaceError,
    YogaCacheError,
)
from yogacache.format.durability import TRASH_MARK, fsync_path, replace_directory, temp_dir_for, write_file_durably
from yogacache.format.integrity import (
    Verify,
    part_file_verified,
    part_matches,
    stamp_verified,
)
from yogacache.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, PartInfo
from yogacache.format.sources import source_for
from yogacache.format.writer import BuildLimits
from yogacache.progress import TransferProgress, waiter, waiting
from yogacache.read.reader import CacheReader
from yogacache.store.base import CacheEntry
from yogacache.store.lease import LEASE_NAME as LEASE_NAME  # re-exported: where the lease lives
from yogacache.store.lease import BuildWaitTimeoutError as BuildWaitTimeoutError  # re-exported
from yogacache.store.lease import Lease, holding
from yogacache.store.local import CacheStore
from yogacache.store.localroot import LOCAL_CACHE_DIR as LOCAL_CACHE_DIR  # re-exported: the documented name
from yogacache.store.localroot import ORIGIN_NAME as ORIGIN_NAME  # re-exported
from yogacache.store.localroot import is_unpublished, local_copies_root, write_origin
from yogacache.store.localroot import read_origin as read_origin  # re-exported
from yogacache.store.transfers import run_transfers

log = logging.getLogger(__name__)

REMOTE_PART_SIZE = 256 << 20  # smaller parts let downloads, uploads and hashing overlap
_REPLACED_RETRIES = 3


class ConcurrentPublishError(YogaCacheError):
    """Another process published the same cache while this one built it; this build lost."""


class _BuildReplaced(Exception):
    """The build being downloaded was replaced in the bucket (its parts are gone)."""

    def __init__(self, newer: Manifest) -> None:
        super().__init__(newer.build_id)
        self.newer = newer


def _free_bytes(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return -1


def _check_free_space(directory: Path, need: int, dataset_id: str, dataset_version: str) -> None:
    free = _free_bytes(directory)
    if 0 <= free < need:
        raise NoSpaceError(
            f"no space left on {directory}, need {need} bytes to download "
            f"{dataset_id}:{dataset_version} ({free} bytes free)"
        )


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
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
        show_progress: bool = True,
        streaming: bool = False,
        local_cache_limit: Optional[int] = None,
        objects_factory: Optional[Callable[[], ObjectStore]] = None,
    ) -> None:
        """``streaming``: read published caches by streaming their parts (see
        ``store.streaming``); ``local_cache_limit``: the byte budget of this node's local copies
        and streamed parts (a cache larger than it is streamed); ``objects_factory`` makes
        another client of the same object store in another process (spawned DataLoader workers)."""
        self.objects = objects
        self.streaming = streaming
        self.local_cache_limit = local_cache_limit
        self.objects_factory = objects_factory
        root = local_copies_root(local_root)  # per user under a shared /tmp: see store.localroot
        self.local = CacheStore(
            root.path,
            private_root=root.private,
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

    @property
    def remote(self) -> RemoteCacheStore:
        """This store: it publishes to ``objects`` (the ``Store`` protocol's remote view)."""
        return self

    def delete_unreferenced(self, dataset_id: str, dataset_version: str) -> None:
        """The part objects of the cache its published manifest does not name, deleted (the
        caller holds the build lease)."""
        self._delete_unreferenced(dataset_id, dataset_version)

    def mirror_builds(self) -> Optional[builtins.list[tuple[str, str, str, Optional[str]]]]:
        """None: this storage has no mirrors (``MirroredCacheStore`` lists them)."""
        return None

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
        found = self._read_manifest(key)
        if found is None:
            return None
        manifest = Manifest.from_bytes(found[0], self.objects.url(key))
        if (manifest.dataset_id, manifest.dataset_version) != (dataset_id, dataset_version):
            raise CorruptCacheError(
                f"{self.objects.url(key)} describes {manifest.dataset_id}:{manifest.dataset_version}, "
                f"not {dataset_id}:{dataset_version} (swapped or copied); refused"
            )
        return manifest

    def _read_manifest(self, key: str) -> Optional[tuple[bytes, str]]:
        """A published manifest's bytes and token; CorruptCacheError when it is larger than any
        real manifest (read with a cap: an oversized object never sits whole in memory)."""
        found = self.objects.read(key, max_bytes=MAX_MANIFEST_BYTES)
        if found is not None and len(found[0]) > MAX_MANIFEST_BYTES:
            raise CorruptCacheError(f"manifest {self.objects.url(key)} is larger than {MAX_MANIFEST_BYTES} bytes")
        return found

    def manifest(self, dataset_id: str, dataset_version: str) -> Manifest:
        """The published manifest, else the local copy's; CacheNotFoundError when neither exists.

        A local copy built for this remote and never published (its publish failed or was
        interrupted) is not this store's cache: a build publishes it anew, ``push`` publishes it.
        """
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is not None:
            return remote
        if is_unpublished(self.local.cache_dir(dataset_id, dataset_version)):
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} at "
                f"{self.location(dataset_id, dataset_version)}: the local copy built for it was never "
                "published (yogacache push publishes it)"
            )
        return self.local.manifest(dataset_id, dataset_version)

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes the local copy's parts; CorruptCacheError on any mismatch."""
        return self.local.verify(dataset_id, dataset_version)

    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Makes the local copy current with the published cache (a whole copy, also when
        reads stream)."""
        if not (self.streaming or self.local_cache_limit is not None):
            return self.open(dataset_id, dataset_version)
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is None:
            return self.open(dataset_id, dataset_version)  # says it is not published
        return self.sync(dataset_id, dataset_version, remote, whole=True)

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

    def sync(self, dataset_id: str, dataset_version: str, remote: Manifest, *, whole: bool = False) -> CacheReader:
        """Makes the local copy the published build ``remote`` (verified), then opens it; or
        streams it (``streams``), unless ``whole``."""
        if self._damaged_parts(dataset_id, dataset_version, remote) != []:
            if not whole and self.streams(remote):
                from yogacache.store.streaming import stream_cache

                return stream_cache(self, remote, limit=self.local_cache_limit, objects_factory=self.objects_factory)
            downloader = waiter(dataset_id, dataset_version, "downloading")
            with self.local.lock(dataset_id, dataset_version, on_wait=downloader):
                self._sync_locked(dataset_id, dataset_version, remote)
        from yogacache.store.budget import hold_copy

        hold_copy(self.local.root, dataset_id, dataset_version)  # in use: gc and eviction leave it
        return self.local.open(dataset_id, dataset_version)

    def streams(self, remote: Manifest) -> bool:
        """Whether ``remote`` is read by streaming its parts: when asked for, or when it is larger
        than the local budget."""
        limit = self.local_cache_limit
        return self.streaming or (limit is not None and remote.total_size_bytes > limit)

    def _damaged_parts(
        self, dataset_id: str, dataset_version: str, remote: Manifest, *, report: bool = False
    ) -> Optional[list[PartInfo]]:
        """None when the local copy is not of the published build; else its parts whose bytes
        do not match the *published* manifest (an empty list: the copy is current).

        A copy is current only if its manifest is the published one and every part hashes to
        the published content hash -- the (created_at, build_id) pair alone proves nothing about
        the bytes beside it. This user's verification stamps spare re-hashing unchanged files.
        """
        local = self.local_manifest(dataset_id, dataset_version)
        if local is None or local.content_json() != remote.content_json():  # CRC32Cs aside
            return None
        directory = self.local.cache_dir(dataset_id, dataset_version)
        damaged = [part for part in remote.parts if not part_file_verified(directory / part.name, part)]
        for part in damaged if report else ():
            log.warning(
                "part %s of the local copy of %s:%s does not match the published manifest "
                "(damaged or replaced); fetching it again from %s",
                part.name,
                dataset_id,
                dataset_version,
                self.location(dataset_id, dataset_version),
            )
        return damaged

    def _sync_locked(self, dataset_id: str, dataset_version: str, remote: Manifest) -> None:
        for _ in range(_REPLACED_RETRIES):
            damaged = self._damaged_parts(dataset_id, dataset_version, remote, report=True)
            if damaged == []:
                return  # current (another process of this node may have just fetched it)
            try:
                self.download_locked(remote, damaged=frozenset(part.name for part in damaged or ()))
                return
            except _BuildReplaced as replaced:
                log.info(
                    "%s was replaced by a newer build while downloading; fetching that one",
                    self.location(dataset_id, dataset_version),
                )
                remote = replaced.newer
        raise YogaCacheError(
            f"{self.location(dataset_id, dataset_version)} was replaced {_REPLACED_RETRIES} times "
            "while downloading it; try again later"
        )

    def download_locked(self, remote: Manifest, damaged: frozenset[str] = frozenset()) -> None:
        """Fetches the published build ``remote`` into a temporary sibling and swaps it in.

        Parts of the existing copy that are this user's files and already hold the published
        bytes (a heal of a damaged copy) are linked instead of downloaded; ``damaged`` names
        parts already found not to. Every downloaded part
        is checked against the published size and content hash. On the first failure, or Ctrl-C, the
        other transfers are cancelled and the temporary directory is removed.
        """
        dataset_id, dataset_version = remote.dataset_id, remote.dataset_version
        target = self.local.cache_dir(dataset_id, dataset_version)
        self.local.clean_leftovers(dataset_id, dataset_version)
        previous_origin = read_origin(target)
        reusable = self._reusable_parts(target, remote, damaged)
        missing = tuple(part for part in remote.parts if part.name not in reusable)
        need = sum(part.size_bytes for part in missing)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if self.local_cache_limit is not None:
            from yogacache.store.eviction import make_room_for_copy

            make_room_for_copy(self, remote, need)
        _check_free_space(target.parent, need, dataset_id, dataset_version)
        if previous_origin is not None and previous_origin != self.remote_url and target.exists():
            log.warning(
                "the local copy %s came from %s; replacing it with the build published at %s. "
                "Two remotes share this local cache directory: give each its own "
                "local_cache_host_path, or the copies replace each other",
                target,
                previous_origin,
                self.location(dataset_id, dataset_version),
            )
        temp = temp_dir_for(target, f"{remote.build_id}-{uuid.uuid4().hex[:8]}")
        temp.mkdir(parents=True, mode=0o755)
        progress = TransferProgress(f"downloading {dataset_id}:{dataset_version}", need, enabled=self.show_progress)
        try:
            for name, path in reusable.items():
                os.link(path, temp / name)

            def fetch(part: PartInfo, on_bytes: ProgressCallback) -> None:
                key = self.part_key(remote, part)
                path = temp / part.name
                try:
                    self.objects.download_file(key, path, on_bytes)
                except FileNotFoundError:
                    newer = self.remote_manifest(dataset_id, dataset_version)
                    if newer is not None and newer.freshness != remote.freshness:
                        raise _BuildReplaced(newer) from None
                    raise CorruptCacheError(
                        f"{self.objects.url(key)} is missing although its manifest is published"
                    ) from None
                size = path.stat().st_size
                if size != part.size_bytes or not part_matches(path, part):
                    raise CorruptCacheError(
                        f"{self.objects.url(key)} does not match its manifest's size and hash "
                        "(altered or swapped); refused"
                    )
                os.chmod(path, 0o644)  # explicit, as the parts a build writes (whatever the umask)
                fsync_path(path)

            self._parallel(fetch, missing, progress.add)
            stamp_verified(temp, remote)
            write_file_durably(temp / MANIFEST_NAME, remote.to_bytes())
            if self.remote_url is not None:
                write_origin(temp, self.remote_url)
            fsync_path(temp)
            replace_directory(temp, target)
        except BaseException as error:
            shutil.rmtree(temp, ignore_errors=True)
            if is_disk_full(error):
                raise NoSpaceError(
                    f"no space left on {target.parent}, need {need} bytes to download "
                    f"{dataset_id}:{dataset_version} ({_free_bytes(target.parent)} bytes free)"
                ) from None
            raise
        progress.finish()

    def _reusable_parts(self, target: Path, remote: Manifest, damaged: frozenset[str]) -> dict[str, Path]:
        """Parts of the existing copy of the same build that are this user's regular files and
        verifiably hold the published bytes."""
        local = self.local_manifest(remote.dataset_id, remote.dataset_version)
        if local is None or local.freshness != remote.freshness:
            return {}
        listed = {part.name: part for part in local.parts}
        found = {}
        for part in remote.parts:
            path = target / part.name
            known = listed.get(part.name)
            if part.name in damaged or known is None or replace(known, crc32c=None) != replace(part, crc32c=None):
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and part_file_verified(path, part):
                found[part.name] = path
        return found

    def _parallel(
        self,
        work: Callable[[PartInfo, ProgressCallback], None],
        parts: tuple[PartInfo, ...],
        add_bytes: ProgressCallback,
    ) -> None:
        """Runs ``work`` for every part on ``transfer_threads`` threads; stops them all on the
        first failure or on an interrupt (Ctrl-C): see ``store.transfers``."""
        run_transfers(work, parts, threads=self.transfer_threads, add_bytes=add_bytes)

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
        with self.local.lock(dataset_id, dataset_version, on_wait=waiter(dataset_id, dataset_version)):
            self._build_or_wait_locked(dataset_id, dataset_version, make_data)
        return self.local.open(dataset_id, dataset_version)

    def _new_lease(self, dataset_id: str, dataset_version: str) -> Lease:
        key = self.key(dataset_id, dataset_version, LEASE_NAME)
        return Lease(self.objects, key, uuid.uuid4().hex, self.lease_seconds)

    def _build_or_wait_locked(
        self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]
    ) -> None:
        deadline = None if self.wait_timeout is None else time.monotonic() + self.wait_timeout
        announced = False
        lease = self._new_lease(dataset_id, dataset_version)  # one lease watches the holder's
        while True:
            remote = self.remote_manifest(dataset_id, dataset_version)
            if remote is not None:
                self._sync_locked(dataset_id, dataset_version, remote)
                return
            acquired, holder = lease.try_acquire()
            if acquired:
                try:
                    if self.remote_manifest(dataset_id, dataset_version) is not None:
                        continue  # published between our check and the lease
                    manifest = self._unpublished_build(dataset_id, dataset_version) or self.local.build_locked(
                        dataset_id, dataset_version, source_for(make_data())
                    )
                    if self._publish_new_build(manifest, self.publish_locked):
                        return
                    log.info("another node published %s:%s first; using its cache", dataset_id, dataset_version)
                finally:
                    lease.release()
                continue
            if holder is not None and not announced:
                waiting(f"{dataset_id}:{dataset_version}", holder.owner)
                announced = True
            if deadline is not None and time.monotonic() > deadline:
                raise BuildWaitTimeoutError(
                    f"waited {self.wait_timeout} s for another node to publish "
                    f"{self.objects.url(self.key(dataset_id, dataset_version))}"
                )
            time.sleep(self.poll_seconds)

    def publish_locked(self, manifest: Manifest) -> bool:
        """Uploads the local copy's parts, then creates the manifest; False if one already exists.

        Afterwards, part objects the published manifest does not name (losers, killed builders)
        are deleted: the caller holds the build lease, so no other builder is uploading.
        """
        published = self._upload_and_commit(manifest, replacing=None)
        self._delete_unreferenced(manifest.dataset_id, manifest.dataset_version)
        return published

    def _upload_and_commit(self, manifest: Manifest, *, replacing: Optional[str]) -> bool:
        """Uploads the parts, then writes the manifest conditionally: created only if none exists
        (``replacing`` None), else replacing only the published version ``replacing``. False when
        that precondition failed."""
        dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
        directory = self.local.cache_dir(dataset_id, dataset_version)
        progress = TransferProgress(
            f"uploading {dataset_id}:{dataset_version}",
            manifest.total_size_bytes,
            enabled=self.show_progress,
        )
        self._parallel(
            lambda part, on_bytes: self.objects.upload_file(
                directory / part.name, self.part_key(manifest, part), on_bytes
            ),
            manifest.parts,
            progress.add,
        )
        progress.finish()
        manifest_key = self.key(dataset_id, dataset_version, MANIFEST_NAME)
        if replacing is None:
            token = self.objects.write(manifest_key, manifest.to_bytes(), if_absent=True)
        else:
            token = self.objects.write(manifest_key, manifest.to_bytes(), if_token=replacing)
        if token is None:
            return False
        if self.remote_url is not None and (directory / MANIFEST_NAME).is_file():
            write_origin(directory, self.remote_url)
        return True

    def _delete_build_parts(self, dataset_id: str, dataset_version: str, build_id: str) -> None:
        """Deletes the part objects of one build (a replaced one, or one that lost)."""
        prefix = self.key(dataset_id, dataset_version, f"{build_id}-")
        for info in self.objects.list(prefix):
            self.objects.delete(info.key)

    def _delete_unreferenced(self, dataset_id: str, dataset_version: str) -> None:
        """Deletes part objects the published manifest does not name (losers, killed builders)."""
        try:
            remote = self.remote_manifest(dataset_id, dataset_version)
        except (CorruptCacheError, IncompatibleCacheError):
            return  # unreadable: which parts it needs is unknown, so nothing is deleted
        if remote is None:
            return
        keep = {self.part_key(remote, part) for part in remote.parts}
        # A YogaDL cache.mdb beside the cache is not ours to delete (yogacache.store.yogadl).
        from yogacache.format.yogadl_legacy import LEGACY_CACHE_NAME

        keep |= {self.key(dataset_id, dataset_version, n) for n in (MANIFEST_NAME, LEASE_NAME, LEGACY_CACHE_NAME)}
        for info in self.objects.list(self.key(dataset_id, dataset_version)):
            if info.key not in keep:
                self.objects.delete(info.key)

    def _remove_stranded(self, dataset_id: str, dataset_version: str) -> bool:
        """Deletes the objects of a cache that has no manifest (the parts of an interrupted or
        failed publish), holding its build lease so that no publish under way loses its parts;
        False when there is nothing to delete."""
        lease_key = self.key(dataset_id, dataset_version, LEASE_NAME)
        if not [info for info in self.objects.list(self.key(dataset_id, dataset_version)) if info.key != lease_key]:
            return False
        with holding(
            self.objects,
            lease_key,
            self.lease_seconds,
            what=f"{dataset_id}:{dataset_version}",
            poll_seconds=self.poll_seconds,
            timeout=self.wait_timeout,
            doing="publishing",
        ):
            if self.remote_manifest(dataset_id, dataset_version) is not None:
                raise YogaCacheError(
                    f"{self.location(dataset_id, dataset_version)} was published meanwhile; run rm again to remove it"
                )
            for info in self.objects.list(self.key(dataset_id, dataset_version)):
                if info.key != lease_key:
                    self.objects.delete(info.key)
        self.objects.delete(lease_key)  # released above: free, and no cache is left to build
        return True

    def remove_stranded(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Deletes the part objects no published manifest names (what interrupted or failed
        publishes and copies left), cache by cache under its build lease; a cache whose lease
        another process holds is being written and is left alone. Returns the objects' URLs."""
        found: dict[tuple[str, str], builtins.list[str]] = {}
        for info in self.objects.list(""):
            names = info.key.split("/")
            if len(names) == 3 and "-part-" in names[2] and names[2].endswith(".mdb"):
                found.setdefault((names[0], names[1]), []).append(info.key)
        removed: builtins.list[str] = []
        for (dataset_id, dataset_version), keys in sorted(found.items()):
            try:
                stranded = self._stranded(dataset_id, dataset_version, keys)
            except (CorruptCacheError, IncompatibleCacheError, InvalidNameError):
                continue  # which parts an unreadable manifest needs is unknown: nothing goes
            if not stranded or dry_run:
                removed.extend(self.objects.url(key) for key in stranded)
                continue
            lease = self._new_lease(dataset_id, dataset_version)
            if not lease.try_acquire()[0]:
                where = self.location(dataset_id, dataset_version)
                log.info("%s is being written (its build lease is held); left alone", where)
                continue
            try:
                for key in self._stranded(dataset_id, dataset_version, stranded):  # published meanwhile?
                    if self.objects.delete(key):
                        removed.append(self.objects.url(key))
            finally:
                lease.release()
        return removed

    def _stranded(self, dataset_id: str, dataset_version: str, keys: builtins.list[str]) -> builtins.list[str]:
        """Those of the part objects ``keys`` of one cache that its published manifest does not name."""
        published = self.remote_manifest(dataset_id, dataset_version)
        named = {self.part_key(published, part) for part in published.parts} if published is not None else set()
        return [key for key in keys if key not in named]

    def _published(self, dataset_id: str, dataset_version: str) -> tuple[Optional[str], Optional[Manifest]]:
        """The published manifest's version token (None: unpublished) and the manifest itself
        (None where it cannot be read: a corrupt one can still be replaced)."""
        key = self.key(dataset_id, dataset_version, MANIFEST_NAME)
        try:
            found = self._read_manifest(key)
        except CorruptCacheError:
            found = self.objects.read(key, max_bytes=0)  # too large: its token, to replace it
            return (found[1] if found else None), None
        if found is None:
            return None, None
        try:
            return found[1], Manifest.from_bytes(found[0], self.objects.url(key))
        except YogaCacheError:
            return found[1], None

    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it, replacing the published one (as YogaDL's
        ``submit`` documents).

        The replace is conditional on the manifest this call saw before building: when another
        process publishes meanwhile, exactly one of the two wins and the other raises
        ConcurrentPublishError. See "Replacing a published cache" in docs/architecture.md for
        what happens to the old build's parts and its readers.
        """
        with self.local.lock(dataset_id, dataset_version):
            seen_token, seen = self._published(dataset_id, dataset_version)
            manifest = self.local.build_locked(dataset_id, dataset_version, source_for(data))

            def publish(manifest: Manifest) -> bool:
                with self._holding_lease(manifest):
                    self._publish_replacing(manifest, seen_token, seen)
                    self._delete_unreferenced(dataset_id, dataset_version)  # what other publishes stranded
                return True

            self._publish_new_build(manifest, publish)
            return manifest

    def _unpublished_build(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The local copy built for this remote whose publish failed or was cut short (it says
        so: ``is_unpublished``), once it verifies; None when there is none. ``get_or_build``
        publishes it rather than building the same id and version again."""
        directory = self.local.cache_dir(dataset_id, dataset_version)
        if not is_unpublished(directory) or read_origin(directory) != self.remote_url:
            return None
        try:
            manifest = self.local.verify(dataset_id, dataset_version)
        except (CacheNotFoundError, CorruptCacheError, IncompatibleCacheError) as error:
            log.warning("the unpublished local build %s cannot be published (%s); building again", directory, error)
            return None
        log.info("publishing the local build %s, whose publish did not finish", directory)
        return manifest

    def _holding_lease(self, manifest: Manifest) -> Any:
        """The cache's build lease, held while this process writes the cache's objects."""
        dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
        return holding(
            self.objects,
            self.key(dataset_id, dataset_version, LEASE_NAME),
            self.lease_seconds,
            what=f"{dataset_id}:{dataset_version}",
            build_id=manifest.build_id,
            poll_seconds=self.poll_seconds,
            timeout=self.wait_timeout,
            doing="publishing",
        )

    def _publish_new_build(self, manifest: Manifest, publish: Callable[[Manifest], bool]) -> bool:
        """Runs ``publish(manifest)`` for the local build ``manifest`` (the caller holds the local lock).

        Until it is published, the local copy says so (``is_unpublished``): it is not the remote's
        cache, and a later build or ``push`` publishes. Interrupted (Ctrl-C), the local copy goes
        too: nothing was cached. The parts uploaded so far are removed by the next publish of the
        cache, or by ``rm --remote``.
        """
        directory = self.local.cache_dir(manifest.dataset_id, manifest.dataset_version)
        if self.remote_url is not None:
            write_origin(directory, self.remote_url, published=False)
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

    def _publish_replacing(self, manifest: Manifest, seen_token: Optional[str], seen: Optional[Manifest]) -> None:
        """Publishes ``manifest`` if the published manifest is still the version ``seen_token``;
        then deletes the replaced build's parts. Raises ConcurrentPublishError when another
        process published first (this build's uploaded parts are deleted again)."""
        dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
        if not self._upload_and_commit(manifest, replacing=seen_token):
            self._delete_build_parts(dataset_id, dataset_version, manifest.build_id)
            raise ConcurrentPublishError(
                f"another process published {self.location(dataset_id, dataset_version)} while "
                f"this build of {dataset_id}:{dataset_version} ran; the other build stays published "
                "and this one was not published"
            )
        if seen is not None and seen.build_id != manifest.build_id:
            self._delete_build_parts(dataset_id, dataset_version, seen.build_id)

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Publishes the local copy of a cache."""
        with self.local.lock(dataset_id, dataset_version):
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
            with self._holding_lease(manifest):
                self._publish_replacing(manifest, None, None)
                self._delete_unreferenced(dataset_id, dataset_version)
            return manifest

    # -- management -----------------------------------------------------------------------
    def list(self) -> list[CacheEntry]:
        """Published caches and this remote's local copies, matched by id and version.

        A published manifest that cannot be read (corrupt, or of a newer format) is listed with
        ``error`` set instead of failing the listing. Local copies fetched from another remote
        (another bucket or prefix sharing this local root) are not this store's and not listed.
        """
        remote: dict[tuple[str, str], Manifest] = {}
        errors: dict[tuple[str, str], str] = {}
        for info in self.objects.list(""):
            parts = info.key.split("/")
            if len(parts) == 3 and parts[2] == MANIFEST_NAME:
                try:
                    manifest = self.remote_manifest(parts[0], parts[1])
                except (CorruptCacheError, IncompatibleCacheError, InvalidNameError) as error:
                    errors[(parts[0], parts[1])] = str(error)
                    continue
                if manifest is not None:
                    remote[(parts[0], parts[1])] = manifest
        local = {
            (e.dataset_id, e.dataset_version): e
            for e in self.local.list()
            if e.local_path is None or read_origin(e.local_path) in (None, self.remote_url)
        }
        entries = []
        for i, v in sorted(set(remote) | set(errors) | set(local)):
            copy = local.get((i, v))
            published = (i, v) in remote or (i, v) in errors
            entries.append(
                CacheEntry(
                    i,
                    v,
                    local_path=copy.local_path if copy else None,
                    local=copy.local if copy else None,
                    remote=remote.get((i, v)),
                    remote_url=self.objects.url(f"{i}/{v}/") if published else None,
                    error=errors.get((i, v)) or (copy.error if copy else None),
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
            if self.objects.read(manifest_key, max_bytes=0) is not None:  # whether it exists, not its bytes
                self.objects.delete(manifest_key)  # unpublish first
                for info in self.objects.list(prefix):
                    self.objects.delete(info.key)
            elif not self._remove_stranded(dataset_id, dataset_version):
                raise CacheNotFoundError(f"no published cache at {self.objects.url(prefix)}")
            removed.append(self.objects.url(prefix))
        if local:
            from yogacache.store.streaming import remove_streamed_parts

            streamed = remove_streamed_parts(self.local.root, dataset_id, dataset_version)
            removed.extend(streamed)
            if self.local.exists(dataset_id, dataset_version):
                removed.extend(self.local.remove(dataset_id, dataset_version))
            elif not remote and not streamed:
                raise CacheNotFoundError(
                    f"no local copy of {dataset_id}:{dataset_version} under {self.local.root}"
                )
        return removed
