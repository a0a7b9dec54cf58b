"""Faults during streaming reads, against the real S3 and GCS servers: in-use parts survive
eviction (and stop being protected when their reader is SIGKILLed), kill -9 mid-fetch, a part
deleted from the bucket, a new build published meanwhile, transient and persistent errors."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.cloud_helpers import Cloud, start_python, unique
from tests.faultproxy import FaultProxy, gcs_error_body
from tests.streaming_helpers import DS, RECORDS, VER, data, node_config, node_env, parts_dir, publish
from yogacache.backends.base import RemoteError, RetryPolicy
from yogacache.errors import CacheReplacedError, ConfigError, CorruptCacheError
from yogacache.format.manifest import Manifest
from yogacache.store import open_store
from yogacache.store.eviction import collect
from yogacache.store.remote import RemoteCacheStore
from yogacache.store.streaming import MAX_AHEAD, minimum_budget


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    kind = request.param
    return Cloud(kind, request.getfixturevalue(f"{kind}_server"))


@pytest.fixture
def published(cloud: Cloud, tmp_path: Path) -> tuple[str, str, Manifest]:
    bucket, prefix = cloud.new_bucket(), unique("caches")
    return bucket, prefix, publish(cloud, bucket, prefix, tmp_path / "builder")


@pytest.fixture
def proxy(cloud: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy in front of the server; in-process GCS clients reach it too."""
    made = FaultProxy(cloud.server_url)
    if cloud.kind == "gcs":
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", made.url)
    try:
        yield made
    finally:
        made.stop()


def _fault(cloud: Cloud, status: int) -> dict[str, Any]:
    if cloud.kind == "gcs":
        body = gcs_error_body(status)
        return {"action": "status", "status": status, "body": body, "content_type": "application/json"}
    return {"action": "status", "status": status}


def _stacks(threads: list[threading.Thread]) -> str:
    """Where ``threads`` are now (what a thread that outlives its reader is waiting for)."""
    frames = sys._current_frames()
    return "\n".join(
        f"{thread.name}:\n{''.join(traceback.format_stack(frames[thread.ident]))}"
        for thread in threads
        if thread.ident in frames
    )


def _labels_in_order(reader: Any, indices: range) -> list[int]:
    return [int(reader[i][1]) for i in indices]


HOLDER = r"""
import json, os, sys, time
from yogacache.store import open_store
store = open_store(json.loads(sys.argv[1]), show_progress=False)
reader = store.open("stream", "v1")
print(json.dumps({"label": int(reader[0][1])}), flush=True)   # part 0 is now held
while not os.path.exists(sys.argv[2]):   # until the test says go on
    time.sleep(0.02)
print(json.dumps({"again": [int(reader[i][1]) for i in range(5)]}), flush=True)
time.sleep(600)   # holding part 0 until killed
"""


