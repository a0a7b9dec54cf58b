"""A full local disk during a pull is this node's fault, not the remote's: no retries, a clear error.

The local cache root is a real 2 MiB tmpfs mounted in a private mount namespace (``unshare -m``,
as tests/test_disk_full.py does); the bucket is on moto's S3 server (the network is shared with
the namespace).

- A cache larger than the free space is refused before any part is downloaded.
- When the disk fills up while downloading (another process takes the space), the pull stops at
  once with "no space left on <path>, need N bytes": no part is fetched twice, no temporary
  directory is left, and the pull succeeds once there is room again.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, python_env
from yogacache.store.remote import RemoteCacheStore

PREFIX = "caches"

SCENARIO = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from tests.cloud_helpers import Cloud, CountingStore, HttpRequests
    from tests.servers import S3Server
    from yogacache.errors import NoSpaceError
    from yogacache.format.durability import leftovers_of
    from yogacache.store.remote import RemoteCacheStore

    endpoint, bucket, mount = sys.argv[1:4]
    cloud = Cloud("s3", S3Server(endpoint))
    report = {}

    def attempt(name, dataset_id, fill_on_first_download):
        s3 = cloud.store(bucket, "caches")
        http = HttpRequests().attach(s3)
        objects = CountingStore(s3)
        filler = Path(mount) / "filler"
        if fill_on_first_download:
            inner_download = objects.download_file
            filled = []
            def download_file(key, path, progress=None, size=None):
                if not filled:  # another process takes the free space, once
                    filled.append(key)
                    with open(filler, "wb") as handle:
                        try:
                            while True:
                                handle.write(b"\\0" * 65536)
                        except OSError:
                            pass
                inner_download(key, path, progress, size=size)
            objects.download_file = download_file
        store = RemoteCacheStore(objects, Path(mount) / "root", transfer_threads=2, show_progress=False)
        entry = {}
        try:
            store.pull(dataset_id, "v1")
            entry["ok"] = True
        except NoSpaceError as error:
            entry.update(ok=False, message=str(error))
        except BaseException as error:
            entry.update(ok=False, unexpected=f"{type(error).__name__}: {error}")
        part_gets = [r for r in http.sent if r.startswith("GET ") and "-part-" in r]
        entry["downloads"] = [k for m, k in objects.calls if m == "download_file"]
        entry["part_gets"] = len(part_gets)
        entry["distinct_part_gets"] = len({r.split("?")[0] for r in part_gets})
        target = store.local.cache_dir(dataset_id, "v1")
        entry["leftovers"] = [p.name for p in leftovers_of(target)]
        entry["copy_exists"] = target.exists()
        if filler.exists():
            filler.unlink()
            try:
                store.pull(dataset_id, "v1")
                entry["after_room"] = "ok"
            except BaseException as error:
                entry["after_room"] = f"{type(error).__name__}: {error}"
        report[name] = entry

    attempt("too_big", "big", False)
    attempt("filled", "small", True)
    print(json.dumps(report))
    """
)


def publish(cloud: Cloud, bucket: str, tmp_path: Path, dataset_id: str, n: int) -> Any:
    store = RemoteCacheStore(
        cloud.store(bucket, PREFIX), tmp_path / "builder", part_size_bytes=200_000, show_progress=False
    )
    records = [{"i": np.int64(i), "x": np.full(4000, i % 251, np.uint8)} for i in range(n)]
    return store.build(dataset_id, "v1", records)


@pytest.fixture(scope="module")
def report(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp_path = tmp_path_factory.mktemp("remote-disk-full")
    cloud = Cloud("s3", s3_server)
    bucket = cloud.new_bucket()
    big = publish(cloud, bucket, tmp_path, "big", 1000)  # about 4 MB: twice the tmpfs
    small = publish(cloud, bucket, tmp_path, "small", 300)  # about 1.2 MB: fits an empty tmpfs
    assert big.total_size_bytes > 2 << 20 > small.total_size_bytes
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) is needed to mount a private tmpfs"
    command = (
        f"mount -t tmpfs -o size=2m,mode=0755 yogacache-test {mount_point} && "
        f"{sys.executable} {script} {s3_server.endpoint_url} {bucket} {mount_point}"
    )
    proc = subprocess.run(
        [unshare, "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=240,
    )
    assert proc.returncode == 0, f"scenario failed: {proc.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["sizes"] = {"big": big.total_size_bytes, "small": small.total_size_bytes}
    return result


def test_a_cache_larger_than_the_free_space_is_refused_before_downloading(report: dict[str, Any]) -> None:
    entry = report["too_big"]
    assert entry["ok"] is False and "unexpected" not in entry, entry
    assert "no space left on" in entry["message"] and f"need {report['sizes']['big']} bytes" in entry["message"]
    assert entry["downloads"] == [] and entry["part_gets"] == 0
    assert entry["leftovers"] == [] and not entry["copy_exists"]


def test_a_disk_filling_up_during_a_pull_is_reported_at_once_not_retried(report: dict[str, Any]) -> None:
    entry = report["filled"]
    assert entry["ok"] is False and "unexpected" not in entry, entry
    assert "no space left on" in entry["message"] and f"need {report['sizes']['small']} bytes" in entry["message"]
    assert "attempt" not in entry["message"]  # not a RemoteError "failed after N attempt(s)"
    # Each started part was requested once: a full disk is not retried, and the rest was cancelled.
    assert entry["part_gets"] == entry["distinct_part_gets"] <= 2
    assert len(entry["downloads"]) <= 2
    assert entry["leftovers"] == [] and not entry["copy_exists"]
    assert entry["after_room"] == "ok"
