"""Function arguments are not part of the cache key (YogaDL), but the manifest records their
fingerprint and a hit made with other arguments warns (issue 9.15)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache
from yogacache.dataref import ARGUMENTS_EXTRA_KEY, arguments_fingerprint
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.storage import LFSConfigurations, LFSStorage


def ids(ref: Any) -> list[int]:
    return [int(e[1]) for e in ref.stream()]


def test_a_hit_with_other_arguments_warns_and_returns_the_cache(tmp_path: Path) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))

    @storage.cacheable("ds", "1")
    def make(size: int, scale: float = 1.0, token: str = "") -> Any:
        return [(np.full(2, i * scale, np.float32), i) for i in range(size)]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ids(make(3, token="hunter2-secret")) == [0, 1, 2]
        # The same arguments, spelled otherwise: no warning.
        assert ids(make(size=3, scale=1.0, token="hunter2-secret")) == [0, 1, 2]
    with pytest.warns(UserWarning, match=r"make\(\) was called with other arguments than those the cache ds:1"):
        assert ids(make(7, token="hunter2-secret")) == [0, 1, 2]  # YogaDL's semantics: the cache
    with pytest.warns(UserWarning, match="not part of the cache key"):
        make(3, token="other")
    manifest = Manifest.load(tmp_path / "ds" / "1")
    assert manifest.extra[ARGUMENTS_EXTRA_KEY]["fingerprint"].startswith("sha256:")
    assert "hunter2" not in (tmp_path / "ds" / "1" / MANIFEST_NAME).read_text()  # only a hash is kept


def test_decorators_warn_on_other_arguments(tmp_path: Path) -> None:
    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": str(tmp_path)}, rank=0, num_shards=1, show_progress=False
    )

    @layer.cache_train_dataset("ds", "1", returns="stream")
    def make(size: int) -> Any:
        return [(np.zeros(2, np.int32), i) for i in range(size)]

    assert len(list(make(4))) == 4
    with pytest.warns(UserWarning, match="other arguments"):
        assert len(list(make(9))) == 4


def test_a_cache_without_a_recorded_fingerprint_does_not_warn(tmp_path: Path) -> None:
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    storage.submit([(np.zeros(2, np.int32), i) for i in range(3)], "ds", "1")

    @storage.cacheable("ds", "1")
    def make(size: int) -> Any:
        raise AssertionError("submitted already")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ids(make(5)) == [0, 1, 2]


def test_fingerprint_compares_values_not_reprs() -> None:
    def make(a: Any, b: Any = None) -> None: ...

    same = [
        ((np.arange(3),), {}),
        ((), {"a": np.arange(3)}),
        ((np.arange(3), None), {}),
    ]
    prints = {arguments_fingerprint(make, args, kwargs) for args, kwargs in same}
    assert len(prints) == 1
    assert arguments_fingerprint(make, (np.arange(4),), {}) not in prints
    assert arguments_fingerprint(make, ({"x": 1.0, "y": [1, 2]},), {}) == arguments_fingerprint(
        make, ({"y": [1, 2], "x": 1.0},), {}
    )
    assert arguments_fingerprint(make, (object(),), {}) == arguments_fingerprint(make, (object(),), {})
