"""The node-local byte budget: sizes, settings, the eviction order, leases of live processes
(gone with a SIGKILLed process), and whole local copies kept under the budget without ever
evicting the only copy or one in use."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import python_env, start_python
from yogacache.backends.files import FileObjectStore
from yogacache.config import parse_config
from yogacache.errors import ConfigError, NoSpaceError
from yogacache.sizes import format_size, parse_size
from yogacache.store import budget, eviction
from yogacache.store.remote import RemoteCacheStore


# -- sizes and settings ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [
        ("200Gi", 200 * 2**30),
        ("500G", 500 * 10**9),
        ("1.5T", 1_500_000_000_000),
        ("512Mi", 512 * 2**20),
        ("64KiB", 64 * 1024),
        ("3k", 3000),
        ("1Ti", 2**40),
        ("12345", 12345),
        (4096, 4096),
    ],
)
def test_sizes_take_decimal_and_binary_units(text: Any, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["12 parsecs", "-5G", "G", "", "1.2.3M", True, 2.5, -1])
def test_bad_sizes_are_refused_naming_the_units(bad: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_size(bad, "data_layer.local_cache_limit")
    assert "data_layer.local_cache_limit" in str(raised.value)


def test_format_size() -> None:
    assert format_size(3 * 2**30 // 2) == "1.5 GiB"
    assert format_size(100) == "100 B"


def test_config_takes_streaming_and_local_cache_limit() -> None:
    raw = {"type": "s3", "bucket": "test-bucket", "bucket_directory_path": "c"}
    default = parse_config(raw)
    assert default.streaming is False and default.local_cache_limit is None  # type: ignore[union-attr]
    parsed = parse_config({**raw, "streaming": True, "local_cache_limit": "200Gi"})
    assert parsed.streaming is True and parsed.local_cache_limit == 200 * 2**30  # type: ignore[union-attr]
    gcs = parse_config({"type": "gcs", "bucket": "b", "bucket_directory_path": "c", "local_cache_limit": "1T"})
    assert gcs.local_cache_limit == 10**12  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="data_layer.streaming must be true or false"):
        parse_config({**raw, "streaming": "yes"})
    with pytest.raises(ConfigError, match="Ki Mi Gi Ti"):
        parse_config({**raw, "local_cache_limit": "lots"})
    with pytest.raises(ConfigError, match="more than 0 bytes"):
        parse_config({**raw, "local_cache_limit": 0})
    # A number without a unit is bytes: one too small for any cache is refused when the config is
    # read (not first when a cache is opened), with the unit it probably lacks.
    with pytest.raises(ConfigError, match=r'local_cache_limit .100. \(100 bytes\) cannot hold .* such as "100Gi"'):
        parse_config({**raw, "local_cache_limit": "100"})
    assert parse_config({**raw, "local_cache_limit": "24Ki"}).local_cache_limit == 24 * 1024  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="unknown data_layer keys"):
        parse_config({"type": "shared_fs", "host_storage_path": "/x", "local_cache_limit": "1G"})


# -- the eviction order ---------------------------------------------------------------------
def _item(name: str, size: int = 10, atime: float = 0.0, kind: str = "part") -> budget.LocalItem:
    return budget.LocalItem(name, Path("/nowhere") / name, size, atime, kind, "d", "v")


def test_eviction_takes_what_is_needed_furthest_in_the_future_first() -> None:
    items = [
        _item("soon"),
        _item("later"),
        _item("held"),
        _item("never-old", atime=1.0),
        _item("never-new", atime=2.0),
        _item("copy", kind="copy"),
    ]
    leases = budget.LiveLeases(frozenset({"held"}), {"soon": 1, "later": 7}, processes=2)
    chosen, usage = budget.choose_evictions(items, leases, need=10, limit=60)
    # 60 used + 10 needed > 60: one item must go; no reader needs "never-old" and it is older.
    assert [e.item.item for e in chosen] == ["never-old"]
    assert usage == 50
    chosen, usage = budget.choose_evictions(items, leases, need=0, limit=0)
    # Everything evictable, furthest first: never needed (LRU), then "later", then "soon";
    # never the held part, never a copy nobody vouched for.
    assert [e.item.item for e in chosen] == ["never-old", "never-new", "later", "soon"]
    assert usage == 20
    # Fetching ahead for position 5 evicts nothing needed sooner than that.
    chosen, _ = budget.choose_evictions(items, leases, need=0, limit=0, sooner_than=5)
    assert "soon" not in [e.item.item for e in chosen] and "later" in [e.item.item for e in chosen]
    assert leases.rank("absent") == math.inf


def test_a_fetch_ahead_leaves_what_a_reader_still_reads_this_epoch() -> None:
    """A fetch ahead takes room only from parts no reader reads again in its current epoch
    (a part it comes back to, or one it reaches later): fetching early must not cost a fetch
    again. A fetch the reader waits for takes the part needed furthest away, whatever epoch."""
    items = [_item("window"), _item("later-this-epoch"), _item("next-epoch"), _item("done")]
    leases = budget.LiveLeases(
        frozenset(),
        {"window": 0, "later-this-epoch": 9, "next-epoch": 20},
        processes=1,
        needed_now=frozenset({"window", "later-this-epoch"}),
    )
    chosen, _ = budget.choose_evictions(items, leases, need=20, limit=40, sooner_than=3, ahead=True)
    assert [e.item.item for e in chosen] == ["done", "next-epoch"]
    chosen, _ = budget.choose_evictions(items, leases, need=30, limit=40, sooner_than=3, ahead=True)
    assert "later-this-epoch" not in [e.item.item for e in chosen]  # no room: the fetch waits
    chosen, _ = budget.choose_evictions(items, leases, need=30, limit=40)
    assert [e.item.item for e in chosen] == ["done", "next-epoch", "later-this-epoch"]


def test_leases_say_which_parts_the_current_epoch_still_reads(tmp_path: Path) -> None:
    lease = budget.ProcessLease(tmp_path)
    lease.announce("r1", ["a", "b", "c", "d"], now=2)
    lease.announce("r2", ["d", "e"])  # no count: all of it is current
    live = budget.live_leases(tmp_path)
    assert live.needed_now == {"a", "b", "d", "e"}
    assert live.rank("d") == 0 and live.rank("c") == 2
    data = json.loads(lease.json_path.read_text())
    data.pop("now")  # a lease written by an older yogacache: its whole order counts as current
    lease.json_path.write_text(json.dumps(data))
    assert budget.live_leases(tmp_path).needed_now == {"a", "b", "c", "d", "e"}


# -- leases -----------------------------------------------------------------------------------
LEASE_HOLDER = r"""
import sys, time
from pathlib import Path
from yogacache.store.budget import process_lease
lease = process_lease(Path(sys.argv[1]))
lease.hold("ds/v1")
lease.announce("r", [".parts/ds/v1/b-part-00002.mdb", ".parts/ds/v1/b-part-00001.mdb"])
print("ready", flush=True)
time.sleep(600)
"""


def test_a_lease_protects_while_its_process_lives_and_not_after_sigkill(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    process = start_python(LEASE_HOLDER, str(root), env=python_env())
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        live = budget.live_leases(root)
        assert live.held == {"ds/v1"} and live.processes == 1
        assert live.rank(".parts/ds/v1/b-part-00002.mdb") == 0 and live.rank(".parts/ds/v1/b-part-00001.mdb") == 1
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    live = budget.live_leases(root)
    assert live.held == frozenset() and live.processes == 0
    assert list((root / budget.LEASES_DIR).iterdir()) == []  # the dead process's lease files went


OPEN_COPY_UNLIMITED = r"""
import sys, time
from yogacache.backends.files import FileObjectStore
from yogacache.store.remote import RemoteCacheStore
reader = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], show_progress=False).open("a", "v1")
print(int(reader[0][1]), flush=True)
time.sleep(600)
"""


def test_a_copy_read_without_a_budget_is_leased_and_dead_leases_go_with_the_next_lease(tmp_path: Path) -> None:
    """A process with no budget and no streaming still takes a lease on the whole copy it reads:
    ``gc --limit`` (or a process with a budget sharing the root) may evict whole copies, and
    only the lease keeps the one it reads. Its files go when the next process takes a lease,
    without waiting for an eviction scan that a node with no budget never runs."""
    bucket, node_dir = tmp_path / "bucket", tmp_path / "node"
    RemoteCacheStore(FileObjectStore(bucket), tmp_path / "builder", show_progress=False).get_or_build(
        "a", "v1", lambda: _data(100, 0)
    )
    root = node_dir / "yogadl_local_cache"
    process = start_python(OPEN_COPY_UNLIMITED, str(bucket), str(node_dir), env=python_env())
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "0"
        assert budget.live_leases(root).held == {"a/v1"}
        store = RemoteCacheStore(FileObjectStore(bucket), node_dir, show_progress=False)
        result = eviction.collect(store, 1)
        assert result.evicted == [] and (root / "a" / "v1" / "manifest.json").is_file()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    leases = root / budget.LEASES_DIR
    assert len(list(leases.iterdir())) == 2  # the dead process's .lock and .json: nothing scanned yet
    mine = budget.ProcessLease(root)  # the next process to read there
    assert sorted(leases.iterdir()) == [mine.lock_path]
    # Now nothing holds "a": gc may take it (it is a copy of the published build).
    assert [e.item.item for e in eviction.collect(store, 1).evicted] == ["a/v1"]


# -- whole local copies under the budget --------------------------------------------------------
def _data(n: int, fill: int) -> list[tuple[np.ndarray, int]]:
    return [(np.full(1024, i + fill, np.int32), i + fill) for i in range(n)]


OPEN_COPY = r"""
import sys, time
from yogacache.backends.files import FileObjectStore
from yogacache.store.remote import RemoteCacheStore
limit = int(sys.argv[3])
node = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], local_cache_limit=limit, show_progress=False)
reader = node.open(sys.argv[4], "v1")
print(int(reader[0][1]), flush=True)
if sys.argv[5] == "hold":
    time.sleep(600)
