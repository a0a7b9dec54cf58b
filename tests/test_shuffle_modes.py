"""Shuffle modes: one registry of classes, dispatched by the schedule, extensible by one entry."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from yogacache.dataref import CacheDataRef
from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import PartsMode
from yogacache.read.schedule import ReadSchedule, ResumeState
from yogacache.read.shuffle import (
    SHUFFLE_MODES,
    ArrayPlan,
    EpochPlan,
    GlobalMode,
    ShardMode,
    ShuffleMode,
    shuffle_mode,
)
from yogacache.store.local import CacheStore


class ReverseMode(ShuffleMode):
    """A toy mode: every rank reads its strided shard backwards, every epoch."""

    name = "reverse"

    def __init__(self, num_records: int, options: ReadOptions) -> None:
        super().__init__(num_records, options)
        self.order = np.arange(options.shard_rank, num_records, options.num_shards, dtype=np.int64)[::-1]

    @classmethod
    def check(cls, options: ReadOptions) -> None:
        if options.shuffle:
            raise ValueError("shuffle_mode='reverse' does not shuffle")

    def remaining(self, position: int) -> int:
        return max(0, len(self.order) - position)

    def plan(self, epoch: int, position: int) -> EpochPlan:
        return ArrayPlan(epoch, self.order[position:])


@pytest.fixture
def reverse_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SHUFFLE_MODES, ReverseMode.name, ReverseMode)


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> CacheDataRef:
    store = CacheStore(Path(tmp_path_factory.mktemp("modes")), show_progress=False)
    store.build("ids", "v1", [{"i": np.int64(i)} for i in range(11)])
    return CacheDataRef(store.open("ids", "v1"))


def test_the_registry_holds_the_three_modes_by_name() -> None:
    assert SHUFFLE_MODES == {"shard": ShardMode, "global": GlobalMode, "parts": PartsMode}
    assert shuffle_mode("global") is GlobalMode
    with pytest.raises(ValueError, match=r"must be one of \('shard', 'global', 'parts'\), got 'local'"):
        shuffle_mode("local")


def test_resume_states_keep_their_format() -> None:
    shard = ResumeState("shard", 1, 5, 3, 100, 1, 4).to_dict()
    assert shard == {
        "version": 1,
        "mode": "shard",
        "epoch": 1,
        "consumed": 5,
        "seed": 3,
        "num_records": 100,
        "shard_rank": 1,
        "num_shards": 4,
    }
    glob = ResumeState("global", 1, 5, 3, 100, 1, 4).to_dict()
    assert glob == {"version": 1, "mode": "global", "epoch": 1, "consumed": 5, "seed": 3, "num_records": 100}
    with pytest.raises(ValueError, match="resume state mode must be one of"):
        ResumeState.from_dict({**glob, "mode": "reverse"})


def test_a_registered_mode_works_end_to_end(ref: CacheDataRef, reverse_registered: None) -> None:
    stream = ref.stream(shard_rank=1, num_shards=3, shuffle_mode="reverse")
    assert len(stream) == 4
    assert [[int(e["i"]) for e in stream] for _ in range(2)] == [[10, 7, 4, 1]] * 2
    batches = stream.batch_iterator_fn
    assert batches is not None and np.concatenate([c[0] for c in batches()]).tolist() == [10, 7, 4, 1]
    # Resume states name the mode, and resume where they say.
    state = stream.state_dict(6)
    build = ref.reader.manifest.build_id
    assert state == {
        "version": 1, "mode": "reverse", "epoch": 1, "consumed": 2, "seed": None, "num_records": 11,
        "build": build, "shuffle": False,
    }
    resumed = ref.stream(shard_rank=1, num_shards=3, shuffle_mode="reverse", resume_state=state)
    assert [int(e["i"]) for e in resumed] == [4, 1]
    with pytest.raises(ValueError, match="the resume state was saved with shuffle_mode='reverse'"):
        ref.stream(resume_state=state)
    # The mode's own check runs when the options are made.
    with pytest.raises(ValueError, match="does not shuffle"):
        ReadOptions(shuffle=True, shuffle_seed=1, shuffle_mode="reverse")
    # Unregistered again, the name is refused.
    del SHUFFLE_MODES["reverse"]
    with pytest.raises(ValueError, match="shuffle_mode must be one of"):
        ReadOptions(shuffle_mode="reverse")


def test_a_registered_mode_reaches_the_torch_dataset(ref: CacheDataRef, reverse_registered: None) -> None:
    torch_adapter = pytest.importorskip("yogacache.torch")
    dataset = torch_adapter.CacheIterableDataset(
        ref, shard_rank=0, num_shards=2, shuffle_mode="reverse", output="numpy"
    )
    assert [int(e["i"]) for e in dataset] == [10, 8, 6, 4, 2, 0]
    assert dataset.state_dict(3)["mode"] == "reverse"


def test_the_schedule_dispatches_to_the_mode_object() -> None:
    shard = ReadSchedule(10, ReadOptions(shard_rank=1, num_shards=3))
    glob = ReadSchedule(10, ReadOptions(shard_rank=1, num_shards=3, shuffle_mode="global"))
    assert isinstance(shard.order, ShardMode) and isinstance(glob.order, GlobalMode)
    assert shard.mode == "shard" and glob.mode == "global"
    # Positions count records of the shard in shard mode, of the epoch in global mode.
    assert shard.advance((0, 0), 2) == (0, 2)
    assert glob.advance((0, 0), 2) == (0, 6)
    assert shard.plan(0).indices(0, 5).tolist() == [1, 4, 7]
    assert glob.plan(0, 6).indices(0, 5).tolist() == [7]
