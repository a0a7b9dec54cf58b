"""Random access (``CacheDataset[i]``, ``__getitems__``, ``CacheReader.read_leaves`` and
``read_columns``) finds each record through the part's B-tree, with no per-process table of
every record: exact records at part boundaries, at both ends, over many parts, in parts keyed
from 0 (parallel builds) and in caches of earlier releases, after fork() and on several threads;
and reading adds no anonymous memory per record (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from yogacache.format.codec import RecordCodec
from yogacache.format.spec import infer_spec
from yogacache.format.writer import CacheWriter
from yogacache.parallel import CallShard, sharded
from yogacache.read.reader import GATHER_RECORDS, CacheReader
from yogacache.store.local import CacheStore
from yogacache.torch import CacheDataset

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "cache_0_1_0"
SMALL_PART = 32 << 10


def ids(start: int, stop: int) -> Iterator[dict[str, Any]]:
    return ({"i": np.int64(i)} for i in range(start, stop))


def ids_reader(tmp_path: Path, count: int, part_size: int = SMALL_PART) -> CacheReader:
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=part_size)
    store.build("ids", "v1", ids(0, count))
    return store.open("ids", "v1")


def boundaries(reader: CacheReader) -> list[int]:
    """Every part's first and last record and their neighbours, and both ends of the cache."""
    found = {0, len(reader) - 1}
    for part in reader.manifest.parts:
        first, last = part.first_record, part.first_record + part.num_records - 1
        found.update({first - 1, first, first + 1, last - 1, last, last + 1})
    return sorted(i for i in found if 0 <= i < len(reader))


def gathered_from_every_part(reader: CacheReader) -> bool:
    """Whether every part of ``reader`` has been read through its map (its tree was found)."""
    return all(entry._tree is not None for entry in reader._held)


def test_every_part_boundary_and_both_ends_read_exactly(tmp_path: Path) -> None:
    reader = ids_reader(tmp_path, 20_000)
    assert len(reader.manifest.parts) >= 10
    ds = CacheDataset(reader, output="numpy")
    edges = boundaries(reader)
    assert [int(ds[i]["i"]) for i in edges] == edges  # one record at a time: LMDB's B-tree
    assert int(ds[-1]["i"]) == 19_999 and int(ds[-20_000]["i"]) == 0
    for outside in (20_000, -20_001):
        with pytest.raises(IndexError, match="out of range"):
            ds[outside]
    assert len(edges) >= GATHER_RECORDS  # a batch: gathered from the parts' maps
    assert [int(e["i"]) for e in ds.__getitems__(edges[::-1])] == edges[::-1]
    assert gathered_from_every_part(reader)
    np.testing.assert_array_equal(reader.read_columns(np.array(edges))[0], edges)
    order = np.random.default_rng(0).permutation(20_000)
    read = np.concatenate([reader.read_columns(order[at : at + 256])[0] for at in range(0, 20_000, 256)])
    np.testing.assert_array_equal(read, order)
    np.testing.assert_array_equal(reader.read_columns(np.arange(20_000))[0], np.arange(20_000))  # in order
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, 20_000])
    element = CacheDataset(reader)[12_345]["i"]
    assert isinstance(element, torch.Tensor) and element.dtype == torch.int64 and element.shape == ()
    assert int(element) == 12_345


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types, dtypes, shapes and writability, nested alike."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.flags.writeable == b.flags.writeable
            and np.array_equal(a, b)
        )
    return type(a) is type(b) and bool(a == b)


@pytest.mark.parametrize(
    "make",
    [
        lambda i: {"image": np.full((4, 4, 3), i % 251, np.uint8), "label": np.int64(i), "w": np.float32(i / 2)},
        lambda i: (np.arange(i % 5 + 1, dtype=np.float32), f"s{i}".encode()),  # ragged
        lambda i: {"label": np.int64(i), "name": f"n{i:04d}".encode()},  # fixed shapes with a string
    ],
    ids=["fixed-layout", "ragged", "fixed-with-string"],
)
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_a_record_read_alone_is_the_record_a_batch_of_one_gives(tmp_path: Path, make: Any, output: str) -> None:
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=SMALL_PART)
    store.build("ds", "v1", [make(i) for i in range(600)])
    ds = CacheDataset(store.open("ds", "v1"), output=output)
    for i in (0, 1, 299, 599, -1):
        assert same(ds[i], ds.__getitems__([i])[0]), i
    reader = store.open("ds", "v1")
    for i in (0, 599):
        assert same(reader[i], CacheReader.__getitem__(reader, i))
        leaves = reader.read_leaves(i)
        assert len(leaves) == len(reader.codec.leaves)


def test_parts_keyed_from_zero_read_exactly(tmp_path: Path) -> None:
    """A parallel build's parts key their records from 0 in each build shard (format 2)."""
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=16 << 10)
    shards = [CallShard(ids, (start, start + 1500)) for start in range(0, 6000, 1500)]
    manifest = store.build("ids", "v1", sharded(shards, 1))
    assert any(part.key_shift for part in manifest.parts)
    reader = store.open("ids", "v1")
    ds = CacheDataset(reader, output="numpy")
    edges = boundaries(reader)
    assert [int(ds[i]["i"]) for i in edges] == edges
    assert [int(e["i"]) for e in ds.__getitems__(edges)] == edges
    assert gathered_from_every_part(reader)
    order = np.random.default_rng(1).permutation(6000)
    np.testing.assert_array_equal(reader.read_columns(order)[0], order)


