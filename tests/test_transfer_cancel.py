"""Failures and Ctrl-C stop a pull's transfers: queued ones never start, running ones abort.

The bucket is a real directory (the ``file://`` backend). ``SlowStore`` wraps it: every part
download it starts is recorded, and all but the parts named fast trickle their bytes, reporting
progress every few milliseconds for up to a minute before they delegate -- long enough that only
cancellation ends them in time. Nothing here mocks the store under test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from tests.cloud_helpers import python_env
from yogacache.backends.base import ObjectInfo, ProgressCallback, TransferCancelled
from yogacache.backends.files import FileObjectStore
from yogacache.errors import CorruptCacheError
from yogacache.format.durability import leftovers_of
from yogacache.store.remote import RemoteCacheStore

DS, VER = "cancel", "v1"
PART_SIZE = 16 << 10
TRICKLE_SECONDS = 60.0


class SlowStore:
    """A FileObjectStore whose part downloads (except ``fast`` ones) trickle until cancelled."""

    def __init__(self, root: Path, fast: tuple[str, ...] = (), started_dir: Optional[Path] = None) -> None:
        self.inner = FileObjectStore(root)
        self.fast = fast
        self.started: list[str] = []
        self.aborted: list[str] = []
        self.started_dir = started_dir
        self._lock = threading.Lock()

    def url(self, key: str = "") -> str:
        return self.inner.url(key)

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        return self.inner.read(key, max_bytes)

    def write(self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None) -> Optional[str]:
        return self.inner.write(key, data, if_absent=if_absent, if_token=if_token)

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        return self.inner.delete(key, if_token=if_token)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return self.inner.list(prefix)

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        self.inner.upload_file(path, key, progress)

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        with self._lock:
            self.started.append(key)
            if self.started_dir is not None:
                (self.started_dir / str(len(self.started))).touch()
        if not key.endswith(self.fast or ("\0",)):
            deadline = time.monotonic() + TRICKLE_SECONDS
            try:
                while time.monotonic() < deadline:
                    if progress:
                        progress(0)
                    time.sleep(0.005)
            except TransferCancelled:
                with self._lock:
                    self.aborted.append(key)
                raise
        self.inner.download_file(key, path, progress, size=size)


def records(n: int = 400) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(256, i, np.int32)} for i in range(n)]


def publish(bucket: Path, tmp_path: Path) -> Any:
    """Publishes a cache of many parts into ``bucket``; returns its manifest."""
    store = RemoteCacheStore(
        FileObjectStore(bucket), tmp_path / "builder", part_size_bytes=PART_SIZE, show_progress=False
    )
    manifest = store.build(DS, VER, records())
    assert len(manifest.parts) >= 10
    return manifest


def test_a_tampered_first_part_stops_the_pull_before_the_other_parts(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    manifest = publish(bucket, tmp_path)
    first = manifest.parts[0]
    first_object = bucket / DS / VER / f"{manifest.build_id}-{first.name}"
    data = bytearray(first_object.read_bytes())
    data[len(data) // 2] ^= 0x01
    first_object.write_bytes(bytes(data))

    objects = SlowStore(bucket, fast=(first.name,))
    node = RemoteCacheStore(objects, tmp_path / "node", transfer_threads=2, show_progress=False)
    result: dict[str, BaseException] = {}

    def pull() -> None:
        try:
            node.pull(DS, VER)
        except BaseException as error:  # checked below
            result["error"] = error

    puller = threading.Thread(target=pull)
    puller.start()
    puller.join(TRICKLE_SECONDS / 2)  # hang guard: without cancellation it would take minutes
    assert not puller.is_alive(), "the pull did not stop after the tampered part failed"

    assert isinstance(result.get("error"), CorruptCacheError), result
    assert first.name in str(result["error"])
    # At most one transfer per thread ever started; every one still running was aborted.
    assert 1 <= len(objects.started) <= 2 < len(manifest.parts)
    assert sorted(objects.aborted) == sorted(k for k in objects.started if not k.endswith(first.name))
    target = node.local.cache_dir(DS, VER)
    assert not target.exists() and leftovers_of(target) == []


PULL_SCRIPT = """
import sys
from pathlib import Path
from tests.test_transfer_cancel import SlowStore
from yogacache.store.remote import RemoteCacheStore
bucket, local, started = sys.argv[1:4]
objects = SlowStore(Path(bucket), started_dir=Path(started))
RemoteCacheStore(objects, local, transfer_threads=3, show_progress=False).pull("cancel", "v1")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT])
def test_sigint_during_a_pull_stops_it_and_cleans_up(tmp_path: Path, sig: signal.Signals) -> None:
    bucket = tmp_path / "bucket"
    manifest = publish(bucket, tmp_path)
    started = tmp_path / "started"
    started.mkdir()
    local = tmp_path / "node"
    process = subprocess.Popen(
        [sys.executable, "-c", PULL_SCRIPT, str(bucket), str(local), str(started)],
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < 3:  # every transfer thread is busy
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the pull never started its transfers"
            time.sleep(0.02)
        os.kill(process.pid, sig)
        try:
            _, err = process.communicate(timeout=TRICKLE_SECONDS / 2)  # hang guard
        except subprocess.TimeoutExpired:
            pytest.fail("the pull kept running after SIGINT")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0
    assert "KeyboardInterrupt" in err
    # Queued transfers never started; the temporary directory is gone; no copy appeared.
    assert len(list(started.iterdir())) == 3 < len(manifest.parts)
    target = local / "yogadl_local_cache" / DS / VER
    assert not target.exists() and leftovers_of(target) == []
    assert json.loads(manifest.to_bytes())["dataset_id"] == DS
