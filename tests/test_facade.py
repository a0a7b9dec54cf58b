"""YogaDL 0.1.4 programs run against yogacache with only the import changed, in YogaDL's order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import yogadl

import yogacache
import yogacache.storage
import yogacache.tensorflow
from yogacache.errors import CacheNotFoundError, InvalidNameError

REPO = Path(__file__).resolve().parent.parent


def reference_order(
    n: int,
    epochs: int,
    start_offset: int = 0,
    shuffle: bool = False,
    skip_shuffle_at_epoch_end: bool = False,
    shuffle_seed: Any = None,
    shard_rank: int = 0,
    num_shards: int = 1,
    drop_shard_remainder: bool = False,
) -> list[int]:
    """Record indices in the order YogaDL 0.1.4's LMDBDataRef.stream reads them, epochs concatenated."""
    keys = yogadl.shard_keys(
        list(range(n)), shard_rank, num_shards, sequential=False, drop_shard_remainder=drop_shard_remainder
    )
    generator = yogadl.GeneratorFromKeys(
        keys=keys,
        initial_offset=start_offset,
        read_val_from_key_fn=lambda key: key,
        shuffle_at_start=shuffle,
        shuffle_after_epoch=shuffle and not skip_shuffle_at_epoch_end,
        shuffle_seed=shuffle_seed,
    )
    return [x for _ in range(epochs) for x in generator.instantiate_generator()]


def test_walkthrough_program(tmp_path: Path) -> None:
    """YogaDL's examples/walkthrough.py with ``yogadl`` replaced by ``yogacache``."""
    # START creating a yogadl.Storage
    storage_path = str(tmp_path / "yogadl_cache")
    os.makedirs(storage_path, exist_ok=True)
    lfs_config = yogacache.storage.LFSConfigurations(storage_path)
    storage = yogacache.storage.LFSStorage(lfs_config)

    # START storing a dataset
    records = tf.data.Dataset.range(10)
    storage.submit(records, "range", "1.0")

    # START fetching a dataset
    dataref = storage.fetch("range", "1.0")
    stream = dataref.stream(start_offset=5, shuffle=True, shuffle_seed=777)
    records = yogacache.tensorflow.make_tf_dataset(stream)
    batches = records.repeat(3).batch(5)
    got = [batch.numpy().tolist() for batch in batches]
    flat = [x for batch in got for x in batch]
    assert flat == reference_order(10, 3, start_offset=5, shuffle=True, shuffle_seed=777)
    assert [len(b) for b in got] == [5] * 5
    assert isinstance(dataref, yogacache.DataRef) and len(dataref) == 10
    assert isinstance(stream, yogacache.Stream) and len(stream) == 10

    # START can I get the same features in fewer steps?
    calls = []

    @storage.cacheable("range", "2.0")
    def make_records() -> tf.data.Dataset:
        calls.append(1)
        return tf.data.Dataset.range(10).map(lambda x: 2 * x)

    dataref = make_records()
    stream = dataref.stream()
    records = yogacache.tensorflow.make_tf_dataset(stream)
    batches = records.repeat(3).batch(5)
    flat = [x for batch in batches for x in batch.numpy().tolist()]
    assert flat == [2 * x for x in reference_order(10, 3)]
    assert calls == [1]
    # The cached dataset is served again without calling the function.
    dataref = make_records()
    assert calls == [1]
    assert [int(x) for x in dataref.stream()] == list(range(0, 20, 2))