@pytest.mark.parametrize("name", ["fixed", "ragged"])
def test_caches_of_0_1_0_read_at_random(tmp_path: Path, name: str) -> None:
    ds = CacheDataset(CacheReader(FIXTURES / name), output="numpy")
    order = np.random.default_rng(2).permutation(len(ds)).tolist()
    singles = [ds[i] for i in order]
    batch = ds.__getitems__(order)
    for i, single, batched in zip(order, singles, batch):
        if name == "fixed":
            expected = {"image": np.full((4, 4, 3), i, np.uint8), "label": np.int64(i), "name": f"rec{i}".encode()}
            for record in (single, batched):
                assert record.keys() == expected.keys()
                assert np.array_equal(record["image"], expected["image"]) and int(record["label"]) == i
                assert record["name"] == expected["name"]
        else:
            for values, label in (single, batched):
                assert np.array_equal(values, np.arange(i % 5 + 1, dtype=np.float32)) and label == f"s{i}".encode()


def test_a_forked_child_reads_through_its_own_environment_and_transaction(tmp_path: Path) -> None:
    reader = ids_reader(tmp_path, 5000)
    ds = CacheDataset(reader, output="numpy")
    assert int(ds[4999]["i"]) == 4999 and len(ds.__getitems__(list(range(64)))) == 64
    parent_entries = list(reader._held)
    parent_txn = parent_entries[-1].reading()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same records, through environments and transactions of its own
        try:
            os.close(read)
            order = np.random.default_rng(3).permutation(5000)
            ok = [int(ds[i]["i"]) for i in order[:500].tolist()] == order[:500].tolist()
            ok = ok and [int(e["i"]) for e in ds.__getitems__(order.tolist())] == order.tolist()
            ok = ok and all(entry.pid == os.getpid() for entry in reader._held)
            ok = ok and not any(mine is theirs for mine, theirs in zip(reader._held, parent_entries))
            ok = ok and reader._held[-1].reading() is not parent_txn
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(read)
    assert int(ds[17]["i"]) == 17 and reader._held[-1].reading() is parent_txn  # the parent's, untouched


def test_a_forked_dataloader_reads_a_shuffled_epoch_exactly(tmp_path: Path) -> None:
    reader = ids_reader(tmp_path, 5000)
    ds = CacheDataset(reader)
    assert int(ds[0]["i"]) == 0  # the parent reads first: its transactions exist at fork()
    sampler = RandomSampler(range(5000), generator=torch.Generator().manual_seed(4))
    expected = list(iter(RandomSampler(range(5000), generator=torch.Generator().manual_seed(4))))
    loader = DataLoader(ds, batch_size=100, sampler=sampler, num_workers=2, multiprocessing_context="fork")
    read = torch.cat([batch["i"] for batch in loader]).tolist()
    assert read == expected


def test_threads_read_through_transactions_of_their_own(tmp_path: Path) -> None:
    reader = ids_reader(tmp_path, 8000)
    ds = CacheDataset(reader, output="numpy")
    transactions: list[int] = []
    failures: list[BaseException] = []

    def read(seed: int) -> None:
        try:
            order = np.random.default_rng(seed).permutation(8000)
            for start in range(0, 8000, 400):
                chunk = order[start : start + 400].tolist()
                assert [int(ds[i]["i"]) for i in chunk[:40]] == chunk[:40]
                assert [int(e["i"]) for e in ds.__getitems__(chunk)] == chunk
            transactions.append(id(reader._held[0].reading()))
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len(set(transactions)) == 4


RANDOM_READS = """
    import json, sys
    import numpy as np
    from yogacache.torch import CacheDataset

    def rss_anon():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

    ds = CacheDataset(sys.argv[1], output="numpy")
    reader, n = ds.reader, len(ds)
    rng = np.random.default_rng(0)
    singles = rng.integers(0, n, 20_000).tolist()
    batches = [rng.integers(0, n, 256).tolist() for _ in range(400)]
    ds[0], ds.__getitems__(batches[0]), reader.read_columns(np.arange(8192))  # warm: every path once
    before = rss_anon()
    assert [int(ds[i]["i"]) for i in singles] == singles
    for batch in batches:
        assert [int(e["i"]) for e in ds.__getitems__(batch)] == batch
    for start in range(0, n, 8192):  # every record, so every page of every part
        assert int(reader.read_columns(np.arange(start, min(n, start + 8192)))[0][-1]) == min(n, start + 8192) - 1
    print(json.dumps({"growth": rss_anon() - before, "trees": [e._tree is not None for e in reader._held]}))
"""


def test_random_access_adds_no_memory_per_record(tmp_path: Path) -> None:
    """Reading 2·10^6 records at random, in batches and through every page adds well under a
    byte per record of anonymous memory to a fresh process (a table of 8-byte offsets was 16 MB)."""
    count = 2_000_000
    spec = infer_spec({"i": np.int64(0)})
    codec = RecordCodec(spec)
    target = tmp_path / "ids" / "v1"
    with CacheWriter(target, "ids", "v1") as writer:
        for start in range(0, count, 1 << 16):
            writer.add_encoded(codec.encode_columns([np.arange(start, min(count, start + (1 << 16)), dtype=np.int64)]))
        writer.seal(spec)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(RANDOM_READS), str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(found["trees"])  # the batches were gathered from the maps, not read through LMDB
    assert found["growth"] < 2 << 20, found  # 2 MiB: about a byte per record
