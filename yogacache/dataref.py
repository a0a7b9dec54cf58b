"""DataRef and Stream: YogaDL's reading interface, backed by a CacheReader and the sampler."""

from __future__ import annotations

import abc
import threading
from typing import Any, Callable, Iterator, Mapping, Optional

import numpy as np

from yogacache.format.spec import Spec
from yogacache.read.reader import CacheReader
from yogacache.read.schedule import SHARD, EpochPlan, ReadSchedule

# Records per read from LMDB; batches of large records are capped by bytes instead.
READ_BATCH_RECORDS = 1024
READ_BATCH_BYTES = 8 << 20
# The first read of an epoch is small, so the first element arrives quickly: 32 records, or
# more while they fit in 1 MiB (a first consumer batch of small records takes one read).
FIRST_READ_RECORDS = 32
FIRST_READ_BYTES = 1 << 20


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
        state_fn: Optional[Callable[[int], dict[str, Any]]] = None,
        max_batches: Optional[int] = None,
    ) -> None:
        self.iterator_fn = iterator_fn
        self.length = length
        # True when every epoch, the first included, yields exactly ``length`` elements.
        self.uniform_epochs = uniform_epochs
        self._output_types = output_types
        self._output_shapes = output_shapes
        self.element_spec = element_spec
        self.batch_iterator_fn = batch_iterator_fn
        # How many batches ``batch_iterator_fn`` yields per epoch at most (None: unknown).
        self.max_batches = max_batches
        self.state_fn = state_fn

    def state_dict(self, records_consumed: int) -> dict[str, Any]:
        """The resume state after this rank consumed ``records_consumed`` records of the stream.

        Counted from the stream's start, across epochs. Pass it back as ``resume_state`` to
        ``CacheDataRef.stream`` (in global shuffle mode, with any number of ranks).
        """
        if self.state_fn is None:
            raise TypeError("this stream was not made by yogacache and cannot report a resume state")
        return self.state_fn(records_consumed)

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
    """Hands out each epoch's plan in turn, starting at the schedule's resume point."""

    def __init__(self, schedule: ReadSchedule) -> None:
        self._schedule = schedule
        self._epoch, self._position = schedule.start
        self._lock = threading.Lock()

    def next_epoch(self) -> EpochPlan:
        with self._lock:
            epoch, position = self._epoch, self._position
            self._epoch += 1
            self._position = 0
        return self._schedule.plan(epoch, position)


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
        *,
        shuffle_mode: str = SHARD,
        resume_state: Optional[Mapping[str, Any]] = None,
    ) -> Stream:
        """YogaDL's ``stream``, plus ``shuffle_mode="global"`` (each epoch one permutation of the
        whole dataset dealt out to the ranks, resumable with any number of ranks) and
        ``resume_state`` (a ``Stream.state_dict`` result, instead of ``start_offset``)."""
        schedule = self.schedule(
            start_offset=start_offset,
            shuffle=shuffle,
            skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
            shuffle_seed=shuffle_seed,
            shard_rank=shard_rank,
            num_shards=num_shards,
            drop_shard_remainder=drop_shard_remainder,
            shuffle_mode=shuffle_mode,
            resume_state=resume_state,
        )
        cursor = _EpochCursor(schedule)
        reader = self.reader
        chunk = _chunk_size(reader)
        first = _first_read_size(reader, chunk)

        def iterate_elements() -> Iterator[Any]:
            for piece in _pieces(cursor.next_epoch(), chunk, first):
                yield from reader.read_elements(piece)

        batch_fn = None
        if reader.codec.stackable:

            def iterate_batches() -> Iterator[list[np.ndarray]]:
                for piece in _pieces(cursor.next_epoch(), chunk, first):
                    yield reader.read_columns(piece)

            batch_fn = iterate_batches

        return Stream(
            iterate_elements,
            len(schedule),
            element_spec=reader.spec,
            batch_iterator_fn=batch_fn,
            uniform_epochs=schedule.start[1] == 0,
            state_fn=lambda records: schedule.state(schedule.start, records),
            max_batches=_count_pieces(len(schedule), chunk, first) if batch_fn is not None else None,
        )

    def schedule(
        self,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
        shuffle_mode: str = SHARD,
        resume_state: Optional[Mapping[str, Any]] = None,
    ) -> ReadSchedule:
        """The read schedule that ``stream`` follows for these arguments (the torch adapter's too)."""
        return ReadSchedule(
            len(self.reader),
            shard_rank=shard_rank,
            num_shards=num_shards,
            drop_remainder=drop_shard_remainder,
            shuffle=bool(shuffle),
            reshuffle_each_epoch=bool(shuffle) and not skip_shuffle_at_epoch_end,
            seed=shuffle_seed,
            shuffle_mode=shuffle_mode,
            start_offset=start_offset,
            resume_state=resume_state,
        )


def _piece_sizes(chunk: int, first: int) -> Iterator[int]:
    """Records per read in an epoch: ``first`` (the first element comes quickly), doubling up
    to ``chunk`` records (throughput), then ``chunk`` for good."""
    size = first
    while True:
        yield size
        size = min(chunk, size * 2)


def _pieces(plan: EpochPlan, chunk: int, first: int) -> Iterator[np.ndarray]:
    """Consecutive slices of ``plan``, sized by ``_piece_sizes``."""
    begin = 0
    for size in _piece_sizes(chunk, first):
        if begin >= len(plan):
            return
        yield plan.indices(begin, begin + size)
        begin += size


def _count_pieces(records: int, chunk: int, first: int) -> int:
    """How many slices ``_pieces`` cuts an epoch of ``records`` records into."""
    count = begin = 0
    for size in _piece_sizes(chunk, first):
        if begin >= records:
            return count
        if size == chunk:  # only whole chunks from here on
            return count - (-(records - begin) // chunk)
        count += 1
        begin += size
    return count  # unreachable: the sizes never end


def _average_record_bytes(reader: CacheReader) -> int:
    manifest = reader.manifest
    return max(1, manifest.num_bytes // max(1, manifest.num_records))


def _first_read_size(reader: CacheReader, chunk: int) -> int:
    return min(chunk, max(FIRST_READ_RECORDS, FIRST_READ_BYTES // _average_record_bytes(reader)))


def _chunk_size(reader: CacheReader) -> int:
    if reader.manifest.num_records == 0:
        return READ_BATCH_RECORDS
    return int(max(1, min(READ_BATCH_RECORDS, READ_BATCH_BYTES // _average_record_bytes(reader))))


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
