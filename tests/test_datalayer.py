"""DataLayer: Determined's decorators over a shared_fs (or local default) cache.

``cache_train_dataset`` reads version ``<v>_train`` with the shard remainder dropped, the trial
seed and the resume offset; ``cache_validation_dataset`` reads ``<v>_val`` from the start in
the same order every epoch. Orders are checked against docs/design.md's definition (numpy
``RandomState(seed + epoch).permutation`` of a strided shard), not against the library's own
sampler.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf

import yogacache
from yogacache import ConfigError, DataLayer
from yogacache.config import S3Config, SharedFSConfig, parse_config
from yogacache.store.local import CacheStore

N = 23  # records in the test dataset
S = 4  # shards: 23 % 4 == 3 records of remainder for training


def shared_fs(root: Path) -> dict[str, Any]:
    return {"type": "shared_fs", "host_storage_path": str(root)}


class DatasetFunction:
    """A dataset-building function that counts its calls."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> tf.data.Dataset:
        self.calls += 1
        i = np.arange(self.n, dtype=np.int64)
        return tf.data.Dataset.from_tensor_slices({"i": i, "x": np.stack([i * 2, i * 3], axis=1).astype(np.float32)})


def read_epoch(ds: tf.data.Dataset) -> list[int]:
    out = []
    for element in ds.as_numpy_iterator():
        i = int(element["i"])
        np.testing.assert_array_equal(element["x"], np.array([2 * i, 3 * i], np.float32))
        out.append(i)
    return out


def expected_order(rank: int, num_shards: int, n: int, drop_remainder: bool, seed: int | None, epoch: int) -> list[int]:
    end = n - n % num_shards if drop_remainder else n
    shard = np.arange(rank, end, num_shards)
    if seed is None:
        return shard.tolist()
    return shard[np.random.RandomState(seed + epoch).permutation(len(shard))].tolist()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "storage"


# -- train ----------------------------------------------------------------------------------


def test_train_version_suffix_and_remainder_dropped_across_ranks(root: Path) -> None:
    make = DatasetFunction()
    per_rank = []
    for rank in range(S):
        layer = DataLayer(shared_fs(root), rank=rank, num_shards=S, seed=5)
        ds = layer.cache_train_dataset("digits", "v1")(make)()
        assert isinstance(ds, tf.data.Dataset)
        got = read_epoch(ds)
        assert got == expected_order(rank, S, N, True, None, 0)
        per_rank.append(got)
    assert make.calls == 1
    flat = [i for got in per_rank for i in got]
    assert len(flat) == len(set(flat)), "ranks overlap"
    assert sorted(flat) == list(range(N - N % S))
    # The cache is stored under "<version>_train" and holds the whole dataset.
    assert sorted(p.name for p in (root / "digits").iterdir() if not p.name.startswith(".")) == ["v1_train"]
    manifest = CacheStore(root).verify_cache("digits", "v1_train")
    assert manifest.num_records == N
    assert manifest.dataset_version == "v1_train"


def test_train_shuffle_reshuffles_each_epoch_with_the_seed(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=1, num_shards=S, seed=7)
    ds = layer.cache_train_dataset("digits", "v1", shuffle=True)(DatasetFunction())()
    epochs = [read_epoch(ds) for _ in range(3)]
    for epoch, got in enumerate(epochs):
        assert got == expected_order(1, S, N, True, 7, epoch)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    assert sorted(epochs[0]) == sorted(epochs[1]) == expected_order(1, S, N, True, None, 0)
    # Another seed, another order.
    other = DataLayer(shared_fs(root), rank=1, num_shards=S, seed=8)
    first = read_epoch(other.cache_train_dataset("digits", "v1", shuffle=True)(DatasetFunction())())
    assert first == expected_order(1, S, N, True, 8, 0) == epochs[1]


