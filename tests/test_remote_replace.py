"""Replacing a published cache (YogaDL's ``submit`` "will be overwritten"), against real servers.

- ``build``/``submit`` of a published cache publishes the new build with a replace conditional on
  the manifest the submitter saw; the replaced build's parts are deleted after the replace.
- Readers of the old build holding a local copy keep reading it; a node that was downloading
  the old build when its parts went away fetches the new build instead.
- Of two concurrent submits exactly one wins; the other gets ConcurrentPublishError and leaves
  nothing in the bucket.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from tests.cloud_helpers import Cloud, CountingStore, dataset, expected_keys, reader_keys
from yogacache.backends.base import ProgressCallback
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.store.remote import ConcurrentPublishError, RemoteCacheStore

PREFIX = "caches"
PART_SIZE = 100_000


@pytest.fixture(params=["s3", "gcs"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    kind = request.param
    return Cloud(kind, request.getfixturevalue("s3_server" if kind == "s3" else "gcs_server"))


def node(objects: Any, root: Path, **options: Any) -> RemoteCacheStore:
    return RemoteCacheStore(objects, root, part_size_bytes=PART_SIZE, show_progress=False, **options)


def part_keys(bucket_keys: list[str]) -> set[str]:
    return {key for key in bucket_keys if "-part-" in key}


def test_submit_replaces_the_published_cache_and_old_readers_finish(cloud: Cloud, tmp_path: Path) -> None:
    from yogacache.storage import GCSConfigurations, GCSStorage, S3Configurations, S3Storage

    bucket = cloud.new_bucket()
    if cloud.kind == "s3":
        configurations = S3Configurations(
            bucket, PREFIX, endpoint_url=cloud.server.endpoint_url, local_cache_dir=str(tmp_path / "a")
        )
        storage: Any = S3Storage(configurations)
    else:
        storage = GCSStorage(GCSConfigurations(bucket, PREFIX, local_cache_dir=str(tmp_path / "a")))
    storage.submit(dataset(1500), "ds", "v1")
    old = node(cloud.store(bucket, PREFIX), tmp_path / "b")
    old_reader = old.open("ds", "v1")
    old_build = old_reader.manifest.build_id
    old_parts = part_keys(cloud.raw_keys(bucket))

    storage.submit(dataset(1500, 100), "ds", "v1")  # "will be overwritten", as YogaDL documents

    keys = cloud.raw_keys(bucket)
    new = node(cloud.store(bucket, PREFIX), tmp_path / "c").open("ds", "v1")
    assert new.manifest.build_id != old_build
    assert reader_keys(new) == expected_keys(1500, 100)
    # Only the new build's parts remain in the bucket: the replaced build's were deleted.
    assert part_keys(keys) == {f"{PREFIX}/ds/v1/{new.manifest.build_id}-{p.name}" for p in new.manifest.parts}
    assert not old_parts & set(keys)
    # The reader of the old build reads it whole; its node syncs to the new build on open.
    assert reader_keys(old_reader) == expected_keys(1500)
    assert reader_keys(old.open("ds", "v1")) == expected_keys(1500, 100)


def waiting_records(barrier: threading.Barrier, fill: int) -> Iterator[Any]:
    barrier.wait(timeout=60)  # both submitters have read the published manifest by now
    yield from dataset(300, fill)


def test_of_two_concurrent_submits_exactly_one_wins(cloud: Cloud, tmp_path: Path) -> None:
    bucket = cloud.new_bucket()
    node(cloud.store(bucket, PREFIX), tmp_path / "first").build("ds", "v1", dataset(300))
    barrier = threading.Barrier(2)
    outcome: dict[int, Any] = {}

    def submit(i: int) -> None:
        store = node(cloud.store(bucket, PREFIX), tmp_path / f"node-{i}")
        try:
            outcome[i] = store.build("ds", "v1", waiting_records(barrier, 1000 * (i + 1)))
        except BaseException as error:  # checked below
            outcome[i] = error

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    errors = [v for v in outcome.values() if isinstance(v, BaseException)]
    winners = [i for i, v in outcome.items() if not isinstance(v, BaseException)]
    assert len(winners) == 1 and len(errors) == 1, outcome
    assert isinstance(errors[0], ConcurrentPublishError), errors[0]
    assert "another process published" in str(errors[0]) and "ds:v1" in str(errors[0])

    winner = outcome[winners[0]]
    reader = node(cloud.store(bucket, PREFIX), tmp_path / "reader").open("ds", "v1")
    assert reader.manifest.build_id == winner.build_id
    assert reader_keys(reader) == expected_keys(300, 1000 * (winners[0] + 1))
    # Nothing of the loser (nor of the replaced first build) stays in the bucket.
    assert part_keys(cloud.raw_keys(bucket)) == {
        f"{PREFIX}/ds/v1/{winner.build_id}-{p.name}" for p in winner.parts
    }


class ReplacedMidDownload(CountingStore):
    """Before its first part download, another node replaces the published cache."""

    def __init__(self, inner: Any, replace: Any) -> None:
        super().__init__(inner)
        self.replace: Optional[Any] = replace

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        if self.replace is not None:
            replace, self.replace = self.replace, None
            replace()
        super().download_file(key, path, progress, size=size)


def test_a_node_downloading_a_replaced_build_fetches_the_new_one(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    publisher = node(cloud.store(bucket, PREFIX), tmp_path / "publisher")
    publisher.build("ds", "v1", dataset(1500))
    objects = ReplacedMidDownload(
        cloud.store(bucket, PREFIX), lambda: publisher.build("ds", "v1", dataset(1500, 100))
    )
    reader = node(objects, tmp_path / "downloader", transfer_threads=1).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(1500, 100)
    assert [k for m, k in objects.calls if m == "read"].count(f"ds/v1/{MANIFEST_NAME}") == 2
