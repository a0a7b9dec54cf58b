"""The "parts" shuffle mode: part order per epoch, a node's share of the parts, a window of few
parts at a time, exact resume at any world size, parts_needed, and the budget warning.

Invariants are checked against the records the plans actually read (hypothesis over part
layouts, splits and resume points), not against the mode's own arithmetic: every epoch reads
every record exactly once across ranks (minus the dropped remainder), a node reads its run of
parts and no more than ``parts_window`` of them at a time, and stopping with one split then
resuming with another reads every remaining record exactly once, then the epochs of an
uninterrupted run with the new split.
"""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yogacache.dataref import CacheDataRef
from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import (
    DEFAULT_PARTS_WINDOW,
    PartLayout,
    PartUse,
    most_at_once,
    random_read_refetch,
    shuffle_budget_warning,
)
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.pipeline import ReadSizes
from yogacache.read.schedule import ReadSchedule, ResumeState
from yogacache.store.local import CacheStore

pytestmark = pytest.mark.filterwarnings("ignore:rank .* reads no records")

SEEDS = st.integers(min_value=0, max_value=2**63)
LAYOUTS = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12).map(PartLayout.from_counts)
# (num_shards, ranks_per_node)
SPLITS = st.sampled_from([(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (2, 2), (4, 2), (6, 3), (6, 2)])


def schedule(
    layout: PartLayout,
    rank: int,
    split: tuple[int, int],
    seed: Optional[int] = 7,
    drop: bool = False,
    window: int = 2,
    state: Optional[dict[str, Any]] = None,
    **kw: Any,
) -> ReadSchedule:
    shards, per_node = split
    return ReadSchedule(
        layout.num_records,
        ReadOptions(
            shard_rank=rank,
            num_shards=shards,
            ranks_per_node=per_node,
            drop_shard_remainder=drop,
            shuffle=seed is not None,
            reshuffle_each_epoch=seed is not None and not kw.pop("skip", False),
            shuffle_seed=seed,
            shuffle_mode="parts",
            parts_window=window,
            resume_state=state,
            **kw,
        ),
        layout,
    )


def ranks(layout: PartLayout, split: tuple[int, int], **kw: Any) -> list[ReadSchedule]:
    return [schedule(layout, r, split, **kw) for r in range(split[0])]


def read_from(s: ReadSchedule, point: tuple[int, int]) -> list[int]:
    plan = s.plan(*point)
    return plan.indices(0, len(plan)).tolist()


def parts_of(layout: PartLayout, records: list[int]) -> list[int]:
    return layout.part_of(np.asarray(records, dtype=np.int64)).tolist()


def uses(layout: PartLayout, records: list[int]) -> dict[int, tuple[int, int]]:
    """Each part read, with the positions of its first and last read."""
    found: dict[int, tuple[int, int]] = {}
    for position, part in enumerate(parts_of(layout, records)):
        found[part] = (found.get(part, (position, 0))[0], position)
    return found


def most_read_at_once(layout: PartLayout, records: list[int]) -> int:
    """The most parts whose first read is behind and last read ahead (or now), at once."""
    spans = uses(layout, records).values()
    return max((sum(a <= t <= b for a, b in spans) for t in range(len(records))), default=0)


# -- one epoch ----------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    layout=LAYOUTS, split=SPLITS, seed=SEEDS, epoch=st.integers(0, 1000), drop=st.booleans(), window=st.integers(1, 4)
)
def test_ranks_read_every_record_once_per_epoch(
    layout: PartLayout, split: tuple[int, int], seed: int, epoch: int, drop: bool, window: int
) -> None:
    n, shards = layout.num_records, split[0]
    schedules = ranks(layout, split, seed=seed, drop=drop, window=window)
    reads = [read_from(s, (epoch, 0)) for s in schedules]
    flat = [i for got in reads for i in got]
    assert len(flat) == len(set(flat)) == (n - n % shards if drop else n)
    assert set(flat) <= set(range(n))
    # YogaDL's counts: rank r reads ⌈(N - r) / S⌉ records, or N // S each when dropping.
    assert [len(got) for got in reads] == [len(s) for s in schedules]
    assert [len(got) for got in reads] == [n // shards if drop else -(-(n - r) // shards) for r in range(shards)]


@settings(max_examples=60, deadline=None)
@given(layout=LAYOUTS, split=SPLITS, seed=SEEDS, window=st.integers(1, 4))
def test_a_node_reads_one_run_of_parts_and_few_at_a_time(
    layout: PartLayout, split: tuple[int, int], seed: int, window: int
) -> None:
    shards, per_node = split
    reads = [read_from(s, (3, 0)) for s in ranks(layout, split, seed=seed, window=window)]
    node_parts = [
        {p for got in reads[node * per_node : (node + 1) * per_node] for p in parts_of(layout, got)}
        for node in range(shards // per_node)
    ]
    # Nodes share only the parts at the ends of their runs.
    nonempty = int(np.count_nonzero(layout.records))
    assert sum(len(parts) for parts in node_parts) <= nonempty + len(node_parts) - 1
    for got in reads:
        assert most_read_at_once(layout, got) <= window


def test_many_parts_mix_window_parts_at_a_time_from_one_part_first() -> None:
    layout = PartLayout.from_counts([200] * 40)
    s = schedule(layout, 0, (1, 1), seed=11, window=4)
    got = read_from(s, (0, 0))
    parts = parts_of(layout, got)
    # The lead: the first stage is half of the first part, so a streamed reader's first batches
    # need that part alone (with equal slices, a quarter of it); the second stage (the rest of
    # the first part cut in three, and a quarter of the second part) mixes two.
    assert len(set(parts[:100])) == 1 and len(set(parts[100:183])) == 2
    assert most_read_at_once(layout, got) == 4
    # Past the first stages a batch mixes the four parts of its stage (five across two stages).
    assert {len(set(parts[b : b + 64])) for b in range(1000, 7000, 64)} == {4, 5}
    # The part order is a permutation, and another one in the next epoch.
    first_use = list(dict.fromkeys(parts))
    assert sorted(first_use) == list(range(40)) and first_use != list(range(40))
    assert first_use != list(dict.fromkeys(parts_of(layout, read_from(s, (1, 0)))))


def test_node_split_keeps_a_node_to_its_share_of_the_parts() -> None:
    layout = PartLayout.from_counts([100] * 32, [1000] * 32)
    for epoch in range(3):
        reads = [read_from(s, (epoch, 0)) for s in ranks(layout, (8, 4), seed=5)]
        node_parts = [{p for got in reads[n * 4 : (n + 1) * 4] for p in parts_of(layout, got)} for n in range(2)]
        assert [len(parts) for parts in node_parts] == [16, 16] and not node_parts[0] & node_parts[1]
    # Ranks of one node read the same parts at the same time (they deal its run out).
    node = [read_from(s, (0, 0)) for s in ranks(layout, (8, 4), seed=5)[:4]]
    assert {parts_of(layout, got[:10])[0] for got in node} == {parts_of(layout, node[0][:1])[0]}


def test_epochs_reshuffle_and_skip_keeps_one_order() -> None:
    layout = PartLayout.from_counts([30, 20, 25, 40, 10, 33, 21, 17, 29, 35, 12, 26])
    s = schedule(layout, 1, (2, 1), seed=3)
    assert len({frozenset(read_from(s, (e, 0))) for e in range(4)}) == 4  # a rank's records change
    skip = schedule(layout, 1, (2, 1), seed=3, skip=True)
    assert read_from(skip, (0, 0)) == read_from(skip, (5, 0))
    again = schedule(layout, 1, (2, 1), seed=3)
    assert read_from(again, (2, 0)) == read_from(s, (2, 0))  # computed alike in every process
    assert read_from(schedule(layout, 1, (2, 1), seed=4), (2, 0)) != read_from(s, (2, 0))


def test_unshuffled_parts_mode_reads_contiguous_runs_in_dataset_order() -> None:
    layout = PartLayout.from_counts([10, 7, 13])
    assert [read_from(s, (4, 0)) for s in ranks(layout, (3, 1), seed=None)] == [
        list(range(0, 10)),
        list(range(10, 20)),
        list(range(20, 30)),
    ]
    # Two ranks on a node deal the node's run out between them.
    assert [read_from(s, (0, 0)) for s in ranks(layout, (2, 2), seed=None)] == [
        list(range(0, 30, 2)),
        list(range(1, 30, 2)),
    ]


# -- elastic exact resume -----------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    layout=LAYOUTS,
    before=SPLITS,
    after=SPLITS,
    seed=SEEDS,
    epoch=st.integers(0, 100),
    drop=st.booleans(),
    window=st.integers(1, 3),
    data=st.data(),
)
def test_stop_with_one_split_resume_with_another(
    layout: PartLayout,
    before: tuple[int, int],
    after: tuple[int, int],
    seed: int,
    epoch: int,
    drop: bool,
    window: int,
    data: st.DataObject,
) -> None:
    n = layout.num_records
    args = {"seed": seed, "drop": drop, "window": window}
    old = ranks(layout, before, **args)
    shortest = min(len(s) for s in old)
    k = data.draw(st.integers(min_value=0, max_value=shortest), label="records per rank before stopping")
    read_before = [read_from(s, (epoch, 0))[:k] for s in old]
    state = old[0].state((epoch, 0), k)
    assert len(json.dumps(state)) < 1024
    if k < shortest or drop:
        assert all(s.state((epoch, 0), k) == state for s in old)  # ranks in lockstep agree

    new = ranks(layout, after, state=state, **args)
    read_after = [read_from(s, s.start) if s.start[0] == epoch else [] for s in new]
    done = [i for got in read_before for i in got]
    rest = [i for got in read_after for i in got]
    assert len(rest) == len(set(rest)) and not set(rest) & set(done)  # nothing twice
    left = n - k * before[0]
    if new[0].start[0] != epoch:
        # Rank 0 read its whole epoch (the state is the next one's), or dropping leaves nothing.
        assert not rest and (k == len(old[0]) or drop and left < after[0])
    elif not drop:
        assert sorted(done + rest) == list(range(n))  # every remaining record exactly once
    elif before == after:
        assert len(rest) == sum(len(s) - k for s in old)
    else:
        assert len(rest) == left - left % after[0]
        assert len({len(got) for got in read_after}) <= 1  # dropping keeps the ranks even
    # The next epochs are those of an uninterrupted run with the new split.
    for r, s in enumerate(new):
        fresh = schedule(layout, r, after, **args)
        for e in (epoch + 1, epoch + 2):
            assert read_from(s, (e, 0)) == read_from(fresh, (e, 0))


@settings(max_examples=50, deadline=None)
@given(layout=LAYOUTS, world=st.lists(SPLITS, min_size=2, max_size=5), seed=SEEDS, data=st.data())
def test_many_elastic_restarts_within_one_epoch_read_it_exactly_once(
    layout: PartLayout, world: list[tuple[int, int]], seed: int, data: st.DataObject
) -> None:
    state = schedule(layout, 0, world[0], seed=seed).state((0, 0))
    seen: list[int] = []
    for split in world:
        group = ranks(layout, split, seed=seed, state=state)
        if group[0].start[0] != 0:
            break  # the epoch is over
        shortest = min(len(s.plan(*s.start)) for s in group)
        k = data.draw(st.integers(min_value=0, max_value=shortest))
        for s in group:
            seen.extend(read_from(s, s.start)[:k])
        state = group[0].state(group[0].start, k)
        assert ResumeState.from_dict(json.loads(json.dumps(state))).to_dict() == state
    for s in ranks(layout, (2, 1), seed=seed, state=state):
        if s.start[0] == 0:
            seen.extend(read_from(s, s.start))
    assert sorted(seen) == list(range(layout.num_records))


@settings(max_examples=40, deadline=None)
@given(
    layout=LAYOUTS,
    split=SPLITS,
    rank_fraction=st.floats(min_value=0, max_value=0.999),
    seed=SEEDS,
    drop=st.booleans(),
    records=st.integers(min_value=0, max_value=300),
)
def test_state_after_any_count_resumes_where_the_uninterrupted_run_is(
    layout: PartLayout, split: tuple[int, int], rank_fraction: float, seed: int, drop: bool, records: int
) -> None:
    rank = int(rank_fraction * split[0])
    s = schedule(layout, rank, split, seed=seed, drop=drop)
    uninterrupted = [i for e in range(12) for i in read_from(s, (e, 0))]
    if len(uninterrupted) < records + 10:
        return
    resumed = schedule(layout, rank, split, seed=seed, drop=drop, state=s.state(s.start, records))
    epoch, position = resumed.start
    after = read_from(resumed, (epoch, position))
    after += [i for e in range(epoch + 1, epoch + 12) for i in read_from(resumed, (e, 0))]
    assert after[:10] == uninterrupted[records : records + 10]
    # start_offset (YogaDL's per-rank count) lands at the same point.
    assert schedule(layout, rank, split, seed=seed, drop=drop, start_offset=records).start == resumed.start


def test_resume_state_is_small_and_checked() -> None:
    layout = PartLayout.from_counts([40, 30, 30])
    s = schedule(layout, 0, (4, 2), seed=3, drop=True)
    state = s.state(s.start, 7)
    assert state == {
        "version": 1,
        "mode": "parts",
        "epoch": 0,
        "consumed": 7,
        "seed": 3,
        "num_records": 100,
        "num_shards": 4,
        "ranks_per_node": 2,
        "window": 2,
        "dealt": 0,
        "parts_order": 2,
        "shuffle": True,
        "reshuffle_each_epoch": True,
        "parts_window": 2,
    }
    assert ResumeState.from_dict(json.loads(json.dumps(state))).to_dict() == state
    resized = schedule(layout, 0, (3, 1), seed=3, drop=True, state=state)
    moved = resized.state(resized.start, 5)
    assert {k: moved[k] for k in ("consumed", "num_shards", "ranks_per_node", "dealt")} == {
        "consumed": 7,
        "num_shards": 4,
        "ranks_per_node": 2,
        "dealt": 15,  # three ranks read five records each of the rest
    }
    with pytest.raises(ValueError, match="saved with parts_window=2, this reader has parts_window=3"):
        schedule(layout, 0, (4, 2), seed=3, drop=True, state=state, window=3)
    with pytest.raises(ValueError, match="seed"):
        schedule(layout, 0, (4, 2), seed=4, drop=True, state=state)
    with pytest.raises(ValueError, match="lacks"):
        schedule(layout, 0, (4, 2), seed=3, state={k: v for k, v in state.items() if k != "dealt"})
    with pytest.raises(ValueError, match=r"consumed=26 is out of range: this reader takes 0 to 25"):
        schedule(layout, 0, (4, 2), seed=3, state={**state, "consumed": 26})
    with pytest.raises(ValueError, match="dealt=99 is out of range: this reader takes 0 to 72"):
        schedule(layout, 0, (3, 1), seed=3, state={**state, "dealt": 99})
    with pytest.raises(ValueError, match="not valid"):
        schedule(layout, 0, (4, 2), seed=3, state={**state, "num_shards": 3})
    with pytest.raises(ValueError, match="shuffle_mode='parts'"):
        ReadSchedule(100, ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode="global", resume_state=state))
    # States of the other modes keep their format.
    glob = ReadSchedule(100, ReadOptions(shuffle=True, shuffle_seed=3, num_shards=4, shuffle_mode="global"))
    assert glob.state(glob.start, 7) == {
        "version": 1, "mode": "global", "epoch": 0, "consumed": 28, "seed": 3, "num_records": 100,
        "shuffle": True, "reshuffle_each_epoch": False,
    }


