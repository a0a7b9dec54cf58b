"""Publishing caches to S3 / GCS and syncing them to node-local copies, against real servers.

Every test runs twice: against moto's S3 server and against fake-gcs-server (both
subprocesses). A "node" is a RemoteCacheStore with its own local cache directory; where the
test needs real concurrency, nodes are separate Python processes sharing only the bucket.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import (
    Builds,
    Cloud,
    CountingStore,
    HttpRequests,
    dataset,
    digest_of_keys,
    element_key,
    expected_keys,
    finish,
    must_not_build,
    reader_keys,
    start_python,
    unique,
)
from yogacache.backends.base import RemoteError
from yogacache.errors import CorruptCacheError
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import source_for
from yogacache.store.lease import Lease
from yogacache.store.remote import LEASE_NAME, LOCAL_CACHE_DIR, BuildWaitTimeoutError, RemoteCacheStore

PREFIX = "caches/team"


class Site:
    """One bucket on one cloud, and the nodes (local cache directories) that use it."""

    def __init__(self, cloud: Cloud, tmp_path: Path) -> None:
        self.cloud = cloud
        self.bucket = cloud.new_bucket()
        self.prefix = PREFIX
        self.tmp_path = tmp_path

    def objects(self, counting: bool = False) -> Any:
        store = self.cloud.store(self.bucket, self.prefix)
        return CountingStore(store) if counting else store

    def node(self, name: str, objects: Any = None, **options: Any) -> RemoteCacheStore:
        settings: dict[str, Any] = dict(lease_seconds=6.0, poll_seconds=0.1, show_progress=False)
        settings.update(options)
        return RemoteCacheStore(objects or self.objects(), self.tmp_path / name, **settings)

    def keys(self) -> list[str]:
        return self.cloud.raw_keys(self.bucket)

    def full_key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    """Each test using it runs against moto's S3 server, fake-gcs-server and Azurite."""
    kind = request.param
    return Cloud(kind, request.getfixturevalue(f"{kind}_server"))


# YogaDL's storages (the facade) are S3 and GCS only.
YOGADL_CLOUDS = pytest.mark.parametrize("cloud", ["s3", "gcs"], indirect=True)


@pytest.fixture
def site(cloud: Cloud, tmp_path: Path) -> Site:
    return Site(cloud, tmp_path)


def hidden_leftovers(store: RemoteCacheStore, dataset_id: str) -> list[str]:
    """Temporary or trash directories next to a cache (lock files are expected and kept)."""
    directory = store.local.root / dataset_id
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") and p.is_dir())


# -- publish: layout -------------------------------------------------------------------------
def test_publish_layout_remote_and_local(site: Site) -> None:
    node = site.node("node-a", part_size_bytes=100_000)
    make = Builds(dataset(1500))
    reader = node.get_or_build("mnist", "v1", make)
    assert make.calls == 1
    assert reader_keys(reader) == expected_keys(1500)
    manifest = reader.manifest
    assert len(manifest.parts) > 1  # several parts, all published

    # Remote: bucket/bucket_directory_path/<id>/<version>/ holds the parts and manifest.json.
    part_keys = [site.full_key(f"mnist/v1/{manifest.build_id}-{p.name}") for p in manifest.parts]
    assert site.keys() == sorted(
        part_keys + [site.full_key("mnist/v1/manifest.json"), site.full_key(f"mnist/v1/{LEASE_NAME}")]
    )
    remote = Manifest.from_bytes(site.cloud.raw_get(site.bucket, site.full_key("mnist/v1/manifest.json")), "remote")
    assert remote.freshness == manifest.freshness
    assert remote.parts == manifest.parts
    for part, key in zip(manifest.parts, part_keys):
        assert site.cloud.raw_get(site.bucket, key) == (reader.directory / part.name).read_bytes()

    # Local: <local root>/yogadl_local_cache/<id>/<version>/.
    local_dir = site.tmp_path / "node-a" / LOCAL_CACHE_DIR / "mnist" / "v1"
    assert reader.directory == local_dir
    assert Manifest.load(local_dir).freshness == manifest.freshness
    # The lease was released (expired), not left to block other builders for its duration.
    lease = Lease.read(site.objects(), f"mnist/v1/{LEASE_NAME}")
    assert lease is not None and lease.expires_at == 0.0


