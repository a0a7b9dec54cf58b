"""Opening a cache while another process builds it (``CacheReader(path)``/``CacheDataset(path)``,
``storage.fetch``, ``store.open``, ``yogacache info``) says who builds it -- pid, host, since
when -- and how to wait, not only "no cache"; once the build is done, all of them read it."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.cloud_helpers import python_env
from yogacache.errors import CacheNotFoundError
from yogacache.read.reader import CacheReader
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.store.local import CacheStore

BUILDER = """
import sys, time
from pathlib import Path
from yogacache.store.local import CacheStore

root, go = sys.argv[1], Path(sys.argv[2])

def records():
    for i in range(10):
        yield {"x": i}
        if i == 4:  # the build is under way: its lock is held, its temporary directory exists
            print("building", flush=True)
            while not go.exists():
                time.sleep(0.05)

CacheStore(root, show_progress=False).build("ds", "v1", records())
print("built", flush=True)
"""


def opener_of(kind: str, root: Path) -> Callable[[], object]:
    if kind == "CacheReader(path)":
        return lambda: CacheReader(root / "ds" / "v1")
    if kind == "CacheDataset(path)":
        torch_adapter = pytest.importorskip("yogacache.torch")
        return lambda: torch_adapter.CacheDataset(root / "ds" / "v1")
    if kind == "storage.fetch":
        return lambda: LFSStorage(LFSConfigurations(str(root))).fetch("ds", "v1")
    return lambda: CacheStore(root).open("ds", "v1")


def test_opening_a_cache_being_built_says_who_builds_it_and_how_to_wait(tmp_path: Path) -> None:
    root, go = tmp_path / "caches", tmp_path / "go"
    builder = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(root), str(go)], stdout=subprocess.PIPE, text=True, env=python_env()
    )
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "building"
        kinds = ["CacheReader(path)", "storage.fetch", "store.open", "CacheDataset(path)"]
        for kind in kinds:
            with pytest.raises(CacheNotFoundError) as raised:
                opener_of(kind, root)()
            message = str(raised.value)
            assert f"pid {builder.pid} on {socket.gethostname()}" in message, (kind, message)
            assert "since" in message and "wait" in message, (kind, message)
        info = subprocess.run(
            [sys.executable, "-m", "yogacache", "info", "ds", "v1", "--storage", str(root)],
            capture_output=True, text=True, env=python_env(), timeout=120,
        )
        assert info.returncode == 1 and f"pid {builder.pid} on {socket.gethostname()}" in info.stderr, info.stderr
        assert "Traceback" not in info.stderr
        # `yogacache build` of the same cache waits for that build, saying whose, then rebuilds.
        (tmp_path / "five.py").write_text("def make():\n    return [{'x': i} for i in range(5)]\n")
        second = subprocess.Popen(
            [sys.executable, "-m", "yogacache", "build", "ds", "v1", f"{tmp_path / 'five.py'}:make",
             "--storage", str(root)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env(),
        )
        assert second.stderr is not None
        said = second.stderr.readline()
        assert f"waiting for pid {builder.pid} on {socket.gethostname()} building ds:v1" in said, said
    finally:
        go.touch()
        out, _ = builder.communicate(timeout=120)
    assert builder.returncode == 0 and "built" in out
    second_out, second_err = second.communicate(timeout=120)
    assert second.returncode == 0 and "built ds v1: 5 records" in second_out, second_err
    kinds_rebuilt = CacheStore(root).open("ds", "v1")
    assert len(kinds_rebuilt) == 5
    kinds_rebuilt.close()
    CacheStore(root).build("ds", "v1", [{"x": i} for i in range(10)])  # as the builder left it
    for kind in kinds:  # the build finished: every way of opening reads all of it
        opened = opener_of(kind, root)()
        assert len(opened) == 10  # type: ignore[arg-type]
    with CacheStore(root).open("ds", "v1") as reader:
        assert [int(e["x"]) for e in reader.read_elements(range(10))] == list(range(10))


def test_a_cache_nobody_builds_is_just_absent(tmp_path: Path) -> None:
    with pytest.raises(CacheNotFoundError) as raised:
        CacheStore(tmp_path).open("ds", "v1")
    assert "pid" not in str(raised.value)
