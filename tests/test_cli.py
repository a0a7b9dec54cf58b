"""The ``yogacache`` command: ls, info, verify, rm, where caches are, and build progress.

Commands run as real processes (``python -m yogacache`` and the installed console script), so
exit codes, stdout/stderr and stdin prompts are what a user sees.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from yogacache.format.manifest import Manifest
from yogacache.format.writer import CacheWriter
from yogacache.progress import Progress, format_bytes
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent


def _records(n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [{"i": np.int64(i + offset), "x": np.full(4, i, np.float32)} for i in range(n)]


def run_cli(
    *args: str, stdin: Optional[str] = None, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    # Piped output: no terminal width the runner exports (pytest-xdist's workers) fits the tables.
    full_env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A storage directory with three caches: mnist v1 and v2, and cifar v1."""
    path = tmp_path / "storage"
    store = CacheStore(path, show_progress=False)
    store.build("mnist", "v1", _records(1500))
    store.build("mnist", "v2", _records(7))
    store.build("cifar", "v1", _records(3, 100))
    return path


def _manifest(root: Path, dataset_id: str, version: str) -> Manifest:
    return CacheStore(root).manifest(dataset_id, version)


# -- ls ---------------------------------------------------------------------------------


def test_ls_table(root: Path) -> None:
    result = run_cli("ls", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines[0].split()
    assert header == ["DATASET", "VERSION", "RECORDS", "DISK", "CREATED", "PATH"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1]) for r in rows] == [("cifar", "v1"), ("mnist", "v1"), ("mnist", "v2")]
    by_key = {(r[0], r[1]): line for r, line in zip(rows, lines[1:])}
    mnist = by_key[("mnist", "v1")]
    assert "1,500" in mnist
    assert str(root / "mnist" / "v1") in mnist
    manifest = _manifest(root, "mnist", "v1")
    assert manifest.created_at[:10] in mnist  # the date the cache was created
    assert format_bytes(manifest.total_size_bytes) in mnist
    assert " 7 " in by_key[("mnist", "v2")]


