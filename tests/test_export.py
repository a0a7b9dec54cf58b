"""``yogacache export``: a cache as WebDataset tar shards plus a ``wids`` index.

The real ``webdataset`` and ``wids`` packages are the oracles: every record read back through
them equals the cache's record byte for byte (arrays as the bytes ``np.save`` writes, integers as
decimal text, strings and bytes unchanged). Exports to S3 and GCS go to moto's S3 server and
fake-gcs-server; a failure part-way (a 500 from the server) leaves no index and no shards.
"""

from __future__ import annotations

import io
import json
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import webdataset as wds
import wids

from tests.cloud_helpers import FAST_RETRY, Cloud, python_env
from tests.faultproxy import FaultProxy
from yogacache.errors import CacheNotFoundError, ConfigError, UnsupportedDatasetError
from yogacache.export import (
    INDEX_NAME,
    DestinationNotEmptyError,
    ExportError,
    ObjectDestination,
    UstarHeaders,
    export_cache,
    export_reader,
    parse_size,
    sample_fields,
)
from yogacache.format.spec import infer_spec
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore


# -- helpers ------------------------------------------------------------------------------------
def npy(value: Any) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(value), allow_pickle=False)
    return buffer.getvalue()


def build(tmp_path: Path, data: list[Any], dataset_id: str = "ds", version: str = "v1") -> CacheStore:
    store = CacheStore(tmp_path / "caches", show_progress=False)
    store.build(dataset_id, version, data)
    return store


def open_reader(store: CacheStore, dataset_id: str = "ds", version: str = "v1") -> CacheReader:
    return store.open(dataset_id, version)


def shard_paths(directory: Path) -> list[str]:
    index = json.loads((directory / INDEX_NAME).read_text())
    return [str(directory / shard["url"]) for shard in index["shardlist"]]


def read_webdataset(directory: Path) -> list[dict[str, Any]]:
    """Every sample, in order, as the real webdataset reader yields it (raw bytes)."""
    samples = list(wds.WebDataset(shard_paths(directory), shardshuffle=False))
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"} for s in samples]


def read_wids(directory: Path, cache: Path) -> list[dict[str, Any]]:
    """Every sample through wids' indexed reader, from the index alone (raw bytes)."""
    dataset = wids.ShardListDataset(str(directory / INDEX_NAME), transformations=[], cache_dir=str(cache))
    try:
        samples = []
        for i in range(len(dataset)):
            sample = dataset[i]
            samples.append(
                {"__key__": sample["__key__"], **{k[1:]: v.getvalue() for k, v in sample.items() if k.startswith(".")}}
            )
        return samples
    finally:
        dataset.close()


def rich_data(n: int = 40) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    return [
        {
            "image": rng.integers(0, 255, (4, 5, 3), dtype=np.uint8),
            "label": i * 3 - 20,
            "caption": f"record {i} — ünïcode",
            "jpg": bytes(rng.integers(0, 255, 50 + i, dtype=np.uint8)),
            "score": np.float32(i) / 7,
            "flag": bool(i % 2),
            "weights": rng.standard_normal(i % 4 + 1),  # ragged: the shape varies
        }
        for i in range(n)
    ]


def expected_rich(record: dict[str, Any]) -> dict[str, bytes]:
    return {
        "image.npy": npy(record["image"]),
        "label.cls": str(record["label"]).encode(),
        "caption.txt": record["caption"].encode("utf-8"),
        "jpg": record["jpg"],
        "score.npy": npy(np.float32(record["score"])),
        "flag.npy": npy(np.bool_(record["flag"])),
        "weights.npy": npy(record["weights"]),
    }


