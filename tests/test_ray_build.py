"""Ray builds on a real local cluster (``ray.init(num_cpus=2)``) writing to the S3 test server.

Build shards run as Ray tasks give the same cache (records, order, part hashes) as local
workers; a task whose worker is SIGKILLed is re-run and the cache is still exactly right; a
failed job publishes nothing and leaves no object behind; a Ray Dataset is cached through
``write_datasink``.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from tests.test_parallel_build import DATA, killed_always, killed_once, raising_on_three, records_of
from yogacache.errors import BuildError
from yogacache.format.manifest import Manifest
from yogacache.parallel import BuildShardError, call_shards, plan_index_shards, sharded
from yogacache.parallel.ray import CacheDatasink, CacheExistsError, build_with_ray
from yogacache.progress import Progress
from yogacache.store import open_store
from yogacache.store.local import CacheStore

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
SMALL_PART = 32 << 10  # several parts per shard (LMDB's own pages within the bound)


@pytest.fixture(scope="module")
def ray_cluster(gcs_server: Any) -> Iterator[Any]:
    import ray
    import ray.data  # noqa: F401

    env = {
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "STORAGE_EMULATOR_HOST": gcs_server.url,  # the tasks reach the GCS emulator too
    }
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def s3_target(s3_server: Any, tmp_path: Path) -> dict[str, Any]:
    return {
        "type": "s3",
        "bucket": s3_server.new_bucket(),
        "bucket_directory_path": "caches",
        "endpoint_url": s3_server.endpoint_url,
        "access_key": s3_server.access_key,
        "secret_key": s3_server.secret_key,
        "local_cache_host_path": str(tmp_path / "copies"),
        "local_cache_container_path": str(tmp_path / "copies"),
    }


def bucket_keys(s3_server: Any, target: dict[str, Any]) -> list[str]:
    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=target["bucket"])
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def content(manifest: Manifest) -> list[tuple[int, int, str, Any]]:
    """What must not depend on who built the cache (Ray part names carry the attempt)."""
    return [(p.first_record, p.num_records, p.digest, p.first_key) for p in manifest.parts]


def check_records(target: dict[str, Any], expected: list[dict[str, Any]], version: str = "v1") -> Manifest:
    store = open_store(target, show_progress=False)
    reader = store.open("ds", version)
    try:
        assert len(reader) == len(expected)
        for i in range(0, len(expected), 5):
            got = reader[i]
            assert int(got["id"]) == int(expected[i]["id"]) and got["text"] == expected[i]["text"]
            np.testing.assert_array_equal(got["x"], expected[i]["x"])
        return reader.manifest
    finally:
        reader.close()


def test_ray_tasks_build_the_same_cache_as_local_workers(ray_cluster: Any, s3_target: dict[str, Any], s3_server: Any,
                                                         tmp_path: Path) -> None:
    shards = plan_index_shards(DATA[:2000], 4)
    on_ray = build_with_ray(s3_target, "ds", "v1", shards, part_size_bytes=SMALL_PART, show_progress=False)
    local = CacheStore(tmp_path / "local", show_progress=False, part_size_bytes=SMALL_PART).build(
        "ds", "v1", sharded(shards, 2)
    )
    assert len(on_ray.parts) > 4 and content(on_ray) == content(local)
    assert check_records(s3_target, DATA[:2000]).build_id == on_ray.build_id
    keys = bucket_keys(s3_server, s3_target)
    parts = [f"caches/ds/v1/{on_ray.build_id}-{p.name}" for p in on_ray.parts]
    assert keys == sorted(["caches/ds/v1/manifest.json", *parts])
    with pytest.raises(CacheExistsError, match="already published"):
        build_with_ray(s3_target, "ds", "v1", shards, show_progress=False)


def test_a_killed_task_is_retried_and_no_record_is_lost_or_doubled(ray_cluster: Any, s3_target: dict[str, Any],
                                                                  s3_server: Any, tmp_path: Path) -> None:
    marker = str(tmp_path / "killed")
    shards = call_shards([functools.partial(killed_once, start, marker) for start in range(0, 500, 100)])
    manifest = build_with_ray(s3_target, "ds", "v1", shards, part_size_bytes=SMALL_PART, show_progress=False)
    assert Path(marker).exists()  # the first attempt at shard 2 was SIGKILLed
    check_records(s3_target, DATA[:500])
    clean = CacheStore(tmp_path / "clean", show_progress=False, part_size_bytes=SMALL_PART).build(
        "ds", "v1", sharded(call_shards([functools.partial(records_of, s, s + 100) for s in range(0, 500, 100)]), 1)
    )
    assert content(manifest) == content(clean)
    assert len(bucket_keys(s3_server, s3_target)) == len(manifest.parts) + 1  # no stray attempt


def test_a_failed_job_publishes_nothing(ray_cluster: Any, s3_target: dict[str, Any], s3_server: Any) -> None:
    shards = call_shards([functools.partial(raising_on_three, start) for start in range(0, 500, 100)])
    with pytest.raises(BuildShardError, match=r"build shard 3 of ds:v1 failed: RuntimeError: bad record 350"):
        build_with_ray(s3_target, "ds", "v1", shards, show_progress=False)
    assert bucket_keys(s3_server, s3_target) == []
    dying = call_shards([functools.partial(killed_always, start) for start in range(0, 300, 100)])
    with pytest.raises(BuildError, match=r"build shard 2 of ds:v1 died 2 times"):
        build_with_ray(s3_target, "ds", "v1", dying, max_retries=1, show_progress=False)
    assert bucket_keys(s3_server, s3_target) == []


def test_a_ray_dataset_is_cached_through_write_datasink(ray_cluster: Any, s3_target: dict[str, Any],
                                                        s3_server: Any) -> None:
    from ray.data import DataContext

    context = DataContext.get_current()
    context.execution_options.preserve_order = True
    items = [{"id": i, "x": np.arange(8, dtype=np.float32) + i, "text": b"r" * (i % 41)} for i in range(1000)]
    ray_cluster.data.from_items(items, override_num_blocks=4).write_datasink(CacheDatasink(s3_target, "ds", "v1"))
    manifest = check_records(s3_target, [{**item, "id": np.int64(item["id"])} for item in items])
    assert manifest.num_records == 1000 and len(manifest.parts) == 4
    assert len(bucket_keys(s3_server, s3_target)) == 5


def slow_records(start: int) -> Iterator[dict[str, Any]]:
    for i in range(start, start + 1200):
        time.sleep(0.002)
        yield {"id": np.int64(i)}


def test_a_shared_directory_target_and_progress_across_tasks(
    ray_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yogacache.progress")
    target = f"file://{tmp_path / 'shared'}"
    (tmp_path / "shared").mkdir()
    progress = Progress("ds:v1 on Ray", stream=io.StringIO(), interval=0.0, total=4800)
    shards = call_shards([functools.partial(slow_records, start) for start in range(0, 4800, 1200)])
    manifest = build_with_ray(target, "ds", "v1", shards, progress=progress)
    store = open_store(target, local_cache=tmp_path / "copies", show_progress=False)
    reader = store.open("ds", "v1")
    assert [int(reader[i]["id"]) for i in range(0, 4800, 97)] == list(range(0, 4800, 97))
    reader.close()
    assert manifest.build_id == store.manifest("ds", "v1").build_id
    lines = [message for message in caplog.messages if "ds:v1 on Ray" in message]
    found = map(re.compile(r"([\d,]+) of 4,800 records").search, lines)
    counts = [int(m.group(1).replace(",", "")) for m in found if m]
    # The tasks' own posts reach the driver: counts that are no whole number of shards.
    assert any(count % 1200 for count in counts), lines
    assert "records/s" in lines[-1] and "4,800 records" in lines[-1]


def test_ray_tasks_write_to_gcs(ray_cluster: Any, gcs_server: Any, tmp_path: Path) -> None:
    bucket = gcs_server.new_bucket()
    target = {
        "type": "gcs",
        "bucket": bucket,
        "bucket_directory_path": "caches",
        "local_cache_host_path": str(tmp_path / "copies"),
        "local_cache_container_path": str(tmp_path / "copies"),
    }
    shards = plan_index_shards(DATA[:1000], 2)
    manifest = build_with_ray(target, "ds", "v1", shards, part_size_bytes=SMALL_PART, show_progress=False)
    check_records(target, DATA[:1000])
    local = CacheStore(tmp_path / "local", show_progress=False, part_size_bytes=SMALL_PART).build(
        "ds", "v1", sharded(shards, 1)
    )
    assert content(manifest) == content(local)
    names = sorted(blob.name for blob in gcs_server.client().list_blobs(bucket))
    parts = [f"caches/ds/v1/{manifest.build_id}-{p.name}" for p in manifest.parts]
    assert names == sorted(["caches/ds/v1/manifest.json", *parts])


KILLED_DRIVER = """
import functools, json, sys
import ray
from yogacache.parallel import call_shards
from yogacache.parallel.ray import build_with_ray
from tests.test_ray_build import slow_records

