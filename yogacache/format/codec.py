"""The msgpack record codec: a flat list of leaves to one record's bytes and back.

A record is a msgpack list with one entry per leaf of the element spec. Each numeric leaf is
``[dtype, shape, raw little-endian bytes]``; each string leaf is ``["string", shape, [bytes,
...]]`` (row-major). Decoding never executes code: msgpack only yields lists, ints, strings
and bytes, and every leaf is checked against the spec. Specs whose leaves are all fixed-shape
numbers take the equivalent fast path of ``yogacache.format.layout``.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import msgpack
import numpy as np

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError
from yogacache.format.layout import FixedLayout
from yogacache.format.spec import (
    STRING,
    Spec,
    as_leaf_array,
    key_path,
    leaf_paths,
    numpy_dtype,
    spec_leaves,
    to_bytes,
)

# The codec that wrote a cache's records, as recorded in its manifest.
CODEC_NAME = "msgpack-leaves-v1"

# Leaves of at least this many raw bytes are framed by hand and joined in one exact copy
# (``RecordCodec._pack_large``): msgpack's packer grows its buffer by doubling and copies it
# out, which held a large member three times over while its record was encoded.
LARGE_LEAF_BYTES = 1 << 20


def _large(data: Any) -> bool:
    """Whether a leaf's data (bytes, or a string leaf's list of bytes) holds a large value."""
    if isinstance(data, list):
        return any(len(value) >= LARGE_LEAF_BYTES for value in data)
    return len(data) >= LARGE_LEAF_BYTES


def _bin_header(size: int) -> bytes:
    """msgpack's header of a ``bin`` value of ``size`` bytes (the smallest form, as the packer writes)."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    if size < 1 << 32:
        return b"\xc6" + size.to_bytes(4, "big")
    raise UnsupportedDatasetError(f"a value of {size} bytes is over msgpack's limit of 4 GiB")


class RecordCodec:
    """Encodes flat leaf lists to msgpack records and decodes them, checked against a spec."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.leaves = spec_leaves(spec)
        if not self.leaves:
            raise UnsupportedDatasetError(
                f"an element with no tensor ({spec!r}) cannot be cached: a record needs at "
                "least one array, number, string or bytes leaf"
            )
        self._dtypes = [numpy_dtype(leaf.dtype) for leaf in self.leaves]
        # How encoding errors name a leaf: its index and where it sits in the element.
        self._names = [
            f"leaf {i} ({key_path(path)})" if path else f"leaf {i}" for i, path in enumerate(leaf_paths(spec))
        ]
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
        if any(_large(entry[2]) for entry in payload):
            return self._pack_large(payload)
        return self._packer.pack(payload)

    def _pack_large(self, payload: list[list[Any]]) -> bytes:
        """``payload`` packed as msgpack's packer packs it, byte for byte, with each large
        bytes value framed by its header and copied once, into the joined record."""
        pack = self._packer.pack
        pieces: list[bytes] = [self._packer.pack_array_header(len(payload))]
        for dtype, shape, data in payload:
            pieces += [self._packer.pack_array_header(3), pack(dtype), pack(shape)]
            values = data if isinstance(data, list) else None
            if values is not None:
                pieces.append(self._packer.pack_array_header(len(values)))
            for value in values if values is not None else [data]:
                if len(value) >= LARGE_LEAF_BYTES:
                    pieces += [_bin_header(len(value)), value]
                else:
                    pieces.append(pack(value))
        return b"".join(pieces)

    def _encode_leaf(self, index: int, value: Any) -> list[Any]:
        leaf = self.leaves[index]
        array = as_leaf_array(value)
        if not leaf.accepts(array.shape):
            raise UnsupportedDatasetError(
                f"{self._names[index]} has shape {array.shape}, incompatible with spec shape {leaf.shape}"
            )
        if leaf.dtype == STRING:
            if array.dtype != object:
                raise UnsupportedDatasetError(f"{self._names[index]} should hold strings, got {array.dtype}")
            return [STRING, list(array.shape), [to_bytes(v) for v in array.reshape(-1)]]
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if array.dtype != self._dtypes[index]:
            raise UnsupportedDatasetError(
                f"{self._names[index]} has dtype {array.dtype.name}, the spec says {leaf.dtype}"
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