# -- round trips through the real readers --------------------------------------------------------
def test_dict_records_round_trip_through_webdataset_and_wids(tmp_path: Path) -> None:
    data = rich_data()
    store = build(tmp_path, data)
    out = tmp_path / "wds"
    with open_reader(store) as reader:
        result = export_reader(reader, out, shard_size="8Ki", show_progress=False)
        cached = reader.read_elements(range(len(reader)))
    assert len(result.shards) > 1
    expected = [{"__key__": f"{i:09d}", **expected_rich(record)} for i, record in enumerate(data)]
    assert read_webdataset(out) == expected
    assert read_wids(out, tmp_path / "wids-cache") == expected
    # Decoded by webdataset's own decoders, the values equal the cache's records.
    decoded = list(wds.WebDataset(shard_paths(out), shardshuffle=False).decode())
    for sample, element in zip(decoded, cached):
        assert sample["image.npy"].dtype == np.uint8
        np.testing.assert_array_equal(sample["image.npy"], element["image"])
        np.testing.assert_array_equal(sample["weights.npy"], element["weights"])
        assert sample["label.cls"] == int(element["label"])
        assert sample["caption.txt"].encode("utf-8") == element["caption"]
        assert sample["score.npy"].dtype == np.float32 and sample["score.npy"] == element["score"]
    index = json.loads((out / INDEX_NAME).read_text())
    assert index["__kind__"] == "wids-shard-index-v1" and index["wids_version"] == 1
    assert sum(shard["nsamples"] for shard in index["shardlist"]) == len(data)
    assert [shard["filesize"] for shard in index["shardlist"]] == [
        (out / shard["url"]).stat().st_size for shard in index["shardlist"]
    ]
    assert index["yogacache"]["fields"]["image"] == "image.npy"


def test_tuple_nested_and_bare_elements(tmp_path: Path) -> None:
    pairs = [(np.arange(i + 1, dtype=np.int16), i) for i in range(5)]
    store = build(tmp_path, pairs, "pairs")
    with open_reader(store, "pairs") as reader:
        export_reader(reader, tmp_path / "pairs", show_progress=False)
    assert read_webdataset(tmp_path / "pairs") == [
        {"__key__": f"{i:09d}", "0.npy": npy(array), "1.cls": str(label).encode()}
        for i, (array, label) in enumerate(pairs)
    ]

    nested = [
        {"pair": (np.full(2, i, np.int64), f"n{i}"), "meta": {"seg.png": b"\x89PNG" + bytes([i])}} for i in range(4)
    ]
    store = build(tmp_path, nested, "nested")
    with open_reader(store, "nested") as reader:
        export_reader(reader, tmp_path / "nested", show_progress=False)
    assert read_wids(tmp_path / "nested", tmp_path / "wids-cache") == [
        {
            "__key__": f"{i:09d}",
            "meta.seg.png": b"\x89PNG" + bytes([i]),
            "pair.0.npy": npy(np.full(2, i, np.int64)),
            "pair.1.txt": f"n{i}".encode(),
        }
        for i in range(4)
    ]

    bare = [np.full((2, 2), i, np.float64) for i in range(3)]
    store = build(tmp_path, bare, "bare")
    with open_reader(store, "bare") as reader:
        export_reader(reader, tmp_path / "bare", show_progress=False)
    assert read_webdataset(tmp_path / "bare") == [{"__key__": f"{i:09d}", "npy": npy(a)} for i, a in enumerate(bare)]


def test_webdataset_style_records_keep_their_keys_and_names(tmp_path: Path) -> None:
    records = [
        {"__key__": f"img_{i:03d}", "jpg": bytes([i, 1, 2]), "cls": i % 3, "json": b'{"i": %d}' % i} for i in range(6)
    ]
    store = build(tmp_path, records)
    with open_reader(store) as reader:
        export_reader(reader, tmp_path / "out", show_progress=False)
    assert read_webdataset(tmp_path / "out") == [
        {"__key__": r["__key__"], "jpg": r["jpg"], "cls": str(r["cls"]).encode(), "json": r["json"]} for r in records
    ]
    with tarfile.open(tmp_path / "out" / "ds-v1-000000.tar") as tar:
        assert tar.getnames()[:3] == ["img_000.cls", "img_000.jpg", "img_000.json"]


