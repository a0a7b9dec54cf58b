"""The remote key layout (store.keys): every key of a published cache, built in one place and
unchanged from the layout caches were published with."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from yogacache.errors import InvalidNameError
from yogacache.store import keys

PACKAGE = Path(__file__).resolve().parent.parent / "yogacache"


def _manifest() -> Any:
    """What the key layout reads of a manifest: its cache, its build and its parts' names."""
    part = SimpleNamespace(name="part-00000.mdb")
    return SimpleNamespace(dataset_id="imagenet", dataset_version="v1", build_id="b123", parts=(part,))


def test_the_layout_of_a_published_cache() -> None:
    manifest = _manifest()
    part = manifest.parts[0]
    assert keys.cache_key("imagenet", "v1") == "imagenet/v1/"
    assert keys.manifest_key("imagenet", "v1") == "imagenet/v1/manifest.json"
    assert keys.lease_key("imagenet", "v1") == "imagenet/v1/build-lease.json"
    assert keys.part_key(manifest, part) == "imagenet/v1/b123-part-00000.mdb"
    assert keys.part_key(manifest, part, build_prefixed=False) == "imagenet/v1/part-00000.mdb"
    assert keys.build_prefix("imagenet", "v1", "b123") == "imagenet/v1/b123-"
    assert keys.part_object_name("b123", part.name) == "b123-part-00000.mdb"
    assert keys.kept_keys("imagenet", "v1") == {
        "imagenet/v1/manifest.json",
        "imagenet/v1/build-lease.json",
        "imagenet/v1/cache.mdb",
    }


def test_listed_keys_are_read_back() -> None:
    assert keys.manifest_cache("imagenet/v1/manifest.json") == ("imagenet", "v1")
    assert keys.manifest_cache("imagenet/v1/b123-part-00000.mdb") is None
    assert keys.manifest_cache("a/imagenet/v1/manifest.json") is None
    assert keys.part_cache("imagenet/v1/b123-part-00000.mdb") == ("imagenet", "v1")
    assert keys.part_cache("imagenet/v1/b123-part-00000-001-a1b2.mdb") == ("imagenet", "v1")
    assert keys.part_cache("imagenet/v1/build-lease.json") is None
    assert keys.part_cache("imagenet/v1/cache.mdb") is None


@pytest.mark.parametrize("dataset_id, version", [("../etc", "v1"), ("ok", "a/b"), ("", "v1")])
def test_invalid_names_never_become_keys(dataset_id: str, version: str) -> None:
    with pytest.raises(InvalidNameError):
        keys.cache_key(dataset_id, version)


def test_no_other_module_spells_a_part_object_name() -> None:
    """A part object's name (``<build id>-<part name>``) is written in store.keys only."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "store" / "keys.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr):
                text = ast.unparse(node)
                if "build_id}-{part" in text or "build_id}-'" in text:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {text}")
    assert found == []
