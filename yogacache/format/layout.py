"""The fixed-layout fast path: batches of fixed-shape numeric records encoded and decoded at once.

Records are byte for byte what ``RecordCodec.encode`` writes; only the number of Python
operations per record differs.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Optional, Sequence

import msgpack
import numpy as np

from yogacache.errors import CorruptCacheError
from yogacache.format.spec import STRING, TensorSpec, numpy_dtype

# Records at least this large are decoded row by row into their columns (one copy); smaller
# ones are joined and sliced column-wise (fewer Python operations).
_ROW_COPY_BYTES = 16 << 10
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

