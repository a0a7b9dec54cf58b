"""Ray Data adapter: a cache as a ``ray.data.Dataset`` whose read tasks each read a range of one epoch's plan.

The only module of the read path that imports Ray (``pip install 'yogacache[ray]'``).
``read_cache`` names a cache (by id and version on a storage, or as anything
``yogacache.read.pipeline.open_reader`` takes) and returns a Dataset of one epoch:

- its records in cache order, or in the epoch's order of one of yogacache's shuffle modes
  (``shuffle=True``, ``shuffle_mode="shard" | "global" | "parts"``), which the Dataset keeps when
  iterated (``preserve_order`` on the Dataset's own ``DataContext``);
- one column per leaf of the element spec (``column_names``), numpy when read back
  (``iter_batches(batch_format="numpy")``, ``iter_torch_batches``), string leaves as bytes;
- ``count()`` from the read tasks' metadata (the epoch plan's length), without reading;
- read tasks over contiguous ranges of the plan, cut at part boundaries where the order reads
  parts one after the other, so that a streamed cache's task fetches only the parts of its range.

Splitting the epoch among Ray Train workers is Ray's (``train.get_dataset_shard`` /
``streaming_split``): ``shard_rank`` and ``num_shards`` default to one shard, the whole epoch.
"""

from __future__ import annotations

import copy
import functools
import inspect
import operator
from typing import Any, Iterator, Optional, Sequence

import numpy as np

try:
    import ray.data
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as error:  # pragma: no cover - exercised only without Ray
    raise ImportError("yogacache.ray needs Ray Data: pip install 'yogacache[ray]'") from error

from yogacache import redaction
from yogacache.format.spec import STRING, Spec, leaf_paths, spec_leaves
from yogacache.read.epochs import EpochReader, layout_of
from yogacache.read.layout import PartLayout
from yogacache.read.options import ReadOptions, stream_arguments, stream_signature
from yogacache.read.pipeline import CacheSource, open_reader
from yogacache.read.plans import GlobalPlan
from yogacache.read.reader import CacheReader
from yogacache.store import open_cache

__all__ = ["CacheDatasource", "column_names", "from_options", "read_cache"]

#: The column of a cache whose elements are single tensors (Ray's name for such a column).
ITEM_COLUMN = "item"
#: What joins the keys of a nested leaf's path into its column name.
PATH_SEPARATOR = "/"


def column_names(spec: Spec) -> list[str]:
    """One column name per leaf of ``spec``, in flattening order (``spec_leaves``): a dict's keys,
    a tuple's positions (``"0"``, ``"1"``, …), nested paths joined with ``"/"``
    (``{"image": {"rgb": …}}`` → ``"image/rgb"``); ``"item"`` for an element that is one tensor."""
    paths = leaf_paths(spec)
    if paths == [()]:
        return [ITEM_COLUMN]
    names = [PATH_SEPARATOR.join(str(key) for key in path) for path in paths]
    if len(set(names)) != len(names):
        clashing = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(
            f"the element spec's leaves {clashing} would share a column name: a dict key holds "
            f"{PATH_SEPARATOR!r}; rename the key when building the cache"
        )
    return names


