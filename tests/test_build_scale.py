"""Parallel builds linear in the dataset's size (issue 34 item 3): a job names its build shard's
range, never the data, however the workers start.

Forked workers inherit the dataset of the index ranges (nothing of it is pickled); spawned ones
make it once each, by calling the function that made it again, or from one pickled copy each;
a build the planner keeps in this process pickles nothing. What was sent is the pool's own
account (``ShardedBuild.sent``: the bytes of each job and of each worker's one-off payload, the
very bytes the pool sends), and the records are the same, one by one, as with one process.
"""

from __future__ import annotations

import pickle
import sys
import threading
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache.errors import BuildError
from yogacache.format.manifest import Manifest
from yogacache.parallel import BuildShardError, CallShard, parallel_maker, sharded
from yogacache.store.local import CacheStore

N = 40_000  # 40 build shards (at least MIN_SHARD_RECORDS, 1,024, each)
SMALL_JOB = 2048  # bytes: a job names its range, the build directory and the limits


def element(i: int) -> dict[str, Any]:
    return {"id": np.int64(i), "x": np.full(16, i % 1000, np.float32), "text": b"t" * (i % 37)}


def make_records(n: int) -> list[dict[str, Any]]:
    """A module-level function making the same records every call (spawned workers call it)."""
    return [element(i) for i in range(n)]


def make_fewer(n: int) -> list[dict[str, Any]]:
    """Made again in a worker, it returns other records than in the driver (where n is asked)."""
    import multiprocessing

    return make_records(n if multiprocessing.parent_process() is None else n - 1)


class Pickles:
    """Counts how often something pickled a dataset (``__reduce_ex__``, which pickle calls)."""

    count = 0


class NeverPickledList(list):  # type: ignore[type-arg]
    """A list that counts every time it is pickled (copying it, as the planner does, is not)."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        Pickles.count += 1
        return super().__reduce_ex__(protocol)

    def __copy__(self) -> NeverPickledList:
        return NeverPickledList(self)


class Witness:
    """Held by a dataset: counts every time the dataset is pickled (a shallow copy, as the
    planner makes to sample records, does not pickle what the dataset holds)."""

    def __reduce__(self) -> Any:
        Pickles.count += 1
        return (Witness, ())


class Table:
    """A map-style dataset over a table of every sample (as torchvision's ImageFolder holds its
    ``samples``): the table is the size of the dataset, and it must not travel with each job."""

    def __init__(self, n: int) -> None:
        self.samples = [(f"/data/{i:08d}.jpg", i % 10) for i in range(n)]
        self.witness = Witness()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict[str, Any]:
        path, label = self.samples[i]
        return {"path": path.encode(), "label": np.int64(label)}


class LockedTable(Table):
    """A dataset holding what does not pickle (as an open file or connection would)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.lock = threading.Lock()


def shape(manifest: Manifest) -> list[tuple[str, int, int, str, Any]]:
    return [(p.name, p.first_record, p.num_records, p.digest, p.first_key) for p in manifest.parts]


def records(store: CacheStore) -> list[dict[str, Any]]:
    reader = store.open("ds", "v1")
    try:
        return [reader[i] for i in range(len(reader))]
    finally:
        reader.close()


def same_records(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    """Every record, in order, field by field."""
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert sorted(a) == sorted(b), i
        for key in b:
            np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=f"record {i} {key}")


@pytest.fixture
def counted() -> Any:
    Pickles.count = 0
    yield Pickles
    Pickles.count = 0


def test_forked_workers_over_a_large_list_are_sent_ranges_and_write_the_records_of_one_process(
    tmp_path: Path, counted: Any
) -> None:
    data = NeverPickledList(make_records(N))
    one = CacheStore(tmp_path / "one", show_progress=False)
    one.build("ds", "v1", data)  # a plain one-process build: no build shards
    build = sharded(data, 2, in_process_below=0, start_method="fork")  # the default here (see below)
    two = CacheStore(tmp_path / "two", show_progress=False)
    manifest = two.build("ds", "v1", build)
    sent = build.sent
    assert (sent.start_method, sent.data, sent.per_worker) == ("fork", "inherited", 0)
    assert len(sent.per_job) == len(build.shards) == 40
    assert max(sent.per_job) < SMALL_JOB, sent.per_job  # a range, not 40,000 records
    assert counted.count == 0  # nothing pickled the list, in the driver or for a worker
    expected = [element(i) for i in range(N)]
    same_records(records(two), expected)
    same_records(records(one), expected)
    # and the cache is the one workers=1 writes, part for part
    sequential = CacheStore(tmp_path / "seq", show_progress=False).build("ds", "v1", sharded(data, 1))
    assert shape(sequential) == shape(manifest)


def test_a_map_style_dataset_holding_a_table_of_every_sample_is_not_sent_per_job(
    tmp_path: Path, counted: Any
) -> None:
    table = Table(N)
    build = sharded(table, 2, in_process_below=0, start_method="fork")
    manifest = CacheStore(tmp_path / "two", show_progress=False).build("ds", "v1", build)
    assert build.sent.data == "inherited" and max(build.sent.per_job) < SMALL_JOB
    assert counted.count == 0
    one = CacheStore(tmp_path / "one", show_progress=False)
    assert shape(one.build("ds", "v1", sharded(table, 1))) == shape(manifest)
    same_records(records(CacheStore(tmp_path / "two")), [table[i] for i in range(N)])


def test_spawned_workers_make_the_dataset_again_from_the_function_that_made_it(tmp_path: Path) -> None:
    """What the CLI and the decorators hand over (``parallel_maker``): spawned workers call the
    function once each, and every job is still a range."""
    data = make_records(N)
    build = sharded(data, 2, in_process_below=0, start_method="spawn", remake=CallShard(make_records, (N,)))
    manifest = CacheStore(tmp_path / "spawn", show_progress=False).build("ds", "v1", build)
    sent = build.sent
    assert (sent.start_method, sent.data) == ("spawn", "remade")
    assert sent.per_worker < SMALL_JOB and max(sent.per_job) < SMALL_JOB
    forked = CacheStore(tmp_path / "fork", show_progress=False).build(
        "ds", "v1", sharded(data, 2, in_process_below=0, start_method="fork")
    )
    assert shape(forked) == shape(manifest)
    same_records(records(CacheStore(tmp_path / "spawn")), data)
    # parallel_maker passes the call: a function returning the dataset is made again, not sent
    made = parallel_maker(make_records, 2)(N)
    assert made.remakes[id(made.shards[0].data)] == CallShard(make_records, (N,), {})


def test_spawned_workers_without_a_function_get_one_copy_each_not_one_per_job(tmp_path: Path, counted: Any) -> None:
    data = NeverPickledList(make_records(N))
    build = sharded(data, 2, in_process_below=0, start_method="spawn")
    manifest = CacheStore(tmp_path / "spawn", show_progress=False).build("ds", "v1", build)
    sent = build.sent
    assert (sent.start_method, sent.data) == ("spawn", "pickled")
    whole = len(pickle.dumps(list(data), protocol=pickle.HIGHEST_PROTOCOL))
    assert whole * 0.9 < sent.per_worker < whole * 1.1  # one copy for each worker
    assert max(sent.per_job) < SMALL_JOB
    # Pickled once to account for it and once per worker by the pool's initializer: never per job.
    assert counted.count == 1 + 2 < len(sent.per_job), (counted.count, len(sent.per_job))
    forked = CacheStore(tmp_path / "fork", show_progress=False).build(
        "ds", "v1", sharded(data, 2, in_process_below=0, start_method="fork")
    )
    assert shape(forked) == shape(manifest)


def test_a_build_the_planner_keeps_in_this_process_pickles_nothing(tmp_path: Path, counted: Any) -> None:
    data = NeverPickledList(make_records(N))
    # in_process_below: as if starting workers cost an hour (the planner's own estimate is timed)
    build = sharded(data, 2, start_method="spawn", in_process_below=3600)  # what spawned workers would get
    assert build.plan_workers()[0] == 1
    manifest = CacheStore(tmp_path / "small", show_progress=False).build("ds", "v1", build)
    assert build.sent.start_method is None and build.sent.per_job == ()
    assert counted.count == 0
    table = Table(5000)
    CacheStore(tmp_path / "table", show_progress=False).build("ds", "v1", sharded(table, 2, in_process_below=3600))
    assert counted.count == 0
    assert shape(CacheStore(tmp_path / "one", show_progress=False).build("ds", "v1", sharded(data, 1))) == shape(
        manifest
    )


def test_a_function_that_makes_other_records_in_a_worker_fails_naming_the_shard(tmp_path: Path) -> None:
    store = CacheStore(tmp_path, show_progress=False)
    build = sharded(
        make_fewer(3000), 2, in_process_below=0, start_method="spawn", remake=CallShard(make_fewer, (3000,))
    )
    with pytest.raises(
        BuildShardError,
        match=r"build shard \d of ds:v1 failed: making its dataset in a worker process: ValueError: make_fewer\(\) "
        r"made 2,999 records in this worker, 3,000 in the driver: spawned workers call it again",
    ):
        store.build("ds", "v1", build)


def test_the_start_method_follows_the_build_shards_and_what_is_imported(monkeypatch: Any) -> None:
    for module in ("tensorflow", "jax"):  # as in a process that never imported them
        monkeypatch.delitem(sys.modules, module, raising=False)
    data = make_records(3000)
    assert sharded(data, 2).choose_start_method()[0] == "fork"
    shards = [CallShard(make_records, (10,)), CallShard(make_records, (20,))]
    assert sharded(shards, 2).choose_start_method()[0] == "spawn"  # recipes: spawned, as they are sent
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    method, why = sharded(data, 2).choose_start_method()
    assert method == "spawn" and "tensorflow is imported" in why
    assert sharded(data, 2, start_method="fork").choose_start_method()[0] == "fork"
    with pytest.raises(ValueError, match="start_method 'threads' is not one of this platform's: .*spawn"):
        sharded(data, 2, start_method="threads")


def test_a_dataset_that_does_not_pickle_builds_with_forked_workers_and_is_refused_by_spawned_ones(
    tmp_path: Path,
) -> None:
    data = LockedTable(3000)
    store = CacheStore(tmp_path, show_progress=False)
    store.build("ds", "v1", sharded(data, 2, in_process_below=0, start_method="fork"))
    same_records(records(store), [data[i] for i in range(3000)])
    with pytest.raises(
        BuildError,
        match=r"the dataset of this build \(LockedTable\) could not be sent to a spawned worker process: "
        r"TypeError: cannot pickle '_thread.lock' object; make it picklable, or build from a module-level function",
    ):
        store.build("ds", "v2", sharded(data, 2, in_process_below=0, start_method="spawn"))


def test_object_shards_share_the_class_table_once_per_worker_not_once_per_job(tmp_path: Path) -> None:
    """An imagefolder's class table (ImageNet-21k: 21,841 classes) is in every shard's recipe; a
    pool sends it to each worker once, and each job names it."""
    from yogacache.parallel.shards import ObjectsShard
    from yogacache.sources import from_url

    root = tmp_path / "images"
    classes = [f"n{index:08d}-a-class-name-as-long-as-imagenet-descriptions-are" for index in range(300)]
    for index, label in enumerate(classes):
        (root / label).mkdir(parents=True)
        (root / label / "0.png").write_bytes(f"image {index}".encode())
    table = len(pickle.dumps({label: index for index, label in enumerate(classes)}))
    one = CacheStore(tmp_path / "one", show_progress=False)
    one.build("ds", "v1", from_url(str(root), format="imagefolder"))
    recipes = from_url(str(root), format="imagefolder").shard_recipes(files_per_shard=10)
    build = sharded([ObjectsShard(recipe) for recipe in recipes], 2)
    assert len(build.shards) == 30
    two = CacheStore(tmp_path / "two", show_progress=False)
    two.build("ds", "v1", build)
    sent = build.sent
    assert (sent.start_method, sent.data) == ("spawn", "pickled")
    assert sent.per_worker > table and max(sent.per_job) < table  # the table once per worker, in no job
    same_records(records(two), records(one))
    assert [int(record["cls"]) for record in records(two)] == list(range(300))
