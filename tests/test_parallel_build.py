"""Parallel build on one node (``workers=N``): the same cache for any N, faults, and every entry point.

Workers are spawned processes (they import this module to run the shard functions below). The
cache must be identical -- records, order, part names and SHA-256 -- for N = 1, 2 and 8,
because the build shards are fixed by the data. A worker killed mid-shard is retried with the
same result, or the build fails with nothing visible; a killed driver leaves nothing visible
and the next build removes its leftovers; an exception names the build shard that raised.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from yogacache import CacheNotFoundError
from yogacache.datalayer import DataLayer
from yogacache.errors import BuildError, UnsupportedDatasetError
from yogacache.format.manifest import Manifest
from yogacache.parallel import BuildShardError, CallShard, builder_shards, call_shards, plan_index_shards, sharded
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
SMALL_PART = 32 << 10  # several parts per shard (a part file never grows past it: 16 KiB held one record)


def element(i: int) -> dict[str, Any]:
    """Record ``i``: an id, a fixed-shape array and a variable-length string."""
    return {"id": np.int64(i), "x": np.arange(8, dtype=np.float32) + i, "text": b"r" * (i % 41)}


DATA = [element(i) for i in range(5000)]


class MapStyle:
    """A map-style dataset (``__getitem__`` + ``__len__``), as a torch Dataset is."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return element(i)


def records_of(start: int, stop: int) -> list[dict[str, Any]]:
    return [element(i) for i in range(start, stop)]


def tf_builder(shard_index: int, num_shards: int) -> Any:
    import tensorflow as tf

    ds = tf.data.Dataset.range(300).shard(num_shards, shard_index)
    return ds.map(lambda i: {"id": i, "x": tf.fill([3], tf.cast(i, tf.float32))})


def raising_on_three(start: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + 100):
        if start == 300 and i == 350:
            raise RuntimeError("bad record 350")
        yield element(i)


def killed_once(start: int, marker: str) -> Iterator[dict[str, Any]]:
    """Shard of 100 records whose first attempt SIGKILLs its worker halfway (when ``start`` is 200)."""
    for i in range(start, start + 100):
        if start == 200 and i == 250 and not os.path.exists(marker):
            Path(marker).write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        yield element(i)


def killed_always(start: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + 100):
        if start == 200 and i == 250:
            os.kill(os.getpid(), signal.SIGKILL)
        yield element(i)


def shape(manifest: Manifest) -> list[tuple[str, int, int, str, Any]]:
    """What must be identical whatever the number of workers: every part, in order."""
    return [(p.name, p.first_record, p.num_records, p.digest, p.first_key) for p in manifest.parts]


def check_records(store: CacheStore, dataset_version: str, expected: list[dict[str, Any]]) -> None:
    reader = store.open("ds", dataset_version)
    try:
        assert len(reader) == len(expected)
        for i in range(0, len(expected), 7):
            got = reader[i]
            assert int(got["id"]) == int(expected[i]["id"])
            np.testing.assert_array_equal(got["x"], expected[i]["x"])
            assert got["text"] == expected[i]["text"]
    finally:
        reader.close()


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "ds").iterdir() if p.name.startswith(".") and ".lock" not in p.name) if (
        root / "ds"
    ).is_dir() else []


def test_the_cache_is_identical_for_1_2_and_8_workers(tmp_path: Path) -> None:
    manifests = {}
    for workers in (1, 2, 8):
        store = CacheStore(tmp_path / f"w{workers}", show_progress=False, part_size_bytes=SMALL_PART)
        # in_process_below=0: the workers start, small as the data is (see the in-process test)
        manifests[workers] = store.build("ds", "v1", sharded(DATA, workers, build_shards=8, in_process_below=0))
        check_records(store, "v1", DATA)
        assert store.verify("ds", "v1").num_records == len(DATA)
    assert len(manifests[1].parts) > 8  # several parts per shard: rolling happens inside shards
    assert shape(manifests[1]) == shape(manifests[2]) == shape(manifests[8])
    assert manifests[1].element_spec == manifests[8].element_spec
    # Index ranges key records by their index: the cache is format 1, readable by older releases.
    assert manifests[8].format_version == 1 and all(p.first_key is None for p in manifests[8].parts)
    assert [p.name for p in manifests[2].parts][:2] == ["part-00000-000.mdb", "part-00000-001.mdb"]


