"""``yogacache copy`` against real servers: two moto servers (two "regions"), fake-gcs-server and
a directory, in every direction.

- The copy keeps the cache's identity (build id, created_at, part SHA-256s) and adds each part's
  CRC32C; a node syncing from the destination reads the same records, and a node already holding
  the source's build downloads nothing.
- Within one S3 endpoint and within GCS the parts never pass through the client (bytes counted
  by the fault proxy); across servers they stream through it.
- A destination part altered after the copy is found from the store's own checksum and copied
  again; a damaged source part is refused before anything is published.
- Another build at the destination is refused unless replacing is asked for.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import (
    Cloud,
    CountingStore,
    dataset,
    expected_keys,
    publish_as_before_crc32c,
    reader_keys,
    unique,
)
from tests.faultproxy import FaultProxy
from yogacache.backends.azure import AzureObjectStore
from yogacache.backends.files import FileObjectStore
from yogacache.backends.gcs import GCSObjectStore
from yogacache.backends.s3 import S3ObjectStore
from yogacache.errors import CacheNotFoundError, CorruptCacheError, InvalidNameError
from yogacache.format.checksum import crc32c_of
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.copy import CacheLocation, CopyRefusedError, check_copy, copy_cache
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore

PART_SIZE = 100_000
N = 1000  # about 5 parts of PART_SIZE


class Place:
    """One storage of a test: a bucket on one of the servers, or a directory."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "dir":
            self.root = tmp_path / unique("dir")
            self.objects: Any = FileObjectStore(self.root)
            return
        servers = {"s3": "s3_server", "s3b": "s3_server_b", "gcs": "gcs_server", "azure": "azure_server"}
        self.cloud = Cloud("s3" if kind == "s3b" else kind, request.getfixturevalue(servers[kind]))
        self.bucket = self.cloud.new_bucket()
        self.objects = self.cloud.store(self.bucket, "caches")

    def raw_put(self, key: str, data: bytes) -> None:
        if self.kind == "dir":
            (self.root / key).write_bytes(data)
        else:
            self.cloud.raw_put(self.bucket, f"caches/{key}", data)

    def raw_get(self, key: str) -> bytes:
        if self.kind == "dir":
            return (self.root / key).read_bytes()
        return self.cloud.raw_get(self.bucket, f"caches/{key}")


def node(objects: Any, root: Path) -> RemoteCacheStore:
    return RemoteCacheStore(objects, root, part_size_bytes=PART_SIZE, show_progress=False)


def publish(place: Place, tmp_path: Path, n: int = N, fill: int = 0, crc32c: bool = False) -> Manifest:
    """Builds and publishes ``ds:v1`` at ``place``; unless ``crc32c``, as a release before 0.2
    published it (no part CRC32Cs: the copy has to add them)."""
    built = node(place.objects, tmp_path / unique("builder")).get_or_build("ds", "v1", lambda: dataset(n, fill))
    if not crc32c:
        publish_as_before_crc32c(place.objects, "ds", "v1")
    return built.manifest


def published(place: Place) -> Manifest:
    return Manifest.from_bytes(place.raw_get(f"ds/v1/{MANIFEST_NAME}"), "test")


DIRECTIONS = [
    ("s3", "s3b", False),  # two S3 servers: streamed through the client
    ("s3", "s3", True),  # one endpoint, two buckets: CopyObject
    ("s3", "gcs", False),
    ("gcs", "s3", False),
    ("gcs", "gcs", True),  # rewrite
    ("dir", "s3", False),
    ("s3", "dir", False),
    ("gcs", "dir", False),
    ("dir", "gcs", False),
    ("azure", "azure", True),  # one account, two containers: Copy Blob
    ("s3", "azure", False),
    ("azure", "gcs", False),
    ("dir", "azure", False),
]