def test_a_state_from_before_the_lead_resumes_in_its_own_order() -> None:
    """A state without ``parts_order`` (written before the lead) resumes the rest of its epoch in
    the order it was taken in; the epochs after are this release's."""
    layout = PartLayout.from_counts([60] * 8)
    s = schedule(layout, 0, (2, 1), seed=5, window=4)
    old_state = {key: value for key, value in s.state(s.start, 0).items() if key != "parts_order"}
    # The whole of epoch 0 as the release before read it (a state at its start, order 1).
    before = schedule(layout, 0, (2, 1), seed=5, window=4, state=old_state)
    epoch_zero = read_from(before, before.start)
    assert epoch_zero != read_from(s, (0, 0))  # the lead changed the order
    assert sorted(epoch_zero) == sorted(read_from(s, (0, 0)))  # of the same records
    resumed = schedule(layout, 0, (2, 1), seed=5, window=4, state={**old_state, "consumed": 70})
    assert resumed.start == (0, 70)
    assert read_from(resumed, resumed.start) == epoch_zero[70:]
    assert resumed.state(resumed.start, 10)["parts_order"] == 1
    assert read_from(resumed, (1, 0)) == read_from(s, (1, 0))
    assert resumed.state((1, 0), 0)["parts_order"] == 2
    with pytest.raises(ValueError, match="parts_order=3 is out of range"):
        schedule(layout, 0, (2, 1), seed=5, window=4, state={**old_state, "parts_order": 3})



