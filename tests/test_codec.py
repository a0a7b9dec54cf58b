"""Record codec: msgpack records of nested dicts/tuples of arrays, bit-exact, checked, never pickle."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import ml_dtypes
import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yogacache.errors import CorruptCacheError, UnsupportedDatasetError
from yogacache.format.codec import LARGE_LEAF_BYTES, RecordCodec
from yogacache.format.layout import FixedLayout
from yogacache.format.spec import TensorSpec, flatten, infer_spec, spec_from_json, spec_to_json, unflatten

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


def sample_array(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Arrays with awkward values: extremes, NaN payloads, -0.0, infinities."""
    rng = np.random.default_rng(seed)
    dtype = np_dtype(name)
    count = int(np.prod(shape))
    if name == "bool":
        flat = rng.integers(0, 2, count).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)
        flat[: min(count, 2)] = [info.min, info.max][: min(count, 2)]
    else:
        # Random raw bits: every bit pattern (NaN payloads, denormals) must survive.
        raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8)
        flat = raw.view(dtype).copy()
    return np.asarray(flat, dtype=dtype).reshape(shape)


def assert_bit_exact(got: Any, want: Any) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want)
        for key in want:
            assert_bit_exact(got[key], want[key])
        return
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_bit_exact(a, b)
        return
    if isinstance(want, (bytes, str)):
        want_bytes = want.encode() if isinstance(want, str) else want
        assert isinstance(got, bytes) and got == want_bytes
        return
    want_array = np.asarray(want)
    got_array = np.asarray(got)
    if want_array.dtype.kind in "OUS":
        assert got_array.shape == want_array.shape
        wanted = [v.encode() if isinstance(v, str) else bytes(v) for v in want_array.reshape(-1)]
        assert list(got_array.reshape(-1)) == wanted
        return
    assert got_array.dtype == want_array.dtype, (got_array.dtype, want_array.dtype)
    assert got_array.shape == want_array.shape
    assert got_array.tobytes() == want_array.tobytes()


def roundtrip(element: Any, spec: Any = None) -> Any:
    spec = infer_spec(element) if spec is None else spec
    codec = RecordCodec(spec)
    value = codec.encode(flatten(element, spec))
    assert isinstance(value, bytes)
    return unflatten(codec.decode(value), spec)


# -- every dtype, bit-exact ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NUMERIC_DTYPES)
@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 4), (2, 0, 3)])
def test_numeric_dtype_roundtrip_is_bit_exact(name: str, shape: tuple[int, ...]) -> None:
    array = sample_array(name, shape, seed=len(shape))
    spec = TensorSpec(name, shape)
    decoded = roundtrip(array, spec)
    assert_bit_exact(decoded, array)


@pytest.mark.parametrize("name", NUMERIC_DTYPES)
def test_zero_d_scalar_decodes_to_a_numpy_scalar_of_the_dtype(name: str) -> None:
    array = sample_array(name, (), seed=3)
    decoded = roundtrip(array, TensorSpec(name, ()))
    assert np.ndim(decoded) == 0
    assert np.asarray(decoded).dtype == np_dtype(name)
    assert np.asarray(decoded).tobytes() == array.tobytes()


def test_infer_spec_names_every_dtype_and_shape() -> None:
    element = {name: sample_array(name, (2, 3)) for name in NUMERIC_DTYPES}
    spec = infer_spec(element)
    assert spec == {name: TensorSpec(name, (2, 3)) for name in NUMERIC_DTYPES}
    assert_bit_exact(roundtrip(element, spec), element)


def test_python_scalars_become_arrays() -> None:
    spec = infer_spec((3, 2.5, True))
    assert spec == (TensorSpec("int64", ()), TensorSpec("float64", ()), TensorSpec("bool", ()))
    decoded = roundtrip((3, 2.5, True))
    assert decoded[0] == 3 and decoded[1] == 2.5 and bool(decoded[2]) is True


def test_special_float_values_survive() -> None:
    array = np.array([np.nan, -0.0, np.inf, -np.inf, 5e-324, np.finfo(np.float64).max])
    nan_payload = np.array([0x7FF8DEADBEEF0001], dtype=np.uint64).view(np.float64)
    array = np.concatenate([array, nan_payload])
    decoded = roundtrip(array)
    assert decoded.tobytes() == array.tobytes()
    assert np.signbit(decoded[1])


