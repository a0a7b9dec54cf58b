"""The key layout of a published cache in an object store: every key and prefix is built here.

A cache ``<id>/<version>/`` holds:

- ``manifest.json``: the published manifest (created last, conditionally);
- ``<build id>-part-NNNNN.mdb``: the parts, named by build, so that a zombie builder never
  overwrites the parts a published manifest points to (a Ray build's parts carry its shard and
  attempt: ``<build id>-part-SSSSS-NNN-<attempt>.mdb``);
- ``build-lease.json``: the build lease (``store.lease``);
- ``cache.mdb``: a YogaDL cache beside it, never ours to delete (``store.yogadl``).

A shared_fs directory holds sealed cache directories instead: ``<id>/<version>/part-NNNNN.mdb``
(``build_prefixed=False``). Streamed parts on a node keep the object name
(``part_object_name``).
"""

from __future__ import annotations

from typing import Optional

from yogacache.format.manifest import MANIFEST_NAME, Manifest, PartInfo
from yogacache.format.yogadl_legacy import LEGACY_CACHE_NAME
from yogacache.names import validate_name, validate_version

LEASE_NAME = "build-lease.json"  # beside the cache's manifest: <id>/<version>/build-lease.json
PART_SUFFIX = ".mdb"
_PART_MARK = "-part-"


def cache_key(dataset_id: str, dataset_version: str, name: str = "") -> str:
    """The key of ``name`` in the cache ``dataset_id:dataset_version`` (its prefix, ending in
    ``/``, when ``name`` is empty); InvalidNameError for a name that is not a valid id or version."""
    validate_name(dataset_id, "dataset_id")
    validate_version(dataset_version)
    return f"{dataset_id}/{dataset_version}/{name}"


def manifest_key(dataset_id: str, dataset_version: str) -> str:
    return cache_key(dataset_id, dataset_version, MANIFEST_NAME)


def lease_key(dataset_id: str, dataset_version: str) -> str:
    return cache_key(dataset_id, dataset_version, LEASE_NAME)


def part_object_name(build_id: str, part_name: str) -> str:
    """A part's object name within its cache: its build's id, then the part's file name."""
    return f"{build_id}-{part_name}"


def build_prefix(dataset_id: str, dataset_version: str, build_id: str) -> str:
    """The prefix of every part object of one build."""
    return cache_key(dataset_id, dataset_version, part_object_name(build_id, ""))


def part_key(manifest: Manifest, part: PartInfo, *, build_prefixed: bool = True) -> str:
    """The key of ``part`` of the build ``manifest``; a shared_fs directory
    (``build_prefixed=False``) keeps the part's own file name."""
    name = part_object_name(manifest.build_id, part.name) if build_prefixed else part.name
    return cache_key(manifest.dataset_id, manifest.dataset_version, name)


def kept_keys(dataset_id: str, dataset_version: str) -> set[str]:
    """The keys of a cache that are not parts and that a clean-up of parts never deletes."""
    return {cache_key(dataset_id, dataset_version, name) for name in (MANIFEST_NAME, LEASE_NAME, LEGACY_CACHE_NAME)}


def _split(key: str) -> Optional[tuple[str, str, str]]:
    names = key.split("/")
    return (names[0], names[1], names[2]) if len(names) == 3 else None


def manifest_cache(key: str) -> Optional[tuple[str, str]]:
    """``(id, version)`` when ``key`` (from a listing of the whole store) is a cache's manifest."""
    found = _split(key)
    return (found[0], found[1]) if found is not None and found[2] == MANIFEST_NAME else None


def part_cache(key: str) -> Optional[tuple[str, str]]:
    """``(id, version)`` when ``key`` (from a listing of the whole store) is a part object."""
    found = _split(key)
    if found is None or _PART_MARK not in found[2] or not found[2].endswith(PART_SUFFIX):
        return None
    return found[0], found[1]
