"""A full disk during a build: a clear BuildError, nothing partial left, an old cache untouched.

Two ways to run out of room, both in a child process so the test process is not limited:

* ``RLIMIT_FSIZE`` set to a few MB with ``SIGXFSZ`` ignored: writes past the limit fail with
  EFBIG ("File too large"), as they would on a filesystem with a small file-size limit.
* a real, small tmpfs mounted in a private mount namespace (``unshare -m``): writes fail with
  ENOSPC ("No space left on device"). The mount disappears with the namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
DATASET, VERSION = "big", "v1"
LIMIT_BYTES = 2 << 20
# What a full disk or a file-size limit should be called in the error message.
OS_ERROR_WORDS = ("File too large", "No space left", "file size limit", "disk is full", "disk full")

# Builds ``n`` records of ``size`` bytes; prints what happened as JSON on the last line.
CHILD = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    import numpy as np
    import yogacache
    from yogacache.store.local import CacheStore

    root, n, size, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    records = ({"i": np.int64(i), "x": np.full(size, i % 251, np.uint8)} for i in range(n))
    try:
        CacheStore(root, show_progress=False).build("big", "v1", records)
        result = {"ok": True}
    except BaseException as error:
        result = {
            "ok": False,
            "type": type(error).__name__,
            "build_error": isinstance(error, yogacache.BuildError),
            "message": str(error),
        }
    print(json.dumps(result))
    """
)

# Runs inside the private mount namespace: a small old cache, then a build that fills the disk.
TMPFS_SCENARIO = textwrap.dedent(
    """
    import json, os, shutil, subprocess, sys
    import numpy as np
    from yogacache.store.local import CacheStore

    child, root = sys.argv[1], sys.argv[2]
    report = {}
    store = CacheStore(root, show_progress=False)
    store.build("big", "v1", ({"i": np.int64(i), "x": np.full(2100, 7, np.uint8)} for i in range(100)))
    old = store.manifest("big", "v1")
    report["free_before"] = shutil.disk_usage(root).free
    for name, n, size in (("overhead", 1500, 2100), ("raw", 3000, 2100)):
        out = subprocess.run([sys.executable, child, root, str(n), str(size), "0"],
                             capture_output=True, text=True, timeout=120)
        entry = json.loads(out.stdout.strip().splitlines()[-1]) if out.stdout.strip() else {"stderr": out.stderr}
        entry["leftovers"] = sorted(p for p in os.listdir(os.path.join(root, "big"))
                                    if p.startswith(".v1.") and not p.endswith(".lock"))
        manifest = store.manifest("big", "v1")
        entry["old_manifest_kept"] = manifest == old
        store.verify_cache("big", "v1")
        reader = store.open("big", "v1")
        entry["old_data_ok"] = (
            len(reader) == 100
            and [int(reader[i]["i"]) for i in range(100)] == list(range(100))
            and all((reader[i]["x"] == 7).all() and reader[i]["x"].shape == (2100,) for i in range(100))
        )
        reader.close()
        entry["cache_files"] = sorted(os.listdir(os.path.join(root, "big", "v1")))
        entry["free_after"] = shutil.disk_usage(root).free
        report[name] = entry
    print(json.dumps(report))
    """
)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _leftovers(root: Path) -> list[str]:
    parent = root / DATASET
    if not parent.is_dir():
        return []
    return sorted(
        p.name for p in parent.iterdir() if p.name.startswith(f".{VERSION}.") and not p.name.endswith(".lock")
    )


def _write_child(tmp_path: Path) -> Path:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return script