"""


def test_whole_copies_stay_under_the_budget_never_evicting_the_only_copy_or_one_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket, node_dir = tmp_path / "bucket", tmp_path / "node"
    builder = RemoteCacheStore(FileObjectStore(bucket), tmp_path / "builder", show_progress=False)
    sizes = {name: builder.get_or_build(name, "v1", lambda: _data(100, 0)).manifest.total_size_bytes for name in "ab"}
    node = RemoteCacheStore(FileObjectStore(bucket), node_dir, show_progress=False)
    only = node.local.build("only", "v1", _data(100, 0))  # never published: the only copy
    limit = only.total_size_bytes + sizes["a"] + sizes["b"] // 2
    args = [str(bucket), str(node_dir), str(limit)]

    def open_elsewhere(name: str, mode: str) -> Any:
        process = start_python(OPEN_COPY, *args, name, mode, env=python_env())
        assert process.stdout is not None and process.stdout.readline().strip() == "0"
        return process

    open_elsewhere("a", "exit").wait(timeout=60)
    assert (node_dir / "yogadl_local_cache" / "a" / "v1").is_dir()
    # A process holds "a" open: "b" does not fit, and nothing may be evicted for it.
    monkeypatch.setattr(eviction, "COPY_ROOM_WAIT_SECONDS", 0.3)
    holder = open_elsewhere("a", "hold")
    try:
        limited = RemoteCacheStore(FileObjectStore(bucket), node_dir, local_cache_limit=limit, show_progress=False)
        with pytest.raises(NoSpaceError) as raised:
            limited.open("b", "v1")
        assert "in use by live processes or the only copy" in str(raised.value)
        assert (node_dir / "yogadl_local_cache" / "a" / "v1").is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    # Its reader is gone: "a" (published, this remote's copy) makes room; "only" stays.
    reader = limited.open("b", "v1")
    assert int(reader[5][1]) == 5
    root = node_dir / "yogadl_local_cache"
    assert not (root / "a" / "v1").exists()
    assert (root / "only" / "v1" / "manifest.json").is_file()
    assert json.loads((root / "only" / "v1" / "manifest.json").read_text())["build_id"] == only.build_id
    assert sum(item.size for item in budget.local_items(root)) <= limit


def test_a_download_finishing_between_the_scans_is_never_counted_as_free_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make_room scans the parts and the reservations of downloads under way; a download that
    renames its temporary file to the part between the two scans (it holds no budget lock) must
    still count, or a second download takes the same room and the node goes over its budget."""
    root = tmp_path / "cache"
    directory = root / budget.PARTS_DIR / "ds" / "v1"
    directory.mkdir(parents=True)
    lock = budget.fetch_lock(directory, "part-0.mdb")
    lock.acquire()  # the downloader is alive
    temp = budget.create_reservation(directory, "part-0.mdb", 600)
    temp.write_bytes(b"x" * 600)
    finished = []
    scans = {"in_flight_bytes": budget.in_flight_bytes, "local_items": budget.local_items}

    def scanning_then_finishing(name: str) -> Any:
        def scan(scan_root: Path) -> Any:
            found = scans[name](scan_root)
            if not finished:  # the download ends right after the first scan, whichever it is
                temp.rename(directory / "part-0.mdb")
                finished.append(name)
            return found

        return scan

    for name in scans:
        monkeypatch.setattr(budget, name, scanning_then_finishing(name))
    try:
        # 600 on disk + 600 more > 1000 (the finished part, unheld, may be evicted: 600 remain)
        assert budget.make_room(root, 600, 1000) is False
        assert finished
    finally:
        lock.release()


