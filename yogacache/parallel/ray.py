"""Many nodes on Ray: build shards run as Ray tasks, or a Ray Dataset written by ``CacheDatasink``.

Every task writes its shard's parts on its own node and uploads them straight to the target
storage (S3, GCS, or a shared directory as ``file://``) under names unique to the attempt:
``<id>/<version>/<build id>-part-SSSSS-NNN-<attempt>.mdb``. Ray re-runs a task whose worker
died; a re-run writes the same records under other names, and the driver, which collects the
results, lists exactly one attempt per build shard, in shard order (Ray hands results back in
completion order: each carries its shard index). The manifest is created last, conditionally
(S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), exactly as a one-process publish does.
Afterwards every part object the manifest does not name (killed attempts) is deleted; a failed
job deletes what it uploaded and publishes nothing. A killed driver leaves parts but no
manifest: nothing is visible, and the next publish of the cache deletes them.

``import ray`` happens here only (``pip install 'yogacache[ray]'``).
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

from yogacache import redaction
from yogacache.backends.base import DEFAULT_TRANSFER_THREADS
from yogacache.errors import BuildError, ConfigError, YogaCacheError
from yogacache.format.manifest import Manifest
from yogacache.format.writer import DEFAULT_PART_SIZE
from yogacache.parallel.pool import ProgressTotals, ShardProgress
from yogacache.parallel.shards import (
    BuildShard,
    BuildShardError,
    ShardResult,
    assemble_manifest,
    known_offsets,
    write_shard,
)
from yogacache.progress import Progress
from yogacache.sizes import parse_part_bytes
from yogacache.store import RemoteStore, open_store
from yogacache.store.keys import cache_key, part_object_name
from yogacache.store.publish import delete_build_parts, publish_manifest
from yogacache.store.target import parse_target
from yogacache.store.transfers import upload_files

log = redaction.get_logger(__name__)

INSTALL_HINT = "building with Ray needs Ray Data: pip install 'yogacache[ray]'"
DEFAULT_MAX_RETRIES = 3  # Ray re-runs of a task whose worker died


class CacheExistsError(YogaCacheError):
    """The cache is already published: a Ray build creates, it never replaces."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error
    return ray


def _remote_store(target: Any) -> RemoteStore:
    """The remote store of ``target``; ConfigError for a plain directory (tasks on other nodes
    could not publish into it: a shared directory is given as a ``file://`` URL)."""
    store = open_store(target, show_progress=False)
    if store.remote is None:
        raise ConfigError(
            f"a Ray build writes to remote storage (s3://, gs://, or file:///shared/dir for a directory every "
            f"node mounts), not to the local directory {store.root}"
        )
    return store.remote


class _Publication:
    """One Ray build's parts in the target storage, and its commit (driver side)."""

    def __init__(self, target: Any, dataset_id: str, dataset_version: str, build_id: Optional[str] = None) -> None:
        self.store = _remote_store(target)
        self.dataset_id = dataset_id
        self.dataset_version = dataset_version
        self.build_id = build_id or uuid.uuid4().hex

    @property
    def where(self) -> str:
        return str(self.store.location(self.dataset_id, self.dataset_version))

    def check_absent(self) -> None:
        if self.store.remote_manifest(self.dataset_id, self.dataset_version) is not None:
            raise CacheExistsError(
                f"{self.where} is already published; a Ray build creates caches and never replaces one: "
                f"remove it first (yogacache rm {self.dataset_id} {self.dataset_version} --remote)"
            )

    def commit(self, results: Sequence[ShardResult], extra: Optional[dict[str, Any]] = None) -> Manifest:
        """Creates the manifest listing ``results`` (one per shard) conditionally; then deletes every
        part object it does not name. CacheExistsError (after deleting this build's parts) when
        another builder published first."""
        manifest = assemble_manifest(
            results, self.dataset_id, self.dataset_version, build_id=self.build_id, extra=extra
        )
        if not publish_manifest(self.store.objects, manifest):  # then deletes killed attempts' parts
            self.abort()
            raise CacheExistsError(f"another builder published {self.where} first; this build was not published")
        return manifest

    def abort(self) -> None:
        """Deletes every part object this build uploaded (best effort: a killed driver's are
        deleted by the next publish)."""
        delete_build_parts(self.store.objects, self.dataset_id, self.dataset_version, self.build_id)


class ProgressBoard:
    """A Ray actor (no CPU) where tasks post their shard's records and bytes as they write; the
    driver reads the totals to show records, bytes, rate and ETA across every worker."""

    def __init__(self) -> None:
        self.shards: dict[int, tuple[int, int]] = {}

    def post(self, index: int, records: int, size: int) -> None:
        self.shards[index] = (records, size)

    def totals(self) -> dict[int, tuple[int, int]]:
        return dict(self.shards)


