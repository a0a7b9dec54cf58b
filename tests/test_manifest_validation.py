"""Malformed manifests are CorruptCacheError, with a message; names that become paths are checked.

A manifest comes from a disk another process wrote or from a bucket anyone with write access
filled: every field that reaches a path (ids, build id, part names) must be one safe path
component, and every number a finite integer in range, before anything is created from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from yogacache.backends.files import FileObjectStore
from yogacache.errors import CacheNotFoundError, CorruptCacheError, IncompatibleCacheError
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore

DATA = [{"x": np.int64(i)} for i in range(40)]


@pytest.fixture()
def store(tmp_path: Path) -> CacheStore:
    store = CacheStore(tmp_path / "caches", show_progress=False, part_size_bytes=1)
    store.build("data", "v1", DATA)
    assert len(store.manifest("data", "v1").parts) > 1
    return store


def manifest_text(store: CacheStore) -> str:
    return (store.cache_dir("data", "v1") / MANIFEST_NAME).read_text()


def edited(text: str, edit: Callable[[dict[str, Any]], None]) -> bytes:
    raw = json.loads(text)
    edit(raw)
    return json.dumps(raw).encode()


def set_field(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that sets ``a.b.0.c``-style ``path`` to ``value``."""

    def edit(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = raw
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return edit


# -- numbers JSON allows but a manifest cannot hold ----------------------------------------------
@pytest.mark.parametrize(
    ("literal", "field"),
    [
        ("Infinity", "num_records"),
        ("-Infinity", "num_bytes"),
        ("NaN", "num_records"),
        ("1e400", "num_bytes"),
        ("9" * 5000, "num_records"),
        ("9" * 5000, "parts.0.size_bytes"),
        ("Infinity", "parts.0.first_record"),
    ],
)
def test_non_finite_and_huge_numbers_are_corrupt(store: CacheStore, literal: str, field: str) -> None:
    marker = "__NUMBER__"
    text = edited(manifest_text(store), set_field(field, marker)).decode()
    data = text.replace(json.dumps(marker), literal).encode()
    with pytest.raises(CorruptCacheError, match=r"manifest where"):
        Manifest.from_bytes(data, "where")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_records", "40", "'num_records' must be an integer, not str"),
        ("num_records", True, "'num_records' must be an integer, not bool"),
        ("num_records", 40.0, "'num_records' must be an integer, not float"),
        ("num_bytes", -1, "'num_bytes' is out of range"),
        ("num_bytes", 1 << 70, "'num_bytes' is out of range"),
        ("num_records", None, "missing the field 'num_records'"),
        ("dataset_id", 7, "'dataset_id' must be a string, not int"),
        ("build_id", ["a"], "'build_id' must be a string, not list"),
        ("parts", {"name": "p"}, "'parts' must be a list, not dict"),
        ("parts.0", "part-00000.mdb", r"parts\[0\]\) is not an object"),
        ("parts.0.size_bytes", "20480", "'size_bytes' must be an integer, not str"),
        ("parts.0.sha256", "zz", "'sha256' is not a hex SHA-256"),
        ("parts.0.name", 5, "'name' must be a string, not int"),
        ("extra", [1], "'extra' must be an object, not list"),
        ("format_version", "1", "no valid format_version"),
        ("format_version", True, "no valid format_version"),
        ("element_spec", {"tensor": {"dtype": "int64", "shape": ["a"]}}, "malformed element_spec"),
        ("element_spec", [1, 2], "malformed element_spec"),
        ("codec", 3, "codec that is not a name"),
    ],
)
def test_wrong_types_are_corrupt_with_a_message_naming_the_field(
    store: CacheStore, field: str, value: Any, message: str
) -> None:
    with pytest.raises(CorruptCacheError, match=message):
        Manifest.from_bytes(edited(manifest_text(store), set_field(field, value)), "where")


@pytest.mark.parametrize("data", [b"", b"\xff\xfe", b"[]", b"null", b"{", b"[" * 100_000])
def test_not_a_manifest_is_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptCacheError, match="manifest where"):
        Manifest.from_bytes(data, "where")


def test_a_future_format_version_is_incompatible_not_corrupt(store: CacheStore) -> None:
    with pytest.raises(IncompatibleCacheError, match="upgrade yogacache"):
        Manifest.from_bytes(edited(manifest_text(store), set_field("format_version", 99)), "where")


# -- names that would become paths ---------------------------------------------------------------
TRAVERSALS = ["x/../../OUTSIDE/planted", "..", ".", "/abs", "a/b", ".hidden", "", "a\x00b", "x" * 300]


