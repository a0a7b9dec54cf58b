"""Reading never writes into a cache: verification stamps live in the user's state directory.

A sealed cache may sit on a read-only bind mount or belong to another user: it must open and
read with full verification in every mode, while the stamps that spare re-hashing go to a
private, node-local state directory keyed by each part file's identity and manifest hash.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import other_user
from yogacache.errors import CorruptCacheError
from yogacache.format import integrity
from yogacache.format.integrity import (
    STAMPS_DIR,
    VERIFY_MODES,
    Verify,
    file_identity,
    has_stamp,
    state_dir,
    write_stamp,
)
from yogacache.format.manifest import Manifest
from yogacache.store.local import CacheStore

FIXTURES = Path(__file__).parent / "fixtures" / "cache_0_1_0"
N = 3_000
MODES: tuple[Verify, ...] = VERIFY_MODES
NOBODY = other_user.NOBODY


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's state directory (subprocesses inherit the variable)."""
    path = tmp_path / "state"
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(path))
    return path


def build(root: Path) -> CacheStore:
    # Four parts (a part file is never larger than part_size_bytes, LMDB's pages counted).
    store = CacheStore(root, show_progress=False, part_size_bytes=100_000)
    store.build("data", "v1", [{"i": np.int64(i), "name": f"r{i}".encode()} for i in range(N)])
    assert 3 <= len(store.manifest("data", "v1").parts) <= 10
    return store


def cache_dir(root: Path) -> Path:
    return root / "data" / "v1"


def part_paths(root: Path) -> list[Path]:
    return sorted(cache_dir(root).glob("part-*.mdb"))


