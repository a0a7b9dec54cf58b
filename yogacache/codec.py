"""Element specs and the msgpack record codec: nested dicts/tuples of arrays to bytes and back.

A record is stored as a msgpack list with one entry per leaf of the element structure, in
``tf.nest`` order (dict keys sorted). Each numeric leaf is ``[dtype, shape, raw little-endian
bytes]``; each string leaf is ``["string", shape, [bytes, ...]]`` (row-major). The structure
itself lives once in the manifest's element spec. Decoding never executes code: msgpack only
yields lists, ints, strings and bytes, and every leaf is checked against the spec.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import msgpack
import numpy as np

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError

STRING = "string"
# Records at least this large are decoded row by row into their columns (one copy); smaller
# ones are joined and sliced column-wise (fewer Python operations).
_ROW_COPY_BYTES = 16 << 10
_NUMERIC_DTYPES = frozenset(
    [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ]
)
SUPPORTED_DTYPES = _NUMERIC_DTYPES | {STRING}

Shape = Union[tuple[Union[int, None], ...], None]


@dataclass(frozen=True)
class TensorSpec:
    """Dtype and shape of one leaf; ``None`` dimensions vary between records, a ``None``
    shape means the rank itself is unknown."""

    dtype: str
    shape: Shape

    def __post_init__(self) -> None:
        if self.dtype not in SUPPORTED_DTYPES:
            raise UnsupportedDatasetError(
                f"dtype {self.dtype!r} cannot be cached; supported: {sorted(SUPPORTED_DTYPES)}"
            )

    @property
    def is_fully_defined(self) -> bool:
        return self.shape is not None and all(d is not None for d in self.shape)

    def accepts(self, shape: tuple[int, ...]) -> bool:
        if self.shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            want is None or want == got for want, got in zip(self.shape, shape)
        )


# A spec is a TensorSpec, a tuple of specs, or a dict of specs (keys are strings).
Spec = Union[TensorSpec, tuple["Spec", ...], dict[str, "Spec"]]


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for a spec dtype name (bfloat16 comes from ml_dtypes)."""
    if name == STRING:
        return np.dtype(object)
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError as error:  # pragma: no cover - ml_dtypes ships with TensorFlow
            raise UnsupportedDatasetError(
                "reading bfloat16 needs the ml_dtypes package: pip install ml_dtypes"
            ) from error
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def spec_leaves(spec: Spec) -> list[TensorSpec]:
    """The leaves of ``spec`` in flattening order (tuples in order, dict keys sorted)."""
    if isinstance(spec, TensorSpec):
        return [spec]
    if isinstance(spec, dict):
        return [leaf for key in sorted(spec) for leaf in spec_leaves(spec[key])]
    return [leaf for item in spec for leaf in spec_leaves(item)]


def flatten(element: Any, spec: Spec) -> list[Any]:
    """The leaves of ``element``, which must have the structure of ``spec``."""
    if isinstance(spec, TensorSpec):
        return [element]
    if isinstance(spec, dict):
        if not isinstance(element, Mapping) or set(element) != set(spec):
            raise UnsupportedDatasetError(
                f"element structure changed: expected a dict with keys {sorted(spec)}"
            )
        return [leaf for key in sorted(spec) for leaf in flatten(element[key], spec[key])]
    if not isinstance(element, (tuple, list)) or len(element) != len(spec):
        raise UnsupportedDatasetError(f"element structure changed: expected a {len(spec)}-tuple")
    return [leaf for item, sub in zip(element, spec) for leaf in flatten(item, sub)]


def flattener(spec: Spec) -> Callable[[Any], Sequence[Any]]:
    """``flatten`` for one spec, with shortcuts for the common flat tuples and dicts of tensors."""
    if isinstance(spec, tuple) and all(isinstance(item, TensorSpec) for item in spec):
        size = len(spec)

        def flat_tuple(element: Any) -> Sequence[Any]:
            if isinstance(element, (tuple, list)) and len(element) == size:
                return element
            return flatten(element, spec)

        return flat_tuple
    if isinstance(spec, dict) and all(isinstance(item, TensorSpec) for item in spec.values()):
        keys = sorted(spec)
        key_set = set(keys)

        def flat_dict(element: Any) -> Sequence[Any]:
            if isinstance(element, dict) and element.keys() == key_set:
                return [element[key] for key in keys]
            return flatten(element, spec)

        return flat_dict
    return lambda element: flatten(element, spec)