# -- the mapping rules, from the spec alone --------------------------------------------------------
def test_mapping_rules_and_refusals() -> None:
    def suffixes(element: Any, **kw: Any) -> dict[str, str]:
        return {f.path: f.suffix for f in sample_fields(infer_spec(element), **kw)[1]}

    assert suffixes({"image": np.zeros(3, np.uint8), "label": 1, "text": "x", "cls": 2, "id": "a"}) == {
        "image": "image.npy",  # "image" names an encoded image in webdataset: an array is not one
        "label": "label.cls",
        "text": "text",
        "cls": "cls",
        "id": "id",
    }
    assert suffixes({"raw": b"\xff"}, extensions={"raw": "bin"}) == {"raw": "raw.bin"}
    with pytest.raises(UnsupportedDatasetError, match="unpickle"):
        sample_fields(infer_spec({"x.pyd": b"data"}))
    with pytest.raises(UnsupportedDatasetError, match="cannot be written as .jpg"):
        sample_fields(infer_spec({"photo.jpg": np.zeros(3)}))
    with pytest.raises(UnsupportedDatasetError, match="array of strings"):
        sample_fields(infer_spec({"tags": np.array(["a", "b"])}))
    with pytest.raises(UnsupportedDatasetError, match="lower case"):
        sample_fields(infer_spec({"A.txt": "a", "a.TXT": "b"}))
    with pytest.raises(UnsupportedDatasetError, match="reserved"):
        sample_fields(infer_spec({"__url__": "a", "x": 1}))
    with pytest.raises(UnsupportedDatasetError, match="bfloat16"):
        import ml_dtypes

        sample_fields(infer_spec({"w": np.zeros(2, ml_dtypes.bfloat16)}))
    with pytest.raises(ConfigError, match="does not have"):
        sample_fields(infer_spec({"x": 1}), extensions={"y": "bin"})


def test_parse_size() -> None:
    assert parse_size("512M") == 512 * 10**6
    assert parse_size("64Ki") == 64 << 10
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("1000") == 1000
    for bad in ("12X", "-1", "0", "M"):
        with pytest.raises(ConfigError):
            parse_size(bad)


# -- shards: splitting and determinism ---------------------------------------------------------------
def test_shard_size_and_record_limits(tmp_path: Path) -> None:
    data = [{"x": np.full(1000, i, np.uint8), "y": i} for i in range(60)]
    store = build(tmp_path, data)
    with open_reader(store) as reader:
        by_size = export_reader(reader, tmp_path / "by-size", shard_size="20Ki", show_progress=False)
        by_count = export_reader(reader, tmp_path / "by-count", shard_records=25, show_progress=False)
    assert len(by_size.shards) > 3
    assert all((tmp_path / "by-size" / s.name).stat().st_size <= 20 << 10 for s in by_size.shards)
    assert [s.num_samples for s in by_count.shards] == [25, 25, 10]
    assert [s.name for s in by_count.shards] == ["ds-v1-000000.tar", "ds-v1-000001.tar", "ds-v1-000002.tar"]
    for out in ("by-size", "by-count"):
        samples = read_webdataset(tmp_path / out)
        assert [s["y.cls"] for s in samples] == [str(i).encode() for i in range(60)]
        assert all(s["x.npy"] == npy(np.full(1000, i, np.uint8)) for i, s in enumerate(samples))


def test_two_exports_are_byte_identical(tmp_path: Path) -> None:
    store = build(tmp_path, rich_data(30))
    with open_reader(store) as reader:
        export_reader(reader, tmp_path / "a", shard_size="10Ki", md5=True, show_progress=False)
    with open_reader(store) as reader:
        export_reader(reader, tmp_path / "b", shard_size="10Ki", md5=True, show_progress=False)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) > 2 and names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for shard in json.loads((tmp_path / "a" / INDEX_NAME).read_text())["shardlist"]:
        assert shard["md5sum"] == wids.wids.compute_file_md5sum(str(tmp_path / "a" / shard["url"]))
    # Every member header is what tarfile itself writes for it (fixed mode, owner and mtime).
    with tarfile.open(tmp_path / "a" / names[0]) as tar:
        members = tar.getmembers()
    assert {(m.mode, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0o444, 0, 0, "", "")}
    assert len({m.mtime for m in members}) == 1