def test_build_shards_of_a_map_style_dataset_depend_on_its_length_only() -> None:
    assert len(plan_index_shards(MapStyle(10))) == 1
    assert len(plan_index_shards(MapStyle(5000))) == 5
    shards = plan_index_shards(MapStyle(1_000_000))
    assert len(shards) == 256 and shards[0].length == 3906 and sum(int(s.length or 0) for s in shards) == 1_000_000


def test_shards_of_unknown_length_key_from_zero_and_read_back_in_shard_order(tmp_path: Path) -> None:
    shards = [CallShard(records_of, (start, start + 700)) for start in range(0, 2800, 700)]
    hashes = []
    for workers in (1, 2):
        store = CacheStore(tmp_path / f"w{workers}", show_progress=False, part_size_bytes=SMALL_PART)
        manifest = store.build("ds", "v1", sharded(shards, workers))
        hashes.append(shape(manifest))
        check_records(store, "v1", DATA[:2800])
        # format 2: every shard keys its records from 0, and the manifest says where each part starts
        assert manifest.format_version == 2
        assert any(p.first_key is not None and p.first_key != p.first_record for p in manifest.parts)
        raw = json.loads((store.cache_dir("ds", "v1") / "manifest.json").read_text())
        assert raw["parts"][0].get("first_key") is None and "first_key" in raw["parts"][-1]
    assert hashes[0] == hashes[1]


def test_a_tf_data_builder_runs_in_spawned_workers(tmp_path: Path) -> None:
    one = CacheStore(tmp_path / "one", show_progress=False)
    in_process = one.build("ds", "v1", sharded(builder_shards(tf_builder, 3), 1))
    # Two spawned workers, through the decorator: tf_builder(shard_index=i, num_shards=3) in each.
    layer = DataLayer.from_config({"type": "shared_fs", "host_storage_path": str(tmp_path / "two")})
    ref = layer.cache_dataset("ds", "v1", workers=2, build_shards=3)(tf_builder)()
    # shard 0 holds 0, 3, 6, ...; shard 1 then 1, 4, 7, ...: shard order, not completion order
    ids = [int(e["id"]) for e in ref.stream()]
    assert ids == [*range(0, 300, 3), *range(1, 300, 3), *range(2, 300, 3)]
    reader = one.open("ds", "v1")
    assert [int(reader[i]["id"]) for i in range(300)] == ids
    np.testing.assert_array_equal(reader[150]["x"], np.full(3, ids[150], np.float32))
    reader.close()
    two = CacheStore(tmp_path / "two").manifest("ds", "v1")
    assert in_process.source == two.source == "tensorflow"
    assert shape(in_process) == shape(two)


def test_an_exception_names_the_build_shard_and_nothing_is_visible(tmp_path: Path) -> None:
    store = CacheStore(tmp_path, show_progress=False)
    store.build("ds", "v1", DATA[:10])
    old = store.manifest("ds", "v1")
    shards = call_shards([lambda_free(start) for start in range(0, 500, 100)])
    with pytest.raises(BuildShardError, match=r"build shard 3 of ds:v1 failed: RuntimeError: bad record 350"):
        store.build("ds", "v1", sharded(shards, 2))
    assert store.manifest("ds", "v1") == old  # the old cache stays, untouched
    assert leftovers(tmp_path) == []


def lambda_free(start: int) -> Any:
    import functools

    return functools.partial(raising_on_three, start)


def test_a_killed_worker_is_retried_and_the_cache_is_identical(tmp_path: Path) -> None:
    import functools

    marker = str(tmp_path / "killed")
    shards = call_shards([functools.partial(killed_once, start, marker) for start in range(0, 500, 100)])
    store = CacheStore(tmp_path / "a", show_progress=False, part_size_bytes=SMALL_PART)
    manifest = store.build("ds", "v1", sharded(shards, 2))
    assert Path(marker).exists()  # a worker was killed mid-shard
    check_records(store, "v1", DATA[:500])
    clean = CacheStore(tmp_path / "b", show_progress=False, part_size_bytes=SMALL_PART).build(
        "ds", "v1", sharded(call_shards([functools.partial(records_of, s, s + 100) for s in range(0, 500, 100)]), 1)
    )
    assert shape(manifest) == shape(clean)
    assert leftovers(tmp_path / "a") == []


def test_a_worker_killed_on_every_attempt_fails_cleanly(tmp_path: Path) -> None:
    import functools

    store = CacheStore(tmp_path, show_progress=False)
    shards = call_shards([functools.partial(killed_always, start) for start in range(0, 500, 100)])
    with pytest.raises(BuildError, match=r"worker process building ds:v1 died .* build shards .*2.*nothing was cached"):
        store.build("ds", "v1", sharded(shards, 2, retries=1))
    with pytest.raises(CacheNotFoundError):
        store.open("ds", "v1")
    assert leftovers(tmp_path) == []


