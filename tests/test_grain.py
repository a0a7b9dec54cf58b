"""yogacache.grain: a cache as a Grain data source (local and streamed from moto's S3), Grain's own
orders and loaders over it, checkpoints, and yogacache's orders as a Grain sampler."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import grain
import numpy as np
import pytest
from absl import flags

from tests.cloud_helpers import Cloud, unique
from tests.faultproxy import FaultProxy
from tests.streaming_helpers import DS, RECORDS, VER, node_config, publish
from yogacache.dataref import CacheDataRef
from yogacache.grain import CacheDataSource, CacheSampler, from_options, open_data_source
from yogacache.read.options import ReadOptions
from yogacache.store import open_store
from yogacache.store.local import CacheStore
from yogacache.torch import CacheDataset

N = 120


@pytest.fixture(autouse=True)
def _grain_flags() -> None:
    # Grain's worker processes read its absl flags, which a program parses at start-up
    # (absl.app.run); a test process never does.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def records(n: int = N) -> list[dict[str, Any]]:
    return [
        {"image": np.full((3, 4), i, np.uint8), "label": np.int64(i), "pair": (np.float32(i / 2), np.int16(-i))}
        for i in range(n)
    ]


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    root = tmp_path / "caches"
    CacheStore(root, part_size_bytes=2048, show_progress=False).build("grainy", "v1", records())  # many parts
    return root


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and np.array_equal(a, b) and np.asarray(a).dtype == np.asarray(b).dtype


def labels(items: Any) -> list[int]:
    return [int(label) for item in items for label in np.atleast_1d(item["label"])]


def test_records_equal_cache_datasets_by_index_batch_and_after_pickling(cache_dir: Path) -> None:
    source = open_data_source("grainy", "v1", cache_dir)
    expected = CacheDataset(source.reader, output="numpy")
    assert len(source) == N
    at: list[Any] = [0, 7, N - 1, -1, np.int64(5)]
    assert all(same(got, want) for got, want in zip(source.__getitems__(at), expected.__getitems__(at)))
    assert all(same(source[i], expected[i]) for i in range(N))
    assert same(source._getitems([3, 1]), [expected[3], expected[1]])
    again = pickle.loads(pickle.dumps(source))
    assert repr(again) == repr(source) and "0x" not in repr(source) and "grainy" in repr(source)
    assert same(again[11], expected[11])
    with pytest.raises(IndexError, match=f"index {N} is out of range for a cache of {N} records"):
        source[N]


def test_map_dataset_shuffle_batch_reads_a_permutation_and_resumes_from_its_state(cache_dir: Path) -> None:
    source = CacheDataSource(CacheDataRef(open_store(cache_dir).open("grainy", "v1")))
    dataset = grain.MapDataset.source(source).shuffle(seed=5).batch(16)
    order = labels(dataset)
    assert sorted(order) == list(range(N)) and order != list(range(N))
    iterator = dataset.to_iter_dataset().__iter__()
    head = [next(iterator) for _ in range(3)]
    state = iterator.get_state()
    rest = labels(iterator)
    resumed = dataset.to_iter_dataset().__iter__()
    resumed.set_state(state)
    after = labels(resumed)
    assert labels(head) + after == order and after == rest


def test_data_loader_with_two_workers_reads_each_record_once_and_resumes_exactly(cache_dir: Path) -> None:
    source = open_data_source("grainy", "v1", cache_dir)

    def loader() -> Any:
        sampler = grain.samplers.IndexSampler(
            num_records=len(source),
            shard_options=grain.sharding.ShardByJaxProcess(),
            shuffle=True,
            num_epochs=1,
            seed=3,
        )
        return grain.DataLoader(
            data_source=source, sampler=sampler, operations=[grain.transforms.Batch(10)], worker_count=2
        )

    iterator = iter(loader())
    head = [next(iterator) for _ in range(4)]
    state = iterator.get_state()
    rest = labels(iterator)
    assert sorted(labels(head) + rest) == list(range(N))
    assert all(batch["image"].shape == (10, 3, 4) and batch["image"].dtype == np.uint8 for batch in head)
    resumed = iter(loader())
    resumed.set_state(state)
    assert labels(resumed) == rest


@pytest.mark.parametrize("mode", ["shard", "global", "parts"])
def test_cache_sampler_reads_the_streams_order_on_each_rank(
    cache_dir: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yogacache.grain

    monkeypatch.setattr(yogacache.grain, "ORDER_BLOCK", 7)  # the order computed in blocks: many cross here
    source = open_data_source("grainy", "v1", cache_dir)
    for rank in range(2):
        kwargs = dict(shuffle=True, shuffle_seed=9, shuffle_mode=mode, shard_rank=rank, num_shards=2)
        stream = CacheDataRef(source.reader).stream(**kwargs)
        expected = labels(stream) + labels(stream)  # two epochs, each in its own order
        sampler = CacheSampler(source, num_epochs=2, **kwargs)
        assert len(sampler) == len(expected) and sampler.epoch_length == len(stream)
        got = labels(grain.DataLoader(data_source=source, sampler=sampler, worker_count=0))
        assert got == expected
        assert expected[: len(stream)] != expected[len(stream) :]


@pytest.mark.parametrize("mode", ["global", "parts"])
def test_cache_sampler_resumes_elastically_from_two_ranks_to_three(cache_dir: Path, mode: str) -> None:
    source = open_data_source("grainy", "v1", cache_dir)
    kwargs: dict[str, Any] = dict(shuffle=True, shuffle_seed=4, shuffle_mode=mode)
    consumed = 13
    before, states = [], []
    for rank in range(2):
        sampler = CacheSampler(source, shard_rank=rank, num_shards=2, **kwargs)
        before += [int(sampler[k].record_key) for k in range(consumed)]
        states.append(sampler.state(consumed))
    assert states[0] == states[1]
    after = []
    for rank in range(3):
        sampler = CacheSampler(source, shard_rank=rank, num_shards=3, resume_state=states[0], **kwargs)
        after += labels(grain.DataLoader(data_source=source, sampler=sampler, worker_count=0))
    assert sorted(before + after) == list(range(N))


def test_shard_options_set_the_rank_and_the_loader_does_not_shard_again(cache_dir: Path) -> None:
    source = open_data_source("grainy", "v1", cache_dir)
    options = grain.sharding.ShardOptions(shard_index=1, shard_count=3)
    sampler = CacheSampler(source, shard_options=options)
    assert labels(grain.DataLoader(data_source=source, sampler=sampler)) == list(range(1, N, 3))
    with pytest.raises(ValueError, match="either shard_options or shard_rank/num_shards"):
        CacheSampler(source, shard_options=options, shard_rank=0, num_shards=3)


def test_bad_arguments_say_what_is_wrong(cache_dir: Path) -> None:
    source = open_data_source("grainy", "v1", cache_dir)
    with pytest.raises(ValueError, match="shuffle_mode"):
        CacheSampler(source, shuffle=True, shuffle_seed=1, shuffle_mode="sorted", shard_rank=0, num_shards=1)
    with pytest.raises(ValueError, match="num_epochs must be at least 1"):
        CacheSampler(source, num_epochs=0, shard_rank=0, num_shards=1)
    sampler = CacheSampler(source, shard_rank=0, num_shards=1)
    with pytest.raises(IndexError, match=f"past the {N} records of 1 epoch"):
        sampler[N]
    with pytest.raises(Exception, match="no cache for dataset 'missing'"):
        open_data_source("missing", "v1", cache_dir)


def test_data_layer_returns_a_grain_map_dataset_in_its_order(tmp_path: Path) -> None:
    import yogacache

    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": str(tmp_path)}, rank=1, num_shards=2, seed=6, show_progress=False
    )

    @layer.cache_train_dataset("grainy", "v1", shuffle=True, shuffle_mode="global", returns="grain")
    def make() -> list[dict[str, Any]]:
        return records()

    dataset = make()
    assert isinstance(dataset, grain.MapDataset) and len(dataset) == N // 2
    ref = CacheDataRef(open_store(tmp_path, show_progress=False).open("grainy", "v1_train"))
    stream = ref.stream(shuffle=True, shuffle_seed=6, shard_rank=1, num_shards=2, shuffle_mode="global")
    first, second = labels(stream), labels(stream)
    assert labels(dataset.batch(7)) == first
    assert labels(dataset.repeat(2)) == first + second  # epochs past the first in their own order
    options = ReadOptions.from_stream_args(
        shuffle=True, shuffle_seed=6, shard_rank=1, num_shards=2, shuffle_mode="global"
    )
    assert labels(from_options(ref, options)) == first


def test_streamed_from_s3_under_a_budget_workers_reuse_the_nodes_parts(s3_server: Any, tmp_path: Path) -> None:
    """Grain's spawned workers get the streamed reader pickled; every record once, each part
    fetched once by the node (the workers share its part cache), records equal CacheDataset's."""
    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("caches")
    manifest = publish(cloud, bucket, prefix, tmp_path / "builder")
    with FaultProxy(s3_server.endpoint_url) as proxy:
        config = node_config(
            cloud,
            bucket,
            prefix,
            tmp_path / "node",
            proxy.url,
            streaming=True,
            local_cache_limit=manifest.total_size_bytes,
        )
        source = open_data_source(DS, VER, config)
        assert source.reader.streamed
        sampler = CacheSampler(source, shard_rank=0, num_shards=1)  # cache order: each part read through once
        loader = grain.DataLoader(
            data_source=source, sampler=sampler, operations=[grain.transforms.Batch(32)], worker_count=2
        )
        got = [int(label) for batch in loader for label in batch[1]]
        assert sorted(got) == list(range(RECORDS))
        gets = [e.target for e in proxy.requests("GET") if "-part-" in e.target and e.size]
        assert sorted(set(gets)) == sorted(gets) and len(gets) == len(manifest.parts)
        expected = CacheDataset(source.reader, output="numpy")
        assert all(
            same(a, b)
            for a, b in zip(
                source.__getitems__(range(0, RECORDS, 37)), expected.__getitems__(list(range(0, RECORDS, 37)))
            )
        )


