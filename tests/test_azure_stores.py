"""What S3 and GCS do above the backend, on Azure (Azurite): sources read from ``az://`` objects
(shards, an overwrite mid-build, a changed source on a cache hit, the freshness check's cost)
and an Azure mirror of an S3 origin, filled once, then read instead of the origin."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, python_env, reader_keys, unique
from tests.faultproxy import FaultProxy
from tests.servers import AzureServer
from tests.sources_helpers import archive_bytes, cache_files, cache_from, read_back, tar_bytes
from yogacache.backends.s3 import S3ObjectStore
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.sources import SourceChangedError, from_url
from yogacache.sources.freshness import check_pins
from yogacache.store import open_store
from yogacache.store.copy import copy_cache
from yogacache.store.mirrors import MirroredCacheStore
from yogacache.store.remote import RemoteCacheStore, read_origin


@pytest.fixture
def container(azure_server: AzureServer) -> str:
    return azure_server.new_bucket()


def put(azure: AzureServer, container: str, key: str, data: bytes) -> str:
    """Uploads ``data``; its ETag as a source pins it (no quotes)."""
    response = azure.client().get_blob_client(container, key).upload_blob(data, overwrite=True)
    return str(response["etag"]).strip('"')


# -- sources --------------------------------------------------------------------------------------
def test_shards_from_azure_are_read_and_pinned_by_etag(tmp_path: Path, azure_server: AzureServer,
                                                       container: str) -> None:
    rng = np.random.default_rng(3)
    members = [{f"img{i:03d}.jpg": rng.bytes(200 + i), f"img{i:03d}.cls": str(i % 5).encode()} for i in range(8)]
    etags = {}
    for index in range(4):
        shard = {name: data for m in members[2 * index : 2 * index + 2] for name, data in m.items()}
        etags[f"train-{index:06d}.tar"] = put(azure_server, container, f"wds/train-{index:06d}.tar", tar_bytes(shard))
    source = from_url(f"az://{container}/wds/train-{{000000..000003}}.tar")
    ref = cache_from(tmp_path / "caches", source)
    ours = read_back(ref)
    assert [bytes(r["jpg"]) for r in ours] == [m[f"img{i:03d}.jpg"] for i, m in enumerate(members)]
    pins = ref.manifest.extra["sources"]["objects"]
    assert [(p["url"], p["etag"]) for p in pins] == [(f"az://{container}/wds/{name}", etags[name]) for name in etags]
    assert all(p.get("version_id") is None for p in pins)  # Azurite keeps no versions (a canary says so)
    assert source.access.requests == 1  # four named shards: one LIST of their common prefix


def test_an_object_overwritten_mid_build_fails_the_build(tmp_path: Path, azure_server: AzureServer,
                                                         container: str) -> None:
    for index in range(30):
        put(azure_server, container, f"wds/train-{index:06d}.tar", tar_bytes({f"k{index}.txt": b"x" * 500}))
    source = from_url(f"az://{container}/wds/")

    def overwrite_a_later_shard(objects: int, size: int, records: int) -> None:
        if objects == 1:  # the first shard is cached, the third not yet asked for (one is read ahead)
            put(azure_server, container, "wds/train-000002.tar", tar_bytes({"other.txt": b"new data"}))

    source.progress = overwrite_a_later_shard
    storage = tmp_path / "caches"
    with pytest.raises(SourceChangedError, match=r"train-000002\.tar changed while it was read"):
        cache_from(storage, source)
    assert cache_files(storage) == []


def test_a_changed_source_is_found_on_a_cache_hit(tmp_path: Path, azure_server: AzureServer, container: str) -> None:
    put(azure_server, container, "s/a.zip", archive_bytes({"k.txt": b"old"}, ".zip"))
    url = f"az://{container}/s/a.zip"
    storage = tmp_path / "caches"
    ref = cache_from(storage, from_url(url, on_source_change="error"))
    assert [bytes(r["txt"]) for r in read_back(ref)] == [b"old"]
    assert not check_pins(ref.manifest.extra["sources"]).changed
    put(azure_server, container, "s/a.zip", archive_bytes({"k.txt": b"new!"}, ".zip"))
    assert check_pins(ref.manifest.extra["sources"]).changed
    with pytest.raises(SourceChangedError, match="s/a.zip"):
        cache_from(storage, from_url(url, on_source_change="error"))


def test_the_freshness_check_lists_once_per_page(tmp_path: Path, azure_server: AzureServer, container: str) -> None:
    for index in range(25):
        put(azure_server, container, f"many/part-{index:04d}.tar", tar_bytes({f"r{index}.txt": b"y"}))
    ref = cache_from(tmp_path / "caches", from_url(f"az://{container}/many/"))
    assert len(read_back(ref)) == 25
    result = check_pins(ref.manifest.extra["sources"])
    assert not result.changed and result.requests == 1


# -- an Azure mirror --------------------------------------------------------------------------------
def test_an_azure_near_mirror_of_an_s3_origin_is_filled_once_then_read(
    s3_server: Any, azure_server: AzureServer, tmp_path: Path
) -> None:
    far_cloud, near_cloud = Cloud("s3", s3_server), Cloud("azure", azure_server)
    far_bucket, near_container = far_cloud.new_bucket(), near_cloud.new_bucket()
    far_direct = far_cloud.store(far_bucket, "caches")
    near = near_cloud.store(near_container, "caches")
    builder = RemoteCacheStore(far_direct, tmp_path / "builder", part_size_bytes=100_000, show_progress=False)
    current = builder.get_or_build("ds", "v1", lambda: dataset(800)).manifest
    with FaultProxy(s3_server.endpoint_url) as proxy:
        far = S3ObjectStore(far_bucket, "caches", endpoint_url=proxy.url)

        def node(root: Path) -> MirroredCacheStore:
            return MirroredCacheStore(far, [near], root, part_size_bytes=100_000, show_progress=False,
                                      poll_seconds=0.05, wait_timeout=120)

        def far_part_reads() -> int:
            return len(proxy.requests(method="GET", path_contains="-part-"))

        assert reader_keys(node(tmp_path / "a").open("ds", "v1")) == expected_keys(800)
        assert far_part_reads() == len(current.parts)  # the copy to the mirror read them once
        assert read_origin(tmp_path / "a" / "yogadl_local_cache" / "ds" / "v1") == near.url()
        found = near.read(f"ds/v1/{MANIFEST_NAME}")
        assert found is not None and Manifest.from_bytes(found[0], "near").freshness == current.freshness
        assert reader_keys(node(tmp_path / "b").open("ds", "v1")) == expected_keys(800)
        assert far_part_reads() == len(current.parts)  # a later node reads nothing from far away


def test_an_azure_origin_with_a_mirror_in_the_config(
    s3_server: Any, azure_server: AzureServer, tmp_path: Path
) -> None:
    origin, mirror = Cloud("azure", azure_server), Cloud("s3", s3_server)
    container, bucket = origin.new_bucket(), mirror.new_bucket()
    config = dict(
        origin.config(container, "caches"),
        local_cache_host_path=str(tmp_path / "local"),
        local_cache_container_path=str(tmp_path / "local"),
        mirrors=[mirror.config(bucket, "caches")],
    )
    store = open_store(config, show_progress=False)
    assert isinstance(store, MirroredCacheStore)
    RemoteCacheStore(origin.store(container, "caches"), tmp_path / unique("b"), show_progress=False).get_or_build(
        "ds", "v1", lambda: dataset(50)
    )
    assert reader_keys(store.open("ds", "v1")) == expected_keys(50)
    assert any(key.endswith(MANIFEST_NAME) for key in mirror.raw_keys(bucket))  # the mirror was filled


# -- a copy to Azure, killed half way ---------------------------------------------------------------
@pytest.mark.slow
def test_a_copy_to_azure_killed_half_way_resumes(s3_server: Any, azure_server: AzureServer, tmp_path: Path) -> None:
    """As test_copy_resume's copy to GCS: an Azure upload (Put Blob, or blocks committed at the
    end) appears whole or not at all, so the copy run again keeps the parts already there."""
    from tests.test_copy_resume import PART_SIZE, N, part_objects, wait_for_parts

    source, target = Cloud("s3", s3_server), Cloud("azure", azure_server)
    source_bucket, target_container = source.new_bucket(), target.new_bucket()
    builder = RemoteCacheStore(
        source.store(source_bucket, "caches"), tmp_path / "builder", part_size_bytes=PART_SIZE, show_progress=False
    )
    manifest = builder.get_or_build("ds", "v1", lambda: dataset(N)).manifest
    source_config = tmp_path / "src.json"
    source_config.write_text(json.dumps(source.config(source_bucket, "caches")))
    with FaultProxy(azure_server.url) as proxy:
        proxy.add_rule(action="delay", method="PUT", path_contains="-part-", seconds=0.3)  # every upload slowed
        process = subprocess.Popen(
            [sys.executable, "-m", "yogacache", "copy", "ds", "v1", "--from", str(source_config),
             "--to", target.url(target_container, "caches"), "--threads", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=python_env(AZURE_STORAGE_CONNECTION_STRING=azure_server.connection_string_at(proxy.url)),
        )
        wait_for_parts(target, target_container, len(manifest.parts) // 2, process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    present = len(part_objects(target, target_container))
    assert 0 < present < len(manifest.parts)
    assert f"caches/ds/v1/{MANIFEST_NAME}" not in target.raw_keys(target_container)
    destination = target.store(target_container, "caches")
    report = copy_cache(source_config, destination, "ds", "v1", show_progress=False)
    assert report.published and len(report.kept) >= present
    assert sorted(report.kept + report.copied) == [part.name for part in manifest.parts]
    reader = RemoteCacheStore(destination, tmp_path / "reader", show_progress=False).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)
