"""Parallel build on one node: build shards written by worker processes, sealed by the driver.

``ShardedBuild`` is what a store's build is handed instead of a dataset (``sharded(data,
workers=N)``): its ``write_cache`` runs the shards on ``workers`` processes, each shard writing
its own parts into the build's temporary directory; the driver lists them in shard order in the
manifest, written last, and renames the directory into place, as a one-process build does.

A job names its build shard, never the data of an index range: a worker finds the dataset of
the build's index ranges (a list, a map-style dataset) in its own memory, so each record is
read once in all, whatever the number of shards. Workers are forked (``fork``) when the build
has index ranges and forking is safe (Linux, and neither TensorFlow nor JAX imported nor CUDA
started here): they inherit the dataset, and nothing of it is pickled. Otherwise they are
spawned (fresh interpreters: safe with TensorFlow, CUDA and threads), and each makes the dataset
once: by calling the function that made it again (``sharded(..., remake=)``, which
``parallel_maker``, the decorators and the CLI pass), else from a copy pickled once per worker.
Other build shards (builder calls, callables, objects) are small recipes, sent to spawned
workers as they are. ``ShardedBuild.sent`` says what the last build sent.

A worker that dies (SIGKILL, out of memory) breaks the pool: the shards it left unfinished are
written again from scratch by a new pool, up to ``retries`` times; an exception in the user's
function fails the build with a message naming its shard. Whatever fails, nothing is visible and the temporary
directory goes (or, if the driver itself is killed, the next build removes it).
"""

from __future__ import annotations

import ast
import copy
import multiprocessing
import multiprocessing.reduction
import os
import queue
import shutil
import sys
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from yogacache import redaction
from yogacache.errors import BuildError, YogaCacheError
from yogacache.format.durability import fsync_path, replace_directory, temp_dir_for, write_file_durably
from yogacache.format.integrity import stamp_verified
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import element_bytes
from yogacache.format.spec import Spec
from yogacache.format.writer import DEFAULT_PART_SIZE, BuildLimits
from yogacache.parallel.shards import (
    BuildShard,
    BuildShardError,
    CallShard,
    IndexRange,
    ObjectsShard,
    ShardResult,
    as_shards,
    assemble_manifest,
    builder_shards,
    known_offsets,
    portable_call,
    sent_size,
    write_shard,
)
from yogacache.progress import Progress

log = redaction.get_logger(__name__)

DEFAULT_RETRIES = 2  # new pools after a worker died, before the build fails

# A build estimated to take less than this many seconds in one process is written in this
# process: starting workers (a fresh interpreter each, importing yogacache, numpy and the
# script's own imports, TensorFlow's alone take seconds) would cost more than they save.
IN_PROCESS_BELOW_S = 2.0
# The estimate: a few records of the first build shard, made and measured in the driver.
SAMPLE_RECORDS = 16
SAMPLE_SECONDS = 0.5
# What one process writes per second (encoding and LMDB), for the bytes the estimate counts.
WRITE_BYTES_PER_S = 256 << 20


class ShardProgress(Progress):
    """A worker's progress on one shard, sent to the driver, which adds up every worker's."""

    def __init__(self, index: int, send: Callable[[tuple[int, int, int]], Any], parent: int) -> None:
        super().__init__(f"shard {index}", enabled=False)
        self.index = index
        self.send = send
        self.parent = parent

    def update(self, records: int, size: int) -> None:
        if self.parent and os.getppid() != self.parent:
            os._exit(1)  # the driver is gone: nobody will seal what this worker writes
        self.send((self.index, records, size))

    def finish(self, records: int, size: int) -> None:
        self.update(records, size)


