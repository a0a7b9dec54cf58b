"""``part_bytes``: the public part-size setting of builds (the data_layer config, ``--part-bytes``
on ``yogacache build`` / ``import``, ``DataLayer(part_bytes=...)``, ``build_with_ray(part_bytes=...)``),
its validation, and budgets checked against it before any manifest is known."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud
from yogacache import ConfigError, DataLayer
from yogacache.cli import main
from yogacache.config import S3Config, SharedFSConfig, check_part_budget, parse_config
from yogacache.format.manifest import Manifest
from yogacache.parallel.ray import _part_size
from yogacache.sizes import MIN_PART_BYTES
from yogacache.store import open_store
from yogacache.store.local import CacheStore
from yogacache.store.remote import REMOTE_PART_SIZE

MiB = 1 << 20
RECORD = 64 << 10  # 48 records of 64 KiB: 3 MiB of values
N = 48


def records() -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(RECORD, i % 251, np.uint8)} for i in range(N)]


def check_cache(store: Any, dataset_id: str, version: str, part_bytes: int) -> Manifest:
    """Three or more parts for 3 MiB of records, none past one part size plus a record, and
    every record as written."""
    manifest = store.manifest(dataset_id, version)
    assert len(manifest.parts) >= 3, [part.size_bytes for part in manifest.parts]
    assert all(part.size_bytes <= part_bytes for part in manifest.parts)  # the file, LMDB's pages included
    reader = store.open(dataset_id, version)
    try:
        for i, element in enumerate(reader.read_elements(range(N))):
            assert int(element["i"]) == i
            np.testing.assert_array_equal(element["x"], np.full(RECORD, i % 251, np.uint8))
    finally:
        reader.close()
    return manifest


# -- the config key ----------------------------------------------------------------------------


def test_the_config_key_sets_the_part_size_of_builds(tmp_path: Path) -> None:
    config = {"type": "shared_fs", "host_storage_path": str(tmp_path / "fs"), "part_bytes": "1Mi"}
    assert parse_config(config) == SharedFSConfig(host_storage_path=str(tmp_path / "fs"), part_bytes=MiB)
    layer = DataLayer.from_config(config, show_progress=False)
    layer.store.build("ds", "v1", records())
    check_cache(layer.store, "ds", "v1", MiB)


def test_every_cloud_config_takes_the_key_and_the_store_builds_with_it(s3_server: Any, tmp_path: Path) -> None:
    for kind in ("s3", "gcs", "azure"):
        parsed = parse_config({"type": kind, "bucket": "b", "part_bytes": "256MB"})
        assert parsed is not None and parsed.part_bytes == 256_000_000
    bucket = s3_server.new_bucket()
    config = {
        "type": "s3",
        "bucket": bucket,
        "bucket_directory_path": "caches",
        "endpoint_url": s3_server.endpoint_url,
        "local_cache_host_path": str(tmp_path / "node"),
        "local_cache_container_path": str(tmp_path / "node"),
        "part_bytes": MiB,
    }
    assert isinstance(parse_config(config), S3Config)
    store = open_store(config, show_progress=False)
    store.build("ds", "v1", records())
    check_cache(store, "ds", "v1", MiB)
    # Without the key, a store keeps its default.
    assert open_store({**config, "part_bytes": None}).local.part_size_bytes == REMOTE_PART_SIZE


def test_a_mirror_may_not_set_part_bytes() -> None:
    config = {"type": "s3", "bucket": "b", "mirrors": [{"type": "s3", "bucket": "m", "part_bytes": "64Mi"}]}
    with pytest.raises(ConfigError, match=r"mirrors\[0\] may not set part_bytes: a mirror holds copies"):
        parse_config(config)


# -- the CLI option ----------------------------------------------------------------------------


def test_the_cli_option_sets_the_part_size_of_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "part_bytes_data.py"
    module.write_text(
        textwrap.dedent("""
        import numpy as np

        def make():
            return [{"i": np.int64(i), "x": np.full(64 << 10, i % 251, np.uint8)} for i in range(48)]
    """)
    )
    storage = tmp_path / "fs"
    code = main(["build", "ds", "v1", f"{module}:make", "--part-bytes", "1Mi", "--storage", str(storage)])
    assert code == 0, capsys.readouterr().err
    check_cache(CacheStore(storage, show_progress=False), "ds", "v1", MiB)


def test_the_cli_option_sets_the_part_size_of_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "files"
    source.mkdir()
    rng = np.random.default_rng(0)
    for i in range(N):
        (source / f"{i:03d}.bin").write_bytes(rng.integers(0, 256, RECORD, dtype=np.uint8).tobytes())
    storage = tmp_path / "fs"
    argv = ["import", f"{source}/", "--id", "files", "--version", "v1", "--part-bytes", "1Mi"]
    argv += ["--storage", str(storage)]
    assert main(argv) == 0, capsys.readouterr().err
    manifest = CacheStore(storage).manifest("files", "v1")
    assert len(manifest.parts) >= 3 and manifest.num_records == N


@pytest.mark.parametrize("command", ["build", "import"])
def test_the_cli_refuses_a_bad_part_size(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    rest = ["ds", "v1", "m:f"] if command == "build" else [str(tmp_path), "--id", "x"]
    assert main([command, *rest, "--part-bytes", "100K", "--storage", str(tmp_path / "fs")]) != 0
    err = capsys.readouterr().err
    assert "--part-bytes must be at least 1 MiB" in err and "'100K'" in err
    assert main([command, *rest, "--part-bytes", "lots", "--storage", str(tmp_path / "fs")]) != 0
    assert "--part-bytes must be a byte size" in capsys.readouterr().err


# -- the Python keyword ------------------------------------------------------------------------


def test_the_datalayer_keyword_sets_the_part_size(tmp_path: Path) -> None:
    config = {"type": "shared_fs", "host_storage_path": str(tmp_path / "fs"), "part_bytes": "1Gi"}
    layer = DataLayer(config, part_bytes=MiB, show_progress=False)  # the keyword wins over the config
    layer.store.build("ds", "v1", records())
    check_cache(layer.store, "ds", "v1", MiB)


@pytest.mark.parametrize(
    "value, message",
    [
        ("512Ki", r"part_bytes must be at least 1 MiB \(1048576 bytes\), got '512Ki': every part is a file"),
        (0, "part_bytes must be at least 1 MiB"),
        (-1, "part_bytes must not be negative"),
        ("64 apples", "part_bytes must be a byte size such as '200Gi'"),
        (True, "part_bytes must be a byte size"),
    ],
)
def test_invalid_part_sizes_are_refused_everywhere(tmp_path: Path, value: Any, message: str) -> None:
    config = {"type": "shared_fs", "host_storage_path": str(tmp_path), "part_bytes": value}
    with pytest.raises(ConfigError, match="data_layer." + message):
        parse_config(config)
    with pytest.raises(ConfigError, match=message):
        DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, part_bytes=value)
    with pytest.raises(ValueError, match=message):  # ConfigError is a ValueError
        _part_size(value, None)


def test_the_ray_builds_older_name_keeps_working() -> None:
    assert _part_size(None, None) == 1 << 30  # the default (format.writer.DEFAULT_PART_SIZE)
    assert _part_size(None, 100_000) == 100_000  # part_size_bytes, bytes as given (as before)
    assert _part_size("64Mi", None) == 64 * MiB
    assert _part_size("64Mi", 64 * MiB) == 64 * MiB
    with pytest.raises(ValueError, match="disagree: pass part_bytes only"):
        _part_size("64Mi", 32 * MiB)
    assert MIN_PART_BYTES == MiB
    config = {"type": "s3", "bucket": "b", "part_bytes": "8Mi"}
    assert _part_size(None, None, config) == 8 * MiB  # a config target's part_bytes
    assert _part_size("2Mi", None, config) == 2 * MiB  # the keyword wins
    assert _part_size(None, None, "s3://b/caches") == 1 << 30


# -- budgets against the part size -------------------------------------------------------------


def test_a_budget_below_two_parts_is_refused_at_config_time() -> None:
    config = {"type": "s3", "bucket": "b", "streaming": True, "local_cache_limit": "300Mi", "part_bytes": "256Mi"}
    with pytest.raises(ConfigError) as refused:
        parse_config(config)
    message = str(refused.value)
    assert "data_layer.local_cache_limit 300.0 MiB" in message and "data_layer.part_bytes 256.0 MiB" in message
    assert "at least 512.0 MiB" in message and "set part_bytes to at most 150.0 MiB" in message
    parse_config({**config, "part_bytes": "150Mi"})  # two parts fit
    parse_config({**config, "part_bytes": None})  # no part size: checked against a manifest's parts on open


def test_a_budget_below_two_parts_is_refused_when_the_keyword_sets_the_size(s3_server: Any, tmp_path: Path) -> None:
    cloud = Cloud("s3", s3_server)
    config = {
        "type": "s3",
        "bucket": cloud.new_bucket(),
        "endpoint_url": s3_server.endpoint_url,
        "local_cache_host_path": str(tmp_path),
        "local_cache_container_path": str(tmp_path),
        "streaming": True,
        "local_cache_limit": "3Mi",
    }
    with pytest.raises(ConfigError, match=r"local_cache_limit 3.0 MiB .* part_bytes 2.0 MiB .* at least 4.0 MiB"):
        DataLayer(config, part_bytes="2Mi", show_progress=False)
    DataLayer(config, part_bytes="1Mi", show_progress=False)
    with pytest.raises(ConfigError, match="raise local_cache_limit to at least"):
        check_part_budget(64 * MiB, 100 * MiB)


# -- part_bytes bounds the part file -------------------------------------------------------------


def test_a_config_that_passes_the_check_streams_its_own_cache(s3_server: Any, tmp_path: Path) -> None:
    """The issue's storage: part_bytes 1Mi and a budget of two such parts (2Mi), records of 4 KiB
    (each on two LMDB pages: the part files of a build that rolled past part_bytes of values were
    2.0x part_bytes). It passes the config check, builds, and a fresh node streams the cache back
    under that budget."""
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    config = {
        **cloud.config(bucket, "caches"),
        "part_bytes": "1Mi",
        "local_cache_limit": "2Mi",
        "streaming": True,
        "local_cache_host_path": str(tmp_path / "builder"),
        "local_cache_container_path": str(tmp_path / "builder"),
    }
    parse_config(config)
    data = [{"i": np.int64(i), "x": np.full(4096, i % 251, np.uint8)} for i in range(1000)]
    manifest = open_store(config, show_progress=False).build("four-k", "v1", data)
    assert len(manifest.parts) >= 4 and max(part.size_bytes for part in manifest.parts) <= MiB
    node = str(tmp_path / "node")
    reader = open_store(
        {**config, "local_cache_host_path": node, "local_cache_container_path": node}, show_progress=False
    ).open("four-k", "v1")
    try:
        for i, element in enumerate(reader.read_elements(range(len(data)))):
            assert int(element["i"]) == i
            np.testing.assert_array_equal(element["x"], data[i]["x"])
    finally:
        reader.close()


def _sizes(kind: str) -> list[int]:
    rng = np.random.default_rng(7)
    return {
        "tiny": [100] * 30_000,  # leaf pages
        "leaf-largest": [2_000] * 2_000,  # the largest value that stays on a leaf page (4 KiB pages)
        "first-overflow": [2_100] * 2_000,  # the smallest that goes on overflow pages: two per value
        "4KiB": [4096] * 1_500,
        "64KiB": [64 << 10] * 60,
        "mixed": [int(n) for n in rng.integers(1, 9_000, 3_000)],
        "alternating": [1_000, 1_000, 1_000, 1_081] * 1_500,  # leaf pages left part-empty
    }[kind]


@pytest.mark.parametrize("kind", ["tiny", "leaf-largest", "first-overflow", "4KiB", "64KiB", "mixed", "alternating"])
def test_no_part_file_is_larger_than_part_bytes(tmp_path: Path, kind: str) -> None:
    """Whatever the record sizes (LMDB stores small values on shared leaf pages, large ones on
    overflow pages of their own), every part file is at most part_bytes, and still mostly full
    (the bound is not kept by making parts small); the records read back as written."""
    sizes = _sizes(kind)
    data = [np.full(size, i % 251, np.uint8) for i, size in enumerate(sizes)]
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=MiB)
    manifest = store.build("sized", "v1", data)
    files = sorted((tmp_path / "sized" / "v1").glob("part-*.mdb"))
    assert [path.stat().st_size for path in files] == [part.size_bytes for part in manifest.parts]
    assert len(manifest.parts) >= 3 and max(part.size_bytes for part in manifest.parts) <= MiB
    assert min(part.size_bytes for part in manifest.parts[:-1]) > 0.9 * MiB, [p.size_bytes for p in manifest.parts]
    reader = store.open("sized", "v1")
    try:
        picked = [0, len(sizes) // 2, len(sizes) - 1]
        for i, element in zip(picked, reader.read_elements(picked)):
            np.testing.assert_array_equal(element, data[i])
    finally:
        reader.close()


def test_a_record_larger_than_part_bytes_gets_a_part_of_its_own(tmp_path: Path) -> None:
    """The one exception to the bound: a record that no part of part_bytes could hold is written
    alone in a part (never split, never refused); the parts around it keep the bound."""
    sizes = [100_000] * 20 + [int(2.5 * MiB)] + [100_000] * 20
    data = [np.full(size, i % 251, np.uint8) for i, size in enumerate(sizes)]
    store = CacheStore(tmp_path, show_progress=False, part_size_bytes=MiB)
    manifest = store.build("big", "v1", data)
    big = [part for part in manifest.parts if part.first_record <= 20 < part.first_record + part.num_records]
    assert len(big) == 1 and big[0].num_records == 1 and big[0].size_bytes > 2.5 * MiB
    assert all(part.size_bytes <= MiB for part in manifest.parts if part is not big[0])
    reader = store.open("big", "v1")
    try:
        np.testing.assert_array_equal(next(iter(reader.read_elements([20]))), data[20])
    finally:
        reader.close()
