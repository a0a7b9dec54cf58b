"""TensorFlow adapter: tf.data.Dataset to record source, and Stream to tf.data.Dataset.

The only module of the package that imports TensorFlow. Reading hands TensorFlow each read of
the stream (``yogacache.read.pipeline``: many records, stacked into one array per leaf) and lets
``unbatch`` split them in C++, instead of one Python call per record. The reads come from a
``numpy_function`` that is stateless in its inputs (read ``i`` of epoch ``e``), so iterator
checkpoints (``tf.train.Checkpoint(iterator=...)``) save and restore the pipeline.
"""

from __future__ import annotations

import atexit
import itertools
import math
import threading
import time
import weakref
from typing import Any, Iterator, Optional

import numpy as np

try:
    import tensorflow as tf
except ImportError as error:  # pragma: no cover - exercised only without TensorFlow
    raise ImportError(
        "yogacache.tensorflow needs TensorFlow: pip install 'yogacache[tf]'"
    ) from error

from yogacache import redaction
from yogacache.errors import UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.spec import (
    MAX_NESTING,
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
from yogacache.read.options import ReadOptions
from yogacache.read.pipeline import EpochReads, Stream

_SOURCE_BATCH_BYTES = 8 << 20
_SOURCE_BATCH_RECORDS = 1024
_SOURCE_PREFETCH = 2  # batches
_SOURCE_PREFETCH_ELEMENTS = 16  # elements of varying shapes (sizes unknown)
_STRING_GUESS_BYTES = 64

log = redaction.get_logger(__name__)

# The fast paths (``_SharedTraces``, ``_unbatch_dense``, ``_rebatch_dense``) build on TensorFlow's
# private modules; a TensorFlow that moved them gets the public methods (the same elements,
# slower), said once per path here, and tests/test_tf_fast_path.py fails.
FAST_PATHS_MISSED: dict[str, str] = {}


def _missed(path: str, error: BaseException) -> None:
    if path not in FAST_PATHS_MISSED:
        FAST_PATHS_MISSED[path] = f"{type(error).__name__}: {error}"
        log.warning(
            "TensorFlow %s lacks what yogacache's fast %s builds on (%s): the public method is used, "
            "slower; please report it",
            tf.__version__, path, FAST_PATHS_MISSED[path],
        )

__all__ = ["from_options", "make_tf_dataset", "spec_from_tf", "spec_to_tf", "TFDatasetSource"]


def spec_from_tf(element_spec: Any, path: str = "element", depth: int = 0) -> Spec:
    """The framework-neutral spec of a ``tf.data`` element spec; refuses ragged and sparse."""
    if isinstance(element_spec, (dict, tuple, list)) and depth >= MAX_NESTING:
        raise UnsupportedDatasetError(
            f"{path[:60]}... is nested more than {MAX_NESTING} levels deep; flatten the element"
        )
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
        return {key: spec_from_tf(value, f"{path}[{key!r}]", depth + 1) for key, value in element_spec.items()}
    if isinstance(element_spec, (tuple, list)):
        return tuple(spec_from_tf(value, f"{path}[{i}]", depth + 1) for i, value in enumerate(element_spec))
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


class _EpochReadFunctions:
    """The Python side of one pipeline, which its graph functions reach through its handle.

    ``next_epoch`` (stateful: each iteration of the dataset is the next epoch) runs once per
    iteration; ``enter(epoch)`` when an epoch's reads are set up, also when an iterator is
    restored from a checkpoint (so the iteration after it reads the next epoch);
    ``read(epoch, i)`` (stateless: its result depends on its inputs alone) once per read, so
    an iterator checkpoint holds nothing but numbers and restores in any process.
    The pipeline's dataset holds this object; ``_pipelines`` and the graph functions only its
    handle, so dropping the dataset releases the reader and its files (TensorFlow keeps every
    function it traced until the process ends).
    """

    def __init__(self, reads: EpochReads, functions: _GraphFunctions) -> None:
        self._reads = reads
        self._carried = functions.carried
        self._refill = functions.refill
        self._empty = self._carry(
            [
                np.empty((0, *(int(d or 0) for d in leaf.shape or ())), dtype=numpy_dtype(leaf.dtype))
                for leaf in functions.leaves
            ]
        )

    def next_epoch(self) -> np.int64:
        keep_freed_memory()
        return np.int64(self._reads.next_epoch())

    def enter(self, epoch: Any) -> np.int64:
        return np.int64(max(1, self._reads.enter(int(epoch))))

    def read(self, epoch: Any, index: Any) -> list[np.ndarray]:
        if _exiting.is_set():
            return self._empty
        columns = self._reads.read(int(epoch), int(index))
        return self._carry(columns) if columns else self._empty

    def _carry(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        """The columns a read hands TensorFlow: with zero-size leaves, a row number instead."""
        if not self._refill:
            return columns
        rows = np.arange(len(columns[0]), dtype=np.int64)
        return [rows, *(column for column, kept in zip(columns, self._carried) if kept)]


_pipelines: "weakref.WeakValueDictionary[int, _EpochReadFunctions]" = weakref.WeakValueDictionary()
_handles = itertools.count(1)


def _pipeline(handle: np.ndarray) -> _EpochReadFunctions:
    functions = _pipelines.get(int(handle))
    if functions is None:
        raise RuntimeError("the yogacache tf.data.Dataset this iterator reads was dropped")
    return functions


# What the graph functions call (tf.numpy_function): one Python function each for every
# pipeline, so that the traced functions are the same for every pipeline of an element spec.
def _call_next_epoch(handle: np.ndarray) -> np.int64:
    return _pipeline(handle).next_epoch()


def _call_enter(handle: np.ndarray, epoch: Any) -> np.int64:
    return _pipeline(handle).enter(epoch)


def _call_read(handle: np.ndarray, epoch: Any, index: Any) -> list[np.ndarray]:
    return _pipeline(handle).read(epoch, index)


def _is_zero_size(leaf: TensorSpec) -> bool:
    return 0 in (leaf.shape or ())


# Plain graph code, not transpiled by AutoGraph (which costs ~100 ms a function).
_plain = tf.autograph.experimental.do_not_convert


class _GraphFunctions:
    """The graph functions of a pipeline of ``spec``; each takes the pipeline's handle (an
    int64 scalar) last, and calls the Python side that ``_pipelines`` holds under it.

    ``next_epoch`` maps the dataset's one element to the next epoch's number; ``epoch_reads``
    makes an epoch's dataset of reads; ``with_zero_size_leaves`` gives each element back its
    zero-size leaves, which never reach ``unbatch``: it crashes the process on them
    (TensorFlow 2.16-2.21), so a read carries a row-number column instead.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.leaves = spec_leaves(spec)
        self.carried = [not _is_zero_size(leaf) for leaf in self.leaves]
        self.refill = not all(self.carried)
        self._dtypes = [_tf_dtype(leaf.dtype) for leaf, kept in zip(self.leaves, self.carried) if kept]
        self._shapes = [
            tf.TensorShape([None, *(leaf.shape or ())]) for leaf, kept in zip(self.leaves, self.carried) if kept
        ]
        if self.refill:
            self._dtypes, self._shapes = [tf.int64, *self._dtypes], [tf.TensorShape([None]), *self._shapes]

    @_plain
    def next_epoch(self, _: tf.Tensor, handle: tf.Tensor) -> tf.Tensor:
        epoch = tf.numpy_function(_call_next_epoch, [handle], tf.int64, stateful=True, name="yogacache_epoch")
        epoch.set_shape([])
        return epoch

    @_plain
    def read(self, epoch: tf.Tensor, index: tf.Tensor, handle: tf.Tensor) -> Any:
        columns = tf.numpy_function(
            _call_read, [handle, epoch, index], self._dtypes, stateful=False, name="yogacache_read"
        )
        for column, shape in zip(columns, self._shapes):
            column.set_shape(shape)
        return tuple(columns) if self.refill else unflatten(columns, self.spec)

    @_plain
    def epoch_reads(self, epoch: tf.Tensor, handle: tf.Tensor) -> tf.data.Dataset:
        # Runs when the epoch starts and again when a checkpoint restores an iterator inside it.
        count = tf.numpy_function(_call_enter, [handle, epoch], tf.int64, stateful=True, name="yogacache_enter")
        # (epoch, read number) pairs sliced from two vectors of one entry per read: no function
        # to trace, and one dataset where zip(from_tensors.repeat, range) made four.
        count = tf.reshape(count, [])
        numbered = tf.data.Dataset.from_tensor_slices((tf.fill([count], epoch), tf.range(count, dtype=tf.int64)))
        return numbered.map(_plain(lambda epoch, index: self.read(epoch, index, handle)))

    @_plain
    def with_zero_size_leaves(self, _: tf.Tensor, *values: tf.Tensor) -> Any:
        carried_values = iter(values)
        return unflatten(
            [
                next(carried_values) if kept else tf.zeros(leaf.shape, _tf_dtype(leaf.dtype))
                for leaf, kept in zip(self.leaves, self.carried)
            ],
            self.spec,
        )


class _SharedTraces:
    """The traced ``next_epoch`` and ``epoch_reads`` of every pipeline of one element spec.

    Tracing them, and the ``read`` inside ``epoch_reads``, was half the ~55 ms it took to make
    a pipeline. Here they are traced once per spec and process, each taking the handle as an
    argument after the element's; each pipeline's map and flat_map pass their own handle
    first among the function's other arguments (where a traced function's captured inputs
    go), so the handle is never part of an element and never in an iterator checkpoint.
    Builds on TensorFlow's private dataset classes, as the fast unbatch and rebatch do; where
    TensorFlow differs, every pipeline traces its own.
    """

    def __init__(self, spec: Spec) -> None:
        from tensorflow.python.data.ops import dataset_ops, flat_map_op, map_op, structured_function
        from tensorflow.python.ops import gen_dataset_ops

        class SharedTraceMap(map_op._MapDataset):  # type: ignore[misc,name-defined]
            def __init__(self, input_dataset: tf.data.Dataset, wrapper: Any, arguments: list[tf.Tensor]) -> None:
                # _MapDataset.__init__ with a function traced before
                self._input_dataset = input_dataset
                self._map_func = wrapper
                self._use_inter_op_parallelism = True
                self._preserve_cardinality = True
                self._force_synchronous = False
                self._name = None
                variant = gen_dataset_ops.map_dataset(
                    input_dataset._variant_tensor,
                    arguments,
                    f=wrapper.function,
                    use_inter_op_parallelism=True,
                    preserve_cardinality=True,
                    force_synchronous=False,
                    **self._common_args,
                )
                dataset_ops.UnaryDataset.__init__(self, input_dataset, variant)

        class SharedTraceFlatMap(flat_map_op._FlatMapDataset):  # type: ignore[misc,name-defined]
            def __init__(self, input_dataset: tf.data.Dataset, wrapper: Any, arguments: list[tf.Tensor]) -> None:
                # _FlatMapDataset.__init__ with a function traced before
                self._input_dataset = input_dataset
                self._map_func = wrapper
                self._structure = wrapper.output_structure._element_spec
                self._name = None
                variant = gen_dataset_ops.flat_map_dataset(
                    input_dataset._variant_tensor, arguments, f=wrapper.function, **self._common_args
                )
                dataset_ops.UnaryDataset.__init__(self, input_dataset, variant)

        self._map, self._flat_map = SharedTraceMap, SharedTraceFlatMap

        functions = _GraphFunctions(spec)
        element_and_handle = (tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64))
        self._next_epoch = structured_function.StructuredFunctionWrapper(
            functions.next_epoch, "Dataset.map()", input_structure=element_and_handle
        )
        self._epoch_reads = structured_function.StructuredFunctionWrapper(
            functions.epoch_reads, "Dataset.flat_map()", input_structure=element_and_handle
        )

    @staticmethod
    def _arguments(wrapper: Any, handle: tf.Tensor) -> list[tf.Tensor]:
        return [handle, *wrapper.function.captured_inputs]

    def epochs(self, handle: tf.Tensor) -> tf.data.Dataset:
        """``range(1).map(next_epoch).flat_map(epoch_reads)`` for the pipeline of ``handle``."""
        epochs = self._map(tf.data.Dataset.range(1), self._next_epoch, self._arguments(self._next_epoch, handle))
        return self._flat_map(epochs, self._epoch_reads, self._arguments(self._epoch_reads, handle))


_shared_traces: dict[str, Optional[_SharedTraces]] = {}
_shared_traces_lock = threading.Lock()


def _epochs(functions: _GraphFunctions, handle: tf.Tensor) -> tf.data.Dataset:
    """Each iteration: one epoch number, then that epoch's reads (the shared traces' when
    TensorFlow allows, else ``functions`` traced for this pipeline)."""
    spec = functions.spec
    key = repr(spec)
    with _shared_traces_lock:
        if key not in _shared_traces:
            try:
                _shared_traces[key] = _SharedTraces(spec)
            except (ImportError, AttributeError, TypeError) as error:
                _missed("pipeline (traced functions shared)", error)
                _shared_traces[key] = None
        shared = _shared_traces[key]
    if shared is not None:
        return shared.epochs(handle)
    return (
        tf.data.Dataset.range(1)
        .map(_plain(lambda element: functions.next_epoch(element, handle)))
        .flat_map(_plain(lambda epoch: functions.epoch_reads(epoch, handle)))
    )


def _epoch_read_datasets(reads: EpochReads, spec: Spec) -> tuple[tf.data.Dataset, Optional[tf.data.Dataset]]:
    """Each iteration: one epoch number, then that epoch's reads, unbatched into elements.

    Returns the dataset of elements and, unless zero-size leaves make it differ, the dataset
    of whole reads it unbatches (what ``batch`` rebatches, see ``_batch_by_rebatching``).
    """
    number = next(_handles)
    handle = tf.constant(number, tf.int64)
    functions = _GraphFunctions(spec)
    python_side = _EpochReadFunctions(reads, functions)
    _pipelines[number] = python_side
    _generators_started.set()
    # prefetch(1): the next read (Python) overlaps unbatch and the consumer's batching of this
    # one (C++), instead of the two taking turns on one thread.
    options = tf.data.Options()
    # The epoch counter is the pipeline's one piece of state outside TensorFlow; a checkpoint
    # holds the epoch it produced (as the flat_map's input), so the counter is not needed.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    batches = _epochs(functions, handle).prefetch(1).with_options(options)
    batches._yogacache_reads = python_side  # the pipeline's Python side lives as long as this
    dataset = _unbatch_dense(batches)
    if functions.refill:
        return dataset.map(functions.with_zero_size_leaves), None
    return dataset, batches


def _unbatch_dense(batches: tf.data.Dataset) -> tf.data.Dataset:
    """``batches.unbatch()`` for batches of dense tensors only (the reads' columns).

    ``Dataset.unbatch`` first maps every element through ``normalize_to_dense`` (for sparse and
    ragged components), tracing a function: about a tenth of the time to the first element.
    For dense tensors that map is the identity, so the unbatch dataset is made directly; where
    TensorFlow's internals differ, the public method."""
    if not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(batches.element_spec)):
        return batches.unbatch()
    try:
        from tensorflow.python.data.ops import unbatch_op

        return unbatch_op._UnbatchDataset(batches)
    except (ImportError, AttributeError, TypeError) as error:
        _missed("unbatch", error)
        return batches.unbatch()


