"""The TensorFlow read path at its edges: zero-size leaves, and datasets that are dropped."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from yogacache.dataref import CacheDataRef
from yogacache.errors import UnsupportedDatasetError
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

ZERO_SIZE = r"""
import sys
import numpy as np
import tensorflow as tf
from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

store = CacheStore(sys.argv[1])
store.build("all", "v1", tf.data.Dataset.from_tensor_slices(np.zeros((4, 0, 3))))
store.build("mixed", "v1", tf.data.Dataset.range(5).map(
    lambda x: {"x": x, "empty": tf.zeros([2, 0], tf.float32), "s": tf.strings.as_string(x)}))
got = list(make_tf_dataset(CacheDataRef(store.open("all", "v1")).stream()).as_numpy_iterator())
assert len(got) == 4 and all(a.shape == (0, 3) and a.dtype == np.float64 for a in got), got
dataset = make_tf_dataset(CacheDataRef(store.open("mixed", "v1")).stream(shuffle=True, shuffle_seed=1))
mixed = list(dataset.batch(2).as_numpy_iterator())
assert sorted(int(x) for batch in mixed for x in batch["x"]) == list(range(5)), mixed
assert all(batch["empty"].shape[1:] == (2, 0) for batch in mixed), mixed
assert all(s == str(x).encode() for batch in mixed for x, s in zip(batch["x"], batch["s"])), mixed
assert dataset.element_spec["empty"] == tf.TensorSpec([2, 0], tf.float32)
print("ok")
"""


def test_zero_size_leaves_read_through_tensorflow_without_crashing(tmp_path: Path) -> None:
    # A subprocess: TensorFlow's unbatch kills the interpreter (SIGSEGV) on zero-size batches.
    result = subprocess.run(
        [sys.executable, "-c", ZERO_SIZE, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert result.stdout.strip().endswith("ok")


def _open_files_under(directory: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


def test_dropping_a_dataset_releases_its_reader_and_files(tmp_path: Path) -> None:
    store = CacheStore(tmp_path)
    store.build("drop", "v1", tf.data.Dataset.range(3000).map(lambda x: (x, tf.fill([50], x))))
    reader = store.open("drop", "v1")
    reader_ref = weakref.ref(reader)
    dataset = make_tf_dataset(CacheDataRef(reader).stream(shuffle=True, shuffle_seed=3)).batch(64)
    iterator = iter(dataset)
    assert int(next(iterator)[1].shape[0]) == 64
    assert _open_files_under(tmp_path), "the reader holds its parts open while in use"
    del reader, dataset, iterator
    gc.collect()
    assert reader_ref() is None, "a dropped dataset must not keep its reader alive"
    assert _open_files_under(tmp_path) == []


def test_an_iterator_outlives_the_dataset_object_it_came_from(tmp_path: Path) -> None:
    store = CacheStore(tmp_path)
    store.build("outlive", "v1", tf.data.Dataset.range(2000))
    iterator = iter(make_tf_dataset(CacheDataRef(store.open("outlive", "v1")).stream()).batch(100))
    gc.collect()
    assert np.concatenate([batch.numpy() for batch in iterator]).tolist() == list(range(2000))


def _batches(dataset: tf.data.Dataset) -> list[list[list[int]]]:
    return [[batch["x"].numpy().tolist(), batch["v"].numpy().tolist()] for batch in dataset]


def test_batch_rebatches_the_reads_with_batch_semantics(tmp_path: Path) -> None:
    """``batch`` on a yogacache dataset rebatches whole reads; it must equal plain batching."""
    store = CacheStore(tmp_path)
    store.build("rb", "v1", tf.data.Dataset.range(1000).map(lambda x: {"x": x, "v": tf.fill([2], x)}))
    reader = store.open("rb", "v1")
    for kwargs in ({}, {"shuffle": True, "shuffle_seed": 3, "start_offset": 130, "num_shards": 3}):
        for size, drop in ((7, False), (64, True), (1000, False)):
            # Two streams: each iteration of a stream is its next epoch.
            batched = make_tf_dataset(CacheDataRef(reader).stream(**kwargs)).batch(size, drop_remainder=drop)
            dataset = make_tf_dataset(CacheDataRef(reader).stream(**kwargs))
            plain = tf.data.Dataset.batch(dataset, size, drop_remainder=drop)  # the unbatched path
            assert "Rebatch" in type(batched._input_dataset).__name__ + type(batched).__name__
            assert batched.element_spec == plain.element_spec
            assert int(batched.cardinality()) == int(plain.cardinality())
            for _ in range(2):  # the (resumed) first epoch, then a whole one
                assert _batches(batched) == _batches(plain)


def test_a_deeply_nested_tf_element_is_refused_with_a_message(tmp_path: Path) -> None:
    element: object = tf.constant(1)
    for _ in range(150):
        element = (element,)
    dataset = tf.data.Dataset.from_tensors(element)
    with pytest.raises(UnsupportedDatasetError, match="levels deep"):
        CacheStore(tmp_path).build("deep", "v1", dataset)
    assert not CacheStore(tmp_path).exists("deep", "v1")


def test_a_stream_has_one_epoch_counter_however_it_is_iterated(tmp_path: Path) -> None:
    """Python iteration, batches and a tf.data dataset of one stream each take the next epoch."""
    store = CacheStore(tmp_path)
    store.build("one", "v1", tf.data.Dataset.range(300))
    reader = store.open("one", "v1")

    def epochs(count: int) -> list[list[int]]:
        stream = CacheDataRef(reader).stream(shuffle=True, shuffle_seed=9)
        return [[int(x) for x in stream] for _ in range(count)]

    want = epochs(3)
    assert want[0] != want[1] != want[2]
    stream = CacheDataRef(reader).stream(shuffle=True, shuffle_seed=9)
    first = [int(x) for x in stream]
    second = [int(x) for batch in stream.batch_iterator_fn() for x in batch[0]]
    third = [int(x) for x in make_tf_dataset(stream).as_numpy_iterator()]
    assert [first, second, third] == want
