"""Corrupted caches are detected on open and by verify_cache, with messages naming the path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache.errors import CacheNotFoundError, CorruptCacheError, IncompatibleCacheError
from yogacache.format.integrity import STAMPS_DIR
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
N = 20_000  # enough int64 records for several parts with a small part size


@pytest.fixture(autouse=True)
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Verification stamps of this test, in a private state directory (subprocesses inherit it)."""
    state = tmp_path / "state"
    monkeypatch.setenv("YOGACACHE_STATE_DIR", str(state))
    return state


def build(root: Path, n: int = N, part_size_bytes: int = 50_000) -> CacheStore:
    store = CacheStore(root, show_progress=False, part_size_bytes=part_size_bytes)
    store.build("data", "v1", [{"i": np.int64(i), "x": np.float32(i) / 2} for i in range(n)])
    return store


def cache_dir(root: Path) -> Path:
    return root / "data" / "v1"


def parts(root: Path) -> list[Path]:
    return sorted(cache_dir(root).glob("part-*.mdb"))


def flip_byte(path: Path, position: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    position = len(data) // 2 if position is None else position
    data[position] ^= 0xFF
    with open(path, "r+b") as handle:  # same inode, same size
        handle.write(bytes(data))


def truncate(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def remove(path: Path) -> None:
    path.unlink()


def swap_parts(root: Path) -> None:
    first, second = parts(root)[:2]
    tmp = first.with_name("swap")
    os.rename(first, tmp)
    os.rename(second, first)
    os.rename(tmp, second)


def rewrite_manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = cache_dir(root) / MANIFEST_NAME
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


PART_DAMAGE = {
    "truncated": lambda root: truncate(parts(root)[1]),
    "flipped-byte": lambda root: flip_byte(parts(root)[1]),
    "flipped-first-byte": lambda root: flip_byte(parts(root)[0], 0),
    "swapped-parts": swap_parts,
    "missing-part": lambda root: remove(parts(root)[-1]),
    "garbage-part": lambda root: parts(root)[0].write_bytes(os.urandom(parts(root)[0].stat().st_size)),
}


@pytest.mark.parametrize("damage", sorted(PART_DAMAGE))
def test_damaged_part_is_detected_on_open_and_by_verify(tmp_path: Path, damage: str) -> None:
    store = build(tmp_path)
    assert len(parts(tmp_path)) >= 3
    assert len(store.open("data", "v1")) == N  # opens fine (and writes its stamp)
    PART_DAMAGE[damage](tmp_path)
    with pytest.raises(CorruptCacheError, match=str(cache_dir(tmp_path))):
        store.open("data", "v1")
    with pytest.raises(CorruptCacheError, match=str(cache_dir(tmp_path))):
        store.verify_cache("data", "v1")
    storage = LFSStorage(LFSConfigurations(str(tmp_path)))
    with pytest.raises(CorruptCacheError, match=str(cache_dir(tmp_path))):
        storage.fetch("data", "v1")


def test_verify_cache_passes_on_a_good_cache(tmp_path: Path) -> None:
    store = build(tmp_path)
    manifest = store.verify_cache("data", "v1")
    assert manifest.num_records == N
    with pytest.raises(CacheNotFoundError):
        store.verify_cache("data", "v2")


def test_stamp_does_not_hide_a_modification(tmp_path: Path, state_dir: Path) -> None:
    store = build(tmp_path)
    store.open("data", "v1")
    # One stamp per part, in the state directory; none in the cache.
    assert len(list((state_dir / STAMPS_DIR).glob("*.json"))) == len(parts(tmp_path))
    assert {p.name for p in cache_dir(tmp_path).iterdir()} == {MANIFEST_NAME, *(p.name for p in parts(tmp_path))}
    target = parts(tmp_path)[1]
    before = target.stat()
    flip_byte(target)
    # Put size and times back: only the change itself (and ctime) can tell.
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert target.stat().st_size == before.st_size
    with pytest.raises(CorruptCacheError, match=str(target)):
        store.open("data", "v1")


def test_stamp_does_not_hide_a_replaced_part(tmp_path: Path) -> None:
    store = build(tmp_path)
    store.open("data", "v1")
    target = parts(tmp_path)[0]
    before = target.stat()
    replacement = target.with_name("replacement")
    data = bytearray(target.read_bytes())
    data[len(data) // 3] ^= 0x55
    replacement.write_bytes(bytes(data))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replacement, target)
    with pytest.raises(CorruptCacheError, match=str(target)):
        store.open("data", "v1")


def test_stamp_is_not_trusted_for_a_forged_stamp_of_other_files(tmp_path: Path) -> None:
    store = build(tmp_path)
    store.open("data", "v1")
    flip_byte(parts(tmp_path)[0])
    # A stamp in the cache, as yogacache 0.1.0 wrote them, vouching for the damaged file as it
    # is now: stamps in caches are ignored (anyone who can write the cache could forge one).
    forged = {}
    for part in json.loads((cache_dir(tmp_path) / MANIFEST_NAME).read_text())["parts"]:
        st = (cache_dir(tmp_path) / part["name"]).stat()
        digest = part.get("sha256") or part["blake3"]
        forged[part["name"]] = [digest, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
    (cache_dir(tmp_path) / ".verified.json").write_text(json.dumps(forged))
    with pytest.raises(CorruptCacheError):
        store.open("data", "v1")


def test_open_after_damage_then_repair_reads_again(tmp_path: Path) -> None:
    store = build(tmp_path, n=100)
    (part,) = parts(tmp_path)
    original = part.read_bytes()
    flip_byte(part)
    with pytest.raises(CorruptCacheError):
        store.open("data", "v1")
    part.write_bytes(original)
    reader = store.open("data", "v1")
    assert [int(e["i"]) for e in reader.read_elements(range(100))] == list(range(100))


def test_future_format_version_is_incompatible(tmp_path: Path) -> None:
    store = build(tmp_path, n=10)
    rewrite_manifest(tmp_path, lambda raw: raw.update(format_version=3))
    manifest_path = str(cache_dir(tmp_path) / MANIFEST_NAME)
    with pytest.raises(IncompatibleCacheError, match="version 3") as info:
        store.open("data", "v1")
    assert manifest_path in str(info.value) or str(cache_dir(tmp_path)) in str(info.value)
    with pytest.raises(IncompatibleCacheError, match="version 3"):
        store.verify_cache("data", "v1")
    with pytest.raises(IncompatibleCacheError, match="version 3"):
        LFSStorage(LFSConfigurations(str(tmp_path))).fetch("data", "v1")


MANIFEST_DAMAGE: dict[str, Callable[[Path], None]] = {
    "not-json": lambda path: path.write_text("{not json"),
    "truncated-json": lambda path: path.write_text(path.read_text()[: len(path.read_text()) // 2]),
    "empty": lambda path: path.write_bytes(b""),
    "binary": lambda path: path.write_bytes(b"\xff\xfe\x00garbage"),
    "a-list": lambda path: path.write_text("[]"),
    "not-yogacache": lambda path: path.write_text(json.dumps({"format": "other", "format_version": 1})),
}


def _edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        raw = json.loads(path.read_text())
        change(raw)
        path.write_text(json.dumps(raw))

    return apply


MANIFEST_DAMAGE.update(
    {
        "no-format-version": _edit(lambda raw: raw.pop("format_version")),
        "string-format-version": _edit(lambda raw: raw.update(format_version="1")),
        "no-parts": _edit(lambda raw: raw.pop("parts")),
        "parts-not-a-list": _edit(lambda raw: raw.update(parts=7)),
        "part-not-a-dict": _edit(lambda raw: raw.update(parts=[1])),
        "count-mismatch": _edit(lambda raw: raw.update(num_records=raw["num_records"] + 1)),
        "part-outside-dir": _edit(lambda raw: raw["parts"][0].update(name="../v2/part-00000.mdb")),
        "wrong-part-size": _edit(
            lambda raw: raw["parts"][0].update(size_bytes=raw["parts"][0]["size_bytes"] + 4096)
        ),
        "wrong-part-hash": _edit(lambda raw: raw["parts"][0].update(blake3="0" * 64)),
        "spec-not-a-spec": _edit(lambda raw: raw.update(element_spec=5)),
        "spec-unknown-dtype": _edit(
            lambda raw: raw.update(element_spec={"tensor": {"dtype": "object", "shape": []}})
        ),
        "spec-negative-dim": _edit(
            lambda raw: raw.update(
                element_spec={
                    "dict": [
                        ["i", {"tensor": {"dtype": "int64", "shape": [-1]}}],
                        ["x", {"tensor": {"dtype": "float32", "shape": []}}],
                    ]
                }
            )
        ),
        "deeply-nested": lambda path: path.write_text("[" * 100_000 + "]" * 100_000),
    }
)


@pytest.mark.parametrize("damage", sorted(MANIFEST_DAMAGE))
def test_malformed_manifest_is_corrupt_and_names_the_path(tmp_path: Path, damage: str) -> None:
    store = build(tmp_path, n=10)
    manifest_path = cache_dir(tmp_path) / MANIFEST_NAME
    MANIFEST_DAMAGE[damage](manifest_path)
    with pytest.raises(CorruptCacheError, match=str(cache_dir(tmp_path))):
        store.open("data", "v1")
    with pytest.raises(CorruptCacheError):
        store.verify_cache("data", "v1")
    with pytest.raises(CorruptCacheError, match=str(cache_dir(tmp_path))):
        LFSStorage(LFSConfigurations(str(tmp_path))).fetch("data", "v1")


def test_list_reports_a_broken_manifest_without_failing(tmp_path: Path) -> None:
    store = build(tmp_path, n=10)
    store.build("good", "v1", [np.int64(1)])
    (cache_dir(tmp_path) / MANIFEST_NAME).write_text("{oops")
    entries = {(e.dataset_id, e.dataset_version): e for e in store.list()}
    assert entries[("good", "v1")].error is None and entries[("good", "v1")].manifest is not None
    assert entries[("data", "v1")].manifest is None
    assert "not valid JSON" in (entries[("data", "v1")].error or "")


# -- the reader never crashes the interpreter ---------------------------------------------------


READ_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from yogacache.store.local import CacheStore
    from yogacache.dataref import CacheDataRef
    from yogacache.errors import YogaCacheError

    store = CacheStore(sys.argv[1], show_progress=False)
    try:
        reader = store.open("data", "v1")
        for element in CacheDataRef(reader).stream(shuffle=True, shuffle_seed=1):
            pass
        reader.read_columns(np.arange(len(reader)))
    except YogaCacheError as error:
        print("ERROR", type(error).__name__, error)
        sys.exit(3)
    print("READ OK")
    """
)


def run_reader(root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", READ_SCRIPT, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(REPO),
    )


def zero_middle_pages(root: Path) -> None:
    path = parts(root)[1]
    data = bytearray(path.read_bytes())
    middle = len(data) // 2 // 4096 * 4096
    data[middle : middle + 3 * 4096] = bytes(3 * 4096)
    with open(path, "r+b") as handle:
        handle.write(bytes(data))


def scribble_meta_pages(root: Path) -> None:
    path = parts(root)[0]
    data = bytearray(path.read_bytes())
    for position in range(16, 2 * 4096, 7):
        data[position] = 0xAB
    with open(path, "r+b") as handle:
        handle.write(bytes(data))


SUBPROCESS_DAMAGE = {
    "truncated": lambda root: truncate(parts(root)[1]),
    "zeroed-pages": zero_middle_pages,
    "scribbled-meta-pages": scribble_meta_pages,
    "garbage-part": lambda root: parts(root)[2].write_bytes(os.urandom(parts(root)[2].stat().st_size)),
    "swapped-parts": swap_parts,
}


def test_reader_subprocess_reads_a_good_cache(tmp_path: Path) -> None:
    build(tmp_path)
    result = run_reader(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "READ OK" in result.stdout


@pytest.mark.parametrize("damage", sorted(SUBPROCESS_DAMAGE))
def test_reader_never_crashes_the_interpreter(tmp_path: Path, damage: str) -> None:
    build(tmp_path)
    build_store = CacheStore(tmp_path, show_progress=False)
    build_store.open("data", "v1")  # a stamp exists: the reader must not trust it blindly
    SUBPROCESS_DAMAGE[damage](tmp_path)
    result = run_reader(tmp_path)
    assert result.returncode >= 0, f"killed by signal {-result.returncode}: {result.stderr[-2000:]}"
    assert result.returncode == 3, (result.stdout, result.stderr[-2000:])
    assert "ERROR CorruptCacheError" in result.stdout
    assert str(cache_dir(tmp_path)) in result.stdout


LATE_DAMAGE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    import numpy as np
    from yogacache.store.local import CacheStore
    from yogacache.dataref import CacheDataRef
    from yogacache.errors import YogaCacheError

    root, mode = Path(sys.argv[1]), sys.argv[2]
    store = CacheStore(root, show_progress=False)
    reader = store.open("data", "v1")  # verified now; the LMDB files are opened on first read
    part = sorted((root / "data" / "v1").glob("part-*.mdb"))[1]
    data = bytearray(part.read_bytes())
    if mode == "random":
        data = bytearray(os.urandom(len(data)))
    else:
        for position in range(16, 2 * 4096, 7):
            data[position] = 0xAB
    with open(part, "r+b") as handle:
        handle.write(bytes(data))
    try:
        for element in CacheDataRef(reader).stream():
            pass
    except YogaCacheError as error:
        print("ERROR", type(error).__name__, error)
        sys.exit(3)
    print("READ OK")
    """
)


@pytest.mark.parametrize("mode", ["random", "meta"])
def test_damage_after_open_never_crashes_the_interpreter(tmp_path: Path, mode: str) -> None:
    build(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, "-c", LATE_DAMAGE_SCRIPT, str(tmp_path), mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=str(REPO),
    )
    assert result.returncode >= 0, f"killed by signal {-result.returncode}: {result.stderr[-2000:]}"
    assert result.returncode == 3, (result.stdout, result.stderr[-2000:])
    assert "ERROR CorruptCacheError" in result.stdout
    assert str(cache_dir(tmp_path)) in result.stdout


def test_a_large_part_hashed_on_several_threads_at_seal_has_the_one_thread_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above ``_THREADED_SEAL_BYTES`` the seal hashes on the hasher's own threads; the digest and
    the CRC32C are those of a plain one-thread read, and a process forked afterwards seals on
    threads of its own (no pool inherited from the parent)."""
    import blake3

    from yogacache.format import checksum, integrity

    path = tmp_path / "part.mdb"
    data = np.random.default_rng(0).integers(0, 256, integrity._THREADED_SEAL_BYTES + 12_345, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    threads: list[int] = []

    def counted(*args: Any, max_threads: int = 1, **kwargs: Any) -> Any:
        threads.append(max_threads)
        return blake3.blake3(*args, max_threads=max_threads, **kwargs)

    monkeypatch.setattr(integrity, "blake3", type("blake3", (), {"blake3": staticmethod(counted)}))
    monkeypatch.setattr(integrity.os, "cpu_count", lambda: 2)

    blake, crc = integrity.seal_hashes(path)

    assert threads == [2]
    assert blake == blake3.blake3(path.read_bytes()).hexdigest()
    if checksum.available():
        assert crc == checksum.crc32c_file(path)
    child = os.fork()
    if child == 0:  # the child seals the same file on threads of its own
        os._exit(0 if integrity.seal_hashes(path)[0] == blake else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(child, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(child, 9)
        os.waitpid(child, 0)
        pytest.fail("the forked child's seal hash did not finish in 60 s (a thread pool inherited?)")
    assert os.waitstatus_to_exitcode(done[1]) == 0
