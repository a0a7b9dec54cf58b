"""Mixtures of caches read as one (``yogacache.mixture``), against real caches on disk.

Three small caches, two in a shared_fs store and one in the local default store, built through
``DataLayer.cache_dataset``: ``a`` (300 records, ids 0…), ``b`` (120, ids 10000…) and ``c``
(40, ids 20000…); a record's id says its component (``id // 10000``) and its record. Every
check compares what the mixture reads with what its counts, passes and mixed order promise:
the counts of each epoch, draws without replacement within a pass, the interleaving, shards,
resumes (elastic, torch, tf.data) and the one-line errors of bad input.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import numpy as np
import pytest

from yogacache import ConfigError, DataLayer
from yogacache.format.sources import AnnotatedSource
from yogacache.format.spec import infer_spec
from yogacache.mixture import Component, Mixture
from yogacache.read.mixture_order import apportion

SIZES = {"a": 300, "b": 120, "c": 40}
BASES = {"a": 0, "b": 10000, "c": 20000}
NAMES = ("a", "b", "c")


def records(name: str, n: int | None = None) -> list[dict[str, Any]]:
    base, n = BASES[name], SIZES[name] if n is None else n
    return [{"x": np.int64(base + i), "v": np.array([base + i, -(base + i)], np.float32)} for i in range(n)]


class Caches:
    """The test caches: refs by name, the layers that hold them, their directories."""

    def __init__(self, root: Path) -> None:
        self.shared_config = {"type": "shared_fs", "host_storage_path": str(root / "shared")}
        self.shared = DataLayer(self.shared_config, show_progress=False)
        with pytest.MonkeyPatch.context() as patch:  # the local default store, in this module's tmp dir
            patch.setenv("YOGACACHE_HOME", str(root / "home"))
            patch.setenv("YOGACACHE_STATE_DIR", str(root / "state"))
            self.local = DataLayer(show_progress=False)
            self.refs = {}
            for name in NAMES:
                layer = self.local if name == "b" else self.shared
                self.refs[name] = layer.cache_dataset(name, "v1")(lambda name=name: records(name))()
        self.dirs = {name: str(ref.reader.directory) for name, ref in self.refs.items()}

    def __getitem__(self, name: str) -> Any:
        return self.refs[name]

    @property
    def all(self) -> list[Any]:
        return [self.refs[name] for name in NAMES]


@pytest.fixture(scope="module")
def caches(tmp_path_factory: pytest.TempPathFactory) -> Caches:
    return Caches(tmp_path_factory.mktemp("mixture"))


def ids(elements: Iterable[Any]) -> list[int]:
    """Record ids of stream elements (numpy dicts), after checking each one's values."""
    out = []
    for element in elements:
        x = int(element["x"])
        assert element["v"].tolist() == [x, -x]
        out.append(x)
    return out


def component(record: int) -> int:
    return record // 10000


def epochs(stream: Any, count: int) -> list[list[int]]:
    return [ids(stream) for _ in range(count)]


def per_component(order: Sequence[int], components: int = 3) -> list[int]:
    counts = collections.Counter(component(r) for r in order)
    return [counts[i] for i in range(components)]


# -- 1. counts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch_size", [1000, 461, 333, 7, 1])
def test_weights_share_the_epoch_within_one_record(caches: Caches, epoch_size: int) -> None:
    weights = [0.7, 0.2, 0.1]
    mixture = Mixture(caches.all, weights=weights, epoch_size=epoch_size)
    assert len(mixture) == mixture.epoch_size == sum(mixture.counts) == epoch_size
    for count, weight in zip(mixture.counts, weights):
        assert abs(count - weight * epoch_size) < 1
    assert per_component(ids(mixture.stream(shuffle=True, shuffle_seed=1))) == list(mixture.counts)


def test_the_default_epoch_size_is_every_record_once(caches: Caches) -> None:
    total = sum(SIZES.values())
    weighted = Mixture(caches.all, weights=[0.7, 0.2, 0.1])
    assert len(weighted) == total and weighted.counts == (322, 92, 46)  # 0.7 · 460 = 322, ...
    natural = Mixture(caches.all)  # no weights: each weighs its records, every record once
    assert len(natural) == total and natural.counts == tuple(SIZES[name] for name in NAMES)
    stream = natural.stream(shuffle=True, shuffle_seed=2)
    assert len(stream) == total and sorted(ids(stream)) == sorted(
        r for name in NAMES for r in range(BASES[name], BASES[name] + SIZES[name])
    )
    with pytest.raises(
        ValueError, match="component 1 has no weight and others have: give every component a weight, or none"
    ):
        Mixture([Component(caches["a"], weight=2), caches["b"]])


