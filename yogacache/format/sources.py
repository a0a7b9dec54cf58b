"""Record sources: what a cache is built from, turned into batches of encoded records.

A source knows its element spec and yields lists of msgpack records. Framework datasets are
built by the adapter named in ``SOURCES`` (as fsspec's registry: a detector that imports
nothing, a ``"module:Class"`` import string resolved only when the detector matches, and an
install hint), so this layer imports no framework. Any other iterable of nested dicts/tuples
of arrays, numbers, strings and bytes is a Python source.
"""

from __future__ import annotations

import importlib
import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

from yogacache.errors import UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.layout import FixedLayout
from yogacache.format.spec import (
    ElementChangedError,
    Spec,
    TensorSpec,
    flatten,
    flattener,
    generalize,
    infer_spec,
    spec_leaves,
)

PYTHON_BATCH = 256
PYTHON_BATCH_BYTES = 8 << 20  # large elements come in smaller batches (memory, page reuse)


class RecordSource(Protocol):
    """What CacheWriter consumes."""

    kind: str
    cardinality: Optional[int]  # None when unknown

    def encoded_batches(self) -> Iterator[list[bytes]]: ...

    def spec(self) -> Spec:
        """The element spec; final once ``encoded_batches`` is exhausted."""
        ...


def _open_spec(spec: Spec) -> Spec:
    """``spec`` with every shape unknown: accepts any element of the same structure and dtypes."""
    if isinstance(spec, TensorSpec):
        return TensorSpec(spec.dtype, None)
    if isinstance(spec, dict):
        return {key: _open_spec(value) for key, value in spec.items()}
    return tuple(_open_spec(item) for item in spec)


class PythonSource:
    """Builds from any iterable of framework-neutral elements; shapes may vary per element."""

    kind = "python"

    def __init__(self, data: Iterable[Any]) -> None:
        if isinstance(data, (str, bytes, dict)):
            raise UnsupportedDatasetError(
                f"cannot cache a {type(data).__name__}: pass an iterable of elements"
            )
        try:
            self.cardinality: Optional[int] = len(data)  # type: ignore[arg-type]
        except TypeError:
            self.cardinality = None
        self._data = data
        self._spec: Optional[Spec] = None

    def spec(self) -> Spec:
        if self._spec is None:
            raise UnsupportedDatasetError("the dataset is empty: its element spec is unknown")
        return self._spec

    def encoded_batches(self) -> Iterator[list[bytes]]:
        iterator = iter(self._data)
        try:
            first = next(iterator)
        except StopIteration:
            return
        spec = infer_spec(first)
        codec = RecordCodec(_open_spec(spec))
        fixed = RecordCodec(spec) if FixedLayout.applies(spec_leaves(spec)) else None
        start = 0  # the index of the batch's first element
        for batch in _chunks(itertools.chain([first], iterator), PYTHON_BATCH, PYTHON_BATCH_BYTES):
            if fixed is not None:  # spec only changes once fixed is dropped
                encoded = _encode_stacked(fixed, spec, batch)
                if encoded is not None:
                    self._spec = spec
                    start += len(batch)
                    yield encoded
                    continue
                fixed = None  # shapes or dtypes vary: encode element by element from now on
            encoded = []
            for index, element in enumerate(batch, start):
                try:
                    spec = generalize(spec, infer_spec(element))
                except ElementChangedError as error:
                    raise error.at_element(index) from None
                encoded.append(codec.encode(flatten(element, spec)))
            self._spec = spec
            start += len(batch)
            yield encoded


def _encode_stacked(codec: RecordCodec, spec: Spec, batch: list[Any]) -> Optional[list[bytes]]:
    """Encodes a batch of same-shaped numeric elements straight into records; None if they differ."""
    if codec.layout is None:
        return None
    flat = flattener(spec)
    try:
        rows = [flat(element) for element in batch]
    except UnsupportedDatasetError:
        return None
    encoded = codec.layout.encode_stacked(rows)
    return encoded if encoded is not None else codec.layout.encode_rows(rows)