def test_train_skip_shuffle_at_epoch_end_keeps_one_order(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=0, num_shards=2, seed=11)
    ds = layer.cache_train_dataset("digits", "v1", shuffle=True, skip_shuffle_at_epoch_end=True)(DatasetFunction())()
    expected = expected_order(0, 2, N, True, 11, 0)
    for _ in range(3):
        assert read_epoch(ds) == expected


@pytest.mark.parametrize("offset", [0, 1, 4, 5, 7, 13, 16])
def test_train_resume_offset_equals_uninterrupted_minus_prefix(root: Path, offset: int) -> None:
    rank, shards, seed = 2, 3, 21  # shard length 7 (22 records kept of 23)
    uninterrupted: list[int] = []
    ds = DataLayer(shared_fs(root), rank=rank, num_shards=shards, seed=seed).cache_train_dataset(
        "digits", "v1", shuffle=True
    )(DatasetFunction())()
    for _ in range(5):
        uninterrupted += read_epoch(ds)
    resumed_layer = DataLayer(shared_fs(root), rank=rank, num_shards=shards, seed=seed, offset=offset)
    resumed_ds = resumed_layer.cache_train_dataset("digits", "v1", shuffle=True)(DatasetFunction())()
    first = read_epoch(resumed_ds)
    length = 7
    assert len(first) == length - offset % length
    resumed = first + read_epoch(resumed_ds) + read_epoch(resumed_ds)
    assert resumed == uninterrupted[offset : offset + len(resumed)]


def test_train_parts_mode_options_reach_the_stream(root: Path) -> None:
    """``parts_window`` and ``ranks_per_node`` go where ``shuffle_mode`` goes: the stream's resume
    state names the split it was cut for, and the order is the one ``DataRef.stream`` gives for
    the same arguments."""
    layer = DataLayer(shared_fs(root), rank=1, num_shards=4, seed=3)
    stream = layer.cache_train_dataset(
        "digits", "v1", shuffle=True, shuffle_mode="parts", parts_window=2, ranks_per_node=2, returns="stream"
    )(DatasetFunction())()
    state = stream.state_dict(0)
    assert (state["mode"], state["window"], state["ranks_per_node"]) == ("parts", 2, 2)
    ref = layer.cache_dataset("digits", "v1_train")(DatasetFunction())()
    same = ref.stream(
        shuffle=True,
        shuffle_seed=3,
        shard_rank=1,
        num_shards=4,
        drop_shard_remainder=True,
        shuffle_mode="parts",
        parts_window=2,
        ranks_per_node=2,
    )
    assert same.state_dict(0) == state
    assert [int(element["i"]) for element in stream] == [int(element["i"]) for element in same]
    default = layer.cache_train_dataset("digits", "v1", shuffle=True, shuffle_mode="parts", returns="stream")(
        DatasetFunction()
    )()
    assert (default.state_dict(0)["window"], default.state_dict(0)["ranks_per_node"]) == (4, 1)


def test_train_resume_offset_without_shuffle(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=0, num_shards=1, offset=20)
    ds = layer.cache_train_dataset("digits", "v1")(DatasetFunction())()
    assert read_epoch(ds) == [20, 21, 22]
    assert read_epoch(ds) == list(range(N))


# -- validation -----------------------------------------------------------------------------


def test_validation_whole_dataset_across_ranks_from_the_start(root: Path) -> None:
    make = DatasetFunction()
    per_rank = []
    for rank in range(S):
        # A resume offset applies to training only.
        layer = DataLayer(shared_fs(root), rank=rank, num_shards=S, seed=3, offset=5)
        ds = layer.cache_validation_dataset("digits", "v1")(make)()
        got = read_epoch(ds)
        assert got == expected_order(rank, S, N, False, None, 0)
        per_rank.append(got)
    assert make.calls == 1
    flat = [i for got in per_rank for i in got]
    assert sorted(flat) == list(range(N)) and len(flat) == len(set(flat))
    assert [len(g) for g in per_rank] == [6, 6, 6, 5]
    manifest = CacheStore(root).verify_cache("digits", "v1_val")
    assert manifest.dataset_version == "v1_val"
    assert not (root / "digits" / "v1_train").exists()