def test_ls_json(root: Path) -> None:
    result = run_cli("ls", "--json", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [(r["dataset_id"], r["dataset_version"]) for r in rows] == [
        ("cifar", "v1"),
        ("mnist", "v1"),
        ("mnist", "v2"),
    ]
    for row in rows:
        manifest = _manifest(root, row["dataset_id"], row["dataset_version"])
        assert row["records"] == manifest.num_records
        assert row["size_bytes"] == manifest.total_size_bytes
        assert row["created_at"] == manifest.created_at
        assert row["where"] == "local"
        assert Path(row["path"]) == root / row["dataset_id"] / row["dataset_version"]
    assert [r["records"] for r in rows] == [3, 1500, 7]


def test_ls_empty_and_ignores_partial_builds(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    # Leftovers of a crashed build and a directory without a manifest are not caches.
    (root / "ds" / ".v1.tmp-abc").mkdir(parents=True)
    (root / "ds" / "v2").mkdir()
    (root / "ds" / ".v1.lock").touch()
    result = run_cli("ls", "--json", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    result = run_cli("ls", "--storage", str(root))
    assert result.returncode == 0
    assert "no caches" in result.stdout


def test_console_script_is_installed(root: Path) -> None:
    script = Path(sys.executable).parent / "yogacache"
    assert script.exists(), f"the yogacache console script is missing next to {sys.executable}"
    result = subprocess.run(
        [str(script), "ls", "--json", "--storage", str(root)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == 3


# -- rm -----------------------------------------------------------------------------------


def _surviving(root: Path) -> set[tuple[str, str]]:
    return {(e.dataset_id, e.dataset_version) for e in CacheStore(root).list()}


ALL = {("mnist", "v1"), ("mnist", "v2"), ("cifar", "v1")}


@pytest.mark.parametrize("answer", ["n\n", "", "no\n", "\n", "maybe\n"], ids=["n", "EOF", "no", "empty", "other"])
def test_rm_without_confirmation_keeps_the_cache(root: Path, answer: str) -> None:
    result = run_cli("rm", "mnist", "v1", "--storage", str(root), stdin=answer)
    assert result.returncode != 0
    assert "mnist" in result.stdout + result.stderr  # the question names what would be removed
    assert _surviving(root) == ALL
    CacheStore(root).verify_cache("mnist", "v1")


@pytest.mark.parametrize("answer", ["y\n", "yes\n", "Y\n"])
def test_rm_confirmed_removes_exactly_one_cache(root: Path, answer: str) -> None:
    result = run_cli("rm", "mnist", "v1", "--storage", str(root), stdin=answer)
    assert result.returncode == 0, result.stderr
    assert _surviving(root) == ALL - {("mnist", "v1")}
    assert not (root / "mnist" / "v1").exists()
    CacheStore(root).verify_cache("mnist", "v2")
    CacheStore(root).verify_cache("cifar", "v1")


def test_rm_yes_flag_skips_the_question(root: Path) -> None:
    result = run_cli("rm", "-y", "mnist", "v2", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    assert _surviving(root) == ALL - {("mnist", "v2")}
    result = run_cli("rm", "mnist", "v1", "--yes", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    assert _surviving(root) == {("cifar", "v1")}
    assert [p.name for p in (root / "cifar" / "v1").iterdir() if p.name == "manifest.json"]
    # Removing a missing cache is an error, not a silent success.
    result = run_cli("rm", "-y", "mnist", "v1", "--storage", str(root))
    assert result.returncode != 0
    assert "mnist" in result.stderr and "Traceback" not in result.stderr


def test_rm_does_not_touch_a_version_prefix_or_similar_names(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    store = CacheStore(root, show_progress=False)
    for version in ("v1", "v10", "v1_train", "v1.bak"):
        store.build("ds", version, _records(2))
    store.build("ds1", "v1", _records(2))
    result = run_cli("rm", "-y", "ds", "v1", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    assert _surviving(root) == {("ds", "v10"), ("ds", "v1_train"), ("ds", "v1.bak"), ("ds1", "v1")}


def test_rm_refuses_a_symlinked_cache_directory(root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    CacheStore(elsewhere, show_progress=False).build("real", "v1", _records(5))
    target = elsewhere / "real" / "v1"
    (root / "linked").mkdir()
    (root / "linked" / "v1").symlink_to(target, target_is_directory=True)
    result = run_cli("rm", "-y", "linked", "v1", "--storage", str(root))
    assert result.returncode != 0
    assert "symbolic link" in result.stderr or "symlink" in result.stderr, result.stderr
    assert (root / "linked" / "v1").is_symlink()
    assert CacheStore(elsewhere).verify_cache("real", "v1").num_records == 5
    assert sorted(p.name for p in target.iterdir()) == ["manifest.json", "part-00000.mdb"]


def test_rm_refuses_a_symlinked_dataset_directory(root: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    CacheStore(elsewhere, show_progress=False).build("real", "v1", _records(5))
    (root / "linkid").symlink_to(elsewhere / "real", target_is_directory=True)
    result = run_cli("rm", "-y", "linkid", "v1", "--storage", str(root))
    assert result.returncode != 0
    assert "symbolic link" in result.stderr or "symlink" in result.stderr, result.stderr
    assert CacheStore(elsewhere).verify_cache("real", "v1").num_records == 5
    assert _surviving(root) == ALL


# -- info and verify ----------------------------------------------------------------------


def test_info_prints_the_manifest_summary(root: Path) -> None:
    manifest = _manifest(root, "mnist", "v1")
    result = run_cli("info", "mnist", "v1", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "mnist" in out and "v1" in out
    assert "1,500" in out
    assert manifest.build_id in out
    assert str(root / "mnist" / "v1") in out
    assert "part" in out
    assert "float32" in out and "int64" in out  # the element spec

    result = run_cli("info", "--json", "mnist", "v1", "--storage", str(root))
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert data["num_records"] == 1500
    assert data["build_id"] == manifest.build_id

    result = run_cli("info", "mnist", "v9", "--storage", str(root))
    assert result.returncode != 0
    assert "v9" in result.stderr and "Traceback" not in result.stderr


def test_verify_good_and_bit_flipped(root: Path) -> None:
    result = run_cli("verify", "mnist", "v1", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout

    part = root / "mnist" / "v1" / "part-00000.mdb"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    result = run_cli("verify", "mnist", "v1", "--storage", str(root))
    assert result.returncode != 0
    assert "part-00000.mdb" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "next: `yogacache rm mnist v1` and build it again" in " ".join(result.stderr.split()), result.stderr
    # The other caches still verify.
    assert run_cli("verify", "mnist", "v2", "--storage", str(root)).returncode == 0


def test_verify_truncated_part(root: Path) -> None:
    part = root / "cifar" / "v1" / "part-00000.mdb"
    with open(part, "r+b") as handle:
        handle.truncate(part.stat().st_size - 4096)
    result = run_cli("verify", "cifar", "v1", "--storage", str(root))
    assert result.returncode != 0
    assert "part-00000.mdb" in result.stderr


# -- where the storage is -----------------------------------------------------------------


def _ls_ids(result: subprocess.CompletedProcess[str]) -> set[tuple[str, str]]:
    assert result.returncode == 0, result.stderr
    return {(r["dataset_id"], r["dataset_version"]) for r in json.loads(result.stdout)}


def test_storage_json_config_file(root: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"type": "shared_fs", "host_storage_path": str(root)}))
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(bare))) == ALL
    nested = tmp_path / "nested.json"
    nested.write_text(
        json.dumps(
            {"data_layer": {"type": "shared_fs", "host_storage_path": str(root), "container_storage_path": None}}
        )
    )
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(nested))) == ALL


def test_storage_yaml_config_file(root: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.yaml"
    bare.write_text(f"type: shared_fs\nhost_storage_path: {root}\n")
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(bare))) == ALL
    nested = tmp_path / "experiment.yml"
    nested.write_text(f"name: my-experiment\ndata_layer:\n  type: shared_fs\n  host_storage_path: {root}\n")
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(nested))) == ALL
    # Commands other than ls take the same option.
    result = run_cli("info", "mnist", "v2", "--storage", str(nested))
    assert result.returncode == 0 and "mnist" in result.stdout


def test_storage_config_container_path_wins(root: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"type": "shared_fs", "host_storage_path": str(tmp_path / "host-view"), "container_storage_path": str(root)}
        )
    )
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(config))) == ALL


