"""Local copies of remote caches are served only when they hold the published bytes.

- A copy planted with the published (created_at, build_id) but other parts is never served.
- One damaged part of a local copy is fetched again from the bucket (only that part).
- A remote listing survives an unreadable manifest; such a cache can still be removed.
- Copies of two remotes sharing one local root: each store lists its own; replacing one
  remote's copy with another's build says so.

Buckets are real: a directory (``file://``) and, where the cloud matters, moto's S3 server.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Builds, Cloud, CountingStore, dataset, expected_keys, reader_keys
from yogacache.backends.files import FileObjectStore
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.sources import source_for
from yogacache.store.remote import LOCAL_CACHE_DIR, ORIGIN_NAME, RemoteCacheStore, read_origin

PART_SIZE = 100_000


@pytest.fixture(params=["file", "s3"])
def bucket_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A factory of ObjectStores on one bucket: a directory, or a bucket on moto's server."""
    if request.param == "file":
        return lambda: FileObjectStore(tmp_path / "bucket")
    cloud = Cloud("s3", request.getfixturevalue("s3_server"))
    bucket = cloud.new_bucket()
    return lambda: cloud.store(bucket, "caches")


def node(objects: Any, root: Path, **options: Any) -> RemoteCacheStore:
    return RemoteCacheStore(objects, root, part_size_bytes=PART_SIZE, show_progress=False, **options)


def test_planted_copy_with_the_published_manifest_is_not_served(bucket_store: Any, tmp_path: Path) -> None:
    """Another user plants ``yogadl_local_cache/ds/v1`` holding the published manifest itself and
    parts of the right sizes but their own records: the victim gets the published records."""
    published = node(bucket_store(), tmp_path / "builder").build("ds", "v1", dataset(1500))
    planted_by = node(FileObjectStore(tmp_path / "other"), tmp_path / "attacker")
    planted = planted_by.local.build_locked("ds", "v1", source_for(dataset(1500, 7)))
    assert [p.size_bytes for p in planted.parts] == [p.size_bytes for p in published.parts]

    victim_root = tmp_path / "victim"
    target = victim_root / LOCAL_CACHE_DIR / "ds" / "v1"
    target.parent.mkdir(parents=True)
    shutil.copytree(planted_by.local.cache_dir("ds", "v1"), target)
    (target / MANIFEST_NAME).write_bytes(published.to_bytes())  # the published (created_at, build_id)

    objects = CountingStore(bucket_store())
    reader = node(objects, victim_root).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(1500)
    assert objects.counts()["download_file"] == len(published.parts)


def test_planted_copy_with_the_published_identity_and_other_part_hashes_is_replaced(
    bucket_store: Any, tmp_path: Path
) -> None:
    """The planted manifest carries the published (created_at, build_id) and its own part list."""
    published = node(bucket_store(), tmp_path / "builder").build("ds", "v1", dataset(300))
    attacker = node(FileObjectStore(tmp_path / "other"), tmp_path / "attacker")
    attacker.local.build_locked("ds", "v1", source_for(dataset(300, 7)))

    victim_root = tmp_path / "victim"
    target = victim_root / LOCAL_CACHE_DIR / "ds" / "v1"
    target.parent.mkdir(parents=True)
    shutil.copytree(attacker.local.cache_dir("ds", "v1"), target)
    raw = json.loads((target / MANIFEST_NAME).read_text())
    raw["created_at"], raw["build_id"] = published.created_at, published.build_id
    (target / MANIFEST_NAME).write_text(json.dumps(raw))
    assert Manifest.load(target).freshness == published.freshness

    reader = node(bucket_store(), victim_root).get_or_build("ds", "v1", Builds(None))
    assert reader_keys(reader) == expected_keys(300)
    assert Manifest.load(target).to_json() == published.to_json()