class ProgressTotals:
    """Adds up the (records, bytes) of every shard in flight and shows them with rate and ETA."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.shards: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()

    def set(self, index: int, records: int, size: int) -> None:
        with self.lock:
            self.shards[index] = (records, size)
            records_done = sum(r for r, _ in self.shards.values())
            bytes_done = sum(b for _, b in self.shards.values())
        self.progress.update(records_done, bytes_done)

    def finish(self) -> tuple[int, int]:
        with self.lock:
            done = (sum(r for r, _ in self.shards.values()), sum(b for _, b in self.shards.values()))
        self.progress.finish(*done)
        return done


# -- the dataset of index ranges reaches each worker once, never once per job ----------------------

# In the driver, during a forked build: token -> the dataset of the build's index ranges (its
# workers inherit it). In a worker: the datasets it has made, by token.
_SHARED: dict[str, Any] = {}
# In a spawned worker, from its initializer: token -> ("recipe" | "data", the CallShard or the dataset).
_SENT: dict[str, tuple[str, Any]] = {}


@dataclass(frozen=True)
class SharedData:
    """Stands in a job's ``IndexRange`` for the dataset of the build's index ranges: the worker
    finds it under ``token`` in ``_SHARED`` (forked: inherited), or makes it once from what its
    initializer was sent (spawned: a call of the function that made it, or a pickled copy)."""

    token: str
    length: int

    def resolve(self) -> Any:
        data = _SHARED.get(self.token)
        if data is not None:
            return data
        how, made = _SENT[self.token]
        if how == "recipe":
            function = getattr(made.function, "qualname", None) or getattr(made.function, "__qualname__", "it")
            made = made.make()
            if len(made) != self.length:
                raise ValueError(
                    f"{function}() made {len(made):,} records in this worker, {self.length:,} in the driver: "
                    "spawned workers call it again, so it must return the same records every call"
                )
        _SHARED[self.token] = made
        del _SENT[self.token]
        return made


@dataclass(frozen=True)
class SentToWorkers:
    """What a parallel build pickled for its worker processes (``ShardedBuild.sent``).

    ``start_method`` is None when the build ran in the driver (nothing was sent). ``data`` says
    how the dataset of its index ranges reached the workers: ``"inherited"`` (forked),
    ``"remade"`` (spawned, each calling the function that made it), ``"pickled"`` (spawned, a
    copy each), ``""`` (no index ranges). ``per_worker`` is the bytes each worker was sent once
    (its dataset or the call that makes it), ``per_job`` those of each build shard's job."""

    start_method: Optional[str] = None
    data: str = ""
    per_worker: int = 0
    per_job: tuple[int, ...] = ()


_updates: Any = None


def _init_worker(updates: Any, sent: dict[str, tuple[str, Any]]) -> None:
    global _updates
    _updates = updates
    _SENT.update(sent)


def _run_shard(job: dict[str, Any]) -> ShardResult:
    """Runs in a worker process: writes one shard."""
    if os.getppid() != job["parent"] or not Path(job["directory"]).is_dir():
        os._exit(1)  # the driver is gone (and the next build may have removed its directory)
    shard = job["shard"]
    try:
        if isinstance(shard, IndexRange) and isinstance(shard.data, SharedData):
            shard = replace(shard, data=shard.data.resolve())
        if isinstance(shard, ObjectsShard):
            recipe = {k: v.resolve() if isinstance(v, SharedData) else v for k, v in shard.recipe.items()}
            shard = replace(shard, recipe=recipe)
    except Exception as error:  # the user's function or dataset, made again in this worker
        raise BuildShardError(
            f"build shard {job['index']} of {job['dataset_id']}:{job['dataset_version']} failed: "
            f"making its dataset in a worker process: {type(error).__name__}: {error}"
        ) from None
    progress = ShardProgress(job["index"], _updates.put, job["parent"])
    return write_shard(
        shard,
        job["index"],
        Path(job["directory"]),
        job["dataset_id"],
        job["dataset_version"],
        first_key=job["first_key"],
        limits=job["limits"],
        part_size_bytes=job["part_size_bytes"],
        progress=progress,
        sync=False,  # the driver syncs the parts while this worker writes its next shard
    )


