"""PyTorch adapter: a cache as a map-style or an iterable ``torch.utils.data`` dataset.

The only module of the package that imports torch (``pip install 'yogacache[torch]'``); it
never needs TensorFlow. Both datasets hold a ``CacheReader``, which opens LMDB lazily in each
process: DataLoader workers, forked or spawned, open their own environments.

- ``CacheDataset``: map-style, ``len()`` records, ``ds[i]`` the i-th record, for any sampler
  (``DistributedSampler`` included). ``__getitems__`` reads a whole batch of indices at once.
- ``CacheIterableDataset``: this rank's records in the order of ``DataRef.stream`` (YogaDL's
  shard order, or ``shuffle_mode="global"``), split across DataLoader workers in blocks of
  ``batch_size`` records so that the loader yields them in exactly that order, with
  ``set_epoch``, ``state_dict`` and ``load_state_dict`` for exact mid-epoch resume.
- ``CacheDataLoader``: a DataLoader that counts the records it hands out, so its ``state_dict()``
  is exact with any number of workers.
"""

from __future__ import annotations

import copy
import operator
import warnings
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

try:
    import torch
    from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
except ImportError as error:  # pragma: no cover - exercised only without torch
    raise ImportError("yogacache.torch needs PyTorch: pip install 'yogacache[torch]'") from error

from yogacache import launcher
from yogacache.format.spec import STRING, Spec, TensorSpec, flatten, spec_leaves, structure_builder, unflatten
from yogacache.read.epochs import EpochReader
from yogacache.read.options import ReadOptions, stream_arguments, stream_signature
from yogacache.read.pipeline import CacheSource, open_reader, record_position, record_positions
from yogacache.read.reader import CacheReader
from yogacache.read.schedule import ReadSchedule

# open_reader is yogacache.read.pipeline's, re-exported.
__all__ = ["CacheDataLoader", "CacheDataset", "CacheIterableDataset", "from_options", "open_reader"]

OUTPUTS = ("torch", "numpy")
def _check_output(output: str) -> str:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    return output


# -- leaves to tensors --------------------------------------------------------------------------


def _to_torch(value: Any, leaf: TensorSpec) -> Any:
    """A numeric leaf (array or numpy scalar) as a tensor; string leaves stay bytes (or lists)."""
    if leaf.dtype == STRING:
        return value.tolist() if isinstance(value, np.ndarray) else value
    array = np.asarray(value)
    if leaf.dtype == "bfloat16":  # numpy has no bfloat16 of its own (ml_dtypes): reinterpret
        return torch.from_numpy(np.array(array.view(np.uint16))).view(torch.bfloat16)
    if not array.flags.writeable:
        array = array.copy()  # never hand torch memory that belongs to a bytes object
    return torch.from_numpy(array)


def _columns_out(columns: Sequence[np.ndarray], leaves: Sequence[TensorSpec], output: str) -> list[Any]:
    if output == "numpy":
        return list(columns)
    return [_to_torch(column, leaf) for column, leaf in zip(columns, leaves)]


def _rows(columns: Sequence[Any], spec: Spec) -> Iterator[Any]:
    """The records of a batch given as stacked columns (arrays, tensors or lists)."""
    build = structure_builder(spec)
    per_leaf = [column.unbind(0) if isinstance(column, torch.Tensor) else list(column) for column in columns]
    for leaves in zip(*per_leaf):
        yield build(leaves)


def _element_out(element: Any, spec: Spec, leaves: Sequence[TensorSpec], output: str) -> Any:
    if output == "numpy":
        return element
    return unflatten([_to_torch(v, leaf) for v, leaf in zip(flatten(element, spec), leaves)], spec)


# -- map-style ----------------------------------------------------------------------------------


