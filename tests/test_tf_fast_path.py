"""The tf.data fast paths are taken with the TensorFlow installed, and the fallback is said.

``yogacache.tensorflow`` makes the unbatch of each read and the ``batch`` that rebatches reads
from TensorFlow's private dataset classes (no ``normalize_to_dense`` function traced per
pipeline). A TensorFlow upgrade that moves them falls back to the public methods: the same
elements, slower. This test fails when that happens, so the upgrade is noticed here, not in a
benchmark.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from yogacache import tensorflow as yc_tf  # noqa: E402
from yogacache.dataref import CacheDataRef  # noqa: E402
from yogacache.store.local import CacheStore  # noqa: E402


def _chain(dataset: object) -> list[str]:
    """The dataset classes from this one down to the pipeline's source."""
    names = []
    while dataset is not None:
        names.append(type(dataset).__name__)
        dataset = getattr(dataset, "_input_dataset", None)
    return names


@pytest.fixture
def ref(tmp_path: Path) -> CacheDataRef:
    store = CacheStore(tmp_path / "caches", show_progress=False)
    store.build("fast", "v1", [{"x": np.int64(i), "v": np.full(3, i, dtype=np.float32)} for i in range(100)])
    return CacheDataRef(store.open("fast", "v1"))


def test_the_unbatch_and_the_batch_are_the_fast_ones(ref: CacheDataRef) -> None:
    dataset = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3))
    batched = dataset.batch(8)

    assert yc_tf.FAST_PATHS_MISSED == {}, f"TensorFlow {tf.__version__}: {yc_tf.FAST_PATHS_MISSED}"
    assert "DenseRebatch" in _chain(batched)
    assert "_UnbatchDataset" in _chain(dataset)
    fast = [batch["x"].numpy().tolist() for batch in batched]
    assert sorted(x for batch in fast for x in batch) == list(range(100))
    assert [len(batch) for batch in fast] == [8] * 12 + [4]


def test_a_moved_private_module_falls_back_to_the_same_elements_and_says_so(
    ref: CacheDataRef, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tensorflow.python.data.ops import rebatch_op

    class Moved(rebatch_op._RebatchDataset):  # type: ignore[misc,name-defined]
        """TensorFlow's rebatch as a release that changed it would be to yogacache: usable, not as a base."""

        def __init_subclass__(cls) -> None:
            raise TypeError("_RebatchDataset cannot be subclassed")

    dataset = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3))
    fast = [batch["x"].numpy().tolist() for batch in dataset.batch(8)]
    monkeypatch.setattr(rebatch_op, "_RebatchDataset", Moved)
    monkeypatch.setattr(yc_tf, "FAST_PATHS_MISSED", {})
    with caplog.at_level(logging.WARNING, logger="yogacache"):
        batched = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3)).batch(8)
        slow = [batch["x"].numpy().tolist() for batch in batched]

    assert "DenseRebatch" not in _chain(batched) and "Moved" in _chain(batched)
    assert slow == fast
    assert list(yc_tf.FAST_PATHS_MISSED) == ["batch (rebatch)"]
    assert "fast batch (rebatch)" in caplog.text and "public method is used" in caplog.text


