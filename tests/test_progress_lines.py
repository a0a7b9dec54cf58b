"""Progress lines a user can rely on (issue 22, item 13): at 80 columns an import's line keeps
its percentage and ETA (the label gives way); a silent stretch (an upload, a slow source) still
gets a line every interval, piped or not; an upload inside ``yogacache import`` is reported as it
goes; after Ctrl-C the last line is not drawn again."""

from __future__ import annotations

import io
import logging
import os
import re
import select
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import python_env
from yogacache.progress import Progress, TransferProgress, close_all, mute_all
from yogacache.sources.importer import ImportProgress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drawn_lines(terminal: _Terminal) -> list[str]:
    return [line for line in re.split(r"[\r\n]", ANSI.sub("", terminal.getvalue())) if line.strip()]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def eighty_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    monkeypatch.delenv("TERM", raising=False)


def test_an_import_line_at_80_columns_keeps_its_percentage_and_eta(
    eighty_columns: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    shown = ImportProgress("imagenet-2012-full-resolution:src-0123456789abcdef", 16, 16 << 30)
    shown._progress.interval = 0.0
    for done in range(1, 16):
        shown(done, done << 30, done * 12_345)
    lines = drawn_lines(terminal)
    assert lines and all(len(line) <= 80 for line in lines), lines
    assert all(re.search(r"\b\d+%", line) and "ETA" in line for line in lines), lines
    assert "93%" in lines[-1]  # 15 of 16: never rounded up to a percentage not reached
    assert lines[-1].startswith("imagenet")  # the label is shortened, not dropped
    shown.close()


def test_a_silent_stretch_still_gets_a_line_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        build = Progress("slow:v1", stream=io.StringIO(), interval=10.0, total=1000, clock=clock)
        clock.now += 10.5
        build.beat()  # before the first batch: still a line
        build.update(256, 1 << 20)  # within the interval of that line: not shown
        for _ in range(3):  # nothing new for 30 s: one line every 10 s all the same
            clock.now += 10.1
            build.beat()
            build.beat()  # twice within an interval: once
        build.finish(1000, 4 << 20)
    messages = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    assert len(messages) == 5, messages
    assert "slow:v1" in messages[0] and "0 of 1,000" in messages[0]
    assert all("256 of 1,000 records" in message for message in messages[1:4]), messages
    assert messages[4].startswith("built slow:v1: 1,000 records")


def test_after_ctrl_c_the_last_line_is_not_drawn_again(eighty_columns: None) -> None:
    """A transfer thread inside an update when Ctrl-C comes must not draw the line anew after
    the interrupted command ended it (it started a second live line before)."""
    terminal = _Terminal()
    transfer = TransferProgress("uploading big:v1", 1 << 30, stream=terminal)
    transfer._progress.interval = 0.0
    transfer.add(1 << 20)
    inside, release = threading.Event(), threading.Event()
    computing = transfer._progress

    def late_line(short: bool = False) -> str:
        inside.set()
        release.wait(10)
        return "late update"

    updater = threading.Thread(target=lambda: computing.emit(late_line, completed=2 << 20, total=1 << 30))
    updater.start()
    assert inside.wait(10)
    interrupted = threading.Thread(target=lambda: (mute_all(), close_all()))  # what main() does on Ctrl-C
    interrupted.start()
    interrupted.join(0.5)
    release.set()
    updater.join(10)
    interrupted.join(10)
    text = ANSI.sub("", terminal.getvalue())
    assert text.count("\n") == 1 and text.endswith("\n"), repr(text)  # ended once, nothing after
    assert "late update" not in text


def _shards(directory: Path, count: int = 4, records: int = 30) -> None:
    directory.mkdir()
    for shard in range(count):
        with tarfile.open(directory / f"train-{shard:06d}.tar", "w") as tar:
            for i in range(records):
                data = os.urandom(40_000)
                info = tarfile.TarInfo(f"sample{shard:02d}{i:04d}.bin")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_an_import_to_s3_reports_its_upload_piped(s3_server: Any, tmp_path: Path) -> None:
    """Piped, ``yogacache import --storage s3://`` reports the upload of the cache as it goes
    (it stood still at "16/16 objects" for the whole upload)."""
    _shards(tmp_path / "shards")
    bucket = s3_server.new_bucket()
    result = subprocess.run(
        [sys.executable, "-m", "yogacache", "import", f"{tmp_path / 'shards'}/", "--id", "shards",
         "--version", "v1", "--storage", f"s3://{bucket}/caches", "--endpoint-url", s3_server.endpoint_url,
         "--local-cache", str(tmp_path / "node")],
        capture_output=True, text=True, timeout=300,
        env={**python_env(), "YOGACACHE_PROGRESS_INTERVAL": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert "imported shards v1: 120 records" in result.stdout
    uploading = [line for line in result.stderr.splitlines() if "uploading shards:v1" in line]
    assert uploading, result.stderr
    assert any("MiB of" in line for line in uploading), uploading


def test_a_failed_build_ends_its_progress(tmp_path: Path) -> None:
    """Nothing repeats the line of a build that failed (the heartbeat would, for ever: the build
    freezes the heap its progress is part of)."""
    from yogacache import progress as progress_module
    from yogacache.store.local import CacheStore

    def records() -> Any:
        for i in range(300):
            yield {"x": i}
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        CacheStore(tmp_path / "caches", show_progress=True).build("failing", "v1", records())
    assert not [p.label for p in progress_module._ACTIVE if "failing" in p.label]
    assert not CacheStore(tmp_path / "caches").exists("failing", "v1")


def test_a_progress_its_owner_dropped_is_freed_and_never_repeated() -> None:
    """The heartbeat keeps nothing alive: a transfer or build that failed and was dropped (no
    finish, no close) is freed at once, without waiting for the cycle collector."""
    import gc

    from yogacache import progress as progress_module

    gc.disable()
    try:
        transfer = TransferProgress("uploading dropped:v1", 1 << 30, stream=io.StringIO())
        transfer.add(1 << 20)
        build = Progress("dropped:v2", stream=io.StringIO(), total=10)
        build.update(3, 100)
        del transfer, build
        assert not [p.label for p in progress_module._ACTIVE if "dropped" in p.label]
    finally:
        gc.enable()


def test_one_live_line_at_a_time_the_newest_in_front(eighty_columns: None) -> None:
    """An import's line and the upload after it do not overwrite each other on one row: the
    upload's line replaces the import's (which ends, and is not repeated while it is behind)."""
    terminal = _Terminal()
    clock = Clock()
    build = Progress("shards:v1", stream=terminal, interval=0.0, total=100, clock=clock)
    build.update(50, 1 << 20)
    build.update(100, 2 << 20)
    upload = TransferProgress("uploading shards:v1", 1 << 30, stream=terminal)
    upload._progress.interval = 0.0
    upload.add(256 << 20)
    clock.now += 5.0
    build.beat()  # behind the upload: not drawn again
    upload.add(512 << 20)
    upload.finish()
    build.close()
    lines = drawn_lines(terminal)
    first_upload = next(i for i, line in enumerate(lines) if line.startswith("uploading"))
    assert first_upload > 0 and all(line.startswith("uploading") for line in lines[first_upload:]), lines
    assert ANSI.sub("", terminal.getvalue()).count("\n") == 2  # the build's line ended, then the upload's


SILENT_SOURCE = """
import sys, time
from pathlib import Path
from yogacache.store.local import CacheStore

go = Path(sys.argv[2])

def records():
    while not go.exists():  # a source that has produced nothing yet
        time.sleep(0.02)
    yield from ({"x": i} for i in range(10))

CacheStore(sys.argv[1]).build("silent", "v1", records())
"""


def test_a_piped_build_that_counts_nothing_still_prints_a_line_every_interval(tmp_path: Path) -> None:
    go = tmp_path / "go"
    process = subprocess.Popen(
        [sys.executable, "-c", SILENT_SOURCE, str(tmp_path / "caches"), str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**python_env(), "YOGACACHE_PROGRESS_INTERVAL": "0.2"},
    )
    assert process.stderr is not None
    heard: list[str] = []
    try:
        while len(heard) < 3:  # before the source yields anything; no line in 60 s: none comes
            ready, _, _ = select.select([process.stderr], [], [], 60)
            assert ready, f"no progress line while the source produced nothing; heard {heard}"
            heard.append(process.stderr.readline())
    finally:
        go.touch()
    rest = process.communicate(timeout=120)[1]
    assert process.returncode == 0, rest
    assert all(line.startswith("yogacache: silent:v1: 0 records written") for line in heard), heard
    assert all("waiting for the source's first batch" in line for line in heard), heard
    assert "built silent:v1: 10 records" in rest
