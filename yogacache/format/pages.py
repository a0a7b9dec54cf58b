"""Where a record of a sealed LMDB part lies in its file, found from the part's B-tree pages.

A read of fixed-layout records (``FixedLayout``: every record the same size) can then gather
its rows from a read-only map of the file with a few numpy calls per batch instead of one LMDB
``get`` and one copy per record. numpy copies with the interpreter lock released, so a reading
thread and the framework consuming its batches run at once instead of taking turns.

Nothing is kept per record or per page (``PartTree``): a part written in key order with
``append=True`` fills every page of each level of its B-tree before it starts the next, so the
page, and the slot in it, of the record ``n`` places after the part's first follow from the
tree's shape: the records a leaf holds and each branch level's fan-out, O(depth) numbers,
checked once over the branch pages (about one page in a hundred; the leaves are not read).
Each batch walks from the newest meta page's root down, one page per level, as LMDB's own
search does; stale pages of earlier transactions are never reached. LMDB's file format (0.9,
64-bit) is stable and documented in ``mdb.c``. Every record is checked on its leaf (the leaf
holds its slot, the node there its key and a value of the expected size; records read in key
order, once per leaf: its first and last keys): anything that does not look exactly as
expected (another format version, page size, flags, key width, value size, a tree not filled
in order, a page out of the file) gives None, and the reader asks LMDB itself.
Gathers are bounds-checked by numpy, so a file altered after verification can give wrong bytes
(as through LMDB) but never a read outside the map.
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import os
from typing import Any, Optional, Sequence

import numpy as np

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16  # pgno (8), pad (2), flags (2), lower and upper (2 + 2) or overflow count (4)
NODE_HEADER = 8  # lo, hi, flags, key size: 2 bytes each
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
_PAGE_KINDS = P_BRANCH | P_LEAF | P_OVERFLOW | P_META
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


class PartTree:
    """The shape of one part's B-tree, enough to find record ``first_key + n`` by arithmetic.

    Every page below the root holds as many nodes as fit (the last of each level excepted),
    as appending in key order leaves them: leaves ``per_leaf`` records each, branch pages of
    level ``l`` (the root's is 0) ``fanouts[l]`` children each. Record ``n`` is then on leaf
    ``n // per_leaf``, in its slot ``n % per_leaf``, and that leaf under child
    ``leaf // spans[l] % fanouts[l]`` of its page at level ``l``. ``part_tree`` checks the
    branch levels once; each read checks the leaf it lands on (a leaf page holding that slot,
    whose node holds the wanted key and a value of the expected size). O(depth) numbers a part.
    """

    def __init__(
        self,
        data: np.ndarray[Any, Any],
        *,
        page_size: int,
        root: int,
        first_key: int,
        entries: int,
        record_size: int,
        per_leaf: int,
        fanouts: Sequence[int],
        on_overflow: bool,
    ) -> None:
        self.data = data  # the whole file, uint8, read-only
        self.page_size = page_size
        self.root = root  # the root's page number
        self.first_key = first_key
        self.entries = entries
        self.record_size = record_size
        self.per_leaf = per_leaf
        # Per branch level, root first: children of a full page (the root's: 0, not wrapped)
        # and leaves under one child.
        self.fanouts = tuple(fanouts)
        self.spans = tuple(math.prod(self.fanouts[level + 1 :]) for level in range(len(self.fanouts)))
        self.on_overflow = on_overflow  # values on overflow pages (records over half a page)
        # A leaf node as it must read: value size, flags and key size, as one little-endian word.
        self._leaf_head = record_size | ((F_BIGDATA if on_overflow else 0) << 32) | (KEY_BYTES << 48)
        # The file as 16-bit halves, as 64-bit words starting at every even offset (LMDB's
        # nodes and pointers lie at even offsets), and as records starting at every offset:
        # each read of a field for a whole batch is one 1-D numpy gather (bounds-checked).
        self._page_halves = page_size // 2
        self._halves = data.view("<u2")
        self._words = np.ndarray((len(data) // 2 - 3,), dtype="<i8", buffer=data, strides=(2,))
        self._records = np.ndarray((len(data) - record_size + 1,), dtype=f"V{record_size}", buffer=data, strides=(1,))

    def take(self, rows: np.ndarray[Any, Any]) -> Optional[np.ndarray[Any, Any]]:
        """Records ``rows`` (numbered from ``first_key``) as a table of whole records (one row
        each), gathered from the map; None unless every one is found where the tree's shape
        puts it."""
        found = self.value_offsets(rows)
        if found is None:
            return None
        return self._records[found].view(np.uint8).reshape(len(found), self.record_size)

    def value_offsets(self, rows: np.ndarray[Any, Any]) -> Optional[np.ndarray[Any, Any]]:
        """The file offsets of the values of records ``rows`` (int64, numbered from
        ``first_key``); None unless every one is found where the tree's shape puts it."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows) or rows.min() < 0 or rows.max() >= self.entries:
            return None
        try:
            return self._value_offsets(rows)
        except (IndexError, ValueError, OverflowError):
            return None  # a page or node pointing outside the file

    def _value_offsets(self, rows: np.ndarray[Any, Any]) -> Optional[np.ndarray[Any, Any]]:
        leaves = rows // self.per_leaf
        if len(rows) > 1:
            later = leaves[1:] != leaves[:-1]
            if (leaves[1:] >= leaves[:-1]).all():
                # In key order (a sequential read): the tree is walked, and each leaf checked,
                # once per leaf, not once per record.
                starts = np.flatnonzero(later) + 1  # where each next leaf's records begin
                firsts = np.concatenate(([0], starts))
                runs = np.diff(firsts, append=len(rows))  # records per leaf
                return self._in_order(rows, leaves[firsts], runs)
        node = self._nodes(self._leaf_pages(leaves), rows - leaves * self.per_leaf, rows)
        return None if node is None else self._values(2 * node + (NODE_HEADER + KEY_BYTES))

    def _leaf_pages(self, leaves: np.ndarray[Any, Any]) -> Any:
        """The position (in halves) of each of ``leaves``' page: the tree walked from the root,
        one page per level, by arithmetic (part_tree checked the branch levels)."""
        halves, words, half_page = self._halves, self._words, self._page_halves
        page: Any = np.int64(self.root * half_page)
        for span, fanout in zip(self.spans, self.fanouts):
            slot = leaves // span
            if fanout:
                slot %= fanout
            node = page + (halves[page + PAGE_HEADER // 2 + slot] >> 1)
            page = (words[node] & 0xFFFF_FFFF_FFFF) * half_page  # the child: 48-bit page number
        return page

    def _nodes(
        self, page: Any, slots: np.ndarray[Any, Any], rows: np.ndarray[Any, Any]
    ) -> Optional[np.ndarray[Any, Any]]:
        """Per record, its node (in halves) in slot ``slots`` of its leaf ``page``, each one
        checked: the leaf holds the slot (its lower bound of free space is past the slot's
        pointer), the node holds the record's key and a value of the record size."""
        halves, words = self._halves, self._words
        if (PAGE_HEADER + 2 * slots >= halves[page + 6]).any():
            return None
        node = page + (halves[page + PAGE_HEADER // 2 + slots] >> 1)
        keys = (self.first_key + rows).astype(">i8").view("<i8")
        if ((words[node] != self._leaf_head) | (words[node + NODE_HEADER // 2] != keys)).any():
            return None
        return node

    def _in_order(
        self, rows: np.ndarray[Any, Any], leaves: np.ndarray[Any, Any], runs: np.ndarray[Any, Any]
    ) -> Optional[np.ndarray[Any, Any]]:
        """``value_offsets`` of records in key order, ``runs[i]`` of them on leaf ``leaves[i]``.
        Each leaf is checked once: it holds the last slot read, and its first and last nodes
        the keys its place in the tree gives them. A leaf's keys are distinct and in order, so
        every node between holds the key between (its value size is not checked)."""
        halves, words = self._halves, self._words
        pages = np.broadcast_to(self._leaf_pages(leaves), leaves.shape)
        counts = (halves[pages + 6].astype(np.int64) - PAGE_HEADER) >> 1
        first_row = leaves * self.per_leaf
        if (rows[np.cumsum(runs) - 1] - first_row >= counts).any():
            return None
        first = pages + (halves[pages + PAGE_HEADER // 2] >> 1)
        last = pages + (halves[pages + PAGE_HEADER // 2 + counts - 1] >> 1)
        wanted = (self.first_key + np.stack((first_row, first_row + counts - 1))).astype(">i8").view("<i8")
        if (
            (words[first] != self._leaf_head)
            | (words[last] != self._leaf_head)
            | (words[first + NODE_HEADER // 2] != wanted[0])
            | (words[last + NODE_HEADER // 2] != wanted[1])
        ).any():
            return None
        # Per record: its slot's pointer (a byte offset in its page), then its value's offset.
        pointers = self._halves[np.repeat(pages + PAGE_HEADER // 2 - first_row, runs) + rows]
        return self._values(np.repeat(2 * pages + (NODE_HEADER + KEY_BYTES), runs) + pointers)

    def _values(self, values: np.ndarray[Any, Any]) -> Optional[np.ndarray[Any, Any]]:
        """The offsets of the values whose leaf nodes' data start at ``values``: there, or on
        the overflow pages named there. None if one is not in the file."""
        if self.on_overflow:
            values = self._words[values >> 1] * self.page_size
            # Each value's first page says it is an overflow page, past the meta pages.
            if values.min() < 2 * self.page_size or ((self._halves[(values >> 1) + 5] & P_OVERFLOW) == 0).any():
                return None
            values += PAGE_HEADER
        if values.max() + self.record_size > len(self.data):
            return None
        return values


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


def part_tree(data: np.ndarray[Any, Any], record_size: int, entries: int) -> Optional[PartTree]:
    """The shape of the B-tree of the part mapped as ``data``, whose ``entries`` values of
    ``record_size`` bytes are keyed by consecutive 8-byte big-endian keys; None if the part is
    not laid out that way. Reads the branch pages (about one page in a hundred), not the leaves."""
    try:
        tree = _part_tree(data, record_size, entries)
    except (IndexError, ValueError, OverflowError):
        return None  # a page or node pointing outside the file
    if tree is None or tree.value_offsets(np.array([0, entries // 2, entries - 1])) is None:
        return None
    return tree


def _part_tree(data: np.ndarray[Any, Any], record_size: int, entries: int) -> Optional[PartTree]:
    main = _newest_main_db(data)
    if main is None or len(data) % main[0]:
        return None
    page_size, flags, depth, count, root = main
    if flags != 0 or count != entries or entries == 0 or not 1 <= depth <= MAX_DEPTH:
        return None
    pages = np.array([root], dtype=np.int64)
    fanouts: list[int] = []
    children = 1
    for level in range(depth - 1):  # every branch page, level by level
        counts = _node_counts(data, pages, page_size, P_BRANCH)
        if counts is None or (level and (np.any(counts[:-1] != counts[0]) or counts[-1] > counts[0])):
            return None  # not filled in order: a page of the level (but the last) not full
        fanouts.append(0 if level == 0 else int(counts[0]))
        if level < depth - 2:
            pages = _children(data, pages, counts, page_size)
        else:
            children = int(counts.sum())
            pages = _children(data, pages[:1], counts[:1], page_size)[:1]  # the first leaf
    leaf = int(pages[0]) * page_size
    leaf_count = _node_counts(data, pages[:1], page_size, P_LEAF)
    if leaf_count is None:
        return None
    per_leaf = int(leaf_count[0])
    if depth == 1 and per_leaf != entries:
        return None
    if depth > 1 and children != -(-entries // per_leaf):
        return None  # as many leaves as full leaves take (their own counts are checked on reads)
    node = leaf + _scalar(data, leaf + PAGE_HEADER, 2)
    value_size, node_flags = _scalar(data, node, 4), _scalar(data, node + 4, 2)
    if value_size != record_size or node_flags & ~F_BIGDATA or _scalar(data, node + 6, 2) != KEY_BYTES:
        return None
    first_key = int.from_bytes(data[node + NODE_HEADER : node + NODE_HEADER + KEY_BYTES].tobytes(), "big")
    if first_key + entries >= 1 << 63:
        return None
    return PartTree(
        data,
        page_size=page_size,
        root=root,
        first_key=first_key,
        entries=entries,
        record_size=record_size,
        per_leaf=per_leaf,
        fanouts=fanouts,
        on_overflow=bool(node_flags & F_BIGDATA),
    )


def _node_counts(
    data: np.ndarray[Any, Any], pages: np.ndarray[Any, Any], page_size: int, kind: int
) -> Optional[np.ndarray[Any, Any]]:
    """How many nodes each of ``pages`` (page numbers) holds; None unless each is a page of
    flag ``kind`` in the file, past the meta pages, holding at least one."""
    starts = pages * page_size
    if starts.min() < 2 * page_size or starts.max() + page_size > len(data):
        return None
    if np.any(_u16(data, starts + 10) & _PAGE_KINDS != kind):
        return None
    lower = _u16(data, starts + 12)
    if np.any(lower <= PAGE_HEADER) or np.any(lower > page_size):
        return None
    return (lower - PAGE_HEADER) // 2


def _children(
    data: np.ndarray[Any, Any], pages: np.ndarray[Any, Any], counts: np.ndarray[Any, Any], page_size: int
) -> np.ndarray[Any, Any]:
    """The page numbers of the children of branch ``pages`` (holding ``counts`` nodes), in order."""
    starts = pages * page_size
    page_of_node = np.repeat(starts, counts)
    slot = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    nodes = page_of_node + _u16(data, page_of_node + PAGE_HEADER + 2 * slot)
    return _u16(data, nodes) | (_u16(data, nodes + 2) << 16) | (_u16(data, nodes + 4) << 32)
