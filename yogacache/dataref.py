"""DataRef and Stream: YogaDL's reading interface, backed by a CacheReader and the sampler."""

from __future__ import annotations

import abc
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np

from yogacache.codec import Spec
from yogacache.reader import CacheReader
from yogacache.sampler import ShardOrder, shard_indices

# Records per read from LMDB; batches of large records are capped by bytes instead.
READ_BATCH_RECORDS = 1024
READ_BATCH_BYTES = 8 << 20
# The first read of an epoch is small, so the first element arrives quickly.
FIRST_READ_RECORDS = 32


class Stream:
    """An iterable of elements; each new iteration is the next epoch. ``len()`` is the shard length.

    Compatible with ``yogadl.Stream(iterator_fn, length, output_types, output_shapes)``; streams
    made by yogacache also know their framework-neutral ``element_spec`` and can yield whole
    batches of stacked columns, which is how the TensorFlow adapter avoids per-record overhead.
    """

    def __init__(
        self,
        iterator_fn: Callable[[], Iterator[Any]],
        length: int,
        output_types: Any = None,
        output_shapes: Any = None,
        *,
        element_spec: Optional[Spec] = None,
        batch_iterator_fn: Optional[Callable[[], Iterator[list[np.ndarray]]]] = None,
        uniform_epochs: bool = False,
    ) -> None:
        self.iterator_fn = iterator_fn
        self.length = length
        # True when every epoch, the first included, yields exactly ``length`` elements.
        self.uniform_epochs = uniform_epochs
        self._output_types = output_types
        self._output_shapes = output_shapes
        self.element_spec = element_spec
        self.batch_iterator_fn = batch_iterator_fn

    def __iter__(self) -> Iterator[Any]:
        return self.iterator_fn()

    def __len__(self) -> int:
        return self.length

    @property
    def output_types(self) -> Any:
        """The element's ``tf.DType`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_types is None and self.element_spec is not None:
            from yogacache.tensorflow import spec_to_tf

            self._output_types = spec_to_tf(self.element_spec, "dtype")
        return self._output_types

    @output_types.setter
    def output_types(self, value: Any) -> None:
        self._output_types = value

    @property
    def output_shapes(self) -> Any:
        """The element's ``tf.TensorShape`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_shapes is None and self.element_spec is not None:
            from yogacache.tensorflow import spec_to_tf

            self._output_shapes = spec_to_tf(self.element_spec, "shape")
        return self._output_shapes

    @output_shapes.setter
    def output_shapes(self, value: Any) -> None:
        self._output_shapes = value


class DataRef(metaclass=abc.ABCMeta):
    """A reference to a cached dataset; the only way to its records is a Stream."""

    @abc.abstractmethod
    def stream(
        self,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
    ) -> Stream:
        """A stream over one shard of the dataset, in the order the arguments define."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records in the whole dataset."""


class _EpochCursor:
    """Hands out each epoch's record indices in turn, starting at the resume offset."""

    def __init__(self, order: ShardOrder, start_offset: int) -> None:
        self._order = order
        self._epoch, self._position = order.start(start_offset)
        self._lock = threading.Lock()

    def next_epoch(self) -> np.ndarray:
        with self._lock:
            epoch, position = self._epoch, self._position
            self._epoch += 1
            self._position = 0
        return self._order.epoch(epoch)[position:]


class CacheDataRef(DataRef):
    """A DataRef over a sealed local cache."""

    def __init__(self, reader: CacheReader) -> None:
        self.reader = reader

    @property
    def manifest(self) -> Any:
        return self.reader.manifest

    def __len__(self) -> int:
        return len(self.reader)

    def stream(
        self,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
    ) -> Stream:
        shard = shard_indices(len(self.reader), shard_rank, num_shards, drop_shard_remainder)
        order = ShardOrder(
            shard,
            shuffle=bool(shuffle),
            reshuffle_each_epoch=bool(shuffle) and not skip_shuffle_at_epoch_end,
            seed=shuffle_seed,
        )
        cursor = _EpochCursor(order, start_offset)
        reader = self.reader
        chunk = _chunk_size(reader)

        def iterate_elements() -> Iterator[Any]:
            indices = cursor.next_epoch()
            for piece in _pieces(indices, chunk):
                yield from reader.read_elements(piece)

        batch_fn = None
        if reader.codec.stackable:

            def iterate_batches() -> Iterator[list[np.ndarray]]:
                for piece in _pieces(cursor.next_epoch(), chunk):
                    yield reader.read_columns(piece)

            batch_fn = iterate_batches

        return Stream(
            iterate_elements,
            len(shard),
            element_spec=reader.spec,
            batch_iterator_fn=batch_fn,
            uniform_epochs=order.start(start_offset)[1] == 0,
        )


def _pieces(indices: np.ndarray, chunk: int) -> Iterator[np.ndarray]:
    """Consecutive slices of ``indices``: small at first (the first element comes quickly),
    doubling up to ``chunk`` records (throughput)."""
    begin, size = 0, min(chunk, FIRST_READ_RECORDS)
    while begin < len(indices):
        yield indices[begin : begin + size]
        begin += size
        size = min(chunk, size * 2)


def _chunk_size(reader: CacheReader) -> int:
    manifest = reader.manifest
    if manifest.num_records == 0:
        return READ_BATCH_RECORDS
    average = max(1, manifest.num_bytes // manifest.num_records)
    return int(max(1, min(READ_BATCH_RECORDS, READ_BATCH_BYTES // average)))


class Storage(metaclass=abc.ABCMeta):
    """A cache of datasets: ``submit`` stores, ``fetch`` returns a DataRef, ``cacheable`` does both."""

    @abc.abstractmethod
    def submit(self, data: Any, dataset_id: str, dataset_version: str) -> None:
        """Stores ``data`` as the cache of (dataset_id, dataset_version)."""

    @abc.abstractmethod
    def fetch(self, dataset_id: str, dataset_version: str) -> DataRef:
        """A DataRef to the cache of (dataset_id, dataset_version)."""

    @abc.abstractmethod
    def cacheable(self, dataset_id: str, dataset_version: str) -> Callable[..., Any]:
        """A decorator: the wrapped function builds the dataset only when it is not cached."""