class _Poster:
    """Posts a task's progress to the board, at most a few times a second."""

    def __init__(self, board: Any) -> None:
        self.board = board
        self.last = 0.0

    def __call__(self, update: tuple[int, int, int]) -> None:
        now = time.monotonic()
        if now - self.last >= 0.5:
            self.last = now
            self.board.post.remote(*update)


def write_and_upload(
    target: Any,
    shard: BuildShard,
    index: int,
    dataset_id: str,
    dataset_version: str,
    build_id: str,
    first_key: int = 0,
    part_size_bytes: int = DEFAULT_PART_SIZE,
    board: Any = None,
) -> ShardResult:
    """Runs in a Ray task: writes one shard in a node-local scratch directory and uploads its
    parts under names unique to this attempt (posting its progress to ``board``, if any)."""
    store = _remote_store(target)
    attempt = uuid.uuid4().hex[:12]
    progress = ShardProgress(index, _Poster(board), 0) if board is not None else None
    with tempfile.TemporaryDirectory(prefix="yogacache-ray-") as scratch:
        result = write_shard(
            shard,
            index,
            Path(scratch),
            dataset_id,
            dataset_version,
            first_key=first_key,
            attempt=attempt,
            part_size_bytes=part_size_bytes,
            progress=progress,
            sync=False,  # the scratch copy is never published: the upload is what must be durable
        )
        files = [
            (Path(scratch) / part.name, cache_key(dataset_id, dataset_version, part_object_name(build_id, part.name)))
            for part in result.parts
        ]
        # A shared directory on the scratch's filesystem takes the parts as they are (a link).
        upload_files(store.objects, files, threads=DEFAULT_TRANSFER_THREADS, adopt=True)
    return result