def _traces(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the tf.data functions traced from now on (every ``map``/``flat_map``
    function TensorFlow traces goes through ``StructuredFunctionWrapper``)."""
    from tensorflow.python.data.ops import structured_function

    traced: list[str] = []
    wrapper = structured_function.StructuredFunctionWrapper

    class Counted(wrapper):  # type: ignore[misc,valid-type]
        def __init__(self, func: object, transformation_name: str, *args: object, **kwargs: object) -> None:
            traced.append(transformation_name)
            super().__init__(func, transformation_name, *args, **kwargs)

    monkeypatch.setattr(structured_function, "StructuredFunctionWrapper", Counted)
    return traced


def test_pipelines_of_one_spec_share_their_traced_functions_and_read_their_own_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CacheStore(tmp_path / "caches", show_progress=False)
    for name, first in (("low", 0), ("high", 1000)):
        store.build(name, "v1", [{"x": np.int64(first + i), "v": np.full(3, i, dtype=np.float32)} for i in range(50)])
    monkeypatch.setattr(yc_tf, "_shared_traces", {})
    traced = _traces(monkeypatch)

    low = yc_tf.make_tf_dataset(CacheDataRef(store.open("low", "v1")).stream(shuffle=True, shuffle_seed=1))
    traced_by_the_first = list(traced)
    high = yc_tf.make_tf_dataset(CacheDataRef(store.open("high", "v1")).stream(shuffle=True, shuffle_seed=1))
    # Read side by side: each pipeline's reads go to its own reader.
    pairs = list(zip(low.batch(10), high.batch(10)))

    assert yc_tf.FAST_PATHS_MISSED == {}, f"TensorFlow {tf.__version__}: {yc_tf.FAST_PATHS_MISSED}"
    assert traced_by_the_first == ["Dataset.map()", "Dataset.flat_map()", "Dataset.map()"]
    assert traced == traced_by_the_first, "the second pipeline of the spec traced functions of its own"
    assert "SharedTraceFlatMap" in _chain(high) and "SharedTraceMap" in _chain(high)
    assert sorted(x for a, _ in pairs for x in a["x"].numpy().tolist()) == list(range(50))
    assert sorted(x for _, b in pairs for x in b["x"].numpy().tolist()) == list(range(1000, 1050))
    # A second epoch of each, after both were made: still each its own.
    assert sorted(int(x) for x in high.map(lambda e: e["x"])) == list(range(1000, 1050))


@pytest.mark.parametrize("moved", ["_FlatMapDataset", "_MapDataset"])
def test_where_tensorflow_differs_each_pipeline_traces_its_own_and_says_so(
    ref: CacheDataRef, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, moved: str
) -> None:
    from tensorflow.python.data.ops import flat_map_op, map_op

    module = flat_map_op if moved == "_FlatMapDataset" else map_op

    class Moved(getattr(module, moved)):  # type: ignore[misc]
        """The dataset class as a release that changed it would be to yogacache: usable, not as a base."""

        def __init_subclass__(cls) -> None:
            raise TypeError(f"{moved} cannot be subclassed")

    dataset = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3))
    fast = [batch["x"].numpy().tolist() for batch in dataset.batch(8)]
    monkeypatch.setattr(module, moved, Moved)
    monkeypatch.setattr(yc_tf, "_shared_traces", {})
    monkeypatch.setattr(yc_tf, "FAST_PATHS_MISSED", {})
    traced = _traces(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="yogacache"):
        datasets = [yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3)) for _ in range(2)]
        first_traces = traced.count("Dataset.flat_map()")
        slow = [[batch["x"].numpy().tolist() for batch in dataset.batch(8)] for dataset in datasets]

    assert slow == [fast, fast]
    assert first_traces == 2, traced  # each pipeline its own
    assert "SharedTraceFlatMap" not in _chain(datasets[1])
    assert list(yc_tf.FAST_PATHS_MISSED) == ["pipeline (traced functions shared)"]
    assert "fast pipeline (traced functions shared)" in caplog.text


def test_pipelines_made_in_graphs_share_the_traces_with_eager_ones(ref: CacheDataRef) -> None:
    """A TF1-style ``input_fn`` (an Estimator's) makes its pipeline inside a ``tf.Graph``: the
    shared traces serve pipelines in two graphs and then eagerly, each reading every record."""
    for graph_round in range(2):
        graph = tf.Graph()
        with graph.as_default():
            dataset = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=graph_round)).batch(10)
            following = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
            read: list[int] = []
            with tf.compat.v1.Session(graph=graph) as session:
                with pytest.raises(tf.errors.OutOfRangeError):
                    while True:
                        read.extend(session.run(following)["x"].tolist())
        assert sorted(read) == list(range(100)), f"graph {graph_round}"
    eager = yc_tf.make_tf_dataset(ref.stream(shuffle=True, shuffle_seed=3)).batch(10)
    assert sorted(x for batch in eager for x in batch["x"].numpy().tolist()) == list(range(100))
    assert yc_tf.FAST_PATHS_MISSED == {}
    assert "SharedTraceFlatMap" in _chain(eager)