class CacheDataset(Dataset):  # type: ignore[type-arg]
    """Map-style dataset over a cache: ``len()`` records, ``ds[i]`` the i-th in cache order.

    Args:
        source: a CacheReader, a CacheDataRef or a cache directory.
        output: ``"torch"`` (numeric leaves as tensors) or ``"numpy"`` (arrays and numpy
            scalars); string leaves are ``bytes`` either way.
    """

    def __init__(self, source: CacheSource, *, output: str = "torch") -> None:
        self.reader = open_reader(source)
        self.output = _check_output(output)
        self._leaves = spec_leaves(self.reader.spec)
        self._build = structure_builder(self.reader.spec)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_build"]  # a closure: rebuilt on arrival (a spawned DataLoader worker)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._build = structure_builder(self.reader.spec)

    def __len__(self) -> int:
        return len(self.reader)

    def _index(self, index: Any) -> int:
        return record_position(index, len(self.reader))

    def __getitem__(self, index: int) -> Any:
        """Record ``index``, as ``__getitems__([index])[0]`` gives it, read on its own: one
        B-tree search and one decode (a reader without ``read_leaves`` reads a batch of one)."""
        read_leaves = getattr(self.reader, "read_leaves", None)
        if read_leaves is None:
            return self.__getitems__([index])[0]
        leaves = read_leaves(self._index(index))
        if self.output == "torch":
            leaves = [_to_torch(value, leaf) for value, leaf in zip(leaves, self._leaves)]
        return self._build(leaves)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices``, read in one pass (DataLoader calls this per batch)."""
        positions = record_positions(indices, len(self.reader))
        reader, spec = self.reader, self.reader.spec
        if reader.codec.stackable and len(positions):
            columns = _columns_out(reader.read_columns(positions), self._leaves, self.output)
            return list(_rows(columns, spec))
        return [_element_out(e, spec, self._leaves, self.output) for e in reader.read_elements(positions)]


# -- iterable -----------------------------------------------------------------------------------


class CacheIterableDataset(IterableDataset):  # type: ignore[type-arg]
    """This rank's records of a cache, in ``DataRef.stream`` order, split across DataLoader workers.

    The first arguments are ``DataRef.stream``'s; ``shard_rank`` and ``num_shards`` default to
    the launcher's (``yogacache.launcher``). Iterating reads the current epoch (``set_epoch``, as
    with ``DistributedSampler``) from the current resume point to its end; iterating again
    reads the same, so call ``set_epoch`` (or ``next_epoch``) between passes, as
    ``yogacache.determined.repeat_epochs`` does. Worker ``w`` of ``W`` reads blocks
    ``w, w+W, …`` of ``batch_size`` records (``yogacache.read.epochs.plan_reads``), which is
    the order a DataLoader with that batch size yields them in. ``from_options`` makes one from ``ReadOptions`` instead.

    Args:
        batch_size: the DataLoader's batch size (default 1): the unit in which the rank's records
            are dealt to workers.
        batched: yield whole batches of ``batch_size`` records (one stacked tensor per leaf, one
            LMDB read per batch) instead of single records; use ``DataLoader(batch_size=None)``.
            Needs fixed-shape leaves.
        drop_last: with ``batched``, drop a last batch smaller than ``batch_size``.
        output: ``"torch"`` or ``"numpy"``.
        skip_shuffle_end_of_epoch: Determined's spelling of ``skip_shuffle_at_epoch_end``.
        parts_window, ranks_per_node: tune ``shuffle_mode="parts"`` (see ``ReadOptions``), as
            ``DataRef.stream``'s do.
    """

    def __init__(
        self,
        source: CacheSource,
        *args: Any,
        batch_size: Optional[int] = None,
        batched: bool = False,
        drop_last: bool = False,
        output: str = "torch",
        **kwargs: Any,
    ) -> None:
        reader = open_reader(source)
        named = stream_arguments(args, kwargs)
        ranks = launcher.resolve(named.pop("shard_rank", None), named.pop("num_shards", None))
        options = ReadOptions.from_stream_args(**named, shard_rank=ranks.rank, num_shards=ranks.num_shards)
        self._configure(reader, options, batch_size, batched, drop_last, output)

    __init__.__signature__ = stream_signature(  # type: ignore[attr-defined]
        ("self", "source"), batch_size=None, batched=False, drop_last=False, output="torch"
    )

    @classmethod
    def from_options(
        cls,
        source: CacheSource,
        options: ReadOptions,
        *,
        batch_size: Optional[int] = None,
        batched: bool = False,
        drop_last: bool = False,
        output: str = "torch",
    ) -> CacheIterableDataset:
        """The dataset that reads ``source`` as ``options`` say (its rank and shard count included)."""
        dataset = cls.__new__(cls)
        dataset._configure(open_reader(source), options, batch_size, batched, drop_last, output)
        return dataset

    def _configure(
        self,
        reader: CacheReader,
        options: ReadOptions,
        batch_size: Optional[int],
        batched: bool,
        drop_last: bool,
        output: str,
    ) -> None:
        self.reader = reader
        self.epochs = EpochReader(reader, options)
        if batch_size is not None:
            batch_size = operator.index(batch_size)
            if batch_size < 1:
                raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if batched and batch_size is None:
            raise ValueError("batched=True needs a batch_size")
        if batched and not reader.codec.stackable:
            raise ValueError(
                f"batched=True needs fixed-shape leaves, and the cache at {reader.directory} has "
                f"varying shapes ({reader.spec}): use batched=False and a collate_fn"
            )
        self.batch_size = batch_size
        self.batched = bool(batched)
        self.drop_last = bool(drop_last)
        self.output = _check_output(output)
        self._leaves = spec_leaves(reader.spec)
        self._epoch, self._position = self.epochs.start
        self._consumed = 0  # records handed out since the resume point, in the tracking process
        # True once this process counts what it hands out (it iterated the dataset itself, or a
        # CacheDataLoader counts for it); a plain DataLoader's workers count in their own copies.
        self._counting_here = False

    # -- epochs and resume points ---------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def rank(self) -> int:
        return self.epochs.options.shard_rank

    @property
    def num_shards(self) -> int:
        return self.epochs.options.num_shards

    @property
    def schedule(self) -> ReadSchedule:
        """The read order (``EpochReader.schedule``)."""
        return self.epochs.schedule

    def set_epoch(self, epoch: int) -> None:
        """Reads ``epoch`` next; the resume point stays if it is in that epoch, else it is 0."""
        epoch = operator.index(epoch)
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0
            self.reset_consumed()

    def state_dict(self, records_consumed: Optional[int] = None) -> dict[str, Any]:
        """The resume state (a small dict) after this rank consumed ``records_consumed``
        records since the resume point of the current epoch.

        By default, the records this process handed out: exact when the dataset is iterated
        in this process (``num_workers=0``) or through ``CacheDataLoader``. With a plain
        DataLoader and workers, pass the count (e.g. steps × batch size). In global mode, all
        ranks at the same count give the same state, valid with any number of ranks.
        """
        if records_consumed is None and not self._counting_here:
            warnings.warn(
                "CacheIterableDataset.state_dict(): this process has not counted any records: a "
                "DataLoader with num_workers > 0 reads in worker processes, whose counts this "
                "process cannot see, so the state would say that nothing was consumed. Use "
                "yogacache.torch.CacheDataLoader, or pass records_consumed (e.g. steps x batch "
                "size; 0 before reading)",
                UserWarning,
                stacklevel=2,
            )
        records = self._consumed if records_consumed is None else operator.index(records_consumed)
        return self.epochs.state((self._epoch, self._position), records)

    def reset_consumed(self) -> None:
        """Counts the records handed out from zero again (a new pass over the epoch starts)."""
        self._consumed = 0

    def count_consumed(self, item: Any, *, batch: bool) -> None:
        """Counts ``item``, a record or (``batch``) a batch of records, as handed out."""
        self._counting_here = True
        self._consumed += self.batch_records(item) if batch else 1

    def batch_records(self, batch: Any) -> int:
        """The number of records in ``batch`` (a batch of this dataset's elements)."""
        return len(flatten(batch, self.reader.spec)[0])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at ``state`` (from ``state_dict``): the next iteration reads the rest of its epoch."""
        self._epoch, self._position = self.epochs.resume_point(state)
        self.reset_consumed()

    def batch(self, batch_size: int, drop_last: bool = False) -> CacheIterableDataset:
        """A copy that yields batches of ``batch_size`` records (use ``DataLoader(batch_size=None)``)."""
        if not self.reader.codec.stackable:
            raise ValueError("batching inside the dataset needs fixed-shape leaves: use a collate_fn")
        batch_size = operator.index(batch_size)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        batched = copy.copy(self)  # same reader, schedule and resume point
        batched.batch_size, batched.batched, batched.drop_last = batch_size, True, bool(drop_last)
        return batched

    def skip_batches(self, batches: int, batch_size: Optional[int] = None, *, drop_last: bool = False) -> None:
        """Resumes after ``batches`` batches of ``batch_size`` records (default: the dataset's),
        counted from the start of epoch 0 and batched epoch by epoch, as a DataLoader batches
        them: each epoch's last batch is short, or dropped with ``drop_last``. Determined's own
        ``det.pytorch.DataLoader`` resumes a trial this way (it skips whole batches); a resume
        offset of ``batches x batch_size`` records would skip each epoch's shortfall instead.
        """
        size = self.batch_size if batch_size is None else operator.index(batch_size)
        self._epoch, self._position = self.epochs.after_batches(operator.index(batches), size, drop_last=drop_last)
        self.reset_consumed()

    # -- reading --------------------------------------------------------------------------
    def _yields(self, records: int) -> int:
        """Items one iteration over ``records`` records yields: records, or batches."""
        if not self.batched:
            return records
        if self.batch_size is None:
            raise ValueError("a batched dataset needs a batch_size")
        return records // self.batch_size if self.drop_last else -(-records // self.batch_size)

    def __len__(self) -> int:
        """Records (or, with ``batched``, batches) one iteration yields on this rank: the rest
        of the current epoch from the resume point."""
        return self._yields(self.epochs.remaining(self._position))

    @property
    def epoch_length(self) -> int:
        """Records (or, with ``batched``, batches) a whole epoch yields on this rank, wherever
        the resume point is."""
        return self._yields(len(self.epochs))

    def next_epoch(self) -> None:
        """Reads the next epoch from its start on the next iteration (``set_epoch(epoch + 1)``)."""
        self.set_epoch(self._epoch + 1)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is None:
            self._counting_here = True
        self.reset_consumed()
        # A streamed cache fetches this epoch's parts ahead, then the next epoch's.
        reads = self.epochs.reads(
            (self._epoch, self._position),
            block_size=self.batch_size or 1,
            worker=worker,
            workers=workers,
            drop_partial=self.batched and self.drop_last,
        )
        for indices in reads:
            items = self._items(indices)
            for item in items:
                self.count_consumed(item, batch=self.batched)  # counted when handed out
                yield item

    def _items(self, indices: np.ndarray) -> Iterator[Any]:
        """What this dataset yields from one read of the records at ``indices``."""
        reader, spec, output = self.reader, self.reader.spec, self.output
        if not reader.codec.stackable:
            return (_element_out(e, spec, self._leaves, output) for e in reader.read_elements(indices))
        columns = reader.read_columns(indices)
        if self.batched:
            return self._batches(columns, len(indices))
        return _rows(_columns_out(columns, self._leaves, output), spec)

    def _batches(self, columns: list[np.ndarray], records: int) -> Iterator[Any]:
        """The blocks of one read, as batches (reads hold whole blocks: only the last may be short)."""
        block = self.batch_size or 1
        for offset in range(0, records, block):
            part = [column[offset : offset + block] for column in columns]
            yield unflatten(_columns_out(part, self._leaves, self.output), self.reader.spec)


# -- loader -------------------------------------------------------------------------------------


class CacheDataLoader(DataLoader):  # type: ignore[type-arg]
    """A DataLoader over a ``CacheIterableDataset`` whose ``state_dict()`` is exact with workers.

    Workers read ahead, so only the main process knows what training consumed: this loader
    counts the records it hands out and asks the dataset for the matching resume state. With
    ``batch_size=B`` and a dataset made without one, the dataset deals records to workers in
    blocks of B, so the loader yields the rank's records in order.
    """

    def __init__(self, dataset: CacheIterableDataset, *args: Any, **kwargs: Any) -> None:
        if not isinstance(dataset, CacheIterableDataset):
            raise TypeError(f"CacheDataLoader reads a CacheIterableDataset, not {type(dataset).__name__}")
        if kwargs.get("persistent_workers"):
            raise ValueError(
                "persistent_workers=True would keep the workers' copy of the dataset, which does "
                "not see set_epoch or load_state_dict: leave it off"
            )
        super().__init__(dataset, *args, **kwargs)
        if dataset.batched and self.batch_size is not None:
            raise ValueError("the dataset already yields batches: pass batch_size=None to the loader")
        if self.batch_size is not None:
            if dataset.batch_size is None:
                dataset.batch_size = self.batch_size
            elif dataset.batch_size != self.batch_size:
                raise ValueError(
                    f"the dataset deals records to workers in blocks of {dataset.batch_size}, the "
                    f"loader's batch_size is {self.batch_size}: make them equal"
                )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        dataset: CacheIterableDataset = self.dataset  # type: ignore[assignment]
        # In-process (num_workers=0) the dataset counts what it hands out itself.
        counting = self.num_workers > 0
        if counting:
            dataset._counting_here = True
            dataset.reset_consumed()
        batching = dataset.batched or self.batch_size is not None
        batches = super().__iter__()  # starts the workers
        if self.num_workers > 0:
            # A streamed cache's first part starts on its way now, not once the workers have
            # started and planned (0.2 s or more): they find it being fetched.
            dataset.epochs.prefetch((dataset._epoch, dataset._position))
        for batch in batches:
            if counting:
                dataset.count_consumed(batch, batch=batching)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return self.dataset.state_dict()  # type: ignore[attr-defined,no-any-return]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]


def from_options(ref: CacheSource, options: ReadOptions) -> CacheIterableDataset:
    """What ``DataLayer`` decorators return with ``returns="torch"``: ``ref`` (a DataRef or a
    mixture) read as ``options`` say (``CacheIterableDataset.from_options``)."""
    return CacheIterableDataset.from_options(ref, options)
