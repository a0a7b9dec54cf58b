"""Is a cache built from pinned objects still current? A cheap check on every cache hit.

The check reads no object: it LISTs the prefixes the source listed, finds the other pinned
objects by LIST pages that start at each next pinned key (at most one per 1,000 objects plus
one, whatever else lives beside them), HEADs what those pages do not reach and a single object,
and compares ETag, size and generation with the pins (local files: size and modification time).
An object pinned by ``version_id=`` is checked to still exist in that version. A prefix source
(a local directory too) also notices objects added under it.
What a change does is the cache's ``on_source_change`` (or the caller's): raise, rebuild, warn
or ignore. A check that cannot be made (the bucket unreachable) raises: it is never read as
"unchanged".
"""

from __future__ import annotations

import posixpath
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from yogacache import redaction
from yogacache.backends.base import LIST_PAGE
from yogacache.errors import CacheNotFoundError
from yogacache.format.manifest import Manifest
from yogacache.read.reader import CacheReader
from yogacache.sources.errors import SourceChangedError
from yogacache.sources.objects import Accessors, ObjectRef, SourceStorage, ref_from_pin
from yogacache.sources.source import SOURCES_EXTRA_KEY, check_policy
from yogacache.sources.urls import Location, parse_location
from yogacache.store.base import Store

log = redaction.get_logger(__name__)
SHOWN_CHANGES = 10


@dataclass
class SourceCheck:
    """What a freshness check found: one line per changed object, and the requests it cost."""

    objects: int
    changes: list[str] = field(default_factory=list)
    requests: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.changes)


def pins_of(manifest: Manifest) -> Optional[dict[str, Any]]:
    """The source pins a manifest records, or None for a cache not built from objects."""
    pins = manifest.extra.get(SOURCES_EXTRA_KEY)
    return pins if isinstance(pins, dict) and isinstance(pins.get("objects"), list) else None


def check_pins(pins: dict[str, Any], access: Optional[Accessors] = None) -> SourceCheck:
    """Compares the objects as they are now with ``pins`` (from ``pins_of``).

    Per bucket: each prefix the source listed is listed again (what is under it is the source:
    an object there that is not pinned was added); the other pinned objects are found by LIST
    pages that start at the next pinned key not yet seen (``_walk``), at most one page per 1,000
    of them plus one, so whatever else lives beside them costs nothing; what those pages did not
    reach, an object pinned by version, a single object and local files outside a listed
    directory are HEADed (a local directory is listed like any prefix)."""
    access = access or Accessors(pins.get("endpoint_url"))
    refs = [ref_from_pin(pin, parse_location(str(pin["url"]))) for pin in pins["objects"]]
    fixed = {str(pin["url"]) for pin in pins["objects"] if pin.get("fixed")}
    check = SourceCheck(len(refs))
    groups: dict[tuple[str, str], list[ObjectRef]] = {}
    for ref in refs:
        groups.setdefault((ref.location.scheme, ref.location.bucket), []).append(ref)
    prefixes = [parse_location(str(url)) for url in pins.get("prefixes", [])]
    for (scheme, bucket), members in groups.items():
        storage = access(members[0].location)
        covering = _outermost([_as_prefix(p) for p in prefixes if p.scheme == scheme and p.bucket == bucket])
        current: dict[str, Optional[ObjectRef]] = {}
        by_head = [ref for ref in members if ref.url in fixed]
        listed = [ref for ref in members if ref.url not in fixed]
        pinned = {ref.url for ref in listed}
        for prefix in covering:
            for listed_now in storage.list(prefix):
                current[listed_now.url] = listed_now
                if listed_now.url not in pinned and not listed_now.url.endswith("/"):
                    check.changes.append(f"{listed_now.url}: added")
        outside = [ref for ref in listed if not any(ref.name.startswith(p.key) for p in covering)]
        if len(outside) == 1 or scheme == "file":  # a local file outside a listed directory: a stat each
            by_head += outside
        elif outside:
            found, left = _walk(storage, scheme, bucket, outside)
            current.update(found)
            by_head += left
        for ref in by_head:
            by_version = ref.url in fixed
            current[ref.url] = storage.head(
                ref.location,
                version_id=ref.version_id if by_version else None,
                generation=ref.generation if by_version else None,
            )
        for ref in members:
            now = current.get(ref.url)
            differences = ref.differences(now)
            if differences:
                check.changes.append(f"{ref.url}: {', '.join(differences)}")
    check.requests = access.requests
    return check


def _as_prefix(prefix: Location) -> Location:
    """A listed prefix as a key prefix: a local directory (recorded as its path) ends in ``/``,
    so that ``/data/a`` does not cover ``/data/ab``."""
    if prefix.scheme != "file" or prefix.key.endswith("/"):
        return prefix
    return prefix.child(prefix.key + "/")


def _outermost(prefixes: list[Location]) -> list[Location]:
    """The prefixes not inside another one (each listed once)."""
    keys = sorted({p.key for p in prefixes})
    kept: list[str] = []
    for key in keys:
        if not any(key.startswith(outer) for outer in kept):
            kept.append(key)
    return [Location(prefixes[0].scheme, prefixes[0].bucket, key) for key in kept] if kept else []