def test_in_use_part_is_never_evicted_and_protection_ends_with_sigkill(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    node = tmp_path / "node"
    limit = minimum_budget(manifest) + manifest.parts[0].size_bytes
    config = node_config(cloud, bucket, prefix, node, proxy.url, streaming=True, local_cache_limit=limit)
    go = tmp_path / "go"
    holder = start_python(HOLDER, json.dumps(config), str(go), env=node_env(cloud, proxy.url))
    try:
        assert holder.stdout is not None
        assert json.loads(holder.stdout.readline()) == {"label": 0}
        held = parts_dir(node) / f"{manifest.build_id}-{manifest.parts[0].name}"
        assert held.is_file()
        # Another process of the node reads every part under the same budget: it has to evict.
        store = open_store(config, show_progress=False)
        reader = store.open(DS, VER)
        assert _labels_in_order(reader, range(RECORDS)) == list(range(RECORDS))
        reader.close()
        remaining = sorted(p.name for p in parts_dir(node).iterdir() if p.name.endswith(".mdb"))
        assert len(remaining) < len(manifest.parts)  # eviction happened
        assert held.is_file(), "a part a live process reads was evicted"
        # gc cannot take it either while its reader lives ...
        assert held not in [e.item.path for e in collect(store, 1).evicted]
        assert held.is_file()
        # ... and the holder still reads it.
        go.touch()
        assert json.loads(holder.stdout.readline()) == {"again": [0, 1, 2, 3, 4]}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # Its lease died with it: the part is an ordinary candidate now.
    evicted = [e.item.path for e in collect(open_store(config, show_progress=False), 1).evicted]
    assert held in evicted and not held.exists()


KILLED_READER = r"""
import json, sys
from yogacache.store import open_store
reader = open_store(json.loads(sys.argv[1]), show_progress=False).open("stream", "v1")
print([int(reader[i][1]) for i in range(len(reader))])
"""


def test_kill_9_mid_fetch_leaves_no_usable_part(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    node = tmp_path / "node"
    victim = f"{manifest.build_id}-{manifest.parts[3].name}"
    proxy.add_rule(action="delay", method="GET", path_contains=manifest.parts[3].name, seconds=60)
    config = node_config(cloud, bucket, prefix, node, proxy.url, streaming=True)
    process = start_python(KILLED_READER, json.dumps(config), env=node_env(cloud, proxy.url))
    deadline = time.monotonic() + 60
    temps: list[Path] = []
    while not temps and time.monotonic() < deadline and process.poll() is None:
        temps = list(parts_dir(node).glob(f".{victim}.tmp-*")) if parts_dir(node).is_dir() else []
        time.sleep(0.02)
    assert temps, "the fetch of part 3 never started"
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert not (parts_dir(node) / victim).exists()  # never renamed into place unverified
    proxy.clear_rules()
    reader = open_store(config, show_progress=False).open(DS, VER)
    values = reader.read_elements(range(RECORDS))
    assert [int(label) for _, label in values] == list(range(RECORDS))
    assert all(int(array[0]) == int(label) for array, label in values)
    assert (parts_dir(node) / victim).is_file()
    assert list(parts_dir(node).glob(".*.tmp-*")) == []  # the killed download's file is gone


def test_part_deleted_from_the_bucket_mid_epoch_names_the_object(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    config = node_config(
        cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True, local_cache_limit=minimum_budget(manifest)
    )
    reader = open_store(config, show_progress=False).open(DS, VER)
    assert int(reader[0][1]) == 0
    gone = f"{prefix}/{DS}/{VER}/{manifest.build_id}-{manifest.parts[8].name}"
    cloud.raw_delete(bucket, gone)
    with pytest.raises(CorruptCacheError) as raised:
        _labels_in_order(reader, range(RECORDS))
    assert gone in str(raised.value) and "missing" in str(raised.value)


def test_new_build_published_while_streaming_never_serves_wrong_data(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    config = node_config(
        cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True, local_cache_limit=minimum_budget(manifest)
    )
    reader = open_store(config, show_progress=False).open(DS, VER)
    first = manifest.parts[0].num_records
    assert _labels_in_order(reader, range(first)) == list(range(first))
    # Another node publishes build 2 (other values): build 1's parts leave the bucket.
    replacer = RemoteCacheStore(cloud.store(bucket, prefix), tmp_path / "replacer", show_progress=False)
    new = replacer.build(DS, VER, data(fill=1000))
    assert new.build_id != manifest.build_id
    # Parts already on the node (named by build) stay readable, with build 1's values.
    assert [int(v[1]) for v in reader.read_elements(range(first))] == list(range(first))
    late = manifest.parts[-1].first_record
    with pytest.raises(CacheReplacedError) as raised:
        reader[late]
    message = str(raised.value)
    assert new.build_id in message and manifest.build_id in message and "open the cache again" in message
    # Opening again reads build 2 (one large part: no room in this budget, so without one).
    again = open_store({**config, "local_cache_limit": None}, show_progress=False).open(DS, VER)
    assert int(again[late][1]) == late + 1000


def test_transient_errors_are_retried_while_streaming(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    config = node_config(cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True)
    proxy.add_rule(method="GET", path_contains=manifest.parts[2].name, times=2, **_fault(cloud, 503))
    proxy.add_rule(method="GET", path_contains=manifest.parts[5].name, times=1, action="reset")
    reader = open_store(config, show_progress=False).open(DS, VER)
    assert _labels_in_order(reader, range(RECORDS)) == list(range(RECORDS))
    actions = [e.action for e in proxy.requests("GET", manifest.parts[2].name)]
    assert actions[:2] == ["status", "status"] and "forwarded" in actions
    assert [e.action for e in proxy.requests("GET", manifest.parts[5].name)][0] == "reset"


def test_persistent_403_while_streaming_is_reported_naming_the_object(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    config = node_config(cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True)
    proxy.add_rule(method="GET", path_contains=manifest.parts[4].name, **_fault(cloud, 403))
    reader = open_store(config, show_progress=False).open(DS, VER)
    with pytest.raises(RemoteError) as raised:
        reader[manifest.parts[4].first_record]
    assert manifest.parts[4].name in str(raised.value) and "403" in str(raised.value)
    if cloud.kind == "s3":
        assert cloud.server.secret_key not in str(raised.value)
    assert not (parts_dir(tmp_path / "node") / f"{manifest.build_id}-{manifest.parts[4].name}").exists()


def test_budget_below_the_parts_in_flight_is_refused_with_the_minimum(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    need = minimum_budget(manifest)
    node = tmp_path / "node"
    config = node_config(cloud, bucket, prefix, node, proxy.url, streaming=True, local_cache_limit=need - 1)
    with pytest.raises(ConfigError) as raised:
        open_store(config, show_progress=False).open(DS, VER)
    assert "at least" in str(raised.value) and str(need) in str(raised.value)
    assert proxy.requests("GET", "-part-") == []  # refused before any part was fetched


def test_close_stops_the_retries_of_fetches_ahead(
    cloud: Cloud, published: tuple[str, str, Manifest], proxy: FaultProxy, tmp_path: Path
) -> None:
    """A fetch ahead retrying a failing server stops when its reader is closed: no attempt after
    the one under way, and its temporary file is removed (it used to retry on, after the test)."""
    bucket, prefix, manifest = published
    node = tmp_path / "node"
    failing = manifest.parts[min(len(manifest.parts), MAX_AHEAD) - 1].name  # the farthest part fetched ahead
    proxy.add_rule(method="GET", path_contains=failing, **_fault(cloud, 503))
    before = set(threading.enumerate())  # another test's threads are not this reader's
    reader = open_store(node_config(cloud, bucket, prefix, node, proxy.url, streaming=True), show_progress=False).open(
        DS, VER
    )
    reader._provider.expect(range(len(manifest.parts)))  # the order a stream announces
    assert int(reader[0][1]) == 0  # part 0 is here; the others are fetched ahead
    deadline = time.monotonic() + 60
    while not proxy.requests("GET", failing) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proxy.requests("GET", failing), "the last part was never fetched ahead"
    fetching = [t for t in set(threading.enumerate()) - before if t.name.startswith("yogacache-stream")]
    assert fetching, "no thread fetches ahead"
    reader.close()
    at_close = len(proxy.requests("GET", failing))
    for thread in fetching:
        thread.join(timeout=30)
    assert not [t for t in fetching if t.is_alive()], _stacks([t for t in fetching if t.is_alive()])
    # At most the attempt under way when close() ran; the retry policy would have made five.
    assert len(proxy.requests("GET", failing)) <= at_close + 1 < RetryPolicy().attempts
    assert list(parts_dir(node).glob(".*.tmp-*")) == []
    assert not (parts_dir(node) / f"{manifest.build_id}-{failing}").exists()
