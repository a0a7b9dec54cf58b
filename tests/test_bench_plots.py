"""The benchmarks' ``--plot`` draws its figure from a result shaped as the benchmark makes it.

The plots on the docs site (docs/img/*.png) are made by the benchmarks, not by hand; a change to
a benchmark's results that its plot no longer reads fails here, not in the next long run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
pytest.importorskip("matplotlib")

import bench_scale  # noqa: E402
import bench_stream  # noqa: E402
import bench_torch  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def drawn(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000


def test_records_per_second_against_workers(tmp_path: Path) -> None:
    rows = [
        {"reader": reader, "workers": workers, "records_per_s": rate * (workers + 1)}
        for reader, rate in (("yogacache shard shuffle, batched", 1000.0), ("LitData", 400.0))
        for workers in (0, 1, 2, 4)
    ]
    rows.append({"reader": "MosaicML Streaming (MDS)", "workers": 2, "error": "not installed"})
    results = {"machine": "test", "workloads": {"small": {"rows": rows}}}
    out = tmp_path / "workers.png"
    bench_torch.plot_workers(results, str(out))
    assert drawn(out)


def test_first_batch_against_link_rate(tmp_path: Path) -> None:
    tables = {
        rate: {"yogacache parts": {"first_batch": 0.5 + 64e6 / rate},
               "MosaicML Streaming (tuned)": {"first_batch": 9.0}}
        for rate in (50 * 10**6, 200 * 10**6)
    }
    out = tmp_path / "first-batch.png"
    bench_stream.plot_first_batch(tables, 64 << 20, str(out))
    assert drawn(out)


def test_memory_against_records(tmp_path: Path) -> None:
    results = {
        "rows": {"open": {"100000": {"growth": 2e6}, "1000000": {"growth": 2.1e6}}},
        "peers": {"LitData": {"100000": {"growth": 3e6}, "1000000": {"error": "over 4 GiB"}}},
        "specs": {},
    }
    out = tmp_path / "memory.png"
    bench_scale.plot_memory(results, str(out))
    assert drawn(out)
