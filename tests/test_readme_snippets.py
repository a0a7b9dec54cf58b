"""The README's YogaDL snippet runs as pasted (only its cache directory moved under tmp_path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def readme_block(after: str) -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start : text.index("```", start)]


def test_the_yogadl_snippet_runs_as_pasted(tmp_path: Path) -> None:
    snippet = readme_block("### YogaDL programs")
    assert "/tmp/yogadl_cache" in snippet
    directory = tmp_path / "fresh" / "yogadl_cache"  # does not exist yet, as on a new machine
    code = snippet.replace("/tmp/yogadl_cache", str(directory)) + "\nprint([int(x) for x in records])\n"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    expected = [int(i) for i in np.random.RandomState(777).permutation(10)][5:]
    assert result.stdout.strip().splitlines()[-1] == str(expected)
