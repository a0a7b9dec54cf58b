"""``yogacache rm`` removes a cache whose manifest is empty, corrupt or oversized -- the cache a
user most needs to delete -- locally and with ``--remote``; it never reads an oversized published
manifest whole, and it removes nothing but that one cache."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, python_env, reader_keys
from yogacache.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore

DAMAGES = {"empty": b"", "corrupt": b"{ not json", "truncated": b'{"format_version": 1, "dataset_id": "mn'}


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args], input=stdin, capture_output=True, text=True, env=python_env(),
        timeout=120,
    )


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_rm_removes_a_local_cache_whose_manifest_is_damaged(damage: str, tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "caches", show_progress=False)
    store.build("mnist", "v1", dataset(10))
    store.build("mnist", "v2", dataset(10))
    (store.cache_dir("mnist", "v1") / MANIFEST_NAME).write_bytes(DAMAGES[damage])

    asked = run_cli("rm", "mnist", "v1", "--storage", str(store.root), stdin="n\n")
    assert asked.returncode == 1 and "manifest unreadable" in asked.stdout + asked.stderr, asked
    assert store.cache_dir("mnist", "v1").is_dir()  # "n": nothing removed

    removed = run_cli("rm", "mnist", "v1", "-y", "--storage", str(store.root))
    assert removed.returncode == 0, removed.stderr
    assert "removed mnist v1" in removed.stdout
    assert not store.cache_dir("mnist", "v1").exists()
    with store.open("mnist", "v2") as reader:  # the other version is untouched
        assert reader_keys(reader) == expected_keys(10)


@pytest.mark.parametrize("damage", ["empty", "corrupt"])
def test_rm_remote_removes_a_published_cache_whose_manifest_is_damaged(
    damage: str, s3_server: Any, tmp_path: Path
) -> None:
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    node = RemoteCacheStore(cloud.store(bucket, "caches"), tmp_path / "node", show_progress=False)
    node.build("mnist", "v1", dataset(10))
    node.build("mnist", "v2", dataset(10))
    cloud.raw_put(bucket, f"caches/mnist/v1/{MANIFEST_NAME}", DAMAGES[damage])
    storage = ["--storage", f"s3://{bucket}/caches", "--endpoint-url", s3_server.endpoint_url,
               "--local-cache", str(tmp_path / "cli-node")]

    removed = run_cli("rm", "mnist", "v1", "--remote", "-y", *storage)
    assert removed.returncode == 0, removed.stderr
    assert "removed mnist v1" in removed.stdout
    keys = cloud.raw_keys(bucket)
    assert not [k for k in keys if k.startswith("caches/mnist/v1/")], keys
    assert f"caches/mnist/v2/{MANIFEST_NAME}" in keys  # the other version is untouched
    with RemoteCacheStore(cloud.store(bucket, "caches"), tmp_path / "reader", show_progress=False).open(
        "mnist", "v2"
    ) as reader:
        assert reader_keys(reader) == expected_keys(10)


PEAK = """
import sys
import boto3, yogacache.cli, yogacache.backends.s3  # imported before the baseline

def peak() -> int:
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) * 1024

before = peak()
code = yogacache.cli.main(sys.argv[1:])
print({"code": code, "grew": peak() - before}, file=sys.stderr)
sys.exit(code)
"""


def test_rm_remote_of_an_oversized_manifest_never_reads_it_whole(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    node = RemoteCacheStore(cloud.store(bucket, "caches"), tmp_path / "node", show_progress=False)
    node.build("big", "v1", dataset(10))
    size = 2 * MAX_MANIFEST_BYTES + (16 << 20)  # 144 MiB: read whole, it would cost at least that
    s3_server.client().put_object(Bucket=bucket, Key=f"caches/big/v1/{MANIFEST_NAME}", Body=b" " * size)
    storage = ["--storage", f"s3://{bucket}/caches", "--endpoint-url", s3_server.endpoint_url,
               "--local-cache", str(tmp_path / "cli-node")]

    result = subprocess.run(
        [sys.executable, "-c", PEAK, "rm", "big", "v1", "--remote", "-y", *storage],
        capture_output=True, text=True, env=python_env(), timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert not [k for k in cloud.raw_keys(bucket) if k.startswith("caches/big/v1/")]
    measured = json.loads(result.stderr.strip().splitlines()[-1].replace("'", '"'))
    # At most the capped read (MAX_MANIFEST_BYTES + 1) and change, never the 144 MiB object.
    assert measured["grew"] < MAX_MANIFEST_BYTES + (32 << 20), measured
