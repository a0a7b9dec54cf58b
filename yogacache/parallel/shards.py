"""Build shards: the units of a parallel build, fixed by the data so the cache is the same for any N.

A build shard is a picklable recipe for part of the dataset: an index range of a map-style
dataset or a sequence, one call of a ``tf.data`` builder function ``(shard_index, num_shards)``,
or any callable returning a dataset (one tar file, one object). ``write_shard`` writes one shard
into parts with ``CacheWriter`` (deterministic LMDB pages, so a shard's parts hash the same
whoever writes them); ``assemble_manifest`` lists the parts of every shard in shard order.

How many shards there are depends only on the data (``plan_index_shards``), never on the number
of workers: the same records land in the same parts, in the same order, with the same hashes,
whether one process, eight processes or a Ray cluster builds the cache.
"""

from __future__ import annotations

import datetime
import importlib
import math
import multiprocessing.reduction
import os
import shutil
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from yogacache.errors import BuildError, UnsupportedDatasetError
from yogacache.format.codec import CODEC_NAME
from yogacache.format.manifest import FORMAT_VERSION, READ_FORMAT_VERSION, Manifest, PartInfo
from yogacache.format.sources import manifest_extra, source_for
from yogacache.format.spec import Spec, generalize, spec_from_json, spec_to_json
from yogacache.format.writer import DEFAULT_PART_SIZE, BuildLimits, CacheWriter
from yogacache.malloc import keep_freed_memory
from yogacache.progress import Progress
from yogacache.version import __version__

# An index range is split into shards of at least this many records, and at most this many
# shards: a function of the dataset's length alone.
MIN_SHARD_RECORDS = 1024
MAX_INDEX_SHARDS = 256


class BuildShardError(BuildError):
    """The user's function raised while it built one build shard (the message names the shard)."""


class _FunctionRef:
    """A module-level function by name: a decorated function (``functools.wraps``) cannot be
    pickled by reference, as its name now names the wrapper; the worker imports the name and
    unwraps it."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.module = function.__module__
        self.qualname = function.__qualname__

    def resolve(self) -> Callable[..., Any]:
        target: Any = importlib.import_module(self.module)
        for name in self.qualname.split("."):
            target = getattr(target, name)
        while hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        return target  # type: ignore[no-any-return]


def _portable(function: Callable[..., Any]) -> Any:
    """``function`` if a worker process can receive it as it is, else a reference by name."""
    try:
        # What the spawn start method does to a task's arguments (the recipe, never a record).
        multiprocessing.reduction.ForkingPickler.dumps(function)
        return function
    except Exception:  # PicklingError, AttributeError, TypeError: not sendable as it is
        if "<locals>" in getattr(function, "__qualname__", "<locals>") or not getattr(function, "__module__", None):
            raise BuildError(
                f"{getattr(function, '__qualname__', function)!r} cannot be sent to a worker process: "
                "define it at module level (workers start fresh Python processes)"
            ) from None
        return _FunctionRef(function)


def _resolve(function: Any) -> Callable[..., Any]:
    return function.resolve() if isinstance(function, _FunctionRef) else function  # type: ignore[no-any-return]


class BuildShard:
    """One unit of parallel work: ``make()`` returns the dataset of this shard's records."""

    length: Optional[int] = None  # records, when known before building

    def make(self) -> Any:
        raise NotImplementedError


@dataclass
class IndexRange(BuildShard):
    """Records ``start .. stop-1`` of a map-style dataset (``__getitem__`` + ``__len__``) or a sequence."""

    data: Any
    start: int
    stop: int

    def __post_init__(self) -> None:
        self.length = self.stop - self.start

    def make(self) -> Any:
        return _IndexSlice(self.data, self.start, self.stop)


class _IndexSlice:
    def __init__(self, data: Any, start: int, stop: int) -> None:
        self.data, self.start, self.stop = data, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[Any]:
        data = self.data
        return (data[i] for i in range(self.start, self.stop))


@dataclass
class BuilderCall(BuildShard):
    """``function(*args, shard_index=i, num_shards=n, **kwargs)``: a ``tf.data`` builder that reads
    its share of the input (``shard(num_shards, shard_index)``, as ``tf.distribute.InputContext``
    hands it out)."""

    function: Any
    shard_index: int
    num_shards: int
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def make(self) -> Any:
        function = _resolve(self.function)
        return function(*self.args, shard_index=self.shard_index, num_shards=self.num_shards, **self.kwargs)


@dataclass
class CallShard(BuildShard):
    """``function(*args, **kwargs)``: any callable returning a dataset, e.g. the records of one tar file."""

    function: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def make(self) -> Any:
        return _resolve(self.function)(*self.args, **self.kwargs)