def test_headers_are_the_ones_tarfile_writes() -> None:
    headers = UstarHeaders(1_763_900_000)
    for name in ("a.npy", "000000001.image.npy", "x" * 100, "ünïcode.txt"):
        for size in (0, 1, 511, 512, 10**9, 8**11 - 1):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = size, 1_763_900_000, 0o444, "", ""
            assert headers.header(name.encode(), size) == info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")


def test_an_empty_cache_exports_one_empty_shard(tmp_path: Path) -> None:
    from yogacache.format.spec import TensorSpec
    from yogacache.format.writer import CacheWriter

    target = tmp_path / "caches" / "empty" / "v1"
    with CacheWriter(target, "empty", "v1") as writer:
        writer.seal({"x": TensorSpec("float32", (3,)), "y": TensorSpec("int64", ())})
    with CacheReader(target) as reader:
        result = export_reader(reader, tmp_path / "out", show_progress=False)
    assert [(s.name, s.num_samples) for s in result.shards] == [("empty-v1-000000.tar", 0)]
    assert list(wds.WebDataset(shard_paths(tmp_path / "out"), shardshuffle=False, empty_check=False)) == []
    with tarfile.open(tmp_path / "out" / "empty-v1-000000.tar") as tar:
        assert tar.getmembers() == []


# -- errors ------------------------------------------------------------------------------------------
def test_non_empty_destination_is_refused_and_overwrite_replaces_only_the_export(tmp_path: Path) -> None:
    store = build(tmp_path, [{"x": np.full(2000, i, np.uint8)} for i in range(20)])
    out = tmp_path / "out"
    with open_reader(store) as reader:
        first = export_reader(reader, out, shard_size="10Ki", show_progress=False)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        with pytest.raises(DestinationNotEmptyError, match="is not empty .*--overwrite"):
            export_reader(reader, out, show_progress=False)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing lost
        (out / "README.txt").write_text("mine")
        second = export_reader(reader, out, shard_size="1Mi", overwrite=True, show_progress=False)
    assert len(first.shards) > 1 and len(second.shards) == 1
    # The old export's extra shards are gone, the user's own file stays.
    assert sorted(p.name for p in out.iterdir()) == ["README.txt", "ds-v1-000000.tar", INDEX_NAME]
    assert len(read_webdataset(out)) == 20


def test_bad_records_fail_with_no_index_and_no_shards(tmp_path: Path) -> None:
    keyed = [{"__key__": "ok1", "x": 1}, {"__key__": "bad.key", "x": 2}]
    store = build(tmp_path, keyed * 1)
    with open_reader(store) as reader:
        with pytest.raises(ExportError, match="bad.key.*first dot.*no index was written"):
            export_reader(reader, tmp_path / "out", shard_records=1, show_progress=False)
    assert list((tmp_path / "out").iterdir()) == []

    store = build(tmp_path, [{"raw": b"text"}, {"raw": b"\xff\xfe"}], "raw")
    with open_reader(store, "raw") as reader:
        with pytest.raises(ExportError, match=r"not UTF-8 text.*--ext raw=bin"):
            export_reader(reader, tmp_path / "raw", show_progress=False)
        assert list((tmp_path / "raw").iterdir()) == []
        export_reader(reader, tmp_path / "raw", extensions={"raw": "bin"}, show_progress=False)
    assert [s["raw.bin"] for s in read_webdataset(tmp_path / "raw")] == [b"text", b"\xff\xfe"]


def test_unknown_format_and_unknown_cache(tmp_path: Path) -> None:
    store = build(tmp_path, [{"x": 1}])
    with open_reader(store) as reader:
        with pytest.raises(ConfigError, match="unknown export format 'tfrecord': the formats are webdataset"):
            export_reader(reader, tmp_path / "out", format="tfrecord", show_progress=False)
    with pytest.raises(CacheNotFoundError):
        export_cache("nope", "v1", tmp_path / "out", store=store)
    assert not (tmp_path / "out").exists()


