"""Tables and help at 80 columns: ids are never cut mid-word, headers never cut, the remote tables
keep their LOCAL COPY column (S3 and GCS alike), and no help line runs past 80 characters."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, python_env
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore

IDS = [("imagenet", "v1_train"), ("imagenet-2012-full-resolution", "n20000_train"), ("quickstart-images", "v1_val")]
COMMANDS = ["", "ls", "info", "verify", "rm", "build", "pull", "push", "copy", "migrate", "gc", "export", "import"]


def run_cli(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args], capture_output=True, text=True, timeout=120,
        env={**python_env(), "COLUMNS": str(columns)},
    )


def records(n: int) -> list[dict[str, Any]]:
    return [{"x": np.zeros(1000, np.uint8)} for _ in range(n)]


def build_all(store: Any) -> None:
    for dataset_id, version in IDS:
        store.build(dataset_id, version, records(1234 if version != "v1_val" else 7))


def check_table(stdout: str, header: list[str], width: int = 80) -> list[str]:
    """Lines fit; the header is whole; every id shows whole, or wrapped only after a separator."""
    lines = stdout.splitlines()
    assert all(len(line) <= width for line in lines), "\n".join(f"{len(line):3} {line}" for line in lines)
    assert re.split(r"\s{2,}", lines[0].strip()) == header, lines[0]
    column = lines[0].index("VERSION")  # the DATASET column ends where VERSION begins
    pieces = [line[:column].strip() for line in lines[1:] if line[:column].strip()]
    joined, cells = "", []
    for piece in pieces:
        joined += piece
        if joined in {i for i, _ in IDS}:
            cells.append(joined)
            joined = ""
        else:
            assert piece[-1] in "-_.", f"{piece!r} cut mid-word:\n{stdout}"
    assert sorted(cells) == sorted(i for i, _ in IDS), stdout
    return lines


def test_the_local_table_fits_80_columns_without_cutting_an_id(tmp_path: Path) -> None:
    root = tmp_path / "a-rather-long-directory-name" / "with-several" / "levels-of-nesting" / "caches"
    build_all(CacheStore(root, show_progress=False))
    result = run_cli("ls", "--storage", str(root))
    assert result.returncode == 0, result.stderr
    lines = check_table(result.stdout, ["DATASET", "VERSION", "RECORDS", "DISK", "CREATED", "PATH"])
    for _, version in IDS:  # the path keeps its end, what tells caches apart
        assert any(line.rstrip().endswith(version) for line in lines), lines


@pytest.mark.parametrize("kind", ["s3", "gcs"])  # the table's layout; test_cli_remote lists Azure
def test_the_remote_tables_fit_80_columns_and_keep_local_copy(kind: str, tmp_path: Path, request: Any) -> None:
    cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
    bucket = cloud.new_bucket()
    build_all(RemoteCacheStore(cloud.store(bucket, "caches"), tmp_path / "node", show_progress=False))
    url, extra = cloud.url(bucket, "caches"), cloud.cli_args()
    result = run_cli("ls", "--storage", url, "--local-cache", str(tmp_path / "node"), *extra)
    assert result.returncode == 0, result.stderr
    lines = check_table(result.stdout, _header(result.stdout))
    assert "LOCAL COPY" in lines[0]
    copy_column = lines[0].index("LOCAL COPY")
    assert sorted(line[copy_column:].strip() for line in lines[1:] if line[copy_column:].strip()) == ["current"] * 3
    wide = run_cli("ls", "--storage", url, "--local-cache", str(tmp_path / "node"), *extra, columns=200)
    assert re.split(r"\s{2,}", wide.stdout.splitlines()[0].strip()) == [
        "DATASET", "VERSION", "RECORDS", "DISK", "CREATED", "LOCAL", "IN USE", "WHERE", "LOCAL COPY"
    ]


def _header(stdout: str) -> list[str]:
    """The remote header at 80 columns: whole column names, LOCAL COPY last."""
    header = re.split(r"\s{2,}", stdout.splitlines()[0].strip())
    assert header[:5] == ["DATASET", "VERSION", "RECORDS", "DISK", "CREATED"] and header[-1] == "LOCAL COPY", header
    known = {"DATASET", "VERSION", "RECORDS", "DISK", "CREATED", "LOCAL", "IN USE", "WHERE", "LOCAL COPY"}
    assert set(header) <= known, header
    return header


@pytest.mark.parametrize("command", COMMANDS)
def test_no_help_line_runs_past_80_columns(command: str) -> None:
    result = run_cli(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    long = [line for line in result.stdout.splitlines() if len(line) > 80]
    assert not long, "\n".join(f"{len(line)}: {line}" for line in long)
    assert "example" in result.stdout or command in ("verify", "pull")


def test_a_column_left_out_comes_back_where_the_room_made_fits_it() -> None:
    """Optional columns go first named first until the line fits; one that then fits again in
    the room a wider one left comes back, in its place."""
    from yogacache.cli.tables import _fit

    header = ["NAME", "IN USE", "WHERE", "STATE"]
    rows = [["n" * 10, "yes", "w" * 20, "current"]]
    # All: 10 + 6 + 20 + 7 + 6 = 49. Without IN USE: 41; without WHERE too: 19; IN USE back: 27.
    fitted, cells = _fit(header, rows, 30, fold=(), path=None, dates=(), optional=("IN USE", "WHERE"))
    assert fitted == ["NAME", "IN USE", "STATE"] and cells == [["n" * 10, "yes", "current"]]
    fitted, _ = _fit(header, rows, 49, fold=(), path=None, dates=(), optional=("IN USE", "WHERE"))
    assert fitted == header
    fitted, _ = _fit(header, rows, 20, fold=(), path=None, dates=(), optional=("IN USE", "WHERE"))
    assert fitted == ["NAME", "STATE"]