def test_manifest_is_created_last(site: Site) -> None:
    """Publishing uploads every part before it creates the manifest (the commit point)."""
    objects = site.objects(counting=True)
    node = site.node("node-a", objects, part_size_bytes=100_000)
    reader = node.get_or_build("ds", "v1", Builds(dataset(1500)))
    writes = [(m, k) for m, k in objects.calls if m in ("upload_file", "write")]
    manifest_index = writes.index(("write", f"ds/v1/{MANIFEST_NAME}"))
    uploads = [i for i, (m, _) in enumerate(writes) if m == "upload_file"]
    assert len(uploads) == len(reader.manifest.parts)
    assert max(uploads) < manifest_index


def test_only_one_of_two_publishers_wins_and_loser_parts_are_removed(site: Site) -> None:
    """Two nodes built the same cache (different bytes); the manifest's conditional create lets
    exactly one publish, and the loser's uploaded parts do not linger in the bucket."""
    a, b = site.node("node-a"), site.node("node-b")
    manifest_a = a.local.build_locked("ds", "v1", source_for(dataset(300)))
    manifest_b = b.local.build_locked("ds", "v1", source_for(dataset(300, 7)))
    assert a.publish_locked(manifest_a) is True
    assert b.publish_locked(manifest_b) is False
    remote = a.remote_manifest("ds", "v1")
    assert remote is not None and remote.freshness == manifest_a.freshness
    assert site.keys() == sorted(
        [site.full_key(f"ds/v1/{manifest_a.build_id}-{p.name}") for p in manifest_a.parts]
        + [site.full_key("ds/v1/manifest.json")]
    )
    # Node b now syncs to the winner's build.
    reader = b.open("ds", "v1")
    assert reader.manifest.freshness == manifest_a.freshness
    assert reader_keys(reader) == expected_keys(300)


# -- sync: reuse, re-download ----------------------------------------------------------------
def test_second_node_downloads_without_building(site: Site) -> None:
    site.node("node-a", part_size_bytes=100_000).get_or_build("ds", "v1", Builds(dataset(1500)))
    objects = site.objects(counting=True)
    node_b = site.node("node-b", objects, part_size_bytes=100_000)
    reader = node_b.get_or_build("ds", "v1", must_not_build)
    assert reader_keys(reader) == expected_keys(1500)
    counts = objects.counts()
    assert counts["download_file"] == len(reader.manifest.parts)
    assert counts["write"] == 0 and counts["upload_file"] == 0  # no lease, no publish
    assert reader.directory == site.tmp_path / "node-b" / LOCAL_CACHE_DIR / "ds" / "v1"


def test_current_local_copy_is_reused_with_exactly_one_request(site: Site) -> None:
    site.node("node-a").get_or_build("ds", "v1", Builds(dataset()))
    site.node("node-b").open("ds", "v1")  # node b now has a current local copy
    local_dir = site.tmp_path / "node-b" / LOCAL_CACHE_DIR / "ds" / "v1"
    part_inodes = {p.name: p.stat().st_ino for p in local_dir.glob("*.mdb")}

    # A new process on node b: one manifest GET, nothing else, for both entry points.
    for call in ("get_or_build", "open"):
        objects = site.objects(counting=True)
        http = HttpRequests().attach(objects.inner)
        node_b = site.node("node-b", objects)
        if call == "get_or_build":
            reader = node_b.get_or_build("ds", "v1", must_not_build)
        else:
            reader = node_b.open("ds", "v1")
        assert objects.calls == [("read", f"ds/v1/{MANIFEST_NAME}")], call
        assert len(http.sent) == 1, http.sent
        assert "manifest.json" in http.sent[0] and http.sent[0].startswith("GET ")
        assert reader_keys(reader) == expected_keys()
    assert {p.name: p.stat().st_ino for p in local_dir.glob("*.mdb")} == part_inodes  # not re-downloaded


