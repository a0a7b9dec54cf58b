"""Property tests of the mixture's pure numpy core (``yogacache.read.mixture``), no cache on disk.

Hypothesis varies the components (sizes, part layouts), their shares (weights and an epoch size,
absolute repeat/samples counts, the stopping rules), each component's own order (``"shard"``,
``"global"``, ``"parts"``, shuffled or not, reshuffled or not), world sizes and resume points,
and checks what ``mixture_counts`` and ``MixtureSchedule`` promise: each epoch's counts, no
record twice within a component's pass, one order whoever computes it and at any world size,
windows that mix every component, and exact elastic resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from yogacache.read.layout import PartLayout
from yogacache.read.mixture import MixtureSchedule, Share, apportion, mixture_counts
from yogacache.read.options import ReadOptions

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = ("shard", "global", "parts")


@dataclass(frozen=True)
class Case:
    """A mixture: its components' sizes and part layouts, shares, and how it is read."""

    sizes: tuple[int, ...]
    parts: tuple[tuple[int, ...], ...]  # records of each part, per component
    shares: tuple[Share, ...]
    epoch_size: Optional[int]
    stopping: Optional[str]
    mode: str
    shuffle: bool
    reshuffle: bool
    seed: int

    @property
    def counts(self) -> tuple[int, ...]:
        return mixture_counts(self.sizes, self.shares, self.epoch_size, self.stopping)

    @property
    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)

    def component_of(self, records: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets, records, side="right") - 1

    def options(self, **more: Any) -> ReadOptions:
        return ReadOptions(
            shuffle=self.shuffle,
            reshuffle_each_epoch=self.reshuffle,
            shuffle_seed=self.seed,
            shuffle_mode=self.mode,
            **more,
        )

    def schedule(self, **more: Any) -> MixtureSchedule:
        return MixtureSchedule(
            [f"c{i}:v1" for i in range(len(self.sizes))],
            self.sizes,
            self.counts,
            [PartLayout.from_counts(parts) for parts in self.parts],
            self.options(**more),
        )


def split(draw: Any, size: int) -> tuple[int, ...]:
    """``size`` records cut into 1-4 parts."""
    cuts = sorted(draw(st.sets(st.integers(1, max(1, size - 1)), max_size=min(3, size - 1))))
    edges = [0, *cuts, size]
    return tuple(b - a for a, b in zip(edges, edges[1:]) if b > a)