def test_validation_shuffled_order_is_the_same_every_epoch(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=1, num_shards=2, seed=9, offset=3)
    ds = layer.cache_validation_dataset("digits", "v1", shuffle=True)(DatasetFunction())()
    expected = expected_order(1, 2, N, False, 9, 0)
    assert sorted(expected) == list(range(1, N, 2))
    for _ in range(3):
        assert read_epoch(ds) == expected


def test_train_and_validation_are_separate_caches(root: Path) -> None:
    train_make, val_make = DatasetFunction(10), DatasetFunction(6)
    layer = DataLayer(shared_fs(root))
    assert read_epoch(layer.cache_train_dataset("ds", "v2")(train_make)()) == list(range(10))
    assert read_epoch(layer.cache_validation_dataset("ds", "v2")(val_make)()) == list(range(6))
    assert (train_make.calls, val_make.calls) == (1, 1)
    store = CacheStore(root)
    assert store.manifest("ds", "v2_train").num_records == 10
    assert store.manifest("ds", "v2_val").num_records == 6


# -- building only on a miss ----------------------------------------------------------------


def test_decorated_function_runs_only_on_a_miss(root: Path) -> None:
    make = DatasetFunction()
    layer = DataLayer(shared_fs(root), seed=1)
    decorated = layer.cache_train_dataset("digits", "v1")(make)
    assert make.calls == 0, "decorating must not build"
    assert read_epoch(decorated()) == list(range(N))
    assert read_epoch(decorated()) == list(range(N))
    assert make.calls == 1
    # Another process's view (a new DataLayer, another rank) reuses the cache.
    again = DataLayer(shared_fs(root), rank=1, num_shards=2).cache_train_dataset("digits", "v1")(make)
    read_epoch(again())
    assert make.calls == 1
    # A new version is a miss.
    read_epoch(layer.cache_train_dataset("digits", "v2")(make)())
    assert make.calls == 2


def test_decorated_function_receives_its_arguments(root: Path) -> None:
    seen: list[tuple[Any, ...]] = []

    def make(n: int, *, scale: int = 1) -> tf.data.Dataset:
        seen.append((n, scale))
        return tf.data.Dataset.from_tensor_slices({"i": np.arange(n, dtype=np.int64) * scale})

    decorated = DataLayer(shared_fs(root)).cache_validation_dataset("args", "v1")(make)
    assert decorated.__name__ == "make"
    got = [int(e["i"]) for e in decorated(4, scale=10).as_numpy_iterator()]
    assert got == [0, 10, 20, 30]
    assert seen == [(4, 10)]


def test_python_iterable_result_is_cached_too(root: Path) -> None:
    layer = DataLayer(shared_fs(root))
    records = [{"i": np.int64(i), "x": np.array([2 * i, 3 * i], np.float32)} for i in range(8)]
    ds = layer.cache_train_dataset("plain", "v1")(lambda: records)()
    assert read_epoch(ds) == list(range(8))


def test_empty_shards_yield_nothing(root: Path) -> None:
    make = DatasetFunction(2)
    for rank in range(4):
        layer = DataLayer(shared_fs(root), rank=rank, num_shards=4, seed=1)
        # 2 records over 4 ranks: training drops both; validation gives ranks 2 and 3 nothing.
        assert read_epoch(layer.cache_train_dataset("tiny", "v1", shuffle=True)(make)()) == []
        val = read_epoch(layer.cache_validation_dataset("tiny", "v1", shuffle=True)(make)())
        assert val == ([rank] if rank < 2 else [])


# -- where caches live ----------------------------------------------------------------------


