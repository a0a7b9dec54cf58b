"""``yogacache build ID VERSION MODULE:FUNCTION``: a cache from a function, into a directory
that may not exist yet; mistakes in the function's name are one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent

SOURCE = """
import numpy as np

def make():
    return [{"i": np.int64(i), "x": np.full(3, i, np.float32)} for i in range(250)]

not_a_function = 3
"""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def test_build_from_a_file_and_from_a_module(tmp_path: Path) -> None:
    (tmp_path / "my_data.py").write_text(SOURCE)
    storage = tmp_path / "new" / "caches"  # created by the build
    by_file = run_cli("build", "ds", "v1", str(tmp_path / "my_data.py") + ":make", "--storage", str(storage), cwd=REPO)
    assert by_file.returncode == 0, by_file.stderr
    assert "built ds v1: 250 records" in by_file.stdout and str(storage / "ds" / "v1") in by_file.stdout
    by_module = run_cli("--storage", str(storage), "build", "ds", "v2", "my_data:make", cwd=tmp_path)
    assert by_module.returncode == 0, by_module.stderr
    store = CacheStore(storage)
    assert [(e.dataset_version, e.manifest.num_records if e.manifest else None) for e in store.list()] == [
        ("v1", 250),
        ("v2", 250),
    ]
    assert store.verify("ds", "v2").num_records == 250
    # A plain version is not what DataLayer.cache_train_dataset reads: the build says so.
    assert "cache_train_dataset('ds', 'v1') reads version v1_train" in by_file.stdout, by_file.stdout
    assert "replacing" not in by_file.stderr


def test_build_over_an_existing_cache_says_it_replaces_it(tmp_path: Path) -> None:
    (tmp_path / "my_data.py").write_text(SOURCE)
    storage = tmp_path / "caches"
    first = run_cli("build", "ds", "v1_train", "my_data:make", "--storage", str(storage), cwd=tmp_path)
    assert first.returncode == 0 and "replacing" not in first.stderr, first.stderr
    assert "cache_train_dataset" not in first.stdout  # a _train version is the one it reads
    again = run_cli("build", "ds", "v1_train", "my_data:make", "--storage", str(storage), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"replacing ds v1_train at {storage / 'ds' / 'v1_train'} (250 records)" in again.stderr, again.stderr
    assert CacheStore(storage).verify("ds", "v1_train").num_records == 250


def test_build_with_a_wrong_function_name_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "my_data.py").write_text(SOURCE)
    storage = tmp_path / "caches"
    for spec, words in (
        ("my_data:mkae", ["my_data", "mkae"]),
        ("my_data:not_a_function", ["not_a_function"]),
        ("no_such_module:make", ["no_such_module"]),
        ("my_data", ["MODULE:FUNCTION"]),
        (str(tmp_path / "missing.py") + ":make", ["missing.py"]),
    ):
        result = run_cli("build", "ds", "v1", spec, "--storage", str(storage), cwd=tmp_path)
        assert result.returncode == 1, spec
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("yogacache: error:"), result.stderr
        assert all(word in lines[0] for word in words), lines[0]
    assert not (storage / "ds" / "v1").exists()


SQUARES = """
import numpy as np

class Squares:  # defined in the file: workers must import this very file to unpickle it
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": np.int64(i), "sq": np.int64(i * i)}

def make():
    return Squares(500)
"""


def test_build_from_a_file_with_workers(tmp_path: Path) -> None:
    """``FILE.py:FUNCTION --workers 2`` imports the file as a module that spawned workers import
    the same way (it was loaded under a name no worker could import: PicklingError)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("data.py", "my-data.py"):
        (project / name).write_text(SQUARES)
    storage = tmp_path / "caches"
    for version, spec, cwd in (
        ("v1", "data.py:make", project),
        ("v2", str(project / "data.py") + ":make", REPO),
        ("v3", str(project / "my-data.py") + ":make", tmp_path),
    ):
        result = run_cli("build", "sq", version, spec, "--workers", "2", "--storage", str(storage), cwd=cwd)
        assert result.returncode == 0, (spec, result.stderr)
        assert f"built sq {version}: 500 records" in result.stdout
        with CacheStore(storage).open("sq", version) as reader:
            records = reader.read_elements(range(len(reader)))
            assert [(int(r["i"]), int(r["sq"])) for r in records] == [(i, i * i) for i in range(500)]


def test_build_from_a_file_named_like_an_imported_module_says_rename_it(tmp_path: Path) -> None:
    (tmp_path / "json.py").write_text(SQUARES)  # "json" is already imported, from the library
    spec = str(tmp_path / "json.py") + ":make"
    result = run_cli("build", "sq", "v1", spec, "--storage", str(tmp_path / "c"), cwd=REPO)
    assert result.returncode == 1 and "rename the file" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "c" / "sq").exists()
