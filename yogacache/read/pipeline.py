"""The read pipeline's streams: YogaDL's ``Stream`` over a rank's epochs, read by number.

Top to bottom: an ``EpochReader`` (``yogacache.read.epochs``: ``ReadOptions`` over a cache)
hands out each epoch's plan and its reads; ``EpochReads`` numbers them, read ``i`` of epoch
``e``, and hands out epoch numbers to successive iterations; ``read_stream`` turns that into
YogaDL's ``Stream``. The TensorFlow adapter reads Streams (and ``EpochReads`` by number), the
torch adapter an ``EpochReader`` from its workers; a JAX or Grain adapter would do one or the
other.
"""

from __future__ import annotations

import operator
import os
import threading
from typing import Any, Callable, Iterator, Optional, Protocol, Union

import numpy as np

from yogacache import redaction
from yogacache.format.spec import Spec
from yogacache.read.epochs import (
    FIRST_READ_BYTES,
    FIRST_READ_RECORDS,
    FULL_READ_BYTES,
    FULL_READ_RECORDS,
    EpochReader,
    ReadSizes,
    plan_reads,
    warn_random_streaming,
)
from yogacache.read.mixture_reader import MixtureReader
from yogacache.read.options import ReadOptions
from yogacache.read.plans import EpochPlan
from yogacache.read.reader import CacheReader

log = redaction.get_logger(__name__)

__all__ = [
    "EpochReader",
    "EpochReads",
    "FIRST_READ_BYTES",
    "FIRST_READ_RECORDS",
    "FULL_READ_BYTES",
    "FULL_READ_RECORDS",
    "ReadSizes",
    "CacheSource",
    "ReaderSource",
    "Stream",
    "open_reader",
    "record_position",
    "plan_reads",
    "read_stream",
    "warn_random_streaming",
]

class ReaderSource(Protocol):
    """Anything that holds a cache's reader, such as ``yogacache.dataref.CacheDataRef``."""

    @property
    def reader(self) -> CacheReader: ...


CacheSource = Union[CacheReader, ReaderSource, str, "os.PathLike[str]"]


def open_reader(source: CacheSource) -> CacheReader:
    """The reader of a cache given as a CacheReader, a CacheDataRef (anything with a ``reader``)
    or a cache directory; or of a mixture (a ``yogacache.Mixture``), whose ``MixtureReader``
    reads as a CacheReader does."""
    if isinstance(source, (CacheReader, MixtureReader)):
        return source  # type: ignore[return-value]  # a MixtureReader reads as a CacheReader
    reader = getattr(source, "reader", None)
    if isinstance(reader, (CacheReader, MixtureReader)):
        return reader  # type: ignore[return-value]
    if isinstance(source, (str, os.PathLike)):
        return CacheReader(source)  # type: ignore[arg-type]
    raise TypeError(
        f"expected a CacheReader, a CacheDataRef or a cache directory, got {type(source).__name__}"
    )


def record_position(index: Any, records: int, what: str = "a dataset") -> int:
    """``index`` (an int or numpy integer, negative from the end) as a record position in
    ``[0, records)``, or IndexError naming ``what`` holds the records: how the map-style adapters
    (``yogacache.torch.CacheDataset``, ``yogacache.grain.CacheDataSource``) index a cache."""
    i = operator.index(index)
    if i < 0:
        i += records
    if not 0 <= i < records:
        raise IndexError(f"index {index} is out of range for {what} of {records} records")
    return i


def record_positions(indices: Any, records: int, what: str = "a dataset") -> np.ndarray:
    """``record_position`` of each of ``indices`` (a sequence or array), as int64: one numpy
    pass for integers (a batch a sampler gives), one call each for anything else."""
    array = np.asarray(indices)
    if array.ndim == 1 and array.dtype.kind == "i":
        positions = array.astype(np.int64)
        positions[positions < 0] += records
        outside = (positions < 0) | (positions >= records)
        if outside.any():
            record_position(array[int(np.argmax(outside))], records, what)  # raises, naming it
        return positions
    return np.fromiter((record_position(i, records, what) for i in indices), dtype=np.int64, count=len(indices))