def test_new_remote_build_makes_other_nodes_redownload(site: Site) -> None:
    node_a = site.node("node-a")
    node_a.get_or_build("ds", "v1", Builds(dataset(300)))
    first = site.node("node-b").open("ds", "v1").manifest

    node_a.remove("ds", "v1", remote=True, local=False)
    rebuilt = node_a.build("ds", "v1", dataset(300, 1000))
    assert rebuilt.freshness != first.freshness

    objects = site.objects(counting=True)
    reader = site.node("node-b", objects).get_or_build("ds", "v1", must_not_build)
    assert objects.counts()["download_file"] == len(rebuilt.parts)
    assert reader.manifest.freshness == rebuilt.freshness
    assert Manifest.load(reader.directory).freshness == rebuilt.freshness
    assert reader_keys(reader) == expected_keys(300, 1000)
    assert hidden_leftovers(site.node("node-b"), "ds") == []


def test_missing_local_copy_is_downloaded_again(site: Site) -> None:
    site.node("node-a").get_or_build("ds", "v1", Builds(dataset()))
    node_b = site.node("node-b")
    node_b.open("ds", "v1")
    node_b.remove("ds", "v1", remote=False, local=True)
    assert not node_b.local.exists("ds", "v1")
    objects = site.objects(counting=True)
    reader = site.node("node-b", objects).open("ds", "v1")
    assert objects.counts()["download_file"] == 1
    assert reader_keys(reader) == expected_keys()


def test_local_copy_with_other_build_id_is_replaced(site: Site) -> None:
    """Freshness is (created_at, build_id): a local copy that differs only in build id is stale."""
    site.node("node-a").get_or_build("ds", "v1", Builds(dataset()))
    node_b = site.node("node-b")
    local_dir = node_b.open("ds", "v1").directory
    raw = json.loads((local_dir / MANIFEST_NAME).read_text())
    raw["build_id"] = "0" * len(raw["build_id"])
    (local_dir / MANIFEST_NAME).write_text(json.dumps(raw))
    objects = site.objects(counting=True)
    reader = site.node("node-b", objects).open("ds", "v1")
    assert objects.counts()["download_file"] == 1
    assert reader.manifest.build_id != "0" * len(raw["build_id"])
    assert Manifest.load(local_dir).build_id == reader.manifest.build_id


# -- readers of the old local copy ------------------------------------------------------------
SWAP_SCRIPT = """
import sys
from tests.test_remote_sync import swap_in_subprocess
swap_in_subprocess(*sys.argv[1:])
"""


def swap_in_subprocess(kind: str, bucket: str, prefix: str, local_root: str) -> None:
    """Another process of the same node refreshes the local copy (used by SWAP_SCRIPT)."""
    import json as _json

    objects = Cloud.from_environment(kind).store(bucket, prefix)
    reader = RemoteCacheStore(objects, local_root, show_progress=False).open("ds", "v1")
    print(_json.dumps({"build_id": reader.manifest.build_id}))


def _swap_env(site: Site) -> dict[str, str]:
    return site.cloud.node_env()


def test_old_reader_keeps_reading_after_another_process_swaps_the_copy(site: Site) -> None:
    node_a = site.node("node-a")
    node_a.get_or_build("ds", "v1", Builds(dataset(300)))
    node_b = site.node("node-b")
    old_reader = node_b.open("ds", "v1")
    old_build = old_reader.manifest.build_id
    assert [element_key(e) for e in old_reader.read_elements(range(5))] == expected_keys(5)

    node_a.remove("ds", "v1", remote=True, local=False)
    new_manifest = node_a.build("ds", "v1", dataset(300, 5000))  # same record count, other bytes

    node_b_root = str(site.tmp_path / "node-b")
    swapper = start_python(SWAP_SCRIPT, site.cloud.kind, site.bucket, site.prefix, node_b_root, env=_swap_env(site))
    result = finish(swapper)
    assert result["build_id"] == new_manifest.build_id != old_build
    assert Manifest.load(old_reader.directory).build_id == new_manifest.build_id  # swapped on disk

    assert reader_keys(old_reader) == expected_keys(300)  # the old reader: old data, whole
    assert reader_keys(node_b.open("ds", "v1")) == expected_keys(300, 5000)


