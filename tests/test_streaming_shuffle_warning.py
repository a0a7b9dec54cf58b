"""A streamed cache larger than the node's budget, read by a mode that touches every part at
random ("shard", "global"), warns once with the re-download volume; "parts" does not."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from yogacache.backends.files import FileObjectStore
from yogacache.dataref import CacheDataRef
from yogacache.store.remote import RemoteCacheStore

PART_SIZE = 64 << 10


def _streamed_reader(tmp_path: Path, limit: int):  # type: ignore[no-untyped-def]
    bucket = tmp_path / "bucket"
    data = [(np.full((1024,), i % 256, dtype=np.uint8), i) for i in range(600)]
    RemoteCacheStore(FileObjectStore(bucket), tmp_path / "builder", part_size_bytes=PART_SIZE,
                     show_progress=False).get_or_build("ds", "v1", lambda: data)
    node = RemoteCacheStore(FileObjectStore(bucket), tmp_path / "node", streaming=True,
                            local_cache_limit=limit, show_progress=False)
    return node.open("ds", "v1")


@pytest.mark.parametrize("mode", ["shard", "global"])
def test_a_random_mode_over_budget_warns_once_with_the_volume(
    mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _streamed_reader(tmp_path, limit=4 * PART_SIZE + (64 << 10)) as reader:
        assert reader.streaming_budget is not None and len(reader.manifest.parts) >= 8
        ref = CacheDataRef(reader)
        with caplog.at_level(logging.WARNING, logger="yogacache.read.pipeline"):
            for _ in range(2):  # a second stream of the same cache does not repeat it
                stream = ref.stream(shuffle=True, shuffle_seed=3, shuffle_mode=mode)
                assert sum(1 for _ in stream) == 600  # reading still works, every record once
    warnings = [r.getMessage() for r in caplog.records if "per epoch" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"shuffle_mode={mode!r}" in warnings[0] and "shuffle_mode='parts'" in warnings[0]


def test_parts_mode_and_a_cache_within_budget_do_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with _streamed_reader(tmp_path, limit=4 * PART_SIZE + (64 << 10)) as reader:
        with caplog.at_level(logging.WARNING, logger="yogacache.read.pipeline"):
            stream = CacheDataRef(reader).stream(shuffle=True, shuffle_seed=3, shuffle_mode="parts")
            assert sum(1 for _ in stream) == 600
    with _streamed_reader(tmp_path / "roomy", limit=1 << 30) as roomy:
        with caplog.at_level(logging.WARNING, logger="yogacache.read.pipeline"):
            stream = CacheDataRef(roomy).stream(shuffle=True, shuffle_seed=3, shuffle_mode="global")
            assert sum(1 for _ in stream) == 600
    assert not [r for r in caplog.records if "per epoch" in r.getMessage()]
