"""The resume-state contract (yogacache.read.state, issue 33 item 1): a state resumed by a reader
whose order differs from the one that saved it is exact or refused, never silently inexact.

The property: over every mode ("shard", "global", "parts", and mixtures of "global" and "parts"
passes) x every setting that decides the order, changed between saving a state and resuming it,
the rest of the state's epoch read by the resuming ranks equals the oracle (the uninterrupted
epoch's remainder: rank by rank where the split is the same, exactly once across the ranks where
the world size changed), or the resume raises ``ResumeStateError`` naming the setting. Which
changes must be honoured (world sizes where the mode promises it, a budget that narrows a
window, a seed an unshuffled read ignores) and which refused is asserted too, so a contract that
refused everything would fail. Orders are computed from part layouts (no cache on disk): a
reader passes its budget and layout to the same schedules.

Then the reproductions of issue 33's bullets through the public API, states of earlier releases,
out-of-range and ill-typed numbers, and Grain's checkpoint reprs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yogacache.dataref import CacheDataRef
from yogacache.errors import ResumeStateError
from yogacache.mixture import Mixture
from yogacache.read.layout import PartLayout
from yogacache.read.mixture_order import MixtureSchedule
from yogacache.read.options import ReadOptions
from yogacache.read.schedule import ReadSchedule
from yogacache.store.local import CacheStore

pytestmark = pytest.mark.filterwarnings("ignore:rank .* reads no records")

PART_BYTES = 100  # every part of the layouts below: budgets count parts


@dataclasses.dataclass(frozen=True)
class Config:
    """Everything that decides a rank's order (and the world it reads in)."""

    mode: str  # "shard", "global", "parts", "mix-global", "mix-parts"
    shuffle: bool = True
    reshuffle: bool = True
    seed: int = 7
    shards: int = 2
    per_node: Optional[int] = None
    window: int = 3
    drop: bool = False
    budget: Optional[int] = None
    build: str = "build-1"
    counts: tuple[int, int] = (30, 20)
    rotate: bool = True

    @property
    def mixture(self) -> bool:
        return self.mode.startswith("mix-")

    def options(self, rank: int, state: Optional[dict[str, Any]] = None) -> ReadOptions:
        return ReadOptions(
            shuffle=self.shuffle,
            reshuffle_each_epoch=self.shuffle and self.reshuffle,
            shuffle_seed=self.seed,
            shard_rank=rank,
            num_shards=self.shards,
            drop_shard_remainder=self.drop,
            shuffle_mode=self.mode.removeprefix("mix-"),
            parts_window=self.window,
            ranks_per_node=self.per_node,
            resume_state=state,
        )


def layout(counts: list[int], build: str) -> PartLayout:
    plain = PartLayout.from_counts(counts, [PART_BYTES] * len(counts))
    return dataclasses.replace(plain, build=build)


def schedule(config: Config, layouts: list[list[int]], rank: int, state: Optional[dict[str, Any]] = None) -> Any:
    options = config.options(rank, state)
    if config.mixture:
        parts = [layout(counts, f"{config.build}-{i}") for i, counts in enumerate(layouts)]
        sizes = [part.num_records for part in parts]
        return MixtureSchedule(
            ["a:v1", "b:v1"], sizes, config.counts, parts, options, budget_bytes=config.budget, rotate=config.rotate
        )
    only = layout(layouts[0], config.build)
    return ReadSchedule(only.num_records, options, only, budget_bytes=config.budget)


def read_rest(s: Any, epoch: int) -> list[int]:
    """What a schedule reads of ``epoch`` from its start point ([] if it starts past it)."""
    start_epoch, position = s.start
    if start_epoch != epoch:
        assert start_epoch > epoch
        return []
    plan = s.plan(start_epoch, position)
    return [int(i) for i in plan.indices(0, len(plan))]


def whole(s: Any, epoch: int) -> list[int]:
    plan = s.plan(epoch, 0)
    return [int(i) for i in plan.indices(0, len(plan))]