def test_reader_opened_before_the_swap_reads_its_own_version(site: Site) -> None:
    """A reader handed out before a refresh (a DataRef not yet iterated) still reads the version it
    was opened on -- never the new version's bytes under the old manifest."""
    node_a = site.node("node-a")
    node_a.get_or_build("ds", "v1", Builds(dataset(300)))
    node_b = site.node("node-b")
    old_reader = node_b.open("ds", "v1")  # opened, not read yet

    node_a.remove("ds", "v1", remote=True, local=False)
    node_a.build("ds", "v1", dataset(300, 5000))
    site.node("node-b").open("ds", "v1")  # another reader on the node refreshes the copy

    try:
        got = reader_keys(old_reader)
    except CorruptCacheError:
        got = None  # refusing would at least be safe; silently mixing versions is not
    assert got == expected_keys(300)


# -- integrity of downloads ------------------------------------------------------------------
def _flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


@pytest.mark.parametrize("tamper", ["flip-byte", "other-bytes", "deleted"])
def test_tampered_remote_part_is_refused_and_previous_copy_stays(site: Site, tamper: str) -> None:
    node_a = site.node("node-a", part_size_bytes=100_000)
    node_a.get_or_build("ds", "v1", Builds(dataset(1500)))
    node_b = site.node("node-b", part_size_bytes=100_000)
    previous = node_b.open("ds", "v1").manifest

    node_a.remove("ds", "v1", remote=True, local=False)
    rebuilt = node_a.build("ds", "v1", dataset(1500, 100))
    part = rebuilt.parts[len(rebuilt.parts) // 2]
    key = site.full_key(f"ds/v1/{rebuilt.build_id}-{part.name}")
    original = site.cloud.raw_get(site.bucket, key)
    if tamper == "flip-byte":
        changed = _flip_a_byte(original)
        assert len(changed) == len(original) == part.size_bytes  # passes a size check
        site.cloud.raw_put(site.bucket, key, changed)
    elif tamper == "other-bytes":
        site.cloud.raw_put(site.bucket, key, b"not an lmdb file" * 100)
    else:
        site.cloud.raw_delete(site.bucket, key)

    with pytest.raises(CorruptCacheError) as raised:
        site.node("node-b", part_size_bytes=100_000).get_or_build("ds", "v1", must_not_build)
    assert part.name in str(raised.value)

    # The previous local copy is intact and still the one on disk.
    local = site.node("node-b")
    assert Manifest.load(local.local.cache_dir("ds", "v1")).freshness == previous.freshness
    assert reader_keys(local.local.open("ds", "v1")) == expected_keys(1500)
    assert hidden_leftovers(local, "ds") == []

    # A node with no previous copy gets nothing at all (no partial cache appears).
    with pytest.raises(CorruptCacheError):
        site.node("node-c").open("ds", "v1")
    assert not site.node("node-c").local.exists("ds", "v1")
    assert hidden_leftovers(site.node("node-c"), "ds") == []


# -- leases: stale takeover, waiting for the winner --------------------------------------------
def test_stale_lease_is_taken_over(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    stale = {"owner": "dead-node:4242", "build_id": "abandoned", "expires_at": time.time() - 600}
    site.objects().write(f"ds/v1/{LEASE_NAME}", json.dumps(stale).encode())
    make = Builds(dataset())
    with caplog.at_level(logging.WARNING, logger="yogacache.store.lease"):
        reader = site.node("node-a", wait_timeout=30).get_or_build("ds", "v1", make)
    assert make.calls == 1
    assert reader_keys(reader) == expected_keys()
    assert any("dead-node:4242" in r.getMessage() for r in caplog.records)
    assert site.node("node-b").remote_manifest("ds", "v1") is not None
    lease = Lease.read(site.objects(), f"ds/v1/{LEASE_NAME}")
    assert lease is not None and lease.owner != "dead-node:4242" and lease.build_id != "abandoned"
    assert lease.expires_at == 0.0  # taken over, then released by the new builder


def test_live_lease_makes_a_node_wait_not_build(site: Site) -> None:
    live = {"owner": "busy-node:1", "build_id": "in-progress", "expires_at": time.time() + 600}
    site.objects().write(f"ds/v1/{LEASE_NAME}", json.dumps(live).encode())
    make = Builds(dataset())
    started = time.monotonic()
    with pytest.raises(BuildWaitTimeoutError):
        site.node("node-a", wait_timeout=1.0).get_or_build("ds", "v1", make)
    assert time.monotonic() - started >= 1.0
    assert make.calls == 0
    assert site.node("node-a").remote_manifest("ds", "v1") is None


def test_waiting_node_uses_the_winners_cache(site: Site) -> None:
    """While another node holds the lease, a node waits; when the holder publishes, the waiter
    downloads the holder's cache instead of building its own."""
    holder = site.node("node-a")
    lease = Lease(site.objects(), f"ds/v1/{LEASE_NAME}", "in-progress", 6.0)  # node-a's, renewed
    assert lease.try_acquire()[0]
    make = Builds(dataset(300, 1))
    result: dict[str, Any] = {}

    def wait() -> None:
        try:
            result["reader"] = site.node("node-b", wait_timeout=30).get_or_build("ds", "v1", make)
        except BaseException as error:  # reported below
            result["error"] = error

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive()  # still waiting for the holder
    with holder.local.lock("ds", "v1"):  # the holder builds and publishes, as get_or_build does
        published = holder.local.build_locked("ds", "v1", source_for(dataset(300)))
        assert holder.publish_locked(published)
    lease.release()
    waiter.join(30)
    assert "error" not in result, result.get("error")
    assert make.calls == 0
    assert result["reader"].manifest.freshness == published.freshness
    assert reader_keys(result["reader"]) == expected_keys(300)


def test_missing_bucket_is_reported_not_waited_on_or_built(cloud: Cloud, tmp_path: Path) -> None:
    from tests.cloud_helpers import FAST_RETRY

    objects = cloud.store(unique("no-such-bucket"), PREFIX, retry=FAST_RETRY)
    store = RemoteCacheStore(objects, tmp_path / "node", poll_seconds=0.1, wait_timeout=3.0, show_progress=False)
    make = Builds(dataset())
    with pytest.raises(RemoteError):
        store.get_or_build("ds", "v1", make)
    assert make.calls == 0


# -- progress --------------------------------------------------------------------------------
def test_transfers_report_bytes_rate_and_eta(site: Site, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        site.node("node-a", show_progress=True).get_or_build("ds", "v1", Builds(dataset(1500)))
        site.node("node-b", show_progress=True).open("ds", "v1")
    lines = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    upload = [line for line in lines if line.startswith("uploading ds:v1")]
    download = [line for line in lines if line.startswith("downloading ds:v1")]
    assert upload and download, lines
    size = site.node("node-b").local.manifest("ds", "v1").total_size_bytes
    from yogacache.progress import format_bytes

    for line in (upload[-1], download[-1]):
        assert f"{format_bytes(size)} of {format_bytes(size)}" in line
        assert "/s" in line and ("ETA" in line or line.endswith(", done)"))  # the last line: done


# -- DataLayer configs, end to end --------------------------------------------------------------
def test_datalayer_config_end_to_end_with_container_path(site: Site) -> None:
    import tensorflow as tf

    import yogacache

    n = 301
    host = site.tmp_path / "host-cache"
    container = site.tmp_path / "container-cache"
    config = site.cloud.config(
        site.bucket,
        site.prefix,
        local_cache_host_path=str(host),
        local_cache_container_path=str(container),
    )
    layer = yogacache.DataLayer.from_config(config, rank=0, num_shards=1, seed=3, show_progress=False)
    calls = []

    @layer.cache_train_dataset("imagenet", "v1")
    def make_dataset() -> Any:
        calls.append(1)
        data = dataset(n)
        return tf.data.Dataset.from_tensor_slices(
            (np.stack([a for a, _ in data]), np.array([label for _, label in data], np.int64))
        )

    ds = make_dataset()
    assert isinstance(ds, tf.data.Dataset)
    got = [(a.numpy().tobytes(), int(b.numpy())) for a, b in ds]
    assert got == expected_keys(n)
    assert calls == [1]

    # The process sees the container path; the host path is the same directory seen from outside.
    assert (container / LOCAL_CACHE_DIR / "imagenet" / "v1_train" / MANIFEST_NAME).is_file()
    assert not host.exists() or not any(host.rglob(MANIFEST_NAME))
    assert site.full_key(f"imagenet/v1_train/{MANIFEST_NAME}") in site.keys()

    # Another node (another container path), rank 1 of 2: no build, its shard of the same data.
    other = site.cloud.config(
        site.bucket,
        site.prefix,
        local_cache_host_path=str(site.tmp_path / "host-2"),
        local_cache_container_path=str(site.tmp_path / "container-2"),
    )
    layer2 = yogacache.DataLayer.from_config(other, rank=1, num_shards=2, seed=3, show_progress=False)

    @layer2.cache_train_dataset("imagenet", "v1")
    def never() -> Any:
        raise AssertionError("the second node must not build")

    labels = [int(b.numpy()) for _, b in never()]
    assert labels == list(range(1, n - 1, 2))  # strided shard, remainder dropped
    assert (site.tmp_path / "container-2" / LOCAL_CACHE_DIR / "imagenet" / "v1_train" / MANIFEST_NAME).is_file()


def test_datalayer_s3_config_uses_standard_endpoint_and_credential_chain(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No endpoint_url, access_key or secret_key in the config: AWS_ENDPOINT_URL and the
    AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY chain are used."""
    import yogacache

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    bucket = s3_server.new_bucket()
    layer = yogacache.DataLayer.from_config(
        {"type": "s3", "bucket": bucket, "bucket_directory_path": "dl", "local_cache_host_path": str(tmp_path / "h"),
         "local_cache_container_path": str(tmp_path / "c")},
        show_progress=False,
    )
    ref = layer.dataref("ds", "v1", Builds(dataset()))
    assert [element_key(e) for e in ref.stream()] == expected_keys()
    keys = Cloud("s3", s3_server).raw_keys(bucket)
    assert "dl/ds/v1/manifest.json" in keys


def test_secrets_never_appear_in_reprs(s3_server: Any, tmp_path: Path) -> None:
    import yogacache
    from yogacache.config import parse_config

    secret = "SUPER-secret-value-987"
    config = {
        "type": "s3",
        "bucket": s3_server.new_bucket(),
        "bucket_directory_path": "x",
        "endpoint_url": s3_server.endpoint_url,
        "access_key": "AKIA-visible-id",
        "secret_key": secret,
        "local_cache_host_path": str(tmp_path / "h"),
        "local_cache_container_path": str(tmp_path / "c"),
    }
    layer = yogacache.DataLayer.from_config(config, show_progress=False)
    for text in (repr(parse_config(config)), repr(layer), repr(layer.store), repr(layer.store.objects)):
        assert secret not in text


# -- YogaDL facade -----------------------------------------------------------------------------
def _facade(site: Site, local: Path, **extra: Any) -> Any:
    from yogacache.storage import GCSConfigurations, GCSStorage, S3Configurations, S3Storage

    if site.cloud.kind == "s3":
        configurations = S3Configurations(
            site.bucket, site.prefix, endpoint_url=site.cloud.server.endpoint_url, local_cache_dir=str(local), **extra
        )
        return S3Storage(configurations)
    return GCSStorage(GCSConfigurations(site.bucket, site.prefix, local_cache_dir=str(local), **extra))


@YOGADL_CLOUDS
def test_yogadl_facade_warns_about_coordinator_arguments(site: Site) -> None:
    with pytest.warns(UserWarning, match="coordinator"):
        _facade(site, site.tmp_path / "a", url="https://coordinator.example:8080")
    with pytest.warns(UserWarning, match="coordinator"):
        _facade(site, site.tmp_path / "a", coordinator_cert_file="/etc/cert.pem", coordinator_cert_name="master")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _facade(site, site.tmp_path / "a")  # no coordinator arguments: no warning


@YOGADL_CLOUDS
def test_yogadl_facade_submit_fetch_cacheable(site: Site) -> None:
    with pytest.warns(UserWarning):
        storage_a = _facade(site, site.tmp_path / "node-a", url="https://coordinator.example:8080")
    storage_a.submit(dataset(), "ds", "v1")
    assert site.full_key(f"ds/v1/{MANIFEST_NAME}") in site.keys()
    assert (site.tmp_path / "node-a" / LOCAL_CACHE_DIR / "ds" / "v1" / MANIFEST_NAME).is_file()
    storage_a.submit(dataset(300, 1), "ds", "v1")  # replaces the published cache, as YogaDL documents

    storage_b = _facade(site, site.tmp_path / "node-b")
    ref = storage_b.fetch("ds", "v1")
    assert [element_key(e) for e in ref.stream()] == expected_keys(300, 1)
    assert (site.tmp_path / "node-b" / LOCAL_CACHE_DIR / "ds" / "v1" / MANIFEST_NAME).is_file()

    calls = []

    @storage_b.cacheable("other", "v2")
    def make() -> Any:
        calls.append(1)
        return dataset(50, 9)

    first = make()
    second = make()
    assert calls == [1]
    assert [element_key(e) for e in second.stream(shard_rank=1, num_shards=2)] == expected_keys(50, 9)[1::2]
    assert len(first) == 50

    @storage_a.cacheable("other", "v2")
    def make_on_a() -> Any:
        raise AssertionError("already published by node b")

    assert [element_key(e) for e in make_on_a().stream()] == expected_keys(50, 9)


# -- several node processes at once --------------------------------------------------------------
NODE_SCRIPT = """
import json, os, sys, time
import numpy as np
kind, bucket, prefix, local, markers, go = sys.argv[1:7]
from yogacache.storage import GCSConfigurations, GCSStorage, S3Configurations, S3Storage
from tests.cloud_helpers import digest_of_keys, element_key
if kind == "s3":
    endpoint = os.environ["TEST_S3_ENDPOINT"]
    storage = S3Storage(S3Configurations(bucket, prefix, endpoint_url=endpoint, local_cache_dir=local))
else:
    storage = GCSStorage(GCSConfigurations(bucket, prefix, local_cache_dir=local))
storage.store.poll_seconds = 0.1
storage.store.show_progress = False

@storage.cacheable("shared", "v1")
def make():
    with open(os.path.join(markers, f"built-by-{os.getpid()}"), "x"):
        pass
    time.sleep(1.0)  # widen the window in which the other nodes look for the cache
    return [(np.full(100, i, np.int32), i) for i in range(300)]

deadline = time.time() + 60
while not os.path.exists(go) and time.time() < deadline:
    time.sleep(0.01)
ref = make()
keys = [element_key(e) for e in ref.stream()]
print(json.dumps({"pid": os.getpid(), "digest": digest_of_keys(keys), "n": len(keys),
                  "dir": str(ref.reader.directory)}))
"""


@YOGADL_CLOUDS
def test_concurrent_nodes_build_exactly_once(site: Site) -> None:
    markers = site.tmp_path / "markers"
    markers.mkdir()
    go = site.tmp_path / "go"
    nodes = [
        start_python(
            NODE_SCRIPT,
            site.cloud.kind,
            site.bucket,
            site.prefix,
            str(site.tmp_path / f"node-{i}"),
            str(markers),
            str(go),
            env=_swap_env(site),
        )
        for i in range(3)
    ]
    time.sleep(2.0)  # let every node import and reach the starting line
    go.touch()
    results = [finish(node) for node in nodes]

    built = sorted(p.name for p in markers.iterdir())
    assert len(built) == 1, built
    assert built[0] in {f"built-by-{r['pid']}" for r in results}
    expected = digest_of_keys(expected_keys(300))
    assert [r["digest"] for r in results] == [expected] * 3
    assert [r["n"] for r in results] == [300] * 3
    # Each node read its own local copy.
    assert sorted(r["dir"] for r in results) == sorted(
        str(site.tmp_path / f"node-{i}" / LOCAL_CACHE_DIR / "shared" / "v1") for i in range(3)
    )
    manifests = [k for k in site.keys() if k.endswith(MANIFEST_NAME)]
    assert manifests == [site.full_key(f"shared/v1/{MANIFEST_NAME}")]
