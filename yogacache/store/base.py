"""The Store protocol: what every store (local directory, remote object store) does for callers.

DataLayer, the CLI, the YogaDL facade, sources and the Ray builder hold a ``Store`` and never
ask which class it is (no ``isinstance``, ``getattr`` or ``hasattr`` on a store outside
``yogacache.store``): what differs between stores is answered by the protocol itself. Every
store has a ``local`` directory store (a local store is its own); ``remote`` is the
``RemoteStore`` view of a store that publishes to an object store, None for one that does not.
"""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from yogacache.backends.base import ObjectStore
from yogacache.format.manifest import Manifest
from yogacache.read.reader import CacheReader
from yogacache.store.entry import CacheEntry as CacheEntry  # re-exported: where stores took it from
from yogacache.store.local import CacheStore

# (dataset_id, version, storage URL, build id or None): which storage holds which build.
MirrorBuild = tuple[str, str, str, Optional[str]]


class Store(Protocol):
    """Caches keyed by ``(dataset_id, dataset_version)``, wherever they live.

    ``root`` is the directory of this node's caches (a remote store's local copies);
    ``remote_url`` is where caches are published, None for a store without a remote.
    """

    @property
    def root(self) -> Path: ...

    @property
    def remote_url(self) -> Optional[str]: ...

    @property
    def local(self) -> CacheStore:
        """The directory store of this node's caches: a local store itself, a remote store's
        node-local copies. What builds, locks and lays out caches on this node."""
        ...

    @property
    def remote(self) -> Optional[RemoteStore]:
        """This store as a ``RemoteStore`` (itself) when it publishes to an object store, None
        for a store whose caches live only in its directory (local or shared filesystem)."""
        ...

    def location(self, dataset_id: str, dataset_version: str) -> str:
        """Where the cache lives, for messages: a directory or a URL (never credentials)."""
        ...

    def manifest(self, dataset_id: str, dataset_version: str) -> Manifest:
        """The cache's manifest (published, else local); CacheNotFoundError when absent."""
        ...

    def open(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """A reader of the current cache (a remote one synced first); CacheNotFoundError when absent."""
        ...

    def get_or_build(self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]) -> CacheReader:
        """Opens the cache, building (and publishing) it from ``make_data()`` on a miss."""
        ...

    def build(self, dataset_id: str, dataset_version: str, data: Any) -> Manifest:
        """Builds a cache from ``data`` and publishes it."""
        ...

    def list(self) -> list[CacheEntry]:
        """Every cache, sorted by id and version."""
        ...

    def verify(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Re-hashes the local copy's parts; CorruptCacheError on any mismatch."""
        ...

    def remove(
        self, dataset_id: str, dataset_version: str, *, remote: bool = False, local: bool = True
    ) -> builtins.list[str]:
        """Removes the published cache and/or the local copy; returns what was removed."""
        ...

    def pull(self, dataset_id: str, dataset_version: str) -> CacheReader:
        """Makes the local copy current (ConfigError for a store with no remote)."""
        ...

    def push(self, dataset_id: str, dataset_version: str) -> Manifest:
        """Publishes the local copy (ConfigError for a store with no remote)."""
        ...


class RemoteStore(Store, Protocol):
    """A store that publishes caches to an object store and reads them through node-local copies.

    ``store.remote`` answers this view (or None): callers ask it, never the store's class.
    """

    local: CacheStore  # assignable: ``yogacache push --from DIR`` publishes another directory's copy

    @property
    def objects(self) -> ObjectStore:
        """The object store caches are published to."""
        ...

    @property
    def local_cache_limit(self) -> Optional[int]:
        """The byte budget of this node's local copies and streamed parts (None: no budget)."""
        ...

    def key(self, dataset_id: str, dataset_version: str, name: str = "") -> str:
        """The object key of ``name`` in the cache's remote directory (validates both names)."""
        ...

    def remote_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The published manifest (one request), or None when the cache is not published."""
        ...

    def local_manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """This node's copy's manifest, None when there is no readable local copy."""
        ...

    def remove_stranded(self, *, dry_run: bool = False) -> builtins.list[str]:
        """Removes (or, with ``dry_run``, lists) the URLs of part objects no published manifest
        names, across every cache of the storage."""
        ...

    def mirror_builds(self) -> Optional[builtins.list[MirrorBuild]]:
        """For a storage with mirrors: per published cache, the origin then each mirror with the
        build it holds (None: unreadable); None for a storage without mirrors."""
        ...
