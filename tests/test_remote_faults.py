"""Faults never turn into data loss: object-store errors through a fault-injecting proxy.

Every test runs against a real server (moto's S3 server, fake-gcs-server or Azurite, as subprocesses)
with ``tests.faultproxy.FaultProxy`` in front of it: injected 403s, 5xx, delays longer than the
client's timeout, connection resets and truncated bodies. The invariants:

- a fault on reading a manifest is retried with backoff; if it persists it is reported as
  RemoteError naming ``s3://bucket/prefix/id/version/manifest.json`` and holding no secret, and
  it is never read as "cache absent": the dataset is not rebuilt, nothing in the bucket
  changes, a local copy stays intact;
- a fault on downloading a part is retried; it ends in the right data or an error, never in a
  corrupt or half-swapped local copy;
- a part object altered or swapped in the bucket is refused by its hash.

The bucket is always inspected and altered through the server directly, never through the proxy.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud
from tests.faultproxy import FaultProxy, gcs_error_body
from yogacache.backends.base import RemoteError, RetryPolicy, TransferCancelled, stop_retries_when
from yogacache.backends.gcs import GCSObjectStore
from yogacache.backends.s3 import S3ObjectStore
from yogacache.errors import CacheNotFoundError, CorruptCacheError
from yogacache.format.durability import leftovers_of
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.remote import RemoteCacheStore

PREFIX = "caches"
DS, VER = "faults", "v1"
N = 48
OLD, NEW = 0, 1000  # value offsets of build 1 and build 2
PART_SIZE = 32 << 10  # several parts per cache (about 8 records a part; 16 KiB held one)
FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05)
MANIFEST_PATH = f"{PREFIX}/{DS}/{VER}/{MANIFEST_NAME}"


# -- data ---------------------------------------------------------------------------------
def records(offset: int, n: int = N) -> list[tuple[np.int64, np.ndarray]]:
    return [(np.int64(i + offset), np.full(256, i + offset, dtype=np.int32)) for i in range(n)]


class Maker:
    """A ``make_data`` callable that counts its calls."""

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.calls = 0

    def __call__(self) -> list[tuple[np.int64, np.ndarray]]:
        self.calls += 1
        return records(self.offset)


def check_data(reader: Any, offset: int, n: int = N) -> None:
    ids, xs = reader.read_columns(np.arange(n))
    np.testing.assert_array_equal(ids, np.arange(n) + offset)
    np.testing.assert_array_equal(xs, np.broadcast_to((np.arange(n) + offset)[:, None], (n, 256)))
    reader.close()


def check_local(store: RemoteCacheStore, build: Manifest, offset: int) -> None:
    """The node's local copy is exactly ``build``, verifies in full and reads its data."""
    manifest = store.local.verify_cache(DS, VER)
    assert manifest.freshness == build.freshness
    check_data(store.local.open(DS, VER), offset)
    assert leftovers_of(store.local.cache_dir(DS, VER)) == []


# -- S3 helpers ---------------------------------------------------------------------------
def s3_node(bucket: str, endpoint: str, root: Path, *, timeout: float = 10.0, **kwargs: Any) -> RemoteCacheStore:
    objects = S3ObjectStore(
        bucket,
        PREFIX,
        endpoint_url=endpoint,
        access_key=os.environ["AWS_ACCESS_KEY_ID"],  # given explicitly: they must not leak either
        secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        retry=FAST,
        timeout=timeout,
    )
    kwargs.setdefault("part_size_bytes", PART_SIZE)
    kwargs.setdefault("wait_timeout", 20)
    kwargs.setdefault("poll_seconds", 0.1)
    return RemoteCacheStore(objects, root, show_progress=False, **kwargs)


def snapshot(s3_server: Any, bucket: str) -> dict[str, bytes]:
    """Every object of the bucket with its bytes, read from the server directly."""
    client = s3_server.client()
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def assert_secret_free(text: str, s3_server: Any) -> None:
    assert s3_server.secret_key not in text
    assert s3_server.access_key not in text


def error_text(error: BaseException) -> str:
    """The message and the whole printed traceback, chained exceptions included."""
    return str(error) + "".join(traceback.format_exception(type(error), error, error.__traceback__))


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def s3_proxy(s3_server: Any) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's moto server, stopped after the test."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        yield proxy


