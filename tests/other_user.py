"""Python for a second user (nobody) in the multi-user tests, wherever the checkout was cloned.

A checkout often sits in a private home directory (mode 0700), its virtual environment inside
it: another user can read neither the package nor its dependencies there ("No module named
'yogacache'"). ``runtime()`` gives that user what its Python needs in a world-readable temporary
directory, once per test session: the ``yogacache`` package of this checkout and the third-party
packages its modules import (hard links where a file is already world-readable, copies with
mode 0644 elsewhere). The second user runs an interpreter of this Python version that it can
start (this environment's own, else the system's) with that directory on ``PYTHONPATH``.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534
# What the second user's code imports; the packages these come from are what it is given.
ENTRY_MODULES = (
    "numpy",
    "yogacache",
    "yogacache.backends.files",
    "yogacache.format.integrity",
    "yogacache.locks",
    "yogacache.read.reader",
    "yogacache.store.local",
    "yogacache.store.remote",
)
_CLOSURE = textwrap.dedent(
    """
    import importlib, json, sys, sysconfig
    for name in sys.argv[1:]:
        importlib.import_module(name)
    print(json.dumps({
        "site": sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}),
        "files": sorted({m.__file__ for m in list(sys.modules.values()) if getattr(m, "__file__", None)}),
    }))
    """
)


def as_user(uid: int = NOBODY) -> list[str]:
    """The command prefix that runs a program as ``uid`` (its group, no supplementary groups)."""
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups"]


@dataclass(frozen=True)
class Runtime:
    """An interpreter the second user can start and a directory it can read holding the packages."""

    python: str
    path: Path

    def env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with the runtime on the path, alone."""
        env = dict(os.environ if base is None else base)
        env.update(PYTHONPATH=str(self.path), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
        return env

    def command(self, code: str, *args: str, uid: int = NOBODY) -> list[str]:
        return [*as_user(uid), self.python, "-c", code, *args]


def _place(source: Path, target: Path) -> None:
    """``source`` (a file or a tree) at ``target``, readable by every user, by hard link where
    its file is world-readable already and on the same filesystem, else by copy."""
    if source.is_dir():
        target.mkdir(mode=0o755)
        target.chmod(0o755)
        for child in source.iterdir():
            _place(child, target / child.name)
        return
    mode = source.stat().st_mode
    if mode & stat.S_IROTH:
        try:
            os.link(source, target)
            return
        except OSError:  # another filesystem, or links refused: copy
            pass
    shutil.copyfile(source, target)
    target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)


def _site_entries(site: Sequence[str], files: Sequence[str]) -> set[Path]:
    """The top-level entries of ``site`` (packages, modules, and the ``<name>.libs`` folders of
    their wheels' shared libraries) that hold any of ``files``."""
    entries: set[Path] = set()
    for directory in map(Path, site):
        for file in map(Path, files):
            try:
                top = file.relative_to(directory).parts[0]
            except ValueError:
                continue
            if top.startswith(("__editable__", "_distutils_hack")):
                continue
            entries.add(directory / top)
            name = top.split(".")[0].split("-")[0]
            entries.update(directory.glob(f"{name}*.libs"))
    return entries


def _can_run(python: str, path: Path) -> bool:
    """Whether the second user starts ``python`` and imports the runtime's packages with it."""
    runtime = Runtime(python, path)
    probe = "import numpy, lmdb, msgpack, yogacache.store.local"
    env = runtime.env({"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    try:
        result = subprocess.run(runtime.command(probe), env=env, cwd="/", capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


@functools.cache
def runtime() -> Runtime:
    """The second user's Python for this session, with this checkout's package (skips the test
    where none can be made)."""
    return make_runtime(REPO / "yogacache")


def make_runtime(package: Path) -> Runtime:
    """A world-readable directory holding ``package`` (a copy of ``yogacache``) and the packages
    it imports, removed at exit, and an interpreter the second user starts with it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to act as a second user")
    found = subprocess.run(
        [sys.executable, "-c", _CLOSURE, *ENTRY_MODULES], capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    if found.returncode != 0:
        raise RuntimeError(f"could not list what the second user imports: {found.stderr[-2000:]}")
    closure = json.loads(found.stdout)
    root = Path(tempfile.mkdtemp(prefix="yogacache-other-user-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    root.chmod(0o755)
    path = root / "site"
    path.mkdir(mode=0o755)
    _place(package, path / "yogacache")
    for entry in sorted(_site_entries(closure["site"], closure["files"])):
        if not (path / entry.name).exists():
            _place(entry, path / entry.name)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"]
    for python in dict.fromkeys(candidates):
        if os.path.exists(python) and _can_run(python, path):
            return Runtime(python, path)
    pytest.skip(f"no {version} that uid {NOBODY} can start was found (tried {', '.join(candidates)})")
