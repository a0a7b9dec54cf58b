"""What used to happen silently now says so (issue 9.16): the seed of a seedless shuffle, ranks
that get no records, a torch state_dict that cannot know what workers consumed, and a missing
``returns="torch"`` without TensorFlow."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache
from yogacache.storage import LFSConfigurations, LFSStorage

REPO = Path(__file__).resolve().parent.parent


def records(n: int) -> list[tuple[np.ndarray, int]]:
    return [(np.full(2, i, np.int32), i) for i in range(n)]


@pytest.fixture
def ref(tmp_path: Path) -> Any:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit(records(40), "ds", "1")
    return storage.fetch("ds", "1")


def ids(stream: Any) -> list[int]:
    return [int(e[1]) for e in stream]


def test_a_seedless_shuffle_logs_its_seed_and_keeps_one_order(ref: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="yogacache"):
        stream = ref.stream(shuffle=True, skip_shuffle_at_epoch_end=True)
    said = re.search(r"shuffle=True without shuffle_seed: shuffling with shuffle_seed=(\d+)", caplog.text)
    assert said, caplog.text
    first, second = ids(stream), ids(stream)
    assert first == second and sorted(first) == list(range(40)) and first != list(range(40))
    # The logged seed reproduces the order.
    again = ref.stream(shuffle=True, skip_shuffle_at_epoch_end=True, shuffle_seed=int(said.group(1)))
    assert ids(again) == first


def test_a_seedless_shuffle_is_one_order_across_dataloader_workers(ref: Any) -> None:
    from torch.utils.data import DataLoader

    from yogacache.torch import CacheIterableDataset

    dataset = CacheIterableDataset(ref, shuffle=True, skip_shuffle_at_epoch_end=True, shard_rank=0, num_shards=1)
    got = [int(i) for _, batch in DataLoader(dataset, batch_size=4, num_workers=2) for i in batch]
    assert sorted(got) == list(range(40))  # each worker computed the same permutation


@pytest.mark.parametrize("drop", [False, True])
def test_a_rank_without_records_warns(tmp_path: Path, drop: bool) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit(records(3), "small", "1")
    ref = storage.fetch("small", "1")
    said = r"rank 5 of 8 reads no records: the dataset has 3 record\(s\), fewer than num_shards"
    with pytest.warns(UserWarning, match=said):
        stream = ref.stream(shard_rank=5, num_shards=8, drop_shard_remainder=drop)
    assert ids(stream) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ids(ref.stream(shard_rank=2, num_shards=8)) == [2]  # this rank has a record
    if drop:
        with pytest.warns(UserWarning, match="drop_shard_remainder=True drops them all"):
            ref.stream(shard_rank=0, num_shards=8, drop_shard_remainder=True)


def test_torch_state_dict_of_a_plain_dataloader_with_workers_warns(ref: Any) -> None:
    from torch.utils.data import DataLoader

    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    dataset = CacheIterableDataset(ref, shard_rank=0, num_shards=1, batch_size=4)
    loader = DataLoader(dataset, batch_size=4, num_workers=2)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    del iterator
    with pytest.warns(UserWarning, match="this process has not counted any records.*CacheDataLoader"):
        state = dataset.state_dict()
    assert state["consumed"] == 0
    assert dataset.state_dict(records_consumed=12)["consumed"] == 12  # told: no warning needed

    counted = CacheIterableDataset(ref, shard_rank=0, num_shards=1)
    iterator = iter(CacheDataLoader(counted, batch_size=4, num_workers=2))
    for _ in range(3):
        next(iterator)
    del iterator
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert counted.state_dict()["consumed"] == 12


BLOCKED_TF = """
import sys
sys.modules["tensorflow"] = None  # as if TensorFlow were not installed
import numpy as np
import yogacache
layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": sys.argv[1]}, rank=0, num_shards=1,
                            show_progress=False)

@layer.cache_train_dataset("ds", "1")
def make():
    return [(np.full(2, i, np.int32), i) for i in range(5)]

try:
    make()
except ImportError as error:
    print("ImportError:", error)

@layer.cache_train_dataset("ds", "1", returns="torch")
def make_torch():
    raise AssertionError("cached already")

print("torch records:", len(list(make_torch())))
"""


def test_without_tensorflow_the_default_returns_says_what_to_pass(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_TF, str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr
    assert "returns='torch'" in done.stdout and "TensorFlow is not installed" in done.stdout
    assert "torch records: 5" in done.stdout
    assert yogacache.__version__  # the package itself imported without TensorFlow