def element_bytes(element: Any) -> int:
    """About how many bytes ``element`` holds (arrays by size, bytes and strings by length,
    anything else counts 64)."""
    if isinstance(element, dict):
        return sum(element_bytes(value) for value in element.values())
    if isinstance(element, (tuple, list)):
        return sum(element_bytes(value) for value in element)
    if isinstance(element, (bytes, bytearray, str)):
        return len(element)
    nbytes = getattr(element, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 64


def _chunks(iterable: Iterable[Any], size: int, max_bytes: int) -> Iterator[list[Any]]:
    """Batches of at most ``size`` elements, each ended once it holds ``max_bytes`` or more (a
    large element comes in a batch of its own: the batch, and its records, are in memory at once)."""
    batch: list[Any] = []
    held = 0
    for element in iterable:
        batch.append(element)
        held += element_bytes(element)
        if len(batch) >= size or held >= max_bytes:
            yield batch
            batch, held = [], 0
    if batch:
        yield batch


def is_tensorflow_dataset(data: Any) -> bool:
    return any(cls.__module__.startswith("tensorflow") for cls in type(data).__mro__) and hasattr(
        data, "element_spec"
    )


def is_torch_iterable_dataset(data: Any) -> bool:
    """A torch IterableDataset inherits a ``__getitem__`` that raises: it must be iterated."""
    return any(
        cls.__name__ == "IterableDataset" and cls.__module__.startswith("torch.utils.data")
        for cls in type(data).__mro__
    )


@dataclass(frozen=True)
class SourceEntry:
    """A framework's record source: how to recognise its datasets without importing it, where
    its source class lives (``"module:Class"``) and how to install what it needs."""

    detect: Callable[[Any], bool]
    target: str
    install_hint: str

    def load(self) -> Callable[[Any], RecordSource]:
        """The source class, imported now."""
        module_name, _, class_name = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ImportError(f"{self.target} cannot be imported: {self.install_hint} ({error})") from error
        return getattr(module, class_name)  # type: ignore[no-any-return]


def is_object_source(data: Any) -> bool:
    """A ``yogacache.sources.from_url`` source (recognised without importing it)."""
    return getattr(type(data), "is_object_source", False) is True


SOURCES: tuple[SourceEntry, ...] = (
    SourceEntry(
        is_tensorflow_dataset,
        "yogacache.tensorflow:TFDatasetSource",
        "caching a tf.data.Dataset needs TensorFlow: pip install 'yogacache[tf]'",
    ),
    SourceEntry(
        is_object_source,
        "yogacache.sources.source:as_record_source",
        "reading S3 or GCS objects needs boto3 or google-cloud-storage: pip install 'yogacache[sources]'",
    ),
)


class AnnotatedSource:
    """A record source and what its build records in the manifest's ``extra`` (for example
    the fingerprint of the arguments the dataset was made with)."""

    def __init__(self, source: RecordSource, extra: dict[str, Any]) -> None:
        self.source = source
        self._extra = dict(extra)
        self.kind = source.kind
        self.cardinality = source.cardinality

    @property
    def manifest_extra(self) -> dict[str, Any]:
        """The source's own ``extra`` (e.g. an object source's pins, final once it is read) and this one's."""
        return {**manifest_extra(self.source), **self._extra}

    def spec(self) -> Spec:
        return self.source.spec()

    def encoded_batches(self) -> Iterator[list[bytes]]:
        return self.source.encoded_batches()


def sharded_build_of(source: Any) -> Any:
    """The parallel build ``source`` stands for (an object with a ``write_cache`` method, see
    ``yogacache.parallel``), looking through an ``AnnotatedSource``; None for any other source."""
    inner = source.source if isinstance(source, AnnotatedSource) else source
    return inner if callable(getattr(inner, "write_cache", None)) else None


def manifest_extra(source: RecordSource) -> dict[str, Any]:
    """What a build from ``source`` records in its manifest's ``extra`` (usually nothing)."""
    return dict(getattr(source, "manifest_extra", None) or {})


def source_for(data: Any) -> RecordSource:
    """The source that builds a cache from ``data`` (a registered framework's dataset, a
    map-style dataset or an iterable; an ``AnnotatedSource`` as it is)."""
    if isinstance(data, AnnotatedSource) or sharded_build_of(data) is not None:
        return data  # type: ignore[no-any-return]
    for entry in SOURCES:
        if entry.detect(data):
            return entry.load()(data)
    if (
        hasattr(data, "__getitem__")
        and hasattr(data, "__len__")
        and not isinstance(data, (list, tuple))
        and not is_torch_iterable_dataset(data)
    ):
        # A map-style dataset (e.g. torch.utils.data.Dataset): index it in order.
        length = len(data)
        return PythonSource(_IndexedView(data, length))
    if not hasattr(data, "__iter__"):
        raise UnsupportedDatasetError(
            f"cannot cache a {type(data).__name__}: pass a tf.data.Dataset, a map-style "
            "dataset or an iterable of elements"
        )
    return PythonSource(data)


class _IndexedView:
    def __init__(self, data: Any, length: int) -> None:
        self._data = data
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __iter__(self) -> Iterator[Any]:
        return (self._data[i] for i in range(self._length))
