"""Grain adapter: a cache as a Grain data source, and yogacache's read orders as a Grain sampler.

The only module of the package that imports Grain (``pip install 'yogacache[grain]'``). It reads
through the one ``EpochReader`` as the torch and tf.data adapters do:

- ``CacheDataSource``: a Grain ``RandomAccessDataSource`` (``len()``, ``ds[i]``, and batched
  ``__getitems__`` / ``_getitems`` through the reader's gather), records as numpy structures, the
  same as ``yogacache.torch.CacheDataset(..., output="numpy")``. Use it under any Grain order:
  ``grain.MapDataset.source(ds).shuffle(seed)`` or ``grain.DataLoader`` with an ``IndexSampler``.
- ``CacheSampler``: a Grain sampler reading this rank's records in yogacache's order
  (``shuffle_mode="shard" | "global" | "parts"``, epoch after epoch, from ``start_offset`` or a
  resume state), for ``grain.DataLoader``; ``state(records)`` is yogacache's resume state, valid
  at any world size in ``global`` and ``parts`` order.
- ``from_options``: what the ``DataLayer`` decorators return with ``returns="grain"``: a
  ``grain.MapDataset`` in that order.

Both pickle into Grain's worker processes: the reader reopens its parts there (a streamed cache
reuses the node's fetched parts; nothing is downloaded again).
"""

from __future__ import annotations

import operator
import sys
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

try:
    import grain
except ImportError as error:  # pragma: no cover - exercised only without grain
    raise ImportError("yogacache.grain needs Grain: pip install 'yogacache[grain]'") from error

from yogacache import launcher
from yogacache.format.spec import structure_builder, unflatten
from yogacache.read.options import ReadOptions, stream_arguments, stream_signature
from yogacache.read.pipeline import CacheSource, open_reader, record_position
from yogacache.read.state import fingerprint

if TYPE_CHECKING:
    from yogacache.read.epochs import EpochReader

__all__ = ["CacheDataSource", "CacheSampler", "from_options", "open_data_source"]

# Positions of an epoch's order a sampler computes at once (32 KiB of record indices).
ORDER_BLOCK = 4096


