"""Faults during a streamed copy, injected by the fault proxy in front of the source server: a
stream cut part-way is started over; a source that keeps failing fails the copy with a clear
error and publishes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import FAST_RETRY, Cloud, dataset, expected_keys, publish_as_before_crc32c, reader_keys
from tests.faultproxy import FaultProxy
from yogacache.backends.base import RemoteError
from yogacache.backends.s3 import S3ObjectStore
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.store.copy import copy_cache
from yogacache.store.remote import RemoteCacheStore

PART_SIZE = 100_000
N = 800


@pytest.fixture
def published(s3_server: Any, s3_server_b: Any, tmp_path: Path) -> Any:
    source = Cloud("s3", s3_server)
    bucket = source.new_bucket()
    objects = S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url)
    builder = RemoteCacheStore(objects, tmp_path / "builder", part_size_bytes=PART_SIZE, show_progress=False)
    manifest = builder.get_or_build("ds", "v1", lambda: dataset(N)).manifest
    publish_as_before_crc32c(objects, "ds", "v1")  # a cache of a release that recorded none
    target = Cloud("s3", s3_server_b)
    target_bucket = target.new_bucket()
    destination = S3ObjectStore(target_bucket, "caches", endpoint_url=s3_server_b.endpoint_url)
    proxy = FaultProxy(s3_server.endpoint_url)
    yield manifest, S3ObjectStore(bucket, "caches", endpoint_url=proxy.url, retry=FAST_RETRY), destination, proxy
    proxy.stop()


def test_a_stream_cut_part_way_is_started_over(published: Any, tmp_path: Path) -> None:
    manifest, source, destination, proxy = published
    part = manifest.parts[1].name
    proxy.add_rule(action="truncate", method="GET", path_contains=part, after_bytes=5000, times=1)
    report = copy_cache(source, destination, "ds", "v1", show_progress=False)
    assert report.published
    assert [e.action for e in proxy.requests("GET", part)] == ["truncate", "forwarded"]
    reader = RemoteCacheStore(destination, tmp_path / "reader", show_progress=False).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)


def test_a_source_that_keeps_failing_fails_the_copy_and_publishes_nothing(published: Any) -> None:
    manifest, source, destination, proxy = published
    part = manifest.parts[2].name
    proxy.add_rule(action="status", status=503, method="GET", path_contains=part)
    with pytest.raises(RemoteError, match=r"GET s3://.*part-00002.mdb failed after 2 attempt\(s\): HTTP 503") as raised:
        copy_cache(source, destination, "ds", "v1", show_progress=False)
    assert "testing-secret" not in str(raised.value)
    assert destination.read(f"ds/v1/{MANIFEST_NAME}") is None
    # A failed copy leaves nothing at the destination: no part it uploaded, no build lease.
    assert [info.key for info in destination.list("")] == []
    # Once the source answers again, the copy runs again and publishes.
    proxy.clear_rules()
    report = copy_cache(source, destination, "ds", "v1", show_progress=False)
    assert report.published and part in report.copied


def test_a_read_only_source_of_an_old_cache_is_copied_with_checksums_computed_on_the_way(
    published: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An S3 source without CRC32Cs that refuses the copy onto itself (no write access): the copy
    computes each part's CRC32C while streaming it and checks the destination's against it."""
    import logging

    from yogacache.format.manifest import Manifest
    from yogacache.store.copy import check_copy

    manifest, source, destination, proxy = published
    proxy.add_rule(action="status", status=403, method="PUT")  # read-only: every write refused
    with caplog.at_level(logging.WARNING, logger="yogacache.store.copy"):
        report = copy_cache(source, destination, "ds", "v1", show_progress=False)
    assert "could not have" in caplog.text and "testing-secret" not in caplog.text
    assert report.published and len(report.streamed) == len(manifest.parts)
    found = destination.read(f"ds/v1/{MANIFEST_NAME}")
    assert found is not None
    copied = Manifest.from_bytes(found[0], "dest")
    assert all(part.crc32c for part in copied.parts)
    assert check_copy(destination, "ds", "v1") == []
    assert not proxy.requests("PUT", action="forwarded")  # the source was never written


def test_a_different_build_published_during_the_copy_wins_and_the_copy_says_so(tmp_path: Path) -> None:
    """The manifest is created conditionally: a build another process publishes at the destination
    while the copy runs stays published, and the copy raises CopyConflictError."""
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.copy import CopyConflictError

    source = FileObjectStore(tmp_path / "source")
    RemoteCacheStore(source, tmp_path / "a", part_size_bytes=PART_SIZE, show_progress=False).get_or_build(
        "ds", "v1", lambda: dataset(N)
    )
    other_root = FileObjectStore(tmp_path / "other")
    other = RemoteCacheStore(other_root, tmp_path / "b", show_progress=False).get_or_build(
        "ds", "v1", lambda: dataset(20, 9)
    )
    other_manifest = (tmp_path / "other" / "ds" / "v1" / MANIFEST_NAME).read_bytes()

    class RacedDestination(FileObjectStore):
        def write(self, key: str, data: bytes, *, if_absent: bool = False, if_token: Any = None) -> Any:
            if key.endswith(MANIFEST_NAME) and if_absent:
                super().write(key, other_manifest)  # another process publishes first
            return super().write(key, data, if_absent=if_absent, if_token=if_token)

    destination = RacedDestination(tmp_path / "dest")
    with pytest.raises(CopyConflictError, match=r"another process published .* the other build stays published"):
        copy_cache(source, destination, "ds", "v1", show_progress=False)
    assert (tmp_path / "dest" / "ds" / "v1" / MANIFEST_NAME).read_bytes() == other_manifest
    assert other.manifest.build_id.encode() in other_manifest


def test_a_build_finishing_after_a_copy_published_does_not_publish_nor_delete_the_copy(tmp_path: Path) -> None:
    """A copy and a build of one (id, version) at one destination cannot both publish: both create
    the manifest conditionally. The build that loses leaves the copied build whole (its clean-up
    keeps the parts the published manifest names)."""
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.copy import check_copy

    source = FileObjectStore(tmp_path / "source")
    copied = RemoteCacheStore(source, tmp_path / "a", part_size_bytes=PART_SIZE, show_progress=False).get_or_build(
        "ds", "v1", lambda: dataset(N)
    )
    # A builder of another build of ds v1 (its local copy complete, not yet published) ...
    built = RemoteCacheStore(FileObjectStore(tmp_path / "elsewhere"), tmp_path / "b", show_progress=False)
    other = built.get_or_build("ds", "v1", lambda: dataset(20, 9)).manifest
    destination = FileObjectStore(tmp_path / "dest")
    # ... while the copy publishes first.
    assert copy_cache(source, destination, "ds", "v1", show_progress=False).published
    builder = RemoteCacheStore(destination, tmp_path / "b", show_progress=False)
    assert builder.publish_locked(other) is False
    found = destination.read(f"ds/v1/{MANIFEST_NAME}")
    assert found is not None and copied.manifest.build_id.encode() in found[0]
    assert other.build_id.encode() not in found[0]
    assert check_copy(destination, "ds", "v1") == []
    reader = RemoteCacheStore(destination, tmp_path / "c", show_progress=False).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)
