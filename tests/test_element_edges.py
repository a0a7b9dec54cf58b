"""Element edge cases and memory by declared shape: elements with no tensor or nested too deep are
refused at build time with UnsupportedDatasetError; zero-size leaves round-trip; opening a cache
costs O(header) whatever record shape its manifest declares."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.layout import FixedLayout
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.spec import MAX_NESTING, TensorSpec, spec_from_json, spec_to_json
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore


def make_store(root: Path) -> CacheStore:
    return CacheStore(root, show_progress=False)


def nested(depth: int) -> Any:
    element: Any = np.int64(7)
    for level in range(depth):
        element = (element,) if level % 2 else {"k": element}
    return element


# -- elements with no tensor, deep nesting --------------------------------------------------------


@pytest.mark.parametrize("element", [(), {}, ((), {}), {"a": {}}], ids=repr)
def test_element_without_a_tensor_is_refused_before_anything_is_published(
    tmp_path: Path, element: Any
) -> None:
    store = make_store(tmp_path)
    with pytest.raises(UnsupportedDatasetError, match="no tensor"):
        store.build("empty", "v1", [element, element])
    assert not store.exists("empty", "v1")
    assert not (tmp_path / "empty").exists()  # no build leftovers, no lock, no empty directory


def test_empty_containers_beside_a_tensor_round_trip(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("mixed", "v1", [{"a": np.int32(i), "b": (), "c": {}} for i in range(3)])
    reader = store.open("mixed", "v1")
    assert reader.read_elements([2, 0]) == [{"a": 2, "b": (), "c": {}}, {"a": 0, "b": (), "c": {}}]


def test_nesting_too_deep_is_refused_with_a_message(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(UnsupportedDatasetError, match="levels deep"):
        store.build("deep", "v1", [nested(1000)])
    with pytest.raises(UnsupportedDatasetError, match="levels deep"):
        store.build("deep", "v1", [nested(MAX_NESTING + 1)])
    assert not store.exists("deep", "v1")


def test_nesting_at_the_limit_round_trips(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("deep", "v1", [nested(MAX_NESTING)])
    element = store.open("deep", "v1")[0]
    for level in reversed(range(MAX_NESTING)):
        element = element[0] if level % 2 else element["k"]
    assert element == 7


def test_manifest_spec_too_deep_or_without_tensor_is_corrupt() -> None:
    deep = spec_to_json(TensorSpec("int64", ()))
    for _ in range(MAX_NESTING + 5):
        deep = {"tuple": [deep]}
    with pytest.raises(CorruptCacheError, match="levels deep"):
        spec_from_json(deep)
    with pytest.raises(CorruptCacheError, match="no tensor"):
        spec_from_json({"dict": [["a", {"tuple": []}]]})


@pytest.mark.parametrize("shape", [(0, 3), (0,), (2, 0)])
def test_zero_size_leaf_round_trips_through_the_plain_reader(tmp_path: Path, shape: tuple[int, ...]) -> None:
    store = make_store(tmp_path)
    records = [{"i": np.int64(i), "z": np.zeros(shape, np.float32)} for i in range(5)]
    store.build("zero", "v1", records)
    reader = store.open("zero", "v1")
    assert reader.codec.layout is not None
    for got in reader.read_elements([4, 1]):
        assert got["z"].shape == shape and got["z"].dtype == np.float32
    columns = reader.read_columns([3, 0, 2])
    assert columns[0].tolist() == [3, 0, 2]
    assert columns[1].shape == (3, *shape)


# -- memory by declared shape --------------------------------------------------------------------


def test_layout_of_a_huge_declared_record_costs_only_its_header() -> None:
    tracemalloc.start()
    try:
        codec = RecordCodec((TensorSpec("uint8", (4_000_000_000,)), TensorSpec("int64", ())))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(codec.layout, FixedLayout)
    assert codec.layout.record_size > 4_000_000_000
    assert peak < 1 << 20


def test_layout_headers_equal_what_msgpack_writes_for_every_bin_size() -> None:
    for size in (0, 1, 255, 256, 65535, 65536, 70000):
        codec = RecordCodec((TensorSpec("uint8", (size,)),))
        value = np.arange(size, dtype=np.uint8)
        assert codec.encode_columns([value[None]]) == [codec.encode([value])]
        assert codec.decode_columns([codec.encode([value])])[0].tobytes() == value.tobytes()


def declare_shape(directory: Path, shape: tuple[int, ...]) -> None:
    """Rewrites a sealed cache's manifest so that its one leaf declares ``shape``."""
    manifest = Manifest.load(directory)
    lying = dataclasses.replace(manifest, element_spec=TensorSpec("uint8", shape))
    (directory / MANIFEST_NAME).write_bytes(lying.to_bytes())


