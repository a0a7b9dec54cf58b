"""A build lease whose holder was killed on this node is taken over at once, not after the lease's
duration: the lease names its process (boot id, pid namespace, pid, start time), which a waiter
on the same node can check. A live holder, or one this node cannot check (another boot, another
pid namespace), is waited for as before.

Holders are real processes (killed with SIGKILL); the bucket is moto's S3 server, through the
same copy that waited 2 minutes after a killed ``yogacache copy``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, python_env
from yogacache.store.lease import Lease, holder_exited, process_identity

HOLD = textwrap.dedent(
    """
    import sys, time
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.lease import Lease
    lease = Lease(FileObjectStore(sys.argv[1]), "lease", "holder", duration=600)
    assert lease.try_acquire()[0]
    print("held", flush=True)
    time.sleep(600)
    """
)


def hold(bucket: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(bucket)], stdout=subprocess.PIPE, text=True, env=python_env()
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_killed_holder_on_this_node_is_taken_over_at_once(tmp_path: Path) -> None:
    from yogacache.backends.files import FileObjectStore

    objects = FileObjectStore(tmp_path / "bucket")
    holder = hold(tmp_path / "bucket")
    contender = Lease(objects, "lease", "contender", duration=600)
    try:
        assert contender.try_acquire()[0] is False  # alive: waited for, duration or not
        assert contender.try_acquire()[0] is False
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        acquired, previous = contender.try_acquire()
        assert acquired and previous is not None and previous.build_id == "holder"
    finally:
        contender.release()
        holder.kill()
        holder.wait()


def test_a_holder_this_node_cannot_check_is_waited_for(tmp_path: Path) -> None:
    from yogacache.backends.files import FileObjectStore

    me = process_identity()
    assert me is not None and not holder_exited(me)
    for elsewhere in ({**me, "boot_id": "another-boot", "pid": 999_999_999},
                      {**me, "pid_ns": 1, "pid": 999_999_999}):
        assert not holder_exited(elsewhere)
    assert holder_exited({**me, "pid": 999_999_999})  # no such process on this node
    objects = FileObjectStore(tmp_path / "bucket")
    objects.write("lease", json.dumps({
        "owner": "other:1", "build_id": "other", "expires_at": time.time() + 600, "duration": 600,
        "process": {**me, "boot_id": "another-boot", "pid": 999_999_999},
    }).encode())
    contender = Lease(objects, "lease", "contender", duration=600)
    assert contender.try_acquire()[0] is False
    assert contender.try_acquire()[0] is False


COPY = textwrap.dedent(
    """
    import sys
    from yogacache.store.copy import copy_cache
    copy_cache(sys.argv[1], sys.argv[2], "ds", "v1", show_progress=False)
    """
)


@pytest.mark.slow
def test_a_copy_killed_half_way_is_resumed_without_waiting_out_its_lease(
    s3_server: Any, tmp_path: Path
) -> None:
    from tests.cloud_helpers import dataset, expected_keys, reader_keys
    from tests.faultproxy import FaultProxy
    from yogacache.store.copy import copy_cache
    from yogacache.store.remote import RemoteCacheStore

    cloud = Cloud("s3", s3_server)
    source_bucket, target_bucket = cloud.new_bucket(), cloud.new_bucket()
    RemoteCacheStore(cloud.store(source_bucket, "caches"), tmp_path / "builder", part_size_bytes=16 << 10,
                     show_progress=False).get_or_build("ds", "v1", lambda: dataset(400))
    proxy = FaultProxy(s3_server.endpoint_url)
    proxy.add_rule(action="delay", method="PUT", path_contains="-part-", seconds=0.5)
    try:
        source_config = tmp_path / "source.json"
        source_config.write_text(json.dumps(cloud.config(source_bucket, "caches")))
        target_config = tmp_path / "target.json"
        target_config.write_text(json.dumps(dict(cloud.config(target_bucket, "caches"), endpoint_url=proxy.url)))
        process = subprocess.Popen([sys.executable, "-c", COPY, str(source_config), str(target_config)],
                                   env=python_env())
        target = cloud.store(target_bucket, "caches")
        deadline = time.monotonic() + 120
        while not any("-part-" in info.key for info in target.list("ds/v1/")):
            assert time.monotonic() < deadline and process.poll() is None, "the copy never started"
            time.sleep(0.1)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        started = time.monotonic()
        report = copy_cache(source_config, cloud.store(target_bucket, "caches"), "ds", "v1", show_progress=False)
        assert report.published
        # The killed copy's lease (120 s) was taken over at once: its process is gone.
        assert time.monotonic() - started < 60
        reader = RemoteCacheStore(cloud.store(target_bucket, "caches"), tmp_path / "reader",
                                  show_progress=False).open("ds", "v1")
        assert reader_keys(reader) == expected_keys(400)
    finally:
        proxy.stop()
