"""yogacache.sources against fake-gcs-server: generations pinned and checked, archives read
through ranged reads, an overwrite mid-build, a changed source on a hit, and what the emulator
does not enforce (canary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from tests.servers import GCSServer
from tests.sources_helpers import archive_bytes, cache_files, cache_from, read_back, tar_bytes
from yogacache.sources import SourceChangedError, SourceError, from_url
from yogacache.sources.freshness import check_pins
from yogacache.sources.importer import import_source
from yogacache.store import open_store


@pytest.fixture
def bucket(gcs_server: GCSServer) -> Any:
    return gcs_server.client().bucket(gcs_server.new_bucket())


def upload(bucket: Any, name: str, data: bytes) -> int:
    blob = bucket.blob(name)
    blob.upload_from_string(data)
    return int(blob.generation)


def test_canary_emulator_ignores_if_generation_match_on_reads_but_drops_old_generations(bucket: Any) -> None:
    """fake-gcs-server serves a GET whatever ifGenerationMatch says (real GCS answers 412), so a
    read pinned only by the precondition would not notice an overwrite here. Reads also name the
    generation, which the emulator (without versioning) no longer has after an overwrite: 404."""
    first = upload(bucket, "x", b"one")
    upload(bucket, "x", b"two!")
    assert bucket.blob("x").download_as_bytes(if_generation_match=first, checksum=None) == b"two!"
    with pytest.raises(gexc.NotFound):
        bucket.blob("x", generation=first).download_as_bytes(checksum=None)


@pytest.mark.parametrize("extension", [".tar.gz", ".zip", ".tar.zst"])
def test_archives_from_gcs_with_generations_pinned(tmp_path: Path, bucket: Any, extension: str) -> None:
    members = {}
    for i in range(5):  # a sample's files are consecutive, as in any WebDataset shard
        members[f"s{i}.jpg"] = bytes([i]) * (1000 + i)
        members[f"s{i}.cls"] = b"%d" % i
    generation = upload(bucket, f"data/shard{extension}", archive_bytes(members, extension))
    source = from_url(f"gs://{bucket.name}/data/shard{extension}", format="webdataset")
    ref = cache_from(tmp_path / "caches", source)
    records = read_back(ref)
    assert [bytes(r["__key__"]).decode() for r in records] == [f"s{i}" for i in range(5)]
    assert all(bytes(r["jpg"]) == members[f"s{i}.jpg"] and bytes(r["cls"]) == b"%d" % i
               for i, r in enumerate(records))
    pin = ref.manifest.extra["sources"]["objects"][0]
    assert pin["generation"] == generation and pin["size"] == bucket.get_blob(f"data/shard{extension}").size


def test_an_object_overwritten_mid_build_fails_the_build(tmp_path: Path, bucket: Any) -> None:
    for i in range(3):
        upload(bucket, f"wds/part-{i}.tar", tar_bytes({f"k{i}.txt": b"v%d" % i}))
    source = from_url(f"gs://{bucket.name}/wds/part-{{0..2}}.tar")

    def overwrite(objects: int, size: int, records: int) -> None:
        if objects == 1:
            upload(bucket, "wds/part-2.tar", tar_bytes({"k2.txt": b"replaced"}))

    source.progress = overwrite
    storage = tmp_path / "caches"
    with pytest.raises(SourceChangedError, match=r"part-2\.tar changed or was deleted while it was read"):
        cache_from(storage, source)
    assert cache_files(storage) == []


def test_changed_source_on_hit_errors_and_version_auto_makes_a_new_cache(tmp_path: Path, bucket: Any) -> None:
    upload(bucket, "one.tar", tar_bytes({"a.txt": b"first"}))
    url = f"gs://{bucket.name}/one.tar"
    ref = cache_from(tmp_path / "caches", from_url(url))
    assert not check_pins(ref.manifest.extra["sources"]).changed
    upload(bucket, "one.tar", tar_bytes({"a.txt": b"second"}))
    with pytest.raises(SourceChangedError, match=rf"{url}: size \d+ -> \d+|{url}: etag .* generation"):
        cache_from(tmp_path / "caches", from_url(url))
    store = open_store(str(tmp_path / "caches"), show_progress=False)
    result = import_source(store, "src", from_url(url), "auto", show_progress=False)
    assert result.outcome == "built" and result.manifest.dataset_version.startswith("src-")
    assert store.manifest("src", "v1").num_records == 1  # the old cache stays as it was


def test_generation_parameter_pins_that_generation(tmp_path: Path, bucket: Any) -> None:
    generation = upload(bucket, "g.zip", archive_bytes({"a.txt": b"x"}, ".zip"))
    url = f"gs://{bucket.name}/g.zip"
    ref = cache_from(tmp_path / "c1", from_url(url, generation=generation))
    pin = ref.manifest.extra["sources"]["objects"][0]
    assert pin["generation"] == generation and pin["fixed"] is True
    check = check_pins(ref.manifest.extra["sources"])
    assert not check.changed and check.requests == 1  # one GET of that generation's metadata
    with pytest.raises(SourceError, match=r"g\.zip \(that version\) does not exist"):
        cache_from(tmp_path / "c2", from_url(url, generation=generation + 1))
    assert cache_files(tmp_path / "c2") == []