class CacheDatasource(Datasource):  # type: ignore[misc]
    """A Ray Data ``Datasource`` of one epoch of a cache, read as ``options`` say.

    Args:
        source: a CacheReader, a CacheDataRef, a Mixture or a cache directory.
        options: how the epoch is ordered and which rank's records are read (``ReadOptions``).
        epoch: the epoch to read; by default the start point's (``options.start_offset`` or
            ``options.resume_state``), read from that point on; any other epoch is read whole.
    """

    def __init__(self, source: CacheSource, options: Optional[ReadOptions] = None, *, epoch: Optional[int] = None):
        super().__init__()
        self.reader = open_reader(source)
        self.options = options if options is not None else ReadOptions()
        self.columns = column_names(self.reader.spec)
        if any(leaf.dtype == "bfloat16" for leaf in spec_leaves(self.reader.spec)):
            raise ValueError(
                f"the cache at {self.reader.directory} has bfloat16 leaves, which Arrow (Ray Data's "
                "blocks) cannot hold: read it with yogacache.torch or yogacache.grain"
            )
        self.epoch = self._epochs().start[0] if epoch is None else operator.index(epoch)
        if self.epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        self.position = self._epochs().first_position(self.epoch)

    def _epochs(self) -> EpochReader:
        """The epochs of this process's reader (made once per process: not pickled)."""
        epochs: Optional[EpochReader] = self.__dict__.get("_epoch_reader")
        if epochs is None:
            epochs = self.__dict__["_epoch_reader"] = EpochReader(self.reader, self.options)
        return epochs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_epoch_reader", None)  # the reader pickles; the schedule is rebuilt on arrival
        state.pop("_part_layout", None)
        return state

    def __len__(self) -> int:
        """Records this Dataset holds: the rest of the epoch from its first position."""
        return self._epochs().remaining(self.position)

    def get_name(self) -> str:
        return "YogaCache"

    def estimate_inmemory_data_size(self) -> Optional[int]:
        return len(self) * int(self.reader.average_record_bytes)

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: Optional[int] = None, data_context: Any = None
    ) -> list[ReadTask]:
        """At most ``parallelism`` tasks, each reading a contiguous range of the epoch's plan,
        with its row count in its metadata (``Dataset.count()`` reads nothing)."""
        bounds = self.task_bounds(parallelism)
        record_bytes = int(self.reader.average_record_bytes)
        # Each task reads through a copy of its own (what sending the reader to a worker process
        # makes anyway) and closes it when done: a finished task holds no part of a streamed cache.
        tasks = []
        for begin, end in zip(bounds, bounds[1:]):
            metadata = BlockMetadata(
                num_rows=end - begin, size_bytes=(end - begin) * record_bytes, exec_stats=None, input_files=None
            )
            read = functools.partial(_read_range, self.reader, self.options, (self.epoch, self.position), (begin, end))
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks

    def task_bounds(self, parallelism: int) -> list[int]:
        """The plan positions where read tasks begin, and the plan's end: ``parallelism`` ranges
        (no more than the parts the cache holds: Ray's hint sizes blocks of 1 MiB, and a task
        costs Ray milliseconds of its own, as much as reading a few hundred records) as even as
        may be, each cut moved to the nearest clean cut between parts (one where every part read
        before it is done with) within half a range."""
        total = len(self)
        if total == 0:
            return [0]
        parts = max(1, self._layout().num_parts)
        count = max(1, min(operator.index(parallelism), total, parts))
        # k·total/count rounded half to even, as ``round`` does (exact: k·total < 2**53).
        even = np.rint(np.arange(count + 1, dtype=np.int64) * total / count).astype(np.int64)
        if count == 1:
            return even.tolist()  # type: ignore[no-any-return]
        cuts = self._clean_cuts()
        if len(cuts):
            # Each inner bound moves to the nearest clean cut (the lower one on a tie) when
            # that is within half a range: one vectorised pass, not a search per task.
            inner = even[1:-1]
            at = np.searchsorted(cuts, inner)
            below = cuts[np.maximum(at - 1, 0)]
            above = cuts[np.minimum(at, len(cuts) - 1)]
            take_below = (at > 0) & ((at == len(cuts)) | (np.abs(below - inner) <= np.abs(above - inner)))
            best = np.where(take_below, below, above)
            even[1:-1] = np.where(np.abs(best - inner) <= total / count / 2, best, inner)
        return np.unique(even).tolist()  # type: ignore[no-any-return]

    def _layout(self) -> PartLayout:
        """How the reader's records lie in parts (made once per process: not pickled)."""
        layout: Optional[PartLayout] = self.__dict__.get("_part_layout")
        if layout is None:
            layout = self.__dict__["_part_layout"] = layout_of(self.reader)
        return layout

    def _clean_cuts(self) -> np.ndarray:
        """Plan positions (inside the plan) before which every part read is done with: the
        parts' starts in cache order, the window boundaries of ``"parts"``, none where parts
        are read at random (a permuted ``"global"`` plan: not looked for, which would map every
        record of the epoch through the permutation)."""
        if self._layout().num_parts < 2:
            return np.empty(0, dtype=np.int64)
        plan = self._epochs().schedule.plan(self.epoch, self.position)
        if isinstance(plan, GlobalPlan) and plan.permutation is not None:
            return np.empty(0, dtype=np.int64)
        uses = self._epochs().schedule.parts_needed(self.epoch, self.position)
        if len(uses) < 2:
            return np.empty(0, dtype=np.int64)
        first = np.array([use.first for use in uses], dtype=np.int64)
        last = np.array([use.last for use in uses], dtype=np.int64)
        order = np.argsort(first, kind="stable")
        first, last = first[order], last[order]
        done_before = np.maximum.accumulate(last)[:-1]  # the last read of the parts first used earlier
        return first[1:][done_before < first[1:]]