def unflatten(leaves: Sequence[Any], spec: Spec) -> Any:
    """Rebuilds the nested structure of ``spec`` from its leaves."""
    iterator = iter(leaves)

    def build(node: Spec) -> Any:
        if isinstance(node, TensorSpec):
            return next(iterator)
        if isinstance(node, dict):
            return {key: build(node[key]) for key in sorted(node)}
        return tuple(build(item) for item in node)

    return build(spec)


def spec_to_json(spec: Spec) -> Any:
    if isinstance(spec, TensorSpec):
        shape = None if spec.shape is None else list(spec.shape)
        return {"tensor": {"dtype": spec.dtype, "shape": shape}}
    if isinstance(spec, dict):
        return {"dict": [[key, spec_to_json(spec[key])] for key in sorted(spec)]}
    return {"tuple": [spec_to_json(item) for item in spec]}


def spec_from_json(data: Any) -> Spec:
    try:
        if "tensor" in data:
            shape = data["tensor"]["shape"]
            dims = None if shape is None else tuple(None if d is None else int(d) for d in shape)
            if dims is not None and any(d is not None and d < 0 for d in dims):
                raise CorruptCacheError(f"element spec has a negative dimension: {list(dims)}")
            return TensorSpec(dtype=str(data["tensor"]["dtype"]), shape=dims)
        if "dict" in data:
            return {str(key): spec_from_json(value) for key, value in data["dict"]}
        return tuple(spec_from_json(item) for item in data["tuple"])
    except (KeyError, TypeError, ValueError, UnsupportedDatasetError) as error:
        raise CorruptCacheError(f"element spec in manifest is malformed: {error}") from error


def infer_spec(element: Any) -> Spec:
    """The spec of a framework-neutral element (nested dicts/tuples of arrays, numbers, str, bytes)."""
    if isinstance(element, Mapping):
        for key in element:
            if not isinstance(key, str):
                raise UnsupportedDatasetError(f"dict keys must be strings, got {key!r}")
        return {key: infer_spec(element[key]) for key in element}
    if isinstance(element, (tuple, list)):
        return tuple(infer_spec(item) for item in element)
    array = as_leaf_array(element)
    dtype = STRING if array.dtype == object else array.dtype.name
    return TensorSpec(dtype=dtype, shape=tuple(array.shape))


def as_leaf_array(value: Any) -> np.ndarray[Any, Any]:
    """Converts one leaf to an ndarray; text and bytes become object arrays of bytes."""
    if isinstance(value, (bytes, str)):
        value = value.encode("utf-8") if isinstance(value, str) else value
        array = np.empty((), dtype=object)
        array[()] = value
        return array
    array = np.asarray(value)
    if array.dtype.kind in "US":
        return np.vectorize(_to_bytes, otypes=[object])(array)
    if array.dtype == object:
        return np.vectorize(_to_bytes, otypes=[object])(array)
    return array


def _to_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, np.bytes_):
        return bytes(value)
    raise UnsupportedDatasetError(f"cannot cache a leaf of type {type(value).__name__}")


def generalize(spec: Spec, other: Spec) -> Spec:
    """The most specific spec that both ``spec`` and ``other`` satisfy (dims that differ become None)."""
    if isinstance(spec, TensorSpec) and isinstance(other, TensorSpec):
        if spec.dtype != other.dtype:
            raise UnsupportedDatasetError(f"dtype changed between elements: {spec.dtype} vs {other.dtype}")
        if spec.shape is None or other.shape is None or len(spec.shape) != len(other.shape):
            return TensorSpec(spec.dtype, None)
        return TensorSpec(
            spec.dtype, tuple(a if a == b else None for a, b in zip(spec.shape, other.shape))
        )
    if isinstance(spec, dict) and isinstance(other, dict) and set(spec) == set(other):
        return {key: generalize(spec[key], other[key]) for key in spec}
    if isinstance(spec, tuple) and isinstance(other, tuple) and len(spec) == len(other):
        return tuple(generalize(a, b) for a, b in zip(spec, other))
    raise UnsupportedDatasetError("element structure changed between elements")


