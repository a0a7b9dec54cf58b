"""TensorFlow adapter: tf.data.Dataset to record source, and Stream to tf.data.Dataset.

The only module of the package that imports TensorFlow. Reading hands TensorFlow each read of
the stream (``yogacache.read.pipeline``: many records, stacked into one array per leaf) through
one stateful ``numpy_function`` map over the read numbers of an epoch, and lets ``unbatch``
split them in C++, instead of one Python call per record.
"""

from __future__ import annotations

import atexit
import math
import threading
import time
from typing import Any, Iterator, Optional

import numpy as np

try:
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - exercised only without TensorFlow
    raise ImportError(
        "yogacache.tensorflow needs TensorFlow: pip install 'yogacache[tf]'"
    ) from error

from yogacache.errors import UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.spec import (
    STRING,
    SUPPORTED_DTYPES,
    Spec,
    TensorSpec,
    flatten,
    numpy_dtype,
    spec_leaves,
    unflatten,
)
from yogacache.malloc import keep_freed_memory
from yogacache.read.pipeline import Stream

_SOURCE_BATCH_BYTES = 8 << 20
_SOURCE_BATCH_RECORDS = 1024
_SOURCE_PREFETCH = 2  # batches
_SOURCE_PREFETCH_ELEMENTS = 16  # elements of varying shapes (sizes unknown)
_STRING_GUESS_BYTES = 64

__all__ = ["make_tf_dataset", "spec_from_tf", "spec_to_tf", "TFDatasetSource"]


def spec_from_tf(element_spec: Any, path: str = "element") -> Spec:
    """The framework-neutral spec of a ``tf.data`` element spec; refuses ragged and sparse."""
    if isinstance(element_spec, tf.TensorSpec):
        dtype = "string" if element_spec.dtype == tf.string else element_spec.dtype.name
        if dtype not in SUPPORTED_DTYPES:
            raise UnsupportedDatasetError(f"{path} has dtype {dtype}, which yogacache cannot cache")
        shape = element_spec.shape
        dims = None if shape.rank is None else tuple(shape.as_list())
        return TensorSpec(dtype, dims)
    if isinstance(element_spec, dict):
        for key in element_spec:
            if not isinstance(key, str):
                raise UnsupportedDatasetError(f"{path} has a non-string dict key {key!r}")
        return {key: spec_from_tf(value, f"{path}[{key!r}]") for key, value in element_spec.items()}
    if isinstance(element_spec, (tuple, list)):
        return tuple(spec_from_tf(value, f"{path}[{i}]") for i, value in enumerate(element_spec))
    kind = type(element_spec).__name__
    hint = {
        "RaggedTensorSpec": "convert it to a dense tensor (x.to_tensor()) or store values and "
        "row_splits as separate leaves",
        "SparseTensorSpec": "convert it with tf.sparse.to_dense, or store indices, values and "
        "dense_shape as separate leaves",
    }.get(kind, "use dense tensors in nested dicts and tuples")
    raise UnsupportedDatasetError(f"{path} is a {kind}, which yogacache cannot cache: {hint}")


def _tf_dtype(name: str) -> tf.DType:
    return tf.string if name == STRING else tf.as_dtype(name)


def spec_to_tf(spec: Spec, what: str = "spec", batched: bool = False) -> Any:
    """The spec as a structure of ``tf.TensorSpec`` (``what="spec"``), dtypes or shapes."""
    if isinstance(spec, TensorSpec):
        shape = tf.TensorShape(None if spec.shape is None else list(spec.shape))
        if batched:
            shape = tf.TensorShape([None]).concatenate(shape)
        if what == "dtype":
            return _tf_dtype(spec.dtype)
        if what == "shape":
            return shape
        return tf.TensorSpec(shape, _tf_dtype(spec.dtype))
    if isinstance(spec, dict):
        return {key: spec_to_tf(value, what, batched) for key, value in spec.items()}
    return tuple(spec_to_tf(item, what, batched) for item in spec)


