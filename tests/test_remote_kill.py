"""Real SIGKILLs of nodes publishing to and syncing from a real S3 server (moto, a subprocess).

Each "node" is a separate local directory; the node under test runs in a child process
(``sys.executable -c``) that talks to the server through ``tests.faultproxy.FaultProxy``, whose
delay rule slows its transfers down so that the kill lands mid-transfer. The delay is applied
before forwarding, and a delayed request whose client died is dropped: nothing the dead node
sent lands in the bucket after the kill.

- Killed while uploading: no manifest is published, readers see no cache, the next builder
  (another node, after the dead node's short lease expired) builds and publishes a complete
  cache, and the dead build's part objects are deleted.
- Killed while downloading a newer build: the node's previous local copy is intact, verifies
  and reads its data; the next sync completes the new build and removes the leftovers.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.faultproxy import FaultProxy
from yogacache.backends.base import RetryPolicy
from yogacache.backends.s3 import S3ObjectStore
from yogacache.errors import CacheNotFoundError
from yogacache.format.durability import leftovers_of
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.remote import LEASE_NAME, LOCAL_CACHE_DIR, RemoteCacheStore

REPO = Path(__file__).resolve().parent.parent
PREFIX = "caches"
DS, VER = "killed", "v1"
N = 160  # about ten parts of PART_SIZE
PART_SIZE = 16 << 10
LEASE_SECONDS = 2.0
DELAY = 1.0  # per slowed request; two transfer threads
OLD, NEW = 0, 1000

NODE = textwrap.dedent(
    """
    import sys
    import numpy as np
    from yogacache.store.remote import RemoteCacheStore
    from yogacache.backends.base import RetryPolicy
    from yogacache.backends.s3 import S3ObjectStore

    mode, bucket, endpoint, root, done, n, offset = sys.argv[1:8]
    n, offset = int(n), int(offset)

    def data():
        return [(np.int64(i + offset), np.full(256, i + offset, dtype=np.int32)) for i in range(n)]

    store = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=endpoint,
                      retry=RetryPolicy(attempts=3, base_delay=0.05), timeout=30),
        root, part_size_bytes=16 << 10, lease_seconds=float(sys.argv[8]), poll_seconds=0.2,
        transfer_threads=2, show_progress=False,
    )
    if mode == "build":
        reader = store.get_or_build("killed", "v1", data)
    else:
        reader = store.open("killed", "v1")
    with open(done, "w") as out:
        out.write(reader.manifest.build_id)
    """
)


@pytest.fixture
def s3_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's moto server, stopped after the test."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy


def records(offset: int, n: int = N) -> list[tuple[np.int64, np.ndarray]]:
    return [(np.int64(i + offset), np.full(256, i + offset, dtype=np.int32)) for i in range(n)]


def check_data(reader: Any, offset: int, n: int = N) -> None:
    ids, xs = reader.read_columns(np.arange(n))
    np.testing.assert_array_equal(ids, np.arange(n) + offset)
    np.testing.assert_array_equal(xs, np.broadcast_to((np.arange(n) + offset)[:, None], (n, 256)))
    reader.close()


def node(bucket: str, endpoint: str, root: Path, **kwargs: Any) -> RemoteCacheStore:
    objects = S3ObjectStore(bucket, PREFIX, endpoint_url=endpoint, retry=RetryPolicy(attempts=3, base_delay=0.05))
    kwargs.setdefault("lease_seconds", LEASE_SECONDS)
    kwargs.setdefault("poll_seconds", 0.1)
    kwargs.setdefault("wait_timeout", 60)
    return RemoteCacheStore(objects, root, part_size_bytes=PART_SIZE, show_progress=False, **kwargs)


def bucket_keys(s3_server: Any, bucket: str) -> set[str]:
    client = s3_server.client()
    keys = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys |= {item["Key"] for item in page.get("Contents", [])}
    return keys


def spawn(mode: str, bucket: str, endpoint: str, root: Path, done: Path, offset: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                NODE,
                mode,
                bucket,
                endpoint,
                str(root),
                str(done),
                str(N),
                str(offset),
                str(LEASE_SECONDS),
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def kill_when(process: subprocess.Popen, condition: Callable[[], bool], log: Path, timeout: float = 60) -> None:
    """SIGKILLs ``process`` as soon as ``condition()`` holds; fails if it ends or times out first."""
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:
            pytest.fail(f"the node exited ({process.returncode}) before the kill: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"the kill condition never came: {log.read_text()[-3000:]}")
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def reap(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def test_sigkill_during_upload_publishes_nothing_and_the_next_builder_finishes(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3_server.new_bucket()
    cache = f"{PREFIX}/{DS}/{VER}/"
    s3_proxy.add_rule(action="delay", method="PUT", path_contains="-part-", seconds=DELAY)
    root_a, done, log = tmp_path / "node-a", tmp_path / "node-a.done", tmp_path / "node-a.log"

    process = spawn("build", bucket, s3_proxy.url, root_a, done, OLD, log)
    try:
        kill_when(process, lambda: any("-part-" in key for key in bucket_keys(s3_server, bucket)), log)
    finally:
        reap(process)
    assert not done.exists()

    # The dead node had sealed its local copy before uploading: that is the build it was publishing.
    killed = Manifest.load(root_a / LOCAL_CACHE_DIR / DS / VER)
    assert len(killed.parts) >= 6
    time.sleep(DELAY + 0.5)  # whatever it still had in flight is dropped, not stored late
    keys = bucket_keys(s3_server, bucket)
    parts = {key for key in keys if "-part-" in key}
    assert cache + MANIFEST_NAME not in keys  # never published
    assert cache + LEASE_NAME in keys  # its lease is left to expire
    assert parts and all(key.startswith(cache + killed.build_id + "-part-") for key in parts)
    assert len(parts) < len(killed.parts)  # the kill came mid-upload

    # A reader sees no cache: not the dead node's parts, not a half-published one.
    reader_node = node(bucket, s3_server.endpoint_url, tmp_path / "reader")
    with pytest.raises(CacheNotFoundError):
        reader_node.open(DS, VER)
    assert reader_node.remote_manifest(DS, VER) is None

    # The next builder takes the dead builder's lease over (at once: the builder ran on this
    # node, and its process is gone; another node would wait out the lease), builds and publishes.
    calls = []

    def make_data() -> list[tuple[np.int64, np.ndarray]]:
        calls.append(1)
        return records(NEW)

    caplog.set_level(logging.INFO, logger="yogacache")
    node_c = node(bucket, s3_server.endpoint_url, tmp_path / "node-c")
    check_data(node_c.get_or_build(DS, VER, make_data), NEW)
    assert calls == [1]
    assert "its process on this node has exited" in caplog.text
    published = node_c.remote_manifest(DS, VER)
    assert published is not None and published.build_id != killed.build_id
    assert published.num_records == N

    # Only the published build's parts remain: the dead build's orphans were deleted.
    expected = {cache + MANIFEST_NAME, cache + LEASE_NAME}
    expected |= {cache + f"{published.build_id}-{part.name}" for part in published.parts}
    assert bucket_keys(s3_server, bucket) == expected
    lease = json.loads(s3_server.client().get_object(Bucket=bucket, Key=cache + LEASE_NAME)["Body"].read())
    assert lease["expires_at"] <= time.time()  # released

    # Every node, the restarted dead one included, reads the published build.
    check_data(reader_node.open(DS, VER), NEW)
    node_a = node(bucket, s3_server.endpoint_url, root_a)
    check_data(node_a.open(DS, VER), NEW)
    assert node_a.local.verify_cache(DS, VER).freshness == published.freshness
    assert leftovers_of(node_a.local.cache_dir(DS, VER)) == []


def test_sigkill_during_download_keeps_the_previous_local_copy(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    node_a = node(bucket, s3_server.endpoint_url, tmp_path / "node-a")
    root_b = tmp_path / "node-b"
    node_b = node(bucket, s3_server.endpoint_url, root_b)
    build1 = node_a.build(DS, VER, records(OLD))
    check_data(node_b.open(DS, VER), OLD)  # B holds build 1
    node_a.remove(DS, VER, remote=True, local=False)
    build2 = node_a.build(DS, VER, records(NEW))
    assert len(build2.parts) >= 6

    target = node_b.local.cache_dir(DS, VER)
    s3_proxy.add_rule(action="delay", method="GET", path_contains="-part-", seconds=DELAY)
    done, log = tmp_path / "node-b.done", tmp_path / "node-b.log"

    def some_part_downloaded() -> bool:
        return any((temp / part.name).is_file() for temp in leftovers_of(target) for part in build2.parts)

    process = spawn("sync", bucket, s3_proxy.url, root_b, done, NEW, log)
    try:
        kill_when(process, some_part_downloaded, log)
    finally:
        reap(process)
    assert not done.exists()

    # Killed mid-download: its temporary directory is left, incomplete...
    (temp,) = leftovers_of(target)
    assert not (temp / MANIFEST_NAME).exists()
    assert sum((temp / part.name).is_file() for part in build2.parts) < len(build2.parts)
    # ... and the previous copy is whole: it verifies and reads build 1.
    assert node_b.local.verify_cache(DS, VER).freshness == build1.freshness
    check_data(node_b.local.open(DS, VER), OLD)

    # The next sync completes build 2 and removes the leftovers.
    check_data(node_b.open(DS, VER), NEW)
    assert node_b.local.verify_cache(DS, VER).freshness == build2.freshness
    assert leftovers_of(target) == []
