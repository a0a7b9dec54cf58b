"""``make demo`` as a new user sees it: no TensorFlow or Keras noise on stderr, the data learned."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_quickstart_prints_no_tensorflow_noise(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "KERAS_"))}  # as from a shell
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--storage", str(tmp_path / "c"), "--records", "1000"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    noise = [
        line
        for line in result.stderr.splitlines()
        if any(word in line for word in ("oneDNN", "absl", "cuda", "Warning", "WARNING", "I0000", "W0000"))
    ]
    assert noise == [], result.stderr
    assert "final accuracy" in result.stdout
    # The last line's command runs as printed: on PATH, or the venv's script by its path.
    command = re.search(r"run `(\S+) ls`", result.stdout)
    assert command is not None, result.stdout
    found = shutil.which(command.group(1))
    assert found is not None, f"the demo says to run {command.group(1)!r}, which is not a command here"
    assert os.path.samefile(found, Path(sys.executable).parent / "yogacache"), found