def _rebatch_dense(
    reads: tf.data.Dataset, batch_size: Any, drop_remainder: bool, name: Optional[str]
) -> tf.data.Dataset:
    """``reads.rebatch(batch_size, ...)`` for reads of dense tensors only.

    ``Dataset.rebatch`` maps its input through ``normalize_to_dense`` first, tracing a function
    (the identity for dense tensors) when the user calls ``batch``: about a tenth of the time to
    the first element. Here the rebatch dataset is made directly; where TensorFlow's internals
    differ, the public method."""
    try:
        from tensorflow.python.data.ops import dataset_ops, rebatch_op
        from tensorflow.python.ops import gen_experimental_dataset_ops

        class DenseRebatch(rebatch_op._RebatchDataset):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:  # _RebatchDataset.__init__ without normalize_to_dense
                self._input_dataset = reads
                self._batch_sizes = tf.convert_to_tensor(batch_size, dtype=tf.int64, name="batch_sizes")
                self._drop_remainder = tf.convert_to_tensor(drop_remainder, dtype=tf.bool, name="drop_remainder")
                self._name = name
                size = self._compute_static_batch_dim()
                self._element_spec = tf.nest.map_structure(
                    lambda spec: spec._unbatch()._batch(size), reads.element_spec
                )
                variant = gen_experimental_dataset_ops.rebatch_dataset_v2(
                    reads._variant_tensor,
                    batch_sizes=self._batch_sizes,
                    drop_remainder=self._drop_remainder,
                    **self._flat_structure,
                )
                dataset_ops.UnaryDataset.__init__(self, reads, variant)

        return DenseRebatch()
    except (ImportError, AttributeError, TypeError) as error:
        _missed("batch (rebatch)", error)
        return reads.rebatch(batch_size, drop_remainder=drop_remainder, name=name)