DRIVER = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from yogacache.parallel import sharded, call_shards
    from tests.test_parallel_build import slow_records
    import functools
    from yogacache.store.local import CacheStore

    store = CacheStore(sys.argv[1], show_progress=False)
    store.build("ds", "v1", sharded(call_shards([functools.partial(slow_records, s) for s in range(0, 8000, 2000)]), 2))
    """
)


def slow_records(start: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + 2000):
        time.sleep(0.002)
        yield element(i)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_driver_leaves_nothing_visible_and_the_next_build_cleans_up(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not any((tmp_path / "ds").glob(".v1.tmp-*/.shard-*")):  # shards being written
            assert driver.poll() is None and time.monotonic() < deadline, "the build never started writing"
            time.sleep(0.05)
        workers = children(driver.pid)
        assert workers
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    # The orphaned workers notice their driver is gone and exit (they would write for nobody).
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{pid}") for pid in workers):
        assert time.monotonic() < deadline, "orphaned workers kept running"
        time.sleep(0.1)
    store = CacheStore(tmp_path, show_progress=False)
    with pytest.raises(CacheNotFoundError):
        store.open("ds", "v1")
    assert leftovers(tmp_path) != []  # the killed build's temporary directory
    store.build("ds", "v1", sharded(DATA[:300], 2))
    check_records(store, "v1", DATA[:300])
    assert leftovers(tmp_path) == []


def test_every_entry_point_takes_workers(tmp_path: Path) -> None:
    reference = CacheStore(tmp_path / "ref", show_progress=False).build("ds", "v1", sharded(MapStyle(3000), 1))

    layer = DataLayer.from_config({"type": "shared_fs", "host_storage_path": str(tmp_path / "layer")})

    @layer.cache_dataset("ds", "v1", workers=2)
    def make() -> MapStyle:
        return MapStyle(3000)

    ref = make()
    assert [int(e["id"]) for e in ref.stream()] == list(range(3000))
    assert shape(CacheStore(tmp_path / "layer").manifest("ds", "v1")) == shape(reference)

    (tmp_path / "lfs").mkdir()
    LFSStorage(LFSConfigurations(str(tmp_path / "lfs"))).submit(MapStyle(3000), "ds", "v1", workers=2)
    assert shape(CacheStore(tmp_path / "lfs").manifest("ds", "v1")) == shape(reference)

    (tmp_path / "cli_data.py").write_text(
        "from tests.test_parallel_build import MapStyle, tf_builder\n\ndef make():\n    return MapStyle(3000)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, "-m", "yogacache", "build", "ds", "v1", str(tmp_path / "cli_data.py") + ":make",
         "--storage", str(tmp_path / "cli"), "--workers", "2"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "built ds v1: 3,000 records" in result.stdout
    assert shape(CacheStore(tmp_path / "cli").manifest("ds", "v1")) == shape(reference)
    bad = subprocess.run(
        [sys.executable, "-m", "yogacache", "build", "ds", "v2", str(tmp_path / "cli_data.py") + ":make",
         "--storage", str(tmp_path / "cli"), "--workers", "0"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )
    assert bad.returncode != 0 and "must be at least 1, got 0" in bad.stderr


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="workers must be at least 1, got 0"):
        sharded(DATA, 0)
    with pytest.raises(UnsupportedDatasetError, match="needs its length"):
        sharded(iter(DATA), 2)
    with pytest.raises(BuildError, match="define it at module level"):
        builder_shards(lambda shard_index, num_shards: DATA, 2)
    store = CacheStore(tmp_path, show_progress=False)
    mixed = call_shards([functools_partial(records_of, 0, 10), functools_partial(strings, 10)])
    with pytest.raises(
        UnsupportedDatasetError,
        match=r"build shard 1 of ds:v1 \(its records from index 10\) holds other elements .* "
        r"found a string value, expected a dict with keys \['id', 'text', 'x'\]",
    ):
        store.build("ds", "v1", sharded(mixed, 2))
    assert leftovers(tmp_path) == []


def strings(n: int) -> list[str]:
    return ["a"] * n


def functools_partial(function: Any, *args: Any) -> Any:
    import functools

    return functools.partial(function, *args)


def test_workers_build_then_publish_to_s3(tmp_path: Path, s3_server: Any) -> None:
    config = {
        "type": "s3",
        "bucket": s3_server.new_bucket(),
        "bucket_directory_path": "caches",
        "endpoint_url": s3_server.endpoint_url,
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
        "local_cache_host_path": str(tmp_path / "node-a"),
        "local_cache_container_path": str(tmp_path / "node-a"),
    }
    layer = DataLayer.from_config(config, rank=0, num_shards=1)
    make = layer.cache_dataset("ds", "v1", workers=2)(MapStyle)
    assert len(make(3000)) == 3000
    reference = CacheStore(tmp_path / "ref", show_progress=False).build("ds", "v1", sharded(MapStyle(3000), 1))
    # Another node syncs the published cache: the parts it downloads are the same bytes.
    other = DataLayer.from_config({**config, "local_cache_host_path": str(tmp_path / "node-b"),
                                   "local_cache_container_path": str(tmp_path / "node-b")})
    ref = other.cache_dataset("ds", "v1")(MapStyle)(3000)
    assert [int(e["id"]) for e in ref.stream()][:5] == [0, 1, 2, 3, 4]
    published = other.store.manifest("ds", "v1")
    assert shape(published) == shape(reference)


class Unpicklable:
    """A map-style dataset holding something no worker process can receive."""

    def __init__(self) -> None:
        self.lock = __import__("threading").Lock()

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, Any]:
        return element(i)


def test_a_dataset_that_cannot_reach_a_worker_gets_a_clear_error(tmp_path: Path) -> None:
    """Spawned workers are sent the dataset (forked ones inherit it: tests/test_build_scale.py)."""
    store = CacheStore(tmp_path, show_progress=False)
    with pytest.raises(BuildError, match=r"dataset of this build \(Unpicklable\) could not be sent .*TypeError.*lock"):
        store.build("ds", "v1", sharded(Unpicklable(), 2, start_method="spawn", in_process_below=0))
    assert leftovers(tmp_path) == []
    with pytest.raises(BuildError, match=r"build shard 1 could not be run in a worker process: TypeError: .*lock"):
        store.build("ds", "v1", sharded([CallShard(records_of, (0, 10)), CallShard(records_of, (Unpicklable(),))], 2))
    assert leftovers(tmp_path) == []


def test_the_driver_syncs_every_part_before_the_manifest_names_it(tmp_path: Path, monkeypatch: Any) -> None:
    """Workers only start their parts' write-back (their core goes on to the next shard); the
    driver syncs each finished shard's parts and writes the manifest after the last sync."""
    import yogacache.parallel.pool as pool

    events: list[str] = []
    real_fsync, real_write = pool.fsync_path, pool.write_file_durably
    monkeypatch.setattr(pool, "fsync_path", lambda path: (events.append(Path(path).name), real_fsync(path))[1])
    monkeypatch.setattr(
        pool, "write_file_durably", lambda path, data: (events.append("manifest"), real_write(path, data))[1]
    )
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=SMALL_PART)
    manifest = store.build("ds", "v1", sharded(DATA, 1, build_shards=4))
    parts = [part.name for part in manifest.parts]
    assert len(parts) > 4
    synced = events[: events.index("manifest")]
    assert sorted(set(parts) - set(synced)) == []  # every part, before the manifest
    check_records(store, "v1", DATA)


