"""yogacache.sources against moto's S3 server over HTTP: shards written by webdataset.ShardWriter,
conditional reads (an overwrite mid-build), etag=, a versioned bucket, a changed source on a cache
hit under each on_source_change, the cost of the freshness check, and ``yogacache import``."""

from __future__ import annotations

import io
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import botocore.exceptions
import numpy as np
import pytest
import webdataset as wds

from tests.servers import S3Server
from tests.sources_helpers import archive_bytes, cache_files, cache_from, read_back, tar_bytes
from yogacache import cli
from yogacache.sources import SourceChangedError, from_url
from yogacache.sources.freshness import check_pins
from yogacache.sources.importer import ImportProgress, import_source
from yogacache.store import open_store


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    return s3_server.new_bucket()


def put(s3: S3Server, bucket: str, key: str, data: bytes) -> dict[str, Any]:
    return s3.client().put_object(Bucket=bucket, Key=key, Body=data)  # type: ignore[no-any-return]


def write_shards(tmp_path: Path, count: int = 40, per_shard: int = 10) -> list[Path]:
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(3)
    with wds.ShardWriter(str(shards / "train-%06d.tar"), maxcount=per_shard, verbose=0) as sink:
        for index in range(count):
            sink.write({"__key__": f"img{index:05d}", "jpg": rng.bytes(200 + index), "cls": str(index % 5).encode()})
    return sorted(shards.iterdir())


def test_shardwriter_shards_from_s3_equal_webdatasets_reading(tmp_path: Path, s3_server: S3Server,
                                                              bucket: str) -> None:
    paths = write_shards(tmp_path)
    etags = {}
    for path in paths:
        etags[path.name] = put(s3_server, bucket, f"wds/{path.name}", path.read_bytes())["ETag"].strip('"')
    source = from_url(f"s3://{bucket}/wds/train-{{000000..000003}}.tar", endpoint_url=s3_server.endpoint_url)
    ref = cache_from(tmp_path / "caches", source)
    ours = read_back(ref)
    theirs = list(wds.WebDataset("file:" + str(tmp_path / "shards" / "train-{000000..000003}.tar"),
                                 shardshuffle=False))
    assert len(ours) == len(theirs) == 40
    for mine, reference in zip(ours, theirs):
        assert bytes(mine["__key__"]).decode() == reference["__key__"]
        assert bytes(mine["jpg"]) == reference["jpg"] and bytes(mine["cls"]) == reference["cls"]
    pins = ref.manifest.extra["sources"]["objects"]
    assert [(p["url"], p["etag"], p["size"]) for p in pins] == [
        (f"s3://{bucket}/wds/{path.name}", etags[path.name], path.stat().st_size) for path in paths
    ]
    assert source.access.requests == 1  # four named shards: one LIST of their common prefix


def test_canary_moto_enforces_if_match_on_get(s3_server: S3Server, bucket: str) -> None:
    """Conditional reads are what keeps an overwrite from mixing versions; moto enforces them."""
    put(s3_server, bucket, "k", b"one")
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        s3_server.client().get_object(Bucket=bucket, Key="k", IfMatch='"0123"')
    assert caught.value.response["Error"]["Code"] in ("412", "PreconditionFailed")


