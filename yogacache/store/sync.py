"""Node-local copies of published caches: whether a copy is current, and fetching a build whole.

A copy is current only if its manifest is the published one and every part hashes to the
published content hash -- the (created_at, build_id) pair alone proves nothing about the bytes
beside it. A fetch downloads into a temporary sibling (every part through the one verified
download, ``store.transfers.download_part``), reuses the parts of the same build already here
and verified, then swaps the directory in atomically; readers of the old copy keep reading it.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

from yogacache import redaction
from yogacache.backends.base import ObjectStore, ProgressCallback, is_disk_full
from yogacache.errors import CacheNotFoundError, CorruptCacheError, NoSpaceError, YogaCacheError
from yogacache.format.durability import fsync_path, replace_directory, temp_dir_for, write_file_durably
from yogacache.format.integrity import part_file_verified, stamp_verified
from yogacache.format.manifest import MANIFEST_NAME, Manifest, PartInfo
from yogacache.progress import TransferProgress
from yogacache.store import keys
from yogacache.store.local import CacheStore
from yogacache.store.localroot import read_origin, write_origin
from yogacache.store.publish import remote_manifest, where
from yogacache.store.transfers import download_part, run_transfers

log = redaction.get_logger(__name__)

REPLACED_RETRIES = 3  # a build replaced while it downloads: the newer one is fetched, this often


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


@dataclass(frozen=True)
class LocalCopies:
    """The local copies (``local``) of the caches an object store (``objects``) publishes."""

    objects: ObjectStore
    local: CacheStore
    threads: int
    show_progress: bool
    # Evicts until a copy of this many bytes fits the node's budget (None: no budget).
    make_room: Optional[Callable[[Manifest, int], None]] = None

    def manifest(self, dataset_id: str, dataset_version: str) -> Optional[Manifest]:
        """The local copy's manifest; None when there is none or it cannot be read."""
        try:
            return self.local.manifest(dataset_id, dataset_version)
        except (CacheNotFoundError, CorruptCacheError):
            return None

    def damaged_parts(self, remote: Manifest, *, report: bool = False) -> Optional[list[PartInfo]]:
        """None when the local copy is not of the published build ``remote``; else its parts
        whose bytes do not match the *published* manifest (an empty list: the copy is current).
        This user's verification stamps spare re-hashing unchanged files."""
        dataset_id, dataset_version = remote.dataset_id, remote.dataset_version
        local = self.manifest(dataset_id, dataset_version)
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
                where(self.objects, dataset_id, dataset_version),
            )
        return damaged

    def sync_locked(self, remote: Manifest) -> None:
        """Makes the local copy the published build ``remote`` (the caller holds its local lock);
        a build replaced meanwhile is followed to the newer one."""
        dataset_id, dataset_version = remote.dataset_id, remote.dataset_version
        for _ in range(REPLACED_RETRIES):
            damaged = self.damaged_parts(remote, report=True)
            if damaged == []:
                return  # current (another process of this node may have just fetched it)
            try:
                self.download(remote, damaged=frozenset(part.name for part in damaged or ()))
                return
            except _BuildReplaced as replaced:
                log.info(
                    "%s was replaced by a newer build while downloading; fetching that one",
                    where(self.objects, dataset_id, dataset_version),
                )
                remote = replaced.newer
        raise YogaCacheError(
            f"{where(self.objects, dataset_id, dataset_version)} was replaced {REPLACED_RETRIES} times "
            "while downloading it; try again later"
        )

    def download(self, remote: Manifest, damaged: frozenset[str] = frozenset()) -> None:
        """Fetches the published build ``remote`` into a temporary sibling and swaps it in.

        Parts of the existing copy that are this user's files and already hold the published
        bytes (a heal of a damaged copy) are linked instead of downloaded; ``damaged`` names
        parts already found not to. Every downloaded part is checked against the published size
        and content hash. On the first failure, or Ctrl-C, the other transfers are cancelled and
        the temporary directory is removed.
        """
        dataset_id, dataset_version = remote.dataset_id, remote.dataset_version
        target = self.local.cache_dir(dataset_id, dataset_version)
        remote_url = self.objects.url()
        self.local.clean_leftovers(dataset_id, dataset_version)
        previous_origin = read_origin(target)
        reusable = self._reusable_parts(target, remote, damaged)
        missing = tuple(part for part in remote.parts if part.name not in reusable)
        need = sum(part.size_bytes for part in missing)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if self.make_room is not None:
            self.make_room(remote, need)
        _check_free_space(target.parent, need, dataset_id, dataset_version)
        if previous_origin is not None and previous_origin != remote_url and target.exists():
            log.warning(
                "the local copy %s came from %s; replacing it with the build published at %s. "
                "Two remotes share this local cache directory: give each its own "
                "local_cache_host_path, or the copies replace each other",
                target,
                previous_origin,
                where(self.objects, dataset_id, dataset_version),
            )
        temp = temp_dir_for(target, f"{remote.build_id}-{uuid.uuid4().hex[:8]}")
        temp.mkdir(parents=True, mode=0o755)
        progress = TransferProgress(f"downloading {dataset_id}:{dataset_version}", need, enabled=self.show_progress)
        try:
            for name, path in reusable.items():
                os.link(path, temp / name)

            def fetch(part: PartInfo, on_bytes: ProgressCallback) -> None:
                key = keys.part_key(remote, part)
                download_part(
                    self.objects, key, part, temp / part.name, cache=f"{dataset_id}:{dataset_version}",
                    on_bytes=on_bytes, when_missing=lambda: self._missing(remote, key),
                )

            run_transfers(fetch, missing, threads=self.threads, add_bytes=progress.add)
            stamp_verified(temp, remote)
            write_file_durably(temp / MANIFEST_NAME, remote.to_bytes())
            if remote_url is not None:
                write_origin(temp, remote_url)
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

    def _missing(self, remote: Manifest, key: str) -> BaseException:
        """Why the part object ``key`` of the build ``remote`` is gone: a newer build replaced it
        (fetched instead), or the bucket lost it."""
        newer = remote_manifest(self.objects, remote.dataset_id, remote.dataset_version)
        if newer is not None and newer.freshness != remote.freshness:
            return _BuildReplaced(newer)
        return CorruptCacheError(f"{self.objects.url(key)} is missing although its manifest is published")

    def _reusable_parts(self, target: Path, remote: Manifest, damaged: frozenset[str]) -> dict[str, Path]:
        """Parts of the existing copy of the same build that are this user's regular files and
        verifiably hold the published bytes."""
        local = self.manifest(remote.dataset_id, remote.dataset_version)
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