# The changes: a name and how it changes a config (None where it does not apply to the config).
def change(config: Config, name: str) -> Optional[Config]:
    replace = dataclasses.replace
    if name == "none":
        return config
    if name == "shuffle":
        return replace(config, shuffle=not config.shuffle, reshuffle=not config.shuffle)
    if name == "seed":
        return replace(config, seed=config.seed + 1)
    if name == "reshuffle":  # skip_shuffle_at_epoch_end flipped
        return replace(config, reshuffle=not config.reshuffle) if config.shuffle else None
    if name == "parts_window":
        return replace(config, window=config.window - 1)
    if name == "num_shards":
        return replace(config, shards=3 if config.shards != 3 else 1, per_node=None)
    if name == "ranks_per_node":
        return replace(config, per_node=2) if config.shards == 2 and not config.mixture else None
    if name == "drop_shard_remainder":
        return replace(config, drop=not config.drop)
    if name == "budget-none":
        return replace(config, budget=None) if config.budget is not None else None
    if name == "budget":
        return replace(config, budget=3 * PART_BYTES if config.budget != 3 * PART_BYTES else 5 * PART_BYTES)
    if name == "build":
        return replace(config, build="build-2")
    if name == "mode":
        other = {"shard": "global", "global": "parts", "parts": "global", "mix-global": "mix-parts"}
        return replace(config, mode=other.get(config.mode, "mix-global"))
    if name == "counts":
        return replace(config, counts=(config.counts[0] + 1, config.counts[1] - 1)) if config.mixture else None
    if name == "rotate":
        return replace(config, rotate=not config.rotate) if config.mixture else None
    raise AssertionError(name)


CHANGES = [
    "none", "shuffle", "seed", "reshuffle", "parts_window", "num_shards", "ranks_per_node",
    "drop_shard_remainder", "budget-none", "budget", "build", "mode", "counts", "rotate",
]  # fmt: skip


def must_refuse(before: Config, name: str) -> Optional[bool]:
    """True: the change must be refused; False: it must be honoured; None: either (a budget that
    may not hold the saved window)."""
    parts = before.mode in ("parts", "mix-parts")
    if name in ("none", "budget-none"):
        return False
    if name == "shuffle":
        return True
    if name in ("seed", "reshuffle"):
        return before.shuffle
    if name == "parts_window":
        return parts
    if name == "ranks_per_node":  # another split: the "parts" runs are dealt anew, the others ignore it
        return False
    if name in ("num_shards", "drop_shard_remainder"):
        return before.mode == "shard"
    if name == "budget":
        return None if parts else False
    return True  # build, mode, counts, rotate


