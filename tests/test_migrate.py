"""YogaDL 0.1.4 caches (``<id>/<version>/cache.mdb``): recognised, converted without running
their pickles, never destroyed, and followed when YogaDL deletes or rewrites them (issue 9.4).

The YogaDL caches here are written by YogaDL 0.1.4 itself: ``yogadl.tensorflow.
serialize_tf_dataset_to_lmdb`` is the function its ``LFSStorage.submit`` (and the cloud storages'
``submit``) call to write cache.mdb. ``yogadl.storage`` itself cannot be imported here, because
its coordinator client needs ``lomond``, which the reference install leaves out.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
import tensorflow as tf
import yogadl
import yogadl.tensorflow

import yogacache
import yogacache.dataref
from tests.cloud_helpers import Cloud
from yogacache.errors import CacheNotFoundError
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.yogadl_legacy import LEGACY_EXTRA_KEY, RefusedPickleError, YogaDLCache
from yogacache.storage import (
    GCSConfigurations,
    GCSStorage,
    LFSConfigurations,
    LFSStorage,
    S3Configurations,
    S3Storage,
)

REPO = Path(__file__).resolve().parent.parent


def write_yogadl_cache(path: Path, dataset: tf.data.Dataset) -> Path:
    """A cache.mdb exactly as YogaDL 0.1.4's LFSStorage.submit writes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    yogadl.tensorflow.serialize_tf_dataset_to_lmdb(dataset=dataset, checkpoint_path=path, tf_config=None)
    return path


def yogadl_records(path: Path) -> list[Any]:
    access = yogadl.LmdbAccess(lmdb_path=path)
    return [access.read_value_by_key(key) for key in access.get_keys()]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def values(stream: Any) -> list[int]:
    return [int(x) for x in stream]


def feature_dataset(n: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        {
            "image": tf.reshape(tf.range(n * 4, dtype=tf.float32), (n, 2, 2)),
            "label": tf.range(n, dtype=tf.int32),
            "name": tf.constant([f"item-{i}".encode() for i in range(n)]),
            "pair": (tf.constant([i % 2 == 0 for i in range(n)]), tf.range(n, dtype=tf.float64) / 2),
        }
    )


def test_fetch_converts_a_yogadl_cache_and_keeps_it(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "features" / "1" / "cache.mdb", feature_dataset(7))
    before = digest(legacy)
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    ref = storage.fetch("features", "1")
    assert digest(legacy) == before  # the YogaDL cache is still there, unchanged
    got = list(ref.stream())
    want = yogadl_records(legacy)
    assert len(got) == len(want) == 7
    for mine, theirs in zip(got, want):
        assert mine["image"].tolist() == theirs["image"].tolist() and mine["image"].dtype == np.float32
        assert int(mine["label"]) == int(theirs["label"])
        assert bytes(mine["name"]) == theirs["name"]
        assert bool(mine["pair"][0]) == bool(theirs["pair"][0]) and float(mine["pair"][1]) == theirs["pair"][1]
    manifest = Manifest.load(tmp_path / "features" / "1")
    assert manifest.source == "yogadl" and manifest.extra[LEGACY_EXTRA_KEY]["size"] == legacy.stat().st_size
    # The element spec is the one YogaDL recorded (__types__, __shapes__).
    stream = ref.stream()
    assert stream.output_types["image"] == tf.float32 and stream.output_shapes["image"] == tf.TensorShape([2, 2])
    assert stream.output_types["name"] == tf.string


def test_element_order_matches_yogadl_for_stream_arguments(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(23))
    ref = LFSStorage(LFSConfigurations(str(tmp_path))).fetch("range", "1")
    from yogadl.dataref import LMDBDataRef as TheirDataRef

    theirs = TheirDataRef(cache_filepath=legacy)
    for kwargs in (
        {},
        {"shuffle": True, "shuffle_seed": 4},
        {"shuffle": True, "shuffle_seed": 4, "skip_shuffle_at_epoch_end": True, "start_offset": 9},
        {"shard_rank": 1, "num_shards": 3, "drop_shard_remainder": True, "shuffle": True, "shuffle_seed": 1},
    ):
        mine, other = ref.stream(**kwargs), theirs.stream(**kwargs)
        assert len(mine) == len(other)
        for _ in range(2):  # two epochs
            assert values(mine) == [int(x) for x in other.iterator_fn()]


def test_cacheable_uses_the_yogadl_cache_then_rebuilds_when_it_is_deleted(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(120))
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    calls: list[int] = []

    @storage.cacheable("range", "1")
    def make(range_size: int) -> tf.data.Dataset:
        calls.append(range_size)
        return tf.data.Dataset.range(range_size)

    assert values(make(range_size=126).stream()) == list(range(120))  # the YogaDL cache, not a build
    assert calls == [] and legacy.is_file()
    assert values(make(range_size=126).stream()) == list(range(120))
    assert calls == []

    legacy.unlink()  # how YogaDL (and its tests) invalidate a cache
    assert values(make(range_size=55).stream()) == list(range(55))
    assert calls == [55]
    assert values(make(range_size=70).stream()) == list(range(55))  # a yogacache cache now
    assert calls == [55]


