"""Progress that informs: a live line that fits an 80-column terminal with %, ETA when the size
is known; "finishing" instead of "ETA 0 s" once every byte is handed over; human-readable
lines off a terminal even when the program configured no logging; and a process waiting for
another one's build says for whom it waits.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache.backends.registry import open_backend
from yogacache.progress import Progress, TransferProgress, waiting
from yogacache.store.lease import Lease
from yogacache.store.local import CacheStore
from yogacache.store.remote import LEASE_NAME, BuildWaitTimeoutError, RemoteCacheStore

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RAW_NUMBER = re.compile(r"(?<![\d,.])\d{4,}(?![\d,])")  # 4+ digits not grouped by commas


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drawn_lines(terminal: _Terminal) -> list[str]:
    text = ANSI.sub("", terminal.getvalue())
    return [line for line in re.split(r"[\r\n]", text) if line.strip()]


@pytest.fixture
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    monkeypatch.delenv("TERM", raising=False)


def test_a_build_line_fits_80_columns_and_shows_percent_and_eta(eighty_columns: None) -> None:
    terminal = _Terminal()
    label = "caching a_dataset_with_a_rather_long_identifier:v1_train_and_more"
    progress = Progress(label, stream=terminal, interval=0.0, total=3_000_000)
    for step in range(1, 4):
        time.sleep(0.01)
        progress.update(step * 250_000, step * (300 << 20))
    progress.finish(3_000_000, 3600 << 20)
    lines = drawn_lines(terminal)
    assert lines and all(len(line) <= 80 for line in lines), lines
    updates = lines[:-1]
    assert all(re.search(r"\b\d+%", line) and "ETA" in line for line in updates), updates
    assert "25%" in updates[-1] and "750,000/3,000,000" in updates[-1]
    assert "3,000,000 records" in lines[-1] and "3.5 GiB" in lines[-1]
    assert terminal.getvalue().count("\n") == 1  # one line, rewritten in place, ended once


def test_a_build_of_unknown_length_shows_count_and_rate(eighty_columns: None) -> None:
    terminal = _Terminal()
    progress = Progress("caching stream:v1", stream=terminal, interval=0.0)
    progress.update(1000, 5 << 20)
    progress.update(2000, 10 << 20)
    lines = drawn_lines(terminal)
    assert "2,000 records" in lines[-1] and "10.0 MiB" in lines[-1] and "/s" in lines[-1]
    assert "%" not in lines[-1] and "ETA" not in lines[-1]


def test_a_transfer_says_finishing_once_every_byte_is_handed_over(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        transfer = TransferProgress("uploading big:v1", 1 << 30, stream=io.StringIO())
        transfer.add(512 << 20)  # within the interval: not shown
        transfer.add(512 << 20)  # every byte handed over: shown at once
        transfer.finish()
    messages = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    assert len(messages) == 2, messages
    assert "1.0 GiB of 1.0 GiB transferred, finishing" in messages[0]
    assert "ETA" not in messages[0]
    assert messages[1].startswith("uploading big:v1: 1.0 GiB of 1.0 GiB in") and "done" in messages[1]

    terminal = _Terminal()
    transfer = TransferProgress("uploading big:v1", 1 << 30, stream=terminal)
    transfer.add(1 << 30)
    assert "finishing" in drawn_lines(terminal)[-1] and "ETA 0 s" not in terminal.getvalue()
    transfer.close()


def test_without_logging_configured_progress_goes_to_stderr_in_human_units(tmp_path: Path) -> None:
    """A training script that configured no logging still hears about a long build."""
    code = textwrap.dedent(
        """
        from yogacache.progress import Progress, TransferProgress
        build = Progress("caching images:v1", interval=0.0, total=3000)
        build.update(1000, 150 * 2**20)
        build.update(2000, 300 * 2**20)
        build.finish(3000, 450 * 2**20)
        transfer = TransferProgress("downloading images:v1", 5 * 2**30)
        transfer._progress.interval = 0.0
        transfer.add(2**30)
        transfer.add(4 * 2**30)
        transfer.finish()
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 6, result.stderr
    assert all(line.startswith("yogacache: ") for line in lines)
    assert "1,000 of 3,000 records (33%), 150.0 MiB" in lines[0] and "ETA" in lines[0]
    assert "1.0 GiB of 5.0 GiB" in lines[3] and "ETA" in lines[3]
    assert "transferred, finishing" in lines[4]
    for line in lines:
        assert not RAW_NUMBER.search(line), f"a raw number in {line!r}"
    assert "\r" not in result.stderr and "\x1b" not in result.stderr