def _run_limited(tmp_path: Path, root: Path, n: int, size: int, limit: int = LIMIT_BYTES) -> dict[str, Any]:
    script = _write_child(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(script), str(root), str(n), str(size), str(limit)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _old_cache(root: Path) -> tuple[CacheStore, Any, dict[str, bytes]]:
    store = CacheStore(root, show_progress=False)
    store.build(DATASET, VERSION, [{"i": np.int64(i), "x": np.full(1000, 3, np.uint8)} for i in range(50)])
    manifest = store.verify_cache(DATASET, VERSION)
    files = {p.name: p.read_bytes() for p in store.cache_dir(DATASET, VERSION).iterdir() if p.name != ".verified.json"}
    return store, manifest, files


def _check_old_cache(store: CacheStore, manifest: Any, files: dict[str, bytes]) -> None:
    assert store.manifest(DATASET, VERSION) == manifest
    assert store.verify_cache(DATASET, VERSION) == manifest
    now = {p.name: p.read_bytes() for p in store.cache_dir(DATASET, VERSION).iterdir() if p.name != ".verified.json"}
    assert now == files
    reader = store.open(DATASET, VERSION)
    assert [int(reader[i]["i"]) for i in range(50)] == list(range(50))
    assert all((reader[i]["x"] == 3).all() for i in range(50))
    reader.close()


# -- RLIMIT_FSIZE ---------------------------------------------------------------------------

# 1500 records of 4000 bytes: about 6 MB, three times the file-size limit.
BIG_N, BIG_SIZE = 1500, 4000


def test_file_size_limit_fails_with_build_error_and_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    result = _run_limited(tmp_path, root, BIG_N, BIG_SIZE)
    assert result["ok"] is False, "a 6 MB build succeeded under a 2 MB file-size limit"
    assert result["build_error"], result
    assert "big" in result["message"] and "v1" in result["message"], result["message"]
    assert _leftovers(root) == []
    store = CacheStore(root)
    assert not store.exists(DATASET, VERSION)
    assert not store.cache_dir(DATASET, VERSION).exists()
    assert store.list() == []


def test_file_size_limit_keeps_an_existing_cache(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    store, manifest, files = _old_cache(root)
    result = _run_limited(tmp_path, root, BIG_N, BIG_SIZE)
    assert result["ok"] is False
    assert result["build_error"], result
    assert _leftovers(root) == []
    _check_old_cache(store, manifest, files)
    # The same build without the limit replaces it: the failure was the limit, not the data.
    result = _run_limited(tmp_path, root, BIG_N, BIG_SIZE, limit=0)
    assert result == {"ok": True}
    assert store.verify_cache(DATASET, VERSION).num_records == BIG_N


def test_file_size_limit_error_names_the_os_error(tmp_path: Path) -> None:
    """The user must learn that the file got too large, not see a bare LMDB I/O error."""
    root = tmp_path / "storage"
    result = _run_limited(tmp_path, root, BIG_N, BIG_SIZE)
    assert result["build_error"], result
    message = result["message"]
    assert any(word in message for word in OS_ERROR_WORDS), (
        f"the BuildError does not say the file size limit was hit: {message!r}"
    )


def test_build_under_the_limit_still_works(tmp_path: Path) -> None:
    """Guards the tests above: the limit itself does not break small builds."""
    root = tmp_path / "storage"
    result = _run_limited(tmp_path, root, 50, 4000)
    assert result == {"ok": True}
    assert CacheStore(root).verify_cache(DATASET, VERSION).num_records == 50


# -- a real full filesystem (tmpfs in a private mount namespace) ----------------------------


@pytest.fixture(scope="module")
def tmpfs_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("tmpfs")
    mount_point = base / "mnt"
    mount_point.mkdir()
    child = _write_child(base)
    scenario = base / "scenario.py"
    scenario.write_text(TMPFS_SCENARIO)
    unshare = shutil.which("unshare")
    assert unshare, "unshare(1) is needed to mount a private tmpfs"
    command = (
        f"mount -t tmpfs -o size=4m,mode=0755 yogacache-test {mount_point} && "
        f"{sys.executable} {scenario} {child} {mount_point}"
    )
    proc = subprocess.run(
        [unshare, "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=240,
    )
    assert proc.returncode == 0, f"tmpfs scenario failed: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_full_filesystem_fails_cleanly_and_keeps_the_old_cache(tmpfs_report: dict[str, Any]) -> None:
    # Records of 2100 bytes take a 4 KiB LMDB overflow page each: the raw size passes the
    # free-space estimate, the disk fills up while writing.
    entry = tmpfs_report["overhead"]
    assert entry.get("ok") is False, entry
    assert entry["build_error"], entry
    assert "big" in entry["message"] and "v1" in entry["message"], entry["message"]
    assert entry["leftovers"] == []
    assert entry["old_manifest_kept"] and entry["old_data_ok"]
    assert sorted(entry["cache_files"]) == ["manifest.json", "part-00000.mdb"]
    # The failed build gave back all the space it took.
    assert entry["free_after"] == tmpfs_report["free_before"]


def test_full_filesystem_error_names_the_os_error(tmpfs_report: dict[str, Any]) -> None:
    message = tmpfs_report["overhead"]["message"]
    assert any(word in message for word in OS_ERROR_WORDS), f"the BuildError does not say the disk is full: {message!r}"


def test_dataset_larger_than_free_space_is_refused_early(tmpfs_report: dict[str, Any]) -> None:
    entry = tmpfs_report["raw"]
    assert entry.get("ok") is False, entry
    assert entry["build_error"], entry
    assert "big" in entry["message"] and "v1" in entry["message"]
    assert "space" in entry["message"], entry["message"]
    assert entry["leftovers"] == []
    assert entry["old_manifest_kept"] and entry["old_data_ok"]
    assert entry["free_after"] == tmpfs_report["free_before"]