@pytest.mark.parametrize(("source_kind", "target_kind", "server_side"), DIRECTIONS)
def test_a_copy_keeps_the_cache_identity_in_every_direction(
    source_kind: str, target_kind: str, server_side: bool, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place(source_kind, request, tmp_path), Place(target_kind, request, tmp_path)
    original = publish(source, tmp_path)
    assert len(original.parts) >= 4
    # A node that already holds the source's build.
    reader_root = tmp_path / "reader"
    node(source.objects, reader_root).open("ds", "v1")

    report = copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)

    assert report.published and report.kept == []
    assert len(report.copied) == len(original.parts)
    assert len(report.copied_server_side) == (len(original.parts) if server_side else 0)
    assert report.bytes_through_client == (0 if server_side else original.total_size_bytes)
    copied = published(target)
    assert copied.freshness == original.freshness
    assert [p.digest for p in copied.parts] == [p.digest for p in original.parts]
    for part in copied.parts:  # the CRC32C recorded is the CRC32C of the bytes at the destination
        data = target.raw_get(f"ds/v1/{copied.build_id}-{part.name}")
        assert part.crc32c == crc32c_of(data)
    # A fresh node reads the same records from the destination ...
    assert reader_keys(node(target.objects, tmp_path / "fresh").open("ds", "v1")) == expected_keys(N)
    # ... and the node holding the source's build sees it as current: nothing is downloaded.
    counting = CountingStore(target.objects)
    assert reader_keys(node(counting, reader_root).open("ds", "v1")) == expected_keys(N)
    assert counting.counts()["download_file"] == 0
    assert check_copy(target.objects, "ds", "v1") == []
    # The source was built before manifests carried CRC32Cs: the copy added them there too,
    # keeping the build's identity, so its readers download nothing either.
    at_source = published(source)
    assert at_source.freshness == original.freshness
    assert [p.crc32c for p in at_source.parts] == [p.crc32c for p in copied.parts]
    counting = CountingStore(source.objects)
    assert reader_keys(node(counting, reader_root).open("ds", "v1")) == expected_keys(N)
    assert counting.counts()["download_file"] == 0


