"""Global shuffle: the keyed permutation, the per-rank global schedule, and elastic exact resume.

The invariants are checked with hypothesis against a model written here from the definition
(epoch ``e`` reads ``π_e(0), π_e(1), …``; global position ``p`` goes to rank ``p % S``), not
against the library's own plan arithmetic: every epoch is a permutation of the whole dataset,
ranks are disjoint and cover it (minus the dropped remainder), a rank's records change from
epoch to epoch, and stopping with S ranks then resuming with S' ranks delivers every remaining
record exactly once, followed by the epochs of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yogacache.dataref import CacheDataRef
from yogacache.read.options import ReadOptions
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.schedule import ReadSchedule, ResumeState
from yogacache.store.local import CacheStore

SEEDS = st.integers(min_value=-(2**63), max_value=2**64)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    return KeyedPermutation(n, seed, epoch).map(np.arange(n)).tolist()


def schedule(
    n: int, rank: int, shards: int, seed: Optional[int], drop: bool, state: Optional[dict[str, Any]] = None, **kw: Any
) -> ReadSchedule:
    return ReadSchedule(
        n,
        ReadOptions(
            shard_rank=rank,
            num_shards=shards,
            drop_shard_remainder=drop,
            shuffle=seed is not None,
            reshuffle_each_epoch=seed is not None and not kw.pop("skip", False),
            shuffle_seed=seed,
            shuffle_mode="global",
            resume_state=state,
            **kw,
        ),
    )


def read_epoch_from(s: ReadSchedule, point: tuple[int, int]) -> list[int]:
    plan = s.plan(*point)
    return plan.indices(0, len(plan)).tolist()


def global_state(n: int, seed: Optional[int], epoch: int, consumed: int) -> dict[str, Any]:
    return {"mode": "global", "epoch": epoch, "consumed": consumed, "seed": seed, "num_records": n}


# -- the permutation ----------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=0, max_value=3000), seed=SEEDS, epoch=st.integers(min_value=0, max_value=10**6))
def test_every_epoch_is_a_permutation_of_the_whole_dataset(n: int, seed: int, epoch: int) -> None:
    order = epoch_order(n, seed, epoch)
    assert sorted(order) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(min_value=1, max_value=5000), seed=SEEDS, data=st.data())
def test_any_slice_of_positions_maps_like_the_whole(n: int, seed: int, data: st.DataObject) -> None:
    perm = KeyedPermutation(n, seed, 3)
    whole = perm.map(np.arange(n))
    positions = np.array(data.draw(st.lists(st.integers(min_value=0, max_value=n - 1), max_size=64)), dtype=np.int64)
    np.testing.assert_array_equal(perm.map(positions), whole[positions])
    # Recomputed from scratch (another process would): the same order.
    np.testing.assert_array_equal(KeyedPermutation(n, seed, 3).map(np.arange(n)), whole)


def test_epochs_and_seeds_give_different_orders() -> None:
    n = 1000
    orders = {tuple(epoch_order(n, seed, epoch)) for seed in (0, 1) for epoch in range(5)}
    assert len(orders) == 10
    assert tuple(range(n)) not in orders
    # Not a near-identity either: few records stay in place.
    assert sum(int(i == p) for p, i in enumerate(epoch_order(n, 7, 0))) < 10


def test_small_datasets_are_shuffled_evenly() -> None:
    # Where does each record land, over many epochs? Every place about equally often.
    n, epochs = 7, 7000
    counts = np.zeros((n, n))
    for epoch in range(epochs):
        counts[np.arange(n), KeyedPermutation(n, 5, epoch).map(np.arange(n))] += 1
    expected = epochs / n
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 2 * (n - 1) ** 2 + 30, counts  # (n-1)² degrees of freedom


def test_billion_record_range_without_per_record_memory() -> None:
    n = 1_000_000_000
    tracemalloc.start()
    try:
        perm = KeyedPermutation(n, 11, 2)
        tail = perm.map(np.arange(n - 4096, n))
        s = schedule(n, 5, 8, seed=11, drop=True)
        state = s.state(s.start, 100_000_000)  # 100M records into the epoch on rank 5 of 8
        resumed = schedule(n, 2, 3, seed=11, drop=True, state=state)
        plan = resumed.plan(*resumed.start)
        last_read = plan.indices(len(plan) - 1024, len(plan))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"peak {peak} bytes"
    assert len(set(tail.tolist())) == 4096 and tail.min() >= 0 and tail.max() < n
    assert state["consumed"] == 800_000_000 and len(json.dumps(state)) < 1024
    assert len(plan) == (n - 800_000_000) // 3 and len(set(last_read.tolist())) == 1024
    # The last read of rank 2 is at global positions 8e8 + 2 + 3j.
    positions = 800_000_000 + 2 + 3 * np.arange(len(plan) - 1024, len(plan))
    np.testing.assert_array_equal(last_read, perm_at(n, 11, 0, positions))


def perm_at(n: int, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    return KeyedPermutation(n, seed, epoch).map(positions)


def test_permutation_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="size"):
        KeyedPermutation(-1, 0)
    with pytest.raises(TypeError, match="seed"):
        KeyedPermutation(10, 1.5)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        KeyedPermutation(10, 0).map([10])


# -- one epoch across ranks ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=400),
    shards=st.integers(min_value=1, max_value=9),
    seed=SEEDS,
    epoch=st.integers(min_value=0, max_value=1000),
    drop=st.booleans(),
)
def test_ranks_deal_the_epoch_by_position(n: int, shards: int, seed: int, epoch: int, drop: bool) -> None:
    order = epoch_order(n, seed, epoch)
    end = n - n % shards if drop else n
    reads = [read_epoch_from(schedule(n, r, shards, seed, drop), (epoch, 0)) for r in range(shards)]
    for rank, got in enumerate(reads):
        assert got == order[rank:end:shards]
        assert len(got) == len(schedule(n, rank, shards, seed, drop))
    flat = [i for got in reads for i in got]
    assert len(flat) == len(set(flat)) == end
    if drop:
        assert len({len(got) for got in reads}) <= 1  # every rank reads as many records


def test_a_rank_reads_a_different_subset_every_epoch() -> None:
    n, shards = 1000, 4
    s = schedule(n, 1, shards, seed=3, drop=True)
    subsets = [frozenset(read_epoch_from(s, (epoch, 0))) for epoch in range(4)]
    assert len(set(subsets)) == 4
    # With YogaDL's shard order the subset never changes: that is what global mode is for.
    shard = ReadSchedule(
        n, ReadOptions(shard_rank=1, num_shards=shards, shuffle=True, reshuffle_each_epoch=True, shuffle_seed=3)
    )
    assert len({frozenset(read_epoch_from(shard, (epoch, 0))) for epoch in range(4)}) == 1


def test_unshuffled_global_order_is_the_strided_shard() -> None:
    s = schedule(10, 1, 3, seed=None, drop=True)
    assert read_epoch_from(s, (0, 0)) == [1, 4, 7]
    assert read_epoch_from(s, (5, 0)) == [1, 4, 7]


def test_skip_shuffle_at_epoch_end_keeps_one_global_order() -> None:
    s = schedule(50, 0, 2, seed=9, drop=False, skip=True)
    assert read_epoch_from(s, (0, 0)) == read_epoch_from(s, (3, 0)) == epoch_order(50, 9, 0)[0::2]


# -- elastic exact resume -----------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(
    n=st.integers(min_value=0, max_value=300),
    before=st.integers(min_value=1, max_value=8),
    after=st.integers(min_value=1, max_value=8),
    seed=SEEDS,
    epoch=st.integers(min_value=0, max_value=100),
    drop=st.booleans(),
    data=st.data(),
)
def test_stop_with_s_ranks_resume_with_s_prime(
    n: int, before: int, after: int, seed: int, epoch: int, drop: bool, data: st.DataObject
) -> None:
    start = global_state(n, seed, epoch, 0)
    ranks = [schedule(n, r, before, seed, drop, start) for r in range(before)]
    shortest = min(len(s) for s in ranks)
    k = data.draw(st.integers(min_value=0, max_value=shortest), label="records per rank before stopping")
    read_before = [read_epoch_from(s, s.start)[:k] for s in ranks]
    state = ranks[0].state(ranks[0].start, k)
    assert len(json.dumps(state)) < 1024
    if k < shortest or drop:
        # Ranks in lockstep agree on the state (rank 0's is the one to save).
        assert all(s.state(s.start, k) == state for s in ranks)

    resumed = [schedule(n, r, after, seed, drop, state) for r in range(after)]
    read_after = [read_epoch_from(s, s.start) if s.start[0] == epoch else [] for s in resumed]

    order = epoch_order(n, seed, epoch)
    consumed = k * before
    assert sorted(i for got in read_before for i in got) == sorted(order[:consumed])
    rest = [i for got in read_after for i in got]
    assert len(rest) == len(set(rest))  # nothing twice
    left = n - consumed
    expected_rest = order[consumed : consumed + (left - left % after if drop else left)]
    if all(s.start[0] == epoch for s in resumed) or not expected_rest:
        assert sorted(rest) == sorted(expected_rest)  # every remaining record exactly once
    # The next epochs are those of an uninterrupted run with S' ranks.
    for r, s in enumerate(resumed):
        fresh = schedule(n, r, after, seed, drop)
        for e in (epoch + 1, epoch + 2):
            assert read_epoch_from(s, (e, 0)) == read_epoch_from(fresh, (e, 0))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=200),
    world=st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=5),
    seed=SEEDS,
    data=st.data(),
)
def test_many_elastic_restarts_within_one_epoch_read_it_exactly_once(
    n: int, world: list[int], seed: int, data: st.DataObject
) -> None:
    state = global_state(n, seed, 0, 0)
    seen: list[int] = []
    for shards in world:
        ranks = [schedule(n, r, shards, seed, False, state) for r in range(shards)]
        if ranks[0].start[0] != 0:
            break  # the epoch is over
        shortest = min(len(s) for s in ranks)
        k = data.draw(st.integers(min_value=0, max_value=shortest))
        for s in ranks:
            seen.extend(read_epoch_from(s, s.start)[:k])
        state = ranks[0].state(ranks[0].start, k)
    last = [schedule(n, r, 2, seed, False, state) for r in range(2)]
    for s in last:
        if s.start[0] == 0:
            seen.extend(read_epoch_from(s, s.start))
    assert sorted(seen) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=200),
    shards=st.integers(min_value=1, max_value=6),
    seed=SEEDS,
    drop=st.booleans(),
    consumed_fraction=st.floats(min_value=0, max_value=1),
)
def test_resume_at_any_global_count(n: int, shards: int, seed: int, drop: bool, consumed_fraction: float) -> None:
    consumed = int(consumed_fraction * n)
    ranks = [schedule(n, r, shards, seed, drop, global_state(n, seed, 4, consumed)) for r in range(shards)]
    rest = [i for s in ranks if s.start[0] == 4 for i in read_epoch_from(s, s.start)]
    left = n - consumed
    expected = epoch_order(n, seed, 4)[consumed : consumed + (left - left % shards if drop else left)]
    assert sorted(rest) == sorted(expected) and len(rest) == len(set(rest))
    assert {s.start for s in ranks} == {(4, consumed) if expected else (5, 0)}


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=100),
    shards=st.integers(min_value=1, max_value=5),
    rank_fraction=st.floats(min_value=0, max_value=0.999),
    seed=SEEDS,
    drop=st.booleans(),
    records=st.integers(min_value=0, max_value=400),
)
def test_state_after_any_count_resumes_where_the_uninterrupted_run_is(
    n: int, shards: int, rank_fraction: float, seed: int, drop: bool, records: int
) -> None:
    rank = int(rank_fraction * shards)
    s = schedule(n, rank, shards, seed, drop)
    uninterrupted = [i for e in range(12) for i in read_epoch_from(s, (e, 0))]
    if len(uninterrupted) < records + 10:
        return
    resumed = schedule(n, rank, shards, seed, drop, s.state(s.start, records))
    epoch, position = resumed.start
    after = read_epoch_from(resumed, (epoch, position))
    after += [i for e in range(epoch + 1, epoch + 12) for i in read_epoch_from(resumed, (e, 0))]
    assert after[:10] == uninterrupted[records : records + 10]
    # start_offset (YogaDL's per-rank count) lands at the same point.
    assert schedule(n, rank, shards, seed, drop, start_offset=records).start == resumed.start


def test_resume_state_is_small_and_checked() -> None:
    s = schedule(100, 0, 4, seed=3, drop=True)
    state = s.state(s.start, 7)
    assert state == {
        "version": 1, "mode": "global", "epoch": 0, "consumed": 28, "seed": 3, "num_records": 100,
        "shuffle": True, "reshuffle_each_epoch": True,
    }  # fmt: skip
    assert ResumeState.from_dict(json.loads(json.dumps(state))).to_dict() == state
    with pytest.raises(ValueError, match="seed"):
        schedule(100, 0, 4, seed=4, drop=True, state=state)
    with pytest.raises(ValueError, match="records"):
        schedule(101, 0, 4, seed=3, drop=True, state=state)
    with pytest.raises(ValueError, match="shuffle_mode"):
        ReadSchedule(100, ReadOptions(shuffle=True, shuffle_seed=3, resume_state=state))  # a shard-mode reader
    with pytest.raises(ValueError, match="unknown keys"):
        schedule(100, 0, 4, seed=3, drop=True, state={**state, "extra": 1})
    with pytest.raises(ValueError, match="consumed"):
        schedule(100, 0, 4, seed=3, drop=True, state={**state, "consumed": 101})
    with pytest.raises(ValueError, match="either"):
        schedule(100, 0, 4, seed=3, drop=True, state=state, start_offset=3)
    with pytest.raises(ValueError, match="shuffle_seed"):
        ReadOptions(shuffle=True, reshuffle_each_epoch=True, shuffle_seed=None, shuffle_mode="global")
    with pytest.raises(ValueError, match="shuffle_mode"):
        ReadOptions(shuffle_mode="local")


def test_shard_mode_state_resumes_only_the_same_shard() -> None:
    options = ReadOptions(shard_rank=1, num_shards=4, shuffle=True, reshuffle_each_epoch=True, shuffle_seed=3)
    s = ReadSchedule(100, options)
    state = s.state(s.start, 30)  # 25 per shard: epoch 1, position 5
    assert (state["mode"], state["epoch"], state["consumed"]) == ("shard", 1, 5)
    same = ReadSchedule(100, dataclasses.replace(options, resume_state=state))
    assert same.start == (1, 5)
    with pytest.raises(ValueError, match="global"):
        ReadSchedule(100, dataclasses.replace(options, num_shards=2, resume_state=state))


# -- through DataRef.stream ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> CacheDataRef:
    store = CacheStore(tmp_path_factory.mktemp("global"), show_progress=False)
    store.build("ids", "v1", [{"i": np.int64(i), "x": np.full(2, i, np.float32)} for i in range(103)])
    return CacheDataRef(store.open("ids", "v1"))


def ids(stream: Any) -> list[int]:
    out = []
    for element in stream:
        assert element["x"].tolist() == [element["i"]] * 2
        out.append(int(element["i"]))
    return out


def test_global_stream_epochs_and_elastic_resume(ref: CacheDataRef) -> None:
    args = {"shuffle": True, "shuffle_seed": 5, "shuffle_mode": "global"}
    streams = [ref.stream(shard_rank=r, num_shards=3, **args) for r in range(3)]
    epochs = [[ids(s) for _ in range(2)] for s in streams]
    for e in range(2):
        flat = [i for rank in epochs for i in rank[e]]
        assert sorted(flat) == list(range(103))
        assert [len(rank[e]) for rank in epochs] == [len(s) for s in streams] == [35, 34, 34]
    assert set(epochs[0][0]) != set(epochs[0][1])  # the subset changes with the epoch

    # Stop after 20 records per rank, resume with 2 ranks: the rest once, then epoch 1 as planned.
    state = streams[0].state_dict(20)
    assert state["consumed"] == 60
    done = [i for rank in epochs for i in rank[0][:20]]
    resumed = [ref.stream(shard_rank=r, num_shards=2, resume_state=state, **args) for r in range(2)]
    rest = [ids(s) for s in resumed]
    assert sorted(done + rest[0] + rest[1]) == list(range(103))
    next_epoch = [ids(s) for s in resumed]
    fresh = [ref.stream(shard_rank=r, num_shards=2, start_offset=52 if r == 0 else 51, **args) for r in range(2)]
    assert next_epoch == [ids(s) for s in fresh]


def test_default_stream_is_unchanged_by_global_mode_arguments(ref: CacheDataRef) -> None:
    args = {"shuffle": True, "shuffle_seed": 5, "shard_rank": 1, "num_shards": 3, "start_offset": 40}
    shard = np.arange(1, 103, 3)
    expected = shard[np.random.RandomState(5 + 1).permutation(len(shard))][40 - 34 :].tolist()
    assert ids(ref.stream(**args)) == ids(ref.stream(**args, shuffle_mode="shard")) == expected


def test_stream_state_dict_in_shard_mode_resumes_the_same_shard(ref: CacheDataRef) -> None:
    args = {"shuffle": True, "shuffle_seed": 2, "shard_rank": 0, "num_shards": 2}
    stream = ref.stream(**args)
    full = ids(stream) + ids(stream)
    state = stream.state_dict(60)  # 52 per shard: epoch 1, position 8
    assert (state["epoch"], state["consumed"]) == (1, 8)
    assert ids(ref.stream(resume_state=state, **args)) == full[60:]