def test_container_storage_path_wins(tmp_path: Path) -> None:
    host, container = tmp_path / "host", tmp_path / "container"
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(host), "container_storage_path": str(container)})
    assert read_epoch(layer.cache_train_dataset("digits", "v1")(DatasetFunction())()) == list(range(N))
    assert CacheStore(container).exists("digits", "v1_train")
    assert not host.exists()


def test_host_path_alone_is_used(tmp_path: Path) -> None:
    host = tmp_path / "host"
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(host), "container_storage_path": None})
    read_epoch(layer.cache_validation_dataset("digits", "v1")(DatasetFunction())())
    assert CacheStore(host).exists("digits", "v1_val")


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda: DataLayer(),
        lambda: DataLayer(None, seed=3),
        lambda: DataLayer.from_config(None),
        lambda: DataLayer({"type": "shared_fs"}),
        lambda: DataLayer({"type": "shared_fs", "host_storage_path": None, "container_storage_path": None}),
    ],
    ids=["no-args", "none", "from_config-none", "shared_fs-no-path", "shared_fs-null-paths"],
)
def test_local_default_under_yogacache_home(
    private_default_root: Path, tmp_path: Path, make_layer: Callable[[], DataLayer]
) -> None:
    layer = make_layer()
    make = DatasetFunction()
    assert read_epoch(layer.cache_train_dataset("local", "v1")(make)()) == list(range(N))
    assert make.calls == 1
    assert CacheStore(private_default_root).verify_cache("local", "v1_train").num_records == N
    # Nothing else under the test's directory received a cache.
    found = [p for p in tmp_path.rglob("manifest.json") if private_default_root not in p.parents]
    assert found == []


def test_from_config_is_the_constructor(root: Path) -> None:
    layer = DataLayer.from_config(shared_fs(root), rank=1, num_shards=2, seed=4, offset=1)
    assert (layer.rank, layer.num_shards, layer.seed, layer.offset) == (1, 2, 4, 1)
    assert layer.store.root == root
    assert isinstance(layer.config, SharedFSConfig)


# -- configuration errors -------------------------------------------------------------------


