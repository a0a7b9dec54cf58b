"""ReadOptions: YogaDL's loose stream arguments converted and validated once, at construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from yogacache.read.options import DEFAULT_SHUFFLE_MODE, ReadOptions
from yogacache.read.schedule import ReadSchedule


def test_defaults_are_yogadls() -> None:
    options = ReadOptions()
    assert options == ReadOptions.from_stream_args()
    assert (options.start_offset, options.shuffle, options.reshuffle_each_epoch, options.shuffle_seed) == (
        0,
        False,
        False,
        None,
    )
    assert (options.shard_rank, options.num_shards, options.drop_shard_remainder) == (0, 1, False)
    assert options.shuffle_mode == DEFAULT_SHUFFLE_MODE == "shard"
    assert options.resume_state is None


@pytest.mark.parametrize(
    ("shuffle", "skip", "reshuffle"),
    [(False, False, False), (False, True, False), (True, False, True), (True, True, False)],
)
def test_skip_shuffle_at_epoch_end_becomes_reshuffle_each_epoch(shuffle: bool, skip: bool, reshuffle: bool) -> None:
    options = ReadOptions.from_stream_args(shuffle=shuffle, skip_shuffle_at_epoch_end=skip, shuffle_seed=1)
    assert options.shuffle is shuffle
    assert options.reshuffle_each_epoch is reshuffle


def test_positional_stream_arguments_keep_yogadls_order() -> None:
    options = ReadOptions.from_stream_args(5, True, True, 7, 1, 3, True)
    assert options == ReadOptions(
        start_offset=5,
        shuffle=True,
        reshuffle_each_epoch=False,
        shuffle_seed=7,
        shard_rank=1,
        num_shards=3,
        drop_shard_remainder=True,
    )


def test_numpy_integers_are_normalised_and_options_are_frozen() -> None:
    numpy_ints: dict[str, Any] = {
        "start_offset": np.int64(3),
        "shard_rank": np.int32(1),
        "num_shards": np.uint8(2),
        "shuffle_seed": np.int16(4),
    }
    options = ReadOptions(**numpy_ints)
    values = (options.start_offset, options.shard_rank, options.num_shards, options.shuffle_seed)
    assert values == (3, 1, 2, 4) and all(type(v) is int for v in values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_shards = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shard_rank": 4, "num_shards": 4}, ValueError, r"shard_rank must be in \[0, 4\)"),
        ({"shard_rank": -1, "num_shards": 4}, ValueError, "shard_rank"),
        ({"num_shards": 0}, ValueError, "num_shards must be at least 1"),
        ({"start_offset": -1}, ValueError, "start_offset must not be negative"),
        ({"start_offset": 1.5}, TypeError, "start_offset must be an integer"),
        ({"num_shards": True}, TypeError, "num_shards must be an integer, not bool"),
        ({"shuffle_seed": "7"}, TypeError, "shuffle_seed"),
        ({"shuffle": True, "reshuffle_each_epoch": True}, ValueError, "shuffle_seed must be set"),
        ({"reshuffle_each_epoch": True, "shuffle_seed": 1}, ValueError, "needs shuffle=True"),
        ({"shuffle": True, "shuffle_mode": "global"}, ValueError, "needs shuffle_seed"),
        ({"shuffle_mode": "local"}, ValueError, r"shuffle_mode must be one of \('shard', 'global'"),
        ({"shuffle_mode": None}, ValueError, "shuffle_mode must be one of"),
        ({"resume_state": [1, 2]}, TypeError, "a resume state is a dict"),
        ({"resume_state": {"mode": "shard"}}, ValueError, "lacks"),
    ],
)
def test_invalid_options_raise_at_construction(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        ReadOptions(**kwargs)


def test_resume_state_excludes_start_offset_and_is_a_checked_copy() -> None:
    state = {"mode": "global", "epoch": 2, "consumed": 10, "seed": 3, "num_records": 100}
    with pytest.raises(ValueError, match="either start_offset or resume_state"):
        ReadOptions(start_offset=1, resume_state=state, shuffle_mode="global")
    options = ReadOptions(shuffle_mode="global", shuffle=True, shuffle_seed=3, resume_state=state)
    state["epoch"] = 99  # the caller's dict changes later: the options do not
    assert options.resume_state == {"version": 1, **{**state, "epoch": 2}}
    assert ReadSchedule(100, options).start == (2, 10)


def test_a_seedless_shuffle_without_reshuffle_is_allowed_in_shard_mode() -> None:
    options = ReadOptions.from_stream_args(shuffle=True, skip_shuffle_at_epoch_end=True)
    assert sorted(ReadSchedule(10, options).plan(0).indices(0, 10).tolist()) == list(range(10))
