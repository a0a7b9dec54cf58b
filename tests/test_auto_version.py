"""``dataset_version="auto"`` and versions derived from a source: one name for one cache.

"auto" derives the version from a ``yogacache.sources.from_url`` source (its pins), as
``yogacache import`` does; where no version can be derived it is refused (never a cache
literally named "auto"). A derived version (``src-<16 hex>``) names the data itself, so the
train and validation decorators use it as it is: a cache made by ``yogacache import`` is the
one ``cache_train_dataset(id, source.auto_version())`` finds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache
from tests.sources_helpers import tar_bytes
from yogacache.errors import UnsupportedDatasetError
from yogacache.sources import from_url
from yogacache.sources.importer import import_source

RECORDS = 12


def shards(directory: Path) -> Path:
    """Two WebDataset shards of six samples each."""
    directory.mkdir()
    for shard in range(2):
        members = {}
        for i in range(shard * 6, shard * 6 + 6):
            members[f"s{i:04d}.cls"] = str(i).encode()
            members[f"s{i:04d}.txt"] = f"text {i}".encode()
        (directory / f"train-{shard}.tar").write_bytes(tar_bytes(members))
    return directory


def layer(root: Path) -> yogacache.DataLayer:
    return yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(root)}, show_progress=False)


def classes(records: Any) -> list[int]:
    return sorted(int(bytes(record["cls"])) for record in records)


class Counting:
    """A dataset function returning ``data`` that counts its calls."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.data


def test_auto_derives_the_version_from_the_source_as_import_does(tmp_path: Path) -> None:
    source = from_url(str(shards(tmp_path / "data")) + "/")
    derived = source.auto_version()
    assert derived.startswith("src-")
    caches = layer(tmp_path / "caches")
    ref = caches.cache_dataset("web", "auto")(lambda: source)()
    assert classes(ref.stream()) == list(range(RECORDS))
    assert caches.store.exists("web", derived)
    assert not caches.store.exists("web", "auto") and not (tmp_path / "caches" / "web" / "auto").exists()


@pytest.mark.parametrize("decorate", ["cache_dataset", "cache_train_dataset", "cache_validation_dataset"])
def test_auto_is_refused_where_no_version_can_be_derived(tmp_path: Path, decorate: str) -> None:
    caches = layer(tmp_path)
    make = Counting([{"x": np.int64(i)} for i in range(5)])
    kwargs = {} if decorate == "cache_dataset" else {"returns": "stream"}
    with pytest.raises(UnsupportedDatasetError) as raised:
        getattr(caches, decorate)("plain", "auto", **kwargs)(make)()
    message = str(raised.value)
    assert 'dataset_version="auto"' in message and "from_url" in message and "list" in message, message
    assert "pass a version of your own" in message
    assert not (tmp_path / "plain").exists() or not any((tmp_path / "plain").iterdir())


def test_auto_with_a_builder_of_build_shards_is_refused_when_decorating(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match='dataset_version="auto".*build_shards'):
        layer(tmp_path).cache_dataset("plain", "auto", workers=2, build_shards=4)


@pytest.mark.parametrize("version", ["derived", "auto"])
@pytest.mark.parametrize("decorate", ["cache_train_dataset", "cache_validation_dataset", "cache_dataset"])
def test_a_cache_made_by_import_is_the_one_the_decorators_find(tmp_path: Path, decorate: str, version: str) -> None:
    source = from_url(str(shards(tmp_path / "data")) + "/")
    caches = layer(tmp_path / "caches")
    imported = import_source(caches.store, "web", source, show_progress=False)
    assert imported.outcome == "built" and imported.manifest.dataset_version == source.auto_version()

    make = Counting(source)
    kwargs = {} if decorate == "cache_dataset" else {"returns": "stream"}
    given = source.auto_version() if version == "derived" else "auto"
    result = getattr(caches, decorate)("web", given, **kwargs)(make)()
    records = result.stream() if decorate == "cache_dataset" else result
    assert classes(records) == list(range(RECORDS))
    assert make.calls == (1 if version == "auto" else 0)  # "auto" makes the source to derive from it
    assert sorted(p.name for p in (tmp_path / "caches" / "web").iterdir() if not p.name.startswith(".")) == [
        source.auto_version()
    ]  # no <version>_train, no second build


def test_a_version_of_ones_own_keeps_the_train_and_validation_suffixes(tmp_path: Path) -> None:
    caches = layer(tmp_path)
    data = [{"x": np.int64(i)} for i in range(5)]
    caches.cache_train_dataset("plain", "v1", returns="stream")(lambda: data)()
    caches.cache_validation_dataset("plain", "v1", returns="stream")(lambda: data)()
    assert caches.store.exists("plain", "v1_train") and caches.store.exists("plain", "v1_val")