def test_an_object_overwritten_mid_build_fails_the_build(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    for path in write_shards(tmp_path, count=30):
        put(s3_server, bucket, f"wds/{path.name}", path.read_bytes())
    source = from_url(f"s3://{bucket}/wds/", endpoint_url=s3_server.endpoint_url)

    def overwrite_a_later_shard(objects: int, size: int, records: int) -> None:
        if objects == 1:  # the first shard is cached, the third not yet asked for (one is read ahead)
            put(s3_server, bucket, "wds/train-000002.tar", tar_bytes({"other.jpg": b"new data"}))

    source.progress = overwrite_a_later_shard
    storage = tmp_path / "caches"
    with pytest.raises(SourceChangedError, match=r"train-000002\.tar changed while it was read .*overwritten"):
        cache_from(storage, source)
    assert cache_files(storage) == []


def test_wrong_etag_fails_before_anything_is_written(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    etag = put(s3_server, bucket, "data.tar.gz", tar_bytes({"a.txt": b"x"}, "w:gz"))["ETag"].strip('"')
    storage = tmp_path / "caches"
    with pytest.raises(SourceChangedError, match=rf"data\.tar\.gz has ETag {etag}, not the 0+ asked for"):
        cache_from(storage, from_url(f"s3://{bucket}/data.tar.gz", etag="0" * 32, endpoint_url=s3_server.endpoint_url))
    assert cache_files(storage) == []
    ref = cache_from(storage, from_url(f"s3://{bucket}/data.tar.gz", etag=etag, endpoint_url=s3_server.endpoint_url))
    assert [bytes(r["txt"]) for r in read_back(ref)] == [b"x"]


def test_versioned_bucket_version_id_reads_and_pins_that_version(tmp_path: Path, s3_server: S3Server,
                                                                  bucket: str) -> None:
    client = s3_server.client()
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    first = put(s3_server, bucket, "d.zip", archive_bytes({"a.txt": b"version one"}, ".zip"))["VersionId"]
    put(s3_server, bucket, "d.zip", archive_bytes({"a.txt": b"version two"}, ".zip"))
    url = f"s3://{bucket}/d.zip"
    ref = cache_from(tmp_path / "c1", from_url(url, version_id=first, endpoint_url=s3_server.endpoint_url))
    assert [bytes(r["txt"]) for r in read_back(ref)] == [b"version one"]
    pin = ref.manifest.extra["sources"]["objects"][0]
    assert pin["version_id"] == first and pin["fixed"] is True
    put(s3_server, bucket, "d.zip", archive_bytes({"a.txt": b"version three"}, ".zip"))
    assert not check_pins(ref.manifest.extra["sources"]).changed  # pinned by version: still that version
    # Without version_id= the build records the version its reads were served.
    latest = cache_from(tmp_path / "c2", from_url(url, endpoint_url=s3_server.endpoint_url))
    current = client.head_object(Bucket=bucket, Key="d.zip")["VersionId"]
    assert latest.manifest.extra["sources"]["objects"][0]["version_id"] == current
    assert [bytes(r["txt"]) for r in read_back(latest)] == [b"version three"]


@pytest.mark.parametrize("policy", ["error", "warn", "ignore", "rebuild"])
def test_changed_source_on_a_cache_hit(tmp_path: Path, s3_server: S3Server, bucket: str, policy: str) -> None:
    put(s3_server, bucket, "s/a.tar", tar_bytes({"k.txt": b"old"}))
    url = f"s3://{bucket}/s/a.tar"
    storage = tmp_path / "caches"

    def cached() -> Any:
        return cache_from(storage, from_url(url, on_source_change=policy, endpoint_url=s3_server.endpoint_url))

    assert [bytes(r["txt"]) for r in read_back(cached())] == [b"old"]
    put(s3_server, bucket, "s/a.tar", tar_bytes({"k.txt": b"new!"}))
    if policy == "error":
        with pytest.raises(SourceChangedError, match=rf"{url}: size \d+ -> \d+|{url}: etag"):
            cached()
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ref = cached()
    said = [str(w.message) for w in caught if "changed since it was built" in str(w.message)]
    expected = {"warn": b"old", "ignore": b"old", "rebuild": b"new!"}[policy]
    assert [bytes(r["txt"]) for r in read_back(ref)] == [expected]
    assert len(said) == (1 if policy == "warn" else 0)
    if policy == "warn":
        assert url in said[0]
    if policy == "rebuild":
        assert not check_pins(ref.manifest.extra["sources"]).changed


@pytest.mark.slow
def test_freshness_check_costs_one_list_page_per_1000_objects(tmp_path: Path, s3_server: S3Server,
                                                              bucket: str) -> None:
    count = 1001  # two LIST pages
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: put(s3_server, bucket, f"files/{i:05d}.bin", i.to_bytes(4, "big")), range(count)))
    source = from_url(f"s3://{bucket}/files/", endpoint_url=s3_server.endpoint_url)
    assert len(source.objects()) == count  # what a build pins (the build itself is tested above)
    pins = source.pins()
    check = check_pins(pins)
    assert not check.changed and check.requests == 2  # ceil(1001 / 1000) LIST pages, no GET or HEAD
    put(s3_server, bucket, "files/00007.bin", b"changed")
    put(s3_server, bucket, "files/99999.bin", b"added")
    check = check_pins(pins)
    assert check.requests == 2
    assert any("00007.bin: size 4 -> 7" in c for c in check.changes)
    assert any("99999.bin: added" in c for c in check.changes) and len(check.changes) == 2
    single = from_url(f"s3://{bucket}/files/00001.bin", endpoint_url=s3_server.endpoint_url)
    one = cache_from(tmp_path / "one", single)
    assert check_pins(one.manifest.extra["sources"]).requests == 1  # one HEAD