def _read_range(
    shipped: CacheReader, options: ReadOptions, point: tuple[int, int], positions: tuple[int, int]
) -> Iterator[Any]:
    """A read task: plan positions ``[begin, end)`` of the epoch from ``point``, as blocks of
    numpy columns, in plan order, read by a copy of the reader ``shipped`` (its own, even where
    the task runs in the process that made the Dataset), closed at the end.
    A streamed cache is told to fetch the range's parts, and only them."""
    reader = copy.deepcopy(shipped)  # reopens its parts as a reader sent to another process does
    try:
        yield from _read_blocks(reader, options, point, positions)
    finally:
        reader.close()  # releases its parts: the node's budget is free for the next task


def _read_blocks(
    reader: CacheReader, options: ReadOptions, point: tuple[int, int], positions: tuple[int, int]
) -> Iterator[Any]:
    epochs = EpochReader(reader, options)
    plan = epochs.schedule.plan(*point)
    begin, end = positions
    if reader.streamed:

        def parts_in_order() -> list[list[int]]:
            parts = layout_of(reader).part_of(plan.indices(begin, end))
            unique, first = np.unique(parts, return_index=True)
            return [unique[np.argsort(first, kind="stable")].tolist()]

        reader.expect_parts(parts_in_order)
    names = column_names(reader.spec)
    leaves = spec_leaves(reader.spec)
    step = epochs.sizes.full
    for start in range(begin, end, step):
        indices = plan.indices(start, min(end, start + step))
        yield BlockAccessor.batch_to_block(dict(zip(names, _columns(reader, indices, leaves))))


def _columns(reader: CacheReader, indices: np.ndarray, leaves: Sequence[Any]) -> list[np.ndarray]:
    """One numpy column per leaf of the records at ``indices``: the fast gather where the leaves
    have fixed shapes; otherwise object columns of each record's leaf."""
    if reader.codec.stackable:
        columns = reader.read_columns(indices)
    else:
        from yogacache.format.spec import flatten

        records = [flatten(element, reader.spec) for element in reader.read_elements(indices)]
        columns = []
        for i in range(len(leaves)):
            column = np.empty(len(records), dtype=object)
            column[:] = [np.asarray(record[i]) if leaves[i].dtype != STRING else record[i] for record in records]
            columns.append(column)
    return [
        np.asarray(column, dtype=object) if leaf.dtype == STRING else column for column, leaf in zip(columns, leaves)
    ]