@pytest.fixture
def published(s3_server: Any, tmp_path: Path) -> Iterator[tuple[str, Manifest]]:
    """A bucket holding a published build 1 (values offset OLD), built by node A directly."""
    bucket = s3_server.new_bucket()
    node_a = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-a")
    manifest = node_a.build(DS, VER, records(OLD))
    assert len(manifest.parts) >= 3
    yield bucket, manifest


@pytest.fixture
def two_builds(s3_server: Any, tmp_path: Path) -> Iterator[tuple[str, Manifest, Manifest, dict[str, bytes]]]:
    """Node B holds a local copy of build 1; the bucket now publishes build 2 (offset NEW).

    Also returns build 1's part objects as they were published (for swapping).
    """
    bucket = s3_server.new_bucket()
    node_a = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-a")
    node_b = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-b")
    build1 = node_a.build(DS, VER, records(OLD))
    check_data(node_b.open(DS, VER), OLD)
    build1_objects = snapshot(s3_server, bucket)
    node_a.remove(DS, VER, remote=True, local=False)
    build2 = node_a.build(DS, VER, records(NEW))
    assert build2.build_id != build1.build_id
    assert len(build2.parts) >= 3
    yield bucket, build1, build2, build1_objects


# -- GET manifest: transient faults are retried ---------------------------------------------
@pytest.mark.parametrize("status", [500, 503])
def test_transient_5xx_on_manifest_get_is_retried_without_rebuild(
    s3_server: Any, s3_proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path, status: int
) -> None:
    bucket, build = published
    before = snapshot(s3_server, bucket)
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    s3_proxy.add_rule(action="status", method="GET", path_contains=MANIFEST_NAME, status=status, times=2)
    maker = Maker(NEW)

    check_data(node_b.get_or_build(DS, VER, maker), OLD)

    assert maker.calls == 0
    gets = s3_proxy.requests("GET", MANIFEST_NAME)
    # The manifest is read with a size cap (a ranged GET): its success is 206 Partial Content.
    assert [entry.status for entry in gets] == [status, status, 206]
    assert [entry.action for entry in gets] == ["status", "status", "forwarded"]
    assert f"/{bucket}/{MANIFEST_PATH}" in gets[0].target
    assert gets[1].time > gets[0].time and gets[2].time > gets[1].time
    assert s3_proxy.requests("PUT") == []  # nothing was built, no lease was taken
    assert snapshot(s3_server, bucket) == before
    check_local(node_b, build, OLD)


# -- GET manifest: persistent faults are reported, never read as "absent" ----------------------
FAULTS: dict[str, dict[str, Any]] = {
    "500": {"action": "status", "status": 500},
    "403": {"action": "status", "status": 403},
    "reset": {"action": "reset"},
    "timeout": {"action": "delay", "seconds": 6.0},
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_persistent_fault_on_published_manifest_is_reported_not_rebuilt(
    s3_server: Any,
    s3_proxy: FaultProxy,
    published: tuple[str, Manifest],
    tmp_path: Path,
    fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket, build = published
    root = tmp_path / "node-b"
    # Node B synced build 1 while the network was fine.
    check_data(s3_node(bucket, s3_server.endpoint_url, root).open(DS, VER), OLD)
    before = snapshot(s3_server, bucket)

    node_b = s3_node(bucket, s3_proxy.url, root, timeout=1.0)
    s3_proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, **FAULTS[fault])
    maker = Maker(NEW)
    caplog.set_level(logging.DEBUG, logger="yogacache")

    with pytest.raises(RemoteError) as raised:
        node_b.get_or_build(DS, VER, maker)
    message = str(raised.value)
    assert f"s3://{bucket}/{MANIFEST_PATH}" in message
    assert "3 attempt" in message
    assert_secret_free(error_text(raised.value), s3_server)
    assert_secret_free(caplog.text, s3_server)
    assert_secret_free(repr(node_b) + repr(node_b.objects), s3_server)

    with pytest.raises(RemoteError) as raised_open:  # open says "error", never "not found"
        node_b.open(DS, VER)
    assert not isinstance(raised_open.value, CacheNotFoundError)
    assert f"s3://{bucket}/{MANIFEST_PATH}" in str(raised_open.value)

    assert maker.calls == 0
    # Two calls, at least three attempts each (the exact count is checked by
    # test_retry_policy_attempts_are_http_attempts); a timed-out request is logged once the
    # proxy sees the client hang up.
    assert wait_for(lambda: len(s3_proxy.requests("GET", MANIFEST_NAME)) >= 6)
    assert s3_proxy.requests("PUT") == [] and s3_proxy.requests("DELETE") == []
    assert s3_proxy.requests(action="forwarded") == []
    assert snapshot(s3_server, bucket) == before
    check_local(node_b, build, OLD)


@pytest.mark.parametrize("fault", ["500", "reset"])
def test_retry_policy_attempts_are_http_attempts(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path, fault: str
) -> None:
    """RetryPolicy(attempts=3) makes 3 requests: the backend's client must not retry on its own
    (its retries would multiply the attempts, and the time before a timeout is reported)."""
    bucket = s3_server.new_bucket()
    objects = S3ObjectStore(bucket, PREFIX, endpoint_url=s3_proxy.url, retry=FAST, timeout=1.0)
    s3_proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, **FAULTS[fault])
    with pytest.raises(RemoteError, match="after 3 attempt"):
        objects.read(f"{DS}/{VER}/{MANIFEST_NAME}")
    assert len(s3_proxy.requests("GET", MANIFEST_NAME)) == 3


