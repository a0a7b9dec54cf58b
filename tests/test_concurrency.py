"""Many processes, one node: exactly one builds a cache, the others wait and read the same data.

The workers are real processes (``sys.executable`` running a small script) that call the same
decorator at once on an empty cache. The build function appends a line to a marker file, so
the number of lines is the number of builds. One test SIGKILLs the builder mid-build and checks
that a waiting process takes over, cleans the leftover and publishes a complete cache.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
DEADLINE = 120.0

# A worker: waits for the start signal, calls the decorated function, dumps what it read.
PYTHON_WORKER = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    import numpy as np
    from yogacache.storage import LFSConfigurations, LFSStorage

    root, marker, out, ready, go, n, delay, progress = sys.argv[1:9]
    n, delay = int(n), float(delay)
    storage = LFSStorage(LFSConfigurations(root))

    @storage.cacheable("shared", "v1")
    def make():
        with open(marker, "a") as handle:
            handle.write(f"{os.getpid()}\\n")

        def records():
            for i in range(n):
                if delay:
                    time.sleep(delay)
                    with open(progress, "a") as handle:
                        handle.write(".")
                yield {"i": np.int64(i), "x": np.arange(8, dtype=np.int32) * i, "s": b"r%d" % i}

        return records()

    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    ref = make()
    got = [(int(e["i"]), e["x"].tolist(), e["s"].decode()) for e in ref.stream()]
    with open(out, "w") as handle:
        json.dump({"pid": os.getpid(), "records": got, "build_id": ref.manifest.build_id}, handle)
    """
)

