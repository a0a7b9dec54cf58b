"""One record lookup for every read path: eager LMDB reads, gathered reads and lazily opened
(streamed) parts find record i at the same part and key, also in caches made of build shards,
whose parts key their records from 0 (parallel builds, imports, Ray)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from yogacache.parallel import sharded
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore

SMALL_PART = 32 << 10  # several parts per build shard (LMDB's own pages within the bound)


def element(i: int) -> dict[str, Any]:
    return {"id": np.int64(i), "x": np.full(16, i, np.int32), "text": b"t" * (i % 13)}


DATA = [element(i) for i in range(1200)]


def records(start: int, stop: int) -> list[dict[str, Any]]:
    return DATA[start:stop]


class LocalParts:
    """A part provider handing out the parts of a local cache directory, counting acquires: the
    lazy path of ``CacheReader`` as a streamed cache uses it, without a network."""

    keep_open = 2

    def __init__(self, directory: Path, names: Sequence[str]) -> None:
        self.directory = directory
        self.names = list(names)
        self.acquired: list[int] = []
        self.held: set[int] = set()

    def acquire(self, index: int) -> Path:
        self.acquired.append(index)
        self.held.add(index)
        return self.directory / self.names[index]

    def release(self, index: int) -> None:
        self.held.discard(index)

    def expect(self, order: Sequence[int]) -> None:
        pass


@pytest.fixture(scope="module")
def shard_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lookup")
    store = CacheStore(root, show_progress=False, part_size_bytes=SMALL_PART)
    # Shards given as functions: their lengths are unknown until written, so each keys from 0.
    shards = [functools.partial(records, start, start + 300) for start in range(0, len(DATA), 300)]
    store.build("ds", "v1", sharded(shards, 1))
    return root / "ds" / "v1"


def test_the_cache_under_test_has_parts_keyed_from_zero(shard_built: Path) -> None:
    reader = CacheReader(shard_built)
    try:
        assert len(reader.manifest.parts) > 4
        assert any(part.key_shift for part in reader.manifest.parts)
    finally:
        reader.close()


@pytest.mark.parametrize("read", ["elements", "columns", "getitem"])
def test_lazily_opened_parts_of_build_shards_return_the_records_asked_for(shard_built: Path, read: str) -> None:
    eager = CacheReader(shard_built)
    provider = LocalParts(shard_built, [p.name for p in eager.manifest.parts])
    lazy = CacheReader(shard_built, eager.manifest, part_provider=provider)
    try:
        order = np.random.default_rng(3).permutation(len(DATA))
        for start in range(0, len(order), 97):
            indices = order[start : start + 97]
            for reader in (eager, lazy):
                if read == "elements":
                    got = [int(e["id"]) for e in reader.read_elements(indices)]
                    texts = [e["text"] for e in reader.read_elements(indices)]
                    assert texts == [DATA[i]["text"] for i in indices.tolist()]
                elif read == "columns":
                    columns = reader.read_columns(indices)
                    got = [int(v) for v in columns[0]]
                else:
                    got = [int(reader[int(i)]["id"]) for i in indices[:5]]
                    indices = indices[:5]
                assert got == indices.tolist(), f"{'lazy' if reader is lazy else 'eager'} read of {read}"
        # Record 210 lies in a part of the second build shard: the report read record 414 there.
        assert int(lazy[210]["id"]) == 210
        assert provider.acquired, "the lazy reader read through its provider"
    finally:
        lazy.close()
        eager.close()


def test_a_lazy_read_acquires_parts_in_the_order_the_request_touches_them(shard_built: Path) -> None:
    manifest = CacheReader(shard_built, verify="size").manifest
    provider = LocalParts(shard_built, [p.name for p in manifest.parts])
    lazy = CacheReader(shard_built, manifest, part_provider=provider)
    try:
        last, first = manifest.parts[-1], manifest.parts[0]
        indices = [last.first_record, first.first_record, last.first_record + 1]
        assert [int(e["id"]) for e in lazy.read_elements(indices)] == indices
        assert provider.acquired[:2] == [len(manifest.parts) - 1, 0]
    finally:
        lazy.close()
