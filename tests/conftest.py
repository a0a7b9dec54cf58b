"""Shared test set-up: quiet TensorFlow, and a private default cache root for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test writes into the user's real cache or state directory."""
    root = tmp_path / "default-root"
    monkeypatch.setenv("YOGACACHE_HOME", str(root))
    # Beside tmp_path, not in it: tests check what appears under tmp_path.
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(tmp_path.parent / f"{tmp_path.name}-state"))
    monkeypatch.delenv("YOGACACHE_STORAGE", raising=False)
    return root


pytest_plugins = ["tests.servers"]


# `YOGACACHE_TEST_TIMES=FILE make test`: each test file's wall and CPU seconds (the worker's own
# and its waited-for children's), one JSON line per file and worker appended to FILE: where the
# suite's time goes (docs/development.md).
_file_times: dict[str, list[float]] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> object:
    if not os.environ.get("YOGACACHE_TEST_TIMES"):
        yield
        return
    import resource
    import time

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    wall, used = time.monotonic(), cpu()
    yield
    spent = _file_times.setdefault(item.nodeid.split("::")[0], [0.0, 0.0, 0])
    spent[0] += time.monotonic() - wall
    spent[1] += cpu() - used
    spent[2] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("YOGACACHE_TEST_TIMES")
    if path and _file_times:
        import json

        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(path, "a") as out:
            for name, (wall, used, count) in _file_times.items():
                line = {"file": name, "worker": worker, "wall": wall, "cpu": used, "tests": count}
                out.write(json.dumps(line) + "\n")
