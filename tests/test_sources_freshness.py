"""What the freshness check of a cache built from pinned objects costs, counted at a proxy in
front of the real moto server (and fake-gcs-server): at most one LIST per 1,000 pinned objects
(+1) whatever else lives beside them, plus HEADs of pinned objects; changes are still found."""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.faultproxy import FaultProxy
from tests.servers import GCSServer, S3Server
from tests.sources_helpers import cache_from, read_back, tar_bytes
from yogacache.sources import SourceChangedError, from_url
from yogacache.sources.freshness import check_pins


def put_many(s3: S3Server, bucket: str, keys: list[str]) -> None:
    """Plain HTTP PUTs to moto's server (which checks no signature), one kept-alive connection
    per thread: boto3's signing and response parsing cost more CPU than moto's storing, on a
    machine the other tests share."""
    url = urllib.parse.urlsplit(s3.endpoint_url)
    connections = threading.local()

    def put(key: str) -> None:
        connection = getattr(connections, "http", None)
        if connection is None:
            connection = connections.http = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
        connection.request("PUT", f"/{bucket}/{urllib.parse.quote(key)}", body=b"unrelated")
        response = connection.getresponse()
        body = response.read()
        assert response.status == 200, (key, response.status, body[:500])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))


def list_budget(pinned: int) -> int:
    return pinned // 1000 + 1


def s3_lists(proxy: FaultProxy) -> int:
    return len([r for r in proxy.requests("GET") if "list-type=2" in r.target])


def test_two_named_shards_beside_2500_unrelated_objects_cost_one_list(tmp_path: Path, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    client.put_object(Bucket=bucket, Key="data/a.tar", Body=tar_bytes({"a.txt": b"A"}))
    client.put_object(Bucket=bucket, Key="data/b.tar", Body=tar_bytes({"b.txt": b"B"}))
    # Beside them under their common prefix "data/": between the two in listing order, and after.
    put_many(
        s3_server,
        bucket,
        [f"data/a.tar.{i:04d}.bak" for i in range(1250)] + [f"data/c/{i:04d}.jpg" for i in range(1250)],
    )
    urls = [f"s3://{bucket}/data/a.tar", f"s3://{bucket}/data/b.tar"]
    storage = tmp_path / "caches"
    with FaultProxy(s3_server.endpoint_url) as proxy:
        ref = cache_from(storage, from_url(urls, endpoint_url=proxy.url))
        assert [bytes(r["txt"]) for r in read_back(ref)] == [b"A", b"B"]
        proxy.clear_log()
        check = check_pins(ref.manifest.extra["sources"])
        assert not check.changed, check.changes
        lists, heads = s3_lists(proxy), len(proxy.requests("HEAD"))
        assert lists <= list_budget(2), f"{lists} LISTs for 2 pinned objects"
        assert heads <= 2 and lists + heads == check.requests == len(proxy.log)
        proxy.clear_log()  # a cache hit (the decorator's check) costs the same
        again = cache_from(storage, from_url(urls, endpoint_url=proxy.url))
        assert again.manifest.build_id == ref.manifest.build_id
        assert s3_lists(proxy) <= list_budget(2) and len(proxy.requests("HEAD")) <= 2
        # Changes are still seen: one shard rewritten, the other deleted.
        client.put_object(Bucket=bucket, Key="data/b.tar", Body=tar_bytes({"b.txt": b"B2"}))
        client.delete_object(Bucket=bucket, Key="data/a.tar")
        proxy.clear_log()
        changed = check_pins(ref.manifest.extra["sources"])
        assert s3_lists(proxy) <= list_budget(2)
        with pytest.raises(SourceChangedError, match=r"data/a\.tar: deleted"):
            cache_from(storage, from_url(urls, endpoint_url=proxy.url))
    assert len(changed.changes) == 2 and f"{urls[0]}: deleted" in changed.changes, changed.changes
    assert any(c.startswith(f"{urls[1]}: etag ") for c in changed.changes), changed.changes


@pytest.mark.slow
def test_many_pinned_objects_beside_many_others_cost_one_list_per_1000(tmp_path: Path, s3_server: S3Server) -> None:
    """1,200 pinned files (named by braces) between 1,300 unrelated objects of their prefix: two
    LISTs, however the pinned objects sit among the others; a prefix source beside them lists its
    own prefix only."""
    bucket = s3_server.new_bucket()
    put_many(s3_server, bucket, [f"d/f-{i:05d}.bin" for i in range(1200)])
    put_many(
        s3_server,
        bucket,
        [f"d/e-{i:04d}" for i in range(600)]
        + [f"d/g-{i:04d}" for i in range(600)]
        + [f"d/f-{i:05d}.bin.old" for i in range(0, 1200, 12)],
    )  # 100 interleaved
    put_many(s3_server, bucket, [f"d/sub/{i:03d}.bin" for i in range(30)])
    with FaultProxy(s3_server.endpoint_url) as proxy:
        named = from_url(f"s3://{bucket}/d/f-{{00000..01199}}.bin", endpoint_url=proxy.url, format="files")
        pins: dict[str, Any] = named.pins()
        assert len(pins["objects"]) == 1200
        proxy.clear_log()
        check = check_pins(pins)
        assert not check.changed, check.changes[:3]
        assert s3_lists(proxy) <= list_budget(1200), f"{s3_lists(proxy)} LISTs for 1,200 pinned objects"
        assert len(proxy.log) == check.requests <= list_budget(1200) + 1200
        # A prefix source and a named object elsewhere in the bucket: the prefix is listed, not
        # the whole bucket (their common prefix is the bucket's root).
        mixed = from_url(
            [f"s3://{bucket}/d/sub/", f"s3://{bucket}/d/f-00005.bin"], endpoint_url=proxy.url, format="files"
        )
        mixed_pins = mixed.pins()
        proxy.clear_log()
        assert not check_pins(mixed_pins).changed
        assert s3_lists(proxy) <= list_budget(31) and len(proxy.requests("HEAD")) <= 1
        s3_server.client().put_object(Bucket=bucket, Key="d/sub/new.bin", Body=b"added")
        assert check_pins(mixed_pins).changes == [f"s3://{bucket}/d/sub/new.bin: added"]


def test_gcs_named_objects_beside_others_cost_one_list(
    gcs_server: GCSServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = gcs_server.new_bucket()
    handle = gcs_server.client().bucket(bucket)
    handle.blob("data/a.tar").upload_from_string(tar_bytes({"a.txt": b"A"}))
    handle.blob("data/b.tar").upload_from_string(tar_bytes({"b.txt": b"B"}))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: handle.blob(f"data/a.tar.{i:04d}").upload_from_string(b"x"), range(1100)))
    urls = [f"gs://{bucket}/data/a.tar", f"gs://{bucket}/data/b.tar"]
    ref = cache_from(tmp_path / "caches", from_url(urls))
    with FaultProxy(gcs_server.url) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        check = check_pins(ref.manifest.extra["sources"])
        lists = len(proxy.requests("GET", f"/b/{bucket}/o?"))
        heads = len(proxy.requests("GET", f"/b/{bucket}/o/"))
        assert not check.changed, check.changes
        assert lists <= list_budget(2), f"{lists} LISTs for 2 pinned objects"
        assert heads <= 2 and lists + heads == check.requests
        # google-cloud-storage 3.x also reads the bucket's metadata once per client (for tracing).
        assert len(proxy.log) <= check.requests + 1, [entry.target for entry in proxy.log]
        handle.blob("data/b.tar").upload_from_string(tar_bytes({"b.txt": b"B2"}))
        changed = check_pins(ref.manifest.extra["sources"])
    assert len(changed.changes) == 1 and changed.changes[0].startswith(f"{urls[1]}: "), changed.changes


