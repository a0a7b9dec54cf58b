"""No silent stall: a node's byte budget never deadlocks its readers (issue 33, item 4).

Hold-and-wait is impossible by construction: a streamed reader holds the part it reads and,
between reads, at most the one it read last; a fetch that waits for room first makes every
reader of its process give up what it holds between reads; a reader closed or collected releases
its parts; the node's budget is the smallest a live reader names; and a set of readers whose
minimum (``budget.node_minimum``) the budget cannot hold is refused up front with a ConfigError
naming the numbers and the readers. Each test waits for room at most a few seconds
(``ROOM_WAIT_SECONDS``, a module setting read at every wait): a stall fails it fast with
NoSpaceError instead of hanging. Every record read is checked against an oracle: the order the
read schedule computes (pure, no I/O) applied to the records' known values.

Caches are published to a directory bucket (``FileObjectStore``): parts of 16 records of 1 KiB.
"""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import pytest

from tests.cloud_helpers import python_env, start_python
from tests.streaming_helpers import UsageSampler
from yogacache.backends.files import FileObjectStore
from yogacache.errors import ConfigError, NoSpaceError
from yogacache.mixture import Component, Mixture
from yogacache.read.epochs import EpochReader
from yogacache.read.options import ReadOptions
from yogacache.store import budget, eviction, streaming
from yogacache.store.remote import RemoteCacheStore

PART_BYTES = 64 << 10  # 16 records of 1 KiB a part (LMDB files of 48 KiB)
VERSION = "v1"
# (dataset id, records, first value, weight): values of component k never meet another's
COMPONENTS = (("dl-a", 192, 0, 5), ("dl-b", 120, 10_000, 3), ("dl-c", 72, 20_000, 2))
# Single caches the rank processes read: 7 parts (half the bytes: 3.5 parts) and 48 parts.
RANKED = (("dl-r", 112), ("dl-e", 768))
WAIT = 5.0  # seconds a fetch waits for room before NoSpaceError: a stall fails fast


