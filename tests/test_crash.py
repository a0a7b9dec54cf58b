"""Crash safety of a build: SIGKILL at many points never leaves a partial cache visible.

A child process builds a cache from a Python generator that reports its progress to a file;
the parent SIGKILLs it at a point chosen by a deterministic seed, from early in the build to
around sealing. After each kill, either nothing is published (fresh build) or the previous
complete cache still reads back and verifies (rebuild) -- or, when the kill came after the
atomic rename, the new cache is complete. The next build cleans the leftovers and succeeds.
An exception raised by the user's dataset mid-build leaves no trace and keeps the old cache.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from yogacache import CacheNotFoundError
from yogacache.format.manifest import Manifest
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
DATASET, VERSION = "crash", "v1"
NEW_RECORDS = 17000  # more than two LMDB write batches (8192 records each) before sealing
OLD_RECORDS = 300
OLD_OFFSET = 1_000_000
PROGRESS_EVERY = 500
KILL_SEEDS = list(range(16))  # per mode: 32 kill points in all
REBUILD_RECORDS, REBUILD_OFFSET = 2000, 2_000_000

BUILDER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from yogacache.store.local import CacheStore

    root, n, every, progress, mode = sys.argv[1:6]
    n, every = int(n), int(every)
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def records():
        for i in range(n):
            if i % every == 0:
                os.write(fd, b".")
            yield (np.int64(i), np.arange(16, dtype=np.int32) + i)
        os.write(fd, b"D")  # the dataset is exhausted: what follows is flushing and sealing

    store = CacheStore(root, show_progress=False)
    if mode == "fresh":
        store.get_or_build("crash", "v1", records)
    else:
        store.build("crash", "v1", records())
    os.write(fd, b"S")
    """
)


def _records(n: int, offset: int = 0) -> Iterator[tuple[np.int64, np.ndarray]]:
    for i in range(n):
        yield (np.int64(i + offset), np.arange(16, dtype=np.int32) + i + offset)


def _check_cache(store: CacheStore, n: int, offset: int = 0) -> Manifest:
    """The cache verifies and holds exactly the n records of ``_records(n, offset)``."""
    manifest = store.verify_cache(DATASET, VERSION)
    assert manifest.num_records == n
    reader = store.open(DATASET, VERSION)
    ids, xs = reader.read_columns(np.arange(n))
    np.testing.assert_array_equal(ids, np.arange(n) + offset)
    np.testing.assert_array_equal(xs, np.arange(16, dtype=np.int32)[None, :] + ids[:, None])
    reader.close()
    return manifest


def _leftovers(root: Path) -> list[str]:
    parent = root / DATASET
    if not parent.is_dir():
        return []
    return sorted(
        p.name for p in parent.iterdir() if p.name.startswith(f".{VERSION}.") and p.name != f".{VERSION}.lock"
    )


def _kill_plan(seed: int) -> tuple[str, float, float]:
    """(phase, threshold, jitter): kill once progress reaches ``threshold`` dots (phase "records")
    or ``jitter`` seconds after the dataset is exhausted (phase "seal")."""
    rng = random.Random(seed)
    dots = NEW_RECORDS // PROGRESS_EVERY
    fraction = seed / (len(KILL_SEEDS) - 1)
    if fraction < 0.7:
        # Spread over the whole iteration, from the very first record on.
        threshold = 1 + int(fraction / 0.7 * dots)
        return "records", threshold, rng.uniform(0, 0.01)
    # Around flushing and sealing: from right when the data ends to just after the rename.
    return "seal", 0, rng.uniform(0, 0.06)


def _run_and_kill(root: Path, progress: Path, mode: str, seed: int) -> bool:
    """Runs the builder and SIGKILLs it at the seed's point; True if it was killed."""
    script = root.parent / "builder.py"
    if not script.exists():
        script.write_text(BUILDER)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    phase, threshold, jitter = _kill_plan(seed)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root), str(NEW_RECORDS), str(PROGRESS_EVERY), str(progress), mode],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            text = progress.read_bytes() if progress.exists() else b""
            if phase == "records" and text.count(b".") >= threshold:
                break
            if phase == "seal" and b"D" in text:
                break
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, "the builder made no progress"
            time.sleep(0.0005)
        time.sleep(jitter)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.returncode not in (0, -signal.SIGKILL):
            raise AssertionError(f"builder failed: {proc.stderr.read().decode()[-3000:] if proc.stderr else ''}")
        return proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _counted(calls: list[int]) -> Callable[[], Any]:
    """The rebuild's dataset function, recording each call in ``calls``."""

    def make() -> Any:
        calls.append(1)
        return _records(REBUILD_RECORDS, REBUILD_OFFSET)

    return make


def _published_is_complete(store: CacheStore, old: Manifest | None) -> str:
    """Checks what a reader sees after a kill; returns "none", "old" or "new"."""
    target = store.cache_dir(DATASET, VERSION)
    if not store.exists(DATASET, VERSION):
        assert old is None, "the old complete cache disappeared after a crash"
        assert not target.exists(), f"a partial cache directory is visible: {sorted(os.listdir(target))}"
        with pytest.raises(CacheNotFoundError):
            store.open(DATASET, VERSION)
        assert store.list() == []
        return "none"
    manifest = store.manifest(DATASET, VERSION)
    if old is not None and manifest.build_id == old.build_id:
        _check_cache(store, OLD_RECORDS, OLD_OFFSET)
        return "old"
    # The kill came after the atomic rename: the new cache must be whole.
    _check_cache(store, NEW_RECORDS)
    return "new"


