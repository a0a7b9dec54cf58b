"""The manifest records which codec wrote the records; unknown codecs are refused, not misread."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from yogacache.errors import CorruptCacheError, IncompatibleCacheError
from yogacache.format.codec import CODEC_NAME
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.local import CacheStore

FIXTURES = Path(__file__).parent / "fixtures" / "cache_0_1_0"


def build(root: Path) -> CacheStore:
    store = CacheStore(root, show_progress=False)
    store.build("data", "v1", [{"i": np.int64(i)} for i in range(10)])
    return store


def edit_manifest(root: Path, **fields: object) -> Path:
    path = root / "data" / "v1" / MANIFEST_NAME
    raw = json.loads(path.read_text())
    raw.update(fields)
    path.write_text(json.dumps(raw))
    return path


def test_the_writer_records_its_codec(tmp_path: Path) -> None:
    manifest = build(tmp_path).manifest("data", "v1")
    raw = json.loads((tmp_path / "data" / "v1" / MANIFEST_NAME).read_text())
    assert raw["codec"] == CODEC_NAME == "msgpack-leaves-v1"
    assert manifest.codec == CODEC_NAME
    assert Manifest.from_bytes(manifest.to_bytes(), "test") == manifest


def test_a_manifest_without_codec_means_msgpack_leaves_v1(tmp_path: Path) -> None:
    for version in ("fixed", "ragged"):
        raw = json.loads((FIXTURES / version / MANIFEST_NAME).read_text())
        assert "codec" not in raw  # written by yogacache 0.1.0
        assert Manifest.load(FIXTURES / version).codec == "msgpack-leaves-v1"
    shutil.copytree(FIXTURES, tmp_path / "fixture")
    reader = CacheStore(tmp_path, show_progress=False).open("fixture", "fixed")
    assert [int(e["label"]) for e in reader.read_elements(range(len(reader)))] == list(range(50))


def test_an_unknown_codec_is_incompatible_and_says_to_upgrade(tmp_path: Path) -> None:
    store = build(tmp_path)
    path = edit_manifest(tmp_path, codec="arrow-columns-v7")
    for attempt in (
        lambda: store.open("data", "v1"),
        lambda: store.verify_cache("data", "v1"),
        lambda: CacheStore(tmp_path, show_progress=False).get_or_build("data", "v1", lambda: []),
    ):
        with pytest.raises(IncompatibleCacheError, match="arrow-columns-v7") as info:
            attempt()
        assert "upgrade yogacache" in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("codec", [None, 7, ["msgpack-leaves-v1"]])
def test_a_codec_that_is_not_a_name_is_corrupt(tmp_path: Path, codec: object) -> None:
    store = build(tmp_path)
    edit_manifest(tmp_path, codec=codec)
    with pytest.raises(CorruptCacheError, match="codec"):
        store.open("data", "v1")
