"""The Store protocol: what every store (local directory, remote object store) does for callers.

DataLayer, the CLI and the YogaDL facade hold a ``Store`` and never ask which kind it is: a
local store answers "no remote copy" where a remote store would talk to its backend.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from yogacache.format.manifest import Manifest
from yogacache.read.reader import CacheReader


@dataclass(frozen=True)
class CacheEntry:
    """One cache a store lists: its local copy and/or its published copy.

    ``error`` is set when the local manifest exists but cannot be read.
    """

    dataset_id: str
    dataset_version: str
    local_path: Optional[Path]
    local: Optional[Manifest]
    remote: Optional[Manifest] = None
    remote_url: Optional[str] = None
    error: Optional[str] = None

    @property
    def manifest(self) -> Optional[Manifest]:
        """The authoritative manifest: the published one where there is one, else the local one."""
        return self.remote or self.local

    @property
    def path(self) -> Optional[Path]:
        return self.local_path

    @property
    def where(self) -> str:
        """``local``, ``remote`` or ``remote+local``."""
        places = [name for name, present in (("remote", self.remote_url), ("local", self.local_path)) if present]
        return "+".join(places)

    @property
    def current(self) -> bool:
        """True when a local copy of a published cache is of the published build."""
        return self.remote is not None and self.local is not None and self.remote.freshness == self.local.freshness

    @property
    def copy_state(self) -> str:
        """How the local copy relates to the published cache: current, stale, only local, none."""
        if self.current:
            return "current"
        if self.local_path is not None and self.remote is not None:
            return "stale"
        return "only local" if self.local_path is not None else "none"


class Store(Protocol):
    """Caches keyed by ``(dataset_id, dataset_version)``, wherever they live.

    ``root`` is the directory of this node's caches (a remote store's local copies);
    ``remote_url`` is where caches are published, None for a store without a remote.
    """

    @property
    def root(self) -> Path: ...

    @property
    def remote_url(self) -> Optional[str]: ...

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