@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"parts_window": 0}, r"parts_window must be at least 1 \(parts mixed at a time\), got 0"),
        ({"ranks_per_node": 0}, "ranks_per_node must be at least 1, got 0"),
        ({"num_shards": 3, "ranks_per_node": 2}, r"num_shards \(3\) must be a multiple of ranks_per_node \(2\)"),
        ({"shuffle": True, "reshuffle_each_epoch": True}, "shuffle_mode='parts' with shuffle=True needs shuffle_seed"),
        ({"shuffle_mode": "part"}, r"shuffle_mode must be one of \('shard', 'global', 'parts'\), got 'part'"),
        ({"parts_window": 2.5}, "parts_window must be an integer"),
    ],
)
def test_bad_options_are_refused_with_a_message(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        ReadOptions(**{"shuffle_mode": "parts", **kwargs})


def test_window_and_node_size_travel_in_the_options() -> None:
    options = ReadOptions.from_stream_args(
        shuffle=True, shuffle_seed=1, num_shards=4, shuffle_mode="parts", parts_window=np.int64(3), ranks_per_node=2
    )
    assert (options.parts_window, options.ranks_per_node) == (3, 2) and type(options.parts_window) is int
    layout = PartLayout.from_counts([50] * 8)
    s = ReadSchedule(layout.num_records, options, layout)
    assert s.state(s.start)["window"] == 3 and s.state(s.start)["ranks_per_node"] == 2
    # The other modes ignore them.
    glob = ReadOptions(shuffle=True, shuffle_seed=1, num_shards=4, shuffle_mode="global")
    wide = dataclasses.replace(glob, parts_window=9, ranks_per_node=2)
    assert read_from(ReadSchedule(400, glob), (0, 0)) == read_from(ReadSchedule(400, wide), (0, 0))


def test_the_mode_needs_the_part_layout() -> None:
    with pytest.raises(ValueError, match="needs their layout: pass layout=PartLayout.from_manifest"):
        ReadSchedule(10, ReadOptions(shuffle_mode="parts"))
    with pytest.raises(ValueError, match="the part layout holds 9 records, the dataset 10"):
        ReadSchedule(10, ReadOptions(shuffle_mode="parts"), PartLayout.from_counts([4, 5]))
    assert ReadOptions().parts_window == DEFAULT_PARTS_WINDOW == 4


# -- the cost of an epoch's set-up --------------------------------------------------------------


def test_epoch_setup_for_100k_parts_is_linear_in_parts_not_records(monkeypatch: pytest.MonkeyPatch) -> None:
    parts, per_part = 100_000, 10_000  # 10^9 records: an index array would take 8 GB
    layout = PartLayout.from_counts(np.full(parts, per_part), np.full(parts, 1 << 20))
    mapped: list[int] = []
    encrypt = KeyedPermutation._encrypt

    def counting(self: KeyedPermutation, values: np.ndarray) -> np.ndarray:
        mapped.append(len(values))
        return encrypt(self, values)

    monkeypatch.setattr(KeyedPermutation, "_encrypt", counting)
    tracemalloc.start()
    try:
        s = schedule(layout, 3, (8, 1), seed=1, window=4)
        for epoch in (0, 1):
            plan = s.plan(epoch, 0)
            assert len(plan) == parts * per_part // 8
            first = plan.indices(0, 1000)
            needed = s.order.parts_needed(epoch, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20  # a few arrays of one int64 per part
    # Work: the part permutation (per part, with a little cycle walking) and the records read.
    assert sum(mapped) < 2 * (2 * parts + 2 * 1000)
    assert len(set(first.tolist())) == 1000
    assert len(needed) in (parts // 8, parts // 8 + 1)
    assert needed[0].first == 0 and needed[-1].last == len(plan) - 1


# -- parts_needed -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(layout=LAYOUTS, split=SPLITS, seed=SEEDS, window=st.integers(1, 4), data=st.data())
def test_parts_needed_covers_what_the_plan_reads(
    layout: PartLayout, split: tuple[int, int], seed: int, window: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, split[0] - 1))
    s = schedule(layout, rank, split, seed=seed, window=window)
    full = len(s)
    position = data.draw(st.integers(0, full))
    points = [(2, position)]
    # And a point of an epoch resumed with another split (its rest dealt out anew).
    other = schedule(layout, 0, (split[0] + 1, 1), seed=seed, window=window)
    resumed = schedule(layout, rank, split, seed=seed, window=window, state=other.state((2, 0), min(1, len(other))))
    points.append(resumed.start)
    for mode, point in ((s.order, points[0]), (resumed.order, points[1])):
        records = read_from(s if mode is s.order else resumed, point)
        actual = uses(layout, records)
        needed = mode.parts_needed(*point)
        assert all(isinstance(use, PartUse) for use in needed)
        assert [u.first for u in needed] == sorted(u.first for u in needed)
        reported = {u.part: (u.first, u.last) for u in needed}
        assert set(actual) <= set(reported)
        for part, (first, last) in actual.items():
            assert reported[part][0] <= first and reported[part][1] >= last


def test_parts_needed_is_exact_for_large_parts_and_every_mode() -> None:
    layout = PartLayout.from_counts([150] * 12)
    s = schedule(layout, 1, (2, 1), seed=9, window=3)
    records = read_from(s, (1, 0))
    actual = uses(layout, records)
    needed = s.parts_needed(1)
    assert needed == s.order.parts_needed(1, 0)
    assert [u.part for u in needed] == list(actual)  # the order of first use
    assert len(needed) == 6
    # From a later point only what is left, and only parts the rest reads.
    later = s.order.parts_needed(1, 400)
    assert {u.part for u in later} == set(uses(layout, records[400:]))
    # Parts of the stage under way count as needed at once; the others in order of first use.
    coming = [u.part for u in later if u.first > 0]
    assert coming == [p for p in uses(layout, records[400:]) if p in coming]
    # Shard and global modes: the parts touched, in order of first use, found by reading the plan.
    for mode in ("shard", "global"):
        options = ReadOptions(shuffle=True, shuffle_seed=2, shard_rank=1, num_shards=3, shuffle_mode=mode)
        other = ReadSchedule(layout.num_records, options, layout)
        records = read_from(other, (0, 5))
        assert [tuple(u) for u in other.order.parts_needed(0, 5)] == [
            (part, first, last) for part, (first, last) in uses(layout, records).items()
        ]
    with pytest.raises(ValueError, match="needs the cache's part layout"):
        ReadSchedule(10, ReadOptions()).order.parts_needed(0)


def test_most_at_once_is_what_a_reader_must_hold() -> None:
    layout = PartLayout.from_counts([150] * 12, [1000 + i for i in range(12)])
    s = schedule(layout, 0, (1, 1), seed=9, window=3)
    assert most_at_once(s.parts_needed(0), layout)[0] == 3 == most_read_at_once(layout, read_from(s, (0, 0)))
    held = most_at_once(s.parts_needed(0), layout)[1]
    assert 3 * 1000 < held <= 1009 + 1010 + 1011
    glob = ReadSchedule(layout.num_records, ReadOptions(shuffle=True, shuffle_seed=1, shuffle_mode="global"), layout)
    assert most_at_once(glob.parts_needed(0), layout) == (12, layout.num_bytes)
    assert most_at_once([], layout) == (0, 0)


# -- the budget warning of random-read modes ----------------------------------------------------


def simulate_random_eviction(layout: PartLayout, reads: list[np.ndarray], budget: int, seed: int) -> int:
    """Bytes fetched reading ``reads`` with at most ``budget`` bytes of parts kept, evicting a
    random resident part, one the current read does not need if there is one."""
    rng = np.random.default_rng(seed)
    resident: list[int] = []
    fetched = 0
    for indices in reads:
        needed = set(np.unique(layout.part_of(indices)).tolist())
        for part in rng.permutation(sorted(needed)).tolist():
            if part in resident:
                continue
            fetched += int(layout.sizes[part])
            while resident and sum(int(layout.sizes[p]) for p in resident) + int(layout.sizes[part]) > budget:
                idle = [i for i, p in enumerate(resident) if p not in needed] or list(range(len(resident)))
                resident.pop(idle[int(rng.integers(len(idle)))])
            resident.append(part)
    return fetched


def test_refetch_estimate_matches_a_simulated_node() -> None:
    layout = PartLayout.from_counts([200] * 50, [1000] * 50)
    sizes = ReadSizes(full=64, first=64)
    options = ReadOptions(shuffle=True, shuffle_seed=4, shuffle_mode="global")
    s = ReadSchedule(layout.num_records, options, layout)
    plan = s.plan(0)
    reads = [plan.indices(b, b + 64) for b in range(0, len(plan), 64)]
    for budget in (12_000, 25_000, 40_000):
        simulated = simulate_random_eviction(layout, reads, budget, seed=1)
        estimate = random_read_refetch(layout, budget, layout.num_records, sizes.full)
        assert estimate.cache_bytes == 50_000 and estimate.budget_bytes == budget
        assert 0.75 * simulated < estimate.fetched_bytes < 1.25 * simulated
        assert estimate.fetched_bytes > 10 * layout.num_bytes  # what the warning is about
    # A cache within the budget is fetched once.
    assert random_read_refetch(layout, 50_000, layout.num_records, 64).fetched_bytes == 50_000
    assert random_read_refetch(layout, 0, 0, 64).fetched_bytes == 0


def test_budget_warning_names_the_volume_and_the_remedy() -> None:
    layout = PartLayout.from_counts([1000] * 100, [1 << 30] * 100)
    text = shuffle_budget_warning("global", layout, 25 << 30, 100_000, 1024)
    assert text is not None
    cost = random_read_refetch(layout, 25 << 30, 100_000, 1024)
    assert f"fetches about {cost.fetched_bytes / (1 << 40):.1f} TiB per epoch" in text
    assert "shuffle_mode='global'" in text and "budget of 25.0 GiB for a cache of 100.0 GiB" in text
    assert "shuffle_mode='parts'" in text
    assert shuffle_budget_warning("parts", layout, 25 << 30, 100_000, 1024) is None
    assert shuffle_budget_warning("shard", layout, 100 << 30, 100_000, 1024) is None


# -- through the adapters -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ref(tmp_path_factory: pytest.TempPathFactory) -> CacheDataRef:
    store = CacheStore(Path(tmp_path_factory.mktemp("parts")), show_progress=False, part_size_bytes=1500)
    store.build("ids", "v1", [{"i": np.int64(i), "x": np.full(8, i, np.int64)} for i in range(301)])
    return CacheDataRef(store.open("ids", "v1"))


def ids(stream: Any) -> list[int]:
    out = []
    for element in stream:
        assert element["x"].tolist() == [int(element["i"])] * 8
        out.append(int(element["i"]))
    return out


def test_parts_stream_epochs_and_elastic_resume(ref: CacheDataRef) -> None:
    layout = PartLayout.from_manifest(ref.reader.manifest)
    assert layout.num_parts >= 8
    args = {"shuffle": True, "shuffle_seed": 5, "shuffle_mode": "parts"}
    streams = [ref.stream(shard_rank=r, num_shards=2, **args) for r in range(2)]
    epochs = [[ids(s) for _ in range(2)] for s in streams]
    for e in range(2):
        assert sorted(epochs[0][e] + epochs[1][e]) == list(range(301))
    # Each rank reads its share of the parts, plus the one at the end of its run.
    touched = [set(parts_of(layout, epochs[r][0])) for r in range(2)]
    assert len(touched[0]) + len(touched[1]) <= layout.num_parts + 1

    state = streams[0].state_dict(40)
    assert (state["mode"], state["consumed"], state["num_shards"]) == ("parts", 40, 2)
    done = epochs[0][0][:40] + epochs[1][0][:40]
    resumed = [ref.stream(shard_rank=r, num_shards=3, resume_state=state, **args) for r in range(3)]
    rest = [ids(s) for s in resumed]
    assert sorted(done + [i for got in rest for i in got]) == list(range(301))
    fresh = [ref.stream(shard_rank=r, num_shards=3, **args) for r in range(3)]
    for s, f in zip(resumed, fresh):
        ids(f)  # epoch 0
        assert ids(s) == ids(f)  # epoch 1, as planned for three ranks


def test_parts_mode_reaches_torch_tf_and_the_datalayer(ref: CacheDataRef, tmp_path: Path) -> None:
    import tensorflow as tf

    from yogacache import DataLayer
    from yogacache.tensorflow import make_tf_dataset
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    args = {"shuffle": True, "shuffle_seed": 8, "shard_rank": 1, "num_shards": 2, "shuffle_mode": "parts"}
    expected = ids(ref.stream(**args))
    dataset = CacheIterableDataset(ref, output="numpy", **args)
    assert [int(e["i"]) for e in dataset] == expected
    loader = CacheDataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork")
    assert [int(i) for batch in loader for i in batch["i"]] == expected
    assert dataset.state_dict(3)["mode"] == "parts"
    tuned = {**args, "num_shards": 4, "shard_rank": 3, "parts_window": 1, "ranks_per_node": 2}
    expected_tuned = ids(ref.stream(**tuned))
    assert expected_tuned != ids(ref.stream(**{**tuned, "parts_window": 3, "ranks_per_node": 1}))
    tuned_dataset = CacheIterableDataset(ref, output="numpy", **tuned)
    assert [int(e["i"]) for e in tuned_dataset] == expected_tuned
    assert tuned_dataset.state_dict(3)["ranks_per_node"] == 2
    tf_ids = [int(e["i"]) for e in make_tf_dataset(ref.stream(**args)).as_numpy_iterator()]
    assert tf_ids == expected

    config = {"type": "shared_fs", "host_storage_path": str(tmp_path)}
    layer = DataLayer.from_config(config, rank=0, num_shards=1, seed=3)

    @layer.cache_train_dataset("ids", "v1", shuffle=True, shuffle_mode="parts", returns="stream")
    def make() -> tf.data.Dataset:
        return tf.data.Dataset.range(50).map(lambda i: {"i": i})

    stream = make()
    assert sorted(int(e["i"]) for e in stream) == list(range(50))
    assert stream.state_dict(10)["mode"] == "parts"
