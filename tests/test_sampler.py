"""Sharding, shuffling and resuming: the pure sampler and DataRef.stream against real YogaDL 0.1.4."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import yogadl
from hypothesis import given, settings
from hypothesis import strategies as st

from yogacache.dataref import CacheDataRef
from yogacache.read.sampler import ShardOrder, shard_indices
from yogacache.store.local import CacheStore

EPOCHS = 4


def yogadl_epochs(
    n: int,
    rank: int,
    num_shards: int,
    drop: bool,
    offset: int,
    shuffle: bool,
    skip: bool,
    seed: Optional[int],
    epochs: int = EPOCHS,
) -> list[list[int]]:
    """The order real YogaDL 0.1.4 reads, the way its LMDBDataRef.stream wires its key functions."""
    keys = list(range(n))
    shard = yogadl.shard_keys(keys, rank, num_shards, sequential=False, drop_shard_remainder=drop)
    generator = yogadl.GeneratorFromKeys(
        keys=shard,
        initial_offset=offset,
        read_val_from_key_fn=lambda key: key,
        shuffle_at_start=shuffle,
        shuffle_after_epoch=shuffle and not skip,
        shuffle_seed=seed,
    )
    return [list(generator.instantiate_generator()) for _ in range(epochs)]


def sampler_epochs(
    n: int,
    rank: int,
    num_shards: int,
    drop: bool,
    offset: int,
    shuffle: bool,
    skip: bool,
    seed: Optional[int],
    epochs: int = EPOCHS,
) -> list[list[int]]:
    order = ShardOrder(
        shard_indices(n, rank, num_shards, drop),
        shuffle=shuffle,
        reshuffle_each_epoch=shuffle and not skip,
        seed=seed,
    )
    first, position = order.start(offset)
    result = []
    for e in range(epochs):
        indices = order.epoch(first + e)
        result.append([int(i) for i in (indices[position:] if e == 0 else indices)])
    return result


def stream_epochs(dataref: CacheDataRef, epochs: int = EPOCHS, **kwargs: object) -> list[list[int]]:
    stream = dataref.stream(**kwargs)  # type: ignore[arg-type]
    return [[int(x) for x in stream] for _ in range(epochs)]


# -- the pure sampler against YogaDL -----------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=60),
    num_shards=st.integers(min_value=1, max_value=6),
    rank_fraction=st.floats(min_value=0, max_value=0.999),
    drop=st.booleans(),
    offset_epochs=st.floats(min_value=0, max_value=2.5),
    shuffle=st.booleans(),
    skip=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**31 - EPOCHS - 10),
)
def test_sampler_matches_yogadl(
    n: int,
    num_shards: int,
    rank_fraction: float,
    drop: bool,
    offset_epochs: float,
    shuffle: bool,
    skip: bool,
    seed: int,
) -> None:
    rank = int(rank_fraction * num_shards)
    if drop and n < num_shards:
        return  # YogaDL asserts here; covered by test_more_shards_than_records
    shard_len = len(yogadl.shard_keys(list(range(n)), rank, num_shards, drop_shard_remainder=drop))
    if shard_len == 0:
        return  # YogaDL divides by zero; covered by the empty-shard tests
    offset = int(offset_epochs * shard_len)
    args = (n, rank, num_shards, drop, offset, shuffle, skip, seed)
    assert sampler_epochs(*args) == yogadl_epochs(*args)


@pytest.mark.parametrize("offset", [0, 1, 6, 7, 8, 13, 20, 35])
@pytest.mark.parametrize("skip", [False, True])
def test_sampler_matches_yogadl_offsets_past_epochs(offset: int, skip: bool) -> None:
    args = (21, 1, 3, False, offset, True, skip, 777)
    assert sampler_epochs(*args, epochs=6) == yogadl_epochs(*args, epochs=6)


def test_shuffle_uses_random_state_seed_plus_epoch() -> None:
    shard = shard_indices(50, 2, 5, False)
    order = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=True, seed=11)
    for epoch in range(4):
        expected = shard[np.random.RandomState(11 + epoch).permutation(len(shard))]
        np.testing.assert_array_equal(order.epoch(epoch), expected)
    fixed = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=False, seed=11)
    for epoch in range(4):
        np.testing.assert_array_equal(fixed.epoch(epoch), shard[np.random.RandomState(11).permutation(10)])


def test_reshuffled_epochs_differ_and_skip_keeps_one_order() -> None:
    shard = shard_indices(40, 0, 1, False)
    reshuffled = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=True, seed=3)
    assert not np.array_equal(reshuffled.epoch(0), reshuffled.epoch(1))
    fixed = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=False, seed=3)
    assert np.array_equal(fixed.epoch(0), fixed.epoch(5))
    assert not np.array_equal(fixed.epoch(0), shard)


# -- invariants ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=80),
    num_shards=st.integers(min_value=1, max_value=9),
    drop=st.booleans(),
    shuffle=st.booleans(),
    skip=st.booleans(),
    seed=st.integers(min_value=0, max_value=10_000),
)
def test_epochs_are_permutations_and_ranks_partition_the_dataset(
    n: int, num_shards: int, drop: bool, shuffle: bool, skip: bool, seed: int
) -> None:
    kept = n - n % num_shards if drop else n
    union: list[int] = []
    for rank in range(num_shards):
        shard = shard_indices(n, rank, num_shards, drop)
        assert shard.tolist() == list(range(rank, kept, num_shards))
        order = ShardOrder(shard, shuffle=shuffle, reshuffle_each_epoch=shuffle and not skip, seed=seed)
        assert len(order) == len(shard)
        for epoch in range(3):
            assert sorted(order.epoch(epoch).tolist()) == shard.tolist()
        union.extend(shard.tolist())
    assert sorted(union) == list(range(kept))
    assert len(union) == len(set(union))  # disjoint
    if drop:
        sizes = {len(shard_indices(n, r, num_shards, True)) for r in range(num_shards)}
        assert sizes == {n // num_shards}


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=50),
    num_shards=st.integers(min_value=1, max_value=4),
    drop=st.booleans(),
    shuffle=st.booleans(),
    skip=st.booleans(),
    seed=st.integers(min_value=0, max_value=10_000),
    k=st.integers(min_value=0, max_value=120),
)
def test_resume_at_offset_equals_uninterrupted_run_minus_prefix(
    n: int, num_shards: int, drop: bool, shuffle: bool, skip: bool, seed: int, k: int
) -> None:
    epochs = 5
    full = [x for e in sampler_epochs(n, 0, num_shards, drop, 0, shuffle, skip, seed, epochs) for x in e]
    shard_len = len(shard_indices(n, 0, num_shards, drop))
    resumed = [x for e in sampler_epochs(n, 0, num_shards, drop, k, shuffle, skip, seed, epochs) for x in e]
    if shard_len == 0:
        assert full == [] and resumed == []
        return
    skipped_epochs = k // shard_len
    # The resumed run reads `epochs` iterations from epoch k // len: compare the common part.
    uninterrupted = [
        x
        for e in sampler_epochs(n, 0, num_shards, drop, 0, shuffle, skip, seed, epochs + skipped_epochs)
        for x in e
    ]
    assert resumed == uninterrupted[k : k + len(resumed)]
    assert len(resumed) == epochs * shard_len - k % shard_len


# -- edge cases ---------------------------------------------------------------------------------


def test_empty_dataset_and_empty_shard_yield_nothing() -> None:
    for n, rank, shards in [(0, 0, 1), (0, 2, 3), (2, 3, 5)]:
        for drop in (False, True):
            shard = shard_indices(n, rank, shards, drop)
            assert len(shard) == 0
            order = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=True, seed=1)
            assert order.start(0) == (0, 0)
            epoch, position = order.start(17)  # no ZeroDivisionError
            assert order.epoch(epoch)[position:].tolist() == []


def test_more_shards_than_records() -> None:
    # Without drop: the first N ranks get one record each, the rest get nothing.
    assert [shard_indices(3, r, 5, False).tolist() for r in range(5)] == [[0], [1], [2], [], []]
    # With drop: N - N % S = 0 records are kept; every shard is empty (YogaDL asserts instead).
    assert [shard_indices(3, r, 5, True).tolist() for r in range(5)] == [[]] * 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_records": 10, "shard_rank": 3, "num_shards": 3, "drop_remainder": False}, "shard_rank"),
        ({"num_records": 10, "shard_rank": -1, "num_shards": 3, "drop_remainder": False}, "shard_rank"),
        ({"num_records": 10, "shard_rank": 0, "num_shards": 0, "drop_remainder": False}, "num_shards"),
        ({"num_records": 10, "shard_rank": 0, "num_shards": -2, "drop_remainder": False}, "num_shards"),
        ({"num_records": -1, "shard_rank": 0, "num_shards": 1, "drop_remainder": False}, "num_records"),
    ],
)
def test_shard_indices_invalid_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        shard_indices(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_records": 10, "shard_rank": 0.0, "num_shards": 1, "drop_remainder": False},
        {"num_records": 10, "shard_rank": 0, "num_shards": "2", "drop_remainder": False},
        {"num_records": 10, "shard_rank": True, "num_shards": 2, "drop_remainder": False},
    ],
)
def test_shard_indices_non_integers_are_type_errors(kwargs: dict) -> None:
    with pytest.raises(TypeError, match="integer"):
        shard_indices(**kwargs)


def test_shard_order_invalid_arguments() -> None:
    shard = shard_indices(10, 0, 1, False)
    with pytest.raises(ValueError, match="shuffle_seed"):
        ShardOrder(shard, shuffle=True, reshuffle_each_epoch=True, seed=None)
    with pytest.raises(ValueError, match="shuffle"):
        ShardOrder(shard, shuffle=False, reshuffle_each_epoch=True, seed=1)
    with pytest.raises(TypeError, match="shuffle_seed"):
        ShardOrder(shard, shuffle=True, reshuffle_each_epoch=True, seed=1.5)  # type: ignore[arg-type]
    order = ShardOrder(shard)
    with pytest.raises(ValueError, match="start_offset"):
        order.start(-1)
    with pytest.raises(TypeError, match="start_offset"):
        order.start(1.0)  # type: ignore[arg-type]


def test_seedless_shuffle_without_reshuffle_is_allowed_and_a_permutation() -> None:
    shard = shard_indices(30, 1, 2, False)
    order = ShardOrder(shard, shuffle=True, reshuffle_each_epoch=False, seed=None)
    for epoch in range(3):
        assert sorted(order.epoch(epoch).tolist()) == shard.tolist()


# -- DataRef.stream over a real cache ----------------------------------------------------------


SIZES = [0, 1, 5, 37]


@pytest.fixture(scope="module")
def datarefs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, CacheDataRef]:
    root: Path = tmp_path_factory.mktemp("sampler-caches")
    store = CacheStore(root, show_progress=False)
    refs = {}
    for n in SIZES:
        if n:
            store.build("idx", f"n{n}", [np.int64(i) for i in range(n)])
        else:
            import tensorflow as tf

            store.build("idx", "n0", tf.data.Dataset.range(0))
        refs[n] = CacheDataRef(store.open("idx", f"n{n}"))
    return refs


STREAM_CASES = [
    # n, rank, shards, drop, offset, shuffle, skip, seed
    (37, 0, 1, False, 0, False, False, None),
    (37, 0, 1, False, 0, True, False, 777),
    (37, 0, 1, False, 5, True, False, 777),
    (37, 0, 1, False, 40, True, False, 777),
    (37, 0, 1, False, 80, True, True, 5),
    (37, 2, 4, False, 3, True, False, 1),
    (37, 3, 4, True, 11, True, False, 2),
    (37, 1, 4, True, 0, False, False, None),
    (37, 4, 5, False, 9, True, True, 0),
    (37, 6, 7, True, 12, True, False, 12345),
    (5, 1, 2, False, 2, True, False, 9),
    (5, 4, 5, True, 3, True, False, 9),
    (1, 0, 1, False, 7, True, False, 3),
]


@pytest.mark.parametrize("case", STREAM_CASES, ids=[str(c) for c in STREAM_CASES])
def test_stream_order_matches_yogadl(datarefs: dict[int, CacheDataRef], case: tuple) -> None:
    n, rank, shards, drop, offset, shuffle, skip, seed = case
    stream = datarefs[n].stream(
        start_offset=offset,
        shuffle=shuffle,
        skip_shuffle_at_epoch_end=skip,
        shuffle_seed=seed,
        shard_rank=rank,
        num_shards=shards,
        drop_shard_remainder=drop,
    )
    reference = yogadl_epochs(n, rank, shards, drop, offset, shuffle, skip, seed)
    got = [[int(x) for x in stream] for _ in range(EPOCHS)]
    assert got == reference
    expected_len = len(yogadl.shard_keys(list(range(n)), rank, shards, drop_shard_remainder=drop))
    assert len(stream) == expected_len


@settings(max_examples=40, deadline=None)
@given(
    rank_fraction=st.floats(min_value=0, max_value=0.999),
    num_shards=st.integers(min_value=1, max_value=5),
    drop=st.booleans(),
    offset=st.integers(min_value=0, max_value=30),
    shuffle=st.booleans(),
    skip=st.booleans(),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_stream_order_matches_yogadl_property(
    datarefs: dict[int, CacheDataRef],
    rank_fraction: float,
    num_shards: int,
    drop: bool,
    offset: int,
    shuffle: bool,
    skip: bool,
    seed: int,
) -> None:
    n = 37
    rank = int(rank_fraction * num_shards)
    got = stream_epochs(
        datarefs[n],
        3,
        start_offset=offset,
        shuffle=shuffle,
        skip_shuffle_at_epoch_end=skip,
        shuffle_seed=seed,
        shard_rank=rank,
        num_shards=num_shards,
        drop_shard_remainder=drop,
    )
    assert got == yogadl_epochs(n, rank, num_shards, drop, offset, shuffle, skip, seed, 3)


def test_stream_ranks_partition_the_dataset(datarefs: dict[int, CacheDataRef]) -> None:
    for drop in (False, True):
        seen: list[int] = []
        for rank in range(4):
            stream = datarefs[37].stream(
                shuffle=True, shuffle_seed=4, shard_rank=rank, num_shards=4, drop_shard_remainder=drop
            )
            epoch = [int(x) for x in stream]
            assert len(epoch) == len(stream)
            seen.extend(epoch)
        assert sorted(seen) == list(range(36 if drop else 37))


def test_stream_len_is_the_shard_length(datarefs: dict[int, CacheDataRef]) -> None:
    ref = datarefs[37]
    assert len(ref) == 37
    assert len(ref.stream()) == 37
    assert [len(ref.stream(shard_rank=r, num_shards=4)) for r in range(4)] == [10, 9, 9, 9]
    assert [len(ref.stream(shard_rank=r, num_shards=4, drop_shard_remainder=True)) for r in range(4)] == [
        9
    ] * 4
    # len does not depend on the offset.
    assert len(ref.stream(start_offset=100, shuffle=True, shuffle_seed=1)) == 37


def test_stream_elements_are_the_records(datarefs: dict[int, CacheDataRef]) -> None:
    values = list(datarefs[5].stream())
    assert [int(v) for v in values] == [0, 1, 2, 3, 4]
    assert all(np.asarray(v).dtype == np.int64 for v in values)


def test_stream_over_empty_dataset_and_empty_shards(datarefs: dict[int, CacheDataRef]) -> None:
    empty = datarefs[0]
    assert len(empty) == 0
    for kwargs in (
        {},
        {"start_offset": 5, "shuffle": True, "shuffle_seed": 1},
        {"shard_rank": 2, "num_shards": 3, "drop_shard_remainder": True},
    ):
        stream = empty.stream(**kwargs)
        assert len(stream) == 0
        assert [list(stream) for _ in range(3)] == [[], [], []]
    # 5 records over 7 shards: ranks 5 and 6 are empty; with drop every rank is.
    ref = datarefs[5]
    for rank in range(7):
        stream = ref.stream(start_offset=3, shuffle=True, shuffle_seed=2, shard_rank=rank, num_shards=7)
        expected = 1 if rank < 5 else 0
        assert len(stream) == expected
        epochs = [[int(x) for x in stream] for _ in range(3)]
        if expected == 0:
            assert epochs == [[], [], []]
        else:
            assert epochs[1] == [rank] and epochs[2] == [rank]
        dropped = ref.stream(shard_rank=rank, num_shards=7, drop_shard_remainder=True, start_offset=4)
        assert len(dropped) == 0 and list(dropped) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"shard_rank": 4, "num_shards": 4}, ValueError, "shard_rank"),
        ({"shard_rank": -1, "num_shards": 4}, ValueError, "shard_rank"),
        ({"num_shards": 0}, ValueError, "num_shards"),
        ({"start_offset": -1}, ValueError, "start_offset"),
        ({"shuffle": True}, ValueError, "shuffle_seed"),
        (
            {"shuffle": True, "shuffle_seed": None, "skip_shuffle_at_epoch_end": False},
            ValueError,
            "shuffle_seed",
        ),
        ({"start_offset": 1.5}, TypeError, "start_offset"),
        ({"num_shards": 2.0}, TypeError, "num_shards"),
        ({"shuffle": True, "shuffle_seed": "7"}, TypeError, "shuffle_seed"),
    ],
)
def test_stream_invalid_arguments_raise_with_message(
    datarefs: dict[int, CacheDataRef], kwargs: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        datarefs[37].stream(**kwargs)


def test_stream_seedless_shuffle_with_skip_is_allowed(datarefs: dict[int, CacheDataRef]) -> None:
    stream = datarefs[37].stream(shuffle=True, skip_shuffle_at_epoch_end=True)
    for _ in range(2):
        assert sorted(int(x) for x in stream) == list(range(37))


def test_stream_resume_matches_uninterrupted(datarefs: dict[int, CacheDataRef]) -> None:
    ref = datarefs[37]
    kwargs = {"shuffle": True, "shuffle_seed": 21, "shard_rank": 1, "num_shards": 3}
    full = [x for epoch in stream_epochs(ref, 4, **kwargs) for x in epoch]
    for k in (0, 1, 12, 13, 25, 30):
        resumed = [x for epoch in stream_epochs(ref, 2, start_offset=k, **kwargs) for x in epoch]
        assert resumed == full[k : k + len(resumed)]
