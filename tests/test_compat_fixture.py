"""Caches written by yogacache 0.1.0 (kept under tests/fixtures/cache_0_1_0) open and read unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from yogacache.storage import LFSConfigurations, LFSStorage

FIXTURES = Path(__file__).parent / "fixtures" / "cache_0_1_0"


@pytest.fixture()
def storage(tmp_path: Path) -> LFSStorage:
    shutil.copytree(FIXTURES, tmp_path / "fixture")
    return LFSStorage(LFSConfigurations(str(tmp_path)))


def test_fixed_shape_cache_of_0_1_0_reads_unchanged(storage: LFSStorage) -> None:
    ref = storage.fetch("fixture", "fixed")
    assert len(ref) == 50
    records = list(ref.stream())
    assert [int(r["label"]) for r in records] == list(range(50))
    assert all(np.array_equal(r["image"], np.full((4, 4, 3), i, np.uint8)) for i, r in enumerate(records))
    assert [r["name"] for r in records] == [f"rec{i}".encode() for i in range(50)]
    # Shuffled, sharded reads follow YogaDL's order on the old cache too.
    shard = [int(r["label"]) for r in ref.stream(shuffle=True, shuffle_seed=3, shard_rank=1, num_shards=2)]
    expected = np.arange(1, 50, 2)[np.random.RandomState(3).permutation(25)]
    assert shard == expected.tolist()


def test_varying_shape_cache_of_0_1_0_reads_unchanged(storage: LFSStorage) -> None:
    records = list(storage.fetch("fixture", "ragged").stream())
    assert len(records) == 20
    for i, (values, name) in enumerate(records):
        assert np.array_equal(values, np.arange(i % 5 + 1, dtype=np.float32))
        assert name == f"s{i}".encode()