def remove_shard_files(directory: Path, index: int) -> None:
    """Removes what an attempt at shard ``index`` left in the build directory."""
    for path in directory.glob(f"part-{index:05d}-*"):
        path.unlink(missing_ok=True)
    for path in directory.glob(f".shard-{index:05d}*"):
        shutil.rmtree(path, ignore_errors=True)


class PartSync:
    """Syncs the parts of finished shards on a driver thread, while the workers write the next
    ones (a worker that waited for its own sync would leave its core idle for each shard)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="yogacache-build-sync")
        self.pending: list[Future[None]] = []

    def add(self, result: ShardResult) -> None:
        for part in result.parts:
            self.pending.append(self.pool.submit(fsync_path, self.directory / part.name))

    def wait(self) -> None:
        """Returns once every added part is durable; the first error fails the build."""
        try:
            for future in self.pending:
                try:
                    future.result()
                except OSError as error:
                    raise BuildError(f"syncing a part of the build in {self.directory} failed: {error}") from error
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


class ShardedBuild:
    """A dataset split into build shards, built by ``workers`` processes (see the module doc)."""

    kind = "sharded"

    def __init__(
        self,
        shards: Sequence[BuildShard],
        workers: int = 1,
        *,
        retries: int = DEFAULT_RETRIES,
        in_process_below: float = IN_PROCESS_BELOW_S,
        start_method: Optional[str] = None,
    ) -> None:
        if not shards:
            raise ValueError("a parallel build needs at least one build shard")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if start_method is not None and start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(
                f"start_method {start_method!r} is not one of this platform's: "
                f"{', '.join(multiprocessing.get_all_start_methods())}"
            )
        self.shards = list(shards)
        self.workers = workers
        self.retries = retries
        self.in_process_below = in_process_below
        self.start_method = start_method  # None: fork where index ranges gain and it is safe, else spawn
        # How spawned workers make a dataset of index ranges again, by id() of that dataset (see sharded).
        self.remakes: dict[int, CallShard] = {}
        self.sent = SentToWorkers()  # what the last write_cache sent its workers
        self.manifest_extra: dict[str, Any] = {}  # recorded in the manifest (see sharded)
        # The manifest's extra from what the shards recorded (``ShardResult.extra``), see sharded.
        self.merge_extra: Optional[Callable[[list[dict[str, Any]]], dict[str, Any]]] = None
        offsets = known_offsets(self.shards)
        self.cardinality: Optional[int] = None
        if offsets is not None:
            self.cardinality = offsets[-1] + int(self.shards[-1].length or 0)

    def __repr__(self) -> str:
        return f"ShardedBuild({len(self.shards)} shards, workers={self.workers})"

    # A store calls write_cache; these make it a RecordSource for everything else.
    def spec(self) -> Spec:
        raise BuildError("a sharded build's spec is known once write_cache has run")

    def encoded_batches(self) -> Any:
        raise BuildError("a sharded build is written by write_cache, not record by record")

    def write_cache(
        self,
        target: Path,
        dataset_id: str,
        dataset_version: str,
        *,
        limits: BuildLimits = BuildLimits(),
        part_size_bytes: int = DEFAULT_PART_SIZE,
        progress: Optional[Progress] = None,
        extra: Optional[dict[str, Any]] = None,
    ) -> Manifest:
        """Builds every shard, then seals the cache at ``target`` (the caller holds its lock)."""
        what = f"{dataset_id}:{dataset_version}"
        if self.workers > 1:
            refuse_unguarded_main(what, self.workers)
        workers, why = self.plan_workers()
        if why:
            log.info(
                "building %s in this process, not with workers=%d: %s; the cache is the one workers "
                "write (docs/parallel-build.md)", what, self.workers, why,
            )
        self.sent = SentToWorkers()
        build_id = uuid.uuid4().hex
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        directory = temp_dir_for(target, build_id)
        directory.mkdir(mode=0o755)
        progress = progress or Progress(f"{dataset_id}:{dataset_version}", enabled=False)
        syncing = PartSync(directory)
        try:
            totals = ProgressTotals(progress)
            try:
                results = self._run(
                    directory, dataset_id, dataset_version, limits, part_size_bytes, totals, syncing, workers
                )
            finally:
                syncing.wait()
            if self.merge_extra is not None:
                extra = {**(extra or {}), **self.merge_extra([result.extra for result in results])}
            manifest = assemble_manifest(results, dataset_id, dataset_version, build_id=build_id, extra=extra)
            if limits.max_records is not None and manifest.num_records > limits.max_records:
                raise BuildError(
                    f"dataset {dataset_id}:{dataset_version} has more than {limits.max_records} records "
                    "(max_records); nothing was cached"
                )
            for leftover in directory.glob(".shard-*"):
                shutil.rmtree(leftover, ignore_errors=True)
            stamp_verified(directory, manifest)
            write_file_durably(directory / MANIFEST_NAME, manifest.to_bytes())
            fsync_path(directory)
            replace_directory(directory, target)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        progress.finish(manifest.num_records, manifest.num_bytes)
        log.info(
            "cached %s:%s from %d build shards on %d workers: %d records in %s",
            dataset_id, dataset_version, len(self.shards), workers, manifest.num_records, target,
        )
        return manifest

    def plan_workers(self) -> tuple[int, str]:
        """How many processes write this build: ``workers``, or 1 with the reason when the build
        is too small to gain from more (one build shard, or less work than ``in_process_below``
        seconds by ``estimate_seconds``). The shards, and so the cache, are the same either way."""
        if self.workers == 1 or self.in_process_below <= 0:
            return self.workers, ""
        if len(self.shards) == 1:
            return 1, "it has one build shard, which one process writes"
        estimate = self.estimate_seconds()
        if estimate is None or estimate >= self.in_process_below:
            return self.workers, ""
        return 1, (
            f"{self.cardinality:,} records, about {estimate:.2g} s of work in one process (estimated from "
            f"its first records), less than starting workers costs (in_process_below={self.in_process_below:g} s)"
        )

    def estimate_seconds(self) -> Optional[float]:
        """About how long one process takes to write this build: its length times the time a
        sample of its first records takes to make, plus their bytes at ``WRITE_BYTES_PER_S``.
        None where it cannot tell: shards of unknown length (a builder function, callables, an
        object source's archives), or records that fail to be made here (the build reports it)."""
        first = self.shards[0] if self.shards else None
        if (
            self.cardinality is None
            or not isinstance(first, IndexRange)
            or not all(isinstance(shard, IndexRange) for shard in self.shards)
        ):
            return None
        sizes = []
        started = time.perf_counter()
        try:
            # A copy: a dataset that opens its files on first access (to be sent to workers
            # unopened, as DataLoader workers want) must stay unopened here.
            data = copy.copy(first.data)
            for index in range(first.start, min(first.stop, first.start + SAMPLE_RECORDS)):
                sizes.append(element_bytes(data[index]))
                if time.perf_counter() - started > SAMPLE_SECONDS:
                    break
        except Exception:  # the user's dataset: its error is the build's to report, naming the shard
            return None
        if not sizes:
            return None
        per_record = (time.perf_counter() - started) / len(sizes)
        per_record += sum(sizes) / len(sizes) / WRITE_BYTES_PER_S
        return self.cardinality * per_record

    def choose_start_method(self) -> tuple[str, str]:
        """How workers start, and why: ``start_method`` if given; ``fork`` for a build of index
        ranges where forking is safe (they inherit the dataset, nothing of it is pickled);
        ``spawn`` otherwise (safe with TensorFlow, CUDA and threads; build shards other than
        index ranges are small recipes, sent as they are)."""
        if self.start_method is not None:
            return self.start_method, "asked for"
        if not any(isinstance(shard, IndexRange) for shard in self.shards):
            return "spawn", "its build shards are recipes, sent as they are"
        unsafe = fork_unsafe()
        if unsafe:
            return "spawn", f"forking is not safe here: {unsafe}"
        return "fork", "on Linux, with nothing imported that a fork breaks"

    def _shared(self) -> dict[int, tuple[SharedData, Any]]:
        """What many shards share, by id(), with its stand-in: the dataset of index ranges, and
        the parts of object shards' recipes common to every shard (``ObjectsShard.SHARED``: the
        URLs given, their prefixes, imagefolder's class table), which workers then get once."""
        shared: dict[int, tuple[SharedData, Any]] = {}

        def add(value: Any) -> None:
            if id(value) not in shared:
                shared[id(value)] = (SharedData(uuid.uuid4().hex, len(value)), value)

        for shard in self.shards:
            if isinstance(shard, IndexRange):
                add(shard.data)
            elif isinstance(shard, ObjectsShard):
                for key in ObjectsShard.SHARED:
                    if isinstance(shard.recipe.get(key), (list, dict)):
                        add(shard.recipe[key])
        return shared

    def _send(
        self, shared: dict[int, tuple[SharedData, Any]], method: str
    ) -> tuple[dict[str, tuple[str, Any]], int, str]:
        """What each spawned worker is sent once (by token: the call that makes a dataset again,
        else the value), the bytes that pickles to, and how it got there; forked workers are sent
        nothing."""
        if not shared:
            return {}, 0, ""
        if method == "fork":
            return {}, 0, "inherited"
        sent: dict[str, tuple[str, Any]] = {}
        size = 0
        kinds = set()
        for key, (stand_in, value) in shared.items():
            recipe = self.remakes.get(key)
            portable = portable_call(recipe) if recipe is not None else None
            if portable is not None:
                sent[stand_in.token] = ("recipe", portable[0])
                size += portable[1]
                kinds.add("remade")
                continue
            try:
                size += sent_size(value)
                sent[stand_in.token] = ("data", value)
            except Exception as error:  # PicklingError, TypeError, AttributeError: what spawn would meet
                raise BuildError(
                    f"the dataset of this build ({type(value).__name__}) could not be sent to a spawned "
                    f"worker process: {type(error).__name__}: {error}; make it picklable, or build from a "
                    "module-level function that makes it (docs/parallel-build.md)"
                ) from None
            kinds.add("pickled")
        return sent, size, "+".join(sorted(kinds))

    def _jobs(
        self,
        directory: Path,
        dataset_id: str,
        dataset_version: str,
        limits: BuildLimits,
        part_size_bytes: int,
        shared: Optional[dict[int, tuple[SharedData, Any]]] = None,
    ) -> list[dict[str, Any]]:
        """Each shard's job; with ``shared``, what shards share is named by its stand-in (see _shared)."""
        offsets = known_offsets(self.shards)

        def sendable(shard: BuildShard) -> BuildShard:
            if shared and isinstance(shard, IndexRange):
                return replace(shard, data=shared[id(shard.data)][0])
            if shared and isinstance(shard, ObjectsShard):
                recipe = {
                    key: shared[id(value)][0] if key in ObjectsShard.SHARED and id(value) in shared else value
                    for key, value in shard.recipe.items()
                }
                return replace(shard, recipe=recipe)
            return shard

        return [
            dict(
                shard=sendable(shard),
                index=index,
                directory=str(directory),
                dataset_id=dataset_id,
                dataset_version=dataset_version,
                first_key=offsets[index] if offsets is not None else 0,
                limits=limits,
                part_size_bytes=part_size_bytes,
                parent=os.getpid(),
            )
            for index, shard in enumerate(self.shards)
        ]

    def _run(
        self,
        directory: Path,
        dataset_id: str,
        dataset_version: str,
        limits: BuildLimits,
        part_size_bytes: int,
        totals: ProgressTotals,
        syncing: PartSync,
        workers: int,
    ) -> list[ShardResult]:
        if workers == 1:  # in this process: the same parts, without starting one, nothing pickled
            jobs = self._jobs(directory, dataset_id, dataset_version, limits, part_size_bytes)
            if self.workers > 1:  # the recipes workers would be sent must be sendable, small build or not
                for job in jobs:
                    if not isinstance(job["shard"], IndexRange):  # index ranges send no data (see _send)
                        _job_size(job)
            results = []
            for job in jobs:
                progress = ShardProgress(job["index"], lambda update: totals.set(*update), 0)
                results.append(
                    write_shard(
                        job["shard"], job["index"], directory, dataset_id, dataset_version,
                        first_key=job["first_key"], limits=limits, part_size_bytes=part_size_bytes, progress=progress,
                        sync=False,
                    )
                )
                syncing.add(results[-1])
            return results
        method, why = self.choose_start_method()
        shared = self._shared()
        sent, sent_bytes, how = self._send(shared, method)
        jobs = self._jobs(directory, dataset_id, dataset_version, limits, part_size_bytes, shared)
        self.sent = SentToWorkers(method, how, sent_bytes, tuple(_job_size(job) for job in jobs))
        log.info(
            "building %s:%s on %d %s workers (%s)%s", dataset_id, dataset_version, workers, method, why,
            f"; what its shards share: {how}" if how else "",
        )
        if method == "fork":
            for stand_in, value in shared.values():
                _SHARED[stand_in.token] = value
        try:
            return self._attempts(
                jobs, sent, method, directory, dataset_id, dataset_version, totals, syncing, workers
            )
        finally:
            for stand_in, _ in shared.values():
                _SHARED.pop(stand_in.token, None)

    def _attempts(
        self,
        jobs: list[dict[str, Any]],
        sent: dict[str, tuple[str, Any]],
        method: str,
        directory: Path,
        dataset_id: str,
        dataset_version: str,
        totals: ProgressTotals,
        syncing: PartSync,
        workers: int,
    ) -> list[ShardResult]:
        """Runs the jobs on pools of ``workers``, a new pool after a worker died (``retries``)."""
        done: dict[int, ShardResult] = {}
        for attempt in range(self.retries + 1):
            pending = [(job["index"], job) for job in jobs if job["index"] not in done]
            try:
                self._run_pool(pending, sent, method, done, totals, syncing, workers)
                return [done[i] for i in range(len(jobs))]
            except BrokenProcessPool:
                lost = sorted(index for index, _ in pending if index not in done)
                for index in lost:
                    remove_shard_files(directory, index)
                    totals.set(index, 0, 0)
                if attempt == self.retries:
                    raise BuildError(
                        f"a worker process building {dataset_id}:{dataset_version} died (killed, or out of "
                        f"memory) while build shards {_ranges(lost)} were being written, {self.retries + 1} "
                        "times; nothing was cached"
                    ) from None
                log.warning(
                    "a worker process building %s:%s died; writing build shards %s again",
                    dataset_id, dataset_version, _ranges(lost),
                )
        raise AssertionError("unreachable")

    def _run_pool(
        self,
        jobs: list[tuple[int, dict[str, Any]]],
        sent: dict[str, tuple[str, Any]],
        method: str,
        done: dict[int, ShardResult],
        totals: ProgressTotals,
        syncing: PartSync,
        workers: int,
    ) -> None:
        context = multiprocessing.get_context(method)
        updates = context.Queue()
        stop = threading.Event()
        pump = threading.Thread(
            target=_pump, args=(updates, totals, stop), name="yogacache-build-progress", daemon=True
        )
        pool = ProcessPoolExecutor(
            max_workers=min(workers, len(jobs)), mp_context=context, initializer=_init_worker,
            initargs=(updates, sent),
        )
        # Forked workers start at the first submit: the progress thread starts after them.
        futures: dict[Future[ShardResult], int] = {pool.submit(_run_shard, job): index for index, job in jobs}
        pump.start()
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in finished:
                    try:
                        result = future.result()  # the shard's error, or BrokenProcessPool
                    except (YogaCacheError, BrokenProcessPool):
                        raise
                    except Exception as error:  # the shard could not be sent to a worker
                        raise _unsendable(futures[future], error) from None
                    done[result.index] = result
                    syncing.add(result)
                    totals.set(result.index, result.num_records, result.num_bytes)
        except BaseException:
            _stop_pool(pool)
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            stop.set()
            pump.join()
            updates.close()
            updates.join_thread()


def _unsendable(index: int, error: Exception) -> BuildError:
    return BuildError(f"build shard {index} could not be run in a worker process: {type(error).__name__}: {error}")


def _job_size(job: dict[str, Any]) -> int:
    """The bytes ``job`` pickles to as the pool sends it (BuildError where it cannot be sent)."""
    try:
        return sent_size(job)
    except Exception as error:  # PicklingError, TypeError, AttributeError: what the pool would meet
        raise _unsendable(job["index"], error) from None


def fork_unsafe() -> str:
    """Why this process must not fork its build workers ("" where it may): not Linux (macOS's
    system libraries do not survive a fork), TensorFlow or JAX imported (their thread pools do
    not), CUDA started by torch (a forked child cannot use it)."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return f"{sys.platform} does not fork safely"
    for module in ("tensorflow", "jax"):
        if module in sys.modules:
            return f"{module} is imported"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "torch has started CUDA"
    return ""


# -- a script that starts a parallel build at import ---------------------------------------------
#
# Workers are spawned: each starts a fresh interpreter that imports the main script again (as
# ``__mp_main__``). A script that starts the build at its top level, not under
# ``if __name__ == "__main__":``, would make each worker start the build again, and wait forever
# for the lock its parent holds while it builds. Both sides refuse at once, naming the fix.

_GUARD = 'if __name__ == "__main__":'


def refuse_bootstrapping_build(what: str, workers: int) -> None:
    """In a worker that is still importing the parent's main script (multiprocessing's
    bootstrapping, when ``current_process()._inheriting`` is set), a parallel build fails."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    script = getattr(main, "__file__", None) or "the main script"
    raise BuildError(
        f"{what} (workers={workers}) was started while this process is importing the main script {script}, "
        "as every worker of a parallel build does when it starts: each worker would start the build again "
        "and wait forever for the one its parent runs. Put the code that runs the script under "
        f"`{_GUARD}` (see docs/parallel-build.md)"
    )