@pytest.mark.parametrize("kind", ["fixed", "variable"])
def test_one_record_is_read_on_its_own_and_equals_a_batch_of_one(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grain's DataLoader reads ``source[i]`` one record at a time: that is one B-tree search and
    one decode (``read_leaves``), never a batch set up for one row, and it gives exactly what
    ``__getitems__([i])[0]`` gives."""
    rng = np.random.default_rng(3)
    if kind == "fixed":
        records = [{"image": rng.integers(0, 255, (4, 4), dtype=np.uint8), "label": np.int64(i)} for i in range(300)]
    else:
        records = [{"text": b"x" * (i % 7), "n": i, "v": np.arange(i % 3, dtype=np.float32)} for i in range(300)]
    CacheStore(tmp_path, show_progress=False).build("g", "v1", records)
    source = CacheDataSource(CacheStore(tmp_path).open("g", "v1"))
    reader = source.reader
    batched = {i: source.__getitems__([i])[0] for i in (0, 1, 150, 299)}
    calls: list[str] = []
    for name in ("read_elements", "read_columns"):
        monkeypatch.setattr(reader, name, lambda *a, _n=name, **k: calls.append(_n))
    for i, expected in batched.items():
        got = source[i]
        assert sorted(got) == sorted(expected)
        for key in got:
            assert type(got[key]) is type(expected[key]), (key, type(got[key]), type(expected[key]))
            np.testing.assert_array_equal(got[key], expected[key])
    assert calls == [], calls  # the single-record path only
