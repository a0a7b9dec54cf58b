"""Build leases under clock skew: expiry is decided by the waiter's own monotonic clock.

- A live holder whose wall clock runs 300 s behind (its lease's ``expires_at`` looks long past
  to everyone else) keeps its lease: nobody else builds while it renews.
- A crashed holder whose clock ran 10 minutes ahead (``expires_at`` far in the future) blocks
  the others only for the lease's duration, watched unchanged by the waiter itself.

The holder runs in its own process with its own (skewed) ``time.time``; both stores share one
bucket on moto's S3 server or fake-gcs-server.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.cloud_helpers import Builds, Cloud, dataset, expected_keys, finish, reader_keys, start_python
from yogacache.store.remote import LEASE_NAME, BuildWaitTimeoutError, RemoteCacheStore

PREFIX = "caches"
LEASE_SECONDS = 1.5


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    kind = request.param
    return Cloud(kind, request.getfixturevalue(f"{kind}_server"))


def waiter(cloud: Cloud, bucket: str, root: Path, wait_timeout: float) -> RemoteCacheStore:
    return RemoteCacheStore(
        cloud.store(bucket, PREFIX),
        root,
        lease_seconds=LEASE_SECONDS,
        poll_seconds=0.1,
        wait_timeout=wait_timeout,
        show_progress=False,
    )


HOLDER_SCRIPT = """
import os, sys, time
skew = float(sys.argv[5])
real_time = time.time
time.time = lambda: real_time() + skew  # this process's wall clock is off by ``skew`` seconds
from pathlib import Path
from tests.cloud_helpers import Cloud, dataset
from yogacache.store.remote import RemoteCacheStore
kind, bucket, root, go = sys.argv[1:5]
store = RemoteCacheStore(Cloud.from_environment(kind).store(bucket, "caches"), root, lease_seconds=1.5,
                         show_progress=False)

def make():
    Path(root, "building").touch()
    while not os.path.exists(go):
        time.sleep(0.02)
    return dataset(300)

reader = store.get_or_build("ds", "v1", make)
print('{"build_id": "%s"}' % reader.manifest.build_id)
"""


def test_a_live_holder_whose_clock_runs_behind_keeps_its_lease(cloud: Cloud, tmp_path: Path) -> None:
    bucket = cloud.new_bucket()
    go = tmp_path / "go"
    holder_root = tmp_path / "holder"
    holder_root.mkdir()
    env = cloud.node_env()
    holder = start_python(HOLDER_SCRIPT, cloud.kind, bucket, str(holder_root), str(go), "-300", env=env)
    try:
        deadline = time.monotonic() + 60
        while not (holder_root / "building").exists():
            assert holder.poll() is None, holder.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the holder never started building"
            time.sleep(0.02)
        lease = json.loads(cloud.raw_get(bucket, f"{PREFIX}/ds/v1/{LEASE_NAME}"))
        assert lease["expires_at"] < time.time() - 200  # by our clock, long expired

        make = Builds(dataset(300, 9))
        # Four lease durations: the holder renews all along, so the waiter never takes over.
        with pytest.raises(BuildWaitTimeoutError):
            waiter(cloud, bucket, tmp_path / "waiter", wait_timeout=4 * LEASE_SECONDS).get_or_build("ds", "v1", make)
        assert make.calls == 0

        go.touch()
        built = finish(holder)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    reader = waiter(cloud, bucket, tmp_path / "waiter", wait_timeout=30).get_or_build("ds", "v1", make)
    assert make.calls == 0
    assert reader.manifest.build_id == built["build_id"]
    assert reader_keys(reader) == expected_keys(300)


def test_a_crashed_holder_whose_clock_ran_ahead_blocks_only_for_the_lease_duration(
    cloud: Cloud, tmp_path: Path
) -> None:
    bucket = cloud.new_bucket()
    crashed = {"owner": "crashed:1", "build_id": "gone", "expires_at": time.time() + 600, "duration": LEASE_SECONDS}
    cloud.store(bucket, PREFIX).write(f"ds/v1/{LEASE_NAME}", json.dumps(crashed).encode())
    make = Builds(dataset(300, 3))
    # Without monotonic expiry the waiter would wait the 600 s the crashed clock claimed.
    reader = waiter(cloud, bucket, tmp_path / "waiter", wait_timeout=60).get_or_build("ds", "v1", make)
    assert make.calls == 1
    assert reader_keys(reader) == expected_keys(300, 3)


def test_a_lease_is_stale_only_after_being_watched_unchanged_for_its_duration(tmp_path: Path) -> None:
    """The decision uses the waiter's monotonic clock only (here a clock the test advances)."""
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.lease import Lease

    objects = FileObjectStore(tmp_path / "bucket")
    now = [1000.0]
    holder = Lease(objects, "lease", "holder", duration=30, wall_clock=lambda: 0.0)  # a clock at 1970
    assert holder.try_acquire()[0]
    contender = Lease(objects, "lease", "contender", duration=5, monotonic=lambda: now[0])
    try:
        assert contender.try_acquire()[0] is False  # first sighting
        now[0] += 29.0
        assert contender.try_acquire()[0] is False  # unchanged, but not yet for the holder's 30 s
        found = objects.read("lease")
        assert found is not None
        holder.token = objects.write("lease", found[0] + b" ", if_token=holder.token)  # a renewal
        now[0] += 29.0
        assert contender.try_acquire()[0] is False  # renewed: watching starts again
        now[0] += 29.0
        assert contender.try_acquire()[0] is False
        now[0] += 1.0
        acquired, previous = contender.try_acquire()
        assert acquired and previous is not None and previous.build_id == "holder"
    finally:
        contender.release()
        holder.release()
