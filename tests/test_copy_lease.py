"""A copy holds the destination's build lease (the one ``get_or_build`` uses): a node that wants
to build the cache at the destination while the copy runs waits for it, then reads the copied
cache; it never builds.

Real moto server; the fault proxy slows the copy's part requests so that the builder arrives
mid-copy. The waits are hang guards, not timings.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from tests.cloud_helpers import dataset, expected_keys, reader_keys
from tests.faultproxy import FaultProxy
from yogacache.backends.s3 import S3ObjectStore
from yogacache.store.copy import copy_cache
from yogacache.store.lease import LEASE_NAME, Lease
from yogacache.store.remote import RemoteCacheStore

N = 1000
HANG_GUARD = 120.0


class Builds:
    """A make_data that counts its calls (it must never run at the destination)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return dataset(N, 5)


def test_a_builder_at_the_destination_waits_for_a_running_copy_and_uses_it(s3_server: Any, tmp_path: Path) -> None:
    source_bucket, target_bucket = s3_server.new_bucket(), s3_server.new_bucket()
    origin = RemoteCacheStore(
        S3ObjectStore(source_bucket, "caches", endpoint_url=s3_server.endpoint_url),
        tmp_path / "builder",
        part_size_bytes=100_000,
        show_progress=False,
    )
    built = origin.get_or_build("ds", "v1", lambda: dataset(N))
    assert len(built.manifest.parts) >= 3
    built.close()

    with FaultProxy(s3_server.endpoint_url) as proxy:
        slow = proxy.add_rule(action="delay", method="PUT", path_contains="-part-", seconds=3.0)
        outcome: dict[str, Any] = {}

        def copy() -> None:
            try:
                outcome["report"] = copy_cache(
                    S3ObjectStore(source_bucket, "caches", endpoint_url=proxy.url),
                    S3ObjectStore(target_bucket, "caches", endpoint_url=proxy.url),
                    "ds",
                    "v1",
                    show_progress=False,
                )
            except BaseException as error:  # reported below
                outcome["error"] = error

        copier = threading.Thread(target=copy)
        copier.start()
        deadline = time.monotonic() + HANG_GUARD
        while slow.hits == 0:  # the copy's parts are under way
            assert copier.is_alive() and time.monotonic() < deadline, outcome
            time.sleep(0.02)

        target = S3ObjectStore(target_bucket, "caches", endpoint_url=s3_server.endpoint_url)
        holder = Lease.read(target, f"ds/v1/{LEASE_NAME}")
        assert holder is not None and not holder.released and holder.build_id == built.manifest.build_id
        builds = Builds()
        node = RemoteCacheStore(target, tmp_path / "node", poll_seconds=0.1, show_progress=False)
        reader = node.get_or_build("ds", "v1", builds)  # waits for the copy's lease, then its manifest
        copier.join(HANG_GUARD)
    assert not copier.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert outcome["report"].published
    assert builds.calls == 0  # the builder never built: it waited and used the copy
    assert reader.manifest.freshness == built.manifest.freshness
    assert reader_keys(reader) == expected_keys(N)
    reader.close()
