"""Mirrors: nodes read a cache from the nearest mirror holding the origin's current build; when the
nearest lacks it, one node copies it there (under the mirror's build lease) and the others wait.

The origin is a bucket on the second moto server behind the fault proxy, which counts the part
reads that reach it; the near mirror is a GCS bucket, a middle one a bucket on the first moto
server.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, reader_keys, unique
from tests.faultproxy import FaultProxy
from yogacache.backends.gcs import GCSObjectStore
from yogacache.backends.s3 import S3ObjectStore
from yogacache.errors import ConfigError
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store import open_store
from yogacache.store.copy import copy_cache
from yogacache.store.mirrors import MirroredCacheStore
from yogacache.store.remote import RemoteCacheStore, read_origin

PART_SIZE = 100_000
N = 800


class World:
    def __init__(self, s3_server: Any, s3_server_b: Any, gcs_server: Any, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.far_cloud, self.mid_cloud, self.near_cloud = (
            Cloud("s3", s3_server_b),
            Cloud("s3", s3_server),
            Cloud("gcs", gcs_server),
        )
        self.far_bucket, self.mid_bucket, self.near_bucket = (
            self.far_cloud.new_bucket(),
            self.mid_cloud.new_bucket(),
            self.near_cloud.new_bucket(),
        )
        self.proxy = FaultProxy(s3_server_b.endpoint_url)
        self.far_direct = S3ObjectStore(self.far_bucket, "caches", endpoint_url=s3_server_b.endpoint_url)
        self.far = S3ObjectStore(self.far_bucket, "caches", endpoint_url=self.proxy.url)
        self.mid = S3ObjectStore(self.mid_bucket, "caches", endpoint_url=s3_server.endpoint_url)
        self.near = GCSObjectStore(self.near_bucket, "caches")

    def publish(self, objects: Any, fill: int = 0) -> Manifest:
        builder = RemoteCacheStore(
            objects, self.tmp_path / unique("builder"), part_size_bytes=PART_SIZE, show_progress=False
        )
        return builder.get_or_build("ds", "v1", lambda: dataset(N, fill)).manifest

    def node(self, mirrors: list[Any], root: Path | None = None) -> MirroredCacheStore:
        return MirroredCacheStore(
            self.far,
            mirrors,
            root or self.tmp_path / unique("node"),
            part_size_bytes=PART_SIZE,
            show_progress=False,
            poll_seconds=0.05,
            wait_timeout=120,
        )

    def far_part_reads(self) -> int:
        """GETs of part objects the far storage answered (a delayed GET whose client hung up,
        which the proxy may log late, after a clear_log, read nothing)."""
        found = self.proxy.requests(method="GET", path_contains="-part-")
        return len([entry for entry in found if entry.action != "delay-dropped"])

    def near_manifest(self) -> Manifest | None:
        found = self.near.read(f"ds/v1/{MANIFEST_NAME}")
        return Manifest.from_bytes(found[0], "near") if found else None


@pytest.fixture
def world(s3_server: Any, s3_server_b: Any, gcs_server: Any, tmp_path: Path) -> Any:
    made = World(s3_server, s3_server_b, gcs_server, tmp_path)
    yield made
    made.proxy.stop()


def test_an_empty_near_mirror_is_filled_once_while_the_other_nodes_wait(world: World) -> None:
    current = world.publish(world.far_direct)
    readers: list[list[Any]] = []
    errors: list[BaseException] = []
    roots = [world.tmp_path / f"node{i}" for i in range(3)]
    start = threading.Barrier(3)

    def run(root: Path) -> None:
        start.wait()
        try:
            readers.append(reader_keys(world.node([world.near], root).open("ds", "v1")))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(root,)) for root in roots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert errors == []
    assert readers == [expected_keys(N)] * 3
    near = world.near_manifest()
    assert near is not None and near.freshness == current.freshness
    # Exactly one copy read the parts from the far origin; every node downloaded from the near mirror.
    assert world.far_part_reads() == len(current.parts)
    for root in roots:
        assert read_origin(root / "yogadl_local_cache" / "ds" / "v1") == world.near.url()
    # A node arriving later reads nothing from far away either.
    assert reader_keys(world.node([world.near]).open("ds", "v1")) == expected_keys(N)
    assert world.far_part_reads() == len(current.parts)


def test_a_stale_near_mirror_is_replaced_with_the_current_build(world: World) -> None:
    old = world.publish(world.near, fill=5)
    current = world.publish(world.far_direct)
    assert old.build_id != current.build_id
    reader = world.node([world.near]).get_or_build("ds", "v1", lambda: pytest.fail("must not build"))
    assert reader_keys(reader) == expected_keys(N)
    near = world.near_manifest()
    assert near is not None and near.freshness == current.freshness
    keys = [info.key for info in world.near.list("ds/v1/")]
    assert not any(old.build_id in key for key in keys)  # the stale build's parts are gone


def test_a_current_near_mirror_is_read_and_the_origin_sends_no_part(world: World) -> None:
    current = world.publish(world.far_direct)
    copy_cache(world.far_direct, world.near, "ds", "v1", show_progress=False)
    world.proxy.clear_log()
    assert reader_keys(world.node([world.near]).open("ds", "v1")) == expected_keys(N)
    assert world.far_part_reads() == 0
    assert len(world.proxy.requests(method="GET", path_contains=MANIFEST_NAME)) >= 1  # which build: the origin says
    assert world.near_manifest().freshness == current.freshness  # type: ignore[union-attr]


def test_the_near_mirror_is_filled_from_the_nearest_place_holding_the_build(world: World) -> None:
    world.publish(world.far_direct)
    copy_cache(world.far_direct, world.mid, "ds", "v1", show_progress=False)
    world.proxy.clear_log()
    assert reader_keys(world.node([world.near, world.mid]).open("ds", "v1")) == expected_keys(N)
    assert world.far_part_reads() == 0
    assert world.near_manifest() is not None


def test_a_mirror_that_cannot_be_used_falls_back_to_the_origin(
    world: World, gcs_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    world.publish(world.far_direct)
    missing = GCSObjectStore(f"no-such-bucket-{unique('x')}", "caches")
    with caplog.at_level(logging.WARNING, logger="yogacache.store.mirrors"):
        assert reader_keys(world.node([missing]).open("ds", "v1")) == expected_keys(N)
    assert "reading it from further away" in caplog.text


def test_mirrors_in_the_config_and_in_ls(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from yogacache.cli import main

    current = world.publish(world.far_direct)
    copy_cache(world.far_direct, world.mid, "ds", "v1", show_progress=False)
    config = dict(
        world.far_cloud.config(world.far_bucket, "caches"),
        local_cache_host_path=str(tmp_path / "local"),
        local_cache_container_path=str(tmp_path / "local"),
        mirrors=[
            {"type": "gcs", "bucket": world.near_bucket, "bucket_directory_path": "caches"},
            world.mid_cloud.config(world.mid_bucket, "caches"),
        ],
    )
    store = open_store(config, show_progress=False)
    assert isinstance(store, MirroredCacheStore)
    path = tmp_path / "storage.json"
    path.write_text(json.dumps(config))
    assert main(["ls", "--storage", str(path)]) == 0
    out = capsys.readouterr().out
    assert "origin" in out and "empty" in out and "mirror" in out and current.build_id[:8] in out
    assert "testing-secret" not in out
    assert main(["ls", "--json", "--storage", str(path)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert [(m["role"], m["build_id"]) for m in row["mirrors"]] == [
        ("origin", current.build_id),
        ("empty", None),  # the near mirror, not filled yet
        ("mirror", current.build_id),
    ]
    assert row["mirrors"][0]["storage"] == store.remote_url
    assert reader_keys(store.open("ds", "v1")) == expected_keys(N)  # fills the near one
    assert main(["ls", "--storage", str(path)]) == 0
    out = capsys.readouterr().out
    assert "empty" not in out
    # The local copy came from the near mirror: the storage lists it as its own.
    assert main(["ls", "--json", "--storage", str(path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["dataset_id"], r["local_current"]) for r in rows] == [("ds", True)]
    assert rows[0]["local_path"] is not None
    assert [m["role"] for m in rows[0]["mirrors"]] == ["origin", "mirror", "mirror"]


@pytest.mark.parametrize(
    ("mirrors", "message"),
    [
        ("near", "data_layer.mirrors must be a list"),
        (["x"], r"data_layer.mirrors\[0\] must be a storage config mapping"),
        ([{"type": "shared_fs", "host_storage_path": "/data"}], r"mirrors\[0\] must be an azure, gcs or s3 storage"),
        ([{"type": "gcs", "bucket": "b", "mirrors": []}], r"mirrors\[0\] may not set mirrors"),
        ([{"type": "gcs", "buckt": "b"}], r"mirrors\[0\]: unknown data_layer keys.*did you mean bucket"),
    ],
)
def test_bad_mirror_configs_are_clear_errors(mirrors: Any, message: str) -> None:
    from yogacache.config import parse_config

    with pytest.raises(ConfigError, match=message):
        parse_config({"type": "s3", "bucket": "origin", "bucket_directory_path": "c", "mirrors": mirrors})


NODE_CODE = """
import sys
from pathlib import Path
from yogacache.backends.gcs import GCSObjectStore
from yogacache.backends.s3 import S3ObjectStore
from yogacache.store.mirrors import MirroredCacheStore