def _walk(
    storage: SourceStorage, scheme: str, bucket: str, refs: list[ObjectRef]
) -> tuple[dict[str, Optional[ObjectRef]], list[ObjectRef]]:
    """The pinned objects ``refs`` as they are now (None: deleted), found by LIST pages of their
    common prefix, each starting at the first pinned key not yet seen: a page settles every
    pinned key up to its last key (listed, or deleted), so runs of other objects between pinned
    ones are skipped, not listed. At most ``len(refs) // LIST_PAGE + 1`` pages; the objects they
    did not reach (pinned keys scattered among many others) are returned for a HEAD each."""
    ordered = sorted(refs, key=lambda ref: ref.name)
    prefix = Location(scheme, bucket, posixpath.commonprefix([ref.name for ref in ordered]))
    found: dict[str, Optional[ObjectRef]] = {}
    index = 0
    for _ in range(len(ordered) // LIST_PAGE + 1):
        if index == len(ordered):
            break
        page, more = storage.list_from(prefix, ordered[index].name)
        if more and not page:
            break
        seen = {ref.name: ref for ref in page}
        last = page[-1].name if more else None
        settled = index
        while index < len(ordered) and (last is None or ordered[index].name <= last):
            found[ordered[index].url] = seen.get(ordered[index].name)
            index += 1
        if index == settled:  # the page ended below the next pinned key: HEAD the rest
            break
    return found, ordered[index:]


def describe_changes(dataset_id: str, dataset_version: str, check: SourceCheck) -> str:
    shown = "; ".join(check.changes[:SHOWN_CHANGES])
    more = f" (and {len(check.changes) - SHOWN_CHANGES} more)" if len(check.changes) > SHOWN_CHANGES else ""
    return (
        f"the source objects of cache {dataset_id}:{dataset_version} changed since it was built: {shown}{more}. "
        "The cache holds the old data. To proceed: rebuild it (on_source_change='rebuild', or "
        f"'yogacache rm {dataset_id} {dataset_version}' and build again), cache the new data under a new "
        "version (version='auto' derives one from the sources), or keep serving the old data "
        "(on_source_change='ignore')"
    )


def ensure_fresh(
    store: Store,
    dataset_id: str,
    dataset_version: str,
    reader: CacheReader,
    make_data: Callable[[], Any],
    on_source_change: Optional[str] = None,
) -> CacheReader:
    """``reader`` if its cache is not built from pinned objects or they are unchanged; otherwise
    what ``on_source_change`` (default: the one the cache was built with) says: raise
    SourceChangedError, rebuild from ``make_data()`` and return a reader of the new cache, or
    warn (or say nothing) and return ``reader``."""
    checked = checked_manifest(store, dataset_id, dataset_version, reader.manifest, make_data, on_source_change)
    if checked.build_id == reader.manifest.build_id:
        return reader
    reader.close()
    return store.open(dataset_id, dataset_version)


def check_before_sync(
    store: Store,
    dataset_id: str,
    dataset_version: str,
    make_data: Callable[[], Any],
    on_source_change: Optional[str] = None,
) -> Optional[str]:
    """For a store with a remote and a node without a local copy: the source check of the
    *published* cache, before the hit downloads it (a stale cache is then never fetched only to
    be rebuilt or refused). Returns the build id that passed the check (or was rebuilt), so that
    the hit does not check it again; None if nothing is published, the store has no remote, or
    a local copy exists (the hit then costs its one manifest read, and checks what it opens)."""
    remote = store.remote
    if remote is None or remote.local_manifest(dataset_id, dataset_version) is not None:
        return None
    try:
        published = store.manifest(dataset_id, dataset_version)
    except CacheNotFoundError:
        return None
    return checked_manifest(store, dataset_id, dataset_version, published, make_data, on_source_change).build_id


def checked_manifest(
    store: Store,
    dataset_id: str,
    dataset_version: str,
    manifest: Manifest,
    make_data: Callable[[], Any],
    on_source_change: Optional[str] = None,
) -> Manifest:
    """``manifest`` if its cache is not built from pinned objects, they are unchanged, or the
    policy keeps it (``warn``, ``ignore``); raises SourceChangedError (``error``); else the
    manifest of the cache rebuilt from ``make_data()`` (``rebuild``)."""
    pins = pins_of(manifest)
    if pins is None:
        return manifest
    policy = check_policy(on_source_change or str(pins.get("on_source_change", "error")))
    if policy == "ignore":
        return manifest
    check = check_pins(pins)
    log.debug(
        "source check of %s:%s: %d objects, %d requests", dataset_id, dataset_version, check.objects, check.requests
    )
    if not check.changed:
        return manifest
    message = describe_changes(dataset_id, dataset_version, check)
    if policy == "error":
        raise SourceChangedError(message)
    if policy == "warn":
        warnings.warn(message, UserWarning, stacklevel=4)
        log.warning("%s", message)
        return manifest
    log.warning(
        "rebuilding %s:%s: its source objects changed (%s)",
        dataset_id,
        dataset_version,
        "; ".join(check.changes[:SHOWN_CHANGES]),
    )
    current = store.manifest(dataset_id, dataset_version)
    if current.build_id != manifest.build_id:  # another process rebuilt it meanwhile
        pins = pins_of(current)
        if pins is not None and not check_pins(pins).changed:
            return current
    return store.build(dataset_id, dataset_version, make_data())
