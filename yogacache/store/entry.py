"""CacheEntry: one cache as a store lists it, its local copy and/or its published copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from yogacache.format.manifest import Manifest


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