@pytest.mark.parametrize("damage", ["flip-byte", "truncate", "delete"])
def test_a_damaged_part_of_a_local_copy_is_fetched_again(bucket_store: Any, tmp_path: Path, damage: str) -> None:
    published = node(bucket_store(), tmp_path / "builder").build("ds", "v1", dataset(1500))
    assert len(published.parts) >= 3
    node(bucket_store(), tmp_path / "node").open("ds", "v1").close()
    target = tmp_path / "node" / LOCAL_CACHE_DIR / "ds" / "v1"
    part = target / published.parts[1].name
    if damage == "flip-byte":
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0x01
        part.write_bytes(bytes(data))
    elif damage == "truncate":
        part.write_bytes(part.read_bytes()[:1000])
    else:
        part.unlink()

    objects = CountingStore(bucket_store())
    reader = node(objects, tmp_path / "node").open("ds", "v1")  # not "remove the cache and rebuild it"
    assert reader_keys(reader) == expected_keys(1500)
    assert [key for method, key in objects.calls if method == "download_file"] == [
        f"ds/v1/{published.build_id}-{published.parts[1].name}"
    ]
    assert reader.directory == target


def test_remote_list_marks_an_unreadable_manifest_and_remove_still_works(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    store = node(FileObjectStore(bucket), tmp_path / "node")
    store.build("good", "v1", dataset(10))
    for version, body in (("v2", b""), ("v3", b"{not json"), ("v4", None)):
        store.build("bad", version, dataset(10))
        manifest_path = bucket / "bad" / version / MANIFEST_NAME
        if body is None:  # a future format version
            raw = json.loads(manifest_path.read_text())
            raw["format_version"] = 99
            body = json.dumps(raw).encode()
        manifest_path.write_bytes(body)

    entries = {(e.dataset_id, e.dataset_version): e for e in store.list()}
    assert sorted(entries) == [("bad", "v2"), ("bad", "v3"), ("bad", "v4"), ("good", "v1")]
    assert entries[("good", "v1")].error is None and entries[("good", "v1")].remote is not None
    for version in ("v2", "v3"):
        entry = entries[("bad", version)]
        assert entry.remote is None and entry.error and "manifest" in entry.error
        assert entry.remote_url == store.location("bad", version)
    assert "format version 99" in (entries[("bad", "v4")].error or "")

    for version in ("v2", "v3", "v4"):
        removed = store.remove("bad", version, remote=True, local=True)
        assert store.location("bad", version) in removed
        assert not (bucket / "bad" / version).exists() or not any((bucket / "bad" / version).iterdir())
    assert [(e.dataset_id, e.dataset_version) for e in store.list()] == [("good", "v1")]


def test_two_remotes_sharing_a_local_root_list_only_their_own_and_warn_on_replace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local = tmp_path / "shared-local"
    first = node(FileObjectStore(tmp_path / "bucket-1"), local)
    second = node(FileObjectStore(tmp_path / "bucket-2"), local)
    first.build("only-first", "v1", dataset(10))
    second.build("only-second", "v1", dataset(10))
    assert read_origin(local / LOCAL_CACHE_DIR / "only-first" / "v1") == first.remote_url

    assert [(e.dataset_id, e.where) for e in first.list()] == [("only-first", "remote+local")]
    assert [(e.dataset_id, e.where) for e in second.list()] == [("only-second", "remote+local")]

    # The same id and version on both remotes: syncing one replaces the other's copy, loudly.
    node(FileObjectStore(tmp_path / "bucket-1"), tmp_path / "builder-1").build("ds", "v1", dataset(10))
    node(FileObjectStore(tmp_path / "bucket-2"), tmp_path / "builder-2").build("ds", "v1", dataset(10, 5))
    assert reader_keys(first.open("ds", "v1")) == expected_keys(10)
    with caplog.at_level(logging.WARNING, logger="yogacache.store.remote"):
        assert reader_keys(second.open("ds", "v1")) == expected_keys(10, 5)
    warned = [r.getMessage() for r in caplog.records if "Two remotes share" in r.getMessage()]
    assert len(warned) == 1 and first.remote_url in warned[0] and str(tmp_path / "bucket-2") in warned[0]
    assert read_origin(local / LOCAL_CACHE_DIR / "ds" / "v1") == second.remote_url
    assert ("ds", "v1") not in {(e.dataset_id, e.dataset_version) for e in first.list() if e.local_path}
    assert (local / LOCAL_CACHE_DIR / "ds" / "v1" / ORIGIN_NAME).stat().st_mode & 0o022 == 0