class RecordCodec:
    """Encodes flat leaf lists to msgpack records and decodes them, checked against a spec."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.leaves = spec_leaves(spec)
        self._dtypes = [numpy_dtype(leaf.dtype) for leaf in self.leaves]
        # Batches can be stacked into dense columns only when every leaf has a fixed shape.
        self.stackable = all(leaf.is_fully_defined for leaf in self.leaves)
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        self.layout = FixedLayout(self.leaves) if FixedLayout.applies(self.leaves) else None

    # -- encoding -----------------------------------------------------------------------
    def encode(self, leaves: Sequence[Any]) -> bytes:
        """Encodes one record given as its flat list of leaves."""
        if len(leaves) != len(self.leaves):
            raise UnsupportedDatasetError(
                f"element has {len(leaves)} leaves, the spec has {len(self.leaves)}"
            )
        payload = [self._encode_leaf(i, value) for i, value in enumerate(leaves)]
        return self._packer.pack(payload)

    def _encode_leaf(self, index: int, value: Any) -> list[Any]:
        leaf = self.leaves[index]
        array = as_leaf_array(value)
        if not leaf.accepts(array.shape):
            raise UnsupportedDatasetError(
                f"leaf {index} has shape {array.shape}, incompatible with spec shape {leaf.shape}"
            )
        if leaf.dtype == STRING:
            if array.dtype != object:
                raise UnsupportedDatasetError(f"leaf {index} should hold strings, got {array.dtype}")
            return [STRING, list(array.shape), [_to_bytes(v) for v in array.reshape(-1)]]
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if array.dtype != self._dtypes[index]:
            raise UnsupportedDatasetError(
                f"leaf {index} has dtype {array.dtype.name}, the spec says {leaf.dtype}"
            )
        return [leaf.dtype, list(array.shape), np.ascontiguousarray(array).tobytes()]

    def encode_columns(self, columns: Sequence[np.ndarray[Any, Any]]) -> list[bytes]:
        """Encodes a batch given as one array per leaf, each with the batch as first dimension."""
        if len(columns) != len(self.leaves):
            raise UnsupportedDatasetError(
                f"batch has {len(columns)} leaves, the spec has {len(self.leaves)}"
            )
        if self.layout is not None:
            encoded = self.layout.encode(columns)
            if encoded is not None:
                return encoded
        count = len(columns[0]) if columns else 0
        pack = self._packer.pack
        per_leaf: list[list[Any]] = []
        for index, column in enumerate(columns):
            leaf = self.leaves[index]
            if len(column) != count:
                raise UnsupportedDatasetError("batch columns have different lengths")
            if leaf.dtype == STRING:
                per_leaf.append([self._encode_leaf(index, row) for row in column])
                continue
            column = np.asarray(column)
            if column.dtype != self._dtypes[index] or not leaf.accepts(column.shape[1:]):
                per_leaf.append([self._encode_leaf(index, row) for row in column])
                continue
            if column.dtype.byteorder == ">":
                column = column.astype(column.dtype.newbyteorder("<"))
            column = np.ascontiguousarray(column)
            shape = list(column.shape[1:])
            dtype = leaf.dtype
            raw = column.tobytes()
            size = len(raw) // count if count else 0
            per_leaf.append(
                [[dtype, shape, raw[i * size : (i + 1) * size]] for i in range(count)]
            )
        return [pack(list(row)) for row in zip(*per_leaf)]

    # -- decoding -----------------------------------------------------------------------
    def _unpack(self, value: bytes) -> list[Any]:
        try:
            payload = msgpack.unpackb(value, raw=False, use_list=True)
        except Exception as error:  # msgpack raises several types for malformed input
            raise CorruptCacheError(f"record is not valid msgpack: {error}") from error
        if not isinstance(payload, list) or len(payload) != len(self.leaves):
            raise CorruptCacheError("record does not match the manifest's element spec")
        return payload

    def decode(self, value: bytes) -> list[Any]:
        """Decodes one record to its flat list of leaves (numpy arrays, numpy scalars, bytes)."""
        return [self._decode_leaf(i, entry) for i, entry in enumerate(self._unpack(value))]

    def _decode_leaf(self, index: int, entry: Any) -> Any:
        leaf = self.leaves[index]
        try:
            dtype_name, shape, data = entry
            shape = tuple(int(d) for d in shape)
        except (TypeError, ValueError) as error:
            raise CorruptCacheError(f"leaf {index} of a record is malformed") from error
        if any(d < 0 for d in shape):
            raise CorruptCacheError(f"leaf {index} of a record has a negative dimension")
        if dtype_name != leaf.dtype or not leaf.accepts(shape):
            raise CorruptCacheError(
                f"leaf {index} of a record is {dtype_name}{list(shape)}, the spec says "
                f"{leaf.dtype}{leaf.shape}"
            )
        count = math.prod(shape)
        if leaf.dtype == STRING:
            if not isinstance(data, list) or len(data) != count or not all(
                isinstance(v, bytes) for v in data
            ):
                raise CorruptCacheError(f"string leaf {index} of a record is malformed")
            if not shape:
                return data[0]
            array = np.empty(count, dtype=object)
            array[:] = data
            return array.reshape(shape)
        dtype = self._dtypes[index]
        if not isinstance(data, bytes) or len(data) != count * dtype.itemsize:
            raise CorruptCacheError(f"leaf {index} of a record has the wrong number of bytes")
        array = np.frombuffer(data, dtype=dtype).reshape(shape)
        return array[()] if not shape else array

    def decode_columns(self, values: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
        """Decodes a batch of records into one stacked array per leaf (stackable specs only).

        ``values`` may be bytes or buffers (e.g. LMDB memoryviews).
        """
        if self.layout is not None:
            return self.layout.decode(values)
        try:
            return self._decode_columns_slow([self._unpack(bytes(value)) for value in values])
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise CorruptCacheError(f"a record does not match the manifest's element spec: {error}") from error

    def _decode_columns_slow(self, rows: list[list[Any]]) -> list[np.ndarray[Any, Any]]:
        count = len(rows)
        columns: list[np.ndarray[Any, Any]] = []
        for index, leaf in enumerate(self.leaves):
            shape = tuple(int(d or 0) for d in leaf.shape or ())
            entries = [row[index] for row in rows]
            try:
                if any(entry[0] != leaf.dtype or tuple(entry[1]) != shape for entry in entries):
                    raise CorruptCacheError(
                        f"leaf {index} of a record does not match the spec {leaf.dtype}{shape}"
                    )
            except (TypeError, IndexError) as error:
                raise CorruptCacheError(f"leaf {index} of a record is malformed") from error
            if leaf.dtype == STRING:
                decoded = [self._decode_leaf(index, entry) for entry in entries]
                column: np.ndarray[Any, Any] = np.empty((count, *shape), dtype=object)
                for row, item in enumerate(decoded):
                    column[row] = item
                columns.append(column)
                continue
            dtype = self._dtypes[index]
            size = math.prod(shape) * dtype.itemsize
            if any(not isinstance(entry[2], bytes) or len(entry[2]) != size for entry in entries):
                raise CorruptCacheError(f"leaf {index} of a record has the wrong number of bytes")
            raw = b"".join(entry[2] for entry in entries)
            columns.append(np.frombuffer(raw, dtype=dtype).reshape((count, *shape)))
        return columns


_ALIGN = 64  # TensorFlow adopts 64-byte aligned numpy buffers without copying them


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """``np.empty`` whose data starts on a 64-byte boundary (malloc only promises 16)."""
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + size].view(dtype).reshape(shape)


class FixedLayout:
    """The byte layout shared by every record of a spec whose leaves are all fixed-shape numbers.

    msgpack is compositional, so every such record is the same header bytes with each leaf's
    raw data at the same offset. A batch of records can then be encoded and decoded with a
    few numpy operations instead of one msgpack call per record; the records are exactly what
    ``RecordCodec.encode`` writes, and decoding checks every header byte.
    """

    @staticmethod
    def applies(leaves: Sequence[TensorSpec]) -> bool:
        return all(leaf.is_fully_defined and leaf.dtype != STRING for leaf in leaves)

    def __init__(self, leaves: Sequence[TensorSpec]) -> None:
        packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        template = bytearray(packer.pack_array_header(len(leaves)))
        self.fields: list[tuple[int, int, np.dtype[Any], tuple[int, ...]]] = []
        headers: list[tuple[int, int]] = []
        for leaf in leaves:
            shape = tuple(int(d or 0) for d in leaf.shape or ())
            dtype = numpy_dtype(leaf.dtype)
            size = math.prod(shape) * dtype.itemsize
            header = (
                packer.pack_array_header(3)
                + packer.pack(leaf.dtype)
                + packer.pack(list(shape))
                + packer.pack(bytes(size))[: -size or None]
            )
            headers.append((len(template), len(template) + len(header)))
            template += header
            self.fields.append((len(template), size, dtype, shape))
            template += bytes(size)
        self.template = np.frombuffer(bytes(template), dtype=np.uint8)
        self.record_size = len(template)
        self._local = threading.local()
        # Merge adjacent header runs into slices checked on decode.
        self.header_slices = [slice(a, b) for a, b in headers if b > a]
        self.header_slices.insert(0, slice(0, headers[0][0]) if headers else slice(0, 1))

    def encode(self, columns: Sequence[Any]) -> list[bytes] | None:
        """The records of a batch given as columns, or None if a column does not match (the
        caller falls back). Records are memoryviews into one table: no per-record copy."""
        count = len(columns[0]) if len(columns) else 0
        table = self._table(count)
        for column, (offset, size, dtype, shape) in zip(columns, self.fields):
            column = np.asarray(column)
            if column.dtype != dtype or column.shape != (count, *shape):
                return None
            table[:, offset : offset + size] = np.ascontiguousarray(column).view(np.uint8).reshape(count, size)
        return self._records(table)

    def encode_stacked(self, rows: Sequence[Sequence[Any]]) -> list[bytes] | None:
        """Like ``encode_rows``, but stacks each leaf's values with one numpy call: for rows of
        numpy arrays and scalars whose dtypes match exactly. None if they do not (the caller
        then tries ``encode_rows``)."""
        count = len(rows)
        columns = []
        for index, (_, _, dtype, shape) in enumerate(self.fields):
            values = [row[index] for row in rows]
            for value in values:
                if getattr(value, "dtype", None) != dtype:
                    return None
            try:
                column = np.stack(values) if shape else np.array(values, dtype=dtype)
            except ValueError:  # shapes differ
                return None
            if column.shape != (count, *shape):
                return None
            columns.append(column)
        return self.encode(columns)

    def encode_rows(self, rows: Sequence[Sequence[Any]]) -> list[bytes] | None:
        """The records of a batch given as flat leaf lists, or None if a leaf does not match."""
        table = self._table(len(rows))
        for index, row in enumerate(rows):
            for value, (offset, size, dtype, shape) in zip(row, self.fields):
                array = np.asarray(value)
                if array.dtype != dtype or array.shape != shape:
                    return None
                table[index, offset : offset + size] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return self._records(table)

    def _table(self, count: int) -> np.ndarray[Any, Any]:
        table = np.empty((count, self.record_size), dtype=np.uint8)
        table[:] = self.template
        return table

    def _records(self, table: np.ndarray[Any, Any]) -> list[Any]:
        view = table.data.cast("B")
        step = self.record_size
        return [view[i : i + step] for i in range(0, len(view), step)]

    def decode(self, values: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
        if self.record_size >= _ROW_COPY_BYTES:
            return self._decode_rows(values)
        count, size = len(values), self.record_size
        # Gather the records into a per-thread staging table that is reused from batch to
        # batch (fresh memory costs a page fault per 4 KiB), then copy each leaf's column out.
        staging = self._staging(count * size)
        view = staging.data  # a writable memoryview of the staging table
        end = 0
        try:
            for value in values:
                view[end : end + size] = value
                end += size
        except (ValueError, TypeError):
            raise CorruptCacheError(
                f"a record is not {size} bytes long, as the manifest's element spec says"
            ) from None
        table = staging[: count * size].reshape(count, size)
        for part in self.header_slices:
            expected = np.broadcast_to(self.template[part], (count, part.stop - part.start))
            if not np.array_equal(table[:, part], expected):
                raise CorruptCacheError("a record does not match the manifest's element spec")
        columns = []
        for offset, length, dtype, shape in self.fields:
            column = aligned_empty((count, *shape), dtype)
            column.reshape(count, -1).view(np.uint8)[...] = table[:, offset : offset + length]
            columns.append(column)
        return columns

    def _staging(self, size: int) -> np.ndarray[Any, Any]:
        buffer: Optional[np.ndarray[Any, Any]] = getattr(self._local, "staging", None)
        if buffer is None or len(buffer) < size:
            buffer = np.empty(max(size, 1), dtype=np.uint8)
            self._local.staging = buffer
        return buffer

    def _decode_rows(self, values: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
        """Large records: copy each leaf straight from the record into its column (one copy)."""
        count = len(values)
        columns = [aligned_empty((count, *shape), dtype) for _, _, dtype, shape in self.fields]
        targets = [column.reshape(count, -1).view(np.uint8) for column in columns]
        header_index, header_bytes = self._header
        for row, value in enumerate(values):
            record = np.frombuffer(value, dtype=np.uint8)
            if len(record) != self.record_size or not np.array_equal(record[header_index], header_bytes):
                raise CorruptCacheError("a record does not match the manifest's element spec")
            for target, (offset, size, _, _) in zip(targets, self.fields):
                target[row] = record[offset : offset + size]
        return columns

    @functools.cached_property
    def _header(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        index = np.concatenate([np.arange(p.start, p.stop) for p in self.header_slices])
        return index, self.template[index]