def test_lmdb_dataref_of_a_cache_mdb_path(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(6))
    with pytest.raises(CacheNotFoundError, match="is a YogaDL cache: convert it first"):
        yogacache.dataref.LMDBDataRef(legacy)
    LFSStorage(LFSConfigurations(str(tmp_path))).fetch("range", "1")
    assert values(yogacache.dataref.LMDBDataRef(legacy).stream()) == list(range(6))


def test_fetch_after_the_yogadl_cache_is_deleted_is_not_found(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(5))
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    assert values(storage.fetch("range", "1").stream()) == list(range(5))
    legacy.unlink()
    with pytest.raises(CacheNotFoundError, match="no cache for dataset 'range'"):
        storage.fetch("range", "1")


def test_a_rewritten_yogadl_cache_is_converted_again(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(5))
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    assert values(storage.fetch("range", "1").stream()) == list(range(5))
    write_yogadl_cache(legacy, tf.data.Dataset.range(100, 108))  # YogaDL's submit overwrote it
    assert values(storage.fetch("range", "1").stream()) == list(range(100, 108))
    assert yogadl_records(legacy) == list(range(100, 108))


def test_decorators_use_a_yogadl_cache(tmp_path: Path) -> None:
    write_yogadl_cache(tmp_path / "range" / "1_train" / "cache.mdb", tf.data.Dataset.range(10))
    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": str(tmp_path)}, rank=0, num_shards=1, show_progress=False
    )

    @layer.cache_train_dataset("range", "1", returns="stream")
    def make() -> tf.data.Dataset:
        raise AssertionError("the YogaDL cache should have been used")

    assert values(make()) == list(range(10))


def _malicious_cache(path: Path, marker: Path) -> None:
    """A cache.mdb in YogaDL's layout whose first record's pickle calls os.system."""

    class Exploit:
        def __reduce__(self) -> Any:
            return (os.system, (f"touch {marker}",))

    path.parent.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(path), subdir=False, map_size=1 << 24)
    keys = [b"00000000", b"00000001"]
    with env.begin(write=True) as txn:
        txn.put(keys[0], pickle.dumps(Exploit(), protocol=-1))
        txn.put(keys[1], pickle.dumps(np.int64(1), protocol=-1))
        txn.put(b"__keys__", pickle.dumps(keys, protocol=-1))
        txn.put(b"__shapes__", pickle.dumps(tf.TensorShape([]), protocol=-1))
        txn.put(b"__types__", pickle.dumps(tf.int64, protocol=-1))
    env.close()


def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    legacy = tmp_path / "evil" / "1" / "cache.mdb"
    marker = tmp_path / "exploited"
    _malicious_cache(legacy, marker)
    before = digest(legacy)
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    with pytest.raises(RefusedPickleError, match=r"posix\.system, which YogaDL never wrote"):
        storage.fetch("evil", "1")
    assert not marker.exists()
    assert digest(legacy) == before  # the file is left for the user to inspect
    assert not (tmp_path / "evil" / "1" / MANIFEST_NAME).exists()
    assert not [p for p in (tmp_path / "evil").iterdir() if ".tmp-" in p.name]  # the build was discarded
    with pytest.raises(RefusedPickleError):
        YogaDLCache(legacy).elements().__next__()


def test_metadata_that_names_another_type_is_refused(tmp_path: Path) -> None:
    legacy = tmp_path / "odd" / "1" / "cache.mdb"
    legacy.parent.mkdir(parents=True)
    env = lmdb.open(str(legacy), subdir=False, map_size=1 << 24)
    with env.begin(write=True) as txn:
        txn.put(b"__keys__", pickle.dumps([], protocol=-1))
        txn.put(b"__shapes__", pickle.dumps(tf.TensorShape([]), protocol=-1))
        txn.put(b"__types__", pickle.dumps(__import__("collections").OrderedDict(), protocol=-1))
    env.close()
    with pytest.raises(RefusedPickleError, match=r"collections\.OrderedDict"):
        YogaDLCache(legacy)


