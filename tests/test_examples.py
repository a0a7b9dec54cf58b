"""The examples run as users run them, and say what happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from yogacache.store.local import CacheStore

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(*args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_quickstart_builds_then_hits_and_trains(tmp_path: Path) -> None:
    storage = tmp_path / "caches"
    first = run_example(str(EXAMPLES / "quickstart.py"), "--storage", str(storage), "--records", "2000")
    assert "first call:  built the cache" in first
    assert "second call: cache hit" in first
    assert "(builds so far: 1)" in first
    assert "read shard 0 of 2, shuffled: 1,000 records" in first
    assert "trained a tiny Keras model for 5 epochs" in first
    accuracy = float(first.split("final accuracy ")[1].split()[0])
    assert accuracy >= 0.9, first  # the synthetic data is learnable, and learned

    second = run_example(str(EXAMPLES / "quickstart.py"), "--storage", str(storage), "--records", "2000")
    assert "cache hit (built by an earlier run)" in second
    assert "(builds so far: 0)" in second

    manifest = CacheStore(storage).manifest("quickstart-images", "n2000_train")
    assert manifest.num_records == 2000


def test_quickstart_uses_the_local_default_without_arguments(private_default_root: Path) -> None:
    out = run_example(str(EXAMPLES / "quickstart.py"), "--records", "1000")
    assert f"cache root: {private_default_root}" in out
    assert CacheStore(private_default_root).exists("quickstart-images", "n1000_train")


def test_yogadl_walkthrough_prints_yogadl_order(tmp_path: Path) -> None:
    out = run_example(str(EXAMPLES / "yogadl_walkthrough.py"), str(tmp_path))
    squares = [x * x for x in range(12)]
    # start_offset=4, shuffle_seed=777: epoch 0 from position 4, then epoch 1 reshuffled with seed 778.
    epoch0 = [squares[i] for i in np.random.RandomState(777).permutation(12)][4:]
    epoch1 = [squares[i] for i in np.random.RandomState(778).permutation(12)]
    expected = epoch0 + epoch1
    printed = [
        int(value)
        for line in out.splitlines()
        if line.startswith("squares:")
        for value in line.split(":", 1)[1].strip(" []").split(",")
    ]
    assert printed == expected
    assert out.count("cache not found, making evens v2") == 1
    assert "evens, shard 0 of 2 (5 records): [0, 4, 8, 12, 16]" in out
    assert "evens, shard 1 of 2 (5 records): [2, 6, 10, 14, 18]" in out


def test_jax_grain_example_trains_from_the_cache_and_resumes_its_loader(tmp_path: Path) -> None:
    out = run_example(str(EXAMPLES / "jax_grain_train.py"), "--storage", str(tmp_path), "--steps", "100")
    assert f"cache: built (2048 records in {tmp_path})" in out
    losses = out.split("trained a flax MLP for 100 steps on cpu: loss ")[1].split()
    first, last = float(losses[0]), float(losses[2])
    assert last < first / 3, out  # the linear rule is learnable, and learned
    assert CacheStore(tmp_path).manifest("jax-example", "v1").num_records == 2048