@pytest.mark.parametrize("fault", ["timeout", "reset"])
def test_download_attempts_are_http_attempts_and_a_stop_ends_them(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path, fault: str
) -> None:
    """A file download makes RetryPolicy's attempts, not s3transfer's five per attempt: a read
    timeout or a reset stream is retried by the policy alone, so a set stop (a closed reader's
    fetch ahead) ends the download after the request under way."""
    bucket = s3_server.new_bucket()
    key = f"{DS}/{VER}/part.mdb"
    S3ObjectStore(bucket, PREFIX, endpoint_url=s3_server.endpoint_url).write(key, b"x" * 4096)
    objects = S3ObjectStore(bucket, PREFIX, endpoint_url=s3_proxy.url, retry=FAST, timeout=1.0)
    s3_proxy.add_rule(method="GET", path_contains="part.mdb", **FAULTS[fault])
    with pytest.raises(RemoteError, match="after 3 attempt"):
        objects.download_file(key, tmp_path / "part.mdb")
    assert wait_for(lambda: len(s3_proxy.requests("GET", "part.mdb")) >= 3)
    time.sleep(1.5)  # a retry of s3transfer's own would have come by now
    assert len(s3_proxy.requests("GET", "part.mdb")) == 3
    assert not (tmp_path / "part.mdb").exists()

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()  # the rule above still holds
    started = time.monotonic()
    with stop_retries_when(stop), pytest.raises(TransferCancelled):
        S3ObjectStore(bucket, PREFIX, endpoint_url=s3_proxy.url, timeout=1.0).download_file(key, tmp_path / "p2.mdb")
    assert time.monotonic() - started < 4.0  # the attempt under way, not five of s3transfer's
    assert not (tmp_path / "p2.mdb").exists()


@pytest.mark.parametrize("fault", ["500", "403", "reset"])
def test_fault_while_checking_an_unpublished_cache_does_not_build(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path, fault: str
) -> None:
    """Even when the cache really is absent, an error is not taken for "absent"."""
    bucket = s3_server.new_bucket()
    node = s3_node(bucket, s3_proxy.url, tmp_path / "node", timeout=1.0)
    s3_proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, **FAULTS[fault])
    maker = Maker(OLD)

    with pytest.raises(RemoteError) as raised:
        node.get_or_build(DS, VER, maker)
    assert f"s3://{bucket}/{MANIFEST_PATH}" in str(raised.value)
    assert_secret_free(error_text(raised.value), s3_server)
    assert maker.calls == 0
    assert snapshot(s3_server, bucket) == {}  # no lease, no parts, no manifest
    assert not node.local.exists(DS, VER)