def test_cli_import_info_verify_source(tmp_path: Path, s3_server: S3Server, bucket: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    for path in write_shards(tmp_path, count=20):
        put(s3_server, bucket, f"wds/{path.name}", path.read_bytes())
    storage = str(tmp_path / "caches")
    argv = ["import", f"s3://{bucket}/wds/train-{{000000..000001}}.tar", "--id", "shards", "--storage", storage,
            "--source-endpoint-url", s3_server.endpoint_url]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "imported shards src-" in out and "20 records" in out
    version = out.split("imported shards ")[1].split(":")[0]
    assert cli.main(argv) == 0
    assert "already cached" in capsys.readouterr().out
    assert cli.main(["info", "shards", version, "--storage", storage]) == 0
    info = capsys.readouterr().out
    etag = s3_server.client().head_object(Bucket=bucket, Key="wds/train-000000.tar")["ETag"].strip('"')
    assert "sources:     2 object(s)" in info and f"etag={etag}" in info
    assert cli.main(["verify", "--source", "shards", version, "--storage", storage]) == 0
    assert "2 source object(s) unchanged (1 request(s))" in capsys.readouterr().out
    put(s3_server, bucket, "wds/train-000001.tar", b"not a tar any more")
    assert cli.main(["verify", "--source", "shards", version, "--storage", storage]) == 1
    assert "train-000001.tar: size" in capsys.readouterr().err
    # version auto: the changed source means a new cache version, whose build fails on the broken
    # shard, naming it; the cache of the old version stays.
    assert cli.main(argv) == 1
    assert "train-000001.tar is corrupt or truncated" in capsys.readouterr().err
    assert cli.main(["info", "shards", version, "--storage", storage]) == 0


def test_import_progress_line_counts_objects_bytes_records_and_eta() -> None:
    shown = ImportProgress("d:v", objects=10, total_bytes=10 << 20, enabled=False)
    shown.done = (3, 3 << 20, 1200)
    line = shown._line()
    assert "3/10 objects" in line and "3.0 MiB of 10.0 MiB" in line and "1,200 records" in line
    assert "/s" in line and "ETA" in line


def test_import_source_with_version_auto_into_a_remote_store(tmp_path: Path, s3_server: S3Server,
                                                             bucket: str) -> None:
    put(s3_server, bucket, "src/x.tgz", tar_bytes({"a.cls": b"1", "b.cls": b"2"}, "w:gz"))
    store = open_store(f"s3://{bucket}/caches", endpoint_url=s3_server.endpoint_url,
                       local_cache=str(tmp_path / "local"), show_progress=False)
    url = f"s3://{bucket}/src/x.tgz"
    first = import_source(store, "x", from_url(url, endpoint_url=s3_server.endpoint_url), show_progress=False)
    assert first.outcome == "built" and first.manifest.num_records == 2
    again = import_source(store, "x", from_url(url, endpoint_url=s3_server.endpoint_url), show_progress=False)
    assert again.outcome == "cached" and again.manifest.build_id == first.manifest.build_id
    put(s3_server, bucket, "src/x.tgz", tar_bytes({"a.cls": b"1", "b.cls": b"2", "c.cls": b"3"}, "w:gz"))
    changed = import_source(store, "x", from_url(url, endpoint_url=s3_server.endpoint_url), show_progress=False)
    assert changed.outcome == "built" and changed.manifest.dataset_version != first.manifest.dataset_version
    assert changed.manifest.num_records == 3
    assert store.manifest("x", first.manifest.dataset_version).num_records == 2  # the old cache is kept
    assert io is not None


def test_imagefolder_from_an_s3_prefix(tmp_path: Path, s3_server: S3Server, bucket: str) -> None:
    files = {"pets/dog/1.jpg": b"d1", "pets/cat/1.png": b"c1", "pets/cat/2.jpg": b"c2", "pets/ant/9.jpg": b"a9"}
    for key, data in files.items():
        put(s3_server, bucket, key, data)
    put(s3_server, bucket, "other/x.jpg", b"outside the prefix")
    # No trailing slash: "pets" is no object, so it is the prefix pets/.
    ref = cache_from(tmp_path / "caches",
                     from_url(f"s3://{bucket}/pets", format="imagefolder", endpoint_url=s3_server.endpoint_url))
    table = ref.manifest.extra["sources"]["class_to_idx"]
    assert table == {"ant": 0, "cat": 1, "dog": 2}
    records = {bytes(r["__key__"]).decode(): r for r in read_back(ref)}
    assert sorted(records) == ["ant/9.jpg", "cat/1.png", "cat/2.jpg", "dog/1.jpg"]
    for key, record in records.items():
        field = key.rsplit(".", 1)[1]
        assert bytes(record[field]) == files["pets/" + key] and int(record["cls"]) == table[key.split("/")[0]]
        assert all(bytes(record[other]) == b"" for other in ("jpg", "png") if other != field)


def test_an_unreachable_endpoint_is_a_clear_error_without_secrets(s3_server: S3Server) -> None:
    from tests.servers import free_port
    from yogacache.sources import SourceError

    source = from_url("s3://some-bucket/x.tar", endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(SourceError, match=r"x\.tar: cannot connect to the S3 endpoint http://127\.0\.0\.1") as caught:
        source.objects()
    assert s3_server.secret_key not in str(caught.value) and s3_server.access_key not in str(caught.value)


@pytest.mark.parametrize("policy", ["error", "rebuild"])
def test_a_stale_published_cache_is_checked_before_a_node_downloads_it(
    tmp_path: Path, s3_server: S3Server, bucket: str, policy: str
) -> None:
    """Node A publishes a cache of a source; the source changes; node B (nothing local) never
    downloads the stale cache: it raises before fetching a part, or fetches only the rebuild."""
    from yogacache.dataref import cached_dataref

    put(s3_server, bucket, "s/a.tar", tar_bytes({"k.txt": b"old"}))
    url = f"s3://{bucket}/s/a.tar"

    def node(name: str) -> Any:
        return open_store(f"s3://{bucket}/caches", endpoint_url=s3_server.endpoint_url,
                          local_cache=str(tmp_path / name), show_progress=False)

    def source() -> Any:
        return from_url(url, on_source_change=policy, endpoint_url=s3_server.endpoint_url)

    first = cached_dataref(node("a"), "src", "v1", source)
    assert [bytes(r["txt"]) for r in read_back(first)] == [b"old"]
    put(s3_server, bucket, "s/a.tar", tar_bytes({"k.txt": b"new!"}))
    store_b = node("b")
    if policy == "error":
        with pytest.raises(SourceChangedError, match="changed since it was built"):
            cached_dataref(store_b, "src", "v1", source)
        assert store_b.local_manifest("src", "v1") is None  # nothing of the stale cache fetched
        assert not [p for p in (tmp_path / "b").rglob("*.mdb")]
        return
    ref = cached_dataref(store_b, "src", "v1", source)
    assert [bytes(r["txt"]) for r in read_back(ref)] == [b"new!"]
    assert ref.manifest.build_id != first.manifest.build_id
    assert not [p for p in (tmp_path / "b").rglob("*.mdb") if first.manifest.build_id in p.name]