def snapshot(root: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every path under ``root`` (``root`` included): size, mode, mtime and ctime."""
    tree = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        tree[str(path.relative_to(root))] = (st.st_size, st.st_mode, st.st_mtime_ns, st.st_ctime_ns)
    return tree


def read_all(store: CacheStore) -> list[tuple[int, bytes]]:
    reader = store.open("data", "v1")
    try:
        return [(int(e["i"]), bytes(e["name"])) for e in reader.read_elements(np.arange(len(reader)))]
    finally:
        reader.close()


EXPECTED = [(i, f"r{i}".encode()) for i in range(N)]


class HashCounter:
    """Counts the part hashes verification computes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        original = integrity.hash_file

        def counted(path: Path, *args: Any) -> str:
            self.paths.append(Path(path))
            return original(path, *args)

        monkeypatch.setattr(integrity, "hash_file", counted)

    def take(self) -> int:
        count, self.paths = len(self.paths), []
        return count


# -- (1) opening and reading leaves the cache untouched, in every mode -----------------------------


def test_open_and_read_in_every_mode_writes_nothing_in_the_cache(tmp_path: Path, state: Path) -> None:
    root = tmp_path / "caches"
    build(root)
    shutil.rmtree(state)  # no stamps yet: the first auto open hashes and stamps
    before = snapshot(root)
    modes: tuple[Verify, ...] = (*MODES, "auto", "full")
    for mode in modes:
        assert read_all(CacheStore(root, verify=mode, show_progress=False)) == EXPECTED
        CacheStore(root, show_progress=False).verify_cache("data", "v1")
        assert snapshot(root) == before, f"verify={mode} changed the cache tree"
    # The stamps went to the state directory instead, private to this user.
    stamps = state / STAMPS_DIR
    assert len(list(stamps.glob("*.json"))) == len(part_paths(root))
    assert stat.S_IMODE(stamps.stat().st_mode) == 0o700 and stat.S_IMODE(state.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in stamps.iterdir())


def test_a_cache_of_0_1_0_opens_without_writing_and_its_old_stamp_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(FIXTURES, tmp_path / "fixture")
    # yogacache 0.1.0 wrote stamps into caches; one left there neither vouches nor is rewritten.
    legacy = tmp_path / "fixture" / "fixed" / ".verified.json"
    legacy.write_text(json.dumps({"part-00000.mdb": ["0" * 64, 1, 2, 3, 4, 5]}))
    before = snapshot(tmp_path / "fixture")
    hashes = HashCounter(monkeypatch)
    for mode in MODES:
        reader = CacheStore(tmp_path, verify=mode, show_progress=False).open("fixture", "fixed")
        assert [int(e["label"]) for e in reader.read_elements(range(len(reader)))] == list(range(50))
    assert hashes.take() == 2  # auto (no stamp of this user yet) and full
    assert snapshot(tmp_path / "fixture") == before
    assert legacy.read_text() == json.dumps({"part-00000.mdb": ["0" * 64, 1, 2, 3, 4, 5]})


# -- (2) a cache owned by another user, read by a user who cannot write anything of it ------------

READ_AS_NOBODY = textwrap.dedent(
    """
    import hashlib, json, os, resource, sys, tempfile
    from pathlib import Path
    import numpy as np
    import yogacache.format.integrity as integrity
    from yogacache.store.local import CacheStore

    # Started as nobody (tests.other_user): every id is its (real, effective and saved), no group.
    assert os.getuid() == os.geteuid() == os.getresuid()[2] == int(sys.argv[2])
    assert os.getgid() == os.getegid() == int(sys.argv[2]) and os.getgroups() == []
    root = Path(sys.argv[1])
    try:
        (root / "data" / "v1" / "probe").write_text("x")
        sys.exit("the cache is writable: the test would prove nothing")
    except PermissionError:
        pass

    hashed = []
    original = integrity.hash_file
    integrity.hash_file = lambda path, *args: hashed.append(1) or original(path, *args)
    result = {}
    for mode in ("auto", "full", "size", "auto"):
        store = CacheStore(root, verify=mode, show_progress=False)
        reader = store.get_or_build("data", "v1", lambda: sys.exit("tried to rebuild"))
        elements = reader.read_elements(np.arange(len(reader)))
        records = [[int(e["i"]), bytes(e["name"]).decode()] for e in elements]
        result.setdefault("records", records)
        assert records == result["records"], mode
        result.setdefault("hashed", []).append(len(hashed))
        hashed.clear()
    print(json.dumps(result))
    """
)


@pytest.fixture()
def shared_base() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is private to root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to build a cache as one user and read it as another")
    base = Path(tempfile.mkdtemp(prefix="yogacache-readonly-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("where", ["unwritable-home", "unwritable-state-dir", "writable-state-dir"])
def test_a_cache_of_another_user_reads_with_full_verification(
    shared_base: Path, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = shared_base / "caches"
    store = build(root)
    for path in [root, *root.rglob("*")]:
        assert path.stat().st_uid == 0 and not path.stat().st_mode & stat.S_IWOTH, path
    home = shared_base / "home"  # root's, read-only to nobody
    home.mkdir(mode=0o755)
    python = other_user.runtime()  # this tree's package, readable by nobody wherever the checkout is
    env = {k: v for k, v in os.environ.items() if k not in ("YOGACACHE_STATE_DIR", "XDG_STATE_HOME")}
    env = python.env(env)
    env["HOME"] = str(home)
    if where == "unwritable-state-dir":
        env["YOGACACHE_STATE_DIR"] = str(home / "state")
    elif where == "writable-state-dir":
        writable = shared_base / "nobody-state"
        writable.mkdir(mode=0o700)
        os.chown(writable, NOBODY, NOBODY)
        env["YOGACACHE_STATE_DIR"] = str(writable)
    before = snapshot(shared_base)

    result = subprocess.run(
        python.command(READ_AS_NOBODY, str(root), str(NOBODY), uid=NOBODY),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )

    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert [(i, name.encode()) for i, name in out["records"]] == EXPECTED
    n_parts = len(store.manifest("data", "v1").parts)
    after = snapshot(shared_base)
    if where == "writable-state-dir":
        # auto hashes (root's stamps are not nobody's), full hashes, size does not, and the
        # second auto reuses the stamps nobody wrote in its own state directory.
        assert out["hashed"] == [n_parts, n_parts, 0, 0]
        stamps = sorted((shared_base / "nobody-state" / STAMPS_DIR).iterdir())
        assert len(stamps) == n_parts and all(p.stat().st_uid == NOBODY for p in stamps)
        after = {k: v for k, v in after.items() if not k.startswith("nobody-state")}
        before = {k: v for k, v in before.items() if not k.startswith("nobody-state")}
    else:
        # Nowhere to keep stamps: every verifying open re-hashes, and reading still works.
        assert out["hashed"] == [n_parts, n_parts, 0, n_parts]
    assert after == before  # nothing written in the caches (nor in the read-only home)


# -- (3) a stamp vouches for one file identity and one manifest hash only ---------------------------


def test_a_part_tampered_after_its_stamp_fails_to_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = build(tmp_path)
    assert len(read_all(store)) == N  # stamped (by the writer) and reused
    target = part_paths(tmp_path)[1]
    before = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(target, "r+b") as handle:  # same inode, same size
        handle.write(bytes(data))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime restored: only ctime tells
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns
    with pytest.raises(CorruptCacheError, match=str(target)):
        store.open("data", "v1")


def test_a_replaced_part_with_the_same_size_and_mtime_fails_to_open(tmp_path: Path) -> None:
    store = build(tmp_path)
    read_all(store)
    target = part_paths(tmp_path)[0]
    before = target.stat()
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x55
    replacement = target.with_name("replacement")
    replacement.write_bytes(bytes(data))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, target)  # a new inode
    with pytest.raises(CorruptCacheError, match=str(target)):
        store.open("data", "v1")


def test_a_stamp_names_one_file_identity_and_one_hash(tmp_path: Path) -> None:
    original = tmp_path / "a"
    original.write_bytes(b"x" * 100)
    copy = tmp_path / "b"
    shutil.copy2(original, copy)  # same bytes, size and mtime; another inode
    identity = file_identity(original)
    digest = integrity.hash_file(original, "sha256")
    assert not has_stamp(identity, digest)
    write_stamp(identity, digest)
    assert has_stamp(identity, digest)
    assert not has_stamp(file_identity(copy), digest)
    assert not has_stamp(identity, "0" * 64)  # another manifest's hash for the same file
    with open(original, "r+b") as handle:
        handle.write(b"y")
    assert not has_stamp(file_identity(original), digest)


def test_a_stamp_directory_others_can_write_is_not_trusted(
    tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = build(tmp_path)
    n_parts = len(part_paths(tmp_path))
    hashes = HashCounter(monkeypatch)
    read_all(store)
    assert hashes.take() == 0
    (state / STAMPS_DIR).chmod(0o777)
    read_all(store)
    assert hashes.take() == n_parts  # ignored, and not written to either
    if os.geteuid() == 0:
        (state / STAMPS_DIR).chmod(0o700)
        os.chown(state / STAMPS_DIR, NOBODY, NOBODY)  # another user's directory
        read_all(store)
        assert hashes.take() == n_parts


# -- (4) stamps are reused: an unchanged cache is hashed once per node and user ----------------------


def test_stamps_spare_rehashing_in_auto_mode_only(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = build(tmp_path)
    n_parts = len(part_paths(tmp_path))
    hashes = HashCounter(monkeypatch)
    assert read_all(store) == EXPECTED
    assert hashes.take() == 0  # the writer stamped the parts it hashed
    shutil.rmtree(state)
    assert read_all(store) == EXPECTED
    assert hashes.take() == n_parts  # no stamps: auto hashes every part once
    assert read_all(store) == EXPECTED
    assert hashes.take() == 0  # the second auto open reuses the stamps of the first
    assert read_all(CacheStore(tmp_path, verify="full", show_progress=False)) == EXPECTED
    assert hashes.take() == n_parts  # full always re-hashes
    assert read_all(CacheStore(tmp_path, verify="size", show_progress=False)) == EXPECTED
    assert hashes.take() == 0
    # A new build of the same version has new files: its parts are stamped anew, and its
    # stamps do not make the old ones vouch for anything else.
    store.build("data", "v1", [{"i": np.int64(i), "name": f"r{i}".encode()} for i in range(N)])
    assert read_all(store) == EXPECTED
    assert hashes.take() == 0


def test_an_unwritable_state_dir_means_rehashing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = build(tmp_path)
    n_parts = len(part_paths(tmp_path))
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(blocker / "state"))
    hashes = HashCounter(monkeypatch)
    for _ in range(2):
        assert read_all(store) == EXPECTED
        assert hashes.take() == n_parts


def test_state_dir_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert state_dir() == tmp_path / "explicit"
    monkeypatch.delenv("YOGACACHE_STATE_DIR")
    assert state_dir() == tmp_path / "xdg" / "yogacache"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/path")  # ignored, as the XDG spec says
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "yogacache"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert state_dir() == tmp_path / "home" / ".local" / "state" / "yogacache"


def test_unknown_verify_mode_is_refused(tmp_path: Path) -> None:
    build(tmp_path)
    manifest = Manifest.load(cache_dir(tmp_path))
    with pytest.raises(ValueError, match="verify must be one of auto, full, size"):
        integrity.verify_parts(cache_dir(tmp_path), manifest, "fast")  # type: ignore[arg-type]
