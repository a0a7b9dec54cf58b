"""A published manifest is read with a size cap: an oversized object is refused, never loaded whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud
from yogacache.backends.files import FileObjectStore
from yogacache.errors import CorruptCacheError
from yogacache.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES
from yogacache.store.remote import RemoteCacheStore


@pytest.fixture(params=["file", "s3", "gcs", "azure"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "file":
        return FileObjectStore(tmp_path / "bucket")
    cloud = Cloud(request.param, request.getfixturevalue(f"{request.param}_server"))
    return cloud.store(cloud.new_bucket(), "caches")


def test_an_oversized_remote_manifest_is_refused_after_a_capped_read(objects: Any, tmp_path: Path) -> None:
    store = RemoteCacheStore(objects, tmp_path / "node", show_progress=False)
    store.build("big", "v1", [{"x": i} for i in range(10)])
    key = store.key("big", "v1", MANIFEST_NAME)
    objects.write(key, b" " * (MAX_MANIFEST_BYTES + 1000))
    found = objects.read(key, max_bytes=1000)
    assert found is not None and len(found[0]) == 1001  # a ranged read: at most max_bytes + 1
    with pytest.raises(CorruptCacheError, match="larger than"):
        store.remote_manifest("big", "v1")
    store.build("big", "v1", [{"x": i} for i in range(3)])  # an oversized manifest can be replaced
    manifest = store.remote_manifest("big", "v1")
    assert manifest is not None and manifest.num_records == 3


def test_a_capped_read_of_an_empty_object_returns_it(objects: Any) -> None:
    token = objects.write("empty", b"")
    found = objects.read("empty", max_bytes=100)
    assert found is not None and found[0] == b""
    assert token is None or found[1] == token
