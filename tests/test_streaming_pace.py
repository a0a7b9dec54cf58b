"""Fetching ahead at the store's pace: a streamed cache whose parts take longer to download than
the reader takes to read one is fetched further ahead, so that a mixture's component published on
a slower store (another region) keeps up with the others, and the records stay exact."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import unique
from tests.faultproxy import FaultProxy
from yogacache.backends.base import DEFAULT_TRANSFER_THREADS
from yogacache.backends.s3 import S3ObjectStore
from yogacache.mixture import Mixture
from yogacache.read import pipeline
from yogacache.store.remote import RemoteCacheStore
from yogacache.store.streaming import MAX_AHEAD, pace_ahead

PART_BYTES = 24 << 10  # 24 records of 1 KiB a part
RECORDS = 240  # ten parts per component
READ = 6
SLOW_SECONDS = 1.0  # each part GET of the slow store


def test_pace_ahead_is_download_time_over_reading_time() -> None:
    assert pace_ahead(None, 1.0) == 0 and pace_ahead(1.0, None) == 0  # nothing measured yet
    assert pace_ahead(0.05, 0.1) == 1
    assert pace_ahead(4.0, 1.0) == 4
    assert pace_ahead(4.1, 1.0) == 5
    assert pace_ahead(100.0, 0.0) == MAX_AHEAD


def _data(fill: int) -> list[tuple[np.ndarray, int]]:
    return [(np.full(256, i + fill, np.int32), i + fill) for i in range(RECORDS)]


def _labels(mixture: Mixture, epochs: int, pause: float = 0.0) -> list[list[int]]:
    stream = mixture.stream(shuffle=True, shuffle_seed=7, shuffle_mode="parts")
    out = []
    for _ in range(epochs):
        labels = []
        for position, (array, label) in enumerate(stream):
            assert (array == label).all()
            labels.append(int(label))
            if pause and position % READ == 0:
                time.sleep(pause)  # the reader's own work per read
        out.append(labels)
    return out


def test_a_component_on_a_slower_store_is_fetched_further_ahead(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline.ReadSizes, "for_records", classmethod(lambda cls, *cache: cls(full=READ, first=READ)))
    bucket = s3_server.new_bucket()
    prefixes = {"near": unique("near"), "far": unique("far")}
    for fill, (name, prefix) in enumerate(prefixes.items()):
        objects = S3ObjectStore(bucket, prefix, endpoint_url=s3_server.endpoint_url)
        builder = RemoteCacheStore(
            objects, tmp_path / f"builder-{name}", part_size_bytes=PART_BYTES, show_progress=False
        )
        builder.get_or_build(name, "v1", lambda fill=fill: _data(fill * 10_000))

    def open_streamed(node: Path, endpoints: dict[str, str], limit: int) -> list[Any]:
        return [
            RemoteCacheStore(
                S3ObjectStore(bucket, prefix, endpoint_url=endpoints[name]),
                node,
                show_progress=False,
                streaming=True,
                local_cache_limit=limit,
            ).open(name, "v1")
            for name, prefix in prefixes.items()
        ]

    # The oracle: the same mixture streamed under the same budget with no slow store (the budget
    # fits the "parts" windows, so whole local copies read in another order), checked against
    # the components' records: each epoch reads each record once (weights 1:1, one pass each).
    direct = {name: s3_server.endpoint_url for name in prefixes}
    probe = open_streamed(tmp_path / "probe", direct, None)  # type: ignore[arg-type]
    total = sum(reader.manifest.total_size_bytes for reader in probe)
    reference = Mixture(open_streamed(tmp_path / "reference", direct, total // 2), weights=[1, 1])
    expected = _labels(reference, epochs=1)
    assert sorted(expected[0]) == [i + fill for fill in (0, 10_000) for i in range(RECORDS)]
    reference.close()

    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add_rule(action="delay", method="GET", path_contains=f"{prefixes['far']}/", seconds=SLOW_SECONDS)
        streamed = open_streamed(tmp_path / "node", {**direct, "far": proxy.url}, total // 2)
        mixture = Mixture(streamed, weights=[1, 1])
        assert _labels(mixture, epochs=1, pause=0.01) == expected
        near, far = (reader._provider for reader in streamed)
        assert far._fetch_seconds >= SLOW_SECONDS * 0.9 > near._fetch_seconds
        assert near._ahead_count() == 2  # the budget's two: this store keeps up
        fits = (total // 2) // max(part.size_bytes for part in streamed[1].manifest.parts)
        paced = pace_ahead(far._fetch_seconds, far._step_seconds)
        assert paced >= 3  # a download takes several parts' reading
        assert far._ahead_count() == min(paced, DEFAULT_TRANSFER_THREADS, fits // 2) > near._ahead_count()
        mixture.close()
