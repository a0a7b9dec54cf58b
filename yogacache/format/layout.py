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
_MAX_BIN_BYTES = 0xFFFFFFFF  # the largest msgpack bin (bin 32)


def _leaf_bytes(leaf: TensorSpec) -> int:
    """The raw bytes of one fixed-shape numeric leaf."""
    return math.prod(int(d or 0) for d in leaf.shape or ()) * numpy_dtype(leaf.dtype).itemsize


def _bin_header(size: int) -> bytes:
    """The msgpack header of a bin of ``size`` bytes, as ``Packer(use_bin_type=True)`` writes it."""
    if size <= 0xFF:
        return b"\xc4" + size.to_bytes(1, "big")
    if size <= 0xFFFF:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


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
        return all(
            leaf.is_fully_defined and leaf.dtype != STRING and _leaf_bytes(leaf) <= _MAX_BIN_BYTES
            for leaf in leaves
        )

    def __init__(self, leaves: Sequence[TensorSpec]) -> None:
        # Only the header bytes are kept: the layout costs O(header) whatever shape the spec
        # declares (a record of 4 GB is laid out without allocating it).
        packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        array_header = packer.pack_array_header(len(leaves))
        self.fields: list[tuple[int, int, np.dtype[Any], tuple[int, ...]]] = []
        headers: list[tuple[int, bytes]] = [(0, array_header)]
        offset = len(array_header)
        for leaf in leaves:
            shape = tuple(int(d or 0) for d in leaf.shape or ())
            dtype = numpy_dtype(leaf.dtype)
            size = _leaf_bytes(leaf)
            header = (
                packer.pack_array_header(3)
                + packer.pack(leaf.dtype)
                + packer.pack(list(shape))
                + _bin_header(size)
            )
            headers.append((offset, header))
            offset += len(header)
            self.fields.append((offset, size, dtype, shape))
            offset += size
        self.record_size = offset
        # Small records decode from one table of whole records (``decode_table``: a reader
        # may gather that table straight from a part's map); large ones row by row, one copy.
        self.by_table = self.record_size < _ROW_COPY_BYTES
        self._local = threading.local()
        # The header runs every record repeats, checked on decode, with their bytes.
        self.header_slices = [slice(start, start + len(data)) for start, data in headers if data]
        self.header_values = [np.frombuffer(data, dtype=np.uint8) for _, data in headers if data]

    def encode(self, columns: Sequence[Any]) -> list[bytes] | None:
        """The records of a batch given as columns, or None if a column does not match (the
        caller falls back). Records are memoryviews into one table: no per-record copy."""
        if len(columns) != len(self.fields):
            return None
        count = len(columns[0]) if len(columns) else 0
        table = self._table(count)
        for column, (offset, size, dtype, shape) in zip(columns, self.fields):
            column = np.asarray(column)
            if column.dtype != dtype or column.shape != (count, *shape):
                return None
            table[:, offset : offset + size] = np.ascontiguousarray(column).view(np.uint8).reshape(count, size)
        return self._records(table)

    def encode_stacked(self, rows: Sequence[Sequence[Any]]) -> list[bytes] | None:
        """Like ``encode_rows``, but stacks each leaf's values with one numpy call straight into
        the record table (one copy per value): for rows of numpy arrays and scalars whose
        dtypes match exactly. None if they do not (the caller then tries ``encode_rows``)."""
        count = len(rows)
        table = self._table(count)
        for index, (offset, _, dtype, shape) in enumerate(self.fields):
            values = [row[index] for row in rows]
            for value in values:
                if getattr(value, "dtype", None) != dtype:
                    return None
            # The leaf's column of the table, seen as ``count`` values of its dtype and shape.
            column = np.ndarray(
                (count, *shape),
                dtype=dtype,
                buffer=table,
                offset=offset,
                strides=(self.record_size, *_contiguous_strides(shape, dtype.itemsize)),
            )
            try:
                if shape:
                    np.stack(values, out=column)
                else:
                    column[...] = values
            except ValueError:  # shapes differ
                return None
        return self._records(table)

    def encode_rows(self, rows: Sequence[Sequence[Any]]) -> list[bytes] | None:
        """The records of a batch given as flat leaf lists, or None if a leaf does not match."""
        table = self._table(len(rows))
        for index, row in enumerate(rows):
            if len(row) != len(self.fields):
                return None
            for value, (offset, size, dtype, shape) in zip(row, self.fields):
                array = np.asarray(value)
                if array.dtype != dtype or array.shape != shape:
                    return None
                table[index, offset : offset + size] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return self._records(table)

    def _table(self, count: int) -> np.ndarray[Any, Any]:
        """A table of ``count`` records with their headers filled in (the callers fill every leaf)."""
        table = np.empty((count, self.record_size), dtype=np.uint8)
        for part, value in zip(self.header_slices, self.header_values):
            table[:, part] = value
        return table

    def _records(self, table: np.ndarray[Any, Any]) -> list[Any]:
        view = table.data.cast("B")
        step = self.record_size
        return [view[i : i + step] for i in range(0, len(view), step)]

    def decode(self, values: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
        if not self.by_table:
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
        return self.decode_table(staging[: count * size].reshape(count, size))

    def decode_record(self, value: Any) -> list[Any]:
        """One record's leaves (bytes or a buffer), as row 0 of ``decode`` gives them: numpy
        scalars for scalar leaves, writable arrays of their own for the others; every header
        byte checked. A few Python operations, for single-record reads."""
        if len(value) != self.record_size:
            raise CorruptCacheError(
                f"a record is not {self.record_size} bytes long, as the manifest's element spec says"
            )
        for part, header in zip(self.header_slices, self._header_runs):
            if value[part] != header:
                raise CorruptCacheError("a record does not match the manifest's element spec")
        leaves: list[Any] = []
        for offset, size, dtype, shape in self.fields:
            leaf = np.frombuffer(value, dtype=dtype, count=size // dtype.itemsize, offset=offset)
            leaves.append(leaf.reshape(shape).copy() if shape else leaf[0])
        return leaves

    @functools.cached_property
    def _header_runs(self) -> list[bytes]:
        return [value.tobytes() for value in self.header_values]

    def decode_table(self, table: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
        """The columns of a table of whole records (``count x record_size`` bytes), every header
        byte checked."""
        count = len(table)
        for part, value in zip(self.header_slices, self.header_values):
            if not np.array_equal(table[:, part], np.broadcast_to(value, (count, len(value)))):
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
        """Large records: copy each leaf straight from the record into its column (one copy).

        Every record is checked before the columns are allocated: a record that does not
        match the spec costs no allocation of the size the spec declares."""
        count = len(values)
        header_index, header_bytes = self._header
        records = []
        for value in values:
            record = np.frombuffer(value, dtype=np.uint8)
            if len(record) != self.record_size or not np.array_equal(record[header_index], header_bytes):
                raise CorruptCacheError("a record does not match the manifest's element spec")
            records.append(record)
        columns = [aligned_empty((count, *shape), dtype) for _, _, dtype, shape in self.fields]
        targets = [column.reshape(count, -1).view(np.uint8) for column in columns]
        for row, record in enumerate(records):
            for target, (offset, size, _, _) in zip(targets, self.fields):
                target[row] = record[offset : offset + size]
        return columns

    @functools.cached_property
    def _header(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        index = np.concatenate([np.arange(p.start, p.stop) for p in self.header_slices])
        return index, np.concatenate(self.header_values)


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides of a C-contiguous array of ``shape``."""
    strides = []
    step = itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))
