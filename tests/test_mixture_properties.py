"""Property tests of the mixture's pure numpy core (``yogacache.read.mixture_order``), no cache on disk.

Hypothesis varies the components (sizes, part layouts), their shares (weights and an epoch size,
absolute repeat/samples counts, the stopping rules), each component's own order (``"shard"``,
``"global"``, ``"parts"``, shuffled or not, reshuffled or not), the interleaving's block size
(mostly a few draws, so that every epoch crosses block boundaries), world sizes and resume
points, and checks what ``mixture_counts`` and ``MixtureSchedule`` promise: each epoch's counts, no
record twice within a component's pass, one order whoever computes it and at any world size,
windows that mix every component, and exact elastic resume.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import tracemalloc
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from yogacache.read.layout import PartLayout
from yogacache.read.mixture_order import (
    BLOCK_SIZE,
    MAX_EPOCH_SIZE,
    STOPPING_RULES,
    MixtureSchedule,
    Share,
    apportion,
    mixture_counts,
)
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
    block_size: int = BLOCK_SIZE  # draws of the interleaving computed at a time

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
            block_size=self.block_size,
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
        block_size=draw(st.one_of(st.integers(1, 40), st.just(BLOCK_SIZE))),
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


# -- the documented rules, by brute force ----------------------------------------------------------


def decimal(weight: Any) -> Fraction:
    """A weight as the number docs/mixtures.md says it stands for: an integer as it is, a float
    as the decimal it prints as (``0.1`` is 1/10)."""
    return Fraction(Decimal(str(weight))) if isinstance(weight, float) else Fraction(weight)


def largest_remainders(total: int, weights: Sequence[Any]) -> tuple[int, ...]:
    """The counts of docs/mixtures.md's rule, found by trying every way to round: each exact quota
    ``w / Σw × total`` rounded down or up, adding up to ``total``, every component rounded up
    with a larger remainder than every one rounded down, or an equal one and an earlier place.
    Exactly one way meets the rule."""
    exact = [decimal(weight) for weight in weights]
    quotas = [weight * total / sum(exact) for weight in exact]
    floors = [math.floor(quota) for quota in quotas]
    remainders = [quota - floor for quota, floor in zip(quotas, floors)]
    found = []
    for up in itertools.combinations(range(len(exact)), total - sum(floors)):
        down = [j for j in range(len(exact)) if j not in up]
        if all(remainders[i] > remainders[j] or (remainders[i] == remainders[j] and i < j) for i in up for j in down):
            found.append(tuple(floor + (i in up) for i, floor in enumerate(floors)))
    assert len(found) == 1, found
    (counts,) = found
    assert all(count in (math.floor(quota), math.ceil(quota)) for count, quota in zip(counts, quotas))
    return counts


def stopping_epoch(stopping: str, sizes: Sequence[int], weights: Sequence[Any]) -> int:
    """docs/mixtures.md's epoch of a stopping rule, by search: ``"first_exhausted"``, the largest
    epoch whose exact quotas (components of weight 0 left out) are all at most the sizes;
    ``"all_exhausted"``, the smallest whose quotas are all at least the sizes."""
    exact = [decimal(weight) for weight in weights]
    whole = sum(exact)

    def within(epoch: int) -> bool:  # no quota past its component's size
        return all(weight * epoch / whole <= size for weight, size in zip(exact, sizes))

    def through(epoch: int) -> bool:  # every quota of a weighted component at least its size
        return all(weight * epoch / whole >= size for weight, size in zip(exact, sizes) if weight)

    epoch = 1
    if stopping == "first_exhausted":
        while within(epoch * 2):
            epoch *= 2
        step = epoch
        while step > 1:  # within(epoch) and not within(2·epoch): bisect the step
            step //= 2
            if within(epoch + step):
                epoch += step
        assert within(epoch) and not within(epoch + 1)
    else:
        while not through(epoch):
            epoch *= 2
        step = epoch // 2
        while step >= 1:
            if through(epoch - step):
                epoch -= step
            step //= 2
        assert through(epoch) and (epoch == 1 or not through(epoch - 1))
    return epoch


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
    weights = [n if s.weight is None else s.weight for s, n in zip(case.shares, case.sizes)]
    assert case.counts == largest_remainders(total, weights)
    positive = np.array([w > 0 for w in weights])
    if case.stopping is None:
        assert total == (case.epoch_size if case.epoch_size is not None else int(sizes.sum()))
    else:
        assert total == stopping_epoch(case.stopping, case.sizes, weights)
    if case.stopping == "first_exhausted":
        assert (counts <= sizes).all()  # no component past one pass
        assert ((counts >= sizes - 1) & positive).any()  # ... and one (nearly) through: the epoch ends
    elif case.stopping == "all_exhausted":
        assert (counts[positive] >= sizes[positive]).all()  # every component through at least once
        assert ((counts <= sizes + 1) & positive).any()  # ... and one (nearly) just through


def test_every_small_case_is_the_largest_remainders_exactly() -> None:
    """All 3,750 mixtures of three integer weights 1-5 and epoch sizes 1-30: ties of remainders
    go to the earlier component (issue 33: 43 of them were broken in floating point, e.g.
    ``[1, 4, 1]`` over 4 records gave ``(1, 2, 1)``)."""
    assert tuple(apportion(4, [1, 4, 1])) == (1, 3, 0)
    wrong = [
        (weights, total)
        for weights in itertools.product(range(1, 6), repeat=3)
        for total in range(1, 31)
        if tuple(apportion(total, weights)) != largest_remainders(total, weights)
    ]
    assert wrong == []


WEIGHTS = st.one_of(
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False),
    st.decimals(0, 1000, places=3).map(float),  # what users type: 0.7, 12.5
    st.sampled_from([1e-18, 5e-324, 1e300, 10**30]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(WEIGHTS, min_size=1, max_size=6).filter(any), st.integers(1, 10**7))
def test_counts_are_the_largest_remainders_of_the_exact_quotas(weights: list[Any], total: int) -> None:
    shares = [Share(weight=weight) for weight in weights]
    counts = mixture_counts([1] * len(weights), shares, total)
    assert counts == tuple(apportion(total, weights)) == largest_remainders(total, weights)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**4), min_size=1, max_size=6).filter(any), st.integers(0, 6), st.integers(1, 1000))
def test_decimal_weights_are_the_decimals_they_print_as(weights: list[int], places: int, total: int) -> None:
    """``[0.3, 0.1]`` weighs as ``[3, 1]``: a float weight is the decimal it prints as (the
    binary float 0.1 is a little more than 1/10 and would break ties the other way)."""
    scaled = [float(f"{weight}e-{places}") for weight in weights]
    assert tuple(apportion(total, scaled)) == tuple(apportion(total, weights)) == largest_remainders(total, weights)
    # A numpy float weighs as it prints too (np.float32(0.1) prints as 0.1).
    narrow = [Share(weight=np.float32(weight)) for weight in scaled]
    assert mixture_counts([1] * len(weights), narrow, total) == largest_remainders(total, weights)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 10**4), WEIGHTS), min_size=1, max_size=5).filter(lambda c: any(w for _, w in c)),
    st.sampled_from(STOPPING_RULES),
)
def test_a_stopping_rule_is_the_epoch_its_quotas_name_or_a_refusal(
    components: list[tuple[int, Any]], stopping: str
) -> None:
    """``"first_exhausted"``: the largest epoch whose exact quotas are all at most the sizes;
    ``"all_exhausted"``: the smallest whose quotas are all at least the sizes; an epoch longer
    than ``MAX_EPOCH_SIZE`` is refused naming the component whose weight asks for it."""
    sizes = [size for size, _ in components]
    weights = [weight for _, weight in components]
    epoch = stopping_epoch(stopping, sizes, weights)
    shares = [Share(weight=weight) for weight in weights]
    if epoch > MAX_EPOCH_SIZE:
        with pytest.raises(
            ValueError, match=rf"stopping='{stopping}' makes an epoch of .* records: component \d"
        ) as error:
            mixture_counts(sizes, shares, stopping=stopping)
        limiting = int(re.search(r"component (\d+)", str(error.value)).group(1))  # type: ignore[union-attr]
        assert f"at weight {weights[limiting]!r} " in str(error.value)
        return
    counts = mixture_counts(sizes, shares, stopping=stopping)
    assert counts == largest_remainders(epoch, weights)
    weighted = [(count, size) for count, size, weight in zip(counts, sizes, weights) if weight]
    if stopping == "first_exhausted":
        assert all(count <= size for count, size in zip(counts, sizes))
        assert any(count >= size - 1 for count, size in weighted)
    else:
        assert all(count >= size for count, size in weighted)


@pytest.mark.parametrize(
    "weights, stopping, epoch_size, counts",
    [
        ([1, 1e-18], "first_exhausted", None, (10, 0)),
        ([1, 1e-18], None, 10**6, (10**6, 0)),
        ([1e308, 1e308, 1e308], None, 10, (4, 3, 3)),  # their float sum overflows
        ([10**400, 1], None, 5, (5, 0)),  # no float holds the first
        ([5e-324, 5e-324], "all_exhausted", None, (10, 10)),  # the smallest float, twice
    ],
)
def test_extreme_but_valid_weights_work(
    weights: list[Any], stopping: Optional[str], epoch_size: Optional[int], counts: tuple[int, ...]
) -> None:
    shares = [Share(weight=weight) for weight in weights]
    assert mixture_counts([10] * len(weights), shares, epoch_size, stopping) == counts


@pytest.mark.parametrize(
    "shares, stopping, epoch_size, message",
    [
        (
            [Share(weight=1), Share(weight=1e-18)],
            "all_exhausted",
            None,
            r"stopping='all_exhausted' makes an epoch of about 1e19 records: component 1 \(10 records\) at weight "
            r"1e-18 is read once through only in an epoch that long, more than the 4,294,967,296 records \(2\*\*32\)",
        ),
        (
            [Share(weight=1), Share(weight=2)],
            None,
            2**32 + 1,
            "epoch_size 4,294,967,297 is more than the 4,294,967,296",
        ),
        ([Share(repeat=1e300), Share()], None, None, "repeat and samples make an epoch of about 1e301 records"),
        ([Share(samples=2**31), Share(samples=2**31 + 1)], None, None, "an epoch of 4,294,967,297 records, more than"),
    ],
)
def test_an_epoch_past_the_cap_is_refused_naming_what_asks_for_it(
    shares: list[Share], stopping: Optional[str], epoch_size: Optional[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as error:
        mixture_counts([10] * len(shares), shares, epoch_size, stopping)
    assert "\n" not in str(error.value)


def test_an_epoch_of_the_cap_itself_is_allowed() -> None:
    assert mixture_counts([10, 10], [Share(weight=1), Share(weight=1)], MAX_EPOCH_SIZE) == (2**31, 2**31)


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


def window_bound(counts: Sequence[int], shuffle: bool) -> np.ndarray:
    """docs/mixtures.md's bound: component ``i``'s records in any window of ``L`` records are
    ``c_i / E · L`` within ``2 + 2·(K - 2)·c_i / E`` (``K >= 2`` the components the epoch reads;
    half that unshuffled; one component fills every window)."""
    share = np.array(counts) / sum(counts)
    k = int((share > 0).sum())
    if k < 2:
        return np.zeros(len(share))
    return (2 + 2 * (k - 2) * share) / (1 if shuffle else 2)


@SETTINGS
@given(cases())
def test_every_window_mixes_every_component(case: Case) -> None:
    """Every window of every length holds each component's share within the stated bound:
    never one component at a time."""
    for epoch in range(2):
        order = whole_epoch(case.schedule(), epoch)
        total, k = len(order), len(case.sizes)
        share = np.array(case.counts) / total
        onehot = np.eye(k)[case.component_of(order)]
        cumulative = np.concatenate([np.zeros((1, k)), np.cumsum(onehot, axis=0)])
        bound = window_bound(case.counts, case.shuffle) + 1e-9
        for length in range(1, total + 1):
            windows = cumulative[length:] - cumulative[:-length]
            assert (np.abs(windows - share * length) <= bound).all(), length


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("counts", [(700, 200, 100), (1, 1), (500, 1), (3, 5, 7, 11, 13), (64, 64, 64, 64)])
def test_the_window_bound_holds_for_many_seeds(counts: tuple[int, ...], shuffle: bool) -> None:
    """The bound is kept for any seed, not the tests' seeds only: 30 seeds, every window
    length, in blocks of 97 draws; and some window comes within one record of it (it is not
    loose by more)."""
    sizes = list(counts)
    closest = 0.0
    bound = window_bound(counts, shuffle)
    for seed in range(30 if shuffle else 1):
        case = Case(
            tuple(sizes),
            tuple((n,) for n in sizes),
            tuple(Share(samples=c) for c in counts),
            None,
            None,
            "global",
            shuffle,
            shuffle,
            seed,
            block_size=97,
        )
        order = whole_epoch(case.schedule(), 0)
        total, k = len(order), len(counts)
        share = np.array(counts) / total
        cumulative = np.concatenate([np.zeros((1, k)), np.cumsum(np.eye(k)[case.component_of(order)], axis=0)])
        for length in range(1, total + 1):
            deviation = np.abs(cumulative[length:] - cumulative[:-length] - share * length).max(axis=0)
            assert (deviation <= bound + 1e-9).all(), (seed, length, deviation, bound)
            closest = max(closest, float((deviation - bound).max()))
    assert closest > -1, closest


# -- the interleaving, a block at a time (issue 34) ------------------------------------------------


def _splitmix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (the keyed hash of docs/mixtures.md's keys)."""
    values = values.copy()
    values ^= values >> np.uint64(30)
    values *= np.uint64(0xBF58476D1CE4E5B9)
    values ^= values >> np.uint64(27)
    values *= np.uint64(0x94D049BB133111EB)
    values ^= values >> np.uint64(31)
    return values