def test_repeat_and_samples_are_absolute_counts(caches: Caches) -> None:
    mixture = Mixture(
        [Component(caches["a"], repeat=0.5), Component(caches["b"], samples=50), Component(caches["c"], repeat=2.0)]
    )
    assert mixture.counts == (150, 50, 80) and len(mixture) == 280
    stream = mixture.stream(shuffle=True, shuffle_seed=3)
    assert len(stream) == 280
    for order in epochs(stream, 2):
        assert per_component(order) == [150, 50, 80]
    # A component of an absolute mixture without a share reads once through per epoch.
    assert Mixture([caches["a"], Component(caches["c"], repeat=3)]).counts == (300, 120)


def test_stopping_first_exhausted_takes_no_component_past_one_pass(caches: Caches) -> None:
    weights = [0.2, 0.3, 0.5]
    mixture = Mixture(caches.all, weights=weights, stopping="first_exhausted")
    sizes = [SIZES[name] for name in NAMES]
    total = len(mixture)
    assert all(count <= size for count, size in zip(mixture.counts, sizes))
    assert mixture.counts == (16, 24, 40)  # c, the first to run out, is read through once: the epoch ends
    assert tuple(apportion(total, weights)) == mixture.counts
    order = ids(mixture.stream(shuffle=True, shuffle_seed=4))
    assert len(order) == total and len(set(order)) == total  # no record twice


def test_stopping_all_exhausted_takes_every_component_through_once(caches: Caches) -> None:
    weights = [0.7, 0.2, 0.1]
    mixture = Mixture(caches.all, weights=weights, stopping="all_exhausted")
    sizes = [SIZES[name] for name in NAMES]
    total = len(mixture)
    assert all(count >= size for count, size in zip(mixture.counts, sizes))
    assert mixture.counts == (420, 120, 60)  # b, the last to run out, is read through once: the epoch ends
    assert tuple(apportion(total, weights)) == mixture.counts
    order = ids(mixture.stream(shuffle=True, shuffle_seed=4))
    every = {BASES[name] + i for name in NAMES for i in range(SIZES[name])}
    assert len(order) == total and set(order) == every


def test_describe_names_each_component_with_its_share(caches: Caches) -> None:
    mixture = Mixture(
        [Component(caches["a"], repeat=1), Component(caches["b"], samples=60), Component(caches["c"], repeat=2)]
    )
    lines = mixture.describe().splitlines()
    assert lines == [
        "mixture of 3 caches, 440 records per epoch:",
        "  a:v1: 300 records (68.18%), 1 passes of 300",
        "  b:v1: 60 records (13.64%), 0.5 passes of 120",
        "  c:v1: 80 records (18.18%), 2 passes of 40",
    ]
    assert mixture.names == ("a:v1", "b:v1", "c:v1")
    assert repr(mixture) == "Mixture(a:v1=300, b:v1=60, c:v1=80; epoch_size=440)"


# -- 2. order -------------------------------------------------------------------------------------


