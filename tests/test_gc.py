"""``yogacache gc`` and the local columns of ``yogacache ls``, run as commands against the S3 test
server: what the policy removes, what it never removes (in use, only copy), and --dry-run."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from tests.cloud_helpers import Cloud, python_env, start_python, unique
from tests.streaming_helpers import data, publish
from tests.test_cli_remote import run_cli
from yogacache.store.budget import PARTS_DIR
from yogacache.store.remote import LOCAL_CACHE_DIR, RemoteCacheStore

HOLD_COPY = r"""
import json, sys, time
from yogacache.store import open_store
reader = open_store(json.loads(open(sys.argv[1]).read()), show_progress=False).open("a", "v1")
print(int(reader[0][1]), flush=True)
time.sleep(600)
"""


def _ls(config: Path) -> dict[str, Any]:
    done = run_cli("ls", "--storage", str(config), "--json")
    assert done.returncode == 0, done.stderr
    return {row["dataset_id"]: row for row in json.loads(done.stdout)}


def test_gc_evicts_by_policy_and_ls_shows_local_bytes_and_use(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("caches")
    node = tmp_path / "node"
    root = node / LOCAL_CACHE_DIR
    builder = RemoteCacheStore(cloud.store(bucket, prefix), tmp_path / "builder", show_progress=False)
    builder.get_or_build("a", "v1", lambda: data(100))
    publish(cloud, bucket, prefix, tmp_path / "builder-b")  # "stream"/"v1", a dozen parts
    config = tmp_path / "data_layer.json"
    config.write_text(
        json.dumps(cloud.config(bucket, prefix, local_cache_host_path=str(node), local_cache_container_path=str(node)))
    )
    pulled = run_cli("pull", "a", "v1", "--storage", str(config))  # a whole copy, by a process that ended
    assert pulled.returncode == 0, pulled.stderr
    whole = RemoteCacheStore(cloud.store(bucket, prefix), node, show_progress=False)
    whole.local.build("only", "v1", data(50))  # never published: the only copy
    streamed = RemoteCacheStore(cloud.store(bucket, prefix), node, streaming=True, show_progress=False)
    reader = streamed.open("stream", "v1")
    assert len(reader.read_elements(range(len(reader)))) == len(reader)
    reader.close()
    parts = sorted((root / PARTS_DIR / "stream" / "v1").glob("*.mdb"))
    assert parts

    rows = _ls(config)
    assert rows["a"]["local_bytes"] > 0 and rows["a"]["in_use"] is False
    assert rows["stream"]["streamed_bytes"] == sum(p.stat().st_size for p in parts)
    table = run_cli("ls", "--storage", str(config))
    assert "LOCAL" in table.stdout and "IN USE" in table.stdout
    # A cache whose parts were streamed to the node, with no whole copy: "streamed", not "none".
    (stream_row,) = [line for line in table.stdout.splitlines() if line.startswith("stream ")]
    assert stream_row.rstrip().endswith("streamed") and " none" not in stream_row, table.stdout

    dry = run_cli("gc", "--storage", str(config), "--dry-run", "--limit", "1")
    assert dry.returncode == 0, dry.stderr
    assert "would remove a/v1" in dry.stdout and f"would remove {PARTS_DIR}/stream/v1/" in dry.stdout
    assert "only/v1" not in dry.stdout
    assert (root / "a" / "v1").is_dir() and all(p.exists() for p in parts)  # dry run: nothing removed

    holder = start_python(HOLD_COPY, str(config), env=python_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        assert _ls(config)["a"]["in_use"] is True
        done = run_cli("gc", "--storage", str(config), "--limit", "1")
        assert done.returncode == 0, done.stderr
        assert (root / "a" / "v1").is_dir(), "gc removed a copy a live process reads"
        assert not any(p.exists() for p in parts)
        assert "still over the limit" in done.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    done = run_cli("gc", "--storage", str(config), "--limit", "1Ki")
    assert done.returncode == 0, done.stderr
    assert not (root / "a" / "v1").exists()
    assert (root / "only" / "v1" / "manifest.json").is_file()  # never the only copy


def test_gc_needs_a_budget_and_leaves_shared_fs_alone(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    config = tmp_path / "data_layer.json"
    config.write_text(json.dumps(cloud.config(bucket, "c", local_cache_host_path=str(tmp_path / "n"),
                                              local_cache_container_path=str(tmp_path / "n"))))
    done = run_cli("gc", "--storage", str(config))
    assert done.returncode == 1 and "gc needs a budget" in done.stderr
    bad = run_cli("gc", "--storage", str(config), "--limit", "lots")
    assert bad.returncode == 1 and "Ki Mi Gi Ti" in bad.stderr
    shared = tmp_path / "shared"
    RemoteCacheStore  # noqa: B018 - a shared_fs directory holds only copies that are the only ones
    from yogacache.store.local import CacheStore

    CacheStore(shared).build("x", "v1", data(10))
    done = run_cli("gc", "--storage", str(shared), "--limit", "1")
    assert done.returncode == 0 and "nothing to collect" in done.stdout
    typo = run_cli("gc", "--storage", str(shared), "--limit", "10XB")  # a typo fails on any storage
    assert typo.returncode == 1 and "--limit" in typo.stderr and "Ki Mi Gi Ti" in typo.stderr, typo.stderr
    assert (shared / "x" / "v1" / "manifest.json").is_file()


def test_rm_removes_the_streamed_parts_of_exactly_that_cache(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("caches")
    node = tmp_path / "node"
    publish(cloud, bucket, prefix, tmp_path / "builder")
    RemoteCacheStore(cloud.store(bucket, prefix), tmp_path / "builder-a", show_progress=False).get_or_build(
        "a", "v1", lambda: data(20)
    )
    store = RemoteCacheStore(cloud.store(bucket, prefix), node, streaming=True, show_progress=False)
    reader = store.open("stream", "v1")
    assert len(reader.read_elements(range(len(reader)))) == len(reader)
    reader.close()
    other = store.open("a", "v1")
    assert int(other[3][1]) == 3
    parts = node / LOCAL_CACHE_DIR / PARTS_DIR / "stream" / "v1"
    assert any(parts.glob("*.mdb"))
    config = tmp_path / "data_layer.json"
    config.write_text(
        json.dumps(cloud.config(bucket, prefix, local_cache_host_path=str(node), local_cache_container_path=str(node)))
    )
    done = run_cli("rm", "stream", "v1", "-y", "--storage", str(config))
    assert done.returncode == 0, done.stderr
    assert not parts.exists()
    assert any((node / LOCAL_CACHE_DIR / PARTS_DIR / "a" / "v1").glob("*.mdb"))  # the other cache's stay
    assert f"{prefix}/stream/v1/manifest.json" in cloud.raw_keys(bucket)  # the published cache stays
    missing = run_cli("rm", "stream", "v1", "-y", "--storage", str(config))
    assert missing.returncode == 1 and "no local copy" in missing.stderr