@pytest.mark.parametrize("value", TRAVERSALS)
@pytest.mark.parametrize("field", ["build_id", "dataset_id", "dataset_version", "parts.0.name"])
def test_a_name_that_is_not_one_safe_path_component_is_corrupt(store: CacheStore, field: str, value: str) -> None:
    with pytest.raises(CorruptCacheError, match="manifest where"):
        Manifest.from_bytes(edited(manifest_text(store), set_field(field, value)), "where")


def test_a_part_named_like_the_manifest_or_listed_twice_is_corrupt(store: CacheStore) -> None:
    text = manifest_text(store)
    with pytest.raises(CorruptCacheError, match="invalid part 'manifest.json'"):
        Manifest.from_bytes(edited(text, set_field("parts.0.name", MANIFEST_NAME)), "where")
    second = json.loads(text)["parts"][1]["name"]
    with pytest.raises(CorruptCacheError, match=f"invalid part '{second}'"):
        Manifest.from_bytes(edited(text, set_field("parts.0.name", second)), "where")


def test_the_writers_manifest_still_parses(store: CacheStore) -> None:
    manifest = Manifest.from_bytes(manifest_text(store).encode(), "where")
    assert manifest == store.manifest("data", "v1")
    assert Manifest.from_bytes(manifest.to_bytes(), "again") == manifest


def test_a_remote_manifest_with_a_traversing_build_id_creates_nothing(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publisher = RemoteCacheStore(FileObjectStore(bucket), tmp_path / "node-a", show_progress=False)
    publisher.build("data", "v1", DATA)
    key = bucket / "data" / "v1" / MANIFEST_NAME
    bad_id = "x/../../../../OUTSIDE/planted"
    key.write_bytes(edited(key.read_text(), set_field("build_id", bad_id)))
    node = tmp_path / "node-b"
    node.mkdir()
    reader_store = RemoteCacheStore(FileObjectStore(bucket), node, show_progress=False)

    with pytest.raises(CorruptCacheError, match="build_id 'x/../../../../OUTSIDE/planted' is not allowed"):
        reader_store.open("data", "v1")

    assert list(node.rglob("*")) == []  # no directory, no lock, no download
    assert not (tmp_path / "OUTSIDE").exists()


# -- the local store lists and removes caches with a bad manifest --------------------------------
@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"format": "yogacache", "format_version": Infinity}', "infinite", "huge"]
)
def test_list_marks_a_bad_manifest_and_keeps_the_others(store: CacheStore, content: bytes | str) -> None:
    store.build("data", "v2", DATA[:5])
    store.build("other", "v1", DATA[:3])
    path = store.cache_dir("data", "v2") / MANIFEST_NAME
    if isinstance(content, str):  # the real manifest with one number JSON allows but int() refuses
        number = {"infinite": "Infinity", "huge": "9" * 5000}[content]
        content = path.read_text().replace('"num_records": 5', f'"num_records": {number}').encode()
        assert number.encode() in content
    path.write_bytes(content)

    entries = store.list()

    assert [(e.dataset_id, e.dataset_version) for e in entries] == [("data", "v1"), ("data", "v2"), ("other", "v1")]
    bad = entries[1]
    assert bad.local is None and bad.local_path == store.cache_dir("data", "v2")
    assert bad.error is not None and "manifest" in bad.error
    assert entries[0].error is None and entries[0].local is not None
    assert entries[2].local is not None and entries[2].local.num_records == 3


def test_list_marks_a_future_format_and_an_unreadable_manifest(store: CacheStore) -> None:
    future = store.cache_dir("data", "v1") / MANIFEST_NAME
    future.write_bytes(edited(future.read_text(), set_field("format_version", 3)))
    store.build("data", "v2", DATA[:5])
    (store.cache_dir("data", "v2") / MANIFEST_NAME).unlink()
    (store.cache_dir("data", "v2") / MANIFEST_NAME).mkdir()  # not even a file

    entries = {e.dataset_version: e for e in store.list()}

    assert entries["v1"].error is not None and "format version 3" in entries["v1"].error
    assert entries["v2"].error is not None and "not a file" in entries["v2"].error


@pytest.mark.parametrize("content", [b"", b"{not json", b"[" * 100_000])
def test_remove_removes_a_cache_whose_manifest_is_empty_or_corrupt(store: CacheStore, content: bytes) -> None:
    store.build("data", "v2", DATA[:5])
    directory = store.cache_dir("data", "v1")
    (directory / MANIFEST_NAME).write_bytes(content)

    assert store.remove("data", "v1") == [str(directory)]

    assert not directory.exists()
    assert store.manifest("data", "v2").num_records == 5  # the other version is untouched
    with pytest.raises(CacheNotFoundError):
        store.remove("data", "v1")
