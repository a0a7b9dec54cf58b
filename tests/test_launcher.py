"""Rank discovery: torchrun / torch.distributed, Horovod and tf.distribute.InputContext; explicit wins."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache import DataLayer, launcher

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def layer(root: Path, **kwargs: Any) -> DataLayer:
    return DataLayer({"type": "shared_fs", "host_storage_path": str(root)}, show_progress=False, **kwargs)


def records(n: int = 10) -> list[dict[str, Any]]:
    return [{"i": np.int64(i)} for i in range(n)]


def test_no_launcher_is_rank_0_of_1() -> None:
    assert launcher.discover() == launcher.RankInfo(0, 1, 0, "default")


def test_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    found = launcher.discover()
    assert (found.rank, found.num_shards, found.local_rank) == (3, 8, 1)
    assert "torchrun" in found.source


def test_horovod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOROVOD_RANK", "2")
    monkeypatch.setenv("HOROVOD_SIZE", "4")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    found = launcher.discover()
    assert (found.rank, found.num_shards) == (2, 4) and "Horovod" in found.source


def test_explicit_arguments_win_each_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    def ranks(rank: Any, num_shards: Any) -> tuple[int, int]:
        found = launcher.resolve(rank, num_shards)
        return found.rank, found.num_shards

    assert ranks(1, 2) == (1, 2)
    assert ranks(None, 16) == (3, 16)
    assert ranks(5, None) == (5, 8)
    assert ranks(None, None) == (3, 8)


@pytest.mark.parametrize(
    ("environment", "match"),
    [
        ({"RANK": "1"}, "WORLD_SIZE"),
        ({"HOROVOD_SIZE": "2"}, "HOROVOD_RANK"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "torchrun"),
        ({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "0"}, "num_shards"),
    ],
)
def test_inconsistent_launcher_environment_is_an_error(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], match: str
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        launcher.discover()


def test_datalayer_takes_rank_from_the_launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    found = layer(tmp_path)
    assert (found.rank, found.num_shards) == (1, 3)
    stream = found.cache_train_dataset("ids", "v1", returns="stream")(records)()
    assert [int(e["i"]) for e in stream] == [1, 4, 7]  # 10 records, remainder dropped
    explicit = layer(tmp_path, rank=0, num_shards=2)
    stream = explicit.cache_train_dataset("ids", "v1", returns="stream")(records)()
    assert [int(e["i"]) for e in stream] == [0, 2, 4, 6, 8]


def test_initialized_torch_distributed_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    # An environment that disagrees with the process group: the process group is the truth.
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        found = launcher.discover()
        assert (found.rank, found.num_shards, found.source) == (0, 1, "torch.distributed")
    finally:
        dist.destroy_process_group()
    assert launcher.discover().rank == 3  # without a process group, the environment again


def test_tf_input_context_sets_the_shard_of_the_decorated_function(tmp_path: Path) -> None:
    import tensorflow as tf

    context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=2, num_replicas_in_sync=3)
    assert launcher.is_input_context(context)
    found = launcher.discover(context)
    assert (found.rank, found.num_shards) == (2, 3)

    seen: list[Any] = []

    def make(input_context: Any) -> list[dict[str, Any]]:
        seen.append(input_context)
        return records()

    decorated = layer(tmp_path).cache_train_dataset("ids", "v1", returns="stream")(make)
    assert [int(e["i"]) for e in decorated(context)] == [2, 5, 8]
    assert seen == [context]  # the dataset function still receives its context
    # Explicit arguments win over the context.
    explicit = layer(tmp_path, rank=0, num_shards=5).cache_train_dataset("ids", "v1", returns="stream")(make)
    assert [int(e["i"]) for e in explicit(input_context=context)] == [0, 5]
    assert not launcher.is_input_context(object())