@settings(max_examples=120, deadline=None)
@given(
    mode=st.sampled_from(["shard", "global", "parts", "mix-global", "mix-parts"]),
    what=st.sampled_from(CHANGES),
    shuffle=st.booleans(),
    reshuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    shards=st.sampled_from([1, 2, 3]),
    budget=st.sampled_from([None, 5 * PART_BYTES, 7 * PART_BYTES]),
    layouts=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=8), min_size=2, max_size=2),
    epoch=st.integers(0, 2),
    fraction=st.floats(0, 1),
)
def test_a_state_resumed_with_a_setting_changed_is_exact_or_refused(
    mode: str,
    what: str,
    shuffle: bool,
    reshuffle: bool,
    seed: int,
    shards: int,
    budget: Optional[int],
    layouts: list[list[int]],
    epoch: int,
    fraction: float,
) -> None:
    before = Config(mode, shuffle=shuffle, reshuffle=reshuffle, seed=seed, shards=shards, budget=budget)
    if before.mixture:
        before = dataclasses.replace(before, counts=(sum(layouts[0]) + 3, max(2, sum(layouts[1]) // 2)))
    after = change(before, what)
    if after is None:
        return
    saved = [schedule(before, layouts, rank) for rank in range(before.shards)]
    full = [whole(s, epoch) for s in saved]
    k = int(min(len(f) for f in full) * fraction)
    # Every rank read k records of the epoch; their states (the same where valid at any world size).
    states = [s.state((epoch, 0), k) for s in saved]
    oracle = [f[k:] for f in full]
    try:
        resumed = [
            schedule(after, layouts, rank, states[min(rank, len(states) - 1)] if before.mode == "shard" else states[0])
            for rank in range(after.shards)
        ]
    except ResumeStateError as error:
        expected = must_refuse(before, what)
        assert expected is not False, f"{what}: a change that must be honoured was refused: {error}"
        assert "\n" not in str(error)
        if what == "budget":
            assert "local_cache_limit" in str(error)
        return
    assert must_refuse(before, what) is not True, f"{what} changed and the state was accepted: {states[0]}"
    got = [read_rest(s, epoch) for s in resumed]
    if after.shards == before.shards and after.per_node == before.per_node and after.drop == before.drop:
        assert got == oracle, f"{what}: the rest of epoch {epoch} differs from the uninterrupted one's"
        return
    # Another world: the rest of the epoch exactly once across the new ranks (less what does not
    # divide among them where the remainder is dropped).
    read = sorted(i for rank in got for i in rank)
    rest = sorted(i for rank in oracle for i in rank)
    assert len(read) == len(set(read)) or before.mixture, f"{what}: records read twice: {read}"
    if after.drop:
        assert set(read) <= set(rest) and len(rest) - len(read) < after.shards, (what, read, rest)
    else:
        assert read == rest, f"{what}: the rest of epoch {epoch} across the new ranks is not the remainder"


# -- issue 33's reproductions, through the public API ----------------------------------------------
N = 90


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("state-contract")
    store = CacheStore(root, part_size_bytes=400, show_progress=False)  # many parts
    for name, size in (("a", N), ("b", 40)):
        store.build(name, "v1", [{"x": np.int64(1000 * (name == "b") + i)} for i in range(size)])
    return {"store": store, "a": CacheDataRef(store.open("a", "v1")), "b": CacheDataRef(store.open("b", "v1"))}


def xs(stream: Any) -> list[int]:
    return [int(element["x"]) for element in stream]


@pytest.mark.parametrize("mode", ["shard", "global", "parts"])
def test_a_shuffled_state_resumed_unshuffled_or_skipping_the_reshuffle_is_refused(
    caches: dict[str, Any], mode: str
) -> None:
    ref = caches["a"]
    stream = ref.stream(shuffle=True, shuffle_seed=3, shuffle_mode=mode)
    first = xs(stream)
    second = xs(stream)  # epoch 1
    state = stream.state_dict(len(first) + 20)  # 20 records into epoch 1
    with pytest.raises(ResumeStateError, match="saved with shuffle=True, this reader has shuffle=False"):
        ref.stream(shuffle=False, shuffle_seed=3, shuffle_mode=mode, resume_state=state)
    with pytest.raises(
        ResumeStateError,
        match=r"saved with reshuffle_each_epoch=True \(skip_shuffle_at_epoch_end=False\), this reader has "
        r"reshuffle_each_epoch=False \(skip_shuffle_at_epoch_end=True\)",
    ):
        ref.stream(shuffle=True, shuffle_seed=3, skip_shuffle_at_epoch_end=True, shuffle_mode=mode, resume_state=state)
    # With the settings it was saved with, the rest of epoch 1 exactly.
    assert xs(ref.stream(shuffle=True, shuffle_seed=3, shuffle_mode=mode, resume_state=state)) == second[20:]


def test_a_mixture_parts_state_resumed_with_another_window_is_refused(caches: dict[str, Any]) -> None:
    mixture = Mixture([caches["a"], caches["b"]], weights=[2, 1])
    args = {"shuffle": True, "shuffle_seed": 5, "shuffle_mode": "parts"}
    stream = mixture.stream(**args, parts_window=4)
    epoch = xs(stream)
    state = stream.state_dict(50)
    with pytest.raises(ResumeStateError, match="saved with parts_window=4, this mixture has parts_window=2"):
        mixture.stream(**args, parts_window=2, resume_state=state)
    assert xs(mixture.stream(**args, parts_window=4, resume_state=state)) == epoch[50:]


def mixture_schedule(budget: Optional[int], state: Optional[dict[str, Any]] = None, window: int = 4) -> Any:
    layouts = [layout([10] * 12, "a"), layout([10] * 6, "b")]
    options = ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode="parts", parts_window=window, resume_state=state)
    return MixtureSchedule(["a:v1", "b:v1"], [120, 60], [100, 90], layouts, options, budget_bytes=budget)


def test_a_mixture_parts_state_resumed_under_another_budget_finishes_its_epoch_in_the_saved_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A node budget narrows each component's window (what MixtureReader passes the schedule as
    ``budget_bytes``): resumed under another one, the rest of the epoch is read with the windows
    the state was saved with, the component's passes that epoch reads too; later passes re-fit."""
    saved = mixture_schedule(None)
    state = saved.state(saved.start, 70)
    assert state["windows"] == [[[0, 4]], [[1, 4]]]
    with caplog.at_level("WARNING"):
        resumed = mixture_schedule(14 * PART_BYTES, state)
    assert [mode.window for mode in resumed.mixed.passes] != [4, 4]  # this budget fits narrower windows
    assert "as the resume state was saved" in caplog.text
    assert read_rest(resumed, 0) == whole(saved, 0)[70:]
    # Its own states name the windows it reads with: resumed again, the same records.
    later = resumed.state(resumed.start, 150)
    again = mixture_schedule(14 * PART_BYTES, later)
    assert later["epoch"] == 1 and read_rest(again, 1) == whole(resumed, 1)[later["consumed"] :]
    # A budget that cannot hold a saved window's parts and the next: refused, naming both.
    with pytest.raises(ResumeStateError, match=r"saved with window=4 .* this reader has window=1"):
        mixture_schedule(8 * PART_BYTES, state)


def test_a_parts_state_resumed_under_another_budget_reads_the_saved_window_then_refits() -> None:
    base = layout([10] * 12, "a")

    def parts(budget: Optional[int], state: Optional[dict[str, Any]] = None) -> ReadSchedule:
        options = ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode="parts", parts_window=4, resume_state=state)
        return ReadSchedule(120, options, base, budget_bytes=budget)

    saved = parts(None)
    state = saved.state(saved.start, 30)
    resumed = parts(6 * PART_BYTES, state)
    assert resumed.order_settings()["window"] == 2 and resumed.start == (0, 30)
    assert read_rest(resumed, 0) == whole(saved, 0)[30:]
    assert whole(resumed, 1) == whole(parts(6 * PART_BYTES), 1)  # the next epoch: this budget's window
    assert resumed.state((1, 5))["window"] == 2 and resumed.state((0, 40))["window"] == 4
    with pytest.raises(ResumeStateError, match="local_cache_limit"):
        parts(4 * PART_BYTES, state)