def _shard_error(error: BaseException, index: int, where: str, max_retries: int) -> BaseException:
    """The error a failed Ray task becomes: the user's exception naming its shard, or a BuildError."""
    ray = _ray()
    cause = getattr(error, "cause", None)
    if isinstance(cause, YogaCacheError):
        return cause
    if isinstance(error, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        return BuildError(
            f"the Ray task writing build shard {index} of {where} died {max_retries + 1} times (killed, or "
            "out of memory); nothing was published"
        )
    return BuildShardError(f"build shard {index} of {where} failed: {type(cause or error).__name__}: {cause or error}")


def build_with_ray(
    target: Any,
    dataset_id: str,
    dataset_version: str,
    shards: Sequence[BuildShard],
    *,
    max_retries: int = DEFAULT_MAX_RETRIES,
    part_bytes: int | str | None = None,
    show_progress: bool = True,
    ray_remote_args: Optional[dict[str, Any]] = None,
    progress: Optional[Progress] = None,
    part_size_bytes: Optional[int] = None,
) -> Manifest:
    """Builds and publishes a cache from ``shards``, one Ray task each (``ray.init`` first, or
    Ray starts a local cluster). ``target`` is what ``open_store`` takes, and must name remote
    storage. A task whose worker dies is re-run up to ``max_retries`` times; an exception in a
    shard fails the job, which then publishes nothing. Progress (records, bytes, rate, ETA of
    every task together) goes to ``progress`` if given, else to stderr unless ``show_progress``
    is false. ``part_bytes`` (an int or a size such as ``"64Mi"``, default 1 GiB): where a shard
    rolls to a new part (default: the ``part_bytes`` of a config ``target``); ``part_size_bytes`` is
    its older name, in bytes."""
    part_size = _part_size(part_bytes, part_size_bytes, target)
    ray = _ray()
    if not shards:
        raise ValueError("a Ray build needs at least one build shard")
    publication = _Publication(target, dataset_id, dataset_version)
    publication.check_absent()
    where = f"{dataset_id}:{dataset_version}"
    offsets = known_offsets(shards)
    total = None if offsets is None else offsets[-1] + int(shards[-1].length or 0)
    task = ray.remote(write_and_upload).options(
        max_retries=max_retries, retry_exceptions=False, **(ray_remote_args or {})
    )
    if progress is None:
        progress = Progress(f"{where} on Ray", enabled=show_progress, total=total)
    board = ray.remote(num_cpus=0)(ProgressBoard).remote() if progress.enabled else None
    totals = ProgressTotals(progress)
    refs = {
        task.remote(
            target,
            shard,
            index,
            dataset_id,
            dataset_version,
            publication.build_id,
            offsets[index] if offsets is not None else 0,
            part_size,
            board,
        ): index
        for index, shard in enumerate(shards)
    }
    results: list[ShardResult] = []
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in ready:
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayError as error:
                    raise _shard_error(error, refs[ref], where, max_retries) from None
                results.append(result)
                totals.set(result.index, result.num_records, result.num_bytes)
            if board is not None and pending:  # shards in flight, as their tasks last posted
                finished = {result.index for result in results}
                for index, (records, size) in ray.get(board.totals.remote()).items():
                    if index not in finished:
                        totals.set(index, records, size)
        manifest = publication.commit(results)
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        if pending:
            ray.wait(pending, num_returns=len(pending), timeout=30)  # let the cancelled tasks stop
        publication.abort()
        progress.close()
        raise
    progress.finish(manifest.num_records, manifest.num_bytes)
    log.info("published %s from %d Ray tasks at %s", where, len(shards), publication.where)
    return manifest


class _RowsShard(BuildShard):
    """The rows of a Ray Data write task's blocks, as a build shard."""

    def __init__(self, blocks: Iterable[Any]) -> None:
        self.blocks = blocks

    def make(self) -> Iterator[dict[str, Any]]:
        from ray.data.block import BlockAccessor

        row: Any
        for block in self.blocks:
            for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
                yield dict(row)


def _datasink_base() -> Any:
    try:
        from ray.data.datasource.datasink import Datasink
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error
    return Datasink


def _part_size(part_bytes: int | str | None, part_size_bytes: Optional[int], target: Any = None) -> int:
    """The part size of a Ray build: ``part_bytes`` (the public name, a size of at least 1 MiB),
    or ``part_size_bytes`` (its older name, bytes as given), else the ``part_bytes`` of the config
    ``target`` names, else ``DEFAULT_PART_SIZE``."""
    if part_bytes is None:
        if part_size_bytes is not None:
            return part_size_bytes
        config = parse_target(target).config if target is not None else None
        return DEFAULT_PART_SIZE if config is None or config.part_bytes is None else config.part_bytes
    size = parse_part_bytes(part_bytes)
    if part_size_bytes is not None and part_size_bytes != size:
        raise ValueError(
            f"part_bytes={part_bytes!r} and part_size_bytes={part_size_bytes} disagree: pass part_bytes only "
            "(part_size_bytes is its older name)"
        )
    return size


def CacheDatasink(
    target: Any,
    dataset_id: str,
    dataset_version: str,
    *,
    part_bytes: int | str | None = None,
    part_size_bytes: Optional[int] = None,
) -> Any:
    """A Ray Data datasink that writes a dataset into a cache: ``ds.write_datasink(CacheDatasink(
    "s3://bucket/caches", "imagenet", "v1"))``. Write task ``i`` (``TaskContext.task_idx``) is
    build shard ``i``; its rows are records in block order. Set
    ``DataContext.get_current().execution_options.preserve_order = True`` for the same record
    order on every run. ``part_bytes``: as in ``build_with_ray``."""
    part_size = _part_size(part_bytes, part_size_bytes, target)
    return _make_datasink_class()(target, dataset_id, dataset_version, part_size)


_DATASINK_CLASS: Any = None


def _make_datasink_class() -> Any:
    global _DATASINK_CLASS
    if _DATASINK_CLASS is not None:
        return _DATASINK_CLASS
    base = _datasink_base()

    class YogaCacheDatasink(base):  # type: ignore[misc, valid-type]
        def __init__(self, target: Any, dataset_id: str, dataset_version: str, part_size_bytes: int) -> None:
            self.target = target
            self.dataset_id = dataset_id
            self.dataset_version = dataset_version
            self.part_size_bytes = part_size_bytes
            self.build_id = uuid.uuid4().hex
            self.manifest: Optional[Manifest] = None
            _Publication(target, dataset_id, dataset_version, self.build_id).check_absent()

        def get_name(self) -> str:
            return "YogaCache"

        def on_write_start(self, schema: Any = None) -> None:
            _Publication(self.target, self.dataset_id, self.dataset_version, self.build_id).check_absent()

        def write(self, blocks: Iterable[Any], ctx: Any) -> ShardResult:
            return write_and_upload(
                self.target,
                _RowsShard(blocks),
                ctx.task_idx,
                self.dataset_id,
                self.dataset_version,
                self.build_id,
                0,
                self.part_size_bytes,
            )

        def on_write_complete(self, write_result: Any) -> None:
            returns = getattr(write_result, "write_returns", write_result)
            results = [r for r in returns if isinstance(r, ShardResult)]
            publication = _Publication(self.target, self.dataset_id, self.dataset_version, self.build_id)
            try:
                self.manifest = publication.commit(results)
            except BaseException:
                publication.abort()
                raise

        def on_write_failed(self, error: Exception) -> None:
            _Publication(self.target, self.dataset_id, self.dataset_version, self.build_id).abort()

    _DATASINK_CLASS = YogaCacheDatasink
    return _DATASINK_CLASS
