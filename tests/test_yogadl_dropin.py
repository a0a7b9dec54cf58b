"""YogaDL 0.1.4 programs run with only the import changed (issue 9: items 1, 2, 5)."""

from __future__ import annotations

import pathlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache
from yogacache import dataref
from yogacache.storage import GCSConfigurations, LFSConfigurations, LFSStorage, S3Configurations, S3Storage


def records(n: int = 12) -> list[tuple[np.ndarray, int]]:
    return [(np.full(3, i, np.int32), i) for i in range(n)]


def order(stream: Any) -> list[int]:
    return [int(element[1]) for element in stream]


# -- 9.1: bucket_directory_path is a pathlib.Path ------------------------------------------------
@pytest.mark.parametrize("configurations", [S3Configurations, GCSConfigurations])
def test_bucket_directory_path_is_a_path_as_in_yogadl(configurations: Any) -> None:
    config = configurations(bucket="b", bucket_directory_path="unit-tests", local_cache_dir="/tmp/")
    assert isinstance(config.bucket_directory_path, pathlib.Path)
    # YogaDL's own tests build their object keys this way.
    key = config.bucket_directory_path.joinpath("range-dataset").joinpath("0").joinpath("cache.mdb")
    assert str(key) == "unit-tests/range-dataset/0/cache.mdb"
    assert config.to_config().url.endswith("://b/unit-tests")


@pytest.mark.parametrize("prefix, url", [("", "s3://b/"), ("/", "s3://b/"), ("a/b/", "s3://b/a/b")])
def test_bucket_directory_path_edge_cases_still_build_the_right_url(prefix: str, url: str) -> None:
    config = S3Configurations(bucket="b", bucket_directory_path=prefix)
    assert config.to_config().url.rstrip("/") == url.rstrip("/")


def test_s3_storage_publishes_under_the_path_prefix(s3_server: Any, tmp_path: Path) -> None:
    bucket = s3_server.new_bucket()
    configurations = S3Configurations(
        bucket, "unit-tests", endpoint_url=s3_server.endpoint_url, local_cache_dir=str(tmp_path / "local")
    )
    storage = S3Storage(configurations)
    storage.store.show_progress = False
    storage.submit(records(), "range-dataset", "0")
    client = s3_server.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    manifest_key = configurations.bucket_directory_path.joinpath("range-dataset", "0", "manifest.json")
    assert str(manifest_key) in keys
    assert order(storage.fetch("range-dataset", "0").stream()) == list(range(12))


# -- 9.2: yogacache.dataref.LMDBDataRef ---------------------------------------------------------
def test_lmdb_dataref_is_what_fetch_and_cacheable_return(tmp_path: Path) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit(records(), "ds", "1")
    fetched = storage.fetch("ds", "1")
    assert isinstance(fetched, dataref.LMDBDataRef)
    assert isinstance(fetched, yogacache.DataRef)

    @storage.cacheable("ds", "2")
    def make() -> dataref.LMDBDataRef:
        return records(5)  # type: ignore[return-value]

    made = make()
    assert isinstance(made, dataref.LMDBDataRef)
    assert order(made.stream()) == list(range(5))
    # Constructed from a cache directory, as YogaDL's took its cache file.
    direct = dataref.LMDBDataRef(tmp_path / "ds" / "1")
    assert len(direct) == 12


# -- 9.5: skip_shuffle_end_of_epoch, Determined's spelling ----------------------------------------
def _two_epochs(stream: Any) -> tuple[list[int], list[int]]:
    return order(stream), order(stream)


def test_stream_accepts_skip_shuffle_end_of_epoch(tmp_path: Path) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit(records(), "ds", "1")
    ref = storage.fetch("ds", "1")
    reference = _two_epochs(ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_at_epoch_end=True))
    assert reference[0] == reference[1]  # the same order every epoch
    aliased = _two_epochs(ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_end_of_epoch=True))
    assert aliased == reference
    reshuffled = _two_epochs(ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_end_of_epoch=False))
    assert reshuffled[0] != reshuffled[1]
    with pytest.raises(ValueError, match="skip_shuffle_end_of_epoch is another name"):
        ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_at_epoch_end=True, skip_shuffle_end_of_epoch=False)


def test_decorator_accepts_skip_shuffle_end_of_epoch(tmp_path: Path) -> None:
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, seed=5,
                                rank=0, num_shards=1, show_progress=False)

    @layer.cache_train_dataset("ds", "1", shuffle=True, skip_shuffle_end_of_epoch=True, returns="stream")
    def make() -> Any:
        return records()

    stream = make()
    first, second = _two_epochs(stream)
    assert first == second and sorted(first) == list(range(12)) and first != list(range(12))

    @layer.cache_train_dataset("ds", "1", shuffle=True, returns="stream")
    def make_reshuffled() -> Any:
        return records()

    first, second = _two_epochs(make_reshuffled())
    assert first != second


def test_torch_dataset_accepts_skip_shuffle_end_of_epoch(tmp_path: Path) -> None:
    from yogacache.torch import CacheIterableDataset

    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit(records(), "ds", "1")
    ref = storage.fetch("ds", "1")
    dataset = CacheIterableDataset(
        ref, shuffle=True, shuffle_seed=3, skip_shuffle_end_of_epoch=True, shard_rank=0, num_shards=1
    )
    first = [int(e[1]) for e in dataset]
    dataset.set_epoch(1)
    second = [int(e[1]) for e in dataset]
    assert first == second == order(ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_at_epoch_end=True))
