"""Copying a published cache to another storage: parts first, checked against the CRC32C the
destination computed, then the manifest by a conditional create.

The copy keeps the cache's identity (``build_id``, ``created_at``, part hashes), so a node
syncing from the destination sees the same build as one syncing from the source. Steps:

1. Read the source manifest; read the destination's. The same build there: only check (and
   repair) its parts. Another build: refused unless ``replace``.
2. Per part, in parallel: a destination object of the right size whose CRC32C (as the
   destination reports it, no bytes read) equals the manifest's is kept (this is what makes an
   interrupted copy resumable). Otherwise the part is copied server-side where both ends are on
   one service (S3 CopyObject / UploadPartCopy within one endpoint, GCS rewrite, Azure Copy
   Blob) and its CRC32C is known, else streamed through this process without touching its disk,
   its content hash and CRC32C computed on the way.
3. Every copied part's destination CRC32C is compared with the expected one. A server-side copy
   that carries no CRC32C (an Azure blob another tool rewrote keeps none) is not taken on trust:
   the part is streamed instead, its content hash checked. A part that does not match its
   manifest refuses the copy, naming the part; the parts this copy wrote are deleted.
4. The manifest, with each part's CRC32C added, is created conditionally (``If-None-Match`` /
   ``ifGenerationMatch=0``), or replaces exactly the build seen in step 1: of two concurrent
   copies one publishes and the other finds the same build published.

An interrupted copy leaves part objects but no manifest: readers of the destination see nothing,
and running the copy again resumes. A later publish of the destination removes parts no manifest
names (``store.publish``'s clean-up).
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, ContextManager, Mapping, Optional, Union, cast

from yogacache import redaction
from yogacache.backends.base import (
    DEFAULT_TRANSFER_THREADS,
    CopyableObjectStore,
    ObjectChecksum,
    RemoteError,
)
from yogacache.errors import CacheNotFoundError, ConfigError, CorruptCacheError, YogaCacheError
from yogacache.format.checksum import encode_crc32c
from yogacache.format.manifest import Manifest, PartInfo
from yogacache.progress import TransferProgress, waiter
from yogacache.safefs import make_directories
from yogacache.store import keys, publish
from yogacache.store.lease import DEFAULT_LEASE_SECONDS, Lease, LeaseTimes
from yogacache.store.transfers import HashedChunks, run_transfers, stream_part

log = redaction.get_logger(__name__)

COPY_THREADS = 2 * DEFAULT_TRANSFER_THREADS  # parts copied at once


class CopyRefusedError(YogaCacheError):
    """The destination holds another build of the cache; replacing it was not asked for."""


class CopyConflictError(YogaCacheError):
    """Another process published a different build at the destination while this copy ran."""


@dataclass(frozen=True)
class CacheLocation:
    """Where caches live in one storage: its object store and how part objects are named.

    Buckets (and ``file://`` URLs) name parts ``<id>/<version>/<build id>-part-NNNNN.mdb``;
    a shared_fs directory holds sealed cache directories, ``<id>/<version>/part-NNNNN.mdb``.
    """

    objects: CopyableObjectStore
    build_prefixed: bool = True

    def url(self, key: str = "") -> str:
        return self.objects.url(key)

    def cache_key(self, dataset_id: str, dataset_version: str, name: str = "") -> str:
        return keys.cache_key(dataset_id, dataset_version, name)

    def manifest_key(self, dataset_id: str, dataset_version: str) -> str:
        return keys.manifest_key(dataset_id, dataset_version)

    def part_key(self, manifest: Manifest, part: PartInfo) -> str:
        return keys.part_key(manifest, part, build_prefixed=self.build_prefixed)

    def published(self, dataset_id: str, dataset_version: str) -> tuple[Optional[str], Optional[Manifest]]:
        """(version token, manifest) of the published manifest (``publish.published``)."""
        return publish.published(self.objects, dataset_id, dataset_version)


Target = Union[CacheLocation, str, "os.PathLike[str]", Mapping[str, Any], Any]


def open_location(target: Target, *, endpoint_url: Optional[str] = None, create: bool = False) -> CacheLocation:
    """The storage ``target`` names: what ``store.target.parse_target`` reads (a URL, a
    ``data_layer`` mapping or config file, a shared_fs directory, which must exist unless
    ``create``: a copy's destination directory is made, as ``export --to`` makes its own), an
    object store (bucket layout), or a remote store."""
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.target import parse_target

    if isinstance(target, CacheLocation):
        return target
    if hasattr(target, "read_chunks") and hasattr(target, "copy_from"):  # a CopyableObjectStore
        return CacheLocation(cast(CopyableObjectStore, target))
    objects = getattr(target, "objects", None)
    if objects is not None:  # a RemoteCacheStore
        return CacheLocation(cast(CopyableObjectStore, objects))
    location = parse_target(target, endpoint_url=endpoint_url, must_exist=not create)
    if location.url is not None:
        return CacheLocation(cast(CopyableObjectStore, location.open_backend()))
    if location.directory is not None:
        if create:
            make_directories(location.directory)
        return CacheLocation(FileObjectStore(location.directory), build_prefixed=False)
    if location.config is None:
        raise ConfigError("a copy needs a storage to copy from and one to copy to, not the local default")
    raise ConfigError("a shared_fs storage to copy with needs host_storage_path")


@dataclass
class CopyReport:
    """What one copy did."""

    dataset_id: str
    dataset_version: str
    build_id: str
    source: str
    destination: str
    copied_server_side: list[str] = field(default_factory=list)
    streamed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # present and verified at the destination
    bytes_through_client: int = 0
    published: bool = False  # this copy created (or replaced) the destination's manifest
    replaced_build: Optional[str] = None
    # Copied server-side, then read back: the destination reported a CRC32C that is not the
    # CRC32C of bytes that match the manifest (an endpoint computing another checksum).
    read_back: list[str] = field(default_factory=list)
    wrong_checksum: Optional[str] = None  # what the endpoint computes instead, where recognised

    @property
    def copied(self) -> list[str]:
        return sorted(self.copied_server_side + self.streamed)


def copy_cache(
    source: Target,
    destination: Target,
    dataset_id: str,
    dataset_version: str,
    *,
    replace_other: bool = False,
    threads: int = COPY_THREADS,
    show_progress: bool = True,
    endpoint_url: Optional[str] = None,
    lease: Optional[Lease] = None,
) -> CopyReport:
    """Copies the cache published at ``source`` to ``destination`` (see the module doc).

    The copy holds the destination's build lease (a shared_fs directory's build lock), the one
    ``get_or_build`` takes there: a node that would build the cache at the destination meanwhile
    waits, then reads the copy. ``lease``: that lease, already held by the caller (a mirror fill).

    Raises CacheNotFoundError when the source has no such cache, CopyRefusedError when the
    destination holds another build and ``replace_other`` is false, CorruptCacheError when a
    source part does not match its manifest or a destination part does not match after the copy.
    """
    src = open_location(source, endpoint_url=endpoint_url)
    dst = open_location(destination, endpoint_url=endpoint_url, create=True)
    keys.cache_key(dataset_id, dataset_version)  # validates both names
    manifest, _ = _source_manifest(src, dataset_id, dataset_version)
    if any(part.crc32c is None for part in manifest.parts):
        manifest = add_checksums(src, dataset_id, dataset_version, threads=threads)
    report = CopyReport(dataset_id, dataset_version, manifest.build_id, src.url(), dst.url())
    with contextlib.nullcontext(lease) if lease is not None else _destination_lease(dst, manifest):
        _copy_holding_lease(src, dst, manifest, report, replace_other, threads, show_progress)
    return report


def _destination_lease(dst: CacheLocation, manifest: Manifest) -> ContextManager[Any]:
    """What a builder at ``dst`` holds while it writes the cache: the build lease object of a
    bucket (or a ``file://`` bucket layout), the build lock of a shared_fs directory."""
    dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
    if not dst.build_prefixed:
        from yogacache.store.local import CacheStore

        root = cast(Any, dst.objects).root
        return CacheStore(root, show_progress=False).lock(
            dataset_id, dataset_version, on_wait=waiter(dataset_id, dataset_version)
        )
    return publish.holding_lease(
        dst.objects,
        dataset_id,
        dataset_version,
        LeaseTimes(DEFAULT_LEASE_SECONDS),
        build_id=manifest.build_id,
        doing="copying",
        remove_on_failure=True,  # a failed copy leaves nothing at the destination
    )


def _copy_holding_lease(
    src: CacheLocation,
    dst: CacheLocation,
    manifest: Manifest,
    report: CopyReport,
    replace_other: bool,
    threads: int,
    show_progress: bool,
) -> None:
    """Steps 1 (the destination's side) to 4 of the module doc; the caller holds the lease."""
    dataset_id, dataset_version = manifest.dataset_id, manifest.dataset_version
    token, existing = dst.published(dataset_id, dataset_version)
    same = existing is not None and existing.freshness == manifest.freshness
    if token is not None and not same:
        what = f"build {existing.build_id} (created {existing.created_at})" if existing else "an unreadable manifest"
        if not replace_other:
            raise CopyRefusedError(
                f"{dst.url(dst.cache_key(dataset_id, dataset_version))} holds {what}, not build "
                f"{manifest.build_id} of {src.url(src.cache_key(dataset_id, dataset_version))}; "
                "nothing was copied. Pass --replace (replace_other=True) to replace it"
            )
        if not dst.build_prefixed:
            raise CopyRefusedError(
                f"{dst.url(dst.cache_key(dataset_id, dataset_version))} holds {what}; a shared_fs "
                "cache is not replaced in place under its readers: remove it first (yogacache rm)"
            )
    try:
        parts = _copy_parts(src, dst, manifest, report, threads=threads, show_progress=show_progress)
    except Exception:
        # Refused or failed: no manifest names this build's parts at the destination, so they
        # go (with the lease, released by the caller). An interrupted copy (Ctrl-C, SIGTERM:
        # not an Exception) keeps them, and the same command resumes it.
        if not same:
            _remove_parts(dst, manifest)
        raise
    _say_read_back(dst, report)
    copied = replace(manifest, parts=parts)
    if same:
        log.info("%s already holds build %s; its parts were checked", dst.url(), manifest.build_id)
        return
    key = dst.manifest_key(dataset_id, dataset_version)
    if not publish.commit_manifest(dst.objects, copied, replacing=token):
        _, now = dst.published(dataset_id, dataset_version)
        if now is not None and now.freshness == manifest.freshness:
            log.info("another copy published build %s at %s first", manifest.build_id, dst.url(key))
            return
        raise CopyConflictError(
            f"another process published {dst.url(key)} while this copy of build {manifest.build_id} "
            "ran; the other build stays published. Its parts were copied and are removed by the "
            "next publish there"
        )
    report.published = True
    if existing is not None and existing.build_id != manifest.build_id and dst.build_prefixed:
        report.replaced_build = existing.build_id
        publish.delete_build_parts(dst.objects, dataset_id, dataset_version, existing.build_id)


def _remove_parts(dst: CacheLocation, manifest: Manifest) -> None:
    """Deletes the part objects of ``manifest`` at ``dst`` (a refused copy's): with the
    destination's lease held and no manifest naming them, they are nobody's."""
    for part in manifest.parts:
        try:
            dst.objects.delete(dst.part_key(manifest, part))
        except RemoteError as error:
            log.warning("could not delete %s (%s)", dst.url(dst.part_key(manifest, part)), error)


def add_checksums(
    target: Target,
    dataset_id: str,
    dataset_version: str,
    *,
    threads: int = COPY_THREADS,
    endpoint_url: Optional[str] = None,
) -> Manifest:
    """Adds each part's CRC32C to the manifest of the cache published at ``target`` (caches built
    before manifests carried it); returns the manifest with them.

    The CRC32C is the one the store computes (GCS always has it; an S3 object without one is
    copied onto itself with CRC32C, server-side; a directory computes it); only where the store
    cannot is the part read, and then its content hash is checked on the way. Where the store refuses
    (a read-only bucket) the part keeps no CRC32C here, with a warning. The manifest is
    rewritten conditionally on the version read, with the same build id and creation time: nodes
    holding a copy of the build keep it. Where it cannot be rewritten (no permission, or it
    changed meanwhile) the checksums are still returned, and a warning says so.
    """
    location = open_location(target, endpoint_url=endpoint_url)
    key = location.manifest_key(dataset_id, dataset_version)
    manifest, token = _source_manifest(location, dataset_id, dataset_version)
    missing = [part for part in manifest.parts if part.crc32c is None]
    if not missing:
        return manifest

    def checksum(part: PartInfo) -> PartInfo:
        part_key = location.part_key(manifest, part)
        try:
            reported = location.objects.ensure_checksum(part_key)
        except RemoteError as error:
            # Typically a source this process may read but not write: the copy computes the
            # CRC32C on its own way instead (streamed), or takes the destination's (server-side).
            log.warning("could not have %s compute a CRC32C of %s: %s", location.url(), part_key, error)
            return part
        if reported is None or reported.size != part.size_bytes:
            raise CorruptCacheError(
                f"part {part.name} of {location.url(key)} is missing or not {part.size_bytes} bytes at "
                f"{location.url(part_key)}"
            )
        if reported.crc32c is not None:
            return replace(part, crc32c=reported.crc32c)
        hashed = HashedChunks(
            location.objects.read_chunks(part_key), part.hash_name, size=part.size_bytes, url=location.url(part_key)
        )
        for _ in hashed:
            pass
        if hashed.digest != part.digest or hashed.size != part.size_bytes:
            raise CorruptCacheError(f"part {part.name} at {location.url(part_key)} does not match its manifest")
        return replace(part, crc32c=hashed.crc32c)

    found = run_transfers(
        lambda part, on_bytes: checksum(part), missing, threads=threads, add_bytes=lambda n: None, name="yogacache-crc"
    )
    added = dict(zip([part.name for part in missing], found))
    if all(part.crc32c is None for part in added.values()):
        return manifest  # the store computed none: nothing to record
    updated = replace(manifest, parts=tuple(added.get(part.name, part) for part in manifest.parts))
    try:
        written = publish.commit_manifest(location.objects, updated, replacing=token)
    except RemoteError as error:
        written = False
        log.warning("could not add CRC32Cs to %s (%s); they are used for this copy only", location.url(key), error)
    if written:
        log.info("added the CRC32C of %d part(s) to %s", len(missing), location.url(key))
    return updated


def _source_manifest(src: CacheLocation, dataset_id: str, dataset_version: str) -> tuple[Manifest, str]:
    """The manifest published at ``src`` and its version token (``publish.read_published``);
    CacheNotFoundError when there is none."""
    found = publish.read_published(src.objects, dataset_id, dataset_version)
    if found is None:
        raise CacheNotFoundError(
            f"no cache for dataset {dataset_id!r} version {dataset_version!r} at "
            f"{src.url(src.cache_key(dataset_id, dataset_version))}"
        )
    return found


def _copy_parts(
    src: CacheLocation,
    dst: CacheLocation,
    manifest: Manifest,
    report: CopyReport,
    *,
    threads: int,
    show_progress: bool,
) -> tuple[PartInfo, ...]:
    """Copies (or keeps) every part; returns the parts with their CRC32C filled in."""
    progress = TransferProgress(
        f"copying {manifest.dataset_id}:{manifest.dataset_version}", manifest.total_size_bytes, enabled=show_progress
    )
    lock = threading.Lock()
    if not manifest.parts:
        return ()
    # One listing says which parts are there at all: only those are asked for their checksum.
    listed = {
        info.key: info.size for info in dst.objects.list(dst.cache_key(manifest.dataset_id, manifest.dataset_version))
    }
    try:
        copied = run_transfers(
            lambda part, on_bytes: _copy_part(src, dst, manifest, part, report, lock, on_bytes, listed),
            manifest.parts,
            threads=threads,
            add_bytes=progress.add,
            name="yogacache-copy",
        )
    except BaseException:
        progress.close()
        raise
    progress.finish()
    return tuple(copied)


def _copy_part(
    src: CacheLocation,
    dst: CacheLocation,
    manifest: Manifest,
    part: PartInfo,
    report: CopyReport,
    lock: threading.Lock,
    on_bytes: Any,
    listed: dict[str, int],
) -> PartInfo:
    source_key, key = src.part_key(manifest, part), dst.part_key(manifest, part)
    expected = part.crc32c  # None only where the source could not compute one (add_checksums)
    present = dst.objects.checksum(key) if listed.get(key) == part.size_bytes else None
    if present is not None and present.size == part.size_bytes and expected and present.crc32c == expected:
        with lock:
            report.kept.append(part.name)
        on_bytes(part.size_bytes)
        return part
    if present is not None:
        log.info(
            "part %s at %s differs from the source (or cannot be checked); copying it again", part.name, dst.url(key)
        )
    # A server-side copy is verified by the checksum the destination computes, so it needs the
    # CRC32C to compare with; without one, the part is streamed and its content hash checked.
    if expected is not None and dst.objects.copy_from(
        src.objects, source_key, key, size=part.size_bytes, crc32c=expected, progress=on_bytes
    ):
        after = dst.objects.checksum(key)
        if after is not None and after.size == part.size_bytes and after.crc32c is None:
            # The copy carries no CRC32C: the source object was not written by yogacache (Azure
            # keeps ours in metadata that another writer replaces) or S3 composed one. Nothing
            # vouches for its bytes: it is streamed instead, its content hash checked on the way.
            log.info("part %s copied to %s carries no CRC32C; streaming it to check it", part.name, dst.url(key))
            dst.objects.delete(key)
            on_bytes(-part.size_bytes)
        else:
            if after is not None and after.crc32c not in (None, expected):
                after = _read_back(dst, key, part, after.crc32c, expected, report, lock)
            _check_copied(dst, key, part, after, expected)
            with lock:
                report.copied_server_side.append(part.name)
            return part
    computed = stream_part(src.objects, dst.objects, source_key, key, part, on_bytes)
    if expected is not None and computed != expected:
        raise CorruptCacheError(
            f"part {part.name} at {src.url(source_key)} has CRC32C {computed}, its manifest says "
            f"{expected}: the source is damaged; nothing was published"
        )
    _check_copied(dst, key, part, dst.objects.checksum(key), computed)
    with lock:
        report.streamed.append(part.name)
        report.bytes_through_client += part.size_bytes
    return replace(part, crc32c=computed)


def _read_back(
    dst: CacheLocation,
    key: str,
    part: PartInfo,
    reported: Optional[str],
    expected: str,
    report: CopyReport,
    lock: threading.Lock,
) -> ObjectChecksum:
    """The destination reported CRC32C ``reported`` for a part copied server-side, not the
    manifest's ``expected``: the part is read back and checked here (size, content hash, CRC32C).
    CorruptCacheError when its bytes differ; else the endpoint computes another checksum under
    CRC32C's name, and the part's true checksum is returned (``copy_cache`` says so once)."""
    hashed = HashedChunks(dst.objects.read_chunks(key), part.hash_name, size=part.size_bytes, url=dst.url(key))
    crc32 = 0
    for chunk in hashed:
        crc32 = zlib.crc32(chunk, crc32)
    if hashed.size != part.size_bytes or hashed.digest != part.digest or hashed.crc32c != expected:
        raise CorruptCacheError(
            f"part {part.name} at {dst.url(key)} has CRC32C {reported} after the copy, not {expected}, "
            "and its bytes do not match the manifest: nothing was published"
        )
    with lock:
        report.read_back.append(part.name)
        if reported == encode_crc32c(crc32):
            report.wrong_checksum = "CRC32"
    return ObjectChecksum(hashed.size, expected)


def _say_read_back(dst: CacheLocation, report: CopyReport) -> None:
    """One warning for the parts ``_read_back`` checked: what is wrong with the endpoint, the cure."""
    if not report.read_back:
        return
    endpoint = getattr(dst.objects, "endpoint", None) or dst.url()
    if report.wrong_checksum == "CRC32":
        what = (
            "the CRC32 of their bytes, not their CRC32C (a moto server computes that when its crc32c "
            "module is missing: pip install 'moto[s3crc32c]' where the server runs)"
        )
    else:
        what = "a checksum that is not the CRC32C of their bytes"
    log.warning(
        "%s reports as CRC32C %s of %d part(s) copied to %s; each was read back and matches the "
        "manifest's size, content hash and CRC32C, so the copy was published with the true CRC32Cs, "
        "but this endpoint's own checksums cannot verify copies there (check_copy reports these parts)",
        endpoint,
        what,
        len(report.read_back),
        dst.url(dst.cache_key(report.dataset_id, report.dataset_version)),
    )


def _check_copied(dst: CacheLocation, key: str, part: PartInfo, after: Any, expected: Optional[str]) -> None:
    """CorruptCacheError unless the destination reports the part's size and CRC32C."""
    if after is None or after.size != part.size_bytes:
        raise CorruptCacheError(
            f"part {part.name} is not at {dst.url(key)} with its {part.size_bytes} bytes after the copy"
        )
    if expected is not None and after.crc32c is not None and after.crc32c != expected:
        raise CorruptCacheError(
            f"part {part.name} at {dst.url(key)} has CRC32C {after.crc32c} after the copy, not {expected}"
        )


def check_copy(
    target: Target, dataset_id: str, dataset_version: str, *, endpoint_url: Optional[str] = None
) -> list[str]:
    """The parts of the cache published at ``target`` whose size or CRC32C, as the store itself
    reports them (no bytes read from a bucket), differ from the manifest; empty when all match.
    An object without a CRC32C where the manifest has one was rewritten since: it counts as
    damaged. Parts whose manifest has no CRC32C (caches never copied) are checked by size only."""
    location = open_location(target, endpoint_url=endpoint_url)
    manifest, _ = _source_manifest(location, dataset_id, dataset_version)
    damaged = []
    for part in manifest.parts:
        found = location.objects.checksum(location.part_key(manifest, part))
        if found is None or found.size != part.size_bytes:
            damaged.append(part.name)
        elif part.crc32c is not None and found.crc32c != part.crc32c:
            damaged.append(part.name)  # another CRC32C, or none: rewritten since it was copied
    return damaged
