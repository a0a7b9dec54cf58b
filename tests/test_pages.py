"""Records found in a part's LMDB pages by the shape of its B-tree (``yogacache.format.pages``)
and the reads that gather whole records from a part's map with it: the same bytes as LMDB's own
``get`` for every record, and no tree (LMDB reads instead) for any file that is not laid out as
expected."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest

from yogacache.format.pages import map_file, part_tree
from yogacache.store.local import CacheStore


def mapped(path: Path) -> np.ndarray:
    fd = os.open(path, os.O_RDONLY)
    try:
        data = map_file(fd, random_access=True)
    finally:
        os.close(fd)
    assert data is not None and not data.flags.writeable
    return data


def write_lmdb(path: Path, first_key: int, values: list[bytes]) -> None:
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    for start in range(0, len(values), 1000):  # several transactions: stale pages in the file
        with env.begin(write=True) as txn:
            for i, value in enumerate(values[start : start + 1000], start):
                txn.put((first_key + i).to_bytes(8, "big"), value, append=True)
    env.close()


def lmdb_values(path: Path) -> dict[int, bytes]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        found = {int.from_bytes(key, "big"): bytes(value) for key, value in txn.cursor()}
    env.close()
    return found


def write_unordered(path: Path, values: list[bytes]) -> None:
    """Records put in a shuffled key order: LMDB splits full pages in the middle."""
    env = lmdb.open(str(path), subdir=False, map_size=1 << 30)
    with env.begin(write=True) as txn:
        for i in np.random.default_rng(0).permutation(len(values)).tolist():
            txn.put(i.to_bytes(8, "big"), values[i])
    env.close()


@pytest.mark.parametrize(
    ("count", "size", "first_key", "depth"),
    [
        (50, 40, 0, 1),  # inline values, one leaf page
        (30_000, 60, 0, 3),  # inline values, a tree of depth 3
        (3_000, 3105, 0, 2),  # values on overflow pages (the 32x32x3 images)
        (2_000, 9000, 5_000, 2),  # values spanning several overflow pages, keys from 5000
    ],
)
def test_the_tree_gives_the_bytes_lmdb_gives_for_every_record(
    tmp_path: Path, count: int, size: int, first_key: int, depth: int
) -> None:
    rng = np.random.default_rng(count)
    values = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
    path = tmp_path / "part.mdb"
    write_lmdb(path, first_key, values)
    data = mapped(path)
    tree = part_tree(data, size, count)
    assert tree is not None
    assert tree.first_key == first_key and tree.entries == count and len(tree.fanouts) == depth - 1
    expected = lmdb_values(path)
    want = [expected[first_key + i] for i in range(count)]
    rows = tree.take(np.arange(count))  # in order: the branch levels walked once per leaf
    assert rows is not None and [row.tobytes() for row in rows] == want
    shuffled = rng.permutation(count)
    rows = tree.take(shuffled)
    assert rows is not None and [row.tobytes() for row in rows] == [want[i] for i in shuffled]
    assert tree.take(np.array([count])) is None and tree.take(np.array([-1])) is None


def test_a_part_that_does_not_match_the_expectation_gives_no_tree(tmp_path: Path) -> None:
    path = tmp_path / "part.mdb"
    write_lmdb(path, 0, [bytes([i % 256]) * 100 for i in range(500)])
    data = mapped(path)
    assert part_tree(data, 100, 500) is not None
    assert part_tree(data, 99, 500) is None  # another value size
    assert part_tree(data, 100, 501) is None  # another record count
    assert part_tree(data[: len(data) // 2], 100, 500) is None  # truncated
    other = tmp_path / "gaps.mdb"
    env = lmdb.open(str(other), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        for key in (0, 1, 3):  # a key missing
            txn.put(key.to_bytes(8, "big"), b"x" * 100)
    env.close()
    assert part_tree(mapped(other), 100, 3) is None
    wide = tmp_path / "wide.mdb"
    env = lmdb.open(str(wide), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"0123456789", b"x" * 100)  # not an 8-byte key
    env.close()
    assert part_tree(mapped(wide), 100, 1) is None
    unordered = tmp_path / "unordered.mdb"
    write_unordered(unordered, [bytes([i % 256]) * 60 for i in range(30_000)])
    assert part_tree(mapped(unordered), 60, 30_000) is None  # pages split in the middle


def test_damaged_pages_give_no_tree_or_reads_inside_the_file_never_an_error(tmp_path: Path) -> None:
    """Bytes flipped anywhere in the B-tree's pages: finding the tree and reading through it
    never raise and never point outside the file (a part is verified before it is read; this
    is about never crashing)."""
    path = tmp_path / "part.mdb"
    write_lmdb(path, 0, [bytes([i % 256]) * 3105 for i in range(300)])
    original = np.array(mapped(path))
    rng = np.random.default_rng(0)
    page = 4096
    tree_pages = [0, 1] + [p for p in range(2, len(original) // page) if original[p * page + 10] & 0x03]
    outcomes = set()
    for _ in range(400):
        damaged = original.copy()
        where = int(rng.choice(tree_pages)) * page + int(rng.integers(0, 64 if rng.random() < 0.7 else page))
        damaged[where] ^= np.uint8(1 << int(rng.integers(0, 8)))
        tree = part_tree(damaged, 3105, 300)
        outcomes.add(tree is None)
        if tree is not None:
            found = tree.value_offsets(np.arange(300))
            assert found is None or (found.min() >= 0 and found.max() + 3105 <= len(damaged))
            for row in rng.integers(0, 300, 20).tolist():
                found = tree.value_offsets(np.array([row]))
                assert found is None or 0 <= found[0] <= len(damaged) - 3105
    assert outcomes == {True, False}  # some flips break the layout, some touch unused bytes


def records(count: int) -> list[dict[str, Any]]:
    return [
        {"image": np.full((8, 8, 3), i % 251, np.uint8), "label": np.int64(i), "w": np.float32(i / 2)}
        for i in range(count)
    ]


@pytest.mark.parametrize("part_size", [1 << 30, 64 << 10])  # one part; many parts
def test_gathered_reads_equal_lmdb_reads(tmp_path: Path, part_size: int) -> None:
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=part_size)
    store.build("ds", "v1", records(5000))
    reader = store.open("ds", "v1")
    layout = reader.codec.layout
    assert layout is not None and layout.by_table
    indices = np.random.default_rng(1).permutation(5000)[:3000]
    table = reader._gather(indices, layout)
    assert table is not None  # every part's tree was found
    through_lmdb = reader._read(indices, reader.codec.decode_columns)
    gathered = reader.read_columns(indices)
    for got, want in zip(gathered, through_lmdb):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(gathered[1], indices)
    with pytest.raises(IndexError, match="out of range"):
        reader.read_columns([5000])
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.read_columns([0])


def test_a_forked_child_gathers_from_its_own_environment(tmp_path: Path) -> None:
    store = CacheStore(tmp_path, show_progress=False)
    store.build("ds", "v1", records(2000))
    reader = store.open("ds", "v1")
    layout = reader.codec.layout
    assert layout is not None
    assert reader._gather(np.arange(64), layout) is not None
    parent = reader._held[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: same values, through the map and tree it finds for itself
        try:
            os.close(read)
            table = reader._gather(np.arange(1999, -1, -1), layout)
            ok = table is not None and list(layout.decode_table(table)[1]) == list(range(1999, -1, -1))
            ok = ok and reader._held[0] is not parent and reader._held[0].pid == os.getpid()
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(read)
    reader.close()