@pytest.mark.parametrize(
    "config, words",
    [
        ({"type": "shared_fs", "host_storage_path": "/x", "bogus_key": 1}, ["bogus_key"]),
        (
            {"data_layer": {"type": "shared_fs", "host_storage_path": "/x", "hots_storage_path": "/y"}},
            ["hots_storage_path"],
        ),
        ({"type": "nfs", "host_storage_path": "/x"}, ["type", "nfs"]),
        ({"type": "shared_fs", "host_storage_path": "relative/path"}, ["absolute"]),
    ],
    ids=["unknown-key", "unknown-key-nested", "bad-type", "relative"],
)
def test_storage_config_errors(tmp_path: Path, config: dict[str, Any], words: list[str]) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    result = run_cli("ls", "--storage", str(path))
    assert result.returncode != 0
    for word in words:
        assert word in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    yaml_path = tmp_path / "config.yaml"
    yaml_path.write_text(json.dumps(config))  # JSON is valid YAML
    result = run_cli("ls", "--storage", str(yaml_path))
    assert result.returncode != 0
    assert words[0] in result.stderr


def test_storage_invalid_config_file_contents(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    result = run_cli("ls", "--storage", str(path))
    assert result.returncode != 0
    assert str(path) in result.stderr and "Traceback" not in result.stderr


def test_storage_from_environment(root: Path, tmp_path: Path) -> None:
    assert _ls_ids(run_cli("ls", "--json", env={"YOGACACHE_STORAGE": str(root)})) == ALL
    config = tmp_path / "env.yaml"
    config.write_text(f"data_layer:\n  type: shared_fs\n  host_storage_path: {root}\n")
    assert _ls_ids(run_cli("ls", "--json", env={"YOGACACHE_STORAGE": str(config)})) == ALL
    # --storage wins over the environment.
    other = tmp_path / "other"
    CacheStore(other, show_progress=False).build("other", "v1", _records(1))
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(other), env={"YOGACACHE_STORAGE": str(root)})) == {
        ("other", "v1")
    }
    result = run_cli("rm", "-y", "mnist", "v2", env={"YOGACACHE_STORAGE": str(root)})
    assert result.returncode == 0
    assert _surviving(root) == ALL - {("mnist", "v2")}