def sorted_interleaving(counts: Sequence[int], seed: Optional[int], key_epoch: int) -> np.ndarray:
    """An epoch's draws in order as one sort of all its keys, the construction before the blocks:
    draw ``k`` of component ``i`` has the key ``(k + u) / c_i`` (``u`` the keyed hash of ``(seed,
    epoch, i, k)`` in ``[0, 1)``, 0.5 without a seed), ties to the earlier component."""
    keys = []
    for i, count in enumerate(counts):
        k = np.arange(count, dtype=np.int64)
        if seed is None:
            jitter: Any = np.full(count, 0.5)
        else:
            digest = hashlib.blake2b(f"yogacache.mixture/v1:{seed}:{key_epoch}:{i}".encode(), digest_size=8).digest()
            base = np.uint64(int.from_bytes(digest, "little") & ((1 << 62) - 1))
            jitter = (_splitmix(k.astype(np.uint64) ^ base) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        keys.append((k + jitter) / count)
    return np.argsort(np.concatenate(keys) if keys else np.empty(0), kind="stable")


@SETTINGS
@given(cases(), st.data())
def test_the_blocked_interleaving_is_one_sort_of_the_epochs_keys(case: Case, data: Any) -> None:
    """For any block size, the draws at any positions (in any order, repeated) are those of one
    sort of the whole epoch's keys, and the draws before any position count them."""
    mixed = case.schedule().mixed
    total = sum(case.counts)
    assert mixed.num_blocks == -(-total // case.block_size)
    for epoch in range(3):
        key_epoch = epoch if case.reshuffle else 0
        expected = sorted_interleaving(case.counts, case.seed if case.shuffle else None, key_epoch)
        assert mixed.draws(epoch, np.arange(total)).tolist() == expected.tolist()
        positions = data.draw(st.lists(st.integers(0, total - 1), max_size=30), label="positions")
        assert mixed.draws(epoch, positions).tolist() == expected[positions].tolist()
        position = data.draw(st.integers(0, total), label="position")
        before = np.bincount(mixed.component_of(expected[:position]), minlength=len(case.counts))
        assert mixed.draws_before(epoch, position).tolist() == before.tolist()
    with pytest.raises(IndexError, match=rf"mixture positions must lie in \[0, {total}\)"):
        mixed.draws(0, [total])


# The interleaving and the records of three mixtures as the release before the blocks read them
# (one argsort of each epoch's keys; yogacache at 90f8481): draws numbered across components
# (component i's k-th draw of the epoch is draw_starts[i] + k), and the mixture's record indices.
BEFORE_BLOCKS: dict[str, dict[str, Any]] = {
    "shuffled": {
        "sizes": (7, 5, 3),
        "counts": (6, 4, 3),
        "options": dict(shuffle=True, shuffle_seed=7, reshuffle_each_epoch=True, shuffle_mode="global"),
        "draws": [[0, 10, 6, 1, 2, 7, 8, 3, 11, 4, 9, 12, 5], [6, 0, 1, 10, 7, 11, 2, 3, 8, 4, 12, 5, 9]],
        "records": [[5, 12, 8, 3, 6, 9, 11, 2, 14, 1, 7, 13, 4], [10, 0, 1, 14, 8, 13, 5, 2, 7, 0, 12, 3, 11]],
    },
    "skip_shuffle_at_epoch_end": {
        "sizes": (9, 4),
        "counts": (9, 6),
        "options": dict(shuffle=True, shuffle_seed=11, reshuffle_each_epoch=False, shuffle_mode="global"),
        "draws": [[0, 9, 1, 10, 2, 11, 3, 12, 4, 5, 6, 13, 7, 8, 14]] * 2,
        "records": [
            [6, 12, 4, 9, 7, 11, 1, 10, 8, 5, 3, 12, 2, 0, 9],
            [6, 11, 4, 10, 7, 12, 1, 9, 8, 5, 3, 11, 2, 0, 10],
        ],
    },
    "unshuffled_ties": {
        "sizes": (4, 4, 2),
        "counts": (4, 4, 2),
        "options": dict(shuffle=False, shuffle_mode="shard"),
        "draws": [[0, 4, 8, 1, 5, 2, 6, 9, 3, 7]] * 2,
        "records": [[0, 4, 8, 1, 5, 2, 6, 9, 3, 7]] * 2,
    },
}


def _pinned(name: str, block_size: int = BLOCK_SIZE, **more: Any) -> MixtureSchedule:
    case = BEFORE_BLOCKS[name]
    return MixtureSchedule(
        [f"c{i}:v1" for i in range(len(case["sizes"]))],
        case["sizes"],
        case["counts"],
        [PartLayout.from_counts([n]) for n in case["sizes"]],
        ReadOptions(**case["options"], **more),
        block_size=block_size,
    )


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, BLOCK_SIZE])
@pytest.mark.parametrize("name", sorted(BEFORE_BLOCKS))
def test_the_order_is_the_one_before_the_blocks(name: str, block_size: int) -> None:
    """The blocked construction reads every epoch as the release before it did (pinned), so
    resume states and checkpoints carry over unchanged."""
    schedule = _pinned(name, block_size)
    total = sum(BEFORE_BLOCKS[name]["counts"])
    for epoch in range(2):
        assert schedule.mixed.draws(epoch, np.arange(total)).tolist() == BEFORE_BLOCKS[name]["draws"][epoch]
        assert schedule.mixed.records(epoch, np.arange(total)).tolist() == BEFORE_BLOCKS[name]["records"][epoch]