def _record_bytes(spec: Spec) -> int:
    total = 0
    for leaf in spec_leaves(spec):
        count = math.prod(d or 1 for d in (leaf.shape or ()))
        itemsize = _STRING_GUESS_BYTES if leaf.dtype == STRING else np.dtype(
            "float16" if leaf.dtype == "bfloat16" else leaf.dtype
        ).itemsize
        total += count * itemsize
    return max(1, total)


# Dataset ops that end an unbounded input: take(n) with n >= 0, take_while(...), and
# assert_cardinality(n) (which fails past n records).
_BOUNDING_OPS = frozenset({"TakeDataset", "TakeWhileDataset", "AssertCardinalityDataset"})


def _unbounded_repeat(dataset: tf.data.Dataset) -> Optional[str]:
    """Where the dataset repeats forever upstream (a ``repeat()`` whose count is -1 that no
    ``take``/``take_while`` bounds, in its chain of datasets or inside the function of an
    interleave or flat_map), or None. Walks the dataset objects and their functions' graphs
    (never the whole serialized dataset, which would copy the data of from_tensor_slices);
    runs nothing."""

    def walk(node: Any, seen: set[int]) -> Optional[str]:
        if id(node) in seen:
            return None
        seen = seen | {id(node)}
        kind = type(node).__name__
        if "TakeWhile" in kind or "AssertCardinality" in kind:
            return None  # bounded here, whatever is upstream
        count = getattr(node, "_count", None)
        if "Take" in kind and count is not None and _as_int(count) != -1:
            return None
        if "Repeat" in kind and count is not None and _as_int(count) == -1:
            return "repeat() with no count"
        for wrapper in _dataset_functions(node):
            found = _repeat_in_function(wrapper)
            if found is not None:
                return f"{found} inside the function of {kind.strip('_').replace('Dataset', '').lower()}"
        try:
            upstream = [walk(child, seen) for child in node._inputs()]
        except Exception:  # noqa: BLE001 - a dataset class without inputs we can see
            return None
        if "Zip" in kind:  # ends with its shortest input
            return upstream[0] if upstream and all(upstream) else None
        return next((found for found in upstream if found), None)

    return walk(dataset, set())


def _as_int(value: Any) -> Optional[int]:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None  # a symbolic count: unknown


def _dataset_functions(dataset: Any) -> list[Any]:
    try:
        return list(dataset._functions())
    except Exception:  # noqa: BLE001
        return []


def _repeat_in_function(wrapper: Any) -> Optional[str]:
    """Whether the dataset a dataset function returns (an interleave's, a flat_map's) repeats
    forever, read from the function's graph."""
    try:
        graph = wrapper.function.graph
        graph_def = graph.as_graph_def()
        outputs = [tensor.op.name for tensor in graph.outputs]
    except Exception:  # noqa: BLE001 - not a traced function: nothing to read
        return None
    functions = {function.signature.name: function for function in graph_def.library.function}

    def const_value(node: Any) -> Optional[int]:
        if node is None or node.op != "Const":
            return None
        try:
            value = tf.make_ndarray(node.attr["value"].tensor)
        except Exception:  # noqa: BLE001
            return None
        return int(value) if value.size == 1 else None

    def search(nodes: dict[str, Any], name: str, in_functions: frozenset[str]) -> Optional[str]:
        node = nodes.get(name)
        if node is None:
            return None
        inputs = [i.split(":")[0] for i in node.input if not i.startswith("^")]
        if node.op in _BOUNDING_OPS:
            count = const_value(nodes.get(inputs[1])) if node.op == "TakeDataset" and len(inputs) > 1 else 0
            if count is None or count != -1:
                return None
        if node.op == "RepeatDataset" and len(inputs) > 1 and const_value(nodes.get(inputs[1])) == -1:
            return "repeat() with no count"
        for attr in node.attr.values():
            function = attr.func.name if attr.HasField("func") else ""
            if function in functions and function not in in_functions and node.op.endswith("Dataset"):
                body = functions[function]
                inner = {n.name: n for n in body.node_def}
                for value in body.ret.values():
                    if search(inner, value.split(":")[0], in_functions | {function}) is not None:
                        return "repeat() with no count"
        upstream = [search(nodes, i, in_functions) for i in inputs if nodes.get(i) is not None]
        if node.op == "ZipDataset":
            return upstream[0] if upstream and all(upstream) else None
        return next((found for found in upstream if found), None)

    nodes = {node.name: node for node in graph_def.node}
    return next((found for found in (search(nodes, o, frozenset()) for o in outputs) if found), None)