def test_big_endian_input_is_stored_and_read_back() -> None:
    """The codec stores little-endian; a big-endian input array must still round-trip by value."""
    array = np.array([1, -2, 300000], dtype=">i4")
    decoded = roundtrip(array)
    np.testing.assert_array_equal(decoded, array)


# -- strings and bytes --------------------------------------------------------------------------


def test_string_and_bytes_scalars() -> None:
    element = {"text": "héllo wörld", "raw": b"\x00\xff\xfe binary", "empty": b""}
    spec = infer_spec(element)
    assert all(leaf == TensorSpec("string", ()) for leaf in spec.values())
    decoded = roundtrip(element)
    assert decoded == {"text": "héllo wörld".encode(), "raw": b"\x00\xff\xfe binary", "empty": b""}


def test_string_arrays_keep_shape_and_order() -> None:
    strings = np.array([["a", "bb", ""], ["ççç", "d", "e" * 1000]])
    decoded = roundtrip(strings)
    assert decoded.shape == (2, 3)
    assert decoded.dtype == object
    assert decoded.tolist() == [[s.encode() for s in row] for row in strings.tolist()]
    raw = np.array([b"\x00\x01", b"\xff"], dtype=object)
    assert roundtrip(raw).tolist() == [b"\x00\x01", b"\xff"]
    fixed_bytes = np.array([b"ab", b"c"])  # numpy 'S' dtype
    assert roundtrip(fixed_bytes).tolist() == [b"ab", b"c"]


def test_empty_string_array() -> None:
    decoded = roundtrip(np.array([], dtype=object).reshape(0, 2), TensorSpec("string", (0, 2)))
    assert decoded.shape == (0, 2)


# -- structure ----------------------------------------------------------------------------------


def test_nested_dicts_and_tuples_are_preserved() -> None:
    element = {
        "image": sample_array("uint8", (4, 4, 3)),
        "meta": {
            "label": np.int64(7),
            "names": ("x", b"y"),
            "weights": (np.float32(0.5), sample_array("float16", (2,))),
        },
        "pair": (np.array([1, 2], dtype=np.int16), {"z": np.bool_(True)}),
    }
    spec = infer_spec(element)
    decoded = roundtrip(element, spec)
    assert set(decoded) == {"image", "meta", "pair"}
    assert isinstance(decoded["pair"], tuple) and isinstance(decoded["pair"][1], dict)
    assert_bit_exact(decoded, element)
    assert spec_from_json(spec_to_json(spec)) == spec


def test_dict_key_order_does_not_matter() -> None:
    spec = infer_spec({"b": 1, "a": 2.0})
    codec = RecordCodec(spec)
    one = codec.encode(flatten({"b": 1, "a": 2.0}, spec))
    two = codec.encode(flatten({"a": 2.0, "b": 1}, spec))
    assert one == two


def test_structure_change_is_refused() -> None:
    spec = infer_spec({"a": 1, "b": 2})
    with pytest.raises(UnsupportedDatasetError, match="keys"):
        flatten({"a": 1}, spec)
    with pytest.raises(UnsupportedDatasetError, match="tuple"):
        flatten((1, 2, 3), infer_spec((1, 2)))


# -- unknown dims -------------------------------------------------------------------------------


def test_unknown_dims_accept_varying_shapes() -> None:
    spec = TensorSpec("float32", (None, 3))
    codec = RecordCodec(spec)
    assert codec.layout is None and not codec.stackable
    for rows in (0, 1, 5):
        array = sample_array("float32", (rows, 3), seed=rows)
        assert_bit_exact(codec.decode(codec.encode([array]))[0], array)
    with pytest.raises(UnsupportedDatasetError, match="shape"):
        codec.encode([np.zeros((2, 4), np.float32)])


def test_unknown_rank_accepts_any_rank() -> None:
    codec = RecordCodec(TensorSpec("int32", None))
    for shape in [(), (3,), (2, 2, 2)]:
        array = sample_array("int32", shape)
        assert_bit_exact(codec.decode(codec.encode([array]))[0], array)
    strings = RecordCodec(TensorSpec("string", (None,)))
    for values in ([], [b"a"], [b"a", b"bc", b""]):
        array = np.array(values, dtype=object)
        assert strings.decode(strings.encode([array]))[0].tolist() == values


