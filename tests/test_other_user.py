"""The multi-user tests run wherever a checkout lives, a private home directory included.

They run Python as a second user (nobody), which cannot read a checkout in a directory of mode
0700, nor the virtual environment inside it. ``tests.other_user`` gives that user a readable copy
of the package and of what it imports; this checks it against a private checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests import other_user

CHECK = "import sys, yogacache, yogacache.store.local, yogacache.read.reader; print(yogacache.__file__)"


def private_checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's package in a home directory only root can read (umask 077)."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    package = home / "checkout" / "yogacache"
    shutil.copytree(other_user.REPO / "yogacache", package, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [package, *package.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    return package


def test_the_second_user_imports_a_private_checkouts_package_from_its_runtime(tmp_path: Path) -> None:
    package = private_checkout(tmp_path)
    runtime = other_user.make_runtime(package)
    env = runtime.env()

    # What the tests did before: the checkout on PYTHONPATH, which nobody cannot read.
    direct = subprocess.run(
        runtime.command(CHECK), env={**env, "PYTHONPATH": str(package.parent)}, cwd="/",
        capture_output=True, text=True, timeout=120,
    )
    assert direct.returncode != 0 and "No module named 'yogacache'" in direct.stderr, direct.stderr[-2000:]

    result = subprocess.run(runtime.command(CHECK), env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert Path(result.stdout.strip()) == runtime.path / "yogacache" / "__init__.py"
    # The copy is this checkout's package, readable by every user and writable by none of them.
    assert (runtime.path / "yogacache" / "datalayer.py").read_bytes() == (package / "datalayer.py").read_bytes()
    for path in [runtime.path, *runtime.path.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & 0o005 if path.is_dir() else mode & 0o004, path
        assert not mode & 0o002, path
    assert os.stat(runtime.python).st_mode & 0o001  # an interpreter others may start