def test_a_state_of_another_build_is_refused(caches: dict[str, Any], tmp_path: Path) -> None:
    state = caches["a"].stream(shuffle=True, shuffle_seed=3, shuffle_mode="global").state_dict(10)
    other = CacheStore(tmp_path, part_size_bytes=400, show_progress=False)
    other.build("a", "v1", [{"x": np.int64(i)} for i in range(N)])  # the same records, another build
    rebuilt = CacheDataRef(other.open("a", "v1"))
    with pytest.raises(ResumeStateError, match="the resume state was saved with build='.*', this reader has build="):
        rebuilt.stream(shuffle=True, shuffle_seed=3, shuffle_mode="global", resume_state=state)


# -- states of earlier releases ----------------------------------------------------------------------
LEGACY = ("build", "shuffle", "reshuffle_each_epoch", "drop_shard_remainder", "parts_window")


@pytest.mark.parametrize("mode", ["shard", "global", "parts"])
def test_states_of_earlier_releases_still_resume(caches: dict[str, Any], mode: str) -> None:
    ref = caches["a"]
    args = {"shuffle": True, "shuffle_seed": 3, "shuffle_mode": mode, "shard_rank": 1, "num_shards": 2}
    stream = ref.stream(**args)
    epoch = xs(stream)
    old = {key: value for key, value in stream.state_dict(7).items() if key not in LEGACY}
    assert xs(ref.stream(**args, resume_state=old)) == epoch[7:]
    with pytest.raises(ResumeStateError, match="shuffle_seed=3"):  # checked on what it carries
        ref.stream(**{**args, "shuffle_seed": 4}, resume_state=old)


def test_mixture_states_of_earlier_releases_still_resume(caches: dict[str, Any]) -> None:
    mixture = Mixture([caches["a"], caches["b"]], weights=[2, 1])
    stream = mixture.stream(shuffle=True, shuffle_seed=3)
    epoch = xs(stream)
    new = stream.state_dict(40)
    old = {key: value for key, value in new.items() if key not in (*LEGACY, "rotate", "builds", "windows")}
    assert xs(mixture.stream(shuffle=True, shuffle_seed=3, resume_state=old)) == epoch[40:]


# -- numbers out of range, values of the wrong type ---------------------------------------------------
def single_state(mode: str) -> tuple[ReadSchedule, dict[str, Any]]:
    base = layout([10] * 9, "a")
    options = ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode=mode, num_shards=2)
    s = ReadSchedule(90, options, base)
    return s, s.state(s.start, 12)


def resume(mode: str, state: dict[str, Any]) -> ReadSchedule:
    base = layout([10] * 9, "a")
    return ReadSchedule(
        90, ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode=mode, num_shards=2, resume_state=state), base
    )


