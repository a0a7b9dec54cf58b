"""The local filesystem on a node several users share: roots, links, locks, modes, leftovers.

Multi-user cases run a second user (nobody) through ``setpriv``; the tests run as root.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import other_user
from yogacache.backends.files import FileObjectStore
from yogacache.errors import ConfigError, CorruptCacheError
from yogacache.format import durability, integrity
from yogacache.format.durability import write_file_durably
from yogacache.format.integrity import STAMPS_DIR, Verify, file_identity, has_stamp, verify_parts, write_stamp
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.locks import FileLock, LockFileError
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore
from yogacache.store.localroot import LOCAL_CACHE_DIR, LocalRoot, check_root, local_copies_root
from yogacache.store.remote import RemoteCacheStore

REPO = Path(__file__).resolve().parent.parent
NOBODY = other_user.NOBODY
DATA = [{"x": np.int64(i)} for i in range(300)]


def records(reader: CacheReader) -> list[int]:
    return [int(e["x"]) for e in reader.read_elements(np.arange(len(reader)))]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture()
def shared_base() -> Iterator[Path]:
    """``base/`` (0755, root's) holding ``tmp/``: a sticky directory every user may write, like /tmp."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two users")
    base = Path(tempfile.mkdtemp(prefix="yogacache-safety-"))
    base.chmod(0o755)
    (base / "tmp").mkdir()
    (base / "tmp").chmod(0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_nobody(code: str, *args: str, state: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` as user nobody, with this tree's package readable by it wherever the
    checkout lives (``tests.other_user``: a private home directory is not)."""
    python = other_user.runtime()
    env = {k: v for k, v in os.environ.items() if k not in ("YOGACACHE_STATE_DIR", "XDG_STATE_HOME")}
    env = python.env(env)
    env["HOME"] = "/nonexistent"
    if state is not None:
        env["YOGACACHE_STATE_DIR"] = str(state)
    return subprocess.run(
        python.command(textwrap.dedent(code), *args, uid=NOBODY),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
    )


def publish(bucket: Path, node: Path) -> RemoteCacheStore:
    store = RemoteCacheStore(FileObjectStore(bucket), node, show_progress=False)
    store.build("data", "v1", DATA)
    for path in [bucket, *bucket.rglob("*")]:  # readable by every user, as a bucket would be
        path.chmod(0o755 if path.is_dir() else 0o644)
    return store


# -- (10.3) a shared /tmp: one private root per user -----------------------------------------------
def test_under_a_world_writable_parent_each_user_gets_a_private_root(shared_base: Path) -> None:
    shared = shared_base / "tmp"
    assert local_copies_root(shared) == LocalRoot(shared / f"{LOCAL_CACHE_DIR}-0", private=True)
    assert local_copies_root(shared_base) == LocalRoot(shared_base / LOCAL_CACHE_DIR, private=False)

    store = publish(shared_base / "bucket", shared)
    assert records(store.open("data", "v1")) == list(range(300))
    mine = shared / f"{LOCAL_CACHE_DIR}-0"
    assert store.root == mine and (mine / "data" / "v1" / MANIFEST_NAME).is_file()
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700

    # A second user syncs the same cache through the same parent: no PermissionError, its own root.
    result = as_nobody(
        """
        import json, sys
        import numpy as np
        from yogacache.backends.files import FileObjectStore
        from yogacache.store.remote import RemoteCacheStore
        store = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], show_progress=False)
        reader = store.open("data", "v1")
        print(json.dumps([str(store.root), [int(e["x"]) for e in reader.read_elements(np.arange(len(reader)))]]))
        """,
        str(shared_base / "bucket"),
        str(shared),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    root, values = json.loads(result.stdout)
    theirs = shared / f"{LOCAL_CACHE_DIR}-{NOBODY}"
    assert root == str(theirs) and values == list(range(300))
    st = theirs.stat()
    assert st.st_uid == NOBODY and stat.S_IMODE(st.st_mode) == 0o700


PLANT = """
import os, sys
kind, path, target = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "link":
    os.symlink(target, path)
else:
    os.makedirs(os.path.join(path, "data"), mode=0o777)
    os.chmod(path, 0o777)
"""


@pytest.mark.parametrize("kind", ["link", "directory"])
def test_a_root_another_user_planted_is_refused_with_a_clear_error(shared_base: Path, kind: str) -> None:
    shared = shared_base / "tmp"
    victim = shared_base / "victim"  # root's own directory, which a planted link points to
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    store = publish(shared_base / "bucket", shared_base / "publisher")
    planted = shared / f"{LOCAL_CACHE_DIR}-0"
    result = as_nobody(PLANT, kind, str(planted), str(victim))
    assert result.returncode == 0, result.stderr
    assert planted.lstat().st_uid == NOBODY

    node = RemoteCacheStore(FileObjectStore(shared_base / "bucket"), shared, show_progress=False)
    expected = "belongs to user 'nobody' \\(uid 65534\\)"
    with pytest.raises(ConfigError, match=expected):
        node.open("data", "v1")
    with pytest.raises(ConfigError, match=expected):
        node.get_or_build("data", "v1", lambda: DATA)
    with pytest.raises(ConfigError, match=expected):
        node.list()

    assert tree(victim) == ["precious"] and (victim / "precious").read_text() == "keep me"
    if kind == "directory":
        assert tree(planted) == ["data"]
    assert store.manifest("data", "v1").num_records == 300


def test_the_old_shared_directory_of_another_user_is_not_in_the_way(shared_base: Path) -> None:
    shared = shared_base / "tmp"
    publish(shared_base / "bucket", shared_base / "publisher")
    result = as_nobody("import os, sys; os.mkdir(sys.argv[1], 0o755)", str(shared / LOCAL_CACHE_DIR))
    assert result.returncode == 0, result.stderr
    node = RemoteCacheStore(FileObjectStore(shared_base / "bucket"), shared, show_progress=False)
    assert records(node.open("data", "v1")) == list(range(300))
    assert tree(shared / LOCAL_CACHE_DIR) == []


@pytest.mark.parametrize("exists", [False, True])
def test_a_configured_root_of_another_user_is_a_config_error_not_a_permission_error(
    shared_base: Path, exists: bool
) -> None:
    publish(shared_base / "bucket", shared_base / "publisher")
    (shared_base / "mine").mkdir(mode=0o755)  # root's, not world-writable
    if exists:
        (shared_base / "mine" / LOCAL_CACHE_DIR).mkdir(mode=0o755)
    result = as_nobody(
        """
        import sys
        from yogacache.backends.files import FileObjectStore
        from yogacache.errors import ConfigError
        from yogacache.store.remote import RemoteCacheStore
        store = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], show_progress=False)
        try:
            store.open("data", "v1")
        except ConfigError as error:
            print(error)
        """,
        str(shared_base / "bucket"),
        str(shared_base / "mine"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "belongs to user 'root' (uid 0) and you (user 'nobody' (uid 65534)) cannot write to it" in result.stdout
    assert "local_cache_host_path" in result.stdout


def test_a_private_root_whose_mode_drifted_is_made_private_again(tmp_path: Path) -> None:
    root = LocalRoot(tmp_path / "root", private=True)
    assert not check_root(root, create=False)
    assert check_root(root, create=True)
    (tmp_path / "root").chmod(0o755)
    assert check_root(root, create=False)
    assert stat.S_IMODE((tmp_path / "root").stat().st_mode) == 0o700


# -- (10.4) no file is written through a planted link --------------------------------------------------
def test_writing_a_file_durably_never_follows_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    planted = tmp_path / "manifest.json"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_file_durably(planted, b"overwritten")
    assert victim.read_text() == "keep me"
    with pytest.raises(FileExistsError):
        write_file_durably(victim, b"overwritten")  # nor an existing file
    assert victim.read_text() == "keep me"


def test_a_stamp_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    part = tmp_path / "part"
    part.write_bytes(b"x" * 100)
    identity, digest = file_identity(part), integrity.hash_file(part, "sha256")
    stamps = integrity.state_dir()
    assert stamps is not None
    write_stamp(identity, "0" * 64)  # creates the directory
    stamp_name = integrity._stamp_name(identity, digest)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (stamps / STAMPS_DIR / stamp_name).symlink_to(victim)
    assert not has_stamp(identity, digest)  # a link is never read as a stamp

    write_stamp(identity, digest)

    assert victim.read_text() == "keep me"
    assert not (stamps / STAMPS_DIR / stamp_name).is_symlink() and has_stamp(identity, digest)


def test_a_stamp_directory_that_is_a_link_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (state / STAMPS_DIR).symlink_to(elsewhere)
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(state))
    part = tmp_path / "part"
    part.write_bytes(b"y" * 10)
    write_stamp(file_identity(part), integrity.hash_file(part, "sha256"))
    assert list(elsewhere.iterdir()) == []


def test_a_lock_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "caches", show_progress=False)
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "caches" / "data").mkdir(parents=True)
    store.lock_path("data", "v1").symlink_to(victim)
    with pytest.raises(LockFileError, match="symbolic link"):
        store.build("data", "v1", DATA)
    assert victim.read_text() == "keep me"


def test_a_lock_directory_another_user_linked_is_refused(shared_base: Path) -> None:
    root = shared_base / "tmp" / "caches"  # a shared root anyone may write to
    root.mkdir(mode=0o777)
    root.chmod(0o1777)
    victim = shared_base / "victim"
    victim.mkdir()
    result = as_nobody("import os, sys; os.symlink(sys.argv[2], sys.argv[1])", str(root / "data"), str(victim))
    assert result.returncode == 0, result.stderr
    store = CacheStore(root, show_progress=False)
    with pytest.raises(LockFileError, match="belongs to user 'nobody'"):
        store.build("data", "v1", DATA)
    assert list(victim.iterdir()) == []


# -- (9.11) no lock files, no empty directories left behind -------------------------------------------
def test_rm_and_failed_builds_leave_nothing_behind(tmp_path: Path) -> None:
    root = tmp_path / "caches"
    store = CacheStore(root, show_progress=False, part_size_bytes=2000)
    store.build("data", "v1", DATA)
    store.build("data", "v2", DATA[:10])
    files = [f"data/{v}/{p.name}" for v in ("v1", "v2") for p in (root / "data" / v).iterdir()]
    assert tree(root) == sorted(["data", "data/v1", "data/v2", *files])  # the builds' lock files are gone

    store.remove("data", "v1")
    assert tree(root) == sorted(["data", "data/v2", *(f"data/v2/{p.name}" for p in (root / "data" / "v2").iterdir())])
    store.remove("data", "v2")
    assert tree(root) == []

    def failing() -> list[dict[str, int]]:
        raise RuntimeError("the dataset function failed")

    with pytest.raises(RuntimeError, match="dataset function failed"):
        store.get_or_build("other", "v1", failing)
    assert tree(root) == []


def test_rm_removes_what_crashed_builds_of_the_cache_left(tmp_path: Path) -> None:
    root = tmp_path / "caches"
    store = CacheStore(root, show_progress=False)
    store.build("data", "v1", DATA)
    (root / "data" / ".v1.tmp-0123abcd").mkdir()
    (root / "data" / ".v1.tmp-0123abcd" / "part-00000.mdb").write_bytes(b"partial")
    store.remove("data", "v1")
    assert tree(root) == []


def test_a_lock_whose_file_is_unlinked_on_release_still_excludes(tmp_path: Path) -> None:
    """Unlinking on release is safe: a waiter that locked the unlinked file starts again."""
    counter = tmp_path / "counter"
    counter.write_text("0")
    lock_path = tmp_path / "d" / ".x.lock"
    inside = [0]
    overlaps = []

    def work() -> None:
        for _ in range(60):
            with FileLock(lock_path, prune_parent=True):
                inside[0] += 1
                overlaps.append(inside[0])
                counter.write_text(str(int(counter.read_text()) + 1))
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.read_text() == "240" and set(overlaps) == {1}
    assert not (tmp_path / "d").exists()  # the last release removed the file and its directory


# -- (10.6) explicit modes under umask 000 ---------------------------------------------------------------
UMASK_0 = """
import os, sys
import numpy as np
os.umask(0)
from yogacache.backends.files import FileObjectStore
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore
data = [{"x": np.int64(i)} for i in range(200)]
CacheStore(sys.argv[1], show_progress=False, part_size_bytes=1000).get_or_build("data", "v1", lambda: data)
publisher = RemoteCacheStore(FileObjectStore(sys.argv[2]), sys.argv[3], show_progress=False)
publisher.build("data", "v1", data)
RemoteCacheStore(FileObjectStore(sys.argv[2]), sys.argv[4], show_progress=False).open("data", "v1")
"""


def test_under_umask_000_nothing_is_writable_by_others(tmp_path: Path) -> None:
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp").chmod(0o1777)
    state = tmp_path / "home" / ".local" / "state"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HOME": str(tmp_path / "home")}
    env.pop("YOGACACHE_STATE_DIR")
    roots = [tmp_path / "caches", tmp_path / "bucket", tmp_path / "node-a", tmp_path / "tmp"]
    result = subprocess.run(
        [sys.executable, "-c", UMASK_0, *map(str, roots)], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]

    manifests = [p for p in tmp_path.rglob(MANIFEST_NAME) if "bucket" not in p.parts]
    assert len(manifests) == 3  # a local cache and two local copies of a published one
    for manifest in manifests:
        assert stat.S_IMODE(manifest.stat().st_mode) == 0o644, manifest
    stamps = list((state / "yogacache" / STAMPS_DIR).iterdir())
    assert stamps and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in stamps)
    for directory in (tmp_path / "home" / ".local", state, state / "yogacache", state / "yogacache" / STAMPS_DIR):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    private = tmp_path / "tmp" / f"{LOCAL_CACHE_DIR}-0"
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    for root in [tmp_path / "caches", tmp_path / "node-a", tmp_path / "home", private]:
        for path in [root, *root.rglob("*")]:
            assert not path.lstat().st_mode & (stat.S_IWOTH | stat.S_IWGRP), path


# -- (10.13) opening while rebuilds swap the directory -------------------------------------------------
@pytest.mark.parametrize(("verify", "exchange"), [("size", True), ("auto", True), ("auto", False)])
def test_open_during_rebuilds_reads_one_whole_build(
    tmp_path: Path, verify: Verify, exchange: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``exchange=False``: a filesystem without renameat2(RENAME_EXCHANGE) (NFS), where a rebuild
    moves the old cache aside and then the new one in."""
    if not exchange:
        monkeypatch.setattr(durability, "_rename_exchange", lambda a, b: False)
    root = tmp_path / "caches"
    # Parts of about 100 records (a part file is never larger than part_size_bytes, LMDB's
    # pages counted): a build takes milliseconds, so the 30 rebuilds race many opens.
    builder = CacheStore(root, show_progress=False, part_size_bytes=24_576)
    n = 400

    def build_number(k: int) -> list[dict[str, np.int64]]:  # every build has the same sizes
        return [{"x": np.int64(k * 1000 + i)} for i in range(n)]

    builder.build("data", "v1", build_number(0))
    assert len(builder.manifest("data", "v1").parts) >= 4
    errors: list[BaseException] = []
    done = threading.Event()

    def rebuild() -> None:
        try:
            for k in range(1, 31):
                builder.build("data", "v1", build_number(k))
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            done.set()

    thread = threading.Thread(target=rebuild)
    thread.start()
    reader_store = CacheStore(root, verify=verify, show_progress=False)
    opened = 0
    try:
        while not done.is_set():
            reader = reader_store.open("data", "v1")
            values = records(reader)
            k = values[0] // 1000
            assert values == [k * 1000 + i for i in range(n)], "records of two builds mixed"
            reader.close()
            opened += 1
    finally:
        thread.join()
    assert not errors, errors
    assert opened > 0


def test_a_damaged_part_is_reported_without_advising_to_delete_the_cache(tmp_path: Path) -> None:
    store = CacheStore(tmp_path / "caches", show_progress=False, verify="full")
    store.build("data", "v1", DATA)
    part = next((tmp_path / "caches" / "data" / "v1").glob("part-*.mdb"))
    data = bytearray(part.read_bytes())
    data[-1] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptCacheError) as raised:
        store.open("data", "v1")
    assert "altered or damaged" in str(raised.value)
    assert "remove" not in str(raised.value)
    with part.open("ab") as handle:
        handle.write(b"more")
    with pytest.raises(CorruptCacheError, match="truncated or replaced") as raised:
        store.open("data", "v1")
    assert "remove" not in str(raised.value)


# -- (10.15) stamps hold across the clients of a shared filesystem -----------------------------------
def test_a_stamp_holds_on_another_client_whose_device_number_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CacheStore(tmp_path / "caches", show_progress=False, part_size_bytes=2000)
    store.build("data", "v1", DATA)
    directory = tmp_path / "caches" / "data" / "v1"
    manifest = store.manifest("data", "v1")
    verify_parts(directory, manifest, "full")  # stamps every part
    hashed: list[Path] = []
    original_hash, original_stat = integrity.hash_file, os.stat

    def another_client(path: object, *args: object, **kwargs: object) -> os.stat_result:
        """os.stat as an NFS client with another device number sees the same files."""
        st = original_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        fields = list(st)
        fields[stat.ST_DEV] = st.st_dev + 17
        return os.stat_result(fields, {"st_mtime_ns": st.st_mtime_ns, "st_ctime_ns": st.st_ctime_ns})

    def counted(path: Path, *args: Any) -> str:
        hashed.append(path)
        return original_hash(path, *args)

    with monkeypatch.context() as patch:
        patch.setattr(integrity, "hash_file", counted)
        patch.setattr(integrity.os, "stat", another_client)
        verify_parts(directory, manifest, "auto")
    assert hashed == []  # no part re-hashed


def test_a_failed_download_leaves_no_lock_and_no_directory(tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"
    publish(bucket, tmp_path / "publisher")
    part = next(p for p in (bucket / "data" / "v1").iterdir() if p.name.endswith(".mdb"))
    part.write_bytes(b"\0" * part.stat().st_size)  # same size, other bytes
    node = RemoteCacheStore(FileObjectStore(bucket), tmp_path / "node", show_progress=False)
    with pytest.raises(CorruptCacheError, match="does not match its manifest"):
        node.open("data", "v1")
    assert tree(tmp_path / "node") == [LOCAL_CACHE_DIR]  # the root stays; nothing in it


def test_another_users_lock_file_still_locks(shared_base: Path) -> None:
    """A lock file this user cannot write (another user's) is locked through a read-only descriptor."""
    directory = shared_base / "tmp" / "locks"
    directory.mkdir()
    directory.chmod(0o1777)
    (directory / ".v1.lock").write_text("")
    (directory / ".v1.lock").chmod(0o644)
    result = as_nobody(
        """
        import sys
        from yogacache.locks import FileLock
        with FileLock(sys.argv[1], timeout=10):
            print("locked")
        """,
        str(directory / ".v1.lock"),
    )
    assert result.returncode == 0 and result.stdout == "locked\n", result.stderr[-3000:]
    with FileLock(directory / ".v1.lock", timeout=10):
        pass
    assert list(directory.iterdir()) == []  # its owner's release removed it