def refuse_unguarded_main(what: str, workers: int) -> None:
    """In the driver, before any worker starts: fails when this build was started by the main
    script's top-level code outside ``if __name__ == "__main__":`` (a line each worker would run)."""
    script = _script_workers_import()
    main = sys.modules.get("__main__")
    if main is None or script is None:
        return
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is vars(main) and frame.f_code.co_name == "<module>"):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(script).read_text(encoding="utf-8"), filename=script)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return
    if _under_main_guard(tree, line):
        return
    raise BuildError(
        f"{what} would be built with workers={workers}, which start fresh Python processes that import "
        f"{script} again; it is started by line {line} of that script, at its top level, not under "
        f"`{_GUARD}`, so every worker would start the build again and wait forever for this one. Move the "
        f"code that runs the script (line {line}) under `{_GUARD}` (see docs/parallel-build.md)"
    )


def _script_workers_import() -> Optional[str]:
    """The main script a spawned worker runs again as ``__mp_main__``, as ``multiprocessing.spawn``
    decides: none for ``python -c``, a notebook, or a package's ``__main__`` module run with ``-m``
    (``python -m yogacache``), which it never re-runs."""
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if main is None or not script:
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:
        return None if name == "__main__" or name.endswith(".__main__") else str(script)
    return None if os.path.splitext(os.path.basename(script))[0] == "ipython" else str(script)


