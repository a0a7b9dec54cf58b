"""yogacache.ray on a real local Ray cluster (``ray.init(num_cpus=2)``), reading caches on the S3 test server.

A Dataset over a cache streamed from S3 under a byte budget holds exactly the records written,
column for column equal to ``CacheDataset(reader, output="numpy")``'s; ``count()`` comes from the
read tasks' metadata (no part fetched, no record read); a shuffled Dataset is in the order
``CacheIterableDataset`` reads for the same arguments, epoch and rank; a read task fetches only
the parts of its range; two ``TorchTrainer`` workers reading one epoch see each record once.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, unique
from tests.streaming_helpers import DS, RECORDS, VER, data, parts_dir, publish
from yogacache.format.manifest import Manifest
from yogacache.read.options import ReadOptions
from yogacache.read.reader import CacheReader
from yogacache.store import open_store

REPO = Path(__file__).resolve().parent.parent
SEED = 7


@pytest.fixture(scope="module")
def ray_cluster(s3_server: Any) -> Iterator[Any]:
    """One local Ray cluster for the module (its start-up costs seconds); started after the S3
    server, so that its workers inherit the server's credentials too."""
    import ray
    import ray.data  # noqa: F401

    env = {"PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def published(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Cloud, str, str, Manifest]:
    """The streaming tests' cache (480 records of (int32[1024] filled with i, i), 12 parts) on S3."""
    cloud = Cloud("s3", s3_server)
    bucket, prefix = s3_server.new_bucket(), unique("caches")
    return cloud, bucket, prefix, publish(cloud, bucket, prefix, tmp_path_factory.mktemp("builder"))


def streaming_config(published: tuple[Cloud, str, str, Manifest], node: Path) -> dict[str, Any]:
    """A data_layer config that streams the cache into ``node`` under half its size."""
    cloud, bucket, prefix, manifest = published
    return cloud.config(
        bucket, prefix, local_cache_host_path=str(node), local_cache_container_path=str(node),
        streaming=True, local_cache_limit=manifest.total_size_bytes // 2,
    )  # fmt: skip


def labels(dataset: Any) -> list[int]:
    return [int(row["1"]) for row in dataset.iter_rows()]


def downloaded(node: Path, manifest: Manifest) -> set[int]:
    """The parts whose files lie in ``node``'s parts directory."""
    names = [path.name for path in parts_dir(node).iterdir()] if parts_dir(node).exists() else []
    whole = [name for name in names if ".tmp-" not in name]
    return {i for i, part in enumerate(manifest.parts) if any(part.name in name for name in whole)}


def test_a_streamed_s3_cache_reads_back_every_record_and_counts_without_reading(
    ray_cluster: Any, published: tuple[Cloud, str, str, Manifest], tmp_path: Path
) -> None:
    import yogacache.ray as yr
    from yogacache.torch import CacheDataset

    manifest = published[3]
    node = tmp_path / "node"
    config = streaming_config(published, node)
    dataset = yr.read_cache(DS, VER, config, override_num_blocks=4)
    assert dataset.count() == RECORDS
    assert downloaded(node, manifest) == set()  # count() fetched no part
    rows = list(dataset.iter_rows())
    assert sorted(int(row["1"]) for row in rows) == list(range(RECORDS))
    written = data()
    for row in rows:
        np.testing.assert_array_equal(row["0"], written[int(row["1"])][0])
    # Unshuffled: cache order, each column equal to the torch dataset's numpy records.
    oracle = CacheDataset(open_store(config, show_progress=False).open(DS, VER), output="numpy")
    batches = list(dataset.iter_batches(batch_size=100, batch_format="numpy"))
    images = np.concatenate([batch["0"] for batch in batches])
    ids = np.concatenate([batch["1"] for batch in batches])
    records = oracle.__getitems__(list(range(RECORDS)))
    np.testing.assert_array_equal(images, np.stack([record[0] for record in records]))
    np.testing.assert_array_equal(ids, np.array([record[1] for record in records]))
    assert ids.dtype == np.array([records[0][1]]).dtype
    # Ray's own shuffle works on the result: the same records, another order.
    shuffled = labels(dataset.random_shuffle(seed=3))
    assert sorted(shuffled) == list(range(RECORDS)) and shuffled != list(range(RECORDS))


class FailingReader(CacheReader):
    """A reader whose every read fails, in this process and in Ray's workers (it pickles by class)."""

    def read_columns(self, indices: Any) -> list[np.ndarray]:
        raise RuntimeError("a record was read")

    def read_elements(self, indices: Any) -> list[Any]:
        raise RuntimeError("a record was read")


def test_count_comes_from_metadata_without_a_read(ray_cluster: Any, tmp_path: Path) -> None:
    """A reader that fails on any read still counts: count() executes no read task."""
    import yogacache.ray as yr
    from yogacache.store.local import CacheStore

    reader = CacheStore(tmp_path / "store", show_progress=False).get_or_build("few", "v1", lambda: data(50))
    reader.__class__ = FailingReader
    assert yr.read_cache(reader, start_offset=20).count() == 30
    assert yr.read_cache(reader, shuffle=True, shuffle_seed=1, num_shards=3, shard_rank=2).count() == 16
    with pytest.raises(Exception, match="a record was read"):  # reading does read
        yr.read_cache(reader).take(1)


@pytest.mark.parametrize(
    ("mode", "epoch", "rank", "shards"), [("shard", 1, 0, 1), ("global", 2, 1, 2), ("parts", 1, 0, 1)]
)
def test_a_shuffled_dataset_is_in_the_torch_streams_order(
    ray_cluster: Any, published: tuple[Cloud, str, str, Manifest], tmp_path: Path,
    mode: str, epoch: int, rank: int, shards: int,
) -> None:  # fmt: skip
    import yogacache.ray as yr
    from yogacache.torch import CacheIterableDataset

    config = streaming_config(published, tmp_path / "node")
    args = {"shuffle": True, "shuffle_seed": SEED, "shuffle_mode": mode, "shard_rank": rank, "num_shards": shards}
    dataset = yr.read_cache(DS, VER, config, epoch=epoch, override_num_blocks=3, **args)
    torch_order = CacheIterableDataset(open_store(config, show_progress=False).open(DS, VER), output="numpy", **args)
    torch_order.set_epoch(epoch)
    expected = [int(record[1]) for record in torch_order]
    assert len(expected) == RECORDS // shards and expected != sorted(expected)
    assert dataset.count() == len(expected)
    assert labels(dataset) == expected


def test_a_resume_state_starts_the_dataset_where_it_says(ray_cluster: Any, tmp_path: Path) -> None:
    import yogacache.ray as yr
    from yogacache.store.local import CacheStore
    from yogacache.torch import CacheIterableDataset

    reader = CacheStore(tmp_path / "store", show_progress=False).get_or_build("few", "v1", lambda: data(60))
    args = {"shuffle": True, "shuffle_seed": SEED, "shuffle_mode": "global"}
    stream = CacheIterableDataset(reader, output="numpy", shard_rank=0, num_shards=1, **args)
    stream.set_epoch(3)
    whole = [int(record[1]) for record in stream]
    state = stream.state_dict(records_consumed=25)
    resumed = yr.read_cache(reader, resume_state=state, **args)
    assert resumed.count() == 35 and labels(resumed) == whole[25:]
    assert labels(yr.read_cache(reader, epoch=4, resume_state=state, **args)) != whole  # another epoch, whole
    assert yr.read_cache(reader, epoch=4, resume_state=state, **args).count() == 60


def test_a_read_task_fetches_only_the_parts_of_its_range(
    ray_cluster: Any, published: tuple[Cloud, str, str, Manifest], tmp_path: Path
) -> None:
    """Unshuffled, tasks are cut at part boundaries; the first of three fetches its four parts."""
    import yogacache.ray as yr

    manifest = published[3]
    node = tmp_path / "node"
    reader = open_store(streaming_config(published, node), show_progress=False).open(DS, VER)
    source = yr.CacheDatasource(reader)
    bounds = source.task_bounds(3)
    starts = {part.first_record for part in manifest.parts} | {RECORDS}
    assert len(bounds) == 4 and set(bounds) <= starts
    tasks = source.get_read_tasks(3)
    assert [task.metadata.num_rows for task in tasks] == [b - a for a, b in zip(bounds, bounds[1:])]
    blocks = list(tasks[0]())
    assert sum(block.num_rows for block in blocks) == bounds[1]
    first_parts = {i for i, part in enumerate(manifest.parts) if part.first_record < bounds[1]}
    assert downloaded(node, manifest) == first_parts
    reader.close()


def test_every_data_layer_decorator_returns_a_ray_dataset_in_its_order(ray_cluster: Any, tmp_path: Path) -> None:
    """``returns="ray"`` on each decorator docs/ray.md names (``cache_dataset`` took no
    ``returns=`` at all): this rank's records, in the order its stream reads them."""
    import ray.data

    import yogacache

    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": str(tmp_path)}, rank=1, num_shards=2, seed=SEED, show_progress=False
    )
    ref = layer.cache_dataset("few", "v1")(lambda: data(30))()
    other = layer.cache_dataset("more", "v1")(lambda: data(12, fill=100))()
    mixture = layer.mixture([ref, other], weights=[3, 1])
    read = {
        "cache_dataset": layer.cache_dataset("few", "v1", returns="ray", shuffle=True)(lambda: data(30))(),
        "cache_train_dataset": layer.cache_train_dataset("few", "v1", shuffle=True, returns="ray")(lambda: data(30))(),
        "cache_validation_dataset": layer.cache_validation_dataset("few", "v1", returns="ray")(lambda: data(30))(),
        "train_mixture": layer.train_mixture(mixture, shuffle=True, returns="ray"),
        "validation_mixture": layer.validation_mixture(mixture, returns="ray"),
    }
    streams = {
        "cache_dataset": ref.stream(shuffle=True, shuffle_seed=SEED, shard_rank=1, num_shards=2),
        "train_mixture": mixture.stream(shuffle=True, shuffle_seed=SEED, shard_rank=1, num_shards=2,
                                        drop_shard_remainder=True),
        "validation_mixture": mixture.for_evaluation().stream(shard_rank=1, num_shards=2),
    }  # fmt: skip
    expected = {name: [int(element[1]) for element in stream] for name, stream in streams.items()}
    shard = np.arange(1, 30, 2)
    expected["cache_train_dataset"] = shard[np.random.RandomState(SEED).permutation(len(shard))].tolist()
    expected["cache_validation_dataset"] = shard.tolist()
    for name, dataset in read.items():
        assert isinstance(dataset, ray.data.Dataset), name
        assert labels(dataset) == expected[name], name


