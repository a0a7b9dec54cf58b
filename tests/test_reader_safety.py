"""CacheReader safety: a reader reads the build it was opened on in every process (spawned and
forked DataLoader workers, pickled copies) or fails with CacheReplacedError; it holds one
descriptor per part, says "too many open files" when the limit is the cause, and ``close()``
releases every descriptor."""

from __future__ import annotations

import errno
import gc
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from yogacache.errors import CacheReplacedError
from yogacache.format.manifest import Manifest
from yogacache.read.reader import CacheReader
from yogacache.store.local import CacheStore
from yogacache.torch import CacheDataset

REPO = Path(__file__).resolve().parent.parent
N = 40  # records per build; a rebuild keeps the count, so only the values tell the builds apart
MANY_PARTS = 650


def records(start: int) -> list[dict[str, Any]]:
    return [{"i": np.int64(start + i), "x": np.full(3, start + i, np.float32)} for i in range(N)]


def make_store(root: Path, **kwargs: Any) -> CacheStore:
    return CacheStore(root, show_progress=False, **kwargs)


def ids(reader: CacheReader) -> list[int]:
    return [int(e["i"]) for e in reader.read_elements(np.arange(len(reader)))]


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True, timeout=120
    )


READ_PICKLED = """
    import pickle, sys
    from yogacache.errors import YogaCacheError
    with open(sys.argv[1], "rb") as handle:
        reader = pickle.load(handle)
    try:
        print([int(e["i"]) for e in reader.read_elements(range(len(reader)))])
    except YogaCacheError as error:
        print(type(error).__name__, error)
"""


@pytest.fixture
def store(tmp_path: Path) -> CacheStore:
    store = make_store(tmp_path / "caches", part_size_bytes=300)  # a few parts
    store.build("data", "v1", records(0))
    return store


def pickled(reader: CacheReader, tmp_path: Path) -> Path:
    path = tmp_path / "reader.pickle"
    path.write_bytes(pickle.dumps(reader))
    return path


# -- the build a reader was opened on, in every process ------------------------------------------


@pytest.mark.parametrize("context", ["spawn", "forkserver", "fork"])
def test_dataloader_workers_read_the_build_the_reader_was_opened_on(store: CacheStore, context: str) -> None:
    reader = store.open("data", "v1")
    assert len(reader.manifest.parts) > 1
    store.build("data", "v1", records(1000))  # same record count, other values
    loader = DataLoader(CacheDataset(reader), batch_size=8, num_workers=2, multiprocessing_context=context)
    seen = sorted(int(i) for batch in loader for i in batch["i"])
    assert seen == list(range(N))
    assert ids(reader) == list(range(N))  # and the parent reads it too
    assert ids(store.open("data", "v1")) == list(range(1000, 1000 + N))


