"""The eviction policy of a remote store's node-local data: what may go, what ``gc`` removes,
and what ``ls`` shows as local bytes and "in use".

A whole local copy may be evicted only when it is not the only copy: it came from (or was
published to) this remote, and the remote still publishes that very build. Streamed parts are
always copies of published objects. Nothing a live process holds is ever evicted
(``store.budget`` leases). A ``CacheStore`` (``shared_fs`` or a local directory) holds only
copies that are the only ones: ``gc`` never removes anything from it.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from yogacache import redaction
from yogacache.errors import CacheNotFoundError, CorruptCacheError, NoSpaceError, YogaCacheError
from yogacache.format.durability import TRASH_MARK
from yogacache.format.manifest import Manifest
from yogacache.locks import FileLock, LockTimeoutError
from yogacache.sizes import format_size
from yogacache.store import budget
from yogacache.store.base import RemoteStore
from yogacache.store.localroot import read_origin

log = redaction.get_logger(__name__)

COPY_ROOM_WAIT_SECONDS = 60.0


def copy_is_evictable(store: Any, item: budget.LocalItem) -> bool:
    """Whether the whole local copy ``item`` is a copy of the build ``store`` publishes."""
    if item.kind != "copy":
        return True
    try:
        local = Manifest.load(item.path)
    except (CacheNotFoundError, CorruptCacheError, YogaCacheError, OSError):
        return False
    if read_origin(item.path) != store.remote_url:
        return False  # unknown origin, or another remote's: maybe the only copy
    try:
        remote = store.remote_manifest(item.dataset_id, item.dataset_version)
    except YogaCacheError:
        return False  # cannot tell: keep it
    return remote is not None and remote.freshness == local.freshness


def remove_copy(store: Any, item: budget.LocalItem) -> bool:
    """Removes a whole local copy under its cache lock; False when that lock is busy (it is
    being built or downloaded)."""
    lock = FileLock(store.local.lock_path(item.dataset_id, item.dataset_version), timeout=0, prune_parent=True)
    try:
        lock.acquire()
    except LockTimeoutError:
        return False
    try:
        # As CacheStore.remove_directory, under the lock already held: unpublish, then delete.
        store.local._check_removable(item.dataset_id, item.dataset_version)
        trash = item.path.parent / f".{item.path.name}{TRASH_MARK}evict-{os.getpid()}"
        os.rename(item.path, trash)
        shutil.rmtree(trash, ignore_errors=True)
    finally:
        lock.release()
    return True


def make_room_for_copy(store: Any, remote: Manifest, need: int) -> None:
    """Evicts until a whole copy of ``need`` bytes fits under the store's budget; NoSpaceError
    when it cannot (the rest is in use or the only copy)."""
    limit = store.local_cache_limit
    if need > limit:  # nothing to wait for: no eviction ever makes room for it
        raise NoSpaceError(
            f"{remote.dataset_id}:{remote.dataset_version} is {format_size(need)} ({need} bytes), larger than "
            f"local_cache_limit {format_size(limit)} ({limit} bytes): a whole copy of it never fits on this "
            "node. Read it streamed instead (opening it streams a cache larger than the budget, part by "
            "part), or raise local_cache_limit"
        )
    deadline = time.monotonic() + COPY_ROOM_WAIT_SECONDS
    while True:
        if budget.make_room(
            store.local.root,
            need,
            limit,
            copy_is_evictable=lambda item: copy_is_evictable(store, item),
            remove_copy=lambda item: remove_copy(store, item),
        ):
            return
        if time.monotonic() > deadline:
            raise NoSpaceError(
                f"local_cache_limit {format_size(limit)} has no room for {remote.dataset_id}:"
                f"{remote.dataset_version} ({format_size(need)}): the rest of {store.local.root} is in "
                "use by live processes or the only copy of a cache; raise local_cache_limit or "
                'stream the cache ("streaming": true)'
            )
        time.sleep(0.2)


@dataclass(frozen=True)
class CollectResult:
    """What ``gc`` removed (or would remove, with ``dry_run``), and the usage before and after."""

    evicted: list[budget.Eviction]
    before: int
    after: int
    limit: int
    kept_in_use: int  # bytes held by live processes
    stranded: list[str] = field(default_factory=list)  # remote part objects no manifest names


def collect(store: RemoteStore, limit: int, *, dry_run: bool = False) -> CollectResult:
    """Brings the node-local data of ``store`` under ``limit`` by the eviction policy, and removes
    the remote's part objects no published manifest names (``RemoteStore.remove_stranded``).

    Only a remote store has copies to collect: a shared_fs or local store's caches are the only
    ones (``store.remote`` is None there, and nothing calls this)."""
    root = store.local.root
    stranded = store.remove_stranded(dry_run=dry_run)
    with budget.budget_lock(root):
        items = budget.local_items(root)
        leases = budget.live_leases(root)
        before = sum(item.size for item in items)
        chosen, after = budget.choose_evictions(
            items, leases, 0, limit, copy_is_evictable=lambda item: copy_is_evictable(store, item)
        )
        done = []
        for eviction in chosen:
            if dry_run or budget.remove_item(root, eviction.item, lambda item: remove_copy(store, item)):
                done.append(eviction)
            else:
                after += eviction.item.size
        in_use = sum(item.size for item in items if item.item in leases.held)
    return CollectResult(done, before, after, limit, in_use, stranded)


@dataclass(frozen=True)
class LocalUsage:
    """One cache's node-local bytes (whole copy and streamed parts) and whether it is in use."""

    copy_bytes: int
    part_bytes: int
    in_use: bool

    @property
    def total(self) -> int:
        return self.copy_bytes + self.part_bytes


def local_usage(root: Any) -> dict[tuple[str, str], LocalUsage]:
    """Per ``(id, version)``: local bytes and whether a live process reads it."""
    from pathlib import Path

    root = Path(root)
    if not root.is_dir():
        return {}
    items = budget.local_items(root)
    leases = budget.live_leases(root)
    found: dict[tuple[str, str], list[int]] = {}
    for item in items:
        entry = found.setdefault((item.dataset_id, item.dataset_version), [0, 0, 0])
        entry[0 if item.kind == "copy" else 1] += item.size
        if item.item in leases.held:
            entry[2] = 1
    for held in leases.held:
        pieces = held.split("/")
        key: Optional[tuple[str, str]] = None
        if pieces[0] == budget.PARTS_DIR and len(pieces) >= 3:
            key = (pieces[1], pieces[2])
        elif len(pieces) == 2:
            key = (pieces[0], pieces[1])
        if key in found:
            found[key][2] = 1
    return {key: LocalUsage(value[0], value[1], bool(value[2])) for key, value in found.items()}