def passes_of(orders: Sequence[Sequence[int]], name: str) -> list[list[int]]:
    """Component ``name``'s records, across epochs in reading order, cut into passes."""
    base, size = BASES[name], SIZES[name]
    drawn = [r - base for order in orders for r in order if component(r) == base // 10000]
    return [drawn[q : q + size] for q in range(0, len(drawn), size)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_epoch_takes_its_counts_and_each_pass_every_record_once(caches: Caches, shuffle: bool) -> None:
    # a downsampled (0.5: two epochs per pass), b one pass, c upsampled 2.5 times.
    mixture = Mixture(
        [Component(caches["a"], repeat=0.5), Component(caches["b"], repeat=1), Component(caches["c"], repeat=2.5)]
    )
    assert mixture.counts == (150, 120, 100)
    orders = epochs(mixture.stream(shuffle=shuffle, shuffle_seed=5, skip_shuffle_at_epoch_end=not shuffle), 4)
    for order in orders:
        assert per_component(order) == [150, 120, 100]
    for name in NAMES:
        passes = passes_of(orders, name)
        for each in passes[:-1] if len(passes[-1]) < SIZES[name] else passes:
            assert sorted(each) == list(range(SIZES[name])), name  # every record once per pass
    # Downsampled: epochs 0 and 1 together read each record of a once, and so do 2 and 3.
    a_records = [[r for r in order if component(r) == 0] for order in orders]
    assert sorted(a_records[0] + a_records[1]) == list(range(300)) == sorted(a_records[2] + a_records[3])
    assert not set(a_records[0]) & set(a_records[1])


def windows(order: Sequence[int], length: int, step: int = 1) -> Iterable[list[int]]:
    for start in range(0, len(order) - length + 1, step):
        yield per_component(order[start : start + length])


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_window_mixes_every_component(caches: Caches, shuffle: bool) -> None:
    """No one-stream-at-a-time runs: each window of 100 records holds each component's share
    of it within docs/mixtures.md's bound, ``2 + 2·(K - 2)·c_i / E`` (3.4, 2.4 and 2.2 records
    for 70/20/10; half that unshuffled), as the stream reads it (MosaicML's streams without
    shuffle read one after another)."""
    mixture = Mixture(caches.all, weights=[0.7, 0.2, 0.1], epoch_size=2000)
    bounds = [(2 + 2 * weight) / (1 if shuffle else 2) for weight in (0.7, 0.2, 0.1)]
    for seed in range(3):
        order = ids(mixture.stream(shuffle=shuffle, shuffle_seed=seed))
        for counts in windows(order, 100):
            for count, weight, bound in zip(counts, [0.7, 0.2, 0.1], bounds):
                assert abs(count - weight * 100) <= bound, counts
        for counts in windows(order, 10):
            assert counts[0] >= 5  # a run of ten without the 70% component never happens


REPLAY = textwrap.dedent(
    """
    import json, sys
    from yogacache.mixture import Mixture
    dirs, seed = json.loads(sys.argv[1]), int(sys.argv[2])
    stream = Mixture(dirs, weights=[0.7, 0.2, 0.1], epoch_size=500).stream(shuffle=True, shuffle_seed=seed)
    print(json.dumps([[int(e["x"]) for e in stream] for _ in range(2)]))
    """
)


def test_the_order_is_the_same_in_another_process(caches: Caches) -> None:
    dirs = [caches.dirs[name] for name in NAMES]
    mine = epochs(Mixture(dirs, weights=[0.7, 0.2, 0.1], epoch_size=500).stream(shuffle=True, shuffle_seed=8), 2)
    result = subprocess.run(
        [sys.executable, "-c", REPLAY, json.dumps(dirs), "8"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == mine
    assert mine[0] != mine[1]


def test_the_order_is_a_function_of_seed_and_epoch(caches: Caches) -> None:
    mixture = Mixture(caches.all, weights=[0.5, 0.3, 0.2], epoch_size=400)
    seven = epochs(mixture.stream(shuffle=True, shuffle_seed=7), 2)
    assert epochs(mixture.stream(shuffle=True, shuffle_seed=7), 2) == seven  # a fresh stream: the same
    other = epochs(mixture.stream(shuffle=True, shuffle_seed=70), 2)
    assert other[0] != seven[0] and other[1] != seven[1]
    interleaving = [[component(r) for r in order] for order in seven]
    assert interleaving[0] != interleaving[1]  # reshuffled each epoch: the mix too
    # skip_shuffle_at_epoch_end: one interleaving every epoch.
    fixed = epochs(mixture.stream(shuffle=True, shuffle_seed=7, skip_shuffle_at_epoch_end=True), 3)
    assert [component(r) for r in fixed[0]] == [component(r) for r in fixed[1]] == [component(r) for r in fixed[2]]
    # ... and with whole passes (repeat 1 and 2) the same records in the same order.
    whole = Mixture([Component(caches["a"], repeat=1), Component(caches["c"], repeat=2)])
    same = epochs(whole.stream(shuffle=True, shuffle_seed=7, skip_shuffle_at_epoch_end=True), 3)
    assert same[0] == same[1] == same[2]
    assert same[0] != sorted(same[0])
    changing = epochs(whole.stream(shuffle=True, shuffle_seed=7), 2)
    assert changing[0] != changing[1] and sorted(changing[0]) == sorted(changing[1])


# -- 3. shards and resume ----------------------------------------------------------------------------


def dealt(shards: Sequence[Sequence[int]]) -> list[int]:
    """The mixed order ranks' shards come from: rank r reads positions r, r+S, ..."""
    out: list[int] = []
    for j in range(max(map(len, shards))):
        out.extend(shard[j] for shard in shards if j < len(shard))
    return out


@pytest.mark.parametrize("drop", [False, True])
def test_ranks_shards_partition_the_mixed_order(caches: Caches, drop: bool) -> None:
    mixture = Mixture(caches.all, weights=[0.6, 0.3, 0.1], epoch_size=403)
    args = {"shuffle": True, "shuffle_seed": 9, "drop_shard_remainder": drop}
    whole = epochs(mixture.stream(**args), 2)
    for num_shards in range(1, 5):
        streams = [mixture.stream(shard_rank=r, num_shards=num_shards, **args) for r in range(num_shards)]
        shards = [epochs(stream, 2) for stream in streams]
        for epoch in range(2):
            mine = [shard[epoch] for shard in shards]
            kept = 403 - 403 % num_shards if drop else 403
            assert dealt(mine) == whole[epoch][:kept]
            assert sum(map(len, mine)) == kept
            assert [len(shard) for shard in mine] == [len(stream) for stream in streams]
            if drop:
                assert len({len(shard) for shard in mine}) == 1


@pytest.mark.parametrize("before, after", [(2, 3), (3, 1), (4, 2), (1, 4)])
def test_elastic_resume_reads_the_rest_of_the_epoch_exactly_once(caches: Caches, before: int, after: int) -> None:
    mixture = Mixture(
        [Component(caches["a"], repeat=0.5), Component(caches["b"], repeat=1), Component(caches["c"], repeat=2)]
    )
    args = {"shuffle": True, "shuffle_seed": 12}
    whole = epochs(mixture.stream(**args), 2)
    read, states = [], []
    for rank in range(before):
        stream = mixture.stream(shard_rank=rank, num_shards=before, **args)
        it = iter(stream)
        read.extend(ids(next(it) for _ in range(23)))
        states.append(stream.state_dict(23))
    assert all(state == states[0] for state in states)  # every rank at 23 records: one state
    state = states[0]
    assert state["mode"] == "mixture" and state["consumed"] == 23 * before and state["epoch"] == 0
    assert [name for name, _, _ in state["components"]] == ["a:v1", "b:v1", "c:v1"]
    json.dumps(state)
    assert sorted(read) == sorted(whole[0][: 23 * before])
    resumed = [mixture.stream(shard_rank=r, num_shards=after, resume_state=state, **args) for r in range(after)]
    rest = [ids(stream) for stream in resumed]
    assert dealt(rest) == whole[0][23 * before :]  # the rest of the epoch, each record once, in order
    # Then the next epochs are those of an uninterrupted run at the new world size.
    for rank, stream in enumerate(resumed):
        fresh = mixture.stream(shard_rank=rank, num_shards=after, **args)
        assert ids(stream) == epochs(fresh, 2)[1]


def test_a_state_at_the_end_of_an_epoch_resumes_at_the_next(caches: Caches) -> None:
    mixture = Mixture(caches.all, weights=[0.7, 0.2, 0.1], epoch_size=100)
    stream = mixture.stream(shuffle=True, shuffle_seed=1, num_shards=2, shard_rank=0)
    state = stream.state_dict(50)
    assert (state["epoch"], state["consumed"]) == (1, 0)
    later = stream.state_dict(50 + 20)  # counted across epochs
    assert (later["epoch"], later["consumed"]) == (1, 40)
    whole = epochs(mixture.stream(shuffle=True, shuffle_seed=1), 2)
    assert ids(mixture.stream(shuffle=True, shuffle_seed=1, resume_state=later)) == whole[1][40:]


def test_start_offset_skips_this_ranks_first_records(caches: Caches) -> None:
    mixture = Mixture(caches.all, weights=[0.7, 0.2, 0.1], epoch_size=300)
    args = {"shuffle": True, "shuffle_seed": 2, "shard_rank": 1, "num_shards": 2}
    whole = epochs(mixture.stream(**args), 3)
    assert epochs(mixture.stream(start_offset=37, **args), 2) == [whole[0][37:], whole[1]]
    assert ids(mixture.stream(start_offset=150 + 37, **args)) == whole[1][37:]  # into epoch 1


def torch_ids(batches: Iterable[Any]) -> list[int]:
    out: list[int] = []
    for batch in batches:
        x = batch["x"]
        assert batch["v"].tolist() == [[int(i), -int(i)] for i in x]
        out.extend(int(i) for i in x)
    return out


def test_torch_dataloader_reads_the_streams_order_and_resumes_exactly(caches: Caches) -> None:
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    mixture = Mixture(caches.all, weights=[0.7, 0.2, 0.1], epoch_size=300)
    args: dict[str, Any] = {"shuffle": True, "shuffle_seed": 6, "shard_rank": 1, "num_shards": 2}
    expected = epochs(mixture.stream(**args), 2)
    dataset = CacheIterableDataset(mixture, **args)
    loader = CacheDataLoader(dataset, batch_size=16, num_workers=2)
    assert torch_ids(loader) == expected[0]

    first = CacheIterableDataset(mixture, **args)
    loader = CacheDataLoader(first, batch_size=16, num_workers=2)
    taken = []
    for step, batch in enumerate(loader):
        taken.extend(torch_ids([batch]))
        if step == 3:
            state = loader.state_dict()
            break
    assert state["mode"] == "mixture" and state["consumed"] == 2 * 64 and taken == expected[0][:64]
    assert state == mixture.stream(**args).state_dict(64)  # the stream's state, whoever reads

    resumed = CacheIterableDataset(mixture, **args)
    resumed.load_state_dict(state)
    loader = CacheDataLoader(resumed, batch_size=16, num_workers=2)
    assert torch_ids(loader) == expected[0][64:]
    resumed.set_epoch(1)
    assert torch_ids(loader) == expected[1]
    # Elastic: the torch state resumes a stream at another world size.
    rest = [
        ids(mixture.stream(shuffle=True, shuffle_seed=6, shard_rank=r, num_shards=3, resume_state=state))
        for r in range(3)
    ]
    whole = ids(mixture.stream(shuffle=True, shuffle_seed=6))
    assert dealt(rest) == whole[128:]


TF_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf
    import yogacache.read.epochs as epochs
    from yogacache.mixture import Mixture
    from yogacache.tensorflow import make_tf_dataset

    epochs.FULL_READ_RECORDS, epochs.FIRST_READ_RECORDS, epochs.FIRST_READ_BYTES = 32, 8, 0  # many reads
    dirs, root = json.loads(sys.argv[1]), sys.argv[2]
    args = dict(shuffle=True, shuffle_seed=4, shard_rank=1, num_shards=2)

    def dataset():
        mixture = Mixture(dirs, weights=[0.7, 0.2, 0.1], epoch_size=300)
        return mixture, make_tf_dataset(mixture.stream(**args))

    def xs(batches):
        out = []
        for batch in batches:
            x = batch["x"].numpy().tolist()
            assert batch["v"].numpy().tolist() == [[i, -i] for i in x]
            out.extend(x)
        return out

    mixture, plain = dataset()
    stream = mixture.stream(**args)
    expected = [[int(e["x"]) for e in stream] for _ in range(2)]
    got = [xs(plain.batch(10)), xs(plain.batch(10))]  # each iteration of the dataset: the next epoch
    assert got == expected, "tf.data read another order than the stream"

    _, ds = dataset()
    iterator = iter(ds.repeat(2).batch(8))
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    head = xs(next(iterator) for _ in range(7))
    path = checkpoint.save(os.path.join(root, "ckpt", "it"))
    saved = xs(iterator)
    _, again = dataset()
    restored_iterator = iter(again.repeat(2).batch(8))
    tf.train.Checkpoint(iterator=restored_iterator).restore(path).assert_consumed()
    restored = xs(restored_iterator)
    print(json.dumps({"expected": expected, "head": head, "saved": saved, "restored": restored}))
    """
)


def test_tf_data_reads_the_streams_order_and_its_iterator_checkpoint_resumes(caches: Caches, tmp_path: Path) -> None:
    """In a fresh interpreter (TensorFlow imported there alone): make_tf_dataset over a mixture's
    stream yields the stream's records, and a tf.train.Checkpoint of its iterator restores exactly."""
    dirs = [caches.dirs[name] for name in NAMES]
    result = subprocess.run(
        [sys.executable, "-c", TF_SCRIPT, json.dumps(dirs), str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    expected = out["expected"]
    assert len(expected[0]) == 150 and expected[0] != expected[1]
    assert out["head"] == expected[0][:56]
    assert out["saved"] == expected[0][56:] + expected[1]
    assert out["restored"] == out["saved"]


# -- 5. bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "weights, message",
    [
        ([1, -1, 1], r"weights\[1\] must be a finite number >= 0, got -1"),
        ([1, float("nan"), 1], r"weights\[1\] must be a finite number >= 0, got nan"),
        ([float("inf"), 1, 1], r"weights\[0\] must be a finite number >= 0, got inf"),
        ([0, 0, 0.0], "mixture weights are all zero: at least one must be positive"),
        ([1, 1], "weights has 2 entries for 3 mixture components"),
        ("abc", "weights must be a list of numbers, got str"),
        ([1, "x", 1], r"weights\[1\] must be a number, got str"),
    ],
)
def test_bad_weights_are_refused_in_one_line(caches: Caches, weights: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message) as error:
        Mixture(caches.all, weights=weights)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda r: Mixture([Component(r["a"], weight=1), r["b"]], weights=[1, 1]),
            "pass weights= or a share on each Component, not both",
        ),
        (
            lambda r: Mixture([Component(r["a"], weight=1), Component(r["b"], repeat=2)]),
            "component 0 has a weight and others repeat or samples",
        ),
        (
            lambda r: Mixture([Component(r["a"], repeat=1), Component(r["b"], repeat=1)], epoch_size=10),
            "epoch_size applies to weights",
        ),
        (
            lambda r: Mixture([Component(r["a"], samples=5), r["b"]], stopping="all_exhausted"),
            "stopping='all_exhausted' applies to weights",
        ),
        (
            lambda r: Mixture([r["a"], r["b"]], epoch_size=10, stopping="first_exhausted"),
            "pass epoch_size or stopping='first_exhausted', not both",
        ),
        (
            lambda r: Mixture([r["a"], r["b"]], stopping="longest"),
            r"stopping must be one of \('first_exhausted', 'all_exhausted'\) or None, got 'longest'",
        ),
        (lambda r: Mixture([r["a"], r["b"]], epoch_size=0), "epoch_size must be at least 1, got 0"),
        (
            # issue 33: an OverflowError; the epoch that would read b once is 10^20 records long
            lambda r: Mixture([r["a"], r["b"]], weights=[1, 1e-18], stopping="all_exhausted"),
            r"stopping='all_exhausted' makes an epoch of about 1e20 records: component 1 \(120 records\) at "
            r"weight 1e-18 is read once through only in an epoch that long, more than the 4,294,967,296 records",
        ),
        (
            lambda r: Mixture([r["a"], r["b"]], epoch_size=2**40),
            r"epoch_size 1,099,511,627,776 is more than the 4,294,967,296 records \(2\*\*32\)",
        ),
        (
            lambda r: Mixture([Component(r["a"], repeat=0), Component(r["b"], samples=0)]),
            "every mixture component takes 0 records per epoch",
        ),
        (lambda r: Mixture([Component(r["a"], repeat=-1)]), "repeat must be a finite number >= 0, got -1"),
        (lambda r: Mixture([Component(r["a"], samples=-3)]), "samples must not be negative, got -3"),
        (
            lambda r: Mixture([Component(r["a"], weight=1, repeat=2)]),
            "takes one of weight, repeat and samples, got weight and repeat",
        ),
        (lambda r: Mixture([]), "a mixture needs at least one component"),
        (lambda r: Mixture(r["a"]), "components must be a list of caches"),
        (lambda r: Mixture([Mixture([r["a"], r["b"]])]), "a mixture's component is one cache, not another mixture"),
        (
            lambda r: Mixture([42]),
            "a mixture component is a CacheDataRef, a CacheReader, a cache directory or a function",
        ),
    ],
)
def test_bad_shares_are_refused_in_one_line(caches: Caches, make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message) as error:
        make(caches.refs)
    assert "\n" not in str(error.value)
    # Nothing lost: the caches read as before.
    assert ids(caches["c"].stream()) == list(range(20000, 20040))


class EmptySource:
    """A record source of no records with a known element spec (a list cannot say its spec)."""

    kind = "python"
    cardinality: Optional[int] = 0

    def spec(self) -> Any:
        return infer_spec(records("c", 1)[0])

    def encoded_batches(self) -> Iterator[list[bytes]]:
        return iter(())


def test_an_empty_component_is_refused(caches: Caches, tmp_path: Path) -> None:
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, show_progress=False)
    empty = layer.cache_dataset("empty", "v1")(lambda: AnnotatedSource(EmptySource(), {}))()
    assert len(empty.reader) == 0 and empty.reader.spec == caches["a"].reader.spec
    with pytest.raises(ValueError, match="mixture component 1 has no records: leave it out"):
        Mixture([caches["a"], empty])
    with pytest.raises(ValueError, match="mixture component 0 has no records"):
        Mixture([Component(empty, samples=3), Component(caches["a"], samples=3)])


def test_components_with_different_specs_are_refused_naming_both(caches: Caches, tmp_path: Path) -> None:
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, show_progress=False)
    other = layer.cache_dataset("wide", "v3")(
        lambda: [{"x": np.int64(i), "v": np.zeros(3, np.float32)} for i in range(5)]
    )()
    with pytest.raises(ValueError, match="mixture components a:v1 and wide:v3 have different element specs") as error:
        Mixture([caches["a"], caches["b"], other])
    assert "\n" not in str(error.value)