def test_pickled_reader_reads_its_build_while_the_opening_process_holds_it(store: CacheStore, tmp_path: Path) -> None:
    reader = store.open("data", "v1")
    path = pickled(reader, tmp_path)
    store.build("data", "v1", records(1000))
    out = run_python(READ_PICKLED, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(list(range(N)))
    # In this process, too, an unpickled copy reads what the original was opened on.
    assert ids(pickle.loads(path.read_bytes())) == list(range(N))


def test_pickled_reader_of_a_rebuilt_cache_fails_clearly_once_its_build_is_gone(
    store: CacheStore, tmp_path: Path
) -> None:
    reader = store.open("data", "v1")
    old = reader.manifest.build_id
    path = pickled(reader, tmp_path)
    reader.close()  # nothing holds build A any more
    new = store.build("data", "v1", records(1000)).build_id
    out = run_python(READ_PICKLED, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("CacheReplacedError"), out.stdout
    assert f"was rebuilt since this reader was opened (build {old}, now {new}); reopen it" in out.stdout
    copy = pickle.loads(path.read_bytes())
    with pytest.raises(CacheReplacedError, match=f"build {old}, now {new}"):
        copy.read_elements([0])


def test_pickled_reader_of_a_removed_cache_fails_clearly(store: CacheStore, tmp_path: Path) -> None:
    reader = store.open("data", "v1")
    path = pickled(reader, tmp_path)
    reader.close()
    store.remove("data", "v1")
    out = run_python(READ_PICKLED, str(path))
    assert out.stdout.startswith("CacheReplacedError") and "was removed since this reader was opened" in out.stdout


def replace_with_copy(directory: Path, tamper: bool = False) -> None:
    """Replaces a cache with a copy of itself (new files, same build), as a re-sync would."""
    copy = directory.parent / f".{directory.name}.copy"
    shutil.copytree(directory, copy)
    if tamper:
        part = copy / Manifest.load(copy).parts[0].name
        data = bytearray(part.read_bytes())
        data[-1] ^= 0xFF
        part.write_bytes(bytes(data))
    trash = directory.parent / f".{directory.name}.old"
    os.rename(directory, trash)
    os.rename(copy, directory)
    shutil.rmtree(trash)


def test_pickled_reader_reads_a_verified_copy_of_the_same_build(store: CacheStore, tmp_path: Path) -> None:
    reader = store.open("data", "v1")
    path = pickled(reader, tmp_path)
    reader.close()
    replace_with_copy(Path(store.location("data", "v1")))
    out = run_python(READ_PICKLED, str(path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(list(range(N)))


def test_pickled_reader_refuses_an_altered_copy_of_the_same_build(store: CacheStore, tmp_path: Path) -> None:
    reader = store.open("data", "v1")
    path = pickled(reader, tmp_path)
    reader.close()
    replace_with_copy(Path(store.location("data", "v1")), tamper=True)
    out = run_python(READ_PICKLED, str(path))
    assert out.stdout.startswith("CorruptCacheError") and "does not match its manifest hash" in out.stdout


# -- descriptors: one per part, all released by close() ------------------------------------------


def test_a_reader_holds_one_descriptor_per_part_and_close_releases_them(store: CacheStore) -> None:
    gc.collect()
    before = open_descriptors()
    reader = store.open("data", "v1")
    parts = len(reader.manifest.parts)
    assert open_descriptors() == before + parts
    second = store.open("data", "v1")  # readers of one part share its environment
    assert open_descriptors() == before + parts
    reader.close()
    assert open_descriptors() == before + parts
    assert ids(second) == list(range(N))
    second.close()
    second.close()  # idempotent
    assert open_descriptors() == before
    with pytest.raises(ValueError, match="reader of the cache at .* is closed"):
        reader.read_elements([0])
    with pytest.raises(ValueError, match="is closed"):
        pickle.loads(pickle.dumps(reader))[0]


def test_a_reader_as_a_context_manager_releases_an_old_build(store: CacheStore) -> None:
    gc.collect()
    before = open_descriptors()
    with store.open("data", "v1") as reader:
        store.build("data", "v1", records(1000))
        assert ids(reader) == list(range(N))
    assert reader.closed
    assert open_descriptors() == before
    held = [os.path.realpath(link) for link in Path("/proc/self/fd").iterdir()]
    assert [path for path in held if path.startswith(str(store.root))] == []


# -- many parts under a descriptor limit ---------------------------------------------------------


@pytest.fixture(scope="module")
def many_parts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("many")
    store = make_store(root, part_size_bytes=1)  # one record per part
    manifest = store.build("many", "v1", [np.int64(i) for i in range(MANY_PARTS)])
    assert len(manifest.parts) == MANY_PARTS
    return Path(store.location("many", "v1"))


UNDER_LIMIT = """
    import os, pickle, resource, sys
    import numpy as np
    from yogacache.read.reader import CacheReader
    soft, hard = int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        reader = CacheReader(sys.argv[1])
    except OSError as error:
        print("OSError", error.errno, error.strerror)
        raise SystemExit(0)
    values = reader.read_columns(np.arange(len(reader)))[0].tolist()
    assert values == list(range(len(reader))), values[:10]
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.read_columns([5, 649])[0].tolist() == [5, 649]
    pid = os.fork()
    if pid == 0:  # a forked child reopens every part from what it inherited
        ok = reader.read_columns(np.arange(len(reader)))[0].tolist() == values
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    print("ok", len(reader.manifest.parts), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def test_many_parts_open_within_a_1024_descriptor_limit(many_parts: Path) -> None:
    out = run_python(UNDER_LIMIT, str(many_parts), "1024", "1024")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(MANY_PARTS), "1024"]


def test_the_soft_limit_is_raised_up_to_the_hard_limit(many_parts: Path) -> None:
    out = run_python(UNDER_LIMIT, str(many_parts), "600", "1024")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", str(MANY_PARTS), "1024"]


def test_too_few_descriptors_say_so_instead_of_corrupt(many_parts: Path) -> None:
    out = run_python(UNDER_LIMIT, str(many_parts), "300", "300")
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"OSError {errno.EMFILE} too many open files ({MANY_PARTS} parts, limit 300): "
                                 "raise ulimit -n"), out.stdout
    assert "Corrupt" not in out.stdout + out.stderr



def test_a_cache_reopens_at_once_after_a_reader_closes(tmp_path: Path) -> None:
    """Closing a reader hands its part to the registry, which closes the LMDB environment under
    its lock: a reader opened right after (here while the closed one's read transaction may
    still be held by its thread) never meets py-lmdb's "already open in this process"."""
    store = make_store(tmp_path)
    store.build("wide", "v1", [(np.int64(i), np.full(256, i, np.int64)) for i in range(20_000)])
    for round_ in range(300):
        reader = store.open("wide", "v1")
        ids_, rows = reader.read_columns(np.arange(round_, round_ + 50))
        np.testing.assert_array_equal(ids_, np.arange(round_, round_ + 50))
        np.testing.assert_array_equal(rows[:, 0], ids_)
        reader.close()
        del reader


def test_readers_closed_on_other_threads_never_block_a_new_open(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    store.build("ds", "v1", records(0))
    failures: list[BaseException] = []

    def churn() -> None:
        try:
            for _ in range(150):
                with store.open("ds", "v1") as reader:
                    assert ids(reader) == list(range(N))
        except BaseException as error:  # reported by the main thread
            failures.append(error)

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with store.open("ds", "v1") as reader:
        assert ids(reader) == list(range(N))