def test_transient_fault_on_unpublished_manifest_then_absent_builds_once(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    """A 500 that clears up, then a real 404: the cache is built exactly once and published."""
    bucket = s3_server.new_bucket()
    node = s3_node(bucket, s3_proxy.url, tmp_path / "node")
    s3_proxy.add_rule(action="status", method="GET", path_contains=MANIFEST_NAME, status=500, times=2)
    maker = Maker(OLD)

    check_data(node.get_or_build(DS, VER, maker), OLD)
    assert maker.calls == 1
    statuses = [entry.status for entry in s3_proxy.requests("GET", MANIFEST_NAME)]
    assert statuses[:3] == [500, 500, 404]
    objects = snapshot(s3_server, bucket)
    assert f"{PREFIX}/{DS}/{VER}/{MANIFEST_NAME}" in objects


def test_truncated_manifest_body_is_retried(
    s3_server: Any, s3_proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path
) -> None:
    bucket, build = published
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    s3_proxy.add_rule(action="truncate", method="GET", path_contains=MANIFEST_NAME, after_bytes=40, times=2)
    maker = Maker(NEW)

    check_data(node_b.get_or_build(DS, VER, maker), OLD)
    assert maker.calls == 0
    assert [e.action for e in s3_proxy.requests("GET", MANIFEST_NAME)] == ["truncate", "truncate", "forwarded"]
    check_local(node_b, build, OLD)


# -- part downloads -----------------------------------------------------------------------
def test_truncated_part_body_is_retried_and_the_data_is_right(
    s3_server: Any, s3_proxy: FaultProxy, two_builds: Any, tmp_path: Path
) -> None:
    bucket, _build1, build2, _ = two_builds
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    s3_proxy.add_rule(action="truncate", method="GET", path_contains="-part-", after_bytes=1000, times=3)

    check_data(node_b.open(DS, VER), NEW)
    assert len(s3_proxy.requests("GET", "-part-", action="truncate")) == 3
    check_local(node_b, build2, NEW)


def test_persistently_truncated_part_never_leaves_a_corrupt_local_copy(
    s3_server: Any, s3_proxy: FaultProxy, two_builds: Any, tmp_path: Path
) -> None:
    bucket, build1, build2, _ = two_builds
    before = snapshot(s3_server, bucket)
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    bad_part = f"{build2.build_id}-{build2.parts[-1].name}"
    s3_proxy.add_rule(action="truncate", method="GET", path_contains=bad_part, after_bytes=1000)

    with pytest.raises((RemoteError, CorruptCacheError)) as raised:
        node_b.open(DS, VER)
    assert bad_part in str(raised.value)
    assert_secret_free(error_text(raised.value), s3_server)
    assert len(s3_proxy.requests("GET", bad_part, action="truncate")) >= 3
    check_local(node_b, build1, OLD)  # the old copy, whole; no temp directory left behind
    assert snapshot(s3_server, bucket) == before

    s3_proxy.clear_rules()  # the network heals: the next sync completes build 2
    check_data(node_b.open(DS, VER), NEW)
    check_local(node_b, build2, NEW)


@pytest.mark.parametrize("fault", ["403", "timeout", "500", "reset"])  # a part is one ranged GET, no HEAD
def test_persistent_fault_on_part_get_keeps_the_old_copy(
    s3_server: Any, s3_proxy: FaultProxy, two_builds: Any, tmp_path: Path, fault: str
) -> None:
    bucket, build1, _build2, _ = two_builds
    before = snapshot(s3_server, bucket)
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b", timeout=1.0)
    s3_proxy.add_rule(method="GET", path_contains="-part-", **FAULTS[fault])

    with pytest.raises(RemoteError) as raised:
        node_b.open(DS, VER)
    assert f"s3://{bucket}/{PREFIX}/{DS}/{VER}/" in str(raised.value)
    assert "-part-" in str(raised.value)
    assert_secret_free(error_text(raised.value), s3_server)
    check_local(node_b, build1, OLD)
    assert snapshot(s3_server, bucket) == before


# -- altered objects in the bucket --------------------------------------------------------
def _flip_byte(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


@pytest.mark.parametrize("damage", ["flipped-byte", "swapped-part"])
def test_altered_part_object_is_refused_and_the_old_copy_kept(
    s3_server: Any, two_builds: Any, tmp_path: Path, damage: str
) -> None:
    bucket, build1, build2, build1_objects = two_builds
    client = s3_server.client()
    index = len(build2.parts) // 2
    key = f"{PREFIX}/{DS}/{VER}/{build2.build_id}-{build2.parts[index].name}"
    original = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    if damage == "flipped-byte":
        altered = _flip_byte(original, len(original) // 3)
    else:  # the same-position part of another build: same size, other content
        altered = build1_objects[f"{PREFIX}/{DS}/{VER}/{build1.build_id}-{build1.parts[index].name}"]
        assert len(altered) == len(original) and altered != original  # only the hash can tell
    client.put_object(Bucket=bucket, Key=key, Body=altered)
    before = snapshot(s3_server, bucket)

    node_b = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-b")
    maker = Maker(NEW)
    with pytest.raises(CorruptCacheError) as raised:
        node_b.get_or_build(DS, VER, maker)
    assert f"s3://{bucket}/{key}" in str(raised.value)
    assert maker.calls == 0
    check_local(node_b, build1, OLD)

    # A node without a local copy gets nothing, and nothing half-downloaded stays behind.
    node_c = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-c")
    with pytest.raises(CorruptCacheError):
        node_c.open(DS, VER)
    assert not node_c.local.exists(DS, VER)
    assert leftovers_of(node_c.local.cache_dir(DS, VER)) == []
    with pytest.raises(CorruptCacheError):
        node_c.get_or_build(DS, VER, maker)
    assert maker.calls == 0
    assert snapshot(s3_server, bucket) == before  # refused, not "repaired" by a rebuild


def test_missing_part_object_of_a_published_cache_is_refused(s3_server: Any, two_builds: Any, tmp_path: Path) -> None:
    bucket, build1, build2, _ = two_builds
    key = f"{PREFIX}/{DS}/{VER}/{build2.build_id}-{build2.parts[0].name}"
    s3_server.client().delete_object(Bucket=bucket, Key=key)
    node_b = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-b")
    maker = Maker(NEW)
    with pytest.raises(CorruptCacheError) as raised:
        node_b.get_or_build(DS, VER, maker)
    assert f"s3://{bucket}/{key}" in str(raised.value)
    assert maker.calls == 0
    check_local(node_b, build1, OLD)
    assert f"{PREFIX}/{DS}/{VER}/{MANIFEST_NAME}" in snapshot(s3_server, bucket)


def test_missing_part_object_is_an_answer_not_retried(
    s3_server: Any, s3_proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path
) -> None:
    """A 404 on a part is "missing" at once (CorruptCacheError), not three rounds of retries."""
    bucket, build = published
    key = f"{PREFIX}/{DS}/{VER}/{build.build_id}-{build.parts[-1].name}"
    s3_server.client().delete_object(Bucket=bucket, Key=key)
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    with pytest.raises(CorruptCacheError, match="missing"):
        node_b.open(DS, VER)
    assert len(s3_proxy.requests("GET", build.parts[-1].name)) == 1
    assert s3_proxy.requests("HEAD", build.parts[-1].name) == []
    assert not node_b.local.exists(DS, VER)
    assert leftovers_of(node_b.local.cache_dir(DS, VER)) == []


# -- answers that lie, and garbled or swapped manifests ------------------------------------
def test_injected_404_on_a_published_manifest_cannot_overwrite_it(
    s3_server: Any, s3_proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path
) -> None:
    """A "not found" that lies makes a node build, but its conditional manifest write loses:
    the published cache is not overwritten, and the node ends up reading the published build."""
    bucket, build = published
    before = snapshot(s3_server, bucket)
    node_b = s3_node(bucket, s3_proxy.url, tmp_path / "node-b")
    # Three lies: the first look, the look under the node lock, the look under the lease.
    s3_proxy.add_rule(action="status", method="GET", path_contains=MANIFEST_NAME, status=404, times=3)
    maker = Maker(NEW)

    check_data(node_b.get_or_build(DS, VER, maker), OLD)
    assert maker.calls == 1  # it did build, believing the lie...
    assert len(s3_proxy.requests("PUT", MANIFEST_NAME)) == 1  # ...tried to publish, conditionally...
    after = snapshot(s3_server, bucket)
    for snap in (before, after):  # the build lease (released) is rewritten by every publisher
        snap.pop(f"{PREFIX}/{DS}/{VER}/build-lease.json", None)
    assert after == before  # ...but overwrote nothing, and its own parts were cleaned up
    check_local(node_b, build, OLD)


def test_persistent_fault_on_part_upload_publishes_nothing(
    s3_server: Any, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    node = s3_node(bucket, s3_proxy.url, tmp_path / "node")
    s3_proxy.add_rule(action="status", method="PUT", path_contains="-part-00001", status=500)
    maker = Maker(OLD)
    with pytest.raises(RemoteError) as raised:
        node.get_or_build(DS, VER, maker)
    assert f"s3://{bucket}/{PREFIX}/{DS}/{VER}/" in str(raised.value)
    assert "-part-00001.mdb" in str(raised.value)
    assert_secret_free(error_text(raised.value), s3_server)
    objects = snapshot(s3_server, bucket)
    assert f"{PREFIX}/{DS}/{VER}/{MANIFEST_NAME}" not in objects  # never published
    reader = s3_node(bucket, s3_server.endpoint_url, tmp_path / "reader")
    with pytest.raises(CacheNotFoundError):
        reader.open(DS, VER)

    s3_proxy.clear_rules()  # the network heals: the next attempt publishes a complete cache
    check_data(node.get_or_build(DS, VER, maker), OLD)
    check_data(reader.open(DS, VER), OLD)


@pytest.mark.parametrize("garbage", [b"", b"{not json", b'{"format": "yogacache"}'])
def test_garbled_manifest_is_refused_not_rebuilt(
    s3_server: Any, published: tuple[str, Manifest], tmp_path: Path, garbage: bytes
) -> None:
    bucket, _build = published
    s3_server.client().put_object(Bucket=bucket, Key=MANIFEST_PATH, Body=garbage)
    before = snapshot(s3_server, bucket)
    node_b = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-b")
    maker = Maker(NEW)
    with pytest.raises(CorruptCacheError) as raised:
        node_b.get_or_build(DS, VER, maker)
    assert f"s3://{bucket}/{MANIFEST_PATH}" in str(raised.value)
    assert maker.calls == 0
    assert snapshot(s3_server, bucket) == before


def test_manifest_swapped_from_another_dataset_is_refused(s3_server: Any, two_builds: Any, tmp_path: Path) -> None:
    """The manifest at ``faults/v1/`` replaced by the one of ``other/v1``: a node must refuse it
    (and never serve its old copy of ``faults/v1`` as if it were current)."""
    bucket, build1, _build2, _ = two_builds
    node_a = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-a")
    node_a.build("other", VER, records(5000))
    client = s3_server.client()
    other = client.get_object(Bucket=bucket, Key=f"{PREFIX}/other/{VER}/{MANIFEST_NAME}")["Body"].read()
    client.put_object(Bucket=bucket, Key=MANIFEST_PATH, Body=other)

    node_b = s3_node(bucket, s3_server.endpoint_url, tmp_path / "node-b")
    with pytest.raises(CorruptCacheError):
        node_b.open(DS, VER)
    check_local(node_b, build1, OLD)
    assert not node_b.local.exists("other", VER)  # nothing written under another cache's name


# -- GCS and Azure ---------------------------------------------------------------------------
def cloud_node(cloud: Cloud, bucket: str, url: str, root: Path, *, timeout: float = 10.0) -> RemoteCacheStore:
    """A node whose backend reaches ``cloud``'s server at ``url`` (the server, or a proxy)."""
    from yogacache.backends.azure import AzureObjectStore

    objects: Any
    if cloud.kind == "gcs":
        objects = GCSObjectStore(bucket, PREFIX, client=gcs_client(url), retry=FAST, timeout=timeout)
    else:
        connection_string = cloud.server.connection_string_at(url)
        objects = AzureObjectStore(bucket, PREFIX, connection_string=connection_string, retry=FAST, timeout=timeout)
    return RemoteCacheStore(objects, root, show_progress=False, part_size_bytes=PART_SIZE, wait_timeout=20)


def gcs_client(url: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="test-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
    )


def cloud_snapshot(cloud: Cloud, bucket: str) -> dict[str, bytes]:
    return {key: cloud.raw_get(bucket, key) for key in cloud.raw_keys(bucket)}


def _azure_error(status: int, code: str) -> dict[str, Any]:
    body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>m</Message></Error>'
    return {"action": "status", "status": status, "body": body.encode(), "content_type": "application/xml"}


# Each service's own error answers (GCS: JSON; Azure: XML with a code; a bare 403 on Azure, as
# a proxy in front would answer, is retried as S3's and GCS's are).
_NO_ANSWER: dict[str, dict[str, Any]] = {"reset": {"action": "reset"}, "timeout": {"action": "delay", "seconds": 6.0}}
CLOUD_FAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "gcs": {
        "500": {"action": "status", "status": 500, "body": gcs_error_body(500), "content_type": "application/json"},
        "403": {"action": "status", "status": 403, "body": gcs_error_body(403), "content_type": "application/json"},
        **_NO_ANSWER,
    },
    "azure": {"500": _azure_error(500, "InternalError"), "403": {"action": "status", "status": 403}, **_NO_ANSWER},
}


@pytest.fixture(params=["gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    return Cloud(request.param, request.getfixturevalue(f"{request.param}_server"))


@pytest.fixture
def cloud_proxy(cloud: Cloud) -> Iterator[FaultProxy]:
    """A fault proxy in front of the cloud's server, stopped after the test."""
    with FaultProxy(cloud.server_url) as proxy:
        yield proxy


@pytest.fixture
def cloud_published(cloud: Cloud, tmp_path: Path) -> tuple[str, Manifest]:
    bucket = cloud.new_bucket()
    node_a = cloud_node(cloud, bucket, cloud.server_url, tmp_path / "node-a")
    return bucket, node_a.build(DS, VER, records(OLD))


def test_gcs_and_azure_transient_500_on_manifest_get_is_retried_without_rebuild(
    cloud: Cloud, cloud_proxy: FaultProxy, cloud_published: tuple[str, Manifest], tmp_path: Path
) -> None:
    bucket, build = cloud_published
    before = cloud_snapshot(cloud, bucket)
    node_b = cloud_node(cloud, bucket, cloud_proxy.url, tmp_path / "node-b")
    cloud_proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, times=2, **CLOUD_FAULTS[cloud.kind]["500"])
    maker = Maker(NEW)

    check_data(node_b.get_or_build(DS, VER, maker), OLD)
    assert maker.calls == 0
    gets = cloud_proxy.requests("GET", MANIFEST_NAME)
    assert [entry.action for entry in gets[:3]] == ["status", "status", "forwarded"]
    assert gets[2].status in (200, 206)  # the media download may be ranged
    assert cloud_proxy.requests("POST") == [] and cloud_proxy.requests("PUT") == []
    assert cloud_snapshot(cloud, bucket) == before
    check_local(node_b, build, OLD)


@pytest.mark.parametrize("fault", ["500", "403", "reset", "timeout"])
def test_gcs_and_azure_persistent_fault_on_published_manifest_is_reported_not_rebuilt(
    cloud: Cloud,
    cloud_proxy: FaultProxy,
    cloud_published: tuple[str, Manifest],
    tmp_path: Path,
    fault: str,
) -> None:
    bucket, build = cloud_published
    root = tmp_path / "node-b"
    check_data(cloud_node(cloud, bucket, cloud.server_url, root).open(DS, VER), OLD)
    before = cloud_snapshot(cloud, bucket)

    node_b = cloud_node(cloud, bucket, cloud_proxy.url, root, timeout=1.0)
    cloud_proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, **CLOUD_FAULTS[cloud.kind][fault])
    maker = Maker(NEW)

    with pytest.raises(RemoteError) as raised:
        node_b.get_or_build(DS, VER, maker)
    assert cloud.url(bucket, MANIFEST_PATH) in str(raised.value)
    assert "3 attempt" in str(raised.value)
    with pytest.raises(RemoteError):
        node_b.open(DS, VER)
    assert maker.calls == 0
    assert wait_for(lambda: len(cloud_proxy.requests("GET", MANIFEST_NAME)) >= 6)
    # Not one request for the manifest got through; nothing but reads was attempted.
    assert [e for e in cloud_proxy.requests(action="forwarded") if MANIFEST_NAME in e.target] == []
    assert {e.method for e in cloud_proxy.log} == {"GET"}
    assert cloud_snapshot(cloud, bucket) == before
    check_local(node_b, build, OLD)


def test_gcs_and_azure_flipped_byte_in_part_is_refused(cloud: Cloud, tmp_path: Path) -> None:
    bucket = cloud.new_bucket()
    node_a = cloud_node(cloud, bucket, cloud.server_url, tmp_path / "node-a")
    node_b = cloud_node(cloud, bucket, cloud.server_url, tmp_path / "node-b")
    build1 = node_a.build(DS, VER, records(OLD))
    check_data(node_b.open(DS, VER), OLD)
    node_a.remove(DS, VER, remote=True, local=False)
    build2 = node_a.build(DS, VER, records(NEW))
    key = f"{PREFIX}/{DS}/{VER}/{build2.build_id}-{build2.parts[1].name}"
    data = cloud.raw_get(bucket, key)
    cloud.raw_put(bucket, key, _flip_byte(data, len(data) // 2))

    with pytest.raises(CorruptCacheError) as raised:
        node_b.open(DS, VER)
    assert cloud.url(bucket, key) in str(raised.value)
    check_local(node_b, build1, OLD)