ray.init(address=sys.argv[1], log_to_driver=False, runtime_env={"env_vars": json.loads(sys.argv[3])})
shards = call_shards([functools.partial(slow_records, start) for start in range(0, 7200, 1200)])
build_with_ray(json.loads(sys.argv[2]), "ds", "v1", shards, show_progress=False)
"""


def test_a_killed_driver_publishes_nothing_and_the_next_build_cleans_up(
    ray_cluster: Any, s3_target: dict[str, Any], s3_server: Any
) -> None:
    import json
    import signal
    import subprocess
    import sys

    address = ray_cluster.get_runtime_context().gcs_address
    env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    driver = subprocess.Popen(
        [sys.executable, "-c", KILLED_DRIVER, address, json.dumps(s3_target), json.dumps(env)],
        env={**os.environ, **env},
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 180
        while not bucket_keys(s3_server, s3_target):  # a first shard is uploaded
            assert driver.poll() is None and time.monotonic() < deadline, "the Ray build never uploaded a part"
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    orphans = bucket_keys(s3_server, s3_target)
    assert orphans and "caches/ds/v1/manifest.json" not in orphans
    store = open_store(s3_target, show_progress=False)
    assert store.remote_manifest("ds", "v1") is None  # nothing visible
    shards = call_shards([functools.partial(records_of, s, s + 100) for s in range(0, 300, 100)])
    manifest = build_with_ray(s3_target, "ds", "v1", shards, show_progress=False)
    check_records(s3_target, DATA[:300])
    # What the killed build had uploaded is gone; this build's parts and manifest are there.
    keys = bucket_keys(s3_server, s3_target)
    assert not set(orphans) & set(keys)
    parts = {f"caches/ds/v1/{manifest.build_id}-{p.name}" for p in manifest.parts}
    assert {"caches/ds/v1/manifest.json", *parts} <= set(keys)


def test_two_attempts_at_one_shard_publish_one_and_delete_the_other(s3_target: dict[str, Any], s3_server: Any) -> None:
    """A task that uploaded its parts and then died (its result lost) was re-run: both attempts'
    parts are in the bucket; the manifest names one, and the other's objects are deleted."""
    from yogacache.parallel.ray import _Publication, write_and_upload

    publication = _Publication(s3_target, "ds", "v1")
    shards = plan_index_shards(DATA[:400], 2)
    lost = write_and_upload(s3_target, shards[0], 0, "ds", "v1", publication.build_id, 0, SMALL_PART)
    kept = [
        write_and_upload(s3_target, shard, index, "ds", "v1", publication.build_id, index * 200, SMALL_PART)
        for index, shard in enumerate(shards)
    ]
    assert lost.attempt != kept[0].attempt and [p.digest for p in lost.parts] == [p.digest for p in kept[0].parts]
    with pytest.raises(BuildError, match="reported twice"):
        publication.commit([lost, *kept])
    manifest = publication.commit(list(reversed(kept)))  # completion order: shard order is restored
    assert [p.name.split("-")[1] for p in manifest.parts][0] == "00000" and manifest.num_records == 400
    check_records(s3_target, DATA[:400])
    parts = [f"caches/ds/v1/{manifest.build_id}-{p.name}" for p in manifest.parts]
    assert bucket_keys(s3_server, s3_target) == sorted(["caches/ds/v1/manifest.json", *parts])