def test_a_decorated_builder_is_a_component(caches: Caches, tmp_path: Path) -> None:
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, show_progress=False)
    calls = []

    @layer.cache_dataset("c", "v9")
    def more() -> list[dict[str, Any]]:
        calls.append(1)
        return records("c", 10)

    mixture = Mixture([caches["a"], more], weights=[3, 1], epoch_size=40)  # called with no arguments
    assert calls == [1] and mixture.names == ("a:v1", "c:v9") and mixture.counts == (30, 10)
    assert sorted(r for r in ids(mixture.stream(shuffle=True, shuffle_seed=1)) if r >= 20000) == list(
        range(20000, 20010)
    )
    with pytest.raises(TypeError, match="pass the decorated builder"):
        Mixture([caches["a"], layer.cache_dataset("c", "v9")])


@pytest.mark.parametrize(
    "shares, epoch_size, stopping, message",
    [
        ([{"weight": 0}, {"weight": 0.0}], None, None, "mixture weights are all zero"),
        ([{"weight": 1}, {}], None, None, "component 1 has no weight and others have"),
        ([{"samples": 3}, {"weight": 1}], None, None, "component 1 has a weight and others repeat or samples"),
        ([{"weight": 1}, {"weight": 2}], 2**33, None, "epoch_size 8,589,934,592 is more than"),
        ([{"weight": 1}, {"weight": 2}], 5, "all_exhausted", "pass epoch_size or stopping='all_exhausted', not both"),
    ],
)
def test_shares_are_checked_before_a_builder_builds(
    tmp_path: Path, shares: list[dict[str, Any]], epoch_size: Optional[int], stopping: Optional[str], message: str
) -> None:
    """A component's builder may build a cache on a miss: shares that cannot mix are refused
    before it is called (all-zero weights on Components were refused after every build)."""
    layer = DataLayer({"type": "shared_fs", "host_storage_path": str(tmp_path)}, show_progress=False)
    calls = []

    @layer.cache_dataset("c", "v9")
    def more() -> list[dict[str, Any]]:
        calls.append(1)
        return records("c", 10)

    with pytest.raises(ValueError, match=message):
        Mixture([Component(more, **share) for share in shares], epoch_size=epoch_size, stopping=stopping)
    assert calls == []