@pytest.fixture(params=["s3", "gcs"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    kind = request.param
    return Cloud(kind, request.getfixturevalue("s3_server" if kind == "s3" else "gcs_server"))


def test_cloud_yogadl_cache_is_converted_published_and_kept(cloud: Cloud, tmp_path: Path) -> None:
    bucket = cloud.new_bucket()
    legacy = write_yogadl_cache(tmp_path / "made" / "cache.mdb", tf.data.Dataset.range(12))
    cloud.raw_put(bucket, "unit-tests/range/0/cache.mdb", legacy.read_bytes())

    def storage(node: str) -> Any:
        local = str(tmp_path / node)
        if cloud.kind == "s3":
            made: Any = S3Storage(
                S3Configurations(bucket, "unit-tests", endpoint_url=cloud.server.endpoint_url, local_cache_dir=local)
            )
        else:
            made = GCSStorage(GCSConfigurations(bucket, "unit-tests", local_cache_dir=local))
        made.store.show_progress = False
        return made

    assert values(storage("a").fetch("range", "0").stream()) == list(range(12))
    assert "unit-tests/range/0/manifest.json" in cloud.raw_keys(bucket)
    assert cloud.raw_get(bucket, "unit-tests/range/0/cache.mdb") == legacy.read_bytes()  # kept

    @storage("b").cacheable("range", "0")
    def make() -> tf.data.Dataset:
        raise AssertionError("published already")

    assert values(make().stream(shard_rank=1, num_shards=2)) == list(range(1, 12, 2))

    cloud.raw_delete(bucket, "unit-tests/range/0/cache.mdb")  # YogaDL's invalidation

    @storage("b").cacheable("range", "0")
    def remake() -> tf.data.Dataset:
        return tf.data.Dataset.range(3)

    assert values(remake().stream()) == [0, 1, 2]
    assert values(storage("c").fetch("range", "0").stream()) == [0, 1, 2]


def test_cli_migrate(tmp_path: Path) -> None:
    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(4))
    before = digest(legacy)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "yogacache", "migrate", "range", "1", "--storage", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "4 records" in done.stdout and "cache.mdb" in done.stdout
    assert digest(legacy) == before
    manifest = json.loads((tmp_path / "range" / "1" / MANIFEST_NAME).read_text())
    assert manifest["num_records"] == 4 and manifest["source"] == "yogadl"
    missing = subprocess.run(
        [sys.executable, "-m", "yogacache", "migrate", "range", "2", "--storage", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert missing.returncode != 0 and "no YogaDL cache of range:2" in missing.stderr


def test_cli_migrate_refuses_a_malicious_cache_and_converts_from_s3(s3_server: Any, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    marker = tmp_path / "exploited"
    _malicious_cache(tmp_path / "lfs" / "evil" / "1" / "cache.mdb", marker)
    refused = subprocess.run(
        [sys.executable, "-m", "yogacache", "migrate", "evil", "1", "--storage", str(tmp_path / "lfs")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert refused.returncode == 1 and "posix.system" in refused.stderr and "Traceback" not in refused.stderr
    assert not marker.exists()

    bucket = s3_server.new_bucket()
    legacy = write_yogadl_cache(tmp_path / "made" / "cache.mdb", tf.data.Dataset.range(9))
    s3_server.client().upload_file(str(legacy), bucket, "caches/range/2/cache.mdb")
    done = subprocess.run(
        [sys.executable, "-m", "yogacache", "migrate", "range", "2", "--storage", f"s3://{bucket}/caches",
         "--endpoint-url", s3_server.endpoint_url, "--local-cache", str(tmp_path / "local")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"s3://{bucket}/caches/range/2/cache.mdb" in done.stdout and "9 records" in done.stdout
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "caches/range/2/manifest.json" in keys and "caches/range/2/cache.mdb" in keys


def test_a_remote_hit_through_the_facade_costs_one_read(s3_server: Any, tmp_path: Path) -> None:
    """Looking for YogaDL caches adds no request to a hit on a yogacache cache."""
    from tests.cloud_helpers import CountingStore

    bucket = s3_server.new_bucket()
    storage = S3Storage(
        S3Configurations(bucket, "p", endpoint_url=s3_server.endpoint_url, local_cache_dir=str(tmp_path / "l"))
    )
    storage.store.show_progress = False
    counting = CountingStore(storage.store.objects)
    storage.store.objects = counting

    @storage.cacheable("ds", "1")
    def make() -> tf.data.Dataset:
        return tf.data.Dataset.range(4)

    assert values(make().stream()) == [0, 1, 2, 3]
    counting.reset()
    assert values(make().stream()) == [0, 1, 2, 3]
    assert values(storage.fetch("ds", "1").stream()) == [0, 1, 2, 3]
    assert counting.counts() == {"read": 2}  # one manifest read per call, no listing


CONVERT_SCRIPT = """
import json, os, sys, time
root, go = sys.argv[1:3]
from yogacache.storage import LFSConfigurations, LFSStorage
storage = LFSStorage(LFSConfigurations(root))
storage.store.show_progress = False

@storage.cacheable("range", "1")
def make():
    raise AssertionError("the YogaDL cache should have been converted, not rebuilt")

deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
ref = make()
print(json.dumps({"values": [int(x) for x in ref.stream()], "build": ref.manifest.build_id}))
"""


def test_processes_converting_at_once_convert_once(tmp_path: Path) -> None:
    from tests.cloud_helpers import finish, start_python

    legacy = write_yogadl_cache(tmp_path / "range" / "1" / "cache.mdb", tf.data.Dataset.range(30))
    before = digest(legacy)
    go = tmp_path / "go"
    processes = [start_python(CONVERT_SCRIPT, str(tmp_path), str(go)) for _ in range(3)]
    go.touch()
    results = [finish(process, timeout=240) for process in processes]
    assert all(result["values"] == list(range(30)) for result in results)
    assert len({result["build"] for result in results}) == 1  # one conversion, read by all
    assert digest(legacy) == before
