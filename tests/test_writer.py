"""CacheStore and CacheWriter: manifest, key layout, map growth, part rolling, limits, atomicity."""

from __future__ import annotations

import base64
import datetime
import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import google_crc32c
import lmdb
import numpy as np
import pytest
import tensorflow as tf

import yogacache
from yogacache.dataref import CacheDataRef
from yogacache.errors import CacheLimitExceededError, UnsupportedDatasetError
from yogacache.format.codec import RecordCodec
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.format.spec import TensorSpec, infer_spec
from yogacache.format.writer import BuildLimits, CacheWriter
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore


def make_store(root: Path, **kwargs: Any) -> CacheStore:
    return CacheStore(root, show_progress=False, **kwargs)


def files_under(root: Path) -> list[str]:
    """Every file under ``root`` except lock files (coordination, not cache data)."""
    if not root.exists():
        return []
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def leftovers(root: Path) -> list[str]:
    """Temporary or trash directories of builds anywhere under ``root``."""
    if not root.exists():
        return []
    return sorted(str(p) for p in root.rglob("*") if ".tmp-" in p.name or ".trash-" in p.name)


def read_all(reader: CacheReader) -> list[Any]:
    return reader.read_elements(np.arange(len(reader)))


def elements(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(3, i, dtype=np.float32)} for i in range(start, start + n)]


# -- manifest -----------------------------------------------------------------------------------


