"""TensorFlow adapter: tf.data round trips, refusals, epochs, output types/shapes, custom DataRefs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import yogadl

import yogacache
from yogacache.dataref import CacheDataRef
from yogacache.errors import UnsupportedDatasetError
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

NUMERIC_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def random_array(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np_dtype(name)
    count = int(np.prod(shape))
    if name == "bool":
        return rng.integers(0, 2, count).astype(bool).reshape(shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True).reshape(shape)
    # Random bit patterns, NaN payloads included: they must survive bit for bit.
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape).copy()


def store_at(root: Path) -> CacheStore:
    return CacheStore(root, show_progress=False)


def leaves_as_bytes(element: Any) -> list[tuple[str, tuple[int, ...], Any]]:
    """Each leaf's dtype, shape and exact bytes (strings as lists of bytes)."""
    result = []
    for leaf in tf.nest.flatten(element):
        array = np.asarray(leaf)
        if array.dtype == object or array.dtype.kind == "S":
            result.append(("string", array.shape, [bytes(v) for v in array.reshape(-1)]))
        else:
            result.append((array.dtype.name, array.shape, array.tobytes()))
    return result


def assert_same_dataset(rebuilt: tf.data.Dataset, source: tf.data.Dataset) -> None:
    assert rebuilt.element_spec == source.element_spec
    got = [leaves_as_bytes(e) for e in rebuilt.as_numpy_iterator()]
    want = [leaves_as_bytes(e) for e in source.as_numpy_iterator()]
    assert len(got) == len(want)
    assert got == want


def cache_and_read(root: Path, dataset: Any, version: str = "v1") -> tuple[CacheDataRef, tf.data.Dataset]:
    store = store_at(root)
    store.build("tf", version, dataset)
    dataref = CacheDataRef(store.open("tf", version))
    return dataref, make_tf_dataset(dataref.stream())


# -- round trips -------------------------------------------------------------------------------


def test_all_dtypes_nested_round_trip_is_bit_exact(tmp_path: Path) -> None:
    n = 7
    columns = {name: random_array(name, (n, 2, 3), seed=i) for i, name in enumerate(NUMERIC_DTYPES)}
    scalars = {name: random_array(name, (n,), seed=100 + i) for i, name in enumerate(NUMERIC_DTYPES)}
    strings = np.array([f"s{i}-é".encode() + bytes([255, i]) for i in range(n)], dtype=object)
    string_grid = np.array([[b"a" * i, b"", b"\x00z"] for i in range(n)], dtype=object)
    source = tf.data.Dataset.from_tensor_slices(
        {
            "arrays": columns,
            "scalars": scalars,
            "pair": (strings, {"grid": string_grid, "label": np.arange(n, dtype=np.int64)}),
        }
    )
    _, rebuilt = cache_and_read(tmp_path, source)
    assert_same_dataset(rebuilt, source)
    spec = rebuilt.element_spec
    assert spec["arrays"]["bfloat16"].dtype == tf.bfloat16
    assert spec["scalars"]["complex128"].shape == tf.TensorShape([])
    assert spec["pair"][0].dtype == tf.string


@pytest.mark.parametrize("name", NUMERIC_DTYPES)
def test_each_dtype_scalar_dataset(tmp_path: Path, name: str) -> None:
    source = tf.data.Dataset.from_tensor_slices(random_array(name, (5,), seed=3))
    _, rebuilt = cache_and_read(tmp_path, source)
    assert_same_dataset(rebuilt, source)


def test_tuple_elements_and_zero_d_scalars(tmp_path: Path) -> None:
    source = tf.data.Dataset.range(12).map(lambda x: (x, tf.cast(x, tf.float32) / 3, tf.strings.as_string(x)))
    _, rebuilt = cache_and_read(tmp_path, source)
    assert isinstance(rebuilt.element_spec, tuple)
    assert_same_dataset(rebuilt, source)


def test_unknown_dims_from_generator(tmp_path: Path) -> None:
    def generate() -> Iterator[Any]:
        for i in range(9):
            yield {
                "vec": np.arange(i, dtype=np.float32) * 1.5,
                "mat": np.full((i % 3, 2), i, dtype=np.int16),
                "any": np.zeros((1,) * (i % 3), dtype=np.uint8) + i,
                "words": np.array([b"w%d" % j for j in range(i % 4)], dtype=object),
            }

    signature = {
        "vec": tf.TensorSpec((None,), tf.float32),
        "mat": tf.TensorSpec((None, 2), tf.int16),
        "any": tf.TensorSpec(None, tf.uint8),
        "words": tf.TensorSpec((None,), tf.string),
    }
    source = tf.data.Dataset.from_generator(generate, output_signature=signature)
    _, rebuilt = cache_and_read(tmp_path, source)
    assert rebuilt.element_spec == signature
    assert_same_dataset(rebuilt, source)


def test_ragged_length_1d_tensors_via_map(tmp_path: Path) -> None:
    source = tf.data.Dataset.range(10).map(lambda x: {"r": tf.range(x), "s": tf.fill([x % 3], "t")})
    assert source.element_spec["r"].shape.as_list() == [None]
    _, rebuilt = cache_and_read(tmp_path, source)
    assert_same_dataset(rebuilt, source)
    lengths = [len(e["r"]) for e in rebuilt.as_numpy_iterator()]
    assert lengths == list(range(10))


def test_empty_tf_dataset_round_trip(tmp_path: Path) -> None:
    source = tf.data.Dataset.from_tensor_slices({"a": np.zeros((0, 3), np.float32)})
    dataref, rebuilt = cache_and_read(tmp_path, source)
    assert len(dataref) == 0
    assert rebuilt.element_spec == source.element_spec
    assert list(rebuilt.as_numpy_iterator()) == []


# -- refused datasets ---------------------------------------------------------------------------


def _ragged() -> tf.data.Dataset:
    return tf.data.Dataset.range(5).map(lambda x: tf.range(x)).ragged_batch(2)


def _sparse() -> tf.data.Dataset:
    st = tf.sparse.SparseTensor(indices=[[0, 0], [1, 2]], values=[1, 2], dense_shape=[3, 4])
    return tf.data.Dataset.from_tensor_slices(st)


@pytest.mark.parametrize(
    ("make", "kind", "hint"),
    [
        (_ragged, "RaggedTensorSpec", "to_tensor"),
        (_sparse, "SparseTensorSpec", "to_dense"),
        (
            lambda: tf.data.Dataset.zip({"ok": tf.data.Dataset.range(3), "bad": _sparse()}),
            "SparseTensorSpec",
            "'bad'",
        ),
        (lambda: tf.data.Dataset.zip((tf.data.Dataset.range(2), _ragged())), "RaggedTensorSpec", "[1]"),
    ],
    ids=["ragged", "sparse", "sparse-in-dict", "ragged-in-tuple"],
)
def test_ragged_and_sparse_are_refused_up_front(tmp_path: Path, make: Any, kind: str, hint: str) -> None:
    store = store_at(tmp_path)
    with pytest.raises(UnsupportedDatasetError) as info:
        store.build("bad", "v1", make())
    assert kind in str(info.value)
    assert hint in str(info.value)
    assert not store.exists("bad", "v1")
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert written == []
    assert not (tmp_path / "bad" / "v1").exists()


def test_ragged_refused_before_the_dataset_is_iterated(tmp_path: Path) -> None:
    calls = []

    def count(x: Any) -> Any:
        calls.append(1)
        return x

    ragged = (
        tf.data.Dataset.range(4)
        .map(lambda x: tf.py_function(count, [x], tf.int64))
        .map(lambda x: tf.RaggedTensor.from_row_lengths(tf.range(4), [2, 2]))
    )
    with pytest.raises(UnsupportedDatasetError):
        store_at(tmp_path).build("bad", "v1", ragged)
    assert calls == []


# -- epochs and order ----------------------------------------------------------------------------


def yogadl_order(n: int, epochs: int, **kwargs: Any) -> list[list[int]]:
    keys = yogadl.shard_keys(
        list(range(n)),
        kwargs.get("shard_rank", 0),
        kwargs.get("num_shards", 1),
        sequential=False,
        drop_shard_remainder=kwargs.get("drop_shard_remainder", False),
    )
    shuffle = kwargs.get("shuffle", False)
    generator = yogadl.GeneratorFromKeys(
        keys,
        kwargs.get("start_offset", 0),
        lambda k: k,
        shuffle,
        shuffle and not kwargs.get("skip_shuffle_at_epoch_end", False),
        kwargs.get("shuffle_seed"),
    )
    return [list(generator.instantiate_generator()) for _ in range(epochs)]


STREAM_KWARGS = {
    "start_offset": 13,
    "shuffle": True,
    "shuffle_seed": 777,
    "shard_rank": 1,
    "num_shards": 3,
    "drop_shard_remainder": True,
}