def test_a_manifest_declaring_a_4gb_record_opens_and_reading_says_corrupt(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("lie", "v1", [np.zeros(8, np.uint8) for _ in range(3)])
    declare_shape(tmp_path / "lie" / "v1", (4_000_000_000,))
    tracemalloc.start()
    try:
        reader = store.open("lie", "v1")
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 4 << 20
        with pytest.raises(CorruptCacheError, match="element spec"):
            reader.read_columns([0, 1])
        with pytest.raises(CorruptCacheError, match="the spec says uint8"):
            reader.read_elements([2])
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 4 << 20  # the bad records were refused before any column was allocated
    finally:
        tracemalloc.stop()


def test_large_records_hold_no_record_sized_buffer_after_open_or_after_a_read(tmp_path: Path) -> None:
    size = 20 << 20
    store = make_store(tmp_path)
    store.build("big", "v1", [np.full(size, i, np.uint8) for i in range(2)])
    gc.collect()
    tracemalloc.start()
    try:
        reader = store.open("big", "v1")
        opened, peak = tracemalloc.get_traced_memory()
        assert peak < 2 << 20  # nothing allocated by declared shape
        (column,) = reader.read_columns([1])
        assert column.shape == (1, size) and int(column[0, -1]) == 1
        del column
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        assert after - opened < 1 << 20  # the record-sized buffer lived only while read
        assert int(reader[0][-1]) == 0
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        assert after - opened < 1 << 20
    finally:
        tracemalloc.stop()
    assert isinstance(reader, CacheReader)


# -- elements that change between records: the message names the element, the key and both sides ---


@pytest.mark.parametrize(
    "odd, words",
    [
        (
            {"a": {"b": np.zeros(2, np.int64)}, "c": np.int64(0)},
            ["dtype changed between elements", "element 3['a']['b']", "is int64", "expected float32"],
        ),
        (
            {"a": {"z": np.zeros(2, np.float32)}, "c": np.int64(0)},
            ["element structure changed between elements", "element 3['a']", "keys ['z']", "expected",
             "keys ['b']"],
        ),
        (
            {"a": (np.zeros(2, np.float32),), "c": np.int64(0)},
            ["element structure changed between elements", "element 3['a']", "is a 1-tuple",
             "expected a dict with keys ['b']"],
        ),
        (
            {"a": {"b": np.zeros(2, np.float32)}},
            ["element structure changed between elements", "element 3 ", "keys ['a']",
             "expected a dict with keys ['a', 'c']"],
        ),
    ],
    ids=["dtype", "keys", "dict-to-tuple", "missing-key"],
)
def test_an_element_that_changes_names_its_index_key_and_both_sides(
    tmp_path: Path, odd: Any, words: list[str]
) -> None:
    store = make_store(tmp_path)
    # Shapes vary (element by element encoding), then element 3 changes.
    good = [{"a": {"b": np.zeros(n + 1, np.float32)}, "c": np.int64(n)} for n in range(3)]
    with pytest.raises(UnsupportedDatasetError) as raised:
        store.build("odd", "v1", [*good, odd, *good])
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))
    assert not store.exists("odd", "v1")


def test_a_change_after_many_fixed_shape_elements_names_the_element_index(tmp_path: Path) -> None:
    """Same-shape elements are encoded a batch at a time; the index is still the element's own."""
    store = make_store(tmp_path)
    data: list[Any] = [(np.int64(i), np.float32(i)) for i in range(600)]
    data[517] = (np.int64(517),)
    with pytest.raises(UnsupportedDatasetError) as raised:
        store.build("odd", "v1", data)
    message = str(raised.value)
    assert "element structure changed between elements" in message
    assert "element 517 is a 1-tuple, expected a 2-tuple" in message, message
    data[517] = (np.int64(517), np.float64(517))
    with pytest.raises(UnsupportedDatasetError) as raised:
        store.build("odd", "v1", data)
    assert "element 517[1] is float64, expected float32" in str(raised.value), str(raised.value)


def test_the_element_error_survives_pickling_as_a_worker_process_sends_it() -> None:
    import pickle

    from yogacache.format.spec import ElementChangedError, generalize, infer_spec

    with pytest.raises(ElementChangedError) as raised:
        generalize(infer_spec({"a": (np.float32(1),)}), infer_spec({"a": (np.int64(1),)}))
    error = raised.value.at_element(7)
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and "element 7['a'][0] is int64, expected float32" in str(copy)