def test_a_store_build_reports_its_known_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store tells the build's progress how many records to expect (for % and ETA)."""
    import yogacache.store.local as local_module

    made: list[Progress] = []

    class Recording(Progress):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(local_module, "Progress", Recording)
    CacheStore(tmp_path / "s", show_progress=False).build("known", "v1", [np.int64(i) for i in range(1234)])
    assert [p.total for p in made] == [1234]


def test_waiting_names_pid_host_and_cache(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        assert waiting("mnist:v1", "node-7:4242") == "waiting for pid 4242 on node-7 building mnist:v1"
        assert waiting("mnist:v1", pid=12, host="h") == "waiting for pid 12 on h building mnist:v1"
        assert waiting("mnist:v1", None) == "waiting for another process building mnist:v1"
        assert waiting("a:b", "h:1", doing="downloading") == "waiting for pid 1 on h downloading a:b"
    assert "waiting for pid 4242 on node-7 building mnist:v1" in caplog.text


BUILDER = """
import sys, time
from pathlib import Path
from yogacache.store.local import CacheStore

root, started, release = map(Path, sys.argv[1:4])

def make():
    started.touch()
    while not release.exists():
        time.sleep(0.02)
    return list(range(10))

CacheStore(root, show_progress=False).get_or_build("shared", "v1", make)
"""

WAITER = """
import sys
from pathlib import Path
from yogacache.store.local import CacheStore

reader = CacheStore(Path(sys.argv[1]), show_progress=False).get_or_build("shared", "v1", lambda: [-1])
print(len(reader))
"""


def test_a_process_waiting_for_a_build_on_this_node_says_for_whom(tmp_path: Path) -> None:
    root, started, release = tmp_path / "caches", tmp_path / "started", tmp_path / "release"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    builder = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(root), str(started), str(release)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    waiter = None
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert builder.poll() is None, builder.communicate()
            assert time.monotonic() < deadline, "the builder never started"
            time.sleep(0.02)
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, str(root)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        guard = threading.Timer(60.0, release.touch)  # hang guard: without a message, end the wait
        guard.start()
        said = ""
        while "waiting for" not in said:  # the waiter's first line, before the builder finishes
            line = waiter.stderr.readline() if waiter.stderr else ""
            assert line, f"the waiter said nothing: {waiter.communicate()}"
            said += line
        guard.cancel()
        release.touch()
        out, err = waiter.communicate(timeout=120)
        assert waiter.returncode == 0, err
        assert out.strip() == "10"  # it read the builder's cache, not its own
        expected = f"yogacache: waiting for pid {builder.pid} on {socket.gethostname()} building shared:v1"
        assert said.strip() == expected
        assert builder.wait(timeout=120) == 0
    finally:
        release.touch()
        for process in (builder, waiter):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()


def test_a_node_waiting_on_another_nodes_build_lease_says_for_whom(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = open_backend(f"file://{tmp_path / 'bucket'}")
    store = RemoteCacheStore(objects, tmp_path / "node-b", poll_seconds=0.05, wait_timeout=0.5, show_progress=False)
    lease = Lease(objects, store.key("leased", "v1", LEASE_NAME), "other-build", 60.0)
    acquired, _ = lease.try_acquire()  # "another node" (this process) is building
    assert acquired
    try:
        with caplog.at_level(logging.INFO, logger="yogacache.progress"):
            with pytest.raises(BuildWaitTimeoutError):
                store.get_or_build("leased", "v1", lambda: [1, 2, 3])
    finally:
        lease.release()
    said = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    assert f"waiting for pid {os.getpid()} on {socket.gethostname()} building leased:v1" in said