def test_walkthrough_as_a_standalone_program(tmp_path: Path) -> None:
    """The same program in a fresh interpreter, twice: the second run finds the cache."""
    program = f"""
import os
import yogacache
import yogacache.storage
import yogacache.tensorflow
import tensorflow as tf

storage_path = {str(tmp_path / "cache")!r}
os.makedirs(storage_path, exist_ok=True)
storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(storage_path))

@storage.cacheable("range", "2.0")
def make_records():
    print("Cache not found, making range v2 dataset...")
    return tf.data.Dataset.range(10).map(lambda x: 2 * x)

dataref = make_records()
stream = dataref.stream(start_offset=3, shuffle=True, shuffle_seed=5, shard_rank=1, num_shards=2)
records = yogacache.tensorflow.make_tf_dataset(stream)
print("ORDER", [int(x) for x in records.repeat(2).as_numpy_iterator()])
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    outputs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
            cwd=str(REPO),
        )
        assert result.returncode == 0, result.stderr[-3000:]
        outputs.append(result.stdout)
    assert "Cache not found" in outputs[0]
    assert "Cache not found" not in outputs[1]
    want = [
        2 * x
        for x in reference_order(
            10, 2, start_offset=3, shuffle=True, shuffle_seed=5, shard_rank=1, num_shards=2
        )
    ]
    for output in outputs:
        (line,) = [line for line in output.splitlines() if line.startswith("ORDER")]
        assert line == f"ORDER {want}"


STREAM_CASES = [
    {},
    {"start_offset": 7},
    {"shuffle": True, "shuffle_seed": 1},
    {"shuffle": True, "shuffle_seed": 1, "skip_shuffle_at_epoch_end": True, "start_offset": 30},
    {"shuffle": True, "shuffle_seed": 42, "shard_rank": 2, "num_shards": 3, "start_offset": 9},
    {"shuffle": True, "shuffle_seed": 42, "shard_rank": 0, "num_shards": 4, "drop_shard_remainder": True},
    {"shard_rank": 3, "num_shards": 4, "drop_shard_remainder": True, "start_offset": 20},
]


@pytest.fixture(scope="module")
def storage_with_data(tmp_path_factory: pytest.TempPathFactory) -> yogacache.storage.LFSStorage:
    root = tmp_path_factory.mktemp("facade")
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(root)))
    storage.submit(tf.data.Dataset.range(23).map(lambda x: {"idx": x, "sq": x * x}), "squares", "1")
    return storage


@pytest.mark.parametrize("kwargs", STREAM_CASES, ids=[str(c) for c in STREAM_CASES])
def test_tf_dataset_order_matches_yogadl(
    storage_with_data: yogacache.storage.LFSStorage, kwargs: dict
) -> None:
    stream = storage_with_data.fetch("squares", "1").stream(**kwargs)
    dataset = yogacache.tensorflow.make_tf_dataset(stream)
    got = [int(e["idx"]) for _ in range(3) for e in dataset.as_numpy_iterator()]
    assert got == reference_order(23, 3, **kwargs)
    squares = [int(e["sq"]) for e in dataset.take(3).as_numpy_iterator()]
    assert all(int(np.sqrt(s)) ** 2 == s for s in squares)


def test_python_stream_order_matches_yogadl(storage_with_data: yogacache.storage.LFSStorage) -> None:
    kwargs = {"shuffle": True, "shuffle_seed": 9, "shard_rank": 1, "num_shards": 2, "start_offset": 15}
    stream = storage_with_data.fetch("squares", "1").stream(**kwargs)
    got = [int(e["idx"]) for _ in range(3) for e in stream]
    assert got == reference_order(23, 3, **kwargs)
    assert len(stream) == 11


def test_cacheable_calls_the_function_only_on_a_miss(tmp_path: Path) -> None:
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    calls: list[tuple[Any, ...]] = []

    @storage.cacheable("counted", "v1")
    def make(n: int, scale: int = 1) -> tf.data.Dataset:
        calls.append((n, scale))
        return tf.data.Dataset.range(n).map(lambda x: x * scale)

    assert make.__name__ == "make"
    first = make(5, scale=3)
    assert calls == [(5, 3)]
    assert [int(x) for x in first.stream()] == [0, 3, 6, 9, 12]
    second = make(5, scale=3)
    third = make(100, scale=7)  # same id and version: the cache is served, the function not called
    assert calls == [(5, 3)]
    assert [int(x) for x in third.stream()] == [0, 3, 6, 9, 12]
    assert len(second) == 5
    # A fresh storage object on the same directory sees the cache too.
    again = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    assert len(again.cacheable("counted", "v1")(lambda: calls.append(("new",)))()) == 5
    assert calls == [(5, 3)]
    # Another version is a miss.
    make_v2 = storage.cacheable("counted", "v2")(make.__wrapped__)
    assert len(make_v2(2)) == 2
    assert calls == [(5, 3), (2, 1)]


def test_cacheable_function_that_raises_caches_nothing_and_is_retried(tmp_path: Path) -> None:
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    calls = []

    @storage.cacheable("flaky", "v1")
    def make() -> tf.data.Dataset:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first call fails")
        return tf.data.Dataset.range(3)

    with pytest.raises(RuntimeError, match="first call fails"):
        make()
    with pytest.raises(CacheNotFoundError):
        storage.fetch("flaky", "v1")
    assert [int(x) for x in make().stream()] == [0, 1, 2]
    assert len(calls) == 2


def test_fetch_of_a_missing_cache_raises_cache_not_found(tmp_path: Path) -> None:
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    with pytest.raises(CacheNotFoundError) as info:
        storage.fetch("nothing", "1.0")
    assert isinstance(info.value, FileNotFoundError)
    assert "nothing" in str(info.value) and "1.0" in str(info.value)
    with pytest.raises(FileNotFoundError):
        storage.fetch("nothing", "1.0")
    assert not (tmp_path / "nothing" / "1.0").exists()


def test_lfs_storage_on_a_missing_directory_raises_file_not_found(tmp_path: Path) -> None:
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError, match="does-not-exist"):
        yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(missing)))
    assert not missing.exists()


def test_submit_replaces_and_fetch_reads_the_new_data(tmp_path: Path) -> None:
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    storage.submit(tf.data.Dataset.range(4), "ds", "1")
    old = storage.fetch("ds", "1")
    storage.submit(tf.data.Dataset.range(100, 106), "ds", "1")
    assert [int(x) for x in storage.fetch("ds", "1").stream()] == list(range(100, 106))
    assert [int(x) for x in old.stream()] == [0, 1, 2, 3]  # an open DataRef keeps its data


@pytest.mark.parametrize("bad", ["../escape", "a/b", "..", ".", "", "/abs", "x\x00y"])
def test_unsafe_names_are_refused_before_any_call(tmp_path: Path, bad: str) -> None:
    storage = yogacache.storage.LFSStorage(yogacache.storage.LFSConfigurations(str(tmp_path)))
    with pytest.raises(InvalidNameError):
        storage.cacheable(bad, "1")
    with pytest.raises(InvalidNameError):
        storage.cacheable("ok", bad)
    with pytest.raises(ValueError):
        storage.fetch(bad, "1")
    with pytest.raises(ValueError):
        storage.submit(tf.data.Dataset.range(1), "ok", bad)
    assert [p for p in tmp_path.rglob("*")] == []


def test_import_yogacache_storage_does_not_import_tensorflow() -> None:
    code = (
        "import sys, yogacache, yogacache.storage; "
        "bad = [m for m in ('tensorflow', 'boto3', 'google.cloud.storage') if m in sys.modules]; "
        "print('LOADED', bad)"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout
