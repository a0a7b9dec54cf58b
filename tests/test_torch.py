"""PyTorch adapter: map-style and iterable datasets, DataLoader workers (fork and spawn), resume,
and caches built from torch or TensorFlow read by the other framework."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from yogacache import DataLayer
from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.torch import CacheDataLoader, CacheDataset, CacheIterableDataset

REPO = Path(__file__).resolve().parent.parent
N = 203  # records in the main test cache (odd: remainders everywhere)
CONTEXTS = ["fork", "spawn"]  # spawned workers import torch afresh: a few seconds each


def record(i: int) -> dict[str, Any]:
    return {"i": np.int64(i), "x": np.full((2, 3), i, np.float32), "name": f"r{i}".encode()}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CacheStore:
    store = CacheStore(tmp_path_factory.mktemp("torch"), show_progress=False)
    store.build("ids", "v1", [record(i) for i in range(N)])
    store.build("ragged", "v1", [{"i": np.int64(i), "v": np.arange(i % 4, dtype=np.int32)} for i in range(20)])
    return store


@pytest.fixture(scope="module")
def ref(store: CacheStore) -> CacheDataRef:
    return CacheDataRef(store.open("ids", "v1"))


def check(element: dict[str, Any]) -> int:
    """The record index of an element (batch or single record), after checking its values."""
    i = element["i"]
    x = element["x"]
    assert isinstance(i, torch.Tensor) and isinstance(x, torch.Tensor)
    assert torch.equal(x, i.reshape(*i.shape, 1, 1).expand(*i.shape, 2, 3).float())
    names = element["name"] if isinstance(element["name"], list) else [element["name"]]
    assert names == [f"r{int(j)}".encode() for j in i.reshape(-1)]
    return int(i) if i.dim() == 0 else -1


def ids_of(batches: Iterable[dict[str, Any]]) -> list[int]:
    out: list[int] = []
    for batch in batches:
        check(batch)
        out.extend(batch["i"].reshape(-1).tolist())
    return out


def plan_of(ds: CacheIterableDataset) -> list[int]:
    plan = ds.schedule.plan(ds.epoch, ds.schedule.start[1] if ds.epoch == ds.schedule.start[0] else 0)
    return plan.indices(0, len(plan)).tolist()


# -- map-style ----------------------------------------------------------------------------------


def test_map_style_len_getitem_and_outputs(ref: CacheDataRef, store: CacheStore) -> None:
    ds = CacheDataset(ref)
    assert len(ds) == N
    assert check(ds[5]) == 5 and check(ds[-1]) == N - 1
    with pytest.raises(IndexError, match="out of range"):
        ds[N]
    as_numpy = CacheDataset(store.cache_dir("ids", "v1"), output="numpy")  # a directory works too
    element = as_numpy[7]
    assert isinstance(element["x"], np.ndarray) and element["x"].dtype == np.float32
    assert int(element["i"]) == 7 and element["name"] == b"r7"
    batch = ds.__getitems__([3, 1, 3])
    assert [int(e["i"]) for e in batch] == [3, 1, 3]
    with pytest.raises(ValueError, match="output"):
        CacheDataset(ref, output="jax")


def test_map_style_tensors_are_writable_and_independent(ref: CacheDataRef) -> None:
    ds = CacheDataset(ref)
    first = ds[4]["x"]
    first += 1  # augmentation in place must not touch the cache or the next read
    assert torch.equal(ds[4]["x"], torch.full((2, 3), 4.0))


@pytest.mark.parametrize("context", CONTEXTS)
def test_map_style_with_two_workers(ref: CacheDataRef, context: str) -> None:
    ds = CacheDataset(ref)
    ds[0]  # the parent has LMDB open before the workers start: they must open their own
    loader = DataLoader(
        ds, batch_size=16, shuffle=True, num_workers=2, multiprocessing_context=context,
        generator=torch.Generator().manual_seed(0),
    )
    seen = ids_of(loader)
    assert sorted(seen) == list(range(N)) and seen != list(range(N))


def test_map_style_variable_shapes(store: CacheStore) -> None:
    ds = CacheDataset(CacheDataRef(store.open("ragged", "v1")))
    assert ds[6]["v"].tolist() == [0, 1]
    assert [len(e["v"]) for e in ds.__getitems__([0, 1, 2, 3])] == [0, 1, 2, 3]


# -- iterable: order, workers, ranks -------------------------------------------------------------


@pytest.mark.parametrize(
    ("context", "mode", "ranks"), [("fork", "shard", 2), ("fork", "global", 2), ("spawn", "global", 1)]
)
def test_workers_split_the_rank_and_the_loader_keeps_its_order(
    ref: CacheDataRef, context: str, mode: str, ranks: int
) -> None:
    per_rank = []
    for rank in range(ranks):
        ds = CacheIterableDataset(ref, shuffle=True, shuffle_seed=3, shard_rank=rank, num_shards=2, shuffle_mode=mode)
        ds.reader[0]  # opened in the parent
        loader = CacheDataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=context)
        got = ids_of(loader)
        assert got == plan_of(ds)  # exactly the rank's order, not just its records
        assert len(got) == len(ds)
        per_rank.append(got)
    if ranks == 2:
        assert sorted(per_rank[0] + per_rank[1]) == list(range(N))


def test_plain_dataloader_with_matching_batch_size_keeps_the_order(ref: CacheDataRef) -> None:
    ds = CacheIterableDataset(ref, shuffle=True, shuffle_seed=1, shard_rank=1, num_shards=3, batch_size=5)
    got = ids_of(DataLoader(ds, batch_size=5, num_workers=2))
    assert got == plan_of(ds)


@pytest.mark.parametrize("mode", ["shard", "global"])
def test_batched_mode_yields_whole_batches(ref: CacheDataRef, mode: str) -> None:
    ds = CacheIterableDataset(
        ref, shuffle=True, shuffle_seed=2, num_shards=2, shard_rank=0, drop_shard_remainder=True,
        shuffle_mode=mode, batch_size=16, batched=True,
    )
    batches = list(CacheDataLoader(ds, batch_size=None, num_workers=2))
    assert [len(b["i"]) for b in batches] == [16] * 6 + [5]
    assert len(ds) == 7
    assert ids_of(batches) == plan_of(ds)
    dropped = ds.batch(16, drop_last=True)
    assert len(dropped) == 6 and [len(b["i"]) for b in dropped] == [16] * 6
    numpy_batches = list(CacheIterableDataset(ref, batch_size=50, batched=True, output="numpy"))
    assert isinstance(numpy_batches[0]["x"], np.ndarray) and numpy_batches[0]["x"].shape == (50, 2, 3)
    assert numpy_batches[0]["name"][3] == b"r3"


def test_rank_and_shards_come_from_the_launcher(ref: CacheDataRef, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = CacheIterableDataset(ref)
    assert (ds.rank, ds.num_shards) == (2, 4)
    assert ids_of(DataLoader(ds, batch_size=10)) == list(range(2, N, 4))
    assert CacheIterableDataset(ref, shard_rank=0, num_shards=1).num_shards == 1  # explicit wins


def test_variable_shapes_iterate_by_record_and_refuse_batching(store: CacheStore) -> None:
    ref = CacheDataRef(store.open("ragged", "v1"))
    ds = CacheIterableDataset(ref, shuffle=True, shuffle_seed=0)
    got = list(ds)
    assert sorted(int(e["i"]) for e in got) == list(range(20))
    assert all(len(e["v"]) == int(e["i"]) % 4 for e in got)
    with pytest.raises(ValueError, match="fixed-shape"):
        CacheIterableDataset(ref, batch_size=4, batched=True)


# -- resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_equals_uninterrupted(ref: CacheDataRef, workers: int) -> None:
    args: dict[str, Any] = {"shuffle": True, "shuffle_seed": 9, "shard_rank": 1, "num_shards": 2}
    full = CacheIterableDataset(ref, **args)
    loader = CacheDataLoader(full, batch_size=7, num_workers=workers)
    uninterrupted = []
    for epoch in range(2):
        full.set_epoch(epoch)
        uninterrupted.append(ids_of(loader))
    assert uninterrupted[0] != uninterrupted[1]

    first = CacheIterableDataset(ref, **args)
    loader = CacheDataLoader(first, batch_size=7, num_workers=workers)
    taken = []
    for step, batch in enumerate(loader):
        taken.extend(ids_of([batch]))
        if step == 4:
            state = loader.state_dict()
            break
    assert state["consumed"] == 35 and state["epoch"] == 0 and len(json.dumps(state)) < 1024

    resumed = CacheIterableDataset(ref, **args)
    resumed.load_state_dict(state)
    loader = CacheDataLoader(resumed, batch_size=7, num_workers=workers)
    rest = ids_of(loader)
    assert taken + rest == uninterrupted[0]
    assert loader.state_dict()["epoch"] == 1  # the whole epoch was consumed
    resumed.set_epoch(1)
    assert ids_of(loader) == uninterrupted[1]


def test_elastic_resume_from_two_ranks_to_three(ref: CacheDataRef) -> None:
    args: dict[str, Any] = {"shuffle": True, "shuffle_seed": 4, "shuffle_mode": "global", "drop_shard_remainder": False}
    read: list[int] = []
    states = []
    for rank in range(2):
        ds = CacheIterableDataset(ref, shard_rank=rank, num_shards=2, batch_size=10, batched=True, **args)
        loader = CacheDataLoader(ds, batch_size=None, num_workers=2)
        for step, batch in enumerate(loader):
            read.extend(ids_of([batch]))
            if step == 2:
                break
        states.append(loader.state_dict())
    assert states[0] == states[1] and states[0]["consumed"] == 60
    for rank in range(3):
        ds = CacheIterableDataset(ref, shard_rank=rank, num_shards=3, resume_state=states[0], **args)
        read.extend(ids_of(CacheDataLoader(ds, batch_size=4, num_workers=2)))
    assert sorted(read) == list(range(N))  # every record exactly once


def test_state_dict_counts_what_was_handed_out_in_process(ref: CacheDataRef) -> None:
    ds = CacheIterableDataset(ref, shuffle=True, shuffle_seed=1, shuffle_mode="global")
    iterator = iter(ds)
    for _ in range(11):
        next(iterator)
    assert ds.state_dict()["consumed"] == 11
    assert ds.state_dict(records_consumed=20)["consumed"] == 20  # told by the caller
    ds.set_epoch(3)
    assert (ds.state_dict()["epoch"], ds.state_dict()["consumed"]) == (3, 0)


def test_public_counting_drives_state_dict(ref: CacheDataRef) -> None:
    ds = CacheIterableDataset(ref, batch_size=4)
    ds.count_consumed({"i": torch.arange(4), "x": torch.zeros(4, 2, 3), "name": [b""] * 4}, batch=True)
    first = next(iter(CacheDataset(ref)))
    ds.count_consumed(first, batch=False)
    assert check(first) == 0
    assert ds.state_dict()["consumed"] == 5
    ds.reset_consumed()
    assert ds.state_dict()["consumed"] == 0


def test_any_object_holding_a_reader_is_a_source(ref: CacheDataRef) -> None:
    holder = SimpleNamespace(reader=ref.reader)  # duck typing: no import of yogacache.dataref
    assert ids_of(CacheIterableDataset(holder, shard_rank=1, num_shards=4)) == list(range(1, N, 4))
    assert len(CacheDataset(holder)) == N
    with pytest.raises(TypeError, match="expected a CacheReader"):
        CacheDataset(SimpleNamespace(reader=None))  # type: ignore[arg-type]


def test_torch_adapter_never_imports_the_dataref_facade() -> None:
    # A None entry makes any import of yogacache.dataref fail.
    code = "import sys; sys.modules['yogacache.dataref'] = None; import yogacache.torch"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]


def test_loader_arguments_that_would_break_order_or_resume(ref: CacheDataRef) -> None:
    with pytest.raises(ValueError, match="persistent_workers"):
        CacheDataLoader(CacheIterableDataset(ref), batch_size=4, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="batch_size=None"):
        CacheDataLoader(CacheIterableDataset(ref, batch_size=4, batched=True), batch_size=4)
    with pytest.raises(ValueError, match="blocks of 5"):
        CacheDataLoader(CacheIterableDataset(ref, batch_size=5), batch_size=4)
    with pytest.raises(TypeError, match="CacheIterableDataset"):
        CacheDataLoader(CacheDataset(ref))  # type: ignore[arg-type]


# -- building from torch, and across frameworks --------------------------------------------------


class Pictures(Dataset):  # type: ignore[type-arg]
    """A map-style torch dataset of dicts with tensors, numbers, str and bytes."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "image": torch.full((4, 4, 3), i, dtype=torch.uint8),
            "label": i % 3,
            "meta": (f"p{i}", bytes([i])),
        }


class Counting(IterableDataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 6

    def __iter__(self) -> Any:
        return iter((torch.tensor(i), float(i) / 2) for i in range(6))


def test_datalayer_caches_torch_datasets_and_returns_torch_datasets(tmp_path: Path) -> None:
    config = {"type": "shared_fs", "host_storage_path": str(tmp_path)}
    layer = DataLayer(config, rank=1, num_shards=2, seed=3, show_progress=False)
    calls = []

    @layer.cache_train_dataset("pictures", "v1", shuffle=True, shuffle_mode="global", returns="torch")
    def make() -> Dataset:  # type: ignore[type-arg]
        calls.append(1)
        return Pictures()

    ds = make()
    assert isinstance(ds, CacheIterableDataset) and (ds.rank, ds.num_shards) == (1, 2)
    elements = list(ds)
    assert len(elements) == 6 and calls == [1]
    for e in elements:
        i = int(e["image"][0, 0, 0])
        assert e["image"].dtype == torch.uint8 and e["image"].shape == (4, 4, 3)
        assert int(e["label"]) == i % 3 and e["meta"] == (f"p{i}".encode(), bytes([i]))
    assert make() is not None and calls == [1]  # a hit does not call the function

    ref = layer.cache_dataset("counting", "v1")(Counting)()
    assert isinstance(ref, CacheDataRef)
    assert [(int(a), float(b)) for a, b in CacheDataset(ref)] == [(i, i / 2) for i in range(6)]
    stream = layer.cache_validation_dataset("counting", "v1", returns="stream")(Counting)()
    assert [int(a) for a, _ in stream] == [1, 3, 5]
    with pytest.raises(ValueError, match="returns"):
        layer.cache_train_dataset("x", "v1", returns="jax")


def test_cache_built_from_torch_reads_in_tensorflow(tmp_path: Path) -> None:
    import tensorflow as tf

    from yogacache.tensorflow import make_tf_dataset

    store = CacheStore(tmp_path, show_progress=False)
    store.build("td", "v1", TensorDataset(torch.arange(8), torch.arange(16, dtype=torch.float32).reshape(8, 2)))
    ds = make_tf_dataset(CacheDataRef(store.open("td", "v1")).stream(shuffle=True, shuffle_seed=1))
    assert ds.element_spec == (tf.TensorSpec((), tf.int64), tf.TensorSpec((2,), tf.float32))
    got = sorted((int(a), b.tolist()) for a, b in ds.as_numpy_iterator())
    assert got == [(i, [2.0 * i, 2.0 * i + 1]) for i in range(8)]


def test_cache_built_from_tensorflow_reads_in_torch_without_tensorflow(tmp_path: Path) -> None:
    import tensorflow as tf

    store = CacheStore(tmp_path, show_progress=False)
    images = np.arange(10 * 4 * 4 * 3, dtype=np.uint8).reshape(10, 4, 4, 3)
    store.build("tfbuilt", "v1", tf.data.Dataset.from_tensor_slices({"image": images, "label": np.arange(10)}))
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["tensorflow"] = None  # any import of TensorFlow now fails
        import torch
        from torch.utils.data import DataLoader
        from yogacache.torch import CacheDataset, CacheIterableDataset

        def main():
            ds = CacheIterableDataset({str(store.cache_dir("tfbuilt", "v1"))!r}, shuffle=True, shuffle_seed=0)
            batches = list(DataLoader(ds, batch_size=4, num_workers=2))
            labels = sorted(int(l) for b in batches for l in b["label"])
            image = CacheDataset({str(store.cache_dir("tfbuilt", "v1"))!r})[3]["image"]
            print(labels, int(image.sum()), "tensorflow" in sys.modules and sys.modules["tensorflow"] is not None)

        if __name__ == "__main__":
            main()
        """
    )
    path = tmp_path / "read_without_tf.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == f"{list(range(10))} {int(images[3].sum())} False"


def test_import_yogacache_imports_no_framework() -> None:
    code = "import sys, yogacache; print(sorted(m for m in ('torch', 'tensorflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_elastic_resume_example_reads_every_record_once(tmp_path: Path) -> None:
    example = REPO / "examples" / "torch_elastic_resume.py"
    out = subprocess.run(
        [sys.executable, str(example), str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("stopped with 2 ranks after 400 records")
    assert "'consumed': 400" in lines[0] and "'mode': 'global'" in lines[0]
    assert lines[1] == "resumed with 3 ranks: 1000 records read in epoch 0, 0 twice, 0 never"
