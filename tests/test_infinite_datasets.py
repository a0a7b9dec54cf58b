"""A tf.data pipeline that repeats forever upstream is refused before anything is written,
even when its cardinality is UNKNOWN (issue 9.14); finite pipelines of unknown cardinality build."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import tensorflow as tf

from yogacache.errors import UnsupportedDatasetError
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.tensorflow import TFDatasetSource

R = tf.data.Dataset.range


def below_three(x: tf.Tensor) -> tf.Tensor:
    return x < 3


def forever(_: tf.Tensor) -> tf.data.Dataset:
    return R(2).repeat()


INFINITE: dict[str, Callable[[], tf.data.Dataset]] = {
    "repeat-filter": lambda: R(5).repeat().filter(below_three),
    "repeat-filter-map-batch": lambda: R(5).repeat().filter(below_three).map(lambda x: x * 2).batch(2),
    "interleave-of-repeat": lambda: R(3).interleave(forever, cycle_length=2),
    "flat-map-of-interleave-of-repeat": lambda: R(2).flat_map(lambda _: R(3).interleave(forever, cycle_length=2)),
    "concatenate-with-repeat-filter": lambda: R(4).concatenate(R(5).repeat().filter(below_three)),
    "zip-of-two-infinite": lambda: tf.data.Dataset.zip((R(5).repeat().filter(below_three), R(3).repeat())),
}

FINITE: dict[str, tuple[Callable[[], tf.data.Dataset], int]] = {
    "filter": (lambda: R(10).filter(below_three), 3),
    "repeat-take-filter": (lambda: R(5).repeat().take(12).filter(below_three), 8),
    "repeat-take-while": (lambda: R(5).repeat().take_while(below_three), 3),
    "zip-with-a-finite-one": (lambda: tf.data.Dataset.zip((R(5).repeat().filter(below_three), R(4))), 4),
    "counted-repeat-filter": (lambda: R(5).repeat(2).filter(below_three), 6),
    "interleave-of-bounded-repeat": (lambda: R(2).interleave(lambda _: R(3).repeat().take(2)), 4),
}


@pytest.mark.parametrize("name", sorted(INFINITE))
def test_infinite_upstream_is_refused_before_writing(name: str, tmp_path: Path) -> None:
    dataset = INFINITE[name]()
    assert int(dataset.cardinality()) in (int(tf.data.UNKNOWN_CARDINALITY), int(tf.data.INFINITE_CARDINALITY))
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    with pytest.raises(UnsupportedDatasetError, match=r"infinite: it repeats forever .*repeat\(\) with no count"):
        storage.submit(dataset, "ds", "1")
    # Refused before a build directory was made.
    assert not any(p.name.startswith(".1") and ".tmp-" in p.name for p in (tmp_path / "ds").glob("*"))
    assert not (tmp_path / "ds" / "1").exists()


def test_refused_in_cacheable_without_iterating(tmp_path: Path) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))

    @storage.cacheable("ds", "1")
    def make() -> tf.data.Dataset:
        return R(5).repeat().filter(below_three)

    with pytest.raises(UnsupportedDatasetError, match="Cache the finite dataset"):
        make()


@pytest.mark.parametrize("name", sorted(FINITE))
def test_finite_pipelines_of_unknown_cardinality_still_build(name: str) -> None:
    make, count = FINITE[name]
    source = TFDatasetSource(make())
    assert sum(len(batch) for batch in source.encoded_batches()) == count


def test_unknown_length_builds_keep_a_reserve_of_free_disk() -> None:
    from yogacache.format.writer import unknown_length_bound

    gib = 1 << 30
    assert unknown_length_bound(free=500 * gib, total=1000 * gib) == 450 * gib  # 5% of the disk kept
    assert unknown_length_bound(free=10 * gib, total=20 * gib) == 9 * gib  # at least 1 GiB kept
    # Little free space: the writer's own free-space check is the bound.
    assert unknown_length_bound(free=gib, total=20 * gib) is None
    assert unknown_length_bound(free=0, total=20 * gib) is None


def test_only_unknown_length_builds_get_the_default_bound(tmp_path: Path) -> None:
    import shutil

    from yogacache.format.writer import BuildLimits, unknown_length_bound

    usage = shutil.disk_usage(tmp_path)
    bounded = BuildLimits(max_records=7).for_unknown_length(tmp_path / "not" / "made" / "yet")
    assert bounded.max_records == 7
    expected = unknown_length_bound(usage.free, usage.total)
    if expected is None:
        assert bounded.max_bytes is None
    else:
        assert bounded.max_bytes is not None and abs(bounded.max_bytes - expected) <= 64 << 20
    assert BuildLimits(max_bytes=123).for_unknown_length(tmp_path).max_bytes == 123  # an explicit limit wins