def sent_size(value: Any) -> int:
    """The bytes ``value`` pickles to as multiprocessing sends it to a worker (what a parallel
    build accounts for; the pool itself pickles it again when it sends it)."""
    return len(multiprocessing.reduction.ForkingPickler.dumps(value))


def portable_call(call: CallShard) -> Optional[tuple[CallShard, int]]:
    """``call`` as a spawned worker can receive it, and its size pickled: its function as it is,
    else by name (``_FunctionRef``: a decorated module-level function); None when neither pickles."""
    candidates = [call.function]
    qualname = getattr(call.function, "__qualname__", "<locals>")
    if "<locals>" not in qualname and getattr(call.function, "__module__", None):
        candidates.append(_FunctionRef(call.function))
    for function in candidates:
        try:
            portable = replace(call, function=function)
            return portable, sent_size(portable)
        except Exception:  # PicklingError, AttributeError, TypeError: not sendable this way
            continue
    return None


@dataclass
class ObjectsShard(BuildShard):
    """Some objects of an object source (``yogacache.sources.from_url``): one tar or zip shard,
    or a run of plain files, as ``ObjectSource.shard_recipes`` lists them."""

    # What every shard's recipe holds the same of (by identity): a pool sends it once per worker.
    SHARED = ("urls", "prefixes", "classes")

    recipe: dict[str, Any]

    def make(self) -> Any:
        from yogacache.sources.source import ObjectSource

        return ObjectSource.from_recipe(self.recipe)


def object_shards(source: Any) -> list[BuildShard]:
    """One build shard per ``source.shard_recipes()`` entry (an object source's objects, in order)."""
    return [ObjectsShard(recipe) for recipe in source.shard_recipes()]