def _under_main_guard(tree: ast.Module, line: int) -> bool:
    """Whether ``line`` lies in the body of ``if __name__ == "__main__":`` (or the ``else`` of
    ``if __name__ != "__main__":``) somewhere in ``tree``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
            continue
        sides = [node.test.left, *node.test.comparators]
        if not (
            any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides)
        ):
            continue
        operator = node.test.ops[0]
        body = node.body if isinstance(operator, ast.Eq) else node.orelse if isinstance(operator, ast.NotEq) else []
        if body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
            return True
    return False


def _pump(updates: Any, totals: ProgressTotals, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            index, records, size = updates.get(timeout=0.2)
        except queue.Empty:
            continue
        except (EOFError, OSError, ValueError):
            return
        totals.set(index, records, size)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stops a failed build's workers now (their shards are discarded anyway)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)


def _ranges(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices[:20]) + (f" and {len(indices) - 20} more" if len(indices) > 20 else "")


def sharded(
    data: Any,
    workers: int = 1,
    *,
    build_shards: Optional[int] = None,
    retries: int = DEFAULT_RETRIES,
    in_process_below: float = IN_PROCESS_BELOW_S,
    start_method: Optional[str] = None,
    remake: Optional[CallShard] = None,
) -> ShardedBuild:
    """A parallel build of ``data`` on ``workers`` processes, to hand to any build in place of
    the dataset (``store.build(id, version, sharded(data, workers=4))``).

    ``data`` is a map-style dataset or a sequence (split into index ranges, ``build_shards`` of
    them, by default a number that depends on its length only), a list of callables each
    returning a dataset (one shard each), an object source (``yogacache.sources.from_url``: one
    shard per archive or run of files), or a list of ``BuildShard``. A build estimated to take
    less than ``in_process_below`` seconds in one process is written in this one (the same
    shards, the same cache; ``0``: always start the workers).

    ``start_method``: ``"fork"`` or ``"spawn"`` (``"forkserver"`` as spawn), by default fork
    for index ranges where it is safe (``fork_unsafe``), else spawn. ``remake``: a call that
    makes ``data`` again (``CallShard(make, args, kwargs)``, the same records every call):
    spawned workers each make the dataset with it instead of being sent a pickled copy.
    """
    if isinstance(data, ShardedBuild):
        return data
    if workers > 1:
        refuse_bootstrapping_build("a parallel build", workers)
    build = ShardedBuild(
        as_shards(data, build_shards), workers, retries=retries, in_process_below=in_process_below,
        start_method=start_method,
    )
    if remake is not None:
        build.remakes[id(data)] = remake
    # An object source's pins go in the manifest, as in a build in one process: its shards' reads
    # (the versions they were served) are merged once they are done.
    build.manifest_extra = dict(getattr(data, "manifest_extra", None) or {})
    build.merge_extra = getattr(data, "merge_shard_extra", None)
    return build


def parallel_maker(
    make_dataset: Callable[..., Any], workers: int, build_shards: Optional[int] = None
) -> Callable[..., Any]:
    """``make_dataset`` turned into a function returning a ``ShardedBuild``: with ``build_shards``,
    a builder called in the workers as ``make_dataset(*args, shard_index=i, num_shards=build_shards,
    **kwargs)``; without, the dataset it returns is split into index ranges (spawned workers call
    ``make_dataset`` again for it rather than be sent its records: ``sharded``'s ``remake``)."""
    import functools

    @functools.wraps(make_dataset)
    def make(*args: Any, **kwargs: Any) -> ShardedBuild:
        if build_shards is not None:
            return ShardedBuild(builder_shards(make_dataset, build_shards, args, kwargs), workers)
        return sharded(make_dataset(*args, **kwargs), workers, remake=CallShard(make_dataset, args, dict(kwargs)))

    return make