def test_extreme_but_valid_weights_mix(caches: Caches) -> None:
    """A weight of 1e-18 takes no record of an epoch of first_exhausted (the epoch ends when a
    is through); weights whose float sum overflows share the epoch evenly (they gave negative
    counts)."""
    tiny = Mixture([caches["a"], caches["b"]], weights=[1, 1e-18], stopping="first_exhausted")
    assert tiny.counts == (300, 0)
    assert sorted(ids(tiny.stream(shuffle=True, shuffle_seed=5))) == list(range(300))
    huge = Mixture(caches.all, weights=[1e308, 1e308, 1e308], epoch_size=30)
    assert huge.counts == (10, 10, 10)
    assert per_component(ids(huge.stream(shuffle=True, shuffle_seed=5))) == [10, 10, 10]


def state_of(mixture: Mixture, **args: Any) -> dict[str, Any]:
    return mixture.stream(**args).state_dict(17)


def test_a_component_that_changed_version_is_refused_on_resume(caches: Caches) -> None:
    args = {"shuffle": True, "shuffle_seed": 3}
    state = state_of(Mixture(caches.all, weights=[0.7, 0.2, 0.1]), **args)
    newer = caches.local.cache_dataset("b", "v2")(lambda: records("b"))()  # same records, new version
    changed = Mixture([caches["a"], newer, caches["c"]], weights=[0.7, 0.2, 0.1])
    with pytest.raises(
        ValueError, match="mixture component 1 changed since the checkpoint: it was b:v1, it is b:v2"
    ) as error:
        changed.stream(resume_state=state, **args)
    assert "\n" not in str(error.value)
    # Nothing lost: the state still resumes the mixture it was taken of.
    original = Mixture(caches.all, weights=[0.7, 0.2, 0.1])
    assert ids(original.stream(resume_state=state, **args)) == ids(original.stream(**args))[17:]