def test_a_part_that_cannot_be_synced_fails_the_build_and_publishes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    import yogacache.parallel.pool as pool

    store = CacheStore(tmp_path, show_progress=False)
    store.build("ds", "v1", DATA[:10])
    old = store.manifest("ds", "v1")

    def failing(path: Any) -> None:
        if "part-00002" in str(path):
            raise OSError(5, "Input/output error")

    monkeypatch.setattr(pool, "fsync_path", failing)
    with pytest.raises(BuildError, match=r"syncing a part of the build .* failed: .*Input/output error"):
        store.build("ds", "v1", sharded(DATA, 1, build_shards=4))
    assert store.manifest("ds", "v1") == old  # the old cache stays, untouched
    assert leftovers(tmp_path) == []


# -- a build too small to gain from workers runs in this process, writing what they would ---------


def test_a_small_build_with_workers_runs_in_this_process_and_writes_what_workers_write(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import yogacache.parallel.pool as pool

    data = DATA[:4000]  # four build shards of small records: far less work than starting workers
    spawned = CacheStore(tmp_path / "spawned", show_progress=False, part_size_bytes=SMALL_PART).build(
        "ds", "v1", sharded(data, 2, in_process_below=0)
    )
    assert len(spawned.parts) > 4

    def no_pool(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_pool)
    with caplog.at_level(logging.INFO, logger="yogacache.parallel.pool"):
        store = CacheStore(tmp_path / "small", show_progress=False, part_size_bytes=SMALL_PART)
        small = store.build("ds", "v1", sharded(data, 2))
        layer = DataLayer.from_config({"type": "shared_fs", "host_storage_path": str(tmp_path / "layer")})
        layer.cache_dataset("ds", "v1", workers=2)(records_of)(0, 4000)
    assert shape(small) == shape(spawned)
    check_records(store, "v1", data)
    one = CacheStore(tmp_path / "one", show_progress=False).build("ds", "v1", sharded(data, 1))
    assert shape(layer.store.manifest("ds", "v1")) == shape(one)  # build shards, as workers write them
    choices = [r.getMessage() for r in caplog.records if "in this process" in r.getMessage()]
    assert len(choices) == 2, choices  # one line per build
    assert "ds:v1" in choices[0] and "workers=2" in choices[0] and "4,000 records" in choices[0], choices[0]


# -- a script without `if __name__ == "__main__":` fails at once instead of hanging ---------------

UNGUARDED = """\
import sys

import numpy as np

from yogacache.datalayer import DataLayer

layer = DataLayer({"type": "shared_fs", "host_storage_path": sys.argv[1]}, show_progress=False)


@layer.cache_dataset("ds", "v1", workers=2)
def make():
    return [{"i": np.int64(i)} for i in range(3000)]


def main():
    print("records:", len(make().stream()))


{call}
"""


@pytest.mark.parametrize("guarded", [False, True], ids=["unguarded", "guarded"])
def test_a_script_without_a_main_guard_fails_at_once_with_the_fix(tmp_path: Path, guarded: bool) -> None:
    """Spawned workers import the script again: unguarded, each would start the build again
    and wait for the lock its parent holds. The build refuses to start, naming the fix."""
    call = 'if __name__ == "__main__":\n    main()\n' if guarded else "main()\n"
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.replace("{call}", call))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "caches")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=90,  # a hang fails here
    )
    if guarded:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "records: 3000" in result.stdout
        return
    assert result.returncode != 0
    assert 'if __name__ == "__main__":' in result.stderr, result.stderr[-3000:]
    assert f"{script}" in result.stderr and "line 19" in result.stderr, result.stderr[-3000:]
    assert "workers=2" in result.stderr
    assert not (tmp_path / "caches" / "ds" / "v1").exists()