def test_a_local_directory_source_notices_files_added_removed_and_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A local directory lists like any prefix: a file added after the import (beside the
    others, in a subdirectory), one removed and one rewritten are each noticed, by ``verify
    --source`` and by the freshness check of a cache hit; a sibling directory whose name starts
    with the source's (``data`` and ``data2``) is not part of it."""
    from yogacache import cli

    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_bytes(b"A")
    (data / "sub" / "b.txt").write_bytes(b"B")
    (tmp_path / "data2").mkdir()
    (tmp_path / "data2" / "other.txt").write_bytes(b"not the source's")
    storage = tmp_path / "caches"
    ref = cache_from(storage, from_url(str(data), format="files"))
    assert sorted(bytes(r["txt"]) for r in read_back(ref)) == [b"A", b"B"]
    pins = ref.manifest.extra["sources"]
    assert not check_pins(pins).changed
    verify = ["verify", "--source", "src", "v1", "--storage", str(storage)]
    assert cli.main(verify) == 0
    assert "2 source object(s) unchanged" in capsys.readouterr().out
    (tmp_path / "data2" / "new.txt").write_bytes(b"beside the source, not in it")
    assert not check_pins(pins).changed

    (data / "sub" / "c.txt").write_bytes(b"C")
    assert check_pins(pins).changes == [f"{data}/sub/c.txt: added"]
    assert cli.main(verify) == 1
    assert f"{data}/sub/c.txt: added" in capsys.readouterr().err
    with pytest.raises(SourceChangedError, match=r"sub/c\.txt: added"):
        cache_from(storage, from_url(str(data), format="files"))

    (data / "sub" / "c.txt").unlink()
    (data / "a.txt").unlink()
    assert check_pins(pins).changes == [f"{data}/a.txt: deleted"]
    (data / "a.txt").write_bytes(b"A2")
    changes = check_pins(pins).changes
    assert len(changes) == 1 and changes[0].startswith(f"{data}/a.txt: size 1 -> 2"), changes