@pytest.mark.parametrize(
    "other, message",
    [
        (
            lambda r: Mixture([r["a"], r["b"], r["c"]], weights=[0.6, 0.3, 0.1]),
            r"mixture component 0 \(a:v1\) took 322 records per epoch when the state was taken, it takes 276 now",
        ),
        (
            lambda r: Mixture([r["a"], r["b"], r["c"]], weights=[0.7, 0.2, 0.1], epoch_size=100),
            r"component 0 \(a:v1\) took 322 records per epoch .* it takes 70 now",
        ),
        (
            lambda r: Mixture([r["a"], r["b"]], weights=[0.7, 0.2]),
            "the resume state is of a mixture of 3 components, this one has 2",
        ),
        (
            lambda r: Mixture([r["a"], r["c"], r["b"]], weights=[0.7, 0.1, 0.2]),
            "mixture component 1 changed since the checkpoint: it was b:v1, it is c:v1",
        ),
    ],
)
def test_a_state_of_another_mixture_is_refused(caches: Caches, other: Any, message: str) -> None:
    args = {"shuffle": True, "shuffle_seed": 3}
    state = state_of(Mixture(caches.all, weights=[0.7, 0.2, 0.1]), **args)
    with pytest.raises(ValueError, match=message):
        other(caches.refs).stream(resume_state=state, **args)