def test_each_iteration_of_the_tf_dataset_is_the_next_epoch_fixed_shapes(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.build("ep", "v1", tf.data.Dataset.range(40).map(lambda x: {"i": x, "v": tf.fill([2], x)}))
    dataref = CacheDataRef(store.open("ep", "v1"))
    stream = dataref.stream(**STREAM_KWARGS)
    assert stream.batch_iterator_fn is not None  # the batched fast path
    dataset = make_tf_dataset(stream)
    got = [[int(e["i"]) for e in dataset.as_numpy_iterator()] for _ in range(4)]
    assert got == yogadl_order(40, 4, **STREAM_KWARGS)
    for epoch in got[1:]:
        assert len(epoch) == len(stream) == 13


def test_each_iteration_of_the_tf_dataset_is_the_next_epoch_varying_shapes(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.build(
        "ep", "v1", tf.data.Dataset.range(40).map(lambda x: (x, tf.range(x % 5), tf.strings.as_string(x)))
    )
    stream = CacheDataRef(store.open("ep", "v1")).stream(**STREAM_KWARGS)
    assert stream.batch_iterator_fn is None
    dataset = make_tf_dataset(stream)
    got = [[int(e[0]) for e in dataset.as_numpy_iterator()] for _ in range(4)]
    assert got == yogadl_order(40, 4, **STREAM_KWARGS)
    for element in dataset.take(5).as_numpy_iterator():
        assert element[1].tolist() == list(range(int(element[0]) % 5))
        assert element[2] == str(int(element[0])).encode()


def test_tf_dataset_repeat_and_batch_continue_the_epochs(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.build("ep", "v1", tf.data.Dataset.range(10))
    stream = CacheDataRef(store.open("ep", "v1")).stream(start_offset=5, shuffle=True, shuffle_seed=777)
    batches = make_tf_dataset(stream).repeat(3).batch(5)
    got = [int(x) for batch in batches.as_numpy_iterator() for x in batch]
    want = [x for epoch in yogadl_order(10, 3, start_offset=5, shuffle=True, shuffle_seed=777) for x in epoch]
    assert got == want
    assert len(got) == 25


# -- Stream output types and shapes -------------------------------------------------------------


def test_stream_output_types_and_shapes_are_tf_structures(tmp_path: Path) -> None:
    source = tf.data.Dataset.from_generator(
        lambda: ({"img": np.zeros((i, 4), np.uint8), "lbl": (np.int32(i), b"x")} for i in range(3)),
        output_signature={
            "img": tf.TensorSpec((None, 4), tf.uint8),
            "lbl": (tf.TensorSpec((), tf.int32), tf.TensorSpec((), tf.string)),
        },
    )
    dataref, _ = cache_and_read(tmp_path, source)
    stream = dataref.stream()
    assert stream.output_types == {"img": tf.uint8, "lbl": (tf.int32, tf.string)}
    shapes = stream.output_shapes
    assert isinstance(shapes["img"], tf.TensorShape)
    assert shapes["img"].as_list() == [None, 4]
    assert shapes["lbl"][0] == tf.TensorShape([]) and shapes["lbl"][1] == tf.TensorShape([])
    assert all(isinstance(t, tf.DType) for t in tf.nest.flatten(stream.output_types))
    # The same structures as YogaDL reads from its own caches.
    assert tf.compat.v1.data.get_output_types(source) == stream.output_types
    assert tf.compat.v1.data.get_output_shapes(source)["img"].as_list() == [None, 4]


# -- custom DataRef (YogaDL's custom_data_ref pattern) ------------------------------------------


class RandomDataRef(yogacache.DataRef):
    """A non-reproducible dataset of uint32 values, as in YogaDL's custom_data_ref example."""

    def __len__(self) -> int:
        return 10

    def stream(
        self,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
    ) -> yogacache.Stream:
        first_epoch = True

        def iterator_fn() -> Iterator[int]:
            nonlocal first_epoch
            if first_epoch:
                first_epoch = False
                start = start_offset + shard_rank
            else:
                start = shard_rank
            end = len(self) - (len(self) % num_shards) if drop_shard_remainder else len(self)
            for _ in range(start, end, num_shards):
                r = os.urandom(4)
                yield r[0] + (r[1] << 8) + (r[2] << 16) + (r[3] << 24)

        return yogacache.Stream(
            iterator_fn=iterator_fn,
            length=len(self),
            output_types=tf.uint32,
            output_shapes=tf.TensorShape([]),
        )


def test_custom_dataref_works_with_make_tf_dataset() -> None:
    dataref = RandomDataRef()
    stream = dataref.stream(start_offset=2, shard_rank=1, num_shards=2)
    assert len(stream) == 10
    dataset = make_tf_dataset(stream)
    assert dataset.element_spec == tf.TensorSpec([], tf.uint32)
    first = list(dataset.as_numpy_iterator())
    second = list(dataset.as_numpy_iterator())
    assert len(first) == 4 and len(second) == 5  # offset only in the first epoch
    assert all(x.dtype == np.uint32 for x in first + second)
    batches = list(make_tf_dataset(dataref.stream()).batch(5).as_numpy_iterator())
    assert [b.shape for b in batches] == [(5,), (5,)]


def test_plain_stream_with_nested_output_types() -> None:
    def iterator_fn() -> Iterator[Any]:
        for i in range(3):
            yield {"a": np.full((2,), i, np.float32), "b": (np.int64(i), b"s%d" % i)}

    stream = yogacache.Stream(
        iterator_fn=iterator_fn,
        length=3,
        output_types={"a": tf.float32, "b": (tf.int64, tf.string)},
        output_shapes={"a": tf.TensorShape([2]), "b": (tf.TensorShape([]), tf.TensorShape([]))},
    )
    assert len(stream) == 3
    elements = list(make_tf_dataset(stream).as_numpy_iterator())
    assert [int(e["b"][0]) for e in elements] == [0, 1, 2]
    assert elements[2]["b"][1] == b"s2"
    assert elements[1]["a"].tolist() == [1.0, 1.0]


# -- caches built from Python data --------------------------------------------------------------


def test_stream_from_a_python_built_cache(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    data = [
        {
            "x": np.arange(i, dtype=np.float64),
            "y": np.int32(i),
            "name": f"item-{i}",
            "pair": (np.uint8(i), np.array([[i, i]], dtype=np.int16)),
        }
        for i in range(8)
    ]
    store.build("py", "v1", data)
    stream = CacheDataRef(store.open("py", "v1")).stream()
    dataset = make_tf_dataset(stream)
    spec = dataset.element_spec
    assert spec["x"] == tf.TensorSpec([None], tf.float64)
    assert spec["y"] == tf.TensorSpec([], tf.int32)
    assert spec["name"] == tf.TensorSpec([], tf.string)
    assert spec["pair"] == (tf.TensorSpec([], tf.uint8), tf.TensorSpec([1, 2], tf.int16))
    assert stream.output_types == {
        "x": tf.float64,
        "y": tf.int32,
        "name": tf.string,
        "pair": (tf.uint8, tf.int16),
    }
    got = list(dataset.as_numpy_iterator())
    assert len(got) == 8
    for i, element in enumerate(got):
        assert element["x"].tolist() == list(range(i))
        assert element["y"] == i
        assert element["name"] == f"item-{i}".encode()
        assert element["pair"][1].tolist() == [[i, i]]


def test_stream_from_a_python_built_fixed_shape_cache_uses_batches(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    data = [(np.full((3,), i, np.float32), np.int64(i)) for i in range(50)]
    store.build("py", "v1", data)
    stream = CacheDataRef(store.open("py", "v1")).stream(shuffle=True, shuffle_seed=4)
    dataset = make_tf_dataset(stream)
    assert dataset.element_spec == (tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int64))
    first = [int(e[1]) for e in dataset.as_numpy_iterator()]
    second = [int(e[1]) for e in dataset.as_numpy_iterator()]
    assert first == yogadl_order(50, 2, shuffle=True, shuffle_seed=4)[0]
    assert second == yogadl_order(50, 2, shuffle=True, shuffle_seed=4)[1]


def test_process_exits_with_a_live_iterator(tmp_path: Path) -> None:
    """A script that stops after the first batch must exit, not deadlock in TF's teardown."""
    import subprocess
    import sys

    script = f"""
import numpy as np
from yogacache import storage
from yogacache.tensorflow import make_tf_dataset
st = storage.LFSStorage(storage.LFSConfigurations({str(tmp_path)!r}))
st.submit([(np.full(3000, i % 251, np.uint8), i) for i in range(20000)], "exit", "v1")
stream = st.fetch("exit", "v1").stream(shuffle=True, shuffle_seed=3)
iterator = iter(make_tf_dataset(stream).batch(256).prefetch(2))
first = next(iterator)
print("first batch", int(first[1].shape[0]), flush=True)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "first batch 256" in result.stdout


# -- the batched pipeline: several reads per epoch ----------------------------------------------


@pytest.fixture
def small_first_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Epochs start with a 32-record read (as for large records), then 64, 128, ..."""
    import yogacache.read.epochs

    monkeypatch.setattr(yogacache.read.epochs, "FIRST_READ_BYTES", 0)


def test_first_read_fits_a_consumer_batch_of_small_records(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.build("fr", "v1", tf.data.Dataset.range(3000).map(lambda x: (x, tf.fill([100], x))))
    stream = CacheDataRef(store.open("fr", "v1")).stream()
    first = next(stream.batch_iterator_fn())
    assert len(first[0]) >= 256
    big = store_at(tmp_path / "big")
    big.build("fr", "v1", tf.data.Dataset.range(40).map(lambda x: tf.fill([10_000], x)))
    first = next(CacheDataRef(big.open("fr", "v1")).stream().batch_iterator_fn())
    assert len(first[0]) == 32


def test_resumed_epoch_of_many_reads_then_full_epochs_match_yogadl(tmp_path: Path, small_first_reads: None) -> None:
    store = store_at(tmp_path)
    store.build("many", "v1", tf.data.Dataset.range(1500).map(lambda x: (x, tf.fill([3], x))))
    kwargs = {"start_offset": 450, "shuffle": True, "shuffle_seed": 3, "shard_rank": 1, "num_shards": 2}
    stream = CacheDataRef(store.open("many", "v1")).stream(**kwargs)
    assert stream.max_batches is not None and stream.max_batches > 3  # 32, 64, 128, ... records
    dataset = make_tf_dataset(stream)
    got = [[int(e[0]) for e in dataset.as_numpy_iterator()] for _ in range(3)]
    assert got == yogadl_order(1500, 3, **kwargs)
    assert [len(epoch) for epoch in got] == [750 - 450, 750, 750]
    for index, values in dataset.take(50).as_numpy_iterator():
        assert values.tolist() == [index] * 3


def test_an_abandoned_iterator_does_not_disturb_the_next_epoch(tmp_path: Path, small_first_reads: None) -> None:
    store = store_at(tmp_path)
    store.build("ab", "v1", tf.data.Dataset.range(1000))
    stream = CacheDataRef(store.open("ab", "v1")).stream(shuffle=True, shuffle_seed=5)
    dataset = make_tf_dataset(stream).prefetch(8)
    abandoned = iter(dataset)
    first = [int(next(abandoned)) for _ in range(40)]  # reads 0 and 1 of epoch 0
    second = [int(x) for x in dataset.as_numpy_iterator()]
    third = [int(x) for x in dataset.as_numpy_iterator()]
    want = yogadl_order(1000, 3, shuffle=True, shuffle_seed=5)
    assert first == want[0][:40]
    assert second == want[1]
    assert third == want[2]
    del abandoned


def test_two_iterators_at_once_each_read_their_own_epoch(tmp_path: Path, small_first_reads: None) -> None:
    store = store_at(tmp_path)
    store.build("two", "v1", tf.data.Dataset.range(1000))
    stream = CacheDataRef(store.open("two", "v1")).stream(shuffle=True, shuffle_seed=4)
    dataset = make_tf_dataset(stream)
    older, newer = iter(dataset), iter(dataset)
    first = [int(next(older)) for _ in range(40)]
    second = [int(next(newer)) for _ in range(500)]
    first += [int(x) for x in older]
    second += [int(x) for x in newer]
    want = yogadl_order(1000, 2, shuffle=True, shuffle_seed=4)
    assert (first, second) == (want[0], want[1])


def test_batches_beyond_max_batches_are_not_dropped() -> None:
    spec = yogacache.format.spec.TensorSpec("int64", ())

    def batches() -> Iterator[list[np.ndarray]]:
        for start in range(0, 50, 10):
            yield [np.arange(start, start + 10, dtype=np.int64)]

    stream = yogacache.Stream(
        lambda: iter(range(50)), 50, element_spec=spec, batch_iterator_fn=batches, max_batches=2
    )
    dataset = make_tf_dataset(stream)
    assert [int(x) for x in dataset.as_numpy_iterator()] == list(range(50))
    assert [int(x) for x in dataset.as_numpy_iterator()] == list(range(50))


def test_an_empty_shard_gives_an_empty_dataset_with_the_spec(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    store.build("tiny", "v1", tf.data.Dataset.range(2).map(lambda x: {"x": x, "s": tf.fill([2], 1.5)}))
    stream = CacheDataRef(store.open("tiny", "v1")).stream(shard_rank=3, num_shards=4)
    dataset = make_tf_dataset(stream)
    assert len(stream) == 0
    assert list(dataset.as_numpy_iterator()) == []
    assert dataset.element_spec == {
        "s": tf.TensorSpec([2], tf.float32),
        "x": tf.TensorSpec([], tf.int64),
    }