class CacheDataSource:
    """A Grain ``RandomAccessDataSource`` over a cache (or a mixture, its components concatenated):
    ``ds[i]`` is record ``i`` in cache order, as numpy arrays and scalars (strings as bytes).

    Args:
        source: a CacheReader, a CacheDataRef, a ``yogacache.Mixture`` or a cache directory;
            ``open_data_source`` opens one by ``(dataset_id, dataset_version)`` on a storage.
    """

    def __init__(self, source: CacheSource) -> None:
        self.reader = open_reader(source)
        self._build = structure_builder(self.reader.spec)

    def __len__(self) -> int:
        return len(self.reader)

    def __repr__(self) -> str:
        # Grain compares a checkpoint's repr of its source with the loader's: name the build,
        # never an object's address.
        manifest = getattr(self.reader, "manifest", None)
        if manifest is None:  # a mixture: its components, in order
            names = ", ".join(repr(CacheDataSource(reader)) for reader in self.reader.readers)  # type: ignore[attr-defined]
            return f"CacheDataSource(mixture=[{names}])"
        return (
            f"CacheDataSource(dataset_id={manifest.dataset_id!r}, dataset_version={manifest.dataset_version!r}, "
            f"build_id={manifest.build_id!r}, records={manifest.num_records})"
        )

    def _index(self, index: Any) -> int:
        return record_position(index, len(self.reader), "a cache")

    def __getitem__(self, index: int) -> Any:
        """Record ``index``, as ``__getitems__([index])[0]`` gives it, read on its own (Grain's
        DataLoader reads record by record): one B-tree search in this thread's reused read-only
        transaction and one decode (a mixture reads a batch of one)."""
        read_leaves = getattr(self.reader, "read_leaves", None)
        if read_leaves is None:
            return self.__getitems__([index])[0]
        leaves = read_leaves(self._index(index))
        return self._build(leaves) if self.reader.codec.stackable else unflatten(leaves, self.reader.spec)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices``, read in one pass (one gather per leaf)."""
        positions = np.fromiter((self._index(i) for i in indices), dtype=np.int64, count=len(indices))
        reader = self.reader
        if not len(positions):
            return []
        if not reader.codec.stackable:
            return reader.read_elements(positions)
        columns = [list(column) for column in reader.read_columns(positions)]
        return [self._build(leaves) for leaves in zip(*columns)]

    # Grain's batched-read protocol (SupportsBatchedReadRandomAccessDataSource).
    _getitems = __getitems__

    def __getstate__(self) -> dict[str, Any]:
        return {"reader": self.reader}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["reader"])  # type: ignore[misc]


def open_data_source(dataset_id: str, dataset_version: str, storage: Any = None) -> CacheDataSource:
    """The data source of the cache ``(dataset_id, dataset_version)`` on ``storage`` (a YogaDL
    storage, a ``DataLayer``, a ``data_layer`` mapping, a URL, a config file, a directory, or None
    for the local default), synced or streamed under its budget as the storage says."""
    from yogacache.store import open_cache  # here: Grain's workers unpickle a source without it

    return CacheDataSource(open_cache(dataset_id, dataset_version, storage))


class _Order:
    """Position ``k`` of a rank's read from its start point -> the record it reads: the first
    epoch from the start position, then whole epochs (``EpochReader``'s plans, one held at a time)."""

    def __init__(self, epochs: EpochReader) -> None:
        self.epochs = epochs
        self.start = epochs.start
        self.first = epochs.remaining(self.start[1])
        self.per_epoch = len(epochs)
        self._plan: Optional[tuple[int, Any]] = None
        self._held: Optional[tuple[int, int, np.ndarray]] = None

    def locate(self, k: int) -> tuple[int, int]:
        """(epoch, position within the plan read from that epoch's first position) of ``k``."""
        if k < self.first:
            return self.start[0], k
        if self.per_epoch == 0:
            raise IndexError(f"index {k} is past the records of an empty epoch")
        epoch, position = divmod(k - self.first, self.per_epoch)
        return self.start[0] + 1 + epoch, position

    def records(self, ks: Sequence[int]) -> np.ndarray:
        """The record indices at positions ``ks`` (in the order given)."""
        out = np.empty(len(ks), dtype=np.int64)
        for j, k in enumerate(ks):
            epoch, position = self.locate(k)
            block, at = divmod(position, ORDER_BLOCK)
            out[j] = self._block(epoch, block)[at]
        return out

    def _block(self, epoch: int, block: int) -> np.ndarray:
        """Records ``block * ORDER_BLOCK`` … of ``epoch``'s plan, computed together (a keyed
        permutation costs as much for one position as for thousands) and kept while read."""
        if self._held is None or self._held[:2] != (epoch, block):
            if self._plan is None or self._plan[0] != epoch:
                self._plan = (epoch, self.epochs.plan(epoch, self.epochs.first_position(epoch)))
            plan = self._plan[1]
            begin = block * ORDER_BLOCK
            self._held = (epoch, block, plan.indices(begin, min(len(plan), begin + ORDER_BLOCK)))
        return self._held[2]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_plan": None, "_held": None}  # recomputed where they are read


def _options(args: tuple[Any, ...], kwargs: dict[str, Any], shard_options: Any) -> ReadOptions:
    named = stream_arguments(args, kwargs)
    rank, shards = named.pop("shard_rank", None), named.pop("num_shards", None)
    if shard_options is not None:
        if rank is not None or shards is not None:
            raise ValueError("pass either shard_options or shard_rank/num_shards, not both")
        rank, shards = shard_options.shard_index, shard_options.shard_count
        named.setdefault("drop_shard_remainder", bool(shard_options.drop_remainder))
    ranks = launcher.resolve(rank, shards)
    return ReadOptions.from_stream_args(**named, shard_rank=ranks.rank, num_shards=ranks.num_shards)


class CacheSampler:
    """A Grain sampler: this rank's records of a cache in yogacache's order, for ``grain.DataLoader``.

    Index ``k`` is the ``k``-th record this rank reads from its start point: the rest of the
    start epoch, then whole epochs (``num_epochs`` in all; None reads on forever), each in the
    order ``DataRef.stream`` reads with the same arguments (YogaDL's ``shuffle``,
    ``shuffle_seed``, ``start_offset``…, ``shuffle_mode``, ``resume_state``). The sampler shards
    (``shard_rank``/``num_shards``, or Grain's ``shard_options`` such as ``ShardByJaxProcess()``;
    default: the launcher's), so the loader must not shard again: it takes the sampler's
    ``NoSharding()`` by itself.

    Args:
        source: a ``CacheDataSource`` (the sampler then announces the parts a streamed cache
            reads next through its reader) or anything it takes.
        num_epochs: epochs to read, counting the start epoch; None for no end.
        shard_options: a Grain ``ShardOptions``, instead of ``shard_rank``/``num_shards``.
    """

    def __init__(
        self,
        source: Any,
        *args: Any,
        num_epochs: Optional[int] = 1,
        shard_options: Any = None,
        **kwargs: Any,
    ) -> None:
        self._configure(source, _options(args, kwargs, shard_options), num_epochs)

    __init__.__signature__ = stream_signature(  # type: ignore[attr-defined]
        ("self", "source"), num_epochs=1, shard_options=None
    )

    @classmethod
    def from_options(cls, source: Any, options: ReadOptions, *, num_epochs: Optional[int] = 1) -> CacheSampler:
        """The sampler that reads ``source`` as ``options`` say (its rank and shard count included)."""
        sampler = cls.__new__(cls)
        sampler._configure(source, options, num_epochs)
        return sampler

    def _configure(self, source: Any, options: ReadOptions, num_epochs: Optional[int]) -> None:
        data = source if isinstance(source, CacheDataSource) else CacheDataSource(source)
        if num_epochs is not None:
            num_epochs = operator.index(num_epochs)
            if num_epochs < 1:
                raise ValueError(f"num_epochs must be at least 1 (or None for no end), got {num_epochs}")
        self.source = data
        self.options = options
        from yogacache.read.epochs import EpochReader  # here: a worker's source does without it

        self.epochs = EpochReader(data.reader, options)
        self.num_epochs = num_epochs
        self._order = _Order(self.epochs)
        # Grain's loader shards the sampler's indices unless told not to: this sampler already has.
        self._shard_options = grain.sharding.NoSharding()

    def __len__(self) -> int:
        """Records read in all: the rest of the start epoch and the whole epochs after it."""
        if self.num_epochs is None:
            return sys.maxsize
        return self._order.first + (self.num_epochs - 1) * self._order.per_epoch

    @property
    def epoch_length(self) -> int:
        """Records this rank reads in a whole epoch."""
        return self._order.per_epoch

    @property
    def first_epoch_length(self) -> int:
        """Records read of the start epoch (from the start point to its end)."""
        return self._order.first

    def __getitem__(self, index: int) -> grain.RecordMetadata:
        k = operator.index(index)
        if k < 0 or k >= len(self):
            raise IndexError(f"sampler index {index} is past the {len(self)} records of {self.num_epochs} epoch(s)")
        return grain.RecordMetadata(index=k, record_key=int(self._order.records([k])[0]))

    def record_keys(self, indices: Sequence[int]) -> np.ndarray:
        """The cache records at sampler indices ``indices`` (no bounds on the epochs)."""
        return self._order.records([operator.index(i) for i in indices])

    def state(self, records_consumed: int) -> dict[str, Any]:
        """yogacache's resume state after this rank consumed ``records_consumed`` records from the
        start point (e.g. steps x batch size): pass it as ``resume_state=`` to a new sampler, at
        any world size in ``global`` and ``parts`` order."""
        return self.epochs.state(self._order.start, operator.index(records_consumed))

    def __repr__(self) -> str:
        # Grain checks a checkpoint against repr(sampler): the order's definition, no addresses.
        # ``order`` fingerprints everything that decides it, as resume states record it (mixture
        # counts, mode settings such as parts_window and ranks_per_node, windows fitted to the
        # budget: ``ReadSchedule.order_settings``), so a checkpoint of another order is refused.
        o = self.options
        order = fingerprint(self.epochs.schedule.order_settings())
        return (
            f"CacheSampler({self.source!r}, order={order}, shuffle={o.shuffle}, "
            f"reshuffle_each_epoch={o.reshuffle_each_epoch}, shuffle_seed={o.shuffle_seed}, "
            f"shuffle_mode={o.shuffle_mode!r}, shard_rank={o.shard_rank}, num_shards={o.num_shards}, "
            f"start={self._order.start}, num_epochs={self.num_epochs})"
        )


class _OrderedDataset(grain.MapDataset):  # type: ignore[misc]
    """A ``grain.MapDataset`` of a sampler's order: element ``k`` is the sampler's ``k``-th record.
    Its length is the first epoch's; indices past it (``.repeat()``) read the next epochs."""

    def __init__(self, sampler: CacheSampler) -> None:
        super().__init__([])
        self._sampler = sampler

    def __len__(self) -> int:
        return self._sampler.first_epoch_length

    def __str__(self) -> str:
        return f"yogacache {self._sampler!r}"

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self.slice(index)
        return self._getitems([index])[0]

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        return self._sampler.source._getitems(self._sampler.record_keys(indices).tolist())


def from_options(ref: Any, options: ReadOptions) -> grain.MapDataset:
    """What ``DataLayer`` decorators return with ``returns="grain"``: ``ref`` (a DataRef or a
    mixture) read as ``options`` say, as a ``grain.MapDataset`` (its length one epoch from the
    start point; ``.repeat(n)`` reads the next epochs in their own order; ``.batch(b)``,
    ``.to_iter_dataset()`` and its iterator's ``get_state``/``set_state`` as for any MapDataset)."""
    return _OrderedDataset(CacheSampler.from_options(ref, options, num_epochs=None))