@pytest.mark.parametrize("mode", ["fresh", "replace"])
def test_sigkill_at_many_points_never_exposes_a_partial_cache(tmp_path: Path, mode: str) -> None:
    outcomes: list[tuple[int, bool, str, int]] = []
    for seed in KILL_SEEDS:
        case = tmp_path / f"seed-{seed}"
        root = case / "storage"
        root.mkdir(parents=True)
        store = CacheStore(root, show_progress=False)
        old = None
        if mode == "replace":
            store.build(DATASET, VERSION, _records(OLD_RECORDS, OLD_OFFSET))
            old = _check_cache(store, OLD_RECORDS, OLD_OFFSET)

        killed = _run_and_kill(root, case / "progress", mode, seed)
        leftovers = _leftovers(root)
        seen = _published_is_complete(store, old)
        if seen == "old":
            # Untouched: same files, same hashes.
            assert store.manifest(DATASET, VERSION) == old
        outcomes.append((seed, killed, seen, len(leftovers)))

        # The next run cleans the leftovers and builds a correct cache.
        if seen == "none":
            calls: list[int] = []
            store.get_or_build(DATASET, VERSION, _counted(calls)).close()
            assert calls == [1]
        else:
            store.build(DATASET, VERSION, _records(REBUILD_RECORDS, REBUILD_OFFSET))
        assert _leftovers(root) == [], f"seed {seed}: leftovers not cleaned: {_leftovers(root)}"
        new = _check_cache(store, REBUILD_RECORDS, REBUILD_OFFSET)
        if old is not None:
            assert new.build_id != old.build_id
        cache_files = sorted(p.name for p in store.cache_dir(DATASET, VERSION).iterdir())
        assert cache_files == sorted(["manifest.json", *(p.name for p in new.parts)])

    killed = [o for o in outcomes if o[1]]
    # The plan must really have interrupted builds, most of them with a temporary directory left.
    assert len(killed) >= len(KILL_SEEDS) // 2, outcomes
    assert sum(1 for o in killed if o[3] > 0) >= len(KILL_SEEDS) // 3, outcomes
    if mode == "fresh":
        assert any(o[2] == "none" for o in outcomes)
    else:
        assert any(o[2] == "old" for o in outcomes)


def _raising_records(n: int, fail_at: int, error: BaseException) -> Iterator[Any]:
    for i, record in enumerate(_records(n)):
        if i == fail_at:
            raise error
        yield record


@pytest.mark.parametrize("fail_at", [0, 1, 9000, NEW_RECORDS - 1])
def test_dataset_exception_mid_build_leaves_no_trace(tmp_path: Path, fail_at: int) -> None:
    root = tmp_path / "storage"
    store = CacheStore(root, show_progress=False)
    with pytest.raises(RuntimeError, match="dataset broke"):
        store.build(DATASET, VERSION, _raising_records(NEW_RECORDS, fail_at, RuntimeError("dataset broke")))
    assert not store.exists(DATASET, VERSION)
    assert not store.cache_dir(DATASET, VERSION).exists()
    assert _leftovers(root) == []
    assert store.list() == []


@pytest.mark.parametrize(
    "error", [RuntimeError("dataset broke"), KeyboardInterrupt()], ids=["RuntimeError", "KeyboardInterrupt"]
)
def test_dataset_exception_keeps_the_old_cache(tmp_path: Path, error: BaseException) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    storage = LFSStorage(LFSConfigurations(str(root)))
    storage.submit(_records(OLD_RECORDS, OLD_OFFSET), DATASET, VERSION)
    store = storage.store
    old = _check_cache(store, OLD_RECORDS, OLD_OFFSET)
    old_files = {p.name: p.read_bytes() for p in store.cache_dir(DATASET, VERSION).iterdir() if p.suffix == ".mdb"}
    reader = store.open(DATASET, VERSION)  # a reader holding the old cache open keeps working
    with pytest.raises(type(error)):
        storage.submit(_raising_records(NEW_RECORDS, 12000, error), DATASET, VERSION)
    assert _leftovers(root) == []
    assert store.manifest(DATASET, VERSION) == old
    _check_cache(store, OLD_RECORDS, OLD_OFFSET)
    assert {
        p.name: p.read_bytes() for p in store.cache_dir(DATASET, VERSION).iterdir() if p.suffix == ".mdb"
    } == old_files
    assert int(reader[5][0]) == OLD_OFFSET + 5
    reader.close()


def test_dataset_function_raising_in_cacheable_leaves_no_trace(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    storage = LFSStorage(LFSConfigurations(str(root)))
    attempts: list[int] = []

    @storage.cacheable(DATASET, VERSION)
    def make() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            return _raising_records(NEW_RECORDS, 10000, ValueError("bad record"))
        return _records(NEW_RECORDS)

    with pytest.raises(ValueError, match="bad record"):
        make()
    assert not storage.store.exists(DATASET, VERSION)
    assert not storage.store.cache_dir(DATASET, VERSION).exists()
    assert _leftovers(root) == []
    # The failure was not cached: the next call builds.
    ref = make()
    assert len(ref) == NEW_RECORDS
    assert attempts == [1, 1]
    _check_cache(storage.store, NEW_RECORDS)
