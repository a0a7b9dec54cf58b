"""RemoteCacheStore: caches published to an object store and synced to node-local copies.

This module orchestrates (open, sync or stream, get_or_build, build, push, list, remove); the
work is done by ``store.keys`` (the remote key layout), ``store.sync`` (local copies),
``store.publish`` (publishing and clean-up), ``store.lease`` (build leases) and
``store.transfers`` (verified, cancellable, parallel transfers).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from yogacache import redaction
from yogacache.backends.base import DEFAULT_TRANSFER_THREADS, ObjectStore
from yogacache.config import check_part_budget
from yogacache.errors import CacheNotFoundError, YogaCacheError
from yogacache.format.integrity import Verify
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import source_for
from yogacache.format.writer import BuildLimits
from yogacache.progress import waiter
from yogacache.read.reader import CacheReader
from yogacache.store import keys, publish
from yogacache.store.base import CacheEntry
from yogacache.store.budget import hold_copy
from yogacache.store.eviction import make_room_for_copy
from yogacache.store.keys import LEASE_NAME as LEASE_NAME  # re-exported: where the lease lives
from yogacache.store.lease import BuildWaitTimeoutError as BuildWaitTimeoutError  # re-exported
from yogacache.store.lease import LeaseTimes, build_or_wait, check_lease_seconds
from yogacache.store.local import CacheStore
from yogacache.store.localroot import LOCAL_CACHE_DIR as LOCAL_CACHE_DIR  # re-exported: the documented name
from yogacache.store.localroot import ORIGIN_NAME as ORIGIN_NAME  # re-exported
from yogacache.store.localroot import is_unpublished, local_copies_root
from yogacache.store.localroot import read_origin as read_origin  # re-exported
from yogacache.store.publish import ConcurrentPublishError as ConcurrentPublishError  # re-exported
from yogacache.store.streaming import remove_streamed_parts, stream_cache
from yogacache.store.sync import LocalCopies

log = redaction.get_logger(__name__)

# Parts of caches published to object stores: the unit of a streamed fetch (the first batch waits
# for one), of parallel transfers and of a budget (which must hold two). 64 MiB, as MosaicML's
# shards and LitData's chunks: 1.3 s at 50 MB/s, and a budget of a few GiB holds dozens.
REMOTE_PART_SIZE = 64 << 20

#: Published manifests ``list`` reads at once.
LIST_READ_THREADS = 16


class RemoteCacheStore:
    """Caches in an object store (S3, GCS, a shared directory), read through local copies."""

    def __init__(
        self,
        objects: ObjectStore,
        local_root: Path | str,
        *,
        verify: Verify = "auto",
        limits: BuildLimits = BuildLimits(),
        part_size_bytes: Optional[int] = None,
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
        another client of the same object store in another process (spawned DataLoader workers);
        ``part_size_bytes``: where builds roll to a new part (default ``REMOTE_PART_SIZE``), checked
        against ``local_cache_limit`` when both are given."""
        check_part_budget(part_size_bytes, local_cache_limit)
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
            part_size_bytes=REMOTE_PART_SIZE if part_size_bytes is None else part_size_bytes,
            show_progress=show_progress,
        )
        self.lease_seconds = check_lease_seconds(lease_seconds)
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

    def mirror_builds(self) -> Optional[builtins.list[tuple[str, str, str, Optional[str]]]]:
        """None: this storage has no mirrors (``MirroredCacheStore`` lists them)."""
        return None

    def location(self, dataset_id: str, dataset_version: str) -> str:
        return self.objects.url(self.key(dataset_id, dataset_version))

    # -- keys and manifests ------------------------------------------------------------------
    def key(self, dataset_id: str, dataset_version: str, name: str = "") -> str:
        """The key of ``name`` in a cache (``store.keys``)."""
        return keys.cache_key(dataset_id, dataset_version, name)

    @property
    def lease_times(self) -> LeaseTimes:
        return LeaseTimes(self.lease_seconds, self.poll_seconds, self.wait_timeout)

    @property
    def copies(self) -> LocalCopies:
        """This node's copies of the caches this store publishes (``store.sync``)."""
        limited = self.local_cache_limit is not None
        return LocalCopies(
            self.objects,
            self.local,
            self.transfer_threads,
            self.show_progress,
            (lambda remote, need: make_room_for_copy(self, remote, need)) if limited else None,
        )

    def remote_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The published manifest (one GET), or None when the cache is not published."""
        return publish.remote_manifest(self.objects, dataset_id, dataset_version)

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

    def local_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        return self.copies.manifest(dataset_id, dataset_version)

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes the local copy's parts; CorruptCacheError on any mismatch."""
        return self.local.verify(dataset_id, dataset_version)

    # -- reading --------------------------------------------------------------------------
    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Makes the local copy current with the published cache (a whole copy, also when
        reads stream)."""
        if not (self.streaming or self.local_cache_limit is not None):
            return self.open(dataset_id, dataset_version)
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is None:
            return self.open(dataset_id, dataset_version)  # says it is not published
        return self.sync(dataset_id, dataset_version, remote, whole=True)

    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Syncs the local copy with the published cache and opens it."""
        remote = self.remote_manifest(dataset_id, dataset_version)
        if remote is None:
            raise CacheNotFoundError(
                f"no cache for dataset {dataset_id!r} version {dataset_version!r} at "
                f"{self.location(dataset_id, dataset_version)}"
            )
        return self.sync(dataset_id, dataset_version, remote)

    def sync(self, dataset_id: str, dataset_version: str, remote: Manifest, *, whole: bool = False) -> CacheReader:
        """Makes the local copy the published build ``remote`` (verified), then opens it; or
        streams it (``streams``), unless ``whole``."""
        copies = self.copies
        if copies.damaged_parts(remote) != []:
            if not whole and self.streams(remote):
                return stream_cache(self, remote, limit=self.local_cache_limit, objects_factory=self.objects_factory)
            downloader = waiter(dataset_id, dataset_version, "downloading")
            with self.local.lock(dataset_id, dataset_version, on_wait=downloader):
                copies.sync_locked(remote)
        hold_copy(self.local.root, dataset_id, dataset_version)  # in use: gc and eviction leave it
        return self.local.open(dataset_id, dataset_version)

    def streams(self, remote: Manifest) -> bool:
        """Whether ``remote`` is read by streaming its parts: when asked for, or when it is larger
        than the local budget."""
        limit = self.local_cache_limit
        return self.streaming or (limit is not None and remote.total_size_bytes > limit)

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

    def _build_or_wait_locked(self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]) -> None:
        """One node builds and publishes under the build lease; the others (and this one, when
        another node published first) sync the published build."""

        def published() -> Optional[tuple[bool, Manifest]]:
            remote = self.remote_manifest(dataset_id, dataset_version)
            return None if remote is None else (False, remote)

        def build() -> Optional[tuple[bool, Manifest]]:
            manifest = publish.unpublished_build(
                self.local, dataset_id, dataset_version, self.remote_url
            ) or self.local.build_locked(dataset_id, dataset_version, source_for(make_data()))
            if publish.publish_new_build(self.local, manifest, self.remote_url, self.publish_locked):
                return True, manifest
            log.info("another node published %s:%s first; using its cache", dataset_id, dataset_version)
            return None

        lease = publish.new_lease(self.objects, dataset_id, dataset_version, self.lease_seconds)
        built, remote = build_or_wait(
            lease,
            published,
            build,
            self.lease_times,
            what=f"{dataset_id}:{dataset_version}",
            waiting_for=f"publish {self.location(dataset_id, dataset_version)}",
        )
        if not built:
            self.copies.sync_locked(remote)

    def publish_locked(self, manifest: Manifest) -> bool:
        """Uploads the local copy's parts, then creates the manifest; False if one already exists.

        Afterwards, part objects the published manifest does not name (losers, killed builders)
        are deleted: the caller holds the build lease, so no other builder is uploading.
        """
        published = publish.upload_and_commit(
            self.objects,
            self.local,
            manifest,
            replacing=None,
            threads=self.transfer_threads,
            show_progress=self.show_progress,
        )
        publish.delete_unreferenced(self.objects, manifest.dataset_id, manifest.dataset_version)
        return published

    def _publish_replacing(self, manifest: Manifest, seen_token: Optional[str], seen: Optional[Manifest]) -> None:
        """Under the build lease: publishes ``manifest`` in place of the version ``seen_token``
        (``publish.publish_replacing``), then deletes what other publishes stranded."""
        with publish.holding_lease(
            self.objects, manifest.dataset_id, manifest.dataset_version, self.lease_times, build_id=manifest.build_id
        ):
            publish.publish_replacing(
                self.objects,
                self.local,
                manifest,
                seen_token,
                seen,
                threads=self.transfer_threads,
                show_progress=self.show_progress,
            )
            publish.delete_unreferenced(self.objects, manifest.dataset_id, manifest.dataset_version)

    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it, replacing the published one (as YogaDL's
        ``submit`` documents).

        The replace is conditional on the manifest this call saw before building: when another
        process publishes meanwhile, exactly one of the two wins and the other raises
        ConcurrentPublishError. See "Replacing a published cache" in docs/architecture.md for
        what happens to the old build's parts and its readers.
        """
        with self.local.lock(dataset_id, dataset_version):
            seen_token, seen = publish.published(self.objects, dataset_id, dataset_version)
            manifest = self.local.build_locked(dataset_id, dataset_version, source_for(data))

            def publish_it(manifest: Manifest) -> bool:
                self._publish_replacing(manifest, seen_token, seen)
                return True

            publish.publish_new_build(self.local, manifest, self.remote_url, publish_it)
            return manifest

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Publishes the local copy of a cache."""
        with self.local.lock(dataset_id, dataset_version):
            manifest = self.local.manifest(dataset_id, dataset_version)
            remote = self.remote_manifest(dataset_id, dataset_version)
            if remote is not None:
                if remote.freshness == manifest.freshness:
                    return manifest
                raise YogaCacheError(
                    f"cannot push {dataset_id} {dataset_version}: {self.location(dataset_id, dataset_version)} "
                    f"holds another build ({remote.build_id}, {remote.num_records:,} records) than this node's "
                    f"copy ({manifest.build_id}, {manifest.num_records:,} records); to replace it, remove it "
                    f"first (yogacache rm {dataset_id} {dataset_version} --remote --storage {self.remote_url}), "
                    f"then push again; to read it, yogacache pull {dataset_id} {dataset_version}"
                )
            self.local.verify(dataset_id, dataset_version)
            self._publish_replacing(manifest, None, None)
            return manifest

    def remove_stranded(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Deletes the part objects no published manifest names (``publish.remove_stranded``);
        returns the objects' URLs."""
        return publish.remove_stranded(self.objects, self.lease_seconds, dry_run=dry_run)

    # -- management -----------------------------------------------------------------------
    def list(self) -> list[CacheEntry]:
        """Published caches and this remote's local copies, matched by id and version.

        A published manifest that cannot be read (corrupt, or of a newer format) is listed with
        ``error`` set instead of failing the listing. Local copies fetched from another remote
        (another bucket or prefix sharing this local root) are not this store's and not listed.
        """
        remote: dict[tuple[str, str], Manifest] = {}
        errors: dict[tuple[str, str], str] = {}
        prefixes: dict[tuple[str, str], str] = {}  # as listed (an invalid name included)
        for info in self.objects.list(""):
            cache = keys.manifest_cache(info.key)
            if cache is not None:
                prefixes[cache] = info.key[: -len(MANIFEST_NAME)]

        def read(cache: tuple[str, str]) -> tuple[Optional[Manifest], Optional[str]]:
            try:
                return self.remote_manifest(*cache), None
            except publish.UNREADABLE as error:
                return None, str(error)

        # One GET per cache, many at once: 10^4 caches are listed in seconds, not minutes.
        with ThreadPoolExecutor(max(1, min(LIST_READ_THREADS, len(prefixes)))) as pool:
            for cache, (manifest, error) in zip(prefixes, pool.map(read, list(prefixes))):
                if error is not None:
                    errors[cache] = error
                elif manifest is not None:
                    remote[cache] = manifest
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
                    remote_url=self.objects.url(prefixes[(i, v)]) if published else None,
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
            if not publish.remove_published(self.objects, dataset_id, dataset_version, self.lease_times):
                raise CacheNotFoundError(f"no published cache at {self.location(dataset_id, dataset_version)}")
            removed.append(self.location(dataset_id, dataset_version))
        if local:
            streamed = remove_streamed_parts(self.local.root, dataset_id, dataset_version)
            removed.extend(streamed)
            if self.local.exists(dataset_id, dataset_version):
                removed.extend(self.local.remove(dataset_id, dataset_version))
            elif not remote and not streamed:
                raise CacheNotFoundError(
                    f"no local copy of {dataset_id}:{dataset_version} under {self.local.root}"
                )
        return removed