# -- the command line ---------------------------------------------------------------------------------
def run_cli(*args: str, env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args],
        capture_output=True,
        text=True,
        env=python_env(**(env or {})),
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_cli_export_to_a_directory_and_its_errors(tmp_path: Path) -> None:
    data = [{"image": np.full((3, 3), i, np.uint8), "label": i} for i in range(50)]
    build(tmp_path, data)
    storage = str(tmp_path / "caches")
    out = tmp_path / "out"
    done = run_cli("export", "ds", "v1", "--to", str(out), "--storage", storage, "--shard-size", "4Ki")
    assert done.returncode == 0, done.stderr
    assert "exported ds v1: 50 records in" in done.stdout and INDEX_NAME in done.stdout
    assert "exporting ds v1: 50 records" in done.stderr  # the progress display's last line
    assert [s["label.cls"] for s in read_webdataset(out)] == [str(i).encode() for i in range(50)]

    again = run_cli("export", "ds", "v1", "--to", str(out), "--storage", storage)
    assert again.returncode == 1 and "is not empty" in again.stderr and "--overwrite" in again.stderr
    unknown = run_cli("export", "ds", "v1", "--to", str(tmp_path / "x"), "--storage", storage, "--format", "tfrecord")
    assert unknown.returncode == 1 and "unknown export format 'tfrecord'" in unknown.stderr
    missing = run_cli("export", "ds", "v9", "--to", str(tmp_path / "x"), "--storage", storage)
    assert missing.returncode == 1 and "no cache" in missing.stderr
    size = run_cli("export", "ds", "v1", "--to", str(tmp_path / "x"), "--storage", storage, "--shard-size", "1Q")
    assert size.returncode == 1 and "the shard size must be a byte size" in size.stderr and "'1Q'" in size.stderr
    assert not (tmp_path / "x").exists()


# -- object stores -------------------------------------------------------------------------------------
def download_prefix(cloud: Cloud, bucket: str, prefix: str, target: Path) -> list[str]:
    target.mkdir()
    keys = [k for k in cloud.raw_keys(bucket) if k.startswith(prefix + "/")]
    for key in keys:
        (target / key[len(prefix) + 1 :]).write_bytes(cloud.raw_get(bucket, key))
    return sorted(key[len(prefix) + 1 :] for key in keys)


