"""The ``yogacache`` command on a remote storage, as a new user meets it: ``push`` publishes the
cache ``yogacache ls`` shows in the local default store, errors about a remote cache name its
``s3://`` URL, and ``rm`` asks naming exactly what it deletes.

Real processes against moto's S3 server (the fixtures of tests/test_cli_remote.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, reader_keys
from tests.test_cli_remote import Remote, run_cli
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.store.local import CacheStore


@pytest.fixture
def s3_remote(s3_server: Any, tmp_path: Path) -> Remote:
    return Remote(Cloud("s3", s3_server), tmp_path)


def test_push_publishes_a_cache_of_the_local_default_store(s3_remote: Remote, private_default_root: Path) -> None:
    remote = s3_remote
    built = CacheStore(private_default_root, show_progress=False).build("mnist", "v1", dataset(300))
    listed = run_cli("ls", "--json")
    assert [(r["dataset_id"], r["dataset_version"]) for r in json.loads(listed.stdout)] == [("mnist", "v1")]

    result = remote.cli("push", "mnist", "v1")
    assert result.returncode == 0, result.stderr
    assert f"{remote.url}/mnist/v1" in result.stdout
    published = remote.node("node-c").remote_manifest("mnist", "v1")
    assert published is not None and published.freshness == built.freshness
    assert reader_keys(remote.node("node-c").open("mnist", "v1")) == expected_keys(300)
    # The local default store still holds its cache, untouched.
    assert CacheStore(private_default_root).verify("mnist", "v1").freshness == built.freshness


def test_push_from_a_named_directory(s3_remote: Remote, tmp_path: Path) -> None:
    remote = s3_remote
    elsewhere = tmp_path / "elsewhere"
    built = CacheStore(elsewhere, show_progress=False).build("cifar", "v2", dataset(40))
    result = remote.cli("push", "cifar", "v2", "--from", str(elsewhere))
    assert result.returncode == 0, result.stderr
    published = remote.node("node-c").remote_manifest("cifar", "v2")
    assert published is not None and published.freshness == built.freshness

    missing = remote.cli("push", "nothing", "v1")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "nothing" in missing.stderr and "--from" in missing.stderr


def test_errors_about_a_remote_cache_name_its_url(s3_remote: Remote) -> None:
    remote = s3_remote
    remote.node("node-a").build("mnist", "v1_train", dataset(20))
    for command in ("info", "pull"):
        result = remote.cli(command, "mnist", "v1")
        assert result.returncode == 1
        assert f"{remote.url}/mnist/v1" in result.stderr, result.stderr
        assert str(remote.local_b) not in result.stderr, result.stderr
        assert "did you mean: mnist v1_train?" in result.stderr
    result = remote.cli("rm", "mnist", "v1", "--remote", "-y")
    assert result.returncode == 1 and f"{remote.url}/mnist/v1" in result.stderr, result.stderr


def test_rm_asks_naming_the_local_copy_it_deletes(s3_remote: Remote) -> None:
    remote = s3_remote
    remote.node("node-a").build("mnist", "v1", dataset(20))
    remote.node("node-b").open("mnist", "v1")  # a local copy on the CLI's node
    local_copy = remote.local_dir("mnist", "v1")

    declined = remote.cli("rm", "mnist", "v1", stdin="n\n")
    assert declined.returncode == 1
    assert f"the local copy {local_copy}?" in declined.stdout, declined.stdout
    assert remote.url not in declined.stdout  # the published cache is not what it deletes
    assert (local_copy / MANIFEST_NAME).is_file()

    both = remote.cli("rm", "mnist", "v1", "--remote", "--local", stdin="n\n")
    assert f"the published cache {remote.url}/mnist/v1" in both.stdout and str(local_copy) in both.stdout

    accepted = remote.cli("rm", "mnist", "v1", stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert str(local_copy) in accepted.stdout and not local_copy.exists()
    assert remote.keys("mnist/v1/")  # the published cache is still there


def test_ls_keeps_listing_when_a_published_manifest_is_unreadable(s3_remote: Remote) -> None:
    remote = s3_remote
    remote.node("node-a").build("mnist", "v1", dataset(20))
    remote.node("node-b").open("mnist", "v1")
    remote.cloud.raw_put(remote.bucket, f"caches/broken/v1/{MANIFEST_NAME}", b"{ not json")

    result = remote.cli("ls")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert any(line.split()[:2] == ["mnist", "v1"] for line in result.stdout.splitlines()), result.stdout
    assert "broken" in result.stdout + result.stderr  # the bad one is named, with its reason
    listed = remote.cli("ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert ("mnist", "v1") in {(r["dataset_id"], r["dataset_version"]) for r in json.loads(listed.stdout)}


def test_a_published_cache_with_no_local_copy_is_named_as_such(s3_remote: Remote) -> None:
    """``verify``/``rm`` act on this node's copy: of a cache published but not on the node, they
    say so and that ``pull`` fetches it (not "did you mean" the very name typed)."""
    remote = s3_remote
    remote.node("node-a").build("stream-demo", "v1", dataset(20))
    for command, extra in (("verify", []), ("rm", ["-y"])):
        result = remote.cli(command, "stream-demo", "v1", *extra)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert "no local copy of stream-demo v1 on this node" in result.stderr, result.stderr
        assert "`yogacache pull stream-demo v1` fetches it" in result.stderr, result.stderr
        assert "did you mean" not in result.stderr, result.stderr
    assert "--remote` removes the published one" in result.stderr
    assert remote.node("node-c").remote_manifest("stream-demo", "v1") is not None  # nothing removed


def test_a_wrong_version_of_an_existing_dataset_lists_its_versions(s3_remote: Remote) -> None:
    remote = s3_remote
    for version in ("2024-01", "2024-02"):
        remote.node("node-a").build("imagenet", version, dataset(5))
    result = remote.cli("info", "imagenet", "v7")
    assert result.returncode == 1, result.stderr
    assert "imagenet has version(s): 2024-01, 2024-02" in result.stderr, result.stderr


def test_a_push_over_another_build_names_the_cache_the_storage_and_the_fix(s3_remote: Remote, tmp_path: Path) -> None:
    remote = s3_remote
    remote.node("node-a").build("cifar", "v2", dataset(30))  # published by another node
    elsewhere = tmp_path / "elsewhere"
    CacheStore(elsewhere, show_progress=False).build("cifar", "v2", dataset(40))
    result = remote.cli("push", "cifar", "v2", "--from", str(elsewhere))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    message = " ".join(result.stderr.split())
    assert "cannot push cifar v2" in message and f"{remote.url}/cifar/v2" in message, message
    assert "30 records" in message and "40 records" in message, message
    assert f"yogacache rm cifar v2 --remote --storage {remote.url}" in message, message
    assert remote.node("node-c").remote_manifest("cifar", "v2").num_records == 30  # type: ignore[union-attr]


def test_a_damaged_local_copy_says_pull_fetches_it_again(s3_remote: Remote) -> None:
    remote = s3_remote
    remote.node("node-a").build("mnist", "v1", dataset(20))
    remote.node("node-b").open("mnist", "v1")  # a local copy on the CLI's node
    part = remote.local_dir("mnist", "v1") / "part-00000.mdb"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    result = remote.cli("verify", "mnist", "v1")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    message = " ".join(result.stderr.split())
    assert "part-00000.mdb" in message and "next: `yogacache pull mnist v1` fetches the published copy" in message
    assert remote.cli("pull", "mnist", "v1").returncode == 0
    assert remote.cli("verify", "mnist", "v1").returncode == 0