@st.composite
def cases(draw: Any, kinds: Sequence[str] = ("weights", "absolute", "stopping")) -> Case:
    k = draw(st.integers(1, 4))
    sizes = tuple(draw(st.lists(st.integers(1, 40), min_size=k, max_size=k)))
    parts = tuple(split(draw, size) for size in sizes)
    kind = draw(st.sampled_from(kinds))
    epoch_size, stopping = None, None
    if kind == "weights":
        weights = draw(
            st.lists(st.floats(0, 10, allow_nan=False), min_size=k, max_size=k).filter(lambda w: sum(w) > 0.01)
        )
        shares = tuple(Share(weight=w) for w in weights)
        epoch_size = draw(st.one_of(st.none(), st.integers(1, 300)))
    elif kind == "absolute":
        one = st.one_of(
            st.builds(lambda r: Share(repeat=r), st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.3, 2.0, 3.0])),
            st.builds(lambda s: Share(samples=s), st.integers(0, 80)),
            st.just(Share()),
        )
        shares = tuple(draw(st.lists(one, min_size=k, max_size=k)))
    else:
        shares = tuple(Share(weight=w) for w in draw(st.lists(st.integers(1, 8), min_size=k, max_size=k)))
        stopping = draw(st.sampled_from(["first_exhausted", "all_exhausted"]))
    shuffle = draw(st.booleans())
    try:
        mixture_counts(sizes, shares, epoch_size, stopping)
    except ValueError as error:  # every absolute share rounds to 0 records
        assert "takes 0 records per epoch" in str(error)
        assume(False)
    return Case(
        sizes,
        parts,
        shares,
        epoch_size,
        stopping,
        mode=draw(st.sampled_from(MODES)),
        shuffle=shuffle,
        reshuffle=shuffle and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def whole_epoch(schedule: MixtureSchedule, epoch: int) -> np.ndarray:
    plan = schedule.plan(epoch, 0)
    return plan.indices(0, len(plan))


def dealt(shards: Sequence[np.ndarray]) -> list[int]:
    """The order ranks' plans come from: rank r holds positions r, r+S, ..."""
    out: list[int] = []
    for j in range(max(map(len, shards), default=0)):
        out.extend(int(shard[j]) for shard in shards if j < len(shard))
    return out


# -- counts -----------------------------------------------------------------------------------------


@SETTINGS
@given(cases())
def test_counts_are_the_shares_of_the_epoch(case: Case) -> None:
    counts = np.array(case.counts)
    sizes = np.array(case.sizes)
    total = int(counts.sum())
    assert total >= 1 and (counts >= 0).all()
    if any(share.absolute for share in case.shares):
        for count, size, share in zip(counts, sizes, case.shares):
            expected = (
                share.samples
                if share.samples is not None
                else math.floor((1.0 if share.repeat is None else share.repeat) * size + 0.5)
            )
            assert count == expected
        return
    # No weights at all: each component weighs its records (the natural proportions).
    weights = np.array([float(n) if s.weight is None else s.weight for s, n in zip(case.shares, sizes)])
    p = weights / weights.sum()
    quotas = p * total
    assert (np.abs(counts - quotas) < 1).all()  # each within one record of its quota
    # Largest remainders: a component rounded up has no smaller remainder than one rounded down
    # (up to float rounding: exact ties are test_proportional_weights_give_the_same_counts's).
    remainders = quotas - np.floor(quotas + 1e-9)
    up, down = counts > np.floor(quotas + 1e-9), counts <= np.floor(quotas + 1e-9)
    if up.any() and down.any():
        assert remainders[up].min() >= remainders[down].max() - 1e-9
    positive = p > 0
    if case.stopping is None:
        assert total == (case.epoch_size if case.epoch_size is not None else int(sizes.sum()))
    elif case.stopping == "first_exhausted":
        assert (counts <= sizes).all()  # no component past one pass
        assert ((counts >= sizes - 1) & positive).any()  # ... and one (nearly) through: the epoch ends
    else:
        assert (counts[positive] >= sizes[positive]).all()  # every component through at least once
        assert ((counts <= sizes + 1) & positive).any()  # ... and one (nearly) just through


@SETTINGS
@given(cases())
def test_every_epoch_takes_exactly_its_counts(case: Case) -> None:
    schedule = case.schedule()
    assert len(schedule) == schedule.num_records == sum(case.counts)
    for epoch in range(3):
        records = whole_epoch(schedule, epoch)
        assert len(records) == sum(case.counts)
        assert ((records >= 0) & (records < sum(case.sizes))).all()
        assert np.bincount(case.component_of(records), minlength=len(case.sizes)).tolist() == list(case.counts)


@SETTINGS
@given(cases())
def test_no_record_twice_within_a_components_pass(case: Case) -> None:
    """Each component's records, read over the epochs, come in whole passes: every record once
    per pass (upsampled: passes repeat; downsampled: all records before any again)."""
    schedule = case.schedule()
    counts = case.counts
    epochs = min(8, max(2, max(math.ceil(2 * n / c) for n, c in zip(case.sizes, counts) if c)))
    read = [whole_epoch(schedule, epoch) for epoch in range(epochs)]
    for i, size in enumerate(case.sizes):
        drawn = np.concatenate([records[case.component_of(records) == i] for records in read]) - case.offsets[i]
        assert len(drawn) == epochs * counts[i]
        for start in range(0, len(drawn), size):
            one_pass = drawn[start : start + size]
            assert len(np.unique(one_pass)) == len(one_pass)
            if len(one_pass) == size:
                assert sorted(one_pass.tolist()) == list(range(size))
        if not case.reshuffle and not case.shuffle and counts[i] == size:
            assert all((r[case.component_of(r) == i] == read[0][case.component_of(read[0]) == i]).all() for r in read)


@SETTINGS
@given(cases(), st.integers(1, 5), st.booleans())
def test_one_order_for_every_schedule_and_world_size(case: Case, shards: int, drop: bool) -> None:
    """Two schedules made alike plan alike (no state outside the arguments), and the ranks of
    any world size deal out the one mixed order."""
    one, again = case.schedule(), case.schedule()
    for epoch in range(2):
        order = whole_epoch(one, epoch)
        assert (whole_epoch(again, epoch) == order).all()
        plans = [
            case.schedule(shard_rank=rank, num_shards=shards, drop_shard_remainder=drop).plan(epoch, 0)
            for rank in range(shards)
        ]
        indices = [plan.indices(0, len(plan)) for plan in plans]
        twins = [
            case.schedule(shard_rank=rank, num_shards=shards, drop_shard_remainder=drop).plan(epoch, 0)
            for rank in range(shards)
        ]
        assert all((twin.indices(0, len(twin)) == mine).all() for twin, mine in zip(twins, indices))
        kept = len(order) - len(order) % shards if drop else len(order)
        assert dealt(indices) == order[:kept].tolist()
        if drop:
            assert len({len(each) for each in indices}) == 1
        positions = np.arange(len(plans[-1]))[::-1]  # take() at any positions agrees with indices()
        assert (plans[-1].take(positions) == indices[-1][positions]).all()


@SETTINGS
@given(cases(), st.integers(1, 6))
def test_every_window_mixes_every_component(case: Case, shards: int) -> None:
    """Each component's records in any window of L records are its share of L, give or take
    2 per other component (shuffled; 1 in dataset order): never one component at a time."""
    schedule = case.schedule()
    order = whole_epoch(schedule, 0)
    total, k = len(order), len(case.sizes)
    share = np.array(case.counts) / total
    onehot = np.eye(k)[case.component_of(order)]
    cumulative = np.concatenate([np.zeros((1, k)), np.cumsum(onehot, axis=0)])
    bound = (2 if case.shuffle else 1) * max(1, k - 1) + 1e-9
    for length in {1, 2, 7, 31, total // 3, total}:
        if 1 <= length <= total:
            windows = cumulative[length:] - cumulative[:-length]
            assert (np.abs(windows - share * length) <= bound).all()


# -- resume -----------------------------------------------------------------------------------------


@SETTINGS
@given(cases(), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.data())
def test_elastic_resume_reads_the_rest_of_the_epoch_exactly_once(
    case: Case, before: int, after: int, drop_after: bool, data: Any
) -> None:
    """All ``before`` ranks read ``k`` records of epoch ``e``; the state resumes ``after`` ranks
    on exactly the rest of the epoch, in the one mixed order, then whole epochs."""
    epoch = data.draw(st.integers(0, 2), label="epoch")
    ranks = [case.schedule(shard_rank=rank, num_shards=before) for rank in range(before)]
    shortest = min(len(schedule.plan(epoch, 0)) for schedule in ranks)
    k = data.draw(st.integers(0, shortest), label="records read by each rank")
    start = (epoch, 0)
    states = [schedule.state(start, k) for schedule in ranks]
    state = states[0]  # rank 0's (the chief's): its shard is the longest
    lengths = [len(schedule.plan(epoch, 0)) for schedule in ranks]
    # Every rank with records left at k states the same; one that read all of its epoch states
    # the next epoch (rank 0's state is then the one to keep, unless every rank is through).
    assert all(each == state for each, length in zip(states, lengths) if length > k or lengths[0] == k)
    assert state["mode"] == "mixture" and state["components"] == [
        [f"c{i}:v1", size, count] for i, (size, count) in enumerate(zip(case.sizes, case.counts))
    ]
    order = whole_epoch(case.schedule(), epoch).tolist()
    consumed = k * before
    read = [ranks[rank].plan(epoch, 0).indices(0, k) for rank in range(before)]
    assert dealt(read) == order[:consumed]
    resumed = [
        case.schedule(shard_rank=rank, num_shards=after, drop_shard_remainder=drop_after, resume_state=state)
        for rank in range(after)
    ]
    points = {schedule.start for schedule in resumed}
    assert len(points) == 1
    (point,) = points
    # Where the state stands: (epoch, k·before), or the next epoch's start once rank 0 is through.
    at_epoch, at = state["epoch"], state["consumed"]
    assert (at_epoch, at) == ((epoch, consumed) if consumed < len(order) else (epoch + 1, 0))
    rest_of_epoch = whole_epoch(case.schedule(), at_epoch).tolist()[at:]
    left = len(rest_of_epoch)
    kept = left - left % after if drop_after else left
    if kept == 0:
        assert point == (at_epoch + 1, 0)  # nothing left of that epoch for any rank
    else:
        assert point == (at_epoch, at)
        rest = [schedule.plan(*point) for schedule in resumed]
        assert dealt([plan.indices(0, len(plan)) for plan in rest]) == rest_of_epoch[:kept]
        assert {len(plan) for plan in rest} <= {kept // after, -(-kept // after)}
    # The following epoch is the uninterrupted run's at the new world size.
    for rank, schedule in enumerate(resumed):
        fresh = case.schedule(shard_rank=rank, num_shards=after, drop_shard_remainder=drop_after)
        following = at_epoch + 1
        assert (schedule.plan(following, 0).indices(0, 10**9) == fresh.plan(following, 0).indices(0, 10**9)).all()
    # A state is the same JSON-ready dict whoever takes it: one rank's state after reading all
    # its records of the epoch resumes the next.
    assert case.schedule().state((epoch, 0), len(order)) == {**state, "epoch": epoch + 1, "consumed": 0}


@SETTINGS
@given(cases(), st.integers(1, 4), st.integers(0, 400))
def test_start_offset_is_the_point_after_that_many_records(case: Case, shards: int, offset: int) -> None:
    rank = offset % shards
    plain = case.schedule(shard_rank=rank, num_shards=shards)
    offset_schedule = case.schedule(shard_rank=rank, num_shards=shards, start_offset=offset)
    mine = np.concatenate([whole_epoch(plain, epoch) for epoch in range(3)])
    length = len(plain.plan(0, 0))
    epoch, position = offset_schedule.start
    assert epoch == (offset // length if length else min(offset, 1))
    if length == 0:
        assert len(offset_schedule.plan(epoch, position)) == 0  # a rank with no records reads none
    elif epoch < 3:
        plan = offset_schedule.plan(epoch, position)
        rest = plan.indices(0, len(plan))
        assert (rest == mine[offset : offset + len(rest)]).all()
        assert offset + len(rest) == (epoch + 1) * length


@pytest.mark.parametrize("stopping, epoch_size", [(None, 7), ("first_exhausted", None)])
def test_proportional_weights_give_the_same_counts(stopping: Optional[str], epoch_size: Optional[int]) -> None:
    """Weights are relative: scaling them changes nothing, and a tie of remainders goes to the
    earlier component (quotas 0.5, 3.5, 1, 2 of 7 records: the first gets the record)."""
    sizes = [2, 4, 2, 2]
    found = {
        tuple(weights): mixture_counts(sizes, [Share(weight=w) for w in weights], epoch_size, stopping)
        for weights in ([1, 7, 2, 4], [2, 14, 4, 8], [0.1, 0.7, 0.2, 0.4], [10, 70, 20, 40])
    }
    assert set(found.values()) == {(1, 3, 1, 2)}, found
    assert tuple(apportion(7, [1, 7, 2, 4])) == (1, 3, 1, 2)


def test_a_changed_component_is_refused_naming_it() -> None:
    case = Case((10, 7), ((10,), (3, 4)), (Share(weight=2), Share(weight=1)), 30, None, "global", True, True, 5)
    state = case.schedule().state((0, 0), 11)
    assert (state["epoch"], state["consumed"]) == (0, 11)
    renamed = MixtureSchedule(
        ["c0:v1", "c1:v2"], case.sizes, case.counts, [PartLayout.from_counts(p) for p in case.parts], case.options()
    )
    with pytest.raises(ValueError, match="mixture component 1 changed since the checkpoint: it was c1:v1, it is c1:v2"):
        renamed.resume_point(state)
    grown = Case((10, 8), ((10,), (4, 4)), case.shares, 30, None, "global", True, True, 5)
    with pytest.raises(
        ValueError, match=r"mixture component 1 \(c1:v1\) changed since the checkpoint: it had 7 records, it has 8"
    ):
        grown.schedule(resume_state=state)
    reweighted = Case(case.sizes, case.parts, (Share(weight=1), Share(weight=1)), 30, None, "global", True, True, 5)
    with pytest.raises(
        ValueError,
        match=r"mixture component 0 \(c0:v1\) took 20 records per epoch when the state was taken, it takes 15 now",
    ):
        reweighted.schedule(resume_state=state)
    assert case.schedule(resume_state=state).start == (0, 11)  # the state itself is intact


@pytest.mark.parametrize(
    "sizes, shares, epoch_size, stopping, message",
    [
        ([3, 0], [Share(), Share()], None, None, "mixture component 1 has no records: leave it out"),
        ([3], [Share(), Share()], None, None, "a mixture of 1 components got 2 shares"),
        ([], [], None, None, "a mixture needs at least one component"),
        ([3, 4], [Share(weight=0), Share(weight=0)], None, None, "mixture weights are all zero"),
        ([3, 4], [Share(), Share()], 0, None, "epoch_size must be at least 1, got 0"),
        ([3, 4], [Share(), Share()], None, "most", "stopping must be one of"),
        (
            [3, 4],
            [Share(repeat=1), Share(weight=1)],
            None,
            None,
            "mixture component 1 has a weight and others repeat or samples",
        ),
    ],
)
def test_mixture_counts_refuse_bad_input_in_one_line(
    sizes: list[int], shares: list[Share], epoch_size: Optional[int], stopping: Optional[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as error:
        mixture_counts(sizes, shares, epoch_size, stopping)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), float("-inf")])
def test_a_share_refuses_a_weight_or_repeat_that_is_not_a_finite_positive_number(value: float) -> None:
    with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
        Share(weight=value)
    with pytest.raises(ValueError, match="repeat must be a finite number >= 0"):
        Share(repeat=value)
    with pytest.raises(TypeError, match="weight must be a number, got str"):
        Share(weight="1")  # type: ignore[arg-type]