def plan_index_shards(data: Any, num_shards: Optional[int] = None) -> list[BuildShard]:
    """Index ranges covering ``data`` (a map-style dataset or a sequence) in order. Without
    ``num_shards``, the count follows from the length alone (ranges of at least
    ``MIN_SHARD_RECORDS``, at most ``MAX_INDEX_SHARDS`` of them)."""
    try:
        length = len(data)
    except TypeError:
        raise UnsupportedDatasetError(
            f"a parallel build of a {type(data).__name__} needs its length: pass a map-style dataset "
            "or a sequence, a builder function with build_shards=, or a list of build shards"
        ) from None
    if not hasattr(data, "__getitem__"):
        raise UnsupportedDatasetError(
            f"a {type(data).__name__} cannot be indexed: it cannot be split into build shards"
        )
    if num_shards is None:
        num_shards = min(MAX_INDEX_SHARDS, max(1, math.ceil(length / MIN_SHARD_RECORDS)))
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    num_shards = max(1, min(num_shards, length))
    bounds = [length * i // num_shards for i in range(num_shards + 1)]
    return [IndexRange(data, bounds[i], bounds[i + 1]) for i in range(num_shards)]


def builder_shards(
    function: Callable[..., Any], num_shards: int, args: tuple[Any, ...] = (), kwargs: Optional[dict[str, Any]] = None
) -> list[BuildShard]:
    """``num_shards`` calls of a builder function taking ``shard_index`` and ``num_shards``."""
    if num_shards < 1:
        raise ValueError(f"build_shards must be at least 1, got {num_shards}")
    portable = _portable(function)
    return [BuilderCall(portable, i, num_shards, tuple(args), dict(kwargs or {})) for i in range(num_shards)]


def call_shards(functions: Sequence[Callable[[], Any]]) -> list[BuildShard]:
    """One shard per callable (each returning a dataset), in order."""
    return [CallShard(_portable(function)) for function in functions]


def as_shards(data: Any, num_shards: Optional[int] = None) -> list[BuildShard]:
    """Build shards for ``data``: a list of ``BuildShard`` as it is, a list of callables one
    shard each, an object source's objects (``object_shards``), a map-style dataset or a
    sequence as index ranges."""
    if isinstance(data, (list, tuple)) and data and all(isinstance(s, BuildShard) for s in data):
        return list(data)
    if isinstance(data, (list, tuple)) and data and all(callable(f) for f in data):
        return call_shards(data)
    if getattr(data, "is_object_source", False):
        return object_shards(data)
    return plan_index_shards(data, num_shards)


def known_offsets(shards: Sequence[BuildShard]) -> Optional[list[int]]:
    """Each shard's first record index, when every shard's length is known; else None (the
    shards then key their records from 0 and the manifest says so)."""
    lengths = [shard.length for shard in shards]
    if any(length is None for length in lengths):
        return None
    offsets, total = [], 0
    for length in lengths:
        offsets.append(total)
        total += int(length or 0)
    return offsets


@dataclass(frozen=True)
class ShardResult:
    """What one attempt at one build shard wrote: its parts (``first_record`` counting from the
    shard's first record, ``first_key`` the key of that record) and what the driver needs."""

    index: int
    attempt: str
    parts: tuple[PartInfo, ...]
    spec_json: Any
    kind: str
    num_records: int
    num_bytes: int
    # What the shard's source records in a manifest (an object source: its objects' pins, with
    # the versions its reads were served); ``ShardedBuild.merge_extra`` combines them.
    extra: dict[str, Any] = field(default_factory=dict)


def shard_part_name(index: int, number: int, attempt: str = "") -> str:
    """A shard's ``number``-th part: ``part-SSSSS-NNN[-attempt].mdb``."""
    return f"part-{index:05d}-{number:03d}{'-' + attempt if attempt else ''}.mdb"


def write_shard(
    shard: BuildShard,
    index: int,
    directory: Path,
    dataset_id: str,
    dataset_version: str,
    *,
    first_key: int = 0,
    attempt: str = "",
    limits: BuildLimits = BuildLimits(),
    part_size_bytes: int = DEFAULT_PART_SIZE,
    progress: Optional[Progress] = None,
    sync: bool = True,
) -> ShardResult:
    """Writes build shard ``index`` as parts named by ``shard_part_name`` in ``directory``.

    An exception from the user's function becomes BuildShardError naming the shard; a failed
    shard leaves nothing of itself in ``directory``. ``sync=False``: the parts' write-back is
    started, not waited for; the caller syncs them before a manifest names them.
    """
    where = f"build shard {index} of {dataset_id}:{dataset_version}"
    writer = CacheWriter(
        directory / f"shard-{index:05d}{'-' + attempt if attempt else ''}",
        dataset_id,
        dataset_version,
        limits=limits,
        part_size_bytes=part_size_bytes,
        progress=progress,
        first_key=first_key,
        deterministic=True,
        sync_parts=sync,
    )
    with writer:
        keep_freed_memory()  # batch buffers are reused, as in a one-process build
        try:
            source = source_for(shard.make())
            writer.add_batches(source.encoded_batches())
        except BuildError:
            raise
        except Exception as error:
            raise BuildShardError(f"{where} failed: {type(error).__name__}: {error}") from None
        parts = writer.finish_parts()
        spec = spec_to_json(source.spec()) if writer.num_records else None
        renamed = []
        for number, part in enumerate(parts):
            name = shard_part_name(index, number, attempt)
            os.replace(writer.directory / part.name, directory / name)
            renamed.append(replace(part, name=name, first_key=first_key + part.first_record))
    shutil.rmtree(writer.directory, ignore_errors=True)
    return ShardResult(
        index, attempt, tuple(renamed), spec, source.kind, writer.num_records, writer.num_bytes, manifest_extra(source)
    )


def assemble_manifest(
    results: Sequence[ShardResult],
    dataset_id: str,
    dataset_version: str,
    *,
    build_id: Optional[str] = None,
    extra: Optional[dict[str, Any]] = None,
) -> Manifest:
    """The manifest of a cache made of build shards: exactly one result per shard index, parts
    listed in shard order (not in the order the shards finished)."""
    ordered = sorted(results, key=lambda r: r.index)
    indices = [r.index for r in ordered]
    if len(set(indices)) != len(indices):
        raise BuildError(f"{dataset_id}:{dataset_version}: a build shard was reported twice: {indices}")
    spec: Optional[Spec] = None
    parts: list[PartInfo] = []
    total = num_bytes = 0
    for result in ordered:
        if result.spec_json is not None:
            shard_spec = spec_from_json(result.spec_json)
            try:
                spec = shard_spec if spec is None else generalize(spec, shard_spec)
            except UnsupportedDatasetError as error:
                raise UnsupportedDatasetError(
                    f"build shard {result.index} of {dataset_id}:{dataset_version} (its records from "
                    f"index {total}) holds other elements than the shards before it: {error}"
                ) from None
        for part in result.parts:
            key = part.first_key if part.first_key is not None else part.first_record
            first = total + part.first_record
            parts.append(replace(part, first_record=first, first_key=None if key == first else key))
        total += result.num_records
        num_bytes += result.num_bytes
    if spec is None:
        raise UnsupportedDatasetError(
            f"{dataset_id}:{dataset_version}: the dataset is empty: its element spec is unknown"
        )
    keyed = any(part.first_key is not None for part in parts)
    manifest = Manifest(
        dataset_id=dataset_id,
        dataset_version=dataset_version,
        num_records=total,
        num_bytes=num_bytes,
        element_spec=spec,
        parts=tuple(parts),
        created_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
        build_id=build_id or uuid.uuid4().hex,
        writer_version=f"yogacache {__version__}",
        source=ordered[0].kind if ordered else "python",
        codec=CODEC_NAME,
        format_version=READ_FORMAT_VERSION if keyed else FORMAT_VERSION,
        extra=dict(extra or {}),
    )
    manifest.check_consistent(f"the build of {dataset_id}:{dataset_version}")
    return manifest