def data(records: int, first: int = 0) -> list[tuple[np.ndarray, int]]:
    """Record i: (int32[256] filled with first + i, first + i)."""
    return [(np.full(256, first + i, np.int32), first + i) for i in range(records)]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three caches, published once to a directory bucket."""
    root = tmp_path_factory.mktemp("deadlock")
    builder = RemoteCacheStore(
        FileObjectStore(root / "bucket"), root / "builder", part_size_bytes=PART_BYTES, show_progress=False
    )
    for name, n, first, _ in COMPONENTS:
        builder.get_or_build(name, VERSION, lambda n=n, first=first: data(n, first))
    for name, n in RANKED:
        builder.get_or_build(name, VERSION, lambda n=n: data(n))
    return root / "bucket"


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streaming, "ROOM_WAIT_SECONDS", WAIT)


def node_store(bucket: Path, node: Path, limit: Optional[int]) -> RemoteCacheStore:
    return RemoteCacheStore(FileObjectStore(bucket), node, show_progress=False, streaming=True, local_cache_limit=limit)


def largest_part(store: RemoteCacheStore, name: str) -> int:
    return max(part.size_bytes for part in store.manifest(name, VERSION).parts)


def oracle(reader: Any, options: ReadOptions, epoch: int, position: int = 0) -> list[int]:
    """The values ``options`` read of ``epoch`` from ``position``: the schedule's record indices
    mapped to the records' values (a mixture's index space: component by component)."""
    return [COMPONENTS[k][2] + i for k, i in mixed_oracle(reader, options, epoch, position)]


def mixed_oracle(reader: Any, options: ReadOptions, epoch: int, position: int = 0) -> list[tuple[int, int]]:
    """(component, record index in it) of each record ``options`` read of ``epoch`` from ``position``."""
    plan = EpochReader(reader, options).schedule.plan(epoch, position)
    indices = plan.indices(0, len(plan)).tolist()
    offsets = getattr(reader, "offsets", None)
    if offsets is None:
        return [(0, int(i)) for i in indices]
    owners = np.searchsorted(offsets, indices, side="right") - 1
    return [(int(k), int(i - offsets[k])) for k, i in zip(owners.tolist(), indices)]


def labels(stream: Any) -> list[int]:
    out = []
    for array, label in stream:
        assert (np.asarray(array) == label).all(), f"record {label} holds other values"
        out.append(int(label))
    return out


def Peak(node: Path, names: Sequence[str]) -> UsageSampler:
    """The most bytes of streamed parts the node held (every named cache's together)."""
    return UsageSampler(node, [node / "yogadl_local_cache" / ".parts" / name / VERSION for name in names], 0.005)


# -- one process: a mixture's components -----------------------------------------------------------


def test_three_streamed_components_under_a_budget_of_three_parts_read_every_epoch_exactly(
    bucket: Path, tmp_path: Path
) -> None:
    """The budget holds each component's minimum (two parts) but not a part of each plus the next
    one: the reader that needs the next part of one component gives up the others' (it held one
    of each and waited for room only it could free, 300 s, then failed)."""
    store = node_store(bucket, tmp_path / "node", None)
    limit = 3 * max(largest_part(store, name) for name, *_ in COMPONENTS)
    store = node_store(bucket, tmp_path / "node", limit)
    mixture = Mixture([Component(store.open(name, VERSION), weight=w) for name, _, _, w in COMPONENTS])
    options = ReadOptions.from_stream_args(shuffle=True, shuffle_seed=13, shuffle_mode="parts", parts_window=1)
    try:
        stream = mixture.stream(shuffle=True, shuffle_seed=13, shuffle_mode="parts", parts_window=1)
        with Peak(tmp_path / "node", [c[0] for c in COMPONENTS]) as peak:
            for epoch in range(2):
                assert labels(stream) == oracle(mixture.reader, options, epoch), f"epoch {epoch}"
        assert 0 < peak.peak <= limit, (peak.peak, limit)
    finally:
        mixture.close()


def test_the_mixtures_docs_streaming_example_reads_both_epochs(tmp_path: Path) -> None:
    """docs/mixtures.md's own example (part_bytes 1Mi, local_cache_limit 4Mi, 70/20/10 of 9,000
    records of 1 KiB) stopped after about 1,000 records."""
    objects = FileObjectStore(tmp_path / "bucket")
    config = dict(show_progress=False, part_size_bytes=1 << 20)
    builder = RemoteCacheStore(objects, tmp_path / "builder", **config)  # type: ignore[arg-type]
    sizes = (("web", 7000), ("code", 1500), ("books", 500))
    for k, (name, n) in enumerate(sizes):
        builder.get_or_build(name, VERSION, lambda n=n, k=k: [(np.full(256, i, np.int32), k) for i in range(n)])
    node = RemoteCacheStore(objects, tmp_path / "node", streaming=True, local_cache_limit=4 << 20, **config)
    mixture = Mixture([node.open(name, VERSION) for name, _ in sizes], weights=[0.7, 0.2, 0.1])
    try:
        args = dict(shuffle=True, shuffle_seed=7, shuffle_mode="parts")
        stream = mixture.stream(**args)
        for epoch in range(2):
            got = [(int(k), int(array[0])) for array, k in stream]
            assert len(got) == 9000
            assert [sum(1 for k, _ in got if k == c) for c in range(3)] == [6300, 1800, 900]
            assert got == mixed_oracle(mixture.reader, ReadOptions.from_stream_args(**args), epoch), epoch
    finally:
        mixture.close()


def test_components_opened_with_different_budgets_keep_the_smallest(bucket: Path, tmp_path: Path) -> None:
    """Two stores on one node root, one with a budget of the whole caches and one of three
    parts: the node holds the smaller (it held the larger)."""
    node = tmp_path / "node"
    probe = node_store(bucket, node, None)
    small = 3 * max(largest_part(probe, name) for name, *_ in COMPONENTS[:2])
    large = 100 * small
    a = node_store(bucket, node, large).open("dl-a", VERSION)
    b = node_store(bucket, node, small).open("dl-b", VERSION)
    mixture = Mixture([Component(a, weight=5), Component(b, weight=3)])
    try:
        assert mixture.reader.streaming_budget == small
        args = dict(shuffle=True, shuffle_seed=3, shuffle_mode="parts", parts_window=1)
        stream = mixture.stream(**args)
        with Peak(node, ["dl-a", "dl-b"]) as peak:
            got = labels(stream)
        assert got == oracle(mixture.reader, ReadOptions.from_stream_args(**args), 0)
        assert 0 < peak.peak <= small, f"the node held {peak.peak} bytes of parts, the smaller budget is {small}"
    finally:
        mixture.close()


# -- one process, many threads: Grain ------------------------------------------------------------


@pytest.mark.parametrize("sampler_kind", ["parts", "index"])
def test_grain_reading_with_many_threads_under_a_budget_smaller_than_the_cache_finishes(
    bucket: Path, tmp_path: Path, sampler_kind: str
) -> None:
    """12 parts, a budget of 5: Grain's 16 read threads each held a part while waiting for room
    (with IndexSampler it read nothing; with CacheSampler("parts") it stopped half way)."""
    grain = pytest.importorskip("grain")
    from yogacache.grain import CacheDataSource, CacheSampler

    store = node_store(bucket, tmp_path / "node", None)
    limit = 5 * largest_part(store, "dl-a")
    store = node_store(bucket, tmp_path / "node", limit)
    source = CacheDataSource(store.open("dl-a", VERSION))
    try:
        assert len(source.reader.manifest.parts) >= 8  # a budget of 5 parts: smaller than the cache
        if sampler_kind == "parts":
            sampler: Any = CacheSampler(
                source, shuffle=True, shuffle_seed=5, shuffle_mode="parts", shard_rank=0, num_shards=1
            )
            expected = [int(k) for k in sampler.record_keys(range(len(sampler)))]
        else:
            sampler = grain.samplers.IndexSampler(192, grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=5)
            expected = [sampler[k].record_key for k in range(192)]
        loader = grain.DataLoader(
            data_source=source,
            sampler=sampler,
            worker_count=0,
            read_options=grain.ReadOptions(num_threads=16, prefetch_buffer_size=64),
        )
        got = []
        for array, label in loader:
            assert (np.asarray(array) == label).all()
            got.append(int(label))
        assert got == expected
        # Between reads the reader keeps the part it read last, no more (one process held 6 of 5).
        assert len(budget.live_leases(store.local.root).held) <= 1
    finally:
        source.reader.close()


GRAIN_WORKERS = r"""
import json, sys
import grain
from yogacache.backends.files import FileObjectStore
from yogacache.grain import CacheDataSource
from yogacache.store import streaming
from yogacache.store.remote import RemoteCacheStore

streaming.ROOM_WAIT_SECONDS = float(sys.argv[4])


def main():
    store = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], show_progress=False, streaming=True,
                             local_cache_limit=int(sys.argv[3]))
    source = CacheDataSource(store.open("dl-a", "v1"))
    sampler = grain.samplers.IndexSampler(192, grain.sharding.NoSharding(), shuffle=True, num_epochs=1, seed=5)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=2)
    got = []
    for array, label in loader:
        assert (array == label).all()
        got.append(int(label))
    print(json.dumps({"got": got, "expected": [sampler[k].record_key for k in range(192)]}), flush=True)


if __name__ == "__main__":
    from absl import flags

    flags.FLAGS(sys.argv[:1], known_only=True)  # Grain's multiprocess loader reads its flags
    main()
"""


def test_grain_workers_reading_with_their_default_threads_under_a_budget_smaller_than_the_cache_finish(
    bucket: Path, tmp_path: Path
) -> None:
    """Two Grain worker processes, each reading with Grain's default 16 threads, 12 parts and a budget
    of 5 (it read nothing). Run in a process of its own, waited for a bounded time: a stall fails."""
    pytest.importorskip("grain")
    limit = 5 * largest_part(node_store(bucket, tmp_path / "probe", None), "dl-a")
    script = tmp_path / "grain_workers.py"
    script.write_text(GRAIN_WORKERS)
    process = subprocess.Popen(
        [sys.executable, str(script), str(bucket), str(tmp_path / "node"), str(limit), str(WAIT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    try:
        out, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the Grain loader with 2 workers did not finish in 120 s (stalled): {err[-2000:]}")
    assert process.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["got"] == result["expected"]


# -- a reader closed or collected -----------------------------------------------------------------


def test_a_streamed_reader_collected_without_closing_releases_its_parts(bucket: Path, tmp_path: Path) -> None:
    store = node_store(bucket, tmp_path / "node", 4 * largest_part(node_store(bucket, tmp_path, None), "dl-a"))
    root = store.local.root
    reader = store.open("dl-a", VERSION)
    assert int(reader[100][1]) == 100
    assert budget.live_leases(root).held, "the reader holds the part it read"
    del reader
    gc.collect()
    live = budget.live_leases(root)
    assert live.held == frozenset(), "a collected reader still pins its parts"
    assert live.readers == (), "a collected reader is still named in the lease"
    closed = store.open("dl-a", VERSION)
    assert int(closed[30][1]) == 30
    closed.close()
    live = budget.live_leases(root)
    assert live.held == frozenset() and live.readers == ()


# -- several processes ------------------------------------------------------------------------------

HOLDER = r"""
import sys, time
from yogacache.backends.files import FileObjectStore
from yogacache.store.remote import RemoteCacheStore
store = RemoteCacheStore(FileObjectStore(sys.argv[1]), sys.argv[2], show_progress=False, streaming=True,
                         local_cache_limit=int(sys.argv[3]))
reader = store.open("dl-a", "v1")
print(int(reader[0][1]), flush=True)
time.sleep(600)
"""


def test_a_node_whose_readers_need_more_than_its_budget_is_refused_up_front(bucket: Path, tmp_path: Path) -> None:
    """Two other processes hold a part each between reads; a third reader, whose fetch needs room
    for a part of its own, finds the budget (which holds one reader's two parts) too small: refused
    when it opens, naming the numbers and the readers (it opened and waited for room for ever)."""
    node = tmp_path / "node"
    part = largest_part(node_store(bucket, tmp_path, None), "dl-a")
    limit = 2 * part + part // 2  # one reader's minimum, not three readers' parts
    holders = [start_python(HOLDER, str(bucket), str(node), str(limit), env=python_env()) for _ in range(2)]
    try:
        for holder in holders:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "0"
        with pytest.raises(ConfigError) as raised:
            node_store(bucket, node, limit).open("dl-a", VERSION)
        message = str(raised.value)
        assert f"{limit} bytes" in message and f"{3 * part} bytes" in message, message
        assert "3 streamed readers of 3 process(es)" in message, message
        for holder in holders:
            assert f"pid {holder.pid}: dl-a:v1" in message, message
        assert "raise local_cache_limit" in message.lower()
        # The refused reader never joined the node's readers.
        live = budget.live_leases(node / "yogadl_local_cache")
        assert sorted(r.pid for r in live.readers) == sorted(holder.pid for holder in holders)
    finally:
        for holder in holders:
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)


RANK = r"""
import json, random, sys, time
from pathlib import Path
from yogacache.backends.files import FileObjectStore
from yogacache.read.options import ReadOptions
from yogacache.read.pipeline import read_stream
from yogacache.store import streaming
from yogacache.store.remote import RemoteCacheStore

streaming.ROOM_WAIT_SECONDS = float(sys.argv[8])   # a stall fails fast
bucket, node, limit, rank, shards, epochs, resume = sys.argv[1:8]
stop_after, name = int(sys.argv[9]), sys.argv[10]
store = RemoteCacheStore(FileObjectStore(bucket), node, show_progress=False, streaming=True,
                         local_cache_limit=int(limit))
reader = store.open(name, "v1")
options = ReadOptions.from_stream_args(shuffle=True, shuffle_seed=9, shuffle_mode="parts", shard_rank=int(rank),
                                       num_shards=int(shards), resume_state=json.loads(resume) if resume else None)
stream = read_stream(reader, options)
pause = random.Random(int(rank))
# All ranks start reading together (a barrier of files): processes that start one after the other
# would each read alone.
barrier = Path(sys.argv[11])
(barrier / f"ready-{rank}").touch()
deadline = time.monotonic() + 120
while len(list(barrier.iterdir())) < int(shards) and time.monotonic() < deadline:
    time.sleep(0.01)
out, read = [], 0
for _ in range(int(epochs)):
    got = []
    for array, label in stream:
        assert (array == label).all()
        got.append(int(label))
        read += 1
        if pause.random() < 0.1:
            time.sleep(pause.random() * 0.03)
        if stop_after and read >= stop_after:
            break
    out.append(got)
    if stop_after and read >= stop_after:
        break
print(json.dumps({"epochs": out, "state": stream.state_dict(read) if stop_after else None}), flush=True)
"""


def run_ranks(
    bucket: Path,
    node: Path,
    name: str,
    limit: int,
    shards: int,
    *,
    epochs: int,
    resume: Any = None,
    stop_after: int = 0,
) -> list[dict[str, Any]]:
    barrier = node.parent / f"barrier-{node.name}-{shards}"
    barrier.mkdir(parents=True)
    processes = [
        start_python(
            RANK,
            str(bucket),
            str(node),
            str(limit),
            str(rank),
            str(shards),
            str(epochs),
            json.dumps(resume) if resume else "",
            str(WAIT * 4),
            str(stop_after),
            name,
            str(barrier),
            env=python_env(),
        )
        for rank in range(shards)
    ]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def oracle_reader(bucket: Path, node: Path, name: str, limit: int) -> Any:
    """A streamed reader under ``limit`` on a node of its own that reads nothing: its schedule
    (fitted to the budget as the ranks' are) is the oracle."""
    return node_store(bucket, node, limit).open(name, VERSION)


def rank_options(rank: int, shards: int, resume: Any = None) -> ReadOptions:
    return ReadOptions.from_stream_args(
        shuffle=True, shuffle_seed=9, shuffle_mode="parts", shard_rank=rank, num_shards=shards, resume_state=resume
    )


def test_two_ranks_resumed_by_three_on_one_node_under_half_the_bytes_read_the_rest_exactly(
    bucket: Path, tmp_path: Path
) -> None:
    """Rank processes of one node share half the cache's bytes; one moves into the next epoch
    while the others still read this one (they stalled in about half the attempts, each waiting
    for room the others held)."""
    manifest = node_store(bucket, tmp_path / "probe", None).manifest("dl-r", VERSION)
    limit = manifest.total_size_bytes // 2
    part = max(p.size_bytes for p in manifest.parts)
    assert len(manifest.parts) == 7 and 3 * part < limit < 4 * part  # three ranks' parts and one more do not fit
    synced = oracle_reader(bucket, tmp_path / "oracle", "dl-r", limit)
    try:
        for attempt in range(1):
            node = tmp_path / f"node-{attempt}"
            head = run_ranks(bucket, node, "dl-r", limit, 2, epochs=1, stop_after=30)
            state = head[0]["state"]
            assert state == head[1]["state"]
            for rank in range(2):
                assert head[rank]["epochs"][0] == oracle(synced, rank_options(rank, 2), 0)[:30]
            rest = run_ranks(bucket, node, "dl-r", limit, 3, epochs=4, resume=state)
            epochs = EpochReader(synced, rank_options(0, 3, state))
            epoch, position = epochs.start
            for rank in range(3):
                options = rank_options(rank, 3, state)
                assert rest[rank]["epochs"][0] == oracle(synced, options, epoch, position), (attempt, rank)
                for more in range(1, 4):
                    assert rest[rank]["epochs"][more] == oracle(synced, options, epoch + more), (attempt, rank, more)
            first = sorted(x for r in head for x in r["epochs"][0]) + sorted(x for r in rest for x in r["epochs"][0])
            assert sorted(first) == list(range(112)), "epoch 0 across the resume: not every record once"
    finally:
        synced.close()


def test_eight_rank_processes_under_a_budget_barely_above_their_minimum_finish_every_epoch_exactly(
    bucket: Path, tmp_path: Path
) -> None:
    """8 processes on one node, random pauses, a budget half a part above what they need together
    (``budget.node_minimum``: seven parts kept by the others between reads, and the part the
    waiting one fetches), in which each holding the part it read last while it waits for the next
    one stalled them all."""
    part = largest_part(node_store(bucket, tmp_path / "probe", None), "dl-e")
    limit = 8 * part + part // 2
    synced = oracle_reader(bucket, tmp_path / "oracle", "dl-e", limit)
    try:
        results = run_ranks(bucket, tmp_path / "node", "dl-e", limit, 8, epochs=2)
        readers = [budget.NodeReader(pid, "dl-e:v1", part, limit, True) for pid in range(8)]
        assert budget.node_minimum(readers) == 8 * part  # the minimum the budget is barely above
        for rank, result in enumerate(results):
            for epoch in range(2):
                assert result["epochs"][epoch] == oracle(synced, rank_options(rank, 8), epoch), (rank, epoch)
        for epoch in range(2):
            assert sorted(x for r in results for x in r["epochs"][epoch]) == list(range(768))
    finally:
        synced.close()


# -- whole copies ------------------------------------------------------------------------------------


def test_pulling_a_cache_larger_than_the_budget_says_at_once_that_it_does_not_fit(
    bucket: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(eviction, "COPY_ROOM_WAIT_SECONDS", WAIT)
    probe = node_store(bucket, tmp_path / "probe", None)
    size = probe.manifest("dl-a", VERSION).total_size_bytes
    limit = size // 2
    store = RemoteCacheStore(FileObjectStore(bucket), tmp_path / "node", show_progress=False, local_cache_limit=limit)
    with pytest.raises(NoSpaceError) as raised:
        store.pull("dl-a", VERSION)
    message = str(raised.value)
    assert "larger than local_cache_limit" in message and f"{size} bytes" in message, message
    assert "streamed" in message, message
    assert "in use by live processes" not in message, message
    reader = store.open("dl-a", VERSION)  # a streamed read of it works under that budget
    try:
        assert reader.streamed and int(reader[191][1]) == 191
    finally:
        reader.close()
