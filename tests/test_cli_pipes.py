"""``yogacache ls --json | head``: a reader that stops early ends the command quietly (exit 141,
as ``cat`` or ``yes`` would by SIGPIPE), never with "[Errno 32] Broken pipe" or a traceback."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cloud_helpers import python_env
from yogacache.store.local import CacheStore

F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux


@pytest.fixture(scope="module")
def many_caches(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Enough caches that ``ls --json`` prints more than a pipe holds (64 KiB)."""
    store = CacheStore(tmp_path_factory.mktemp("many") / "caches", show_progress=False)
    for i in range(200):
        store.build(f"dataset{i:03d}", "v1", [{"x": i}])
    return store.root


@pytest.mark.parametrize("command", [["ls", "--json"], ["ls"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(command: list[str], many_caches: Path) -> None:
    # A pipe of one page (the ls table is 19 KB, under the default 64 KiB a pipe holds): the
    # command cannot finish writing before the reader goes, whatever the timing.
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [sys.executable, "-m", "yogacache", *command, "--storage", str(many_caches)],
        stdout=write_end,
        stderr=subprocess.PIPE,
        env={**python_env(), "COLUMNS": "200"},
    )
    os.close(write_end)
    assert process.stderr is not None
    with os.fdopen(read_end, "rb") as stdout:
        head = stdout.read(100)  # like `head -c 100`
    # ... and gone: the rest cannot be written
    stderr = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert head.startswith(b"[" if "--json" in command else b"DATASET")
    assert stderr == "", stderr
    assert code == 141
    assert len(CacheStore(many_caches).list()) == 200  # nothing was touched