def test_cli_export_to_s3_uploads_shards_then_the_index(s3_server: Any, tmp_path: Path) -> None:
    data = rich_data(30)
    build(tmp_path, data)
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    with FaultProxy(s3_server.endpoint_url) as proxy:
        done = run_cli(
            "export", "ds", "v1", "--to", f"s3://{bucket}/wds", "--storage", str(tmp_path / "caches"),
            "--endpoint-url", proxy.url, "--shard-size", "8Ki",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        puts = [entry.target for entry in proxy.requests(method="PUT")]
    assert len(puts) > 2 and INDEX_NAME in puts[-1] and all(".tar" in put for put in puts[:-1])
    names = download_prefix(cloud, bucket, "wds", tmp_path / "copy")
    assert INDEX_NAME in names
    expected = [{"__key__": f"{i:09d}", **expected_rich(record)} for i, record in enumerate(data)]
    assert read_webdataset(tmp_path / "copy") == expected
    assert read_wids(tmp_path / "copy", tmp_path / "wids-cache") == expected


def test_export_to_gcs(gcs_server: Any, tmp_path: Path) -> None:
    data = [(np.full(10, i, np.int32), f"caption {i}") for i in range(25)]
    store = build(tmp_path, data)
    cloud = Cloud("gcs", gcs_server)
    bucket = cloud.new_bucket()
    result = export_cache("ds", "v1", f"gs://{bucket}/exports/ds", store=store, shard_records=10, show_progress=False)
    assert result.index_url == f"gs://{bucket}/exports/ds/{INDEX_NAME}"
    assert download_prefix(cloud, bucket, "exports/ds", tmp_path / "copy") == [
        "ds-v1-000000.tar", "ds-v1-000001.tar", "ds-v1-000002.tar", INDEX_NAME,
    ]  # fmt: skip
    expected = [{"__key__": f"{i:09d}", "0.npy": npy(a), "1.txt": c.encode()} for i, (a, c) in enumerate(data)]
    assert read_wids(tmp_path / "copy", tmp_path / "wids-cache") == expected
    assert read_webdataset(tmp_path / "copy") == expected


def test_a_500_mid_export_leaves_no_index_and_no_shards(s3_server: Any, tmp_path: Path) -> None:
    from yogacache.backends.s3 import S3ObjectStore

    store = build(tmp_path, [{"x": np.full(3000, i, np.uint8)} for i in range(20)])
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add_rule(action="status", method="PUT", path_contains="ds-v1-000002.tar", status=500)
        backend = S3ObjectStore(bucket, "wds", endpoint_url=proxy.url, retry=FAST_RETRY)
        with open_reader(store) as reader:
            with pytest.raises(ExportError, match="ds-v1-000002.tar failed.*no index was written"):
                export_reader(reader, ObjectDestination(backend), shard_size="8Ki", show_progress=False)
        assert proxy.requests(method="PUT", path_contains="ds-v1-000001.tar")  # shards went up before it
    assert cloud.raw_keys(bucket) == []  # no index, and the shards written were removed


# Runs in a private mount namespace with a 1 MiB tmpfs as the destination: the disk fills up.
FULL_DISK_CHILD = textwrap.dedent(
    """
    import json, os, sys
    from yogacache.export import ExportError, export_cache
    from yogacache.store.local import CacheStore

    caches, out = sys.argv[1], sys.argv[2]
    try:
        export_cache("ds", "v1", out, store=CacheStore(caches), shard_size="256Ki", show_progress=False)
        report = {"ok": True}
    except ExportError as error:
        report = {"ok": False, "message": str(error)}
    report["left"] = sorted(os.listdir(out)) if os.path.isdir(out) else []
    print(json.dumps(report))
    """
)


def test_a_full_disk_mid_export_leaves_no_index_and_no_shards(tmp_path: Path) -> None:
    build(tmp_path, [{"x": np.full(20_000, i, np.uint8)} for i in range(150)])  # 3 MB of records
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) is needed to mount a private tmpfs"
    command = (
        f"mount -t tmpfs -o size=1m,mode=0755 yogacache-test {mount_point} && "
        f"{sys.executable} -c '{FULL_DISK_CHILD}' {tmp_path / 'caches'} {mount_point / 'out'}"
    )
    proc = subprocess.run(
        [unshare, "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is False
    assert "No space left on device" in report["message"] and "no index was written" in report["message"]
    assert report["left"] == []  # no index, no shard, no temporary file


@pytest.mark.parametrize(
    "signum, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_mid_export_stops_with_one_line_and_leaves_nothing(
    s3_server: Any, tmp_path: Path, signum: int, status: int, word: str
) -> None:
    from tests.test_cli_signals import assert_one_line, start_cli, stop_with, wait_until

    build(tmp_path, [{"x": np.full(3000, i, np.uint8)} for i in range(20)])
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    with FaultProxy(s3_server.endpoint_url) as proxy:
        slow = proxy.add_rule(action="delay", method="PUT", path_contains="ds-v1-000002.tar", seconds=2.0)
        process = start_cli(
            "export", "ds", "v1", "--to", f"s3://{bucket}/wds", "--storage", str(tmp_path / "caches"),
            "--endpoint-url", proxy.url, "--shard-size", "8Ki",
        )  # fmt: skip
        wait_until(lambda: slow.hits >= 1, process)  # two shards are up, the third under way
        code, out, err = stop_with(process, signum)
    assert code == status, out + err
    assert_one_line(err, word)
    assert "export stopped, no index was written" in err
    assert cloud.raw_keys(bucket) == []  # the shards it had written were removed