class TFDatasetSource:
    """A tf.data.Dataset as a record source; refuses infinite datasets before writing anything."""

    kind = "tensorflow"

    def __init__(self, dataset: tf.data.Dataset) -> None:
        if not isinstance(dataset, tf.data.Dataset):
            raise UnsupportedDatasetError(f"expected a tf.data.Dataset, got {type(dataset).__name__}")
        cardinality = int(dataset.cardinality())
        infinite = cardinality == int(tf.data.INFINITE_CARDINALITY)
        if infinite or cardinality == int(tf.data.UNKNOWN_CARDINALITY):
            # Unknown cardinality (repeat().filter(...), an interleave of repeat()s, ...): look
            # for an unbounded repeat() upstream in the dataset's graph.
            found = None if infinite else _unbounded_repeat(dataset)
            if infinite or found is not None:
                where = "" if found is None else f" ({found})"
                raise UnsupportedDatasetError(
                    f"the dataset is infinite: it repeats forever{where}, and caching it would fill "
                    "the disk. Cache the finite dataset (without repeat()) and call repeat() on the "
                    "cached one, or bound it with take(n)"
                )
        self.cardinality: Optional[int] = (
            None if cardinality == int(tf.data.UNKNOWN_CARDINALITY) else cardinality
        )
        self._dataset = dataset
        self._spec = spec_from_tf(dataset.element_spec)
        self._codec = RecordCodec(self._spec)

    def spec(self) -> Spec:
        return self._spec

    def encoded_batches(self) -> Iterator[list[bytes]]:
        spec, codec = self._spec, self._codec
        if codec.stackable:
            size = max(1, min(_SOURCE_BATCH_RECORDS, _SOURCE_BATCH_BYTES // _record_bytes(spec)))
            # prefetch: the source computes its next batches while this thread encodes and the
            # writer thread commits (a decoding source and the writer then overlap).
            for batch in self._dataset.batch(size).prefetch(_SOURCE_PREFETCH).as_numpy_iterator():
                yield codec.encode_columns(flatten(batch, spec))
            return
        pending: list[bytes] = []
        for element in self._dataset.prefetch(_SOURCE_PREFETCH_ELEMENTS).as_numpy_iterator():
            pending.append(codec.encode(flatten(element, spec)))
            if len(pending) >= _SOURCE_BATCH_RECORDS:
                yield pending
                pending = []
        if pending:
            yield pending


# At interpreter exit, a live iterator's prefetch thread may still be calling our generator
# while the main thread, holding the GIL, destroys the iterator and waits for that thread: a
# deadlock. At exit, generators stop first, and the threads get a moment to see it.
_exiting = threading.Event()
_generators_started = threading.Event()


@atexit.register
def _stop_generators() -> None:
    _exiting.set()
    if _generators_started.is_set():
        time.sleep(0.2)  # releases the GIL: in-flight generator calls finish and stop


def _until_exit(iterator: Iterator[Any]) -> Iterator[Any]:
    _generators_started.set()
    for item in iterator:
        if _exiting.is_set():
            return
        yield item


class _ReadPuller:
    """The ``numpy_function`` behind the fast path: read ``i`` of the current epoch.

    TensorFlow calls it with ``0, 1, ..., max_batches - 1`` (the stream's reads per epoch) once
    per iteration of the dataset; ``0`` starts the stream's next epoch. Calls past the end of a
    short epoch (the resumed first one) get empty reads, and the last call also takes whatever
    the epoch has left, so nothing is dropped even if the bound were low. A call out of
    sequence means two iterators of this dataset are running at once, which would interleave
    one epoch: it fails with a message instead.
    """

    def __init__(self, batch_fn: Any, leaves: list[TensorSpec], last: int) -> None:
        self._batch_fn = batch_fn
        self._empty = [
            np.empty((0, *(int(d or 0) for d in leaf.shape or ())), dtype=numpy_dtype(leaf.dtype))
            for leaf in leaves
        ]
        self._last = last
        self._lock = threading.Lock()
        self._reads: Optional[Iterator[list[np.ndarray]]] = None
        self._next = 0

    def __call__(self, index: Any) -> list[np.ndarray]:
        index = int(index)
        with self._lock:
            if index == 0:
                keep_freed_memory()
                self._reads = _until_exit(self._batch_fn())
            elif index != self._next:
                raise RuntimeError(
                    "two iterators of one yogacache tf.data.Dataset are running at once; each "
                    "iteration of the dataset is the stream's next epoch, so finish (or drop) one "
                    "iterator before starting the next, or call make_tf_dataset once per iterator"
                )
            self._next = index + 1
            reads = self._reads
            if reads is None:
                return self._empty
            columns = next(reads, None)
            if index == self._last or columns is None:
                rest = list(reads)
                self._reads = None
                if columns is None:
                    return self._empty
                if rest:
                    return [np.concatenate(parts) for parts in zip(columns, *rest)]
            return columns


def make_tf_dataset(stream: Stream) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the stream's elements; each iteration of it is the next epoch."""
    spec = stream.element_spec
    batch_fn = stream.batch_iterator_fn
    leaves = spec_leaves(spec) if spec is not None else []
    if spec is not None and batch_fn is not None and stream.max_batches is not None and leaves:
        # One stateful map over the read numbers: cheaper to trace and to start than
        # from_generator, whose nested functions cost tens of milliseconds on the first element.
        count = max(1, stream.max_batches)
        pull = _ReadPuller(batch_fn, leaves, count - 1)
        dtypes = [_tf_dtype(leaf.dtype) for leaf in leaves]
        shapes = [tf.TensorShape([None, *(leaf.shape or ())]) for leaf in leaves]

        @tf.autograph.experimental.do_not_convert  # plain graph code: transpiling it costs ~100 ms
        def pull_read(index: tf.Tensor) -> Any:
            columns = tf.numpy_function(pull, [index], dtypes, stateful=True, name="yogacache_read")
            for column, shape in zip(columns, shapes):
                column.set_shape(shape)
            return unflatten(columns, spec)

        _generators_started.set()
        # prefetch(1): the next read (Python) overlaps unbatch and the consumer's batching of
        # this one (C++), instead of the two taking turns on one thread.
        dataset = tf.data.Dataset.range(count).map(pull_read).prefetch(1).unbatch()
    elif spec is not None and batch_fn is not None:

        def batches() -> Iterator[Any]:
            keep_freed_memory()
            for columns in _until_exit(batch_fn()):
                yield unflatten(columns, spec)

        signature = spec_to_tf(spec, "spec", batched=True)
        dataset = tf.data.Dataset.from_generator(batches, output_signature=signature).unbatch()
    elif spec is not None:
        dataset = tf.data.Dataset.from_generator(
            lambda: _until_exit(stream.iterator_fn()), output_signature=spec_to_tf(spec, "spec")
        )
    else:
        return tf.data.Dataset.from_generator(
            stream.iterator_fn, output_types=stream.output_types, output_shapes=stream.output_shapes
        )
    if stream.uniform_epochs:
        # Known cardinality lets Keras size its epochs and progress bars.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(len(stream)))
    return dataset