class Stream:
    """An iterable of elements; each new iteration is the next epoch. ``len()`` is the shard length.

    Compatible with ``yogadl.Stream(iterator_fn, length, output_types, output_shapes)``; streams
    made by yogacache also know their framework-neutral ``element_spec`` and can yield each
    read whole, as stacked columns (``batch_iterator_fn``, at most ``max_batches`` per epoch),
    which is how the TensorFlow adapter avoids per-record overhead.
    ``spec_converter(element_spec, "dtype" | "shape")`` derives ``output_types`` and
    ``output_shapes`` when they are first asked for (it may import a framework then).
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
        spec_converter: Optional[Callable[[Spec, str], Any]] = None,
        epoch_reads: Optional[EpochReads] = None,
    ) -> None:
        self.iterator_fn = iterator_fn
        self.length = length
        # True when every epoch, the first included, yields exactly ``length`` elements.
        self.uniform_epochs = uniform_epochs
        self._output_types = output_types
        self._output_shapes = output_shapes
        self.element_spec = element_spec
        self.batch_iterator_fn = batch_iterator_fn
        # How many reads ``batch_iterator_fn`` yields per epoch at most (None: unknown).
        self.max_batches = max_batches
        self.state_fn = state_fn
        self.spec_converter = spec_converter
        # Random access to the same reads, by (epoch, read number): what a framework whose
        # iterators checkpoint (tf.data) maps over, holding no reader state of its own.
        self.epoch_reads = epoch_reads

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

    def _derived(self, what: str) -> Any:
        if self.element_spec is None or self.spec_converter is None:
            return None
        return self.spec_converter(self.element_spec, what)

    @property
    def output_types(self) -> Any:
        """The element's ``tf.DType`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_types is None:
            self._output_types = self._derived("dtype")
        return self._output_types

    @output_types.setter
    def output_types(self, value: Any) -> None:
        self._output_types = value

    @property
    def output_shapes(self) -> Any:
        """The element's ``tf.TensorShape`` structure (needs TensorFlow when derived from the spec)."""
        if self._output_shapes is None:
            self._output_shapes = self._derived("shape")
        return self._output_shapes

    @output_shapes.setter
    def output_shapes(self, value: Any) -> None:
        self._output_shapes = value


# -- epochs and streams -------------------------------------------------------------------------


class EpochReads:
    """The reads of every epoch by number: read ``i`` of epoch ``e`` depends on ``(e, i)`` alone.

    The same reads, in the same order, as ``plan_reads`` with one worker. ``count`` reads cover a
    whole epoch (the last one takes whatever is left); a shorter, resumed first epoch gives
    empty reads past its end. ``next_epoch`` hands out epoch numbers to successive iterations,
    starting at the schedule's start; a read of epoch ``e`` moves that on past ``e``, so that an
    iterator restored from a checkpoint is followed by the epoch after its own.
    """

    def __init__(self, epochs: EpochReader) -> None:
        self._epochs = epochs
        self._sizes = epochs.sizes
        self.count = epochs.sizes.count(len(epochs))
        self._next_epoch = epochs.start[0]
        self._plans: dict[int, EpochPlan] = {}  # the latest epochs' plans, computed once each
        self._lock = threading.Lock()

    def next_epoch(self) -> int:
        with self._lock:
            epoch = self._next_epoch
            self._next_epoch += 1
        return epoch

    def enter(self, epoch: int) -> int:
        """Notes that ``epoch`` is being read (the next new one is later); returns ``count``."""
        with self._lock:
            self._next_epoch = max(self._next_epoch, epoch + 1)
        return self.count

    def plan(self, epoch: int) -> EpochPlan:
        self.enter(epoch)
        with self._lock:
            plan = self._plans.get(epoch)
            if plan is None:
                plan = self._epochs.plan(epoch, self._epochs.first_position(epoch))
                while len(self._plans) >= 2:  # iterators of neighbouring epochs may overlap
                    del self._plans[min(self._plans)]
                self._plans[epoch] = plan
        return plan

    def indices(self, epoch: int, read: int) -> np.ndarray:
        """The record indices of read ``read`` of ``epoch`` (empty past the epoch's end)."""
        plan = self.plan(epoch)
        begin, end = self._sizes.bounds(read)
        if read >= self.count - 1:
            end = len(plan)
        return plan.indices(begin, end) if begin < len(plan) else np.empty(0, dtype=np.int64)

    def read(self, epoch: int, read: int) -> list[np.ndarray]:
        """One stacked array per leaf: the records of read ``read`` of ``epoch`` (``[]`` if none)."""
        indices = self.indices(epoch, read)
        return self._epochs.reader.read_columns(indices) if len(indices) else []


def read_stream(
    reader: CacheReader, options: ReadOptions, *, spec_converter: Optional[Callable[[Spec, str], Any]] = None
) -> Stream:
    """The stream of ``reader``'s records that ``options`` define: each iteration the next epoch."""
    epochs = EpochReader(reader, options)
    # One epoch counter and one set of reads, whichever way the stream is iterated.
    reads = EpochReads(epochs)

    def epoch_indices() -> Iterator[np.ndarray]:
        epoch = reads.next_epoch()
        for read in range(reads.count):
            indices = reads.indices(epoch, read)
            if len(indices):
                yield indices

    def iterate_elements() -> Iterator[Any]:
        for indices in epoch_indices():
            yield from reader.read_elements(indices)

    def iterate_batches() -> Iterator[list[np.ndarray]]:
        for indices in epoch_indices():
            yield reader.read_columns(indices)

    stackable = reader.codec.stackable
    return Stream(
        iterate_elements,
        len(epochs),
        element_spec=reader.spec,
        batch_iterator_fn=iterate_batches if stackable else None,
        uniform_epochs=epochs.start[1] == 0,
        state_fn=lambda records: epochs.state(epochs.start, records),
        max_batches=reads.count if stackable else None,
        spec_converter=spec_converter,
        epoch_reads=reads if stackable else None,
    )