@pytest.mark.parametrize(
    ("mode", "edit", "match"),
    [
        ("parts", {"dealt": -1}, "dealt=-1 is out of range"),
        ("parts", {"dealt": 10**6}, "dealt=1000000 is out of range"),
        ("parts", {"window": 0}, "window=0 is out of range"),
        ("parts", {"parts_order": 3}, "parts_order=3 is out of range"),
        ("parts", {"consumed": 46}, "consumed=46 is out of range: this reader takes 0 to 45"),
        ("parts", {"num_shards": 0}, "is not valid"),
        ("parts", {"parts_window": 0}, "parts_window must be a positive integer"),
        ("shard", {"consumed": 46}, "consumed=46 is out of range: this reader takes 0 to 45"),
        ("shard", {"consumed": 10**10}, "consumed=10000000000 is out of range"),
        ("global", {"consumed": 91}, "consumed=91 is out of range: this reader takes 0 to 90"),
        ("global", {"epoch": 2**60}, "epoch=1152921504606846976 is out of range"),
        ("global", {"shuffle": "yes"}, "shuffle must be bool, got 'yes'"),
        ("global", {"reshuffle_each_epoch": 1}, "reshuffle_each_epoch must be bool, got 1"),
        ("global", {"build": 5}, "build must be str, got 5"),
        ("global", {"epoch": -1}, "must not be negative"),
    ],
)
def test_numbers_out_of_range_and_values_of_the_wrong_type_are_refused(
    mode: str, edit: dict[str, Any], match: str
) -> None:
    _, state = single_state(mode)
    with pytest.raises(ResumeStateError, match=match):
        resume(mode, {**state, **edit})


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"consumed": 191}, "consumed=191 is out of range: this mixture takes 0 to 190"),
        ({"windows": [[[0, 0]], [[1, 4]]]}, "windows must be one list of"),
        ({"windows": [[[1, 4], [0, 4]], []]}, "windows must be one list of"),
        ({"windows": [[]]}, "windows must be one list of"),
        ({"builds": ["a-0"]}, "builds must be one build id per component"),
        ({"rotate": "no"}, "rotate must be bool"),
    ],
)
def test_a_mixture_state_out_of_range_is_refused(edit: dict[str, Any], match: str) -> None:
    saved = mixture_schedule(None)
    state = saved.state(saved.start, 70)
    with pytest.raises(ResumeStateError, match=match):
        mixture_schedule(None, {**state, **edit})


# -- Grain's checkpoint check: reprs fingerprint the order ---------------------------------------------
def test_grain_sampler_reprs_name_what_decides_the_order(caches: dict[str, Any]) -> None:
    grain_adapter = pytest.importorskip("yogacache.grain")
    sampler = grain_adapter.CacheSampler
    mixture = Mixture([caches["a"], caches["b"]], weights=[2, 1])
    base = {"shuffle": True, "shuffle_seed": 3, "shard_rank": 0, "num_shards": 2}

    def shown(source: Any, **kwargs: Any) -> str:
        return repr(sampler(source, **{**base, **kwargs}))

    parts = shown(caches["a"], shuffle_mode="parts")
    assert parts == shown(caches["a"], shuffle_mode="parts")  # the same order, the same repr
    assert "0x" not in parts
    different = [
        shown(caches["a"], shuffle_mode="parts", parts_window=2),
        shown(caches["a"], shuffle_mode="parts", ranks_per_node=2),
        shown(caches["a"], shuffle_mode="parts", skip_shuffle_at_epoch_end=True),
        shown(caches["a"], shuffle_mode="parts", drop_shard_remainder=True),
    ]
    assert parts not in different and len(set(different)) == len(different)
    weighted = shown(mixture, shuffle_mode="global")
    reweighted = shown(Mixture([caches["a"], caches["b"]], weights=[1, 1]), shuffle_mode="global")
    assert weighted != reweighted


def test_grain_refuses_a_checkpoint_of_another_order(caches: dict[str, Any]) -> None:
    grain = pytest.importorskip("grain")
    from absl import flags

    from yogacache.grain import CacheDataSource, CacheSampler

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    source = CacheDataSource(caches["a"])

    def loader(**kwargs: Any) -> Any:
        sampler = CacheSampler(source, shuffle=True, shuffle_seed=3, shuffle_mode="parts", **kwargs)
        return grain.DataLoader(data_source=source, sampler=sampler, worker_count=0)

    iterator = iter(loader())
    head = [int(next(iterator)["x"]) for _ in range(10)]
    state = iterator.get_state()
    rest = [int(element["x"]) for element in iterator]
    same = iter(loader())
    same.set_state(state)
    assert [int(element["x"]) for element in same] == rest and len(head + rest) == N
    other = iter(loader(parts_window=2))
    with pytest.raises(ValueError):
        other.set_state(state)