far_bucket, far_endpoint, near_bucket, root = sys.argv[1:5]
store = MirroredCacheStore(
    S3ObjectStore(far_bucket, "caches", endpoint_url=far_endpoint),
    [GCSObjectStore(near_bucket, "caches")],
    Path(root), part_size_bytes=100_000, show_progress=False, lease_seconds=2.0, poll_seconds=0.05,
)
store.open("ds", "v1")
print("{}")
"""


@pytest.mark.slow
def test_a_node_killed_while_filling_the_near_mirror_is_taken_over(world: World) -> None:
    import signal
    import time

    from tests.cloud_helpers import start_python

    current = world.publish(world.far_direct)
    last = current.parts[-1].name  # held back: the filler is killed while it waits for it
    world.proxy.add_rule(action="delay", method="GET", path_contains=last, seconds=60)
    filler = start_python(NODE_CODE, world.far_bucket, world.proxy.url, world.near_bucket, str(world.tmp_path / "a"))
    deadline = time.monotonic() + 60
    while len([i for i in world.near.list("ds/v1/") if "-part-" in i.key]) < len(current.parts) - 1:
        assert filler.poll() is None, filler.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the filling node made no progress"
        time.sleep(0.05)
    filler.send_signal(signal.SIGKILL)
    filler.communicate(timeout=30)
    assert world.near_manifest() is None  # half a copy is never visible
    world.proxy.clear_log()
    world.proxy.clear_rules()
    node = MirroredCacheStore(
        world.far,
        [world.near],
        world.tmp_path / "b",
        part_size_bytes=PART_SIZE,
        show_progress=False,
        lease_seconds=2.0,
        poll_seconds=0.05,
        wait_timeout=120,
    )
    assert reader_keys(node.open("ds", "v1")) == expected_keys(N)  # took the stale lease over
    assert world.near_manifest().freshness == current.freshness  # type: ignore[union-attr]
    assert world.far_part_reads() == 1  # only the part held back: the others were kept