def test_storage_local_default(private_default_root: Path, root: Path) -> None:
    # conftest points YOGACACHE_HOME at a private directory and clears YOGACACHE_STORAGE.
    assert "YOGACACHE_STORAGE" not in os.environ
    assert _ls_ids(run_cli("ls", "--json")) == set()
    CacheStore(private_default_root, show_progress=False).build("local", "v3", _records(4))
    assert _ls_ids(run_cli("ls", "--json")) == {("local", "v3")}
    result = run_cli("verify", "local", "v3")
    assert result.returncode == 0, result.stderr
    # A config with no storage path also means the local default.
    config = private_default_root.parent / "null.json"
    config.write_text(json.dumps({"type": "shared_fs", "host_storage_path": None}))
    assert _ls_ids(run_cli("ls", "--json", "--storage", str(config))) == {("local", "v3")}


# -- progress -----------------------------------------------------------------------------


class _FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_logs_lines_when_not_on_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()  # not a terminal
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        progress = Progress("caching ds:v1", stream=stream, interval=0.0)
        for step in range(1, 6):
            progress.update(step * 1000, step * 1_000_000)
        progress.finish(5000, 5_000_000)
    messages = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    assert len(messages) == 6, messages
    assert all("caching ds:v1" in m for m in messages)
    assert "5,000 records" in messages[-1]
    assert "records/s" in messages[0]
    assert stream.getvalue() == "", "no terminal control characters when not on a terminal"


def test_progress_is_throttled(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        progress = Progress("slow", stream=io.StringIO(), interval=3600.0)
        for step in range(100):
            progress.update(step, step)
    assert [r for r in caplog.records if r.name == "yogacache.progress"] == []


def test_progress_on_a_terminal_rewrites_one_line(caplog: pytest.LogCaptureFixture) -> None:
    terminal = _FakeTerminal()
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        progress = Progress("tty", stream=terminal, interval=0.0)
        progress.update(10, 100)
        progress.update(20, 200)
        progress.finish(20, 200)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue())  # drop colours, cursor codes
    assert text.count("\r") == 2  # drawn once, then rewritten in place twice
    assert text.endswith("\n") and text.count("\n") == 1
    assert "20 records" in text
    assert [r for r in caplog.records if r.name == "yogacache.progress"] == []


def test_progress_disabled_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        progress = Progress("off", enabled=False, stream=stream, interval=0.0)
        progress.update(1, 1)
        progress.finish(1, 1)
    assert stream.getvalue() == ""
    assert [r for r in caplog.records if r.name == "yogacache.progress"] == []


def test_long_build_logs_progress(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A build driven through CacheWriter reports progress as it goes, not only at the end."""
    from yogacache.format.sources import PythonSource

    source = PythonSource({"i": np.int64(i), "x": np.zeros(64, np.float32)} for i in range(3000))
    with caplog.at_level(logging.INFO, logger="yogacache.progress"):
        progress = Progress("caching long:v1", stream=io.StringIO(), interval=0.0)
        with CacheWriter(tmp_path / "long" / "v1", "long", "v1", progress=progress) as writer:
            for batch in source.encoded_batches():
                writer.add_encoded(batch)
            manifest = writer.seal(source.spec())
    messages = [r.getMessage() for r in caplog.records if r.name == "yogacache.progress"]
    assert manifest.num_records == 3000
    building = [m for m in messages if m.startswith("building")]
    assert len(building) >= 5, messages  # one per batch of 256 records at least
    counts = [int(m.split(": ")[1].split(" records")[0].replace(",", "")) for m in building]
    assert counts == sorted(counts) and counts[0] < 3000
    assert messages[-1].startswith("built") and "3,000 records" in messages[-1]