def test_a_state_with_another_seed_or_order_is_refused(caches: Caches) -> None:
    mixture = Mixture(caches.all, weights=[0.7, 0.2, 0.1])
    state = state_of(mixture, shuffle=True, shuffle_seed=3)
    saved_seed = "the resume state was saved with shuffle_seed=3, this mixture has shuffle_seed=4"
    with pytest.raises(ValueError, match=saved_seed):
        mixture.stream(shuffle=True, shuffle_seed=4, resume_state=state)
    saved_mode = "the resume state was saved with shuffle_mode='shard', this mixture has shuffle_mode='global'"
    with pytest.raises(ValueError, match=saved_mode):
        mixture.stream(shuffle=True, shuffle_seed=3, shuffle_mode="global", resume_state=state)
    with pytest.raises(ValueError, match=r"mixture resume state has unknown keys \['weights'\]"):
        mixture.stream(shuffle=True, shuffle_seed=3, resume_state={**state, "weights": [1, 2, 3]})
    out_of_range = "the resume state's consumed=9999 is out of range: this mixture takes 0 to 460"
    with pytest.raises(ValueError, match=out_of_range):
        mixture.stream(shuffle=True, shuffle_seed=3, resume_state={**state, "consumed": 9999})


def test_a_single_cache_state_is_refused_by_a_mixture(caches: Caches) -> None:
    state = caches["a"].stream(shuffle=True, shuffle_seed=3, shuffle_mode="global").state_dict(5)
    with pytest.raises(ValueError, match=r"the resume state is for one cache \(shuffle_mode='global'\), not a mixture"):
        Mixture(caches.all).stream(shuffle=True, shuffle_seed=3, shuffle_mode="global", resume_state=state)