def _batch_by_rebatching(dataset: tf.data.Dataset, reads: tf.data.Dataset, length: Optional[int]) -> None:
    """Makes ``dataset.batch`` rebatch the reads (one copy per element) instead of batching
    the unbatched elements (two copies, and TensorFlow's per-element work twice).

    ``rebatch(n)`` is ``unbatch().batch(n)`` done in one step: the batches, their element spec
    and their iterator checkpoints are the same. The other transformations (``map``,
    ``shuffle``, ...) see the elements as before.
    """

    def batch(
        batch_size: Any,
        drop_remainder: bool = False,
        num_parallel_calls: Any = None,
        deterministic: Optional[bool] = None,
        name: Optional[str] = None,
    ) -> tf.data.Dataset:
        batched = _rebatch_dense(reads, batch_size, drop_remainder, name)
        size = tf.get_static_value(batch_size)
        if length is not None and size is not None and int(size) > 0:
            batches = length // int(size) if drop_remainder else -(-length // int(size))
            batched = batched.apply(tf.data.experimental.assert_cardinality(batches))
        return batched

    batch.__doc__ = tf.data.Dataset.batch.__doc__
    dataset.batch = batch


def make_tf_dataset(stream: Stream) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of the stream's elements; each iteration of it is the next epoch."""
    spec = stream.element_spec
    batch_fn = stream.batch_iterator_fn
    reads = None
    if spec is not None and stream.epoch_reads is not None and spec_leaves(spec):
        dataset, reads = _epoch_read_datasets(stream.epoch_reads, spec)
    elif spec is not None and batch_fn is not None and not any(map(_is_zero_size, spec_leaves(spec))):

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
    if reads is not None:
        _batch_by_rebatching(dataset, reads, len(stream) if stream.uniform_epochs else None)
    return dataset


def from_options(ref: Any, options: ReadOptions) -> tf.data.Dataset:
    """What ``DataLayer`` decorators return by default (``returns="tf"``): ``ref`` (a DataRef or
    a mixture) read as ``options`` say, as a ``tf.data.Dataset`` (``make_tf_dataset``)."""
    return make_tf_dataset(ref.open_stream(options))