def test_from_options_reads_a_dataref_as_the_options_say(ray_cluster: Any, tmp_path: Path) -> None:
    import yogacache.ray as yr
    from yogacache.store.local import CacheStore

    reader = CacheStore(tmp_path / "store", show_progress=False).get_or_build("few", "v1", lambda: data(40))

    class Ref:  # what DataLayer hands its adapters: anything holding a reader
        def __init__(self) -> None:
            self.reader = reader

    options = ReadOptions(shard_rank=1, num_shards=2, start_offset=5)
    assert labels(yr.from_options(Ref(), options)) == list(range(1, 40, 2))[5:]


def test_bad_input_says_what_is_wrong(ray_cluster: Any, tmp_path: Path) -> None:
    import yogacache.ray as yr
    from yogacache.errors import CacheNotFoundError

    with pytest.raises(ValueError, match=r"shuffle_mode must be one of .*'global'.*got 'random'"):
        yr.read_cache("ds", "v1", tmp_path, shuffle=True, shuffle_mode="random")
    with pytest.raises(CacheNotFoundError, match="missing"):
        yr.read_cache("missing", "v1", tmp_path)
    with pytest.raises(TypeError, match="read_cache takes a dataset id with dataset_version"):
        yr.read_cache("missing", storage=tmp_path)
    with pytest.raises(TypeError, match="unexpected keyword"):
        yr.read_cache("ds", "v1", tmp_path, shufle=True)