def test_manifest_fields(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    before = datetime.datetime.now(datetime.UTC)
    manifest = store.build("mnist", "v1", elements(10))
    after = datetime.datetime.now(datetime.UTC)
    directory = tmp_path / "mnist" / "v1"
    raw = json.loads((directory / MANIFEST_NAME).read_text())
    assert raw["format_version"] == 1
    assert raw["dataset_id"] == "mnist" and raw["dataset_version"] == "v1"
    assert raw["num_records"] == 10
    assert raw["num_bytes"] > 0
    spec = Manifest.from_bytes((directory / MANIFEST_NAME).read_bytes(), "test").element_spec
    assert spec == {"i": TensorSpec("int64", ()), "x": TensorSpec("float32", (3,))}
    assert raw["element_spec"] == {
        "dict": [
            ["i", {"tensor": {"dtype": "int64", "shape": []}}],
            ["x", {"tensor": {"dtype": "float32", "shape": [3]}}],
        ]
    }
    assert len(raw["parts"]) == 1
    for part in raw["parts"]:
        path = directory / part["name"]
        assert part["size_bytes"] == path.stat().st_size
        # New builds are hashed with BLAKE3 (the reference implementation, not ours, checks it).
        assert "sha256" not in part
        assert part["blake3"] == blake3.blake3(path.read_bytes()).hexdigest()
        # ... and carry the CRC32C the clouds compute, in their form (base64, big-endian).
        crc = google_crc32c.value(path.read_bytes()).to_bytes(4, "big")
        assert part["crc32c"] == base64.b64encode(crc).decode()
    assert raw["parts"][0]["first_record"] == 0 and raw["parts"][0]["num_records"] == 10
    created = datetime.datetime.fromisoformat(raw["created_at"])
    assert created.tzinfo is not None
    assert before <= created <= after
    assert isinstance(raw["build_id"], str) and len(raw["build_id"]) >= 16
    assert yogacache.__version__ in raw["writer_version"]
    assert manifest.build_id == raw["build_id"]
    # A second build gets a new build id and a later timestamp.
    second = store.build("mnist", "v1", elements(10))
    assert second.build_id != manifest.build_id
    assert second.created_at >= manifest.created_at
    # Only the manifest and the parts are in the directory (verification stamps live in the
    # user's state directory, never in a cache).
    assert {p.name for p in directory.iterdir()} == {MANIFEST_NAME, *(p["name"] for p in raw["parts"])}


def test_record_keys_are_8_byte_big_endian_indices(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    n = 300
    store.build("keys", "v1", [np.int64(i * 7) for i in range(n)])
    manifest = store.manifest("keys", "v1")
    codec = RecordCodec(manifest.element_spec)
    (part,) = manifest.parts
    env = lmdb.open(str(tmp_path / "keys" / "v1" / part.name), subdir=False, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            items = list(txn.cursor())
        assert env.stat()["entries"] == n
    finally:
        env.close()
    assert [key for key, _ in items] == [struct.pack(">Q", i) for i in range(n)]
    assert all(len(key) == 8 for key, _ in items)
    assert [int(codec.decode(value)[0]) for _, value in items] == [i * 7 for i in range(n)]


def test_map_growth_with_tiny_initial_map_never_loses_a_record(tmp_path: Path) -> None:
    spec = TensorSpec("uint8", (None,))
    codec = RecordCodec(spec)
    rng = np.random.default_rng(0)
    payloads = [rng.integers(0, 256, int(rng.integers(100, 5000)), dtype=np.uint8) for _ in range(1500)]
    target = tmp_path / "grow" / "v1"
    with CacheWriter(target, "grow", "v1", initial_map_size=64 * 1024) as writer:
        for start in range(0, len(payloads), 97):
            writer.add_encoded([codec.encode([p]) for p in payloads[start : start + 97]])
        manifest = writer.seal(spec)
    assert manifest.num_records == len(payloads)
    assert manifest.total_size_bytes > 64 * 1024 * 4  # the map had to grow several times
    reader = CacheReader(target)
    assert len(reader) == len(payloads)
    for got, want in zip(read_all(reader), payloads, strict=True):
        assert got.tobytes() == want.tobytes()
    reader.close()


def test_part_rolling_gives_several_parts_read_back_correctly(tmp_path: Path) -> None:
    n = 20_000
    store = make_store(tmp_path, part_size_bytes=50_000)
    store.build("roll", "v1", [np.int64(i) for i in range(n)])
    manifest = store.manifest("roll", "v1")
    assert len(manifest.parts) >= 2
    assert sum(p.num_records for p in manifest.parts) == n
    first = 0
    for part in manifest.parts:
        assert part.first_record == first
        first += part.num_records
        path = tmp_path / "roll" / "v1" / part.name
        assert path.stat().st_size == part.size_bytes
        assert blake3.blake3(path.read_bytes()).hexdigest() == part.blake3 == part.digest
        # Keys in each part are the global indices of its records.
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            keys = [k for k, _ in txn.cursor()]
        env.close()
        assert keys == [struct.pack(">Q", i) for i in range(part.first_record, first)]
    reader = store.open("roll", "v1")
    rng = np.random.default_rng(1)
    indices = rng.integers(0, n, 3000)
    assert [int(x) for x in reader.read_elements(indices)] == indices.tolist()
    assert [int(x) for x in reader.read_columns(indices)[0]] == indices.tolist()
    assert int(reader[n - 1]) == n - 1 and int(reader[0]) == 0
    boundary = manifest.parts[1].first_record
    assert [int(x) for x in reader.read_elements([boundary, boundary - 1, boundary])] == [
        boundary,
        boundary - 1,
        boundary,
    ]
    order = [int(x) for x in CacheDataRef(reader).stream(shuffle=True, shuffle_seed=3)]
    assert sorted(order) == list(range(n))
    with pytest.raises(IndexError):
        reader.read_elements([n])


def test_empty_tf_dataset(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    manifest = store.build("empty", "v1", tf.data.Dataset.range(0))
    assert manifest.num_records == 0
    raw = json.loads((tmp_path / "empty" / "v1" / MANIFEST_NAME).read_text())
    assert raw["num_records"] == 0
    assert raw["element_spec"] == {"tensor": {"dtype": "int64", "shape": []}}
    reader = store.open("empty", "v1")
    assert len(reader) == 0
    stream = CacheDataRef(reader).stream(shuffle=True, shuffle_seed=0)
    assert len(stream) == 0 and list(stream) == []


def test_empty_python_dataset_is_refused_cleanly(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(UnsupportedDatasetError, match="empty"):
        store.build("empty", "v1", [])
    assert not store.exists("empty", "v1")
    assert leftovers(tmp_path) == []


def test_infinite_dataset_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(UnsupportedDatasetError, match="infinite"):
        store.build("inf", "v1", tf.data.Dataset.range(3).repeat())
    assert not (tmp_path / "inf" / "v1").exists()
    assert leftovers(tmp_path) == []
    assert files_under(tmp_path) == []


def test_infinite_dataset_via_cacheable_does_not_write(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(UnsupportedDatasetError, match="repeat"):
        store.get_or_build("inf", "v1", lambda: tf.data.Dataset.range(3).map(lambda x: x * 2).repeat())
    assert not store.exists("inf", "v1")
    assert files_under(tmp_path) == []


def _filtered(n: int) -> tf.data.Dataset:
    ds = tf.data.Dataset.range(n).filter(lambda x: x % 2 == 0)
    assert int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    return ds


@pytest.mark.parametrize(
    "limits", [BuildLimits(max_records=10), BuildLimits(max_bytes=200)], ids=["max_records", "max_bytes"]
)
def test_unknown_cardinality_over_limit_leaves_nothing(tmp_path: Path, limits: BuildLimits) -> None:
    store = make_store(tmp_path, limits=limits)
    with pytest.raises(CacheLimitExceededError, match="max_records" if limits.max_records else "max_bytes"):
        store.build("filt", "v1", _filtered(1000))
    assert not store.exists("filt", "v1")
    assert not (tmp_path / "filt" / "v1").exists()
    assert leftovers(tmp_path) == []
    assert files_under(tmp_path) == []


def test_unknown_cardinality_over_limit_keeps_previous_cache(tmp_path: Path) -> None:
    make_store(tmp_path).build("filt", "v1", _filtered(10))
    limited = make_store(tmp_path, limits=BuildLimits(max_records=10))
    with pytest.raises(CacheLimitExceededError):
        limited.build("filt", "v1", _filtered(1000))
    assert [int(x) for x in read_all(limited.open("filt", "v1"))] == [0, 2, 4, 6, 8]
    assert leftovers(tmp_path) == []


def test_unknown_cardinality_within_limit_builds(tmp_path: Path) -> None:
    store = make_store(tmp_path, limits=BuildLimits(max_records=500, max_bytes=1 << 20))
    manifest = store.build("filt", "v1", _filtered(1000))
    assert manifest.num_records == 500
    assert [int(x) for x in read_all(store.open("filt", "v1"))] == list(range(0, 1000, 2))
    # Exactly at the record limit is allowed.
    exact = make_store(tmp_path, limits=BuildLimits(max_records=500))
    assert exact.build("filt", "v2", _filtered(1000)).num_records == 500


class DatasetBroke(RuntimeError):
    pass


def failing_generator(n: int, fail_at: int) -> Iterator[dict[str, Any]]:
    for i, element in enumerate(elements(n, start=100)):
        if i == fail_at:
            raise DatasetBroke(f"user dataset failed at {i}")
        yield element


def test_python_generator_raising_mid_build_keeps_previous_cache(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("data", "v1", elements(20))
    old = store.manifest("data", "v1")
    with pytest.raises(DatasetBroke):
        store.build("data", "v1", failing_generator(5000, fail_at=3000))
    assert store.manifest("data", "v1").build_id == old.build_id
    values = read_all(store.open("data", "v1"))
    assert [int(v["i"]) for v in values] == list(range(20))
    assert leftovers(tmp_path) == []


def test_tf_py_function_raising_mid_build_keeps_previous_cache(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("data", "v1", tf.data.Dataset.range(10))
    old = store.manifest("data", "v1")

    def explode(x: Any) -> Any:
        if int(x) == 2500:
            raise DatasetBroke("boom in py_function")
        return x

    broken = tf.data.Dataset.range(5000).map(lambda x: tf.reshape(tf.py_function(explode, [x], tf.int64), []))
    with pytest.raises(Exception, match="boom in py_function"):
        store.build("data", "v1", broken)
    assert store.manifest("data", "v1").build_id == old.build_id
    assert [int(v) for v in read_all(store.open("data", "v1"))] == list(range(10))
    assert leftovers(tmp_path) == []


def test_exception_inside_writer_block_discards(tmp_path: Path) -> None:
    target = tmp_path / "w" / "v1"
    codec = RecordCodec(infer_spec(np.int64(0)))
    with pytest.raises(DatasetBroke):
        with CacheWriter(target, "w", "v1") as writer:
            writer.add_encoded([codec.encode([np.int64(i)]) for i in range(10_000)])
            raise DatasetBroke("stop")
    assert not target.exists()
    assert leftovers(tmp_path) == []


def test_submit_over_existing_cache_replaces_it_atomically(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("data", "v1", elements(50))
    old_reader = store.open("data", "v1")
    assert int(old_reader[0]["i"]) == 0  # the old environment is open and mapped
    old_stream = CacheDataRef(old_reader).stream()
    old_iter = iter(old_stream)
    assert int(next(old_iter)["i"]) == 0

    store.build("data", "v1", elements(30, start=1000))

    # The old reader keeps reading the old data, in full.
    assert [int(v["i"]) for v in read_all(old_reader)] == list(range(50))
    assert [int(v["i"]) for v in old_iter] == list(range(1, 50))
    # A new open sees the new data.
    new_reader = store.open("data", "v1")
    assert len(new_reader) == 30
    assert [int(v["i"]) for v in read_all(new_reader)] == list(range(1000, 1030))
    assert leftovers(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if not p.name.endswith(".lock")) == ["v1"]


def test_reader_opened_before_a_replacement_but_not_yet_read_keeps_old_data(tmp_path: Path) -> None:
    """``store.open`` returned before the rebuild: its reads must be the old cache's, not the new one's."""
    store = make_store(tmp_path)
    store.build("data", "v1", elements(50))
    old_reader = store.open("data", "v1")  # opened (manifest read, parts verified), nothing read yet
    store.build("data", "v1", elements(30, start=1000))
    assert len(old_reader) == 50
    assert [int(v["i"]) for v in read_all(old_reader)] == list(range(50))


def test_reader_opened_before_a_same_size_replacement_never_mixes_builds(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("data", "v1", elements(50))
    old_reader = store.open("data", "v1")
    store.build("data", "v1", elements(50, start=1000))
    # The old reader's manifest describes the old build: its records must be the old ones.
    assert [int(v["i"]) for v in read_all(old_reader)] == list(range(50))


def test_writer_without_records_and_a_closed_writer(tmp_path: Path) -> None:
    target = tmp_path / "w" / "v1"
    with CacheWriter(target, "w", "v1") as writer:
        manifest = writer.seal(TensorSpec("int64", ()))
    assert manifest.num_records == 0 and len(manifest.parts) == 1
    assert len(CacheReader(target)) == 0
    with pytest.raises(yogacache.BuildError):
        writer.add_encoded([b"x"])


def test_builds_leave_no_world_writable_files(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("perm", "v1", elements(5))
    for path in [tmp_path / "perm", *(tmp_path / "perm").rglob("*")]:
        assert not path.stat().st_mode & 0o002, path


def test_leftovers_of_a_crashed_build_are_cleaned_on_next_build(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    crashed = tmp_path / "data" / ".v1.tmp-deadbeef"
    crashed.mkdir(parents=True)
    (crashed / "part-00000.mdb").write_bytes(b"partial")
    store.build("data", "v1", elements(3))
    assert not crashed.exists()
    assert len(store.open("data", "v1")) == 3


@pytest.mark.parametrize("kernel_writeback", [True, False], ids=["sync_file_range", "env.sync"])
def test_early_writeback_during_a_build_keeps_every_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_writeback: bool
) -> None:
    import yogacache.format.durability as durability
    import yogacache.format.writer as writer_module

    monkeypatch.setattr(writer_module, "_TXN_BYTES", 64 << 10)  # many transactions
    monkeypatch.setattr(writer_module, "_WRITEBACK_EVERY_BYTES", 4096)
    if not kernel_writeback:
        monkeypatch.setattr(durability, "_sync_file_range", None)
    calls = []
    original = writer_module.CacheWriter._start_writeback
    monkeypatch.setattr(
        writer_module.CacheWriter, "_start_writeback", lambda self: (calls.append(1), original(self))
    )
    store = make_store(tmp_path)
    data = [{"i": np.int64(i), "x": np.full(300, i, dtype=np.float32)} for i in range(3000)]
    store.build("wb", "v1", data)
    assert len(calls) > 3
    store.verify_cache("wb", "v1")  # every part's hash matches its bytes
    reader = store.open("wb", "v1")
    got = read_all(reader)
    assert [int(e["i"]) for e in got] == list(range(3000))
    assert all(np.array_equal(e["x"], np.full(300, i, dtype=np.float32)) for i, e in enumerate(got))


def test_records_limit_is_checked_per_batch_but_exactly(tmp_path: Path) -> None:
    data = elements(2000)
    exact = make_store(tmp_path, limits=BuildLimits(max_records=2000))
    assert exact.build("lim", "v1", data).num_records == 2000
    over = make_store(tmp_path, limits=BuildLimits(max_records=1999))
    with pytest.raises(CacheLimitExceededError, match="more than 1999 records"):
        over.build("lim", "v2", data)
    assert not over.exists("lim", "v2")
    assert leftovers(tmp_path) == []


def test_large_records_across_parts_are_read_in_one_batch_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    images = rng.integers(0, 255, (60, 20_000), dtype=np.uint8)  # >= 16 KiB: per-row decoding
    store = make_store(tmp_path, part_size_bytes=300_000)
    store.build("big", "v1", [(images[i], np.int64(i)) for i in range(60)])
    assert len(store.manifest("big", "v1").parts) >= 4
    reader = store.open("big", "v1")
    order = rng.permutation(60)
    columns = reader.read_columns(order)
    assert columns[1].tolist() == order.tolist()
    assert np.array_equal(columns[0], images[order])


@pytest.mark.parametrize("floats, threaded", [(300, False), (8192, True)], ids=["1 KB inline", "32 KB threaded"])
def test_small_records_are_committed_inline_and_large_ones_on_the_writer_thread(
    tmp_path: Path, floats: int, threaded: bool
) -> None:
    """py-lmdb takes the interpreter lock back after each record: a writer thread storing small
    records would fight the producer for it, so they are committed on the producer's thread."""
    import threading

    seen: list[bool] = []

    def records() -> Iterator[dict[str, Any]]:
        for i in range(400):
            if i % 50 == 49:
                seen.append(any(t.name.startswith("yogacache-writer-") for t in threading.enumerate()))
            yield {"i": np.int64(i), "x": np.full(floats, i, dtype=np.float32)}

    store = make_store(tmp_path, part_size_bytes=1 << 20)
    store.build("ds", "v1", records())
    assert any(seen) is threaded
    got = read_all(store.open("ds", "v1"))
    assert [int(e["i"]) for e in got] == list(range(400))
    assert all(np.array_equal(e["x"], np.full(floats, i, dtype=np.float32)) for i, e in enumerate(got))
    store.verify_cache("ds", "v1")


def test_a_build_hides_the_existing_heap_from_the_collector_and_gives_it_back(tmp_path: Path) -> None:
    import gc

    counts: list[int] = []

    def records() -> Iterator[dict[str, Any]]:
        for i in range(100):
            if i in (0, 50, 99):  # the count walks the frozen heap: a few looks, not one per record
                counts.append(gc.get_freeze_count())
            yield {"i": np.int64(i)}

    assert gc.get_freeze_count() == 0
    make_store(tmp_path / "a").build("ds", "v1", records())
    assert min(counts) > 0  # frozen while records were written
    assert gc.get_freeze_count() == 0  # and given back after
    # A program that freezes objects itself keeps its own freeze, untouched.
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        counts.clear()
        make_store(tmp_path / "b").build("ds", "v1", records())
        # Never frozen again (the count would grow) nor given back (it would drop to 0); it may
        # shrink as frozen objects are freed, by this thread or another.
        assert 0 < min(counts) and max(counts) <= frozen and 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_parts_stay_lmdb_0_9_files_whatever_lmdb_default_lib_version_says(tmp_path: Path) -> None:
    """py-lmdb 3 bundles LMDB 1.0, whose files older py-lmdb and YogaDL cannot open, and writes
    them where LMDB_DEFAULT_LIB_VERSION=1 is set. The writer names LMDB 0.9's format."""
    build = textwrap.dedent(
        """
        import sys
        import numpy as np
        from yogacache.store.local import CacheStore
        store = CacheStore(sys.argv[1], show_progress=False)
        store.build("ds", "v1", [{"i": np.int64(i), "x": np.full(8, i, np.float32)} for i in range(500)])
        """
    )
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo), "LMDB_DEFAULT_LIB_VERSION": "1"}
    subprocess.run([sys.executable, "-c", build, str(tmp_path)], env=env, check=True, timeout=120)
    manifest = Manifest.load(tmp_path / "ds" / "v1")
    meta = (tmp_path / "ds" / "v1" / manifest.parts[0].name).read_bytes()[16:24]
    assert struct.unpack("<II", meta) == (0xBEEFC0DE, 1)  # magic, data format v1 (LMDB 0.9)
    with make_store(tmp_path).open("ds", "v1") as reader:
        assert [int(e["i"]) for e in read_all(reader)] == list(range(500))
