"""Ctrl-C and SIGTERM stop a ``yogacache`` command with one line, exit 130 / 143, and keep
nothing half-done: a build from a slow generator, and a pull from a slow S3 server (the fault
proxy delays the part download).

Commands run as real processes and get real signals; the waits are hang guards, not timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.cloud_helpers import dataset
from tests.faultproxy import FaultProxy
from yogacache.format.durability import leftovers_of
from yogacache.store.local import CacheStore
from yogacache.store.remote import LOCAL_CACHE_DIR, RemoteCacheStore

REPO = Path(__file__).resolve().parent.parent
HANG_GUARD = 120.0
SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
IDS = ["SIGINT", "SIGTERM"]

SLOW_SOURCE = """
import time
from pathlib import Path

import numpy as np

STARTED = Path(__file__).with_name("started")


def make():
    def records():
        for i in range(10**9):
            if i == 300:
                STARTED.touch()  # a few batches are written by now
            yield {"i": np.int64(i), "x": np.zeros(64, np.float32)}
            time.sleep(0.002)

    return records()
"""


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "yogacache", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def wait_until(condition: Callable[[], bool], process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not condition():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"the command ended early ({process.returncode}):\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("the command never got going")
        time.sleep(0.02)


def stop_with(process: subprocess.Popen[str], signum: int) -> tuple[int, str, str]:
    process.send_signal(signum)
    try:
        out, err = process.communicate(timeout=HANG_GUARD)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the command did not stop after the signal:\n{out}\n{err}")
    return process.returncode, out, err


def assert_one_line(err: str, word: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"yogacache: {word}"), lines[0]


@pytest.mark.parametrize("signum, status, word", SIGNALS, ids=IDS)
def test_a_build_stops_with_one_line_and_leaves_nothing(tmp_path: Path, signum: int, status: int, word: str) -> None:
    source = tmp_path / "slow_source.py"
    source.write_text(SLOW_SOURCE)
    storage = tmp_path / "storage"
    storage.mkdir()
    process = start_cli("build", "slow", "v1", f"{source}:make", "--storage", str(storage))
    wait_until((tmp_path / "started").exists, process)

    code, _, err = stop_with(process, signum)
    assert code == status, err
    assert_one_line(err, word)
    store = CacheStore(storage)
    assert not store.exists("slow", "v1")
    assert leftovers_of(store.cache_dir("slow", "v1")) == []
    assert store.list() == []


@pytest.mark.parametrize("signum, status, word", SIGNALS, ids=IDS)
def test_a_pull_from_a_slow_server_stops_with_one_line(
    s3_server: Any, tmp_path: Path, signum: int, status: int, word: str
) -> None:
    bucket = s3_server.new_bucket()
    from yogacache.backends.s3 import S3ObjectStore

    publisher = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "node-a", show_progress=False
    )
    publisher.build("mnist", "v1", dataset(300))
    with FaultProxy(s3_server.endpoint_url) as proxy:
        slow = proxy.add_rule(action="delay", method="GET", path_contains="-part-", seconds=5.0)
        local = tmp_path / "node-b"
        process = start_cli(
            "pull",
            "mnist",
            "v1",
            "--storage",
            f"s3://{bucket}/caches",
            "--endpoint-url",
            proxy.url,
            "--local-cache",
            str(local),
        )
        wait_until(lambda: slow.hits >= 1, process)  # the part download is under way

        code, out, err = stop_with(process, signum)
    assert code == status, out + err
    assert_one_line(err, word)
    copy = local / LOCAL_CACHE_DIR / "mnist" / "v1"
    assert not copy.exists()
    assert leftovers_of(copy) == []


STUCK_SECONDS = 300.0  # the part GETs get no answer for this long: only a stop ends them in time
STOP_GUARD = 20.0  # "does not hang": the command ends within this long of the signal


def _publish_parts(s3_server: Any, tmp_path: Path, parts: int) -> tuple[str, Any]:
    from yogacache.backends.s3 import S3ObjectStore

    bucket = s3_server.new_bucket()
    publisher = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url),
        tmp_path / "publisher",
        part_size_bytes=64 << 10,
        show_progress=False,
    )
    manifest = publisher.build("mnist", "v1", dataset(1200))
    assert len(manifest.parts) >= parts, len(manifest.parts)
    return bucket, manifest


def _start_stuck_pull(bucket: str, proxy: FaultProxy, local: Path) -> subprocess.Popen[str]:
    return start_cli(
        "pull", "mnist", "v1", "--storage", f"s3://{bucket}/caches", "--endpoint-url", proxy.url,
        "--local-cache", str(local),
    )


def _ended_within(process: subprocess.Popen[str], seconds: float) -> tuple[str, str]:
    try:
        return process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the pull did not end within {seconds} s of Ctrl-C:\n{out}\n{err}")


def test_ctrl_c_stops_a_pull_whose_transfers_are_stuck_every_time(s3_server: Any, tmp_path: Path) -> None:
    """Every transfer thread waits inside s3transfer for a part the server does not send: one
    Ctrl-C ends the pull (exit 130, one line), five times out of five, with no copy and no
    temporary left behind. Before the fix the process waited for its transfer threads at exit."""
    bucket, manifest = _publish_parts(s3_server, tmp_path, parts=4)
    with FaultProxy(s3_server.endpoint_url) as proxy:
        stuck = proxy.add_rule(action="delay", method="GET", path_contains="-part-", seconds=STUCK_SECONDS)
        for run in range(5):
            before = stuck.hits
            local = tmp_path / f"node-{run}"
            process = _start_stuck_pull(bucket, proxy, local)
            wait_until(lambda before=before: stuck.hits >= before + 4, process)  # all four transfer threads wait
            time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            _, err = _ended_within(process, STOP_GUARD)
            assert process.returncode == 130, err
            assert_one_line(err, "interrupted")
            assert "pull stopped" in err
            copy = local / LOCAL_CACHE_DIR / "mnist" / "v1"
            assert not copy.exists()
            assert leftovers_of(copy) == []
    # The published cache is untouched.
    from yogacache.backends.s3 import S3ObjectStore

    store = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "check", show_progress=False
    )
    assert store.remote_manifest("mnist", "v1") == manifest
    assert len(store.pull("mnist", "v1")) == 1200


def test_a_second_ctrl_c_ends_a_pull_at_once(s3_server: Any, tmp_path: Path) -> None:
    """Two Ctrl-C in a row while the transfers are stuck: the command ends (130), whatever the
    first one was still doing."""
    bucket, _ = _publish_parts(s3_server, tmp_path, parts=4)
    with FaultProxy(s3_server.endpoint_url) as proxy:
        stuck = proxy.add_rule(action="delay", method="GET", path_contains="-part-", seconds=STUCK_SECONDS)
        for run in range(3):
            before = stuck.hits
            local = tmp_path / f"node-{run}"
            process = _start_stuck_pull(bucket, proxy, local)
            wait_until(lambda before=before: stuck.hits >= before + 4, process)
            process.send_signal(signal.SIGINT)
            time.sleep(0.05)
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            _, err = _ended_within(process, STOP_GUARD)
            assert process.returncode == 130, err
            assert "Traceback" not in err, err
            assert "interrupted" in err