def test_wrong_dtype_is_refused_on_encode() -> None:
    codec = RecordCodec(TensorSpec("int32", (2,)))
    with pytest.raises(UnsupportedDatasetError, match="dtype"):
        codec.encode([np.zeros(2, np.int64)])


def test_unsupported_dtype_is_refused() -> None:
    with pytest.raises(UnsupportedDatasetError, match="object"):
        TensorSpec("object", ())
    with pytest.raises(UnsupportedDatasetError):
        infer_spec(np.array([object()], dtype=object))


# -- FixedLayout fast path ----------------------------------------------------------------------


FIXED_SPEC = {
    "a": TensorSpec("float32", (3, 2)),
    "b": (TensorSpec("int8", ()), TensorSpec("bfloat16", (4,))),
    "c": TensorSpec("complex128", (1,)),
    "d": TensorSpec("bool", (5,)),
    "e": TensorSpec("uint64", (0,)),
    "f": TensorSpec("float16", ()),
}


def fixed_batch(count: int, seed: int = 0) -> list[np.ndarray]:
    from yogacache.format.spec import spec_leaves

    return [
        sample_array(leaf.dtype, (count, *leaf.shape), seed=seed + i)
        for i, leaf in enumerate(spec_leaves(FIXED_SPEC))
    ]