@pytest.mark.parametrize("target_kind", ["s3b", "gcs"])
def test_a_cache_built_with_crc32cs_is_copied_without_writing_to_the_source(
    target_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Builds since 0.2 record each part's CRC32C when they seal it: the copy checks the
    destination against those, and leaves the source as it was (no rewrite onto itself)."""
    source, target = Place("s3", request, tmp_path), Place(target_kind, request, tmp_path)
    original = publish(source, tmp_path, crc32c=True)
    assert all(part.crc32c for part in original.parts)
    manifest_before = source.raw_get(f"ds/v1/{MANIFEST_NAME}")
    tokens_before = {key: source.objects.read(key)[1] for key in (i.key for i in source.objects.list("ds/v1/"))}
    report = copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert report.published and len(report.copied) == len(original.parts)
    assert [p.crc32c for p in published(target).parts] == [p.crc32c for p in original.parts]
    assert source.raw_get(f"ds/v1/{MANIFEST_NAME}") == manifest_before
    assert {key: source.objects.read(key)[1] for key in tokens_before} == tokens_before
    assert check_copy(target.objects, "ds", "v1") == []


def test_a_shared_fs_cache_copies_to_a_bucket_and_back(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    built = (
        CacheStore(shared, part_size_bytes=PART_SIZE, show_progress=False)
        .get_or_build("ds", "v1", lambda: dataset(N))
        .manifest
    )
    bucket = Place("s3", request, tmp_path)
    config = {"type": "shared_fs", "host_storage_path": str(shared)}
    report = copy_cache(config, bucket.objects, "ds", "v1", show_progress=False)
    assert report.published and published(bucket).freshness == built.freshness
    back = tmp_path / "back" / "made"  # a destination directory is made, as export --to makes its own
    copy_cache(bucket.objects, str(back), "ds", "v1", show_progress=False)
    # The copy back is a sealed cache directory a local store opens (parts named part-NNNNN).
    reader = CacheStore(back, show_progress=False).open("ds", "v1")
    assert reader.manifest.freshness == built.freshness
    assert reader_keys(reader) == expected_keys(N)


def proxied(place: Place, proxy: FaultProxy) -> Any:
    """A store for ``place``'s bucket that talks through ``proxy``."""
    if place.kind == "gcs":
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        client = storage.Client(
            project="test-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": proxy.url}
        )
        return GCSObjectStore(place.bucket, "caches", client=client)
    if place.kind == "azure":
        connection_string = place.cloud.server.connection_string_at(proxy.url)
        return AzureObjectStore(place.bucket, "caches", connection_string=connection_string)
    return S3ObjectStore(place.bucket, "caches", endpoint_url=proxy.url)


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_server_side_copy_sends_no_part_byte_through_the_client(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place(kind, request, tmp_path), Place(kind, request, tmp_path)
    original = publish(source, tmp_path)
    upstream = source.cloud.server_url
    with FaultProxy(upstream) as proxy:
        report = copy_cache(proxied(source, proxy), proxied(target, proxy), "ds", "v1", show_progress=False)
        assert proxy.requests(path_contains="-part-")  # the copies did go through the proxy
        assert proxy.body_bytes("-part-") < 64 * len(original.parts) * 100
        # Everything else is the two manifests and a few XML/JSON answers.
        assert proxy.body_bytes() < 4 * len(original.to_bytes()) + 64 * 1024
        assert proxy.body_bytes() < original.total_size_bytes // 4
    assert report.copied_server_side and report.bytes_through_client == 0
    assert reader_keys(node(target.objects, tmp_path / "n").open("ds", "v1")) == expected_keys(N)

    # The counter does count part bytes: a streamed copy through the same proxy moves them all.
    other = Place("s3b", request, tmp_path)
    with FaultProxy(upstream) as proxy:
        copy_cache(proxied(source, proxy), other.objects, "ds", "v1", show_progress=False)
        streamed = proxy.body_bytes("-part-")
        assert streamed >= original.total_size_bytes


@pytest.mark.parametrize("target_kind", ["gcs", "s3b", "dir", "azure"])
def test_a_destination_part_altered_after_the_copy_is_found_and_copied_again(
    target_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place("s3", request, tmp_path), Place(target_kind, request, tmp_path)
    original = publish(source, tmp_path)
    copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    victim = original.parts[3]
    key = f"ds/v1/{original.build_id}-{victim.name}"
    good = target.raw_get(key)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # same size, one byte changed
    target.raw_put(key, bytes(bad))

    assert check_copy(target.objects, "ds", "v1") == [victim.name]
    report = copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert report.copied == [victim.name]
    assert len(report.kept) == len(original.parts) - 1
    assert not report.published  # the same build was already published: only repaired
    assert target.raw_get(key) == good
    assert check_copy(target.objects, "ds", "v1") == []


def test_a_damaged_source_part_is_refused_and_nothing_is_published(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place("s3", request, tmp_path), Place("s3b", request, tmp_path)
    original = publish(source, tmp_path)
    key = f"ds/v1/{original.build_id}-{original.parts[1].name}"
    data = bytearray(source.raw_get(key))
    data[10] ^= 0x01
    source.raw_put(key, bytes(data))
    with pytest.raises(CorruptCacheError, match=r"part-00001.*does not match its manifest.*nothing was published"):
        copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert target.objects.read(f"ds/v1/{MANIFEST_NAME}") is None
    assert target.objects.checksum(key) is None  # the bad copy was deleted


@pytest.mark.parametrize("kind", ["azure", "s3", "gcs"])
def test_a_source_part_rewritten_by_another_tool_is_refused_by_a_server_side_copy(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A part rewritten in place by another tool (same size, one byte changed) under a manifest
    that carries CRC32Cs: a copy within one service is refused, naming the part; nothing is
    published and no part object is left at the destination. On Azure the copy carries no CRC32C
    at all (the other writer replaced the blob's metadata): it is not taken on trust."""
    source, target = Place(kind, request, tmp_path), Place(kind, request, tmp_path)
    original = publish(source, tmp_path, crc32c=True)
    victim = original.parts[2]
    key = f"ds/v1/{original.build_id}-{victim.name}"
    data = bytearray(source.raw_get(key))
    data[len(data) // 3] ^= 0x01
    source.raw_put(key, bytes(data))
    with pytest.raises(CorruptCacheError, match=rf"part {victim.name}\b.*nothing was published"):
        copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert target.objects.read(f"ds/v1/{MANIFEST_NAME}") is None
    assert [info.key for info in target.objects.list("ds/v1/") if "-part-" in info.key] == []


def test_an_azure_part_rewritten_with_the_same_bytes_is_checked_and_copied(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The same bytes put back by another tool: the blob lost the CRC32C yogacache keeps in its
    metadata, so the copy within the account streams that part, checks its content hash, and
    publishes it with its CRC32C; the destination then verifies from its own checksums."""
    source, target = Place("azure", request, tmp_path), Place("azure", request, tmp_path)
    original = publish(source, tmp_path, crc32c=True)
    victim = original.parts[1]
    key = f"ds/v1/{original.build_id}-{victim.name}"
    source.raw_put(key, source.raw_get(key))  # same bytes, written by another client
    assert source.objects.checksum(key).crc32c is None
    report = copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert report.published and report.streamed == [victim.name]
    assert sorted(report.copied_server_side) == sorted(p.name for p in original.parts if p.name != victim.name)
    assert check_copy(target.objects, "ds", "v1") == []
    reader = node(target.objects, tmp_path / "reader").open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)


def test_another_build_at_the_destination_is_refused_unless_replacing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place("s3", request, tmp_path), Place("gcs", request, tmp_path)
    original = publish(source, tmp_path)
    other = publish(target, tmp_path, n=50, fill=7)
    before = target.raw_get(f"ds/v1/{MANIFEST_NAME}")
    with pytest.raises(CopyRefusedError, match=rf"holds build {other.build_id}.*Pass --replace"):
        copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    assert target.raw_get(f"ds/v1/{MANIFEST_NAME}") == before  # nothing lost
    assert reader_keys(node(target.objects, tmp_path / "a").open("ds", "v1")) == expected_keys(50, 7)

    report = copy_cache(source.objects, target.objects, "ds", "v1", replace_other=True, show_progress=False)
    assert report.published and report.replaced_build == other.build_id
    assert published(target).freshness == original.freshness
    keys = [info.key for info in target.objects.list("ds/v1/")]
    assert not any(key.startswith(f"ds/v1/{other.build_id}-") for key in keys)  # old parts removed
    assert reader_keys(node(target.objects, tmp_path / "b").open("ds", "v1")) == expected_keys(N)


def test_of_two_concurrent_copies_one_publishes_and_both_succeed(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source, target = Place("gcs", request, tmp_path), Place("s3", request, tmp_path)
    original = publish(source, tmp_path)
    reports: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def run() -> None:
        start.wait()
        try:
            reports.append(copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(report.published for report in reports) == [False, True]
    assert published(target).freshness == original.freshness
    assert check_copy(target.objects, "ds", "v1") == []
    assert reader_keys(node(target.objects, tmp_path / "n").open("ds", "v1")) == expected_keys(N)


def test_bad_requests_get_clear_errors(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source, target = Place("s3", request, tmp_path), Place("dir", request, tmp_path)
    with pytest.raises(CacheNotFoundError, match=r"no cache for dataset 'ds' version 'v1' at s3://"):
        copy_cache(source.objects, target.objects, "ds", "v1", show_progress=False)
    with pytest.raises(InvalidNameError):
        copy_cache(source.objects, target.objects, "../x", "v1", show_progress=False)
    with pytest.raises(Exception, match="does not exist"):
        copy_cache(str(tmp_path / "nowhere"), target.objects, "ds", "v1", show_progress=False)
    assert not target.root.exists()  # nothing was written


def test_the_cli_copies_between_two_s3_servers_given_as_config_files(
    request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from yogacache.cli import main

    source, target = Place("s3", request, tmp_path), Place("s3b", request, tmp_path)
    original = publish(source, tmp_path)
    configs = []
    for place in (source, target):
        path = tmp_path / f"{unique('cfg')}.json"
        path.write_text(json.dumps(place.cloud.config(place.bucket, "caches")))
        configs.append(str(path))
    assert main(["copy", "ds", "v1", "--from", configs[0], "--to", configs[1]]) == 0
    out = capsys.readouterr().out
    assert f"build {original.build_id}" in out and "published" in out
    assert main(["copy", "ds", "v1", "--from", configs[0], "--to", configs[1]]) == 0
    assert "already published there" in capsys.readouterr().out
    assert published(target).freshness == original.freshness

    other = Place("s3b", request, tmp_path)
    publish(other, tmp_path, n=30, fill=3)
    other_config = tmp_path / "other.json"
    other_config.write_text(json.dumps(other.cloud.config(other.bucket, "caches")))
    assert main(["copy", "ds", "v1", "--from", configs[0], "--to", str(other_config)]) == 1
    err = capsys.readouterr().err
    assert "Pass --replace" in err and "testing-secret" not in err
    assert main(["copy", "ds", "v1", "--from", configs[0], "--to", str(other_config), "--replace"]) == 0
    assert main(["copy", "ds", "v1", "--from", configs[0], "--to", configs[1], "--threads", "0"]) == 1
    assert "--threads must be at least 1" in capsys.readouterr().err


def test_location_layouts() -> None:
    objects: Any = FileObjectStore("/tmp/unused-root")
    manifest_like: Any = type("M", (), {"dataset_id": "a", "dataset_version": "v", "build_id": "b1"})()
    part: Any = type("P", (), {"name": "part-00000.mdb"})()
    assert CacheLocation(objects).part_key(manifest_like, part) == "a/v/b1-part-00000.mdb"
    assert CacheLocation(objects, build_prefixed=False).part_key(manifest_like, part) == "a/v/part-00000.mdb"


def test_the_cli_copies_between_urls(request: pytest.FixtureRequest, tmp_path: Path, capsys: Any) -> None:
    from yogacache.cli import main

    source = Place("gcs", request, tmp_path)
    original = publish(source, tmp_path)
    target = tmp_path / "bucket-like"
    assert main(["copy", "ds", "v1", "--from", f"gs://{source.bucket}/caches", "--to", f"file://{target}"]) == 0
    out = capsys.readouterr().out
    assert f"{len(original.parts)} part(s) copied (0 server-side), 0 already there" in out
    # The file:// destination has the bucket layout: a RemoteCacheStore on it reads the cache.
    reader = node(FileObjectStore(target), tmp_path / "n").open("ds", "v1")
    assert reader.manifest.freshness == original.freshness
    assert reader_keys(reader) == expected_keys(N)
    assert main(["copy", "ds", "v2", "--from", f"gs://{source.bucket}/caches", "--to", f"file://{target}"]) == 1
    assert "no cache for dataset 'ds' version 'v2'" in capsys.readouterr().err