def documented_worker_resources() -> dict[str, float]:
    """The ``resources_per_worker`` of docs/ray.md's Ray Train example: less than a CPU."""
    text = (REPO / "docs" / "ray.md").read_text()
    example = text[text.index("## Exactly once across Ray Train workers") :]
    found = re.search(r"ScalingConfig\(num_workers=\d+, resources_per_worker=(\{[^}]*\})\)", example)
    assert found, "docs/ray.md's Ray Train example gives its workers no resources_per_worker"
    resources = ast.literal_eval(found.group(1))
    assert 0 < resources["CPU"] < 1, resources
    return resources


def _train_loop(config: dict[str, Any]) -> None:
    """A Ray Train worker: one epoch of its shard of the dataset; writes the record ids it saw."""
    import ray.train

    shard = ray.train.get_dataset_shard("train")
    seen: list[int] = []
    for batch in shard.iter_torch_batches(batch_size=32):
        seen.extend(int(x) for x in batch["1"])
        assert batch["0"].shape[1:] == (1024,)
    rank = ray.train.get_context().get_world_rank()
    Path(config["out"], f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_two_torch_trainer_workers_see_each_record_exactly_once(
    ray_cluster: Any, published: tuple[Cloud, str, str, Manifest], tmp_path: Path
) -> None:
    """480 records split between 2 workers: Ray's ``streaming_split(equal=True)`` drops nothing
    when the count divides evenly (it would drop a remainder otherwise). The workers take the
    resources docs/ray.md's Ray Train example gives them: less than a CPU each, so that the
    cluster's 2 CPUs leave room for the read tasks (whole-CPU workers would take both, and the
    read tasks would wait for ever: issue 33)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    import yogacache.ray as yr

    config = streaming_config(published, tmp_path / "node")
    dataset = yr.read_cache(DS, VER, config, shuffle=True, shuffle_seed=SEED, shuffle_mode="parts")
    out = tmp_path / "seen"
    out.mkdir()
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker=documented_worker_resources()),
        run_config=RunConfig(storage_path=str(tmp_path / "runs"), name="read"),
        datasets={"train": dataset},
    )
    trainer.fit()
    seen = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert all(seen) and sorted(seen[0] + seen[1]) == list(range(RECORDS))
