"""The read pipeline: read sizes, the worker split and Stream, shared by every adapter."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yogacache.dataref
from yogacache.format.manifest import Manifest
from yogacache.read import pipeline
from yogacache.read.pipeline import ReadSizes, Stream, plan_reads
from yogacache.read.shuffle import ArrayPlan, GlobalPlan


@dataclass
class FakeManifest:
    num_records: int
    num_bytes: int

    average_record_bytes = Manifest.average_record_bytes  # the real rule, on these two counts


def test_stream_is_re_exported_by_dataref() -> None:
    assert yogacache.dataref.Stream is Stream
    assert yogacache.Stream is Stream


@pytest.mark.parametrize(
    ("records", "record_bytes", "first", "full"),
    [
        (10_000, 100, 1024, 1024),  # small records: 1 MiB is past the full read
        (10_000, 4096, 256, 1024),  # a first read of 1 MiB, full reads of 1024 records
        (10_000, 40_000, 32, 209),  # large records: 32 first, full reads capped at 8 MiB
        (100, 1 << 24, 1, 1),  # huge records: one per read
        (0, 0, 1024, 1024),  # an empty cache
    ],
)
def test_read_sizes_policy(records: int, record_bytes: int, first: int, full: int) -> None:
    sizes = ReadSizes.for_manifest(FakeManifest(records, records * record_bytes))  # type: ignore[arg-type]
    assert (sizes.first, sizes.full) == (first, full)
    head = list(itertools.islice(sizes, 8))
    assert head[0] == first and head[-1] == full
    assert all(b == min(full, 2 * a) for a, b in itertools.pairwise(head))


@given(records=st.integers(0, 5000), first=st.integers(1, 64), full_factor=st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_count_is_the_number_of_reads(records: int, first: int, full_factor: int) -> None:
    sizes = ReadSizes(full=first * full_factor, first=first)
    plan = ArrayPlan(0, np.arange(records))
    reads = list(plan_reads(plan, sizes))
    assert sizes.count(records) == len(reads)
    assert np.concatenate([np.arange(0), *reads]).tolist() == list(range(records))


def reference_worker_reads(
    total: int, block: int, worker: int, workers: int, per_read: int, drop: bool
) -> list[list[int]]:
    """The torch adapter's former worker split, one constant read size: the reference."""
    blocks = range(worker, -(-total // block), workers)
    out = []
    for first in range(0, len(blocks), per_read):
        bounds = [(b * block, min((b + 1) * block, total)) for b in blocks[first : first + per_read]]
        if drop:
            bounds = [(lo, hi) for lo, hi in bounds if hi - lo == block]
        if bounds:
            out.append([p for lo, hi in bounds for p in range(lo, hi)])
    return out


@given(
    total=st.integers(0, 300),
    block=st.integers(1, 20),
    workers=st.integers(1, 5),
    per_read_records=st.integers(1, 64),
    drop=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_worker_split_matches_the_reference_and_the_loader_order(
    total: int, block: int, workers: int, per_read_records: int, drop: bool
) -> None:
    plan = GlobalPlan(0, 0, 1, total, None)  # identity: indices are positions
    sizes = ReadSizes(full=per_read_records, first=per_read_records)
    per_worker = []
    for worker in range(workers):
        reads = [
            r.tolist()
            for r in plan_reads(plan, sizes, block_size=block, worker=worker, workers=workers, drop_partial=drop)
        ]
        per_read = max(1, per_read_records // block)
        assert reads == reference_worker_reads(total, block, worker, workers, per_read, drop)
        per_worker.append([p for read in reads for p in read])
    # A DataLoader takes one block from each worker in turn: the plan comes back in order.
    blocks = [[w[i : i + block] for i in range(0, len(w), block)] for w in per_worker]
    merged = [p for round_ in itertools.zip_longest(*blocks, fillvalue=[]) for blk in round_ for p in blk]
    end = total - total % block if drop else total
    assert merged == list(range(end))


def test_reads_grow_from_the_first_size(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = ReadSizes(full=64, first=8)
    reads = [len(r) for r in plan_reads(ArrayPlan(0, np.arange(200)), sizes)]
    assert reads == [8, 16, 32, 64, 64, 16]
    two_workers = [len(r) for r in plan_reads(ArrayPlan(0, np.arange(200)), sizes, block_size=4, workers=2)]
    assert two_workers == [8, 16, 32, 44]  # whole blocks of 4, every other one
    assert pipeline.FIRST_READ_RECORDS == 32 and pipeline.FULL_READ_RECORDS == 1024