def test_a_worker_importing_the_script_that_starts_the_build_fails_at_once(tmp_path: Path, monkeypatch: Any) -> None:
    """In a spawned child, while it imports the parent's main script (multiprocessing's
    bootstrapping), a parallel build would wait forever for its parent's lock: it fails."""
    import multiprocessing

    layer = DataLayer.from_config({"type": "shared_fs", "host_storage_path": str(tmp_path)})
    make = layer.cache_dataset("ds", "v1", workers=2)(records_of)
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(BuildError, match='if __name__ == "__main__":'):
        make(0, 3000)
    with pytest.raises(BuildError, match="importing the main script"):
        sharded(DATA, 2)
    assert not (tmp_path / "ds" / "v1").exists()


class OpensOnFirstRead(MapStyle):
    """A map-style dataset that opens its file on first read (as DataLoader-friendly datasets do,
    so that they reach workers unopened): an open one cannot be sent to a worker."""

    handle: Any = None

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.handle is None:
            self.handle = __import__("threading").Lock()  # stands for an open file: it does not pickle
        return super().__getitem__(i)


def test_the_estimate_of_a_build_leaves_the_dataset_as_the_workers_get_it() -> None:
    data = OpensOnFirstRead(5000)
    build = sharded(data, 2)
    estimate = build.estimate_seconds()
    assert estimate is not None and estimate > 0
    assert data.handle is None  # sampled on a copy: still sendable to workers
    assert build.plan_workers()[0] == 1  # 5,000 small records: one process
    slow = sharded(data, 2, in_process_below=1e-9)
    assert slow.plan_workers() == (2, "")
    assert sharded(builder_shards(tf_builder, 3), 2).estimate_seconds() is None  # unknown lengths
    assert sharded(call_shards([functools_partial(records_of, 0, 10)]), 2).plan_workers()[0] == 1  # one shard
