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