TF_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import yogacache

    root, marker, out, ready, go, rank, shards = sys.argv[1:8]
    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": root}, rank=int(rank), num_shards=int(shards), seed=3
    )

    @layer.cache_train_dataset("tfshared", "v1", shuffle=True)
    def make():
        with open(marker, "a") as handle:
            handle.write(f"{os.getpid()}\\n")
        ds = tf.data.Dataset.range(100)
        return ds.map(lambda i: {"i": i, "sq": i * i, "name": tf.strings.as_string(i)})

    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    ds = make()
    got = [(int(e["i"]), int(e["sq"]), e["name"].decode()) for e in ds.as_numpy_iterator()]
    with open(out, "w") as handle:
        json.dump({"pid": os.getpid(), "records": got}, handle)
    """
)


def _expected(n: int) -> list[list[Any]]:
    return [[i, (np.arange(8) * i).tolist(), f"r{i}"] for i in range(n)]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _wait_for(
    condition: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]], timeout: float = DEADLINE
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        for proc in procs:
            if proc.poll() is not None and proc.returncode != 0:
                raise AssertionError(f"a worker died while waiting for {what}: {_stderr(proc)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    if proc.stderr is None or proc.poll() is None:
        return ""
    return proc.stderr.read().decode(errors="replace")[-3000:]


def _finish(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


class Workers:
    """Starts worker processes of one script and hands out their files."""

    def __init__(self, tmp_path: Path, script: str) -> None:
        self.dir = tmp_path / "workers"
        self.dir.mkdir(exist_ok=True)
        self.script = self.dir / "worker.py"
        self.script.write_text(script)
        self.go = self.dir / "go"
        self.marker = self.dir / "marker"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outs: list[Path] = []
        self.readies: list[Path] = []

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        out, ready = self.dir / f"out-{index}.json", self.dir / f"ready-{index}"
        proc = subprocess.Popen(
            [
                sys.executable,
                str(self.script),
                args[0],
                str(self.marker),
                str(out),
                str(ready),
                str(self.go),
                *args[1:],
            ],
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.procs.append(proc)
        self.outs.append(out)
        self.readies.append(ready)
        return proc

    def wait_ready(self, indices: list[int]) -> None:
        _wait_for(lambda: all(self.readies[i].exists() for i in indices), "workers to start", self.procs)

    def release(self) -> None:
        self.go.touch()

    def wait(self, indices: list[int], timeout: float = DEADLINE) -> list[dict[str, Any]]:
        results = []
        for i in indices:
            proc = self.procs[i]
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"worker {i} did not finish in {timeout} s") from None
            assert code == 0, f"worker {i} failed with {code}: {_stderr(proc)}"
            results.append(json.loads(self.outs[i].read_text()))
        return results

    def builds(self) -> list[str]:
        return self.marker.read_text().split() if self.marker.exists() else []

    def close(self) -> None:
        _finish(self.procs)


def _leftovers(root: Path, dataset_id: str, version: str) -> list[str]:
    parent = root / dataset_id
    if not parent.is_dir():
        return []
    return sorted(
        p.name for p in parent.iterdir() if p.name.startswith(f".{version}.") and not p.name.endswith(".lock")
    )


def test_eight_processes_build_once_and_read_identical_data(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    n = 3000
    workers = Workers(tmp_path, PYTHON_WORKER)
    try:
        for _ in range(8):
            # A small per-record delay keeps the build going while the others arrive.
            workers.start(str(root), str(n), "0", str(workers.dir / "progress"))
        workers.wait_ready(list(range(8)))
        workers.release()
        results = workers.wait(list(range(8)))
    finally:
        workers.close()

    builders = workers.builds()
    assert len(builders) == 1, f"expected exactly one build, got {len(builders)}: {builders}"
    expected = _expected(n)
    for result in results:
        assert result["records"] == expected
    assert len({r["build_id"] for r in results}) == 1, "workers read different builds"
    assert len({r["pid"] for r in results}) == 8
    assert int(builders[0]) in {r["pid"] for r in results}
    store = CacheStore(root)
    manifest = store.verify_cache("shared", "v1")
    assert manifest.num_records == n
    assert manifest.build_id == results[0]["build_id"]
    assert _leftovers(root, "shared", "v1") == []


def test_eight_processes_wait_for_a_slow_builder(tmp_path: Path) -> None:
    """All eight start together while the build takes a while: the others block, then read."""
    root = tmp_path / "storage"
    root.mkdir()
    n = 60
    workers = Workers(tmp_path, PYTHON_WORKER)
    progress = workers.dir / "progress"
    try:
        for _ in range(8):
            workers.start(str(root), str(n), "0.01", str(progress))
        workers.wait_ready(list(range(8)))
        workers.release()
        # While the build is under way, nothing is published.
        _wait_for(lambda: progress.exists() and progress.stat().st_size >= 5, "the build to start", workers.procs)
        assert not (root / "shared" / "v1" / "manifest.json").exists()
        assert all(p.poll() is None for p in workers.procs), "a worker finished before the cache existed"
        results = workers.wait(list(range(8)))
    finally:
        workers.close()
    assert len(workers.builds()) == 1
    assert progress.stat().st_size == n, "the dataset was iterated more than once"
    for result in results:
        assert result["records"] == _expected(n)


def test_builder_killed_mid_build_a_waiter_takes_over(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    n = 400
    workers = Workers(tmp_path, PYTHON_WORKER)
    slow_progress = workers.dir / "progress-slow"
    fast_progress = workers.dir / "progress-fast"
    try:
        # The builder is slow: 20 ms per record, so it is killed long before it could finish.
        builder = workers.start(str(root), str(n), "0.02", str(slow_progress))
        workers.wait_ready([0])
        workers.release()
        parent = root / "shared"

        def temp_dirs() -> list[Path]:
            return sorted(parent.glob(".v1.tmp-*")) if parent.is_dir() else []

        _wait_for(
            lambda: bool(temp_dirs()) and slow_progress.exists() and slow_progress.stat().st_size >= 10,
            "the builder to start writing",
            workers.procs,
        )
        builder_temp = temp_dirs()
        assert len(builder_temp) == 1
        # Two more processes arrive and block on the build lock (their records are fast).
        for _ in range(2):
            workers.start(str(root), str(n), "0.0005", str(fast_progress))
        workers.wait_ready([1, 2])
        time.sleep(0.5)  # let them reach the lock
        assert workers.procs[1].poll() is None and workers.procs[2].poll() is None
        assert not (parent / "v1" / "manifest.json").exists()
        assert len(workers.builds()) == 1
        os.kill(builder.pid, signal.SIGKILL)
        builder.wait(timeout=30)
        assert builder.returncode == -signal.SIGKILL
        results = workers.wait([1, 2])
    finally:
        workers.close()

    builders = workers.builds()
    assert len(builders) == 2, f"expected the killed build and one takeover, got {builders}"
    assert int(builders[0]) == builder.pid
    assert int(builders[1]) in {r["pid"] for r in results}
    expected = _expected(n)
    for result in results:
        assert result["records"] == expected
    assert results[0]["build_id"] == results[1]["build_id"]
    assert not builder_temp[0].exists(), "the killed builder's temporary directory was not cleaned"
    assert _leftovers(root, "shared", "v1") == []
    manifest = CacheStore(root).verify_cache("shared", "v1")
    assert manifest.num_records == n
    assert sorted(p.name for p in (root / "shared" / "v1").iterdir() if p.suffix == ".mdb") == [
        p.name for p in manifest.parts
    ]


def test_tensorflow_decorator_three_ranks_build_once(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    shards = 3
    workers = Workers(tmp_path, TF_WORKER)
    try:
        for rank in range(shards):
            workers.start(str(root), str(rank), str(shards))
        workers.wait_ready(list(range(shards)))
        workers.release()
        results = workers.wait(list(range(shards)), timeout=240)
    finally:
        workers.close()

    assert len(workers.builds()) == 1
    per_rank = [r["records"] for r in results]
    for records in per_rank:
        for i, sq, name in records:
            assert sq == i * i and name == str(i)
    seen = [i for records in per_rank for i, _, _ in records]
    # 100 records over 3 ranks: the remainder (record 99) is dropped, the rest split disjointly.
    assert sorted(seen) == list(range(99))
    for rank, records in enumerate(per_rank):
        indices = [i for i, _, _ in records]
        assert sorted(indices) == list(range(rank, 99, shards))
        shard = np.arange(rank, 99, shards)
        assert indices == shard[np.random.RandomState(3).permutation(len(shard))].tolist()
    manifest = CacheStore(root).verify_cache("tfshared", "v1_train")
    assert manifest.num_records == 100