def test_a_mixture_state_is_refused_by_a_single_cache(caches: Caches) -> None:
    state = state_of(Mixture(caches.all), shuffle=True, shuffle_seed=3)
    with pytest.raises(ValueError, match="mixture") as error:  # says what the state is, not just its keys
        caches["a"].stream(shuffle=True, shuffle_seed=3, resume_state=state)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "section, message",
    [
        (
            {"components": [{"dataset_id": "a", "dataset_version": "v1"}], "epoch_sise": 5},
            r"unknown mixture keys \['epoch_sise'\]; valid keys: components, epoch_size, stopping",
        ),
        (
            {"components": [{"dataset_id": "a", "dataset_version": "v1", "wieght": 2}]},
            r"unknown mixture.components\[0\] keys \['wieght'\]",
        ),
        ({"components": []}, "mixture.components must be a non-empty list"),
        (
            {"components": [{"dataset_id": "a"}]},
            r"mixture.components\[0\] needs dataset_id and dataset_version strings",
        ),
        (
            {"components": [{"dataset_id": "a", "dataset_version": "v1", "weight": -2}]},
            r"mixture.components\[0\]: weight must be a finite number >= 0, got -2",
        ),
        (
            {"components": [{"dataset_id": "a", "dataset_version": "v1"}], "stopping": "never"},
            "mixture.stopping must be one of",
        ),
        (
            {"components": [{"dataset_id": "a", "dataset_version": "v1", "repeat": 1}], "epoch_size": 9},
            "mixture: epoch_size applies to weights",
        ),
        (["a", "b"], "mixture must be a mapping, got list"),
    ],
)
def test_bad_config_sections_are_refused_in_one_line(caches: Caches, section: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as error:
        Mixture.from_config(section, storage=caches.shared_config)
    assert "\n" not in str(error.value)


def test_a_config_section_reads_as_the_same_mixture(caches: Caches) -> None:
    section = {
        "epoch_size": 200,
        "components": [
            {"dataset_id": "a", "dataset_version": "v1", "weight": 0.75},
            {"dataset_id": "c", "dataset_version": "v1", "weight": 0.25},
        ],
    }
    configured = Mixture.from_config(section, storage=caches.shared_config)
    direct = Mixture([caches["a"], caches["c"]], weights=[0.75, 0.25], epoch_size=200)
    assert configured.counts == direct.counts == (150, 50)
    assert ids(configured.stream(shuffle=True, shuffle_seed=1)) == ids(direct.stream(shuffle=True, shuffle_seed=1))