@pytest.mark.parametrize("block_size", [1000, BLOCK_SIZE])
def test_a_long_epoch_is_the_one_before_the_blocks(block_size: int) -> None:
    """A 100,000-record epoch in 25 or 101 blocks: the same draws as the release before them
    (their BLAKE2b digest, pinned), epoch after epoch."""
    sizes = (70_000, 20_000, 10_000)
    mixed = MixtureSchedule(
        ["a:v1", "b:v1", "c:v1"],
        sizes,
        sizes,
        [PartLayout.from_counts([n]) for n in sizes],
        ReadOptions(shuffle=True, shuffle_seed=3, reshuffle_each_epoch=True, shuffle_mode="global"),
        block_size=block_size,
    ).mixed
    pinned = {
        0: ([0, 1, 2, 70000, 3, 90000, 4, 5, 70001, 6, 7, 8], "63e00e1918434090da953cee047d1751"),
        1: ([0, 90000, 1, 2, 70000, 3, 4, 70001, 5, 6, 90001, 7], "a05312e9718728386f91f4b45b15537b"),
    }
    for epoch, (head, digest) in pinned.items():
        draws = mixed.draws(epoch, np.arange(sum(sizes))).astype("<i8")
        assert draws[:12].tolist() == head
        assert hashlib.blake2b(draws.tobytes(), digest_size=16).hexdigest() == digest


