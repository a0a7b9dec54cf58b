"""Parallel builds from object sources (``from_url``): one build shard per tar shard or run of
files, built by worker processes; the same cache for any number of workers, the same records in
the same order as a build in one process, the source pins recorded, and ``yogacache import
--workers``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.servers import S3Server
from tests.sources_helpers import tar_bytes
from yogacache import cli
from yogacache.parallel import sharded
from yogacache.parallel.shards import ObjectsShard, as_shards
from yogacache.sources import from_url
from yogacache.sources.freshness import check_pins, pins_of
from yogacache.store import open_store
from yogacache.store.local import CacheStore


def write_tars(root: Path, shards: int = 5, per_shard: int = 7) -> Path:
    root.mkdir(parents=True)
    for shard in range(shards):
        members = {}
        for index in range(per_shard):
            key = f"s{shard:02d}-{index:03d}"
            members[f"{key}.jpg"] = bytes([shard, index]) * (50 + index)
            members[f"{key}.cls"] = str((shard + index) % 3).encode()
        (root / f"train-{shard:06d}.tar").write_bytes(tar_bytes(members))
    return root


def hashes(manifest: Any) -> list[tuple[int, str]]:
    return [(part.num_records, part.digest) for part in manifest.parts]


def test_one_build_shard_per_tar_and_the_same_cache_for_any_number_of_workers(tmp_path: Path) -> None:
    shards = write_tars(tmp_path / "src")
    source = from_url(str(shards) + "/")
    planned = as_shards(source)
    assert len(planned) == 5 and all(isinstance(shard, ObjectsShard) for shard in planned)
    assert [len(shard.recipe["objects"]) for shard in planned] == [1] * 5
    one = CacheStore(tmp_path / "one", show_progress=False)
    one.build("d", "v1", from_url(str(shards) + "/"))
    expected = [dict(record) for record in _records(one)]
    manifests = {}
    for workers in (1, 2, 3):
        store = CacheStore(tmp_path / f"w{workers}", show_progress=False)
        manifests[workers] = store.build("d", "v1", sharded(from_url(str(shards) + "/"), workers=workers))
        assert _records(store) == expected  # the records of the one-process build, in order
    assert hashes(manifests[1]) == hashes(manifests[2]) == hashes(manifests[3])
    assert len(manifests[2].parts) == 5  # one part per shard at this size
    pins = pins_of(manifests[2])
    assert pins is not None and len(pins["objects"]) == 5 and not check_pins(pins).changed


def _records(store: CacheStore) -> list[dict[str, Any]]:
    reader = store.open("d", "v1")
    try:
        return [
            {key: bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else value.tolist()
             for key, value in element.items()}
            for element in reader.read_elements(range(len(reader)))
        ]
    finally:
        reader.close()


def test_imagefolder_files_in_runs_keep_one_class_table(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for label in ("cat", "dog", "eel"):
        (root / label).mkdir(parents=True)
        for index in range(5):
            (root / label / f"{index}.png").write_bytes(f"{label}{index}".encode())
    source = from_url(str(root), format="imagefolder")
    recipes = source.shard_recipes(files_per_shard=4)
    assert [len(recipe["objects"]) for recipe in recipes] == [4, 4, 4, 3]
    assert all(recipe["classes"] == {"cat": 0, "dog": 1, "eel": 2} for recipe in recipes)
    one = CacheStore(tmp_path / "one", show_progress=False)
    one.build("d", "v1", from_url(str(root), format="imagefolder"))
    two = CacheStore(tmp_path / "two", show_progress=False)
    import yogacache.sources.source as module

    saved = module.FILES_PER_BUILD_SHARD
    module.FILES_PER_BUILD_SHARD = 4
    try:
        manifest = two.build("d", "v1", sharded(from_url(str(root), format="imagefolder"), workers=2))
    finally:
        module.FILES_PER_BUILD_SHARD = saved
    assert _records(two) == _records(one)
    assert [int(r["cls"]) for r in _records(two)] == [0] * 5 + [1] * 5 + [2] * 5
    pins = pins_of(manifest)
    assert pins is not None and pins["class_to_idx"] == {"cat": 0, "dog": 1, "eel": 2}


def test_a_bad_archive_names_its_build_shard_and_nothing_is_cached(tmp_path: Path) -> None:
    shards = write_tars(tmp_path / "src", shards=3)
    (shards / "train-000001.tar").write_bytes(tar_bytes({"a.jpg": b"x"})[:700])  # truncated
    store = CacheStore(tmp_path / "caches", show_progress=False)
    with pytest.raises(Exception, match=r"build shard 1|train-000001"):
        store.build("d", "v1", sharded(from_url(str(shards) + "/"), workers=2, retries=0))
    assert not store.exists("d", "v1")


def test_cli_import_with_workers_from_s3(
    tmp_path: Path, s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3_server.new_bucket()
    shards = write_tars(tmp_path / "src", shards=4)
    client = s3_server.client()
    for path in sorted(shards.iterdir()):
        client.put_object(Bucket=bucket, Key=f"wds/{path.name}", Body=path.read_bytes())
    local = tmp_path / "local"
    code = cli.main([
        "import", f"s3://{bucket}/wds/", "--id", "wds", "--version", "v1", "--storage", str(tmp_path / "caches"),
        "--workers", "2", "--source-endpoint-url", s3_server.endpoint_url,
    ])
    assert code == 0, capsys.readouterr().err
    assert "imported wds v1: 28 records" in capsys.readouterr().out
    store = open_store(str(tmp_path / "caches"), local_cache=str(local), show_progress=False)
    reader = store.open("wds", "v1")
    keys = [bytes(element["__key__"]).decode() for element in reader.read_elements(range(len(reader)))]
    reader.close()
    assert keys == [f"s{shard:02d}-{index:03d}" for shard in range(4) for index in range(7)]


def test_cli_import_with_workers_pins_as_one_process_from_a_versioned_bucket(
    tmp_path: Path, s3_server: S3Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/parallel-build.md: a parallel import records the same pins as one process, the
    VersionId each read was served included (a versioned bucket)."""
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    shards = write_tars(tmp_path / "src", shards=3)
    served = {}
    for path in sorted(shards.iterdir()):
        client.put_object(Bucket=bucket, Key=f"wds/{path.name}", Body=b"an older version")
        served[f"s3://{bucket}/wds/{path.name}"] = client.put_object(
            Bucket=bucket, Key=f"wds/{path.name}", Body=path.read_bytes())["VersionId"]
    pins = {}
    for workers in ("1", "2"):
        storage = str(tmp_path / f"caches-{workers}")
        code = cli.main([
            "import", f"s3://{bucket}/wds/", "--id", "wds", "--version", "v1", "--storage", storage,
            "--workers", workers, "--source-endpoint-url", s3_server.endpoint_url,
        ])
        assert code == 0, capsys.readouterr().err
        assert "imported wds v1: 21 records" in capsys.readouterr().out
        pins[workers] = pins_of(open_store(storage, show_progress=False).manifest("wds", "v1"))
    assert pins["1"] is not None and pins["2"] is not None
    assert {pin["url"]: pin.get("version_id") for pin in pins["1"]["objects"]} == served
    assert pins["2"] == pins["1"]
    assert not check_pins(pins["2"]).changed