def _dataset(
    datasource: CacheDatasource, override_num_blocks: Optional[int], ray_remote_args: Optional[dict[str, Any]]
) -> ray.data.Dataset:
    """The Dataset of ``datasource``, which keeps the plan's order when iterated. By default one
    read task per part (``task_bounds``): Ray, asked for more blocks than a datasource makes
    tasks, splits every block after reading it, which cost 2.5x the read in the benchmark."""
    blocks = override_num_blocks
    if blocks is None:
        blocks = max(1, len(datasource.task_bounds(datasource._layout().num_parts)) - 1)
    remote_args = dict(ray_remote_args or {})
    dataset = ray.data.read_datasource(datasource, override_num_blocks=blocks, ray_remote_args=remote_args)
    # The Dataset's own DataContext (a copy made by read_datasource): the global one is untouched.
    dataset.context.execution_options.preserve_order = True
    return dataset


def read_cache(
    dataset_id_or_source: Any,
    dataset_version: Optional[str] = None,
    storage: Any = None,
    *,
    epoch: Optional[int] = None,
    override_num_blocks: Optional[int] = None,
    ray_remote_args: Optional[dict[str, Any]] = None,
    **stream_args: Any,
) -> ray.data.Dataset:
    """One epoch of a cache as a ``ray.data.Dataset`` (see the module).

    Args:
        dataset_id_or_source: a dataset id (with ``dataset_version``, on ``storage``:
            ``yogacache.store.open_cache``), or a CacheReader, CacheDataRef, Mixture or cache
            directory.
        dataset_version: the cache's version, when ``dataset_id_or_source`` is an id.
        storage: where the cache lives: a YogaDL storage or ``DataLayer``, a ``data_layer``
            mapping, a URL, a config file, a directory, or None for the local default.
        epoch: the epoch to read (default: the start point's, from ``start_offset`` or
            ``resume_state``).
        override_num_blocks: the number of read tasks, at most one per part (Ray's hint otherwise).
        ray_remote_args: Ray's remote arguments for the read tasks (``num_cpus``, …).
        **stream_args: ``DataRef.stream``'s arguments by name (``shuffle``, ``shuffle_seed``,
            ``skip_shuffle_at_epoch_end``, ``shuffle_mode``, ``start_offset``, ``resume_state``,
            ``shard_rank``, ``num_shards``, ``drop_shard_remainder``, the modes' settings);
            ``shard_rank``/``num_shards`` default to one shard, not the launcher's rank.
    """
    options = ReadOptions.from_stream_args(**stream_arguments((), stream_args))
    if isinstance(dataset_id_or_source, str) and dataset_version is not None:
        reader = open_cache(dataset_id_or_source, dataset_version, storage)
    elif storage is not None or dataset_version is not None:
        raise TypeError(
            "read_cache takes a dataset id with dataset_version (and storage), or a reader, DataRef, "
            f"mixture or directory alone; got {type(dataset_id_or_source).__name__} with "
            f"dataset_version={redaction.describe(dataset_version)}, storage={redaction.describe(storage)}"
        )
    else:
        reader = open_reader(dataset_id_or_source)
    return _dataset(CacheDatasource(reader, options, epoch=epoch), override_num_blocks, ray_remote_args)


def _read_cache_signature() -> inspect.Signature:
    """``read_cache``'s signature with the stream arguments listed by name, for ``help()``."""
    named = stream_signature((), epoch=None, override_num_blocks=None, ray_remote_args=None)
    leading = [
        inspect.Parameter("dataset_id_or_source", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("dataset_version", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("storage", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
    ]
    keywords = [each.replace(kind=inspect.Parameter.KEYWORD_ONLY) for each in named.parameters.values()]
    return inspect.Signature([*leading, *keywords], return_annotation="ray.data.Dataset")


read_cache.__signature__ = _read_cache_signature()  # type: ignore[attr-defined]


def from_options(ref: CacheSource, options: ReadOptions) -> ray.data.Dataset:
    """What ``DataLayer`` decorators return with ``returns="ray"``: ``ref`` (a DataRef or a
    mixture) read as ``options`` say, the start point's epoch."""
    return _dataset(CacheDatasource(ref, options), None, None)