@pytest.mark.parametrize("name", NUMERIC_DTYPES)
def test_fixed_layout_matches_per_record_encoding_for_every_dtype(name: str) -> None:
    spec = (TensorSpec(name, ()), TensorSpec(name, (3,)))
    codec = RecordCodec(spec)
    assert isinstance(codec.layout, FixedLayout)
    columns = [sample_array(name, (9,), seed=1), sample_array(name, (9, 3), seed=2)]
    fast = codec.encode_columns(columns)
    slow = [codec.encode([columns[0][i], columns[1][i]]) for i in range(9)]
    assert fast == slow
    decoded = codec.decode_columns(fast)
    for got, want in zip(decoded, columns, strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_fixed_layout_matches_per_record_encoding_nested() -> None:
    codec = RecordCodec(FIXED_SPEC)
    assert codec.layout is not None
    columns = fixed_batch(11)
    fast = codec.encode_columns(columns)
    assert len(fast) == 11
    assert len({len(v) for v in fast}) == 1 and len(fast[0]) == codec.layout.record_size
    for i, value in enumerate(fast):
        assert value == codec.encode([column[i] for column in columns])
        # And each record decodes per record, too.
        for got, column in zip(codec.decode(value), columns, strict=True):
            assert np.asarray(got).tobytes() == column[i].tobytes()
    for got, want in zip(codec.decode_columns([memoryview(v) for v in fast]), columns, strict=True):
        assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_fixed_layout_detects_every_altered_header_byte() -> None:
    codec = RecordCodec(FIXED_SPEC)
    layout = codec.layout
    assert layout is not None
    record = codec.encode_columns(fixed_batch(1))[0]
    data_bytes = set()
    for offset, size, _, _ in layout.fields:
        data_bytes.update(range(offset, offset + size))
    header_positions = [i for i in range(len(record)) if i not in data_bytes]
    assert header_positions, "a record always has msgpack headers"
    good = codec.encode_columns(fixed_batch(2, seed=5))
    for position in header_positions:
        altered = bytearray(record)
        altered[position] ^= 0x01
        with pytest.raises(CorruptCacheError):
            codec.decode_columns([good[0], bytes(altered), good[1]])
    # Altering a data byte is not a format error: the data is what it is.
    offset = layout.fields[0][0]
    altered = bytearray(record)
    altered[offset] ^= 0x01
    codec.decode_columns([bytes(altered)])


def test_fixed_layout_detects_wrong_record_length() -> None:
    codec = RecordCodec(FIXED_SPEC)
    records = [bytes(r) for r in codec.encode_columns(fixed_batch(3))]
    with pytest.raises(CorruptCacheError):
        codec.decode_columns([records[0], records[1][:-1], records[2]])
    with pytest.raises(CorruptCacheError):
        codec.decode_columns([records[0] + b"\x00", records[1]])


def test_encode_columns_without_fixed_layout_matches_per_record() -> None:
    spec = (TensorSpec("string", (2,)), TensorSpec("int32", (3,)))
    codec = RecordCodec(spec)
    assert codec.layout is None and codec.stackable
    strings = np.array([[b"a", b"b"], [b"", b"\xff"], [b"c", b"dd"]], dtype=object)
    ints = sample_array("int32", (3, 3))
    values = codec.encode_columns([strings, ints])
    assert values == [codec.encode([strings[i], ints[i]]) for i in range(3)]
    got_strings, got_ints = codec.decode_columns(values)
    assert got_strings.tolist() == strings.tolist()
    assert got_ints.tobytes() == ints.tobytes()


# -- garbage is CorruptCacheError, never another exception -------------------------------------


SPECS_FOR_GARBAGE = [
    TensorSpec("float32", (2,)),
    TensorSpec("int64", ()),
    TensorSpec("float32", None),
    TensorSpec("uint8", (None, 2)),
    TensorSpec("string", ()),
    TensorSpec("string", None),
    (TensorSpec("string", ()), TensorSpec("float32", (2,))),
    {"a": TensorSpec("int16", (3,)), "b": TensorSpec("string", (2,))},
    FIXED_SPEC,
]


def decode_or_corrupt(codec: RecordCodec, value: bytes) -> None:
    """Decoding either succeeds or raises CorruptCacheError; anything else is a bug."""
    try:
        codec.decode(value)
    except CorruptCacheError:
        pass
    if codec.stackable:
        try:
            codec.decode_columns([value])
        except CorruptCacheError:
            pass


@pytest.mark.parametrize("spec_index", range(len(SPECS_FOR_GARBAGE)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_random_bytes_give_corrupt_cache_error(spec_index: int, data: bytes) -> None:
    decode_or_corrupt(RecordCodec(SPECS_FOR_GARBAGE[spec_index]), data)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=16)
    | st.sampled_from(["float32", "int64", "string", "uint8", "int16", "bool"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("spec_index", range(len(SPECS_FOR_GARBAGE)))
@settings(max_examples=150, deadline=None)
@given(payload=msgpack_values)
def test_well_formed_msgpack_of_the_wrong_shape_gives_corrupt_cache_error(
    spec_index: int, payload: Any
) -> None:
    decode_or_corrupt(RecordCodec(SPECS_FOR_GARBAGE[spec_index]), msgpack.packb(payload, use_bin_type=True))


@pytest.mark.parametrize("spec_index", range(len(SPECS_FOR_GARBAGE)))
@settings(max_examples=100, deadline=None)
@given(
    shape=st.lists(st.integers(min_value=-3, max_value=3), max_size=3),
    count=st.integers(min_value=0, max_value=4),
)
def test_records_with_bad_shapes_give_corrupt_cache_error(
    spec_index: int, shape: list[int], count: int
) -> None:
    from yogacache.format.spec import spec_leaves

    spec = SPECS_FOR_GARBAGE[spec_index]
    leaves = []
    for leaf in spec_leaves(spec):
        if leaf.dtype == "string":
            leaves.append(["string", shape, [b"x"] * count])
        else:
            leaves.append([leaf.dtype, shape, b"\x00" * (count * np_dtype(leaf.dtype).itemsize)])
    decode_or_corrupt(RecordCodec(spec), msgpack.packb(leaves, use_bin_type=True))


def test_negative_dims_in_a_record_give_corrupt_cache_error() -> None:
    numeric = RecordCodec(TensorSpec("float32", None))
    with pytest.raises(CorruptCacheError):
        numeric.decode(msgpack.packb([["float32", [-1, -1], b"\x00" * 4]], use_bin_type=True))
    strings = RecordCodec(TensorSpec("string", None))
    with pytest.raises(CorruptCacheError):
        strings.decode(msgpack.packb([["string", [-1, -1], [b"x"]]], use_bin_type=True))


def test_decode_columns_leaf_without_data_gives_corrupt_cache_error() -> None:
    codec = RecordCodec((TensorSpec("string", ()), TensorSpec("float32", (2,))))
    assert codec.stackable and codec.layout is None
    record = msgpack.packb([["string", [], [b"a"]], ["float32", [2]]], use_bin_type=True)
    with pytest.raises(CorruptCacheError):
        codec.decode(record)
    with pytest.raises(CorruptCacheError):
        codec.decode_columns([record])


def test_decode_columns_leaf_that_is_a_map_gives_corrupt_cache_error() -> None:
    codec = RecordCodec((TensorSpec("string", ()), TensorSpec("float32", (2,))))
    record = msgpack.packb([{}, ["float32", [2], b"\x00" * 8]], use_bin_type=True)
    with pytest.raises(CorruptCacheError):
        codec.decode(record)
    with pytest.raises(CorruptCacheError):
        codec.decode_columns([record])


def test_decode_columns_checks_each_record_length_not_only_the_total() -> None:
    """Two records whose wrong lengths cancel out must not decode into shifted data."""
    codec = RecordCodec((TensorSpec("string", ()), TensorSpec("int32", (2,))))
    too_long = msgpack.packb([["string", [], [b"a"]], ["int32", [2], b"\x01" * 12]], use_bin_type=True)
    too_short = msgpack.packb([["string", [], [b"b"]], ["int32", [2], b"\x02" * 4]], use_bin_type=True)
    for value in (too_long, too_short):
        with pytest.raises(CorruptCacheError):
            codec.decode(value)
    with pytest.raises(CorruptCacheError):
        codec.decode_columns([too_long, too_short])


def test_truncated_and_extended_records_give_corrupt_cache_error() -> None:
    spec = {"x": TensorSpec("float64", (None,)), "s": TensorSpec("string", (2,))}
    codec = RecordCodec(spec)
    value = codec.encode(flatten({"x": np.arange(5.0), "s": np.array([b"ab", b"cd"], dtype=object)}, spec))
    for cut in range(len(value)):
        with pytest.raises(CorruptCacheError):
            codec.decode(value[:cut])
    with pytest.raises(CorruptCacheError):
        codec.decode(value + b"\x00")


def test_dtype_mismatch_with_spec_gives_corrupt_cache_error() -> None:
    writer = RecordCodec(TensorSpec("int32", (2,)))
    reader = RecordCodec(TensorSpec("float32", (2,)))
    with pytest.raises(CorruptCacheError, match="spec"):
        reader.decode(writer.encode([np.array([1, 2], np.int32)]))
    with pytest.raises(CorruptCacheError):
        reader.decode_columns([writer.encode([np.array([1, 2], np.int32)])])


# -- no pickle ----------------------------------------------------------------------------------


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize(
    "spec",
    [TensorSpec("int64", ()), TensorSpec("string", ()), TensorSpec("float32", None), FIXED_SPEC],
    ids=["int", "string", "unknown-shape", "fixed"],
)
def test_a_pickle_payload_is_refused_and_never_executed(tmp_path: Path, spec: Any) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker), protocol=pickle.HIGHEST_PROTOCOL)
    codec = RecordCodec(spec)
    for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
        for value in (pickle.dumps(_Exploit(marker), protocol=protocol), payload):
            with pytest.raises(CorruptCacheError):
                codec.decode(value)
            if codec.stackable:
                with pytest.raises(CorruptCacheError):
                    codec.decode_columns([value])
    assert not marker.exists()


def test_a_pickle_inside_a_leaf_stays_bytes(tmp_path: Path) -> None:
    """A pickle stored as a bytes leaf is data: decoding returns the bytes, it never unpickles."""
    marker = tmp_path / "pwned"
    blob = pickle.dumps(_Exploit(marker))
    codec = RecordCodec(TensorSpec("string", ()))
    assert codec.decode(codec.encode([blob])) == [blob]
    # A record claiming a pickle or object leaf is refused.
    forged = msgpack.packb([["object", [], blob]], use_bin_type=True)
    with pytest.raises(CorruptCacheError):
        codec.decode(forged)
    assert not marker.exists()


def test_msgpack_extension_types_are_refused() -> None:
    codec = RecordCodec(TensorSpec("int64", ()))
    forged = msgpack.packb([msgpack.ExtType(1, b"\x80\x04")], use_bin_type=True)
    with pytest.raises(CorruptCacheError):
        codec.decode(forged)
    forged = msgpack.packb([["int64", [], msgpack.ExtType(1, b"\x00" * 8)]], use_bin_type=True)
    with pytest.raises(CorruptCacheError):
        codec.decode(forged)


def test_codec_modules_do_not_use_pickle() -> None:
    import yogacache.format.codec
    import yogacache.format.layout
    import yogacache.format.manifest
    import yogacache.format.spec
    import yogacache.format.writer
    import yogacache.read.reader

    for module in (
        yogacache.format.codec,
        yogacache.format.layout,
        yogacache.format.spec,
        yogacache.read.reader,
        yogacache.format.writer,
        yogacache.format.manifest,
    ):
        assert "pickle" not in vars(module), module.__name__
        source = Path(module.__file__).read_text()
        assert "import pickle" not in source and "pickle.loads" not in source, module.__name__


# -- fast paths: stacked encoding of Python rows, aligned columns ---------------------------------


def _rows(count: int) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(3)
    return [(rng.integers(0, 255, (4, 5), dtype=np.uint8), np.int64(i), np.float32(i / 3)) for i in range(count)]


def test_stacked_encoding_equals_per_record_encoding() -> None:
    rows = _rows(300)
    codec = RecordCodec(infer_spec(rows[0]))
    assert codec.layout is not None
    stacked = codec.layout.encode_stacked(rows)
    assert stacked is not None
    assert [bytes(r) for r in stacked] == [codec.encode(list(row)) for row in rows]


@pytest.mark.parametrize(
    "odd",
    [
        (np.zeros((4, 5), np.int8), np.int64(1), np.float32(0)),  # another dtype, same shape
        (np.zeros((4, 5), np.uint8), np.int32(1), np.float32(0)),  # a scalar of another width
        (np.zeros((4, 5), np.uint8), 1, np.float32(0)),  # a Python int
        (np.zeros((5, 4), np.uint8), np.int64(1), np.float32(0)),  # another shape
        (np.zeros((4, 5), np.uint8), np.int64(1), np.float64(0)),  # would be cast silently
    ],
    ids=["dtype", "width", "python-int", "shape", "float64"],
)
def test_stacked_encoding_refuses_rows_it_would_have_to_convert(odd: tuple[Any, ...]) -> None:
    rows = _rows(10)
    rows[7] = odd
    layout = RecordCodec(infer_spec(rows[0])).layout
    assert layout is not None
    assert layout.encode_stacked(rows) is None


def test_flattener_matches_flatten_and_checks_structure() -> None:
    from yogacache.format.spec import flattener

    for element in [(np.int64(1), np.zeros(2)), {"b": np.int64(1), "a": np.zeros(2)}, {"a": (np.int64(1),)}]:
        spec = infer_spec(element)
        assert list(flattener(spec)(element)) == flatten(element, spec)
    with pytest.raises(UnsupportedDatasetError, match="structure changed"):
        flattener(infer_spec((np.int64(1), np.int64(2))))((np.int64(1),))
    with pytest.raises(UnsupportedDatasetError, match="structure changed"):
        flattener(infer_spec({"a": np.int64(1)}))({"b": np.int64(1)})


@pytest.mark.parametrize("size", [16, 20_000])  # the staging path and the per-row path
def test_decoded_columns_are_64_byte_aligned_and_exact(size: int) -> None:
    rng = np.random.default_rng(5)
    rows = [(rng.integers(0, 255, size, dtype=np.uint8), np.float64(i)) for i in range(33)]
    codec = RecordCodec(infer_spec(rows[0]))
    columns = codec.decode_columns([codec.encode(list(row)) for row in rows])
    for column in columns:
        assert column.ctypes.data % 64 == 0
    assert np.array_equal(columns[0], np.stack([row[0] for row in rows]))
    assert columns[1].tolist() == [float(i) for i in range(33)]


@pytest.mark.parametrize("size", [LARGE_LEAF_BYTES - 1, LARGE_LEAF_BYTES, 70_000 + LARGE_LEAF_BYTES, 3 << 20])
def test_records_with_large_leaves_are_msgpacks_own_bytes(size: int) -> None:
    """Large leaves are framed by hand (one copy) and the record is what msgpack's packer
    writes, byte for byte: caches stay identical, whatever the path."""

    element = {
        "bin": bytes(range(256)) * (size // 256) + b"x" * (size % 256),
        "small": b"s",
        "array": np.arange(size // 4, dtype=np.int32),
        "strings": np.array([b"a" * size, b"b"], dtype=object),
    }
    spec = infer_spec(element)
    codec = RecordCodec(spec)
    leaves = flatten(element, spec)
    expected = msgpack.Packer(use_bin_type=True).pack([codec._encode_leaf(i, v) for i, v in enumerate(leaves)])
    record = codec.encode(leaves)
    assert record == expected
    decoded = unflatten(codec.decode(record), spec)
    assert decoded["bin"] == element["bin"] and decoded["small"] == b"s"
    np.testing.assert_array_equal(decoded["array"], element["array"])
    assert list(decoded["strings"]) == [b"a" * size, b"b"]