def test_a_state_saved_before_the_blocks_resumes_in_the_order_it_was_saved_in() -> None:
    """A checkpoint's state as the release before the blocks wrote it: the rest of its epoch in
    that release's order (pinned), at another world size."""
    state = {
        "version": 1,
        "mode": "mixture",
        "epoch": 1,
        "consumed": 5,
        "seed": 7,
        "order": "global",
        "num_records": 13,
        "components": [["c0:v1", 7, 6], ["c1:v1", 5, 4], ["c2:v1", 3, 3]],
        "shuffle": True,
        "reshuffle_each_epoch": True,
        "rotate": True,
        "builds": [None, None, None],
    }
    ranks = [_pinned("shuffled", 2, shard_rank=rank, num_shards=2, resume_state=state) for rank in range(2)]
    rest = [schedule.plan(*schedule.start) for schedule in ranks]
    assert dealt([plan.indices(0, len(plan)) for plan in rest]) == BEFORE_BLOCKS["shuffled"]["records"][1][5:]
    assert ranks[0].state(ranks[0].start) == state


def test_the_interleaving_holds_one_block_at_any_size() -> None:
    """A 3-way mixture of 10^9 records: its first 1000 positions, and 1000 two thirds into the
    epoch, read through plans, hold about a block of the order at a time (the order is never
    computed whole: 10^9 draws would be gigabytes), and each component's counts hold there."""
    sizes = (700_000_000, 200_000_000, 100_000_000)
    counts = mixture_counts(sizes, [Share(weight=w) for w in (0.7, 0.2, 0.1)])
    options: dict[str, Any] = dict(shuffle=True, shuffle_seed=7, shuffle_mode="global")

    def schedule(**more: Any) -> MixtureSchedule:
        layouts = [PartLayout.from_counts([n]) for n in sizes]
        return MixtureSchedule(["a:v1", "b:v1", "c:v1"], sizes, counts, layouts, ReadOptions(**options, **more))

    schedule().plan(0, 0).indices(0, 10)  # imports and first-use allocations
    tracemalloc.start()
    try:
        first = schedule()
        records = first.plan(0, 0).indices(0, 1000)
        later = schedule(resume_state=first.state((1, 0), 2 * sum(counts) // 3))
        more = later.plan(*later.start).indices(0, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak / 2**20:.1f} MiB to read 2000 positions of a 10^9-record mixture"
    for found in (records, more):
        per = np.bincount(np.searchsorted([0, *np.cumsum(sizes)[:-1]], found, side="right") - 1, minlength=3)
        assert (np.abs(per - np.array(counts) / sum(counts) * 1000) <= 3).all(), per
    assert later.start == (1, 2 * sum(counts) // 3)


def test_a_boundary_found_from_its_guess_is_the_one_bisection_finds() -> None:
    """Each block boundary (the draws of each component below ``b / M``) is found from a few
    keys near ``floor(b / M · c_i)``; bisection over all the draws finds the same."""
    mixed = _pinned("shuffled", 2).mixed
    bigger = MixtureSchedule(
        ["a:v1", "b:v1"],
        (1000, 3),
        (997, 3),
        [PartLayout.from_counts([1000]), PartLayout.from_counts([3])],
        ReadOptions(shuffle=True, shuffle_seed=5, shuffle_mode="global"),
        block_size=10,
    ).mixed
    for order in (mixed, bigger):
        for epoch in range(2):
            for block in range(order.num_blocks + 1):
                found = order._boundary(epoch, block)
                threshold = block / order.num_blocks if block < order.num_blocks else float("inf")
                assert found.tolist() == [order._bisect(epoch, i, threshold) for i in range(len(order.counts))]


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
    # (The windows it names are those of the passes that epoch reads.)
    through = case.schedule().state((epoch, 0), len(order))
    assert through == case.schedule().state((epoch + 1, 0))
    assert {**through, "windows": None} == {**state, "epoch": epoch + 1, "consumed": 0, "windows": None}


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