# -- the node's readers: its budget and its minimum -------------------------------------------------
def test_the_node_minimum_is_the_other_processes_parts_plus_the_waiters_largest() -> None:
    """Between reads each reader keeps one part; the process whose fetch waits gives up its own and
    needs room for the part it fetches: the most over the processes."""
    reader = budget.NodeReader
    eight = [reader(pid, "a:v1", 10, 100, True) for pid in range(8)]
    assert budget.node_minimum(eight) == 7 * 10 + 10
    mixture = [reader(pid, name, size, 100, True) for pid in (1, 2) for name, size in (("a:v1", 10), ("b:v1", 30))]
    assert budget.node_minimum(mixture) == 40 + 30  # the other rank's two parts, and its own largest
    assert budget.node_minimum([reader(1, "a:v1", 10, 100, True), reader(1, "b:v1", 30, 100, True)]) == 30
    opened_only = [reader(1, "a:v1", 10, 100, True), reader(2, "a:v1", 10, 100, False)]  # a loader's main
    assert budget.node_minimum(opened_only) == 10
    assert "pid 1: a:v1 (10 B)" in budget.describe_readers(opened_only)
    assert "pid 2" not in budget.describe_readers(opened_only)


def test_leases_name_their_readers_the_smallest_budget_and_the_fetches_waiting(tmp_path: Path) -> None:
    lease = budget.ProcessLease(tmp_path)
    lease.register("r1", "a:v1", 600, 5000, reads=True)
    lease.register("r2", "b:v1", 700, 3000, reads=False)
    lease.register("r3", "c:v1", 800, None, reads=False)
    live = budget.live_leases(tmp_path)
    assert sorted((r.cache, r.part, r.limit, r.reads) for r in live.readers) == [
        ("a:v1", 600, 5000, True),
        ("b:v1", 700, 3000, False),
        ("c:v1", 800, None, False),
    ]
    assert live.limit == 3000 and live.waiting == 0
    lease.set_waiting(+1)
    assert budget.live_leases(tmp_path).waiting == 1
    lease.set_waiting(-1)
    lease.forget("r2")
    assert budget.live_leases(tmp_path).limit == 5000
    data = json.loads(lease.json_path.read_text())
    data["readers"] = [{"cache": "x", "part": -5, "limit": 10}, "junk", {"cache": "y", "part": 1, "limit": "big"}]
    lease.json_path.write_text(json.dumps(data))
    assert budget.live_leases(tmp_path).readers == ()  # entries that are not well formed count for nothing


def test_room_is_made_under_the_smallest_budget_and_nothing_is_fetched_ahead_while_a_fetch_waits(
    tmp_path: Path,
) -> None:
    directory = tmp_path / budget.PARTS_DIR / "ds" / "v1"
    directory.mkdir(parents=True)
    (directory / "b-part-00000.mdb").write_bytes(b"x" * 600)
    lease = budget.process_lease(tmp_path)
    lease.hold(budget.part_item("ds", "v1", "b-part-00000.mdb"))
    assert budget.make_room(tmp_path, 300, 1000) is True
    lease.register("small", "ds:v1", 600, 800, reads=False)  # another reader's budget: 800
    try:
        assert budget.make_room(tmp_path, 300, 1000) is False
        assert budget.make_room(tmp_path, 200, 1000) is True
        lease.set_waiting(+1)
        assert budget.make_room(tmp_path, 100, 1000, ahead=True) is False  # a fetch waits: none ahead
        assert budget.make_room(tmp_path, 100, 1000) is True
    finally:
        lease.set_waiting(-1)
        lease.forget("small")
        lease.drop(budget.part_item("ds", "v1", "b-part-00000.mdb"))