@pytest.mark.parametrize(
    "config, words",
    [
        ({"type": "shared_fs", "host_storage_path": "/x", "hots_storage_path": "/y"}, ["hots_storage_path"]),
        ({"type": "shared_fs", "host_storage_path": "relative/dir"}, ["host_storage_path", "absolute"]),
        ({"type": "shared_fs", "container_storage_path": "./dir"}, ["container_storage_path", "absolute"]),
        ({"type": "shared_fs", "host_storage_path": 5}, ["host_storage_path"]),
        ({"type": "nfs", "host_storage_path": "/x"}, ["type", "nfs"]),
        ({"host_storage_path": "/x"}, ["type"]),
        ({}, ["type"]),
        (
            {"type": "s3", "bucket": "b", "bucket_directory_path": "p", "local_cache_host_path": "/cache"},
            ["local_cache_host_path", "local_cache_container_path"],
        ),
        (
            {"type": "gcs", "bucket": "b", "bucket_directory_path": "p", "local_cache_container_path": "/cache"},
            ["local_cache_host_path", "local_cache_container_path"],
        ),
        (
            {
                "type": "s3",
                "bucket": "b",
                "bucket_directory_path": "p",
                "local_cache_host_path": "cache",
                "local_cache_container_path": "/cache",
            },
            ["local_cache_host_path", "absolute"],
        ),
        ({"type": "s3", "bucket_directory_path": "p"}, ["bucket"]),
        ({"type": "gcs", "bucket": "b", "bucket_directory_path": "p", "endpoint_url": "http://x"}, ["endpoint_url"]),
        (["shared_fs"], ["mapping"]),
        ("shared_fs", ["mapping"]),
    ],
    ids=[
        "unknown-key",
        "relative-host",
        "relative-container",
        "non-string-path",
        "bad-type",
        "missing-type",
        "empty",
        "s3-host-only",
        "gcs-container-only",
        "s3-relative-local-cache",
        "s3-no-bucket",
        "gcs-unknown-key",
        "list",
        "string",
    ],
)
def test_config_errors(tmp_path: Path, config: Any, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        DataLayer(config)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    for word in words:
        assert word in message, message
    with pytest.raises(ConfigError):
        parse_config(config)
    assert list(tmp_path.iterdir()) == [], "a rejected config created files"


def test_rank_and_shard_errors(root: Path) -> None:
    with pytest.raises(ValueError, match="rank"):
        DataLayer(shared_fs(root), rank=2, num_shards=2)
    with pytest.raises(ValueError, match="rank"):
        DataLayer(shared_fs(root), rank=-1, num_shards=2)
    with pytest.raises(ValueError, match="num_shards"):
        DataLayer(shared_fs(root), num_shards=0)
    with pytest.raises(ValueError, match="offset"):
        DataLayer(shared_fs(root), offset=-1)
    with pytest.raises(TypeError, match="seed"):
        DataLayer(shared_fs(root), seed="7")  # type: ignore[arg-type]
    assert not root.exists()


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
ACCESS = "AKIAIOSFODNN7EXAMPLE"


def s3_config(**extra: Any) -> dict[str, Any]:
    return {
        "type": "s3",
        "bucket": "my-bucket",
        "bucket_directory_path": "caches",
        "access_key": ACCESS,
        "secret_key": SECRET,
        "endpoint_url": "http://127.0.0.1:9000",
        **extra,
    }


def test_secrets_never_appear_in_reprs_or_errors(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    config = parse_config(s3_config())
    assert isinstance(config, S3Config)
    assert config.secret_key == SECRET  # kept, only hidden
    for text in (repr(config), str(config)):
        assert SECRET not in text
        assert ACCESS not in text
        assert "my-bucket" in text  # the repr is still useful
    with caplog.at_level(logging.DEBUG):
        # Unknown keys, bad types, a lone local cache path: none of the messages leak it.
        for bad in (
            s3_config(bogus=1),
            s3_config(bucket=None),
            s3_config(local_cache_host_path="/x"),
            s3_config(local_cache_host_path="rel", local_cache_container_path="/x"),
            s3_config(endpoint_url=5),
        ):
            with pytest.raises(ConfigError) as info:
                DataLayer(bad)
            for text in (str(info.value), repr(info.value), repr(info.value.__cause__), repr(info.value.__context__)):
                assert SECRET not in text and ACCESS not in text, text
        # A valid S3 layer (no network is touched until a dataset is used) hides them too.
        layer = DataLayer(
            s3_config(local_cache_host_path=str(tmp_path / "cache"), local_cache_container_path=str(tmp_path / "cache"))
        )
        for text in (repr(layer), str(layer), repr(layer.config), repr(layer.store)):
            assert SECRET not in text and ACCESS not in text, text
    assert all(SECRET not in record.getMessage() for record in caplog.records)


def test_layer_repr_names_the_root(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=1, num_shards=3, seed=2, offset=4)
    text = repr(layer)
    assert str(root) in text and "rank=1" in text and "num_shards=3" in text


def test_import_yogacache_does_not_import_tensorflow() -> None:
    import subprocess
    import sys

    code = "import sys, yogacache, yogacache.storage; assert 'tensorflow' not in sys.modules, 'tf imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert yogacache.DataLayer is DataLayer


# -- returns= on every decorator (issue 33 item 7) ------------------------------------------------


def record_ids(result: Any) -> list[int]:
    """The ``i`` of every record an adapter's result yields, in order (one epoch)."""
    if isinstance(result, tf.data.Dataset):
        return read_epoch(result)
    return [int(element["i"]) for element in result]


def adapter_type(returns: str) -> type:
    if returns == "tf":
        return tf.data.Dataset
    if returns == "torch":
        from yogacache.torch import CacheIterableDataset

        return CacheIterableDataset
    if returns == "grain":
        import grain

        return grain.MapDataset
    from yogacache.read.pipeline import Stream

    return Stream


@pytest.mark.parametrize("returns", ["tf", "torch", "stream", "grain"])
def test_every_decorator_returns_what_returns_names_in_its_order(root: Path, returns: str) -> None:
    """docs/grain.md, docs/ray.md and docs/determined.md name ``returns=`` for the decorators:
    ``cache_dataset`` took none (``returns="grain"`` raised TypeError). Each decorator returns
    the adapter's dataset of this rank's records, in the order of the design's definition (the
    mixture methods: in the mixture stream's order)."""
    rank, make = 1, DatasetFunction()
    layer = DataLayer(shared_fs(root), rank=rank, num_shards=S, seed=5, show_progress=False)
    ref = layer.cache_dataset("digits", "v1")(make)()
    assert isinstance(ref, yogacache.CacheDataRef)  # without returns=: the cache itself
    read = {
        "cache_dataset": layer.cache_dataset("digits", "v1", returns=returns)(make)(),
        "cache_dataset shuffled": layer.cache_dataset("digits", "v1", returns=returns, shuffle=True)(make)(),
        "cache_train_dataset": layer.cache_train_dataset("digits", "v1", shuffle=True, returns=returns)(make)(),
        "cache_validation_dataset": layer.cache_validation_dataset("digits", "v1", returns=returns)(make)(),
    }
    assert make.calls == 3  # v1, v1_train, v1_val: each built once
    expected = {
        "cache_dataset": expected_order(rank, S, N, False, None, 0),
        "cache_dataset shuffled": expected_order(rank, S, N, False, 5, 0),
        "cache_train_dataset": expected_order(rank, S, N, True, 5, 0),
        "cache_validation_dataset": expected_order(rank, S, N, False, None, 0),
    }
    mixture = layer.mixture([ref, layer.cache_dataset("digits", "v2")(DatasetFunction(9))()], weights=[2, 1])
    read["train_mixture"] = layer.train_mixture(mixture, shuffle=True, returns=returns)
    read["validation_mixture"] = layer.validation_mixture(mixture, returns=returns)
    streams = {
        "train_mixture": mixture.stream(shuffle=True, shuffle_seed=5, shard_rank=rank, num_shards=S,
                                        drop_shard_remainder=True),
        "validation_mixture": mixture.for_evaluation().stream(shard_rank=rank, num_shards=S),
    }  # fmt: skip
    expected.update({name: record_ids(stream) for name, stream in streams.items()})
    for name, result in read.items():
        assert isinstance(result, adapter_type(returns)), name
        assert record_ids(result) == expected[name], name


def test_cache_dataset_read_arguments_need_returns(root: Path) -> None:
    layer = DataLayer(shared_fs(root), rank=0, num_shards=2, seed=5, show_progress=False)
    with pytest.raises(TypeError, match=r"cache_dataset got read arguments \['shuffle'\] without returns="):
        layer.cache_dataset("digits", "v1", shuffle=True)
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['shard_rank'\] \(shard_rank: the layer's"):
        layer.cache_dataset("digits", "v1", returns="stream", shard_rank=1)
    with pytest.raises(ValueError, match="returns must be one of"):
        layer.cache_dataset("digits", "v1", returns="jax")
    # start_offset and a mode's settings reach the read.
    make = DatasetFunction()
    stream = layer.cache_dataset("digits", "v1", returns="stream", shuffle=True, shuffle_mode="global",
                                 start_offset=3)(make)()  # fmt: skip
    whole = layer.cache_dataset("digits", "v1", returns="stream", shuffle=True, shuffle_mode="global")(make)()
    assert record_ids(stream) == record_ids(whole)[3:]
