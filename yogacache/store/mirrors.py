"""Mirrors: copies of a storage's caches nearer the readers, read in order of preference.

A storage config may list ``"mirrors"`` (storage configs, nearest first). The storage itself is
the origin: caches are built and published there, and its published manifest says which build
is current. Reading a cache:

1. the origin's manifest names the current build (one small request);
2. the nearest mirror holding that build serves it (the origin last);
3. when the nearest mirror lacks it (empty, or an older build), one node copies it there from
   the nearest place holding it (``store.copy``: server-side where it can, verified by CRC32C,
   manifest last), holding that mirror's build lease; other nodes wait for the mirror's
   manifest and then sync from it too. Should the copy fail (a mirror that cannot be written),
   the node reads from the nearest place holding the build instead.
"""

from __future__ import annotations

import builtins
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from yogacache import redaction
from yogacache.backends.base import ObjectStore, RemoteError
from yogacache.errors import CacheNotFoundError, CorruptCacheError, IncompatibleCacheError, YogaCacheError
from yogacache.format.manifest import Manifest
from yogacache.read.reader import CacheReader
from yogacache.store.base import CacheEntry
from yogacache.store.copy import copy_cache
from yogacache.store.lease import BuildWaitTimeoutError, build_or_wait
from yogacache.store.localroot import read_origin
from yogacache.store.publish import new_lease
from yogacache.store.remote import RemoteCacheStore

log = redaction.get_logger(__name__)


class MirroredCacheStore(RemoteCacheStore):
    """A RemoteCacheStore (the origin) whose caches are read from the nearest mirror holding them."""

    def __init__(
        self, objects: ObjectStore, mirrors: list[ObjectStore], local_root: Path | str, **options: Any
    ) -> None:
        super().__init__(objects, local_root, **options)
        if not mirrors:
            raise ValueError("a mirrored store needs at least one mirror")
        self.mirrors = [RemoteCacheStore(mirror, local_root, **options) for mirror in mirrors]

    def __repr__(self) -> str:
        urls = ", ".join(repr(mirror.objects.url()) for mirror in self.mirrors)
        return f"MirroredCacheStore({self.objects.url()!r}, mirrors=[{urls}], local={str(self.local.root)!r})"

    # -- reading --------------------------------------------------------------------------
    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        current = self.remote_manifest(dataset_id, dataset_version)
        if current is None:
            return super().open(dataset_id, dataset_version)  # its CacheNotFoundError
        return self._open_nearest(dataset_id, dataset_version, current)

    def get_or_build(self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]) -> CacheReader:
        current = self.remote_manifest(dataset_id, dataset_version)
        if current is None:
            return super().get_or_build(dataset_id, dataset_version, make_data)  # built at the origin
        return self._open_nearest(dataset_id, dataset_version, current)

    def _held(self, store: RemoteCacheStore, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The build ``store`` publishes (None: none, or it cannot be read: a mirror that fails is
        passed over with a warning, never taken for the origin)."""
        try:
            return store.remote_manifest(dataset_id, dataset_version)
        except (RemoteError, CorruptCacheError, IncompatibleCacheError) as error:
            log.warning("mirror %s passed over: %s", store.objects.url(), error)
            return None

    def _open_nearest(self, dataset_id: str, dataset_version: str, current: Manifest) -> CacheReader:
        near = self.mirrors[0]
        held = self._held(near, dataset_id, dataset_version)
        if held is not None and held.freshness == current.freshness:
            return near.sync(dataset_id, dataset_version, held)
        try:
            filled = self._fill(near, dataset_id, dataset_version, current)
        except BuildWaitTimeoutError:
            raise
        except YogaCacheError as error:  # RemoteError included: a mirror we cannot write
            log.warning(
                "could not copy %s:%s into mirror %s (%s); reading it from further away",
                dataset_id,
                dataset_version,
                near.objects.url(),
                error,
            )
            filled = None
        if filled is not None:
            return near.sync(dataset_id, dataset_version, filled)
        source, manifest = self._nearest_holding(dataset_id, dataset_version, current, skip=1)
        return source.sync(dataset_id, dataset_version, manifest)

    def _nearest_holding(
        self, dataset_id: str, dataset_version: str, current: Manifest, skip: int = 0
    ) -> tuple[RemoteCacheStore, Manifest]:
        """The nearest mirror (after the first ``skip``) holding the current build, else the origin."""
        for mirror in self.mirrors[skip:]:
            held = self._held(mirror, dataset_id, dataset_version)
            if held is not None and held.freshness == current.freshness:
                return mirror, held
        return self, current

    def _fill(
        self, near: RemoteCacheStore, dataset_id: str, dataset_version: str, current: Manifest
    ) -> Optional[Manifest]:
        """Makes ``near`` hold the current build: one node copies under ``near``'s build lease, the
        others wait for its manifest. Returns the manifest ``near`` then publishes."""

        def filled() -> Optional[Manifest]:
            held = self._held(near, dataset_id, dataset_version)
            return held if held is not None and held.freshness == current.freshness else None

        lease = new_lease(near.objects, dataset_id, dataset_version, self.lease_seconds)

        def fill() -> None:
            source, _ = self._nearest_holding(dataset_id, dataset_version, current, skip=1)
            log.info(
                "copying %s:%s from %s into mirror %s",
                dataset_id,
                dataset_version,
                source.objects.url(),
                near.objects.url(),
            )
            copy_cache(
                source.objects,
                near.objects,
                dataset_id,
                dataset_version,
                replace_other=True,
                show_progress=self.show_progress,
                lease=lease,  # held: the copy must not wait for it
            )
            return None  # the mirror's manifest says what it holds now: looked at again

        what, into = f"{dataset_id}:{dataset_version}", near.objects.url()
        copying, waiting_for = f"{what} (copy into {into})", f"copy {what} into {into}"
        return build_or_wait(lease, filled, fill, self.lease_times, what=copying, waiting_for=waiting_for)

    # -- management -----------------------------------------------------------------------
    def list(self) -> builtins.list[CacheEntry]:
        """The origin's caches; local copies fetched from a mirror count as this store's."""
        mirror_urls = {mirror.objects.url() for mirror in self.mirrors}
        from_mirrors = {
            (e.dataset_id, e.dataset_version): e
            for e in self.local.list()
            if e.local_path is not None and read_origin(e.local_path) in mirror_urls
        }
        entries = []
        for entry in super().list():
            copy = from_mirrors.pop((entry.dataset_id, entry.dataset_version), None)
            if copy is not None and entry.local_path is None:
                entry = replace(entry, local_path=copy.local_path, local=copy.local)
            entries.append(entry)
        entries.extend(from_mirrors.values())
        return sorted(entries, key=lambda e: (e.dataset_id, e.dataset_version))

    def mirror_builds(self) -> builtins.list[tuple[str, str, str, Optional[str]]]:
        """(dataset_id, version, storage URL, build id or None) for the origin and every mirror,
        for each cache the origin publishes: which mirror holds which build."""
        rows: builtins.list[tuple[str, str, str, Optional[str]]] = []
        for entry in super().list():
            if entry.remote is None:
                continue
            i, v = entry.dataset_id, entry.dataset_version
            rows.append((i, v, self.objects.url(), entry.remote.build_id))
            for mirror in self.mirrors:
                try:
                    held = mirror.remote_manifest(i, v)
                    build: Optional[str] = held.build_id if held else None
                except (RemoteError, CorruptCacheError, IncompatibleCacheError, CacheNotFoundError):
                    build = "unreadable"
                rows.append((i, v, mirror.objects.url(), build))
        return rows
