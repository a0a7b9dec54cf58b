"""Where each record of a sealed LMDB part lies in its file, read from the part's B-tree pages.

A read of fixed-layout records (``FixedLayout``: every record the same size, each leaf at the
same offset) can then gather its rows from a read-only map of the file with a few numpy calls,
one per leaf, instead of one LMDB ``get`` and one copy per record. numpy copies with the
interpreter lock released, so a reading thread and the framework consuming its batches run at
once instead of taking turns.

The offsets come from the part's current B-tree (the newest meta page's root, branch pages,
then leaf pages in key order), parsed with numpy over all the pages of a level at once; stale
pages of earlier transactions are never looked at. LMDB's file format (0.9, 64-bit) is stable
and documented in ``mdb.c``; anything that does not look exactly as expected (another format
version, page size, flags, key width, value size, missing or unordered keys, a page out of the
file) makes ``record_offsets`` return None, and the reader keeps using LMDB itself. Gathers are
bounds-checked by numpy, so a file altered after verification can give wrong bytes (as through
LMDB) but never a read outside the map.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16  # pgno (8), pad (2), flags (2), lower and upper (2 + 2) or overflow count (4)
NODE_HEADER = 8  # lo, hi, flags, key size: 2 bytes each
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA = 0x01  # the value is on overflow pages; the node holds their first page number
KEY_BYTES = 8  # yogacache keys: the record number, 8 bytes big-endian
MAX_DEPTH = 32

# MDB_meta after the page header: magic (4), version (4), address (8), map size (8), then two
# MDB_db of 48 bytes (free pages, main), last page (8), transaction id (8).
_META_MAGIC, _META_VERSION = 16, 20
_FREE_DB, _MAIN_DB = 40, 88
_META_TXNID = 144
# MDB_db: pad (4; the page size in the free pages' record), flags (2), depth (2), branch, leaf
# and overflow page counts (8 each), entries (8), root page (8).
_DB_PAD, _DB_FLAGS, _DB_DEPTH, _DB_ENTRIES, _DB_ROOT = 0, 4, 6, 32, 40


# What appending records costs in file bytes (a writer's part size bound; see ``append_bytes``).
_BRANCH_NODE = NODE_HEADER + KEY_BYTES + 2  # a branch node (a key and a child page) and its pointer
_OVERFLOW_NODE = NODE_HEADER + KEY_BYTES + 8 + 2  # a leaf node naming its value's first overflow page
# Pages a transaction may add besides its records' shares (``transaction_bytes``): per level,
# the copy of the page on the path to the last leaf (copy on write) and a page begun part-full;
# then a new root and the free-page database's pages.
_TXN_PAGES = 3


def _leaf_nodes(sizes: np.ndarray[Any, Any], page_size: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Per record under an 8-byte key, its leaf page bytes (LMDB 0.9's ``mdb_leaf_size``: node
    header, key and value, or an overflow page number for a value too large for a leaf, rounded
    up to even, and the node's 2-byte pointer), and whether its value is on overflow pages."""
    node_max = (((page_size - PAGE_HEADER) // 2) & -2) - 2  # me_nodemax
    full = NODE_HEADER + KEY_BYTES + sizes
    big = full > node_max
    node = np.where(big, _OVERFLOW_NODE - 2, full)
    return (node + 1) // 2 * 2 + 2, big


def append_bytes(value_sizes: np.ndarray[Any, Any], page_size: int, widest_leaf_node: int = 0) -> np.ndarray[Any, Any]:
    """An upper bound of the file bytes each record of ``value_sizes`` adds to an LMDB file when
    appended in key order (``put`` with ``append``): its overflow pages (a value too large for a
    leaf takes ``ceil((16 + size) / page_size)`` pages, so a 4 KiB value takes two), and its share
    of leaf and branch pages. Appending fills each leaf page until the next node does not fit,
    so no leaf page keeps more room than the widest leaf node (``widest_leaf_node``: the widest
    the file holds already; these records' own count too), and each leaf page adds one node to
    a branch page. A transaction adds at most ``transaction_bytes`` besides."""
    sizes = np.asarray(value_sizes, dtype=np.int64)
    leaf, big = _leaf_nodes(sizes, page_size)
    widest = max(int(widest_leaf_node), int(leaf.max(initial=0)))
    usable = page_size - PAGE_HEADER
    per_leaf_byte = page_size / (usable - widest) * (1 + _BRANCH_NODE / (usable - _BRANCH_NODE))
    overflow = np.where(big, (PAGE_HEADER + sizes + page_size - 1) // page_size * page_size, 0)
    return np.asarray(np.ceil(leaf * per_leaf_byte).astype(np.int64) + overflow)


def widest_leaf_node(value_sizes: np.ndarray[Any, Any], page_size: int) -> int:
    """The widest leaf node (with its pointer) of records of ``value_sizes`` (see ``append_bytes``)."""
    leaf, _ = _leaf_nodes(np.asarray(value_sizes, dtype=np.int64), page_size)
    return int(leaf.max(initial=0))


def transaction_bytes(page_size: int, depth: int) -> int:
    """The file bytes one transaction may add besides its records' (``append_bytes``) to a file
    whose tree is ``depth`` levels deep: per level a copy of the page it changes and a page begun
    part-full, a new root, the free-page database's pages."""
    return (2 * depth + _TXN_PAGES) * page_size


@dataclass(frozen=True)
class RecordOffsets:
    """The file offset of the value of every key ``first_key + i`` of one part, and the map."""

    data: np.ndarray[Any, Any]  # the whole file, uint8, read-only
    first_key: int
    offsets: np.ndarray[Any, Any]  # int64, one per record in key order
    record_size: int

    def windows(self, width: int) -> np.ndarray[Any, Any]:
        """Every ``width`` consecutive bytes of the file as a row: row ``o`` starts at offset
        ``o`` (a view; no byte is copied). Taking rows of it is a bounds-checked gather."""
        size = len(self.data)
        return as_strided(self.data, shape=(max(0, size - width + 1), width), strides=(1, 1), writeable=False)


class _Mapping:
    """A read-only shared map of a whole file, unmapped when the last array over it is gone.

    Made with libc's ``mmap`` rather than Python's ``mmap.mmap``, which keeps a duplicate of the
    file's descriptor open for as long as the map lives (a reader holds one descriptor per part,
    no more). numpy arrays over it keep it alive through their ``base``.
    """

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size
        self._munmap = _libc().munmap  # held: at interpreter exit module globals may be gone
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, True), "version": 3}

    def __del__(self) -> None:
        self._munmap(self.address, self.size)


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def map_file(fd: int, random_access: bool) -> Optional[np.ndarray[Any, Any]]:
    """The file behind ``fd`` mapped read-only as uint8 (the descriptor may be closed after);
    None if it cannot be mapped."""
    try:
        size = os.fstat(fd).st_size
        libc = _libc()
    except (OSError, AttributeError):
        return None
    if size == 0:
        return None
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == ctypes.c_void_p(-1).value:
        return None
    if random_access:
        libc.madvise(ctypes.c_void_p(address), size, mmap.MADV_RANDOM)
    return np.asarray(_Mapping(address, size))


def _u16(data: np.ndarray[Any, Any], at: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return data[at].astype(np.int64) | (data[at + 1].astype(np.int64) << 8)


def _u64(data: np.ndarray[Any, Any], at: np.ndarray[Any, Any], big_endian: bool = False) -> np.ndarray[Any, Any]:
    rows = data[at[:, None] + np.arange(8)]
    return (rows.view(">u8" if big_endian else "<u8").ravel()).astype(np.int64)


def _scalar(data: np.ndarray[Any, Any], at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size].tobytes(), "little")


def _newest_main_db(data: np.ndarray[Any, Any]) -> Optional[tuple[int, int, int, int, int]]:
    """The page size and the main database's flags, depth, entries and root page, from the
    meta page with the highest transaction id; None if the meta pages are not LMDB 0.9's."""
    if len(data) < 2 * 4096:
        return None
    page_size = _scalar(data, _FREE_DB + _DB_PAD, 4)  # meta page 0 records the page size
    if page_size < 512 or page_size & (page_size - 1) or len(data) < 2 * page_size:
        return None
    metas = (0, page_size)
    for meta in metas:
        if not _scalar(data, meta + 10, 2) & P_META:
            return None
        if _scalar(data, meta + _META_MAGIC, 4) != MAGIC or _scalar(data, meta + _META_VERSION, 4) != DATA_VERSION:
            return None
    db = max(metas, key=lambda meta: _scalar(data, meta + _META_TXNID, 8)) + _MAIN_DB
    return (
        page_size,
        _scalar(data, db + _DB_FLAGS, 2),
        _scalar(data, db + _DB_DEPTH, 2),
        _scalar(data, db + _DB_ENTRIES, 8),
        _scalar(data, db + _DB_ROOT, 8),
    )


def _nodes(
    data: np.ndarray[Any, Any], pages: np.ndarray[Any, Any], page_size: int, kind: int
) -> Optional[np.ndarray[Any, Any]]:
    """The file offsets of the nodes of ``pages`` (all of flag ``kind``), in order."""
    starts = pages * page_size
    if len(pages) == 0 or starts.min() < 2 * page_size or starts.max() + page_size > len(data):
        return None
    if np.any(_u16(data, starts + 10) & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META) != kind):
        return None
    lower = _u16(data, starts + 12)
    counts = (lower - PAGE_HEADER) // 2
    if np.any(lower < PAGE_HEADER) or np.any(lower > page_size) or np.any(counts == 0):
        return None
    page_of_node = np.repeat(starts, counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    slot = np.arange(int(counts.sum()), dtype=np.int64) - first
    pointers = _u16(data, page_of_node + PAGE_HEADER + 2 * slot)
    if np.any(pointers < PAGE_HEADER) or np.any(pointers > page_size - NODE_HEADER):
        return None
    return page_of_node + pointers


def record_offsets(data: np.ndarray[Any, Any], record_size: int, entries: int) -> Optional[RecordOffsets]:
    """Where the ``entries`` values of ``record_size`` bytes of the part mapped as ``data`` lie,
    keyed by consecutive 8-byte big-endian keys; None if the part is not laid out that way."""
    try:
        return _record_offsets(data, record_size, entries)
    except (IndexError, ValueError, OverflowError):
        return None  # a page or node pointing outside the file


def _record_offsets(data: np.ndarray[Any, Any], record_size: int, entries: int) -> Optional[RecordOffsets]:
    main = _newest_main_db(data)
    if main is None:
        return None
    page_size, flags, depth, count, root = main
    if flags != 0 or count != entries or entries == 0 or not 1 <= depth <= MAX_DEPTH:
        return None
    level = np.array([root], dtype=np.int64)
    for _ in range(depth - 1):  # branch levels: each node names a child page
        nodes = _nodes(data, level, page_size, P_BRANCH)
        if nodes is None:
            return None
        low, high, top = _u16(data, nodes), _u16(data, nodes + 2), _u16(data, nodes + 4)
        level = low | (high << 16) | (top << 32)
    nodes = _nodes(data, level, page_size, P_LEAF)
    if nodes is None or len(nodes) != entries:
        return None
    sizes = _u16(data, nodes) | (_u16(data, nodes + 2) << 16)
    node_flags = _u16(data, nodes + 4)
    if np.any(sizes != record_size) or np.any(_u16(data, nodes + 6) != KEY_BYTES) or np.any(node_flags & ~F_BIGDATA):
        return None
    keys = _u64(data, nodes + NODE_HEADER, big_endian=True)
    first_key = int(keys[0])
    if first_key < 0 or not np.array_equal(keys, first_key + np.arange(entries, dtype=np.int64)):
        return None
    value_at = nodes + NODE_HEADER + KEY_BYTES
    big = (node_flags & F_BIGDATA) != 0
    if big.any():
        overflow = _u64(data, value_at[big]) * page_size
        if overflow.min() < 2 * page_size or overflow.max() + page_size > len(data):
            return None
        # Each overflow page's own header says so; checking a sample keeps the parse from
        # touching every page of the file (a record's bytes are verified with the part).
        sample = overflow[np.linspace(0, len(overflow) - 1, min(len(overflow), 64)).astype(np.int64)]
        if np.any(_u16(data, sample + 10) & P_OVERFLOW == 0) or np.any(_u64(data, sample) != sample // page_size):
            return None
        value_at[big] = overflow + PAGE_HEADER
    if value_at.min() < 0 or value_at.max() + record_size > len(data):
        return None
    return RecordOffsets(data, first_key, value_at, record_size)
