"""Streaming reads of published caches against the real S3 and GCS test servers: nodes are
subprocesses with their own local cache directories, reaching the server through a
byte-counting fault proxy each."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.cloud_helpers import Cloud, finish, unique
from tests.faultproxy import FaultProxy
from tests.streaming_helpers import (
    DS,
    RECORDS,
    VER,
    UsageSampler,
    bytes_on_disk,
    data,
    node_config,
    parts_dir,
    publish,
    start_reader,
)
from yogacache.format.manifest import Manifest
from yogacache.read.options import ReadOptions
from yogacache.read.pipeline import read_stream
from yogacache.read.shuffle import SHUFFLE_MODES
from yogacache.store import open_store
from yogacache.store.budget import fetch_lock_free


@pytest.fixture(params=["s3", "gcs", "azure"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    kind = request.param
    return Cloud(kind, request.getfixturevalue(f"{kind}_server"))


@pytest.fixture
def published(cloud: Cloud, tmp_path: Path) -> tuple[str, str, Manifest]:
    bucket, prefix = cloud.new_bucket(), unique("caches")
    return bucket, prefix, publish(cloud, bucket, prefix, tmp_path / "builder")


def _proxy(cloud: Cloud) -> FaultProxy:
    return FaultProxy(cloud.server_url)


@pytest.fixture
def proxies(cloud: Cloud) -> Iterator[list[FaultProxy]]:
    """One proxy per simulated node: the bytes each node fetched are counted apart."""
    made = [_proxy(cloud), _proxy(cloud)]
    try:
        yield made
    finally:
        for proxy in made:
            proxy.stop()


def _part_gets(proxy: FaultProxy) -> list[str]:
    return [entry.target for entry in proxy.requests("GET") if "-part-" in entry.target and entry.size]


# Every registered mode made for streaming takes part ("parts", where it exists), besides YogaDL's.
STREAMING_MODES = ["shard"] + [mode for mode in ("parts",) if mode in SHUFFLE_MODES]
RESUMABLE_MODES = ["global"] + [mode for mode in ("parts",) if mode in SHUFFLE_MODES]


@pytest.mark.slow
@pytest.mark.parametrize("mode", STREAMING_MODES)
def test_two_nodes_two_ranks_quarter_budget_two_epochs(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path, mode: str
) -> None:
    """Two nodes x two ranks, a budget of a quarter of the cache, two epochs: every record exactly
    once per epoch; each node's streamed bytes stay under its budget; the bytes each node
    fetched are counted through its own proxy."""
    bucket, prefix, manifest = published
    limit = manifest.total_size_bytes // 4
    nodes = [tmp_path / "node-0", tmp_path / "node-1"]
    processes, samplers = [], []
    for n, (node, proxy) in enumerate(zip(nodes, proxies)):
        config = node_config(cloud, bucket, prefix, node, proxy.url, streaming=True, local_cache_limit=limit)
        samplers.append(UsageSampler(node).__enter__())
        for local_rank in range(2):
            rank = 2 * n + local_rank
            processes.append(start_reader(cloud, config, proxy.url, rank=rank, shards=4, epochs=2, mode=mode))
    results = [finish(process, timeout=240) for process in processes]
    for sampler in samplers:
        sampler.__exit__()
    assert all(result["streamed"] for result in results)
    for epoch in range(2):
        labels = sorted(label for result in results for label in result["epochs"][epoch])
        assert labels == list(range(RECORDS)), f"epoch {epoch}: not every record exactly once"
    for node, sampler, proxy in zip(nodes, samplers, proxies):
        assert sampler.samples > 0
        assert sampler.peak <= limit, f"{node.name} held {sampler.peak} bytes of parts, budget {limit}"
        fetched = proxy.bytes_sent("GET", "-part-")
        total, largest = manifest.total_size_bytes, max(p.size_bytes for p in manifest.parts)
        if mode == "shard":
            # Both epochs read every part on this node, and the budget keeps a quarter at most.
            assert fetched >= 2 * total * 3 // 4 - largest
        else:
            # A mode made for streaming: each node reads about its share of the parts per epoch.
            assert total // 2 - largest <= fetched <= 2 * (total // 2 + 2 * largest), fetched
        print(f"{cloud.kind} {node.name}: fetched {fetched} bytes over 2 epochs (cache {manifest.total_size_bytes})")


def test_one_download_per_part_per_node(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path
) -> None:
    """Without a budget, two ranks of one node fetch each part once between them, and a second
    node fetches each part once too (its own part cache)."""
    bucket, prefix, manifest = published
    for n, proxy in enumerate(proxies):
        config = node_config(cloud, bucket, prefix, tmp_path / f"node-{n}", proxy.url, streaming=True)
        ranks = [start_reader(cloud, config, proxy.url, rank=r, shards=2, epochs=2) for r in range(2)]
        results = [finish(process) for process in ranks]
        for epoch in range(2):
            assert sorted(x for result in results for x in result["epochs"][epoch]) == list(range(RECORDS))
        gets = _part_gets(proxy)
        assert len(gets) == len(manifest.parts), f"node {n}: part downloads {sorted(gets)}"
        assert len(set(gets)) == len(manifest.parts)
        assert proxy.bytes_sent("GET", "-part-") == manifest.total_size_bytes


def test_streaming_is_opt_in_and_automatic_above_the_budget(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path
) -> None:
    bucket, prefix, manifest = published
    whole = open_store(node_config(cloud, bucket, prefix, tmp_path / "a", proxies[0].url), show_progress=False)
    if cloud.kind == "gcs":
        os.environ["STORAGE_EMULATOR_HOST"] = proxies[0].url
    try:
        reader = whole.open(DS, VER)
        assert reader.directory == tmp_path / "a" / "yogadl_local_cache" / DS / VER  # today's whole copy
        assert not parts_dir(tmp_path / "a").exists()
        small = node_config(
            cloud, bucket, prefix, tmp_path / "b", proxies[0].url, local_cache_limit=manifest.total_size_bytes // 2
        )
        streamed = open_store(small, show_progress=False).open(DS, VER)
        assert streamed.directory == parts_dir(tmp_path / "b")
        assert [int(streamed[i][1]) for i in (0, RECORDS - 1)] == [0, RECORDS - 1]
        # pull (yogacache pull) still makes a whole local copy when reads stream.
        config = node_config(cloud, bucket, prefix, tmp_path / "c", proxies[0].url, streaming=True)
        pulled = open_store(config, show_progress=False).pull(DS, VER)
        assert pulled.directory == tmp_path / "c" / "yogadl_local_cache" / DS / VER
        assert (pulled.directory / "manifest.json").is_file() and int(pulled[7][1]) == 7
    finally:
        if cloud.kind == "gcs":
            os.environ["STORAGE_EMULATOR_HOST"] = cloud.server.url


@pytest.mark.slow
@pytest.mark.parametrize("mode", RESUMABLE_MODES)
@pytest.mark.parametrize("cloud", ["s3", "gcs"], indirect=True)  # Azure: its 2x2 test above; time
def test_elastic_resume_from_2x2_to_3x1(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path, mode: str
) -> None:
    """Four ranks on two nodes stop mid-epoch; three ranks on three fresh nodes resume from one
    state: every record of the epoch exactly once, then the whole next epoch."""
    bucket, prefix, manifest = published
    limit = manifest.total_size_bytes // 4
    first = []
    for rank in range(4):
        node = tmp_path / f"old-{rank // 2}"
        config = node_config(cloud, bucket, prefix, node, proxies[0].url, streaming=True, local_cache_limit=limit)
        first.append(start_reader(cloud, config, proxies[0].url, rank=rank, shards=4, mode=mode, stop_after=50))
    before = [finish(process) for process in first]
    states = [result["state"] for result in before]
    assert all(state == states[0] for state in states)
    resumed = []
    for rank in range(3):
        config = node_config(
            cloud, bucket, prefix, tmp_path / f"new-{rank}", proxies[1].url, streaming=True, local_cache_limit=limit
        )
        resumed.append(
            start_reader(cloud, config, proxies[1].url, rank=rank, shards=3, epochs=2, mode=mode, resume=states[0])
        )
    after = [finish(process) for process in resumed]
    epoch_0 = [x for result in before for x in result["epochs"][0]] + [x for r in after for x in r["epochs"][0]]
    assert sorted(epoch_0) == list(range(RECORDS))
    assert sorted(x for result in after for x in result["epochs"][1]) == list(range(RECORDS))


def test_in_process_reader_under_a_budget_reads_every_record(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path
) -> None:
    """A streamed reader in this process, two epochs, shuffled: every record, the right values."""
    bucket, prefix, manifest = published
    node = tmp_path / "node"
    limit = manifest.total_size_bytes // 4
    config = node_config(cloud, bucket, prefix, node, proxies[0].url, streaming=True, local_cache_limit=limit)
    if cloud.kind == "gcs":
        os.environ["STORAGE_EMULATOR_HOST"] = proxies[0].url
    try:
        reader = open_store(config, show_progress=False).open(DS, VER)
        stream = read_stream(reader, ReadOptions(shuffle=True, shuffle_seed=1, reshuffle_each_epoch=True))
        expected = {label: array.tobytes() for array, label in data()}
        with UsageSampler(node) as sampler:
            for _ in range(2):
                seen = [(int(label), array.tobytes()) for array, label in stream]
                assert sorted(label for label, _ in seen) == list(range(RECORDS))
                assert all(expected[label] == raw for label, raw in seen)
        assert sampler.peak <= limit
        reader.close()  # stops fetching ahead; a download under way finishes (or is cleaned later)
        for leftover in [p.name for p in parts_dir(node).iterdir() if ".tmp-" in p.name]:
            part_name = leftover[1 : leftover.index(".tmp-")]
            # Only a download still under way has a temporary file: its fetch lock is held.
            assert not fetch_lock_free(parts_dir(node), part_name) or not (parts_dir(node) / leftover).exists()
    finally:
        if cloud.kind == "gcs":
            os.environ["STORAGE_EMULATOR_HOST"] = cloud.server.url
    print(json.dumps({"fetched": proxies[0].bytes_sent("GET", "-part-"), "cache": manifest.total_size_bytes}))


def test_reading_parts_on_the_node_leaves_them_untouched(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path
) -> None:
    """Parts already on the node are read as they are: no part's inode times change in a second
    epoch (touching one moved its ctime, which voided the stamp of its hash, so every acquire
    hashed the whole part again), and nothing is fetched again."""
    bucket, prefix, manifest = published
    node = tmp_path / "node"
    # Under a budget (that holds every part) a reader holds one part at a time, so it acquires
    # each part again and again.
    limit = 2 * manifest.total_size_bytes
    config = node_config(cloud, bucket, prefix, node, proxies[0].url, streaming=True, local_cache_limit=limit)
    if cloud.kind == "gcs":
        os.environ["STORAGE_EMULATOR_HOST"] = proxies[0].url
    try:
        reader = open_store(config, show_progress=False).open(DS, VER)
        stream = read_stream(reader, ReadOptions(shuffle=True, shuffle_seed=3, shuffle_mode="parts"))
        assert sorted(int(label) for _, label in stream) == list(range(RECORDS))
        parts = sorted(path for path in parts_dir(node).iterdir() if path.name.endswith(".mdb"))
        assert len(parts) == len(manifest.parts)
        before = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns, path.stat().st_ctime_ns) for path in parts}
        fetched = proxies[0].bytes_sent("GET", "-part-")
        assert sorted(int(label) for _, label in stream) == list(range(RECORDS))
        after = {path.name: (path.stat().st_ino, path.stat().st_mtime_ns, path.stat().st_ctime_ns) for path in parts}
        assert after == before
        assert proxies[0].bytes_sent("GET", "-part-") == fetched
        reader.close()
    finally:
        if cloud.kind == "gcs":
            os.environ["STORAGE_EMULATOR_HOST"] = cloud.server.url


def test_second_epoch_refetches_only_what_the_budget_could_not_keep(
    cloud: Cloud, published: tuple[str, str, Manifest], proxies: list[FaultProxy], tmp_path: Path
) -> None:
    """The read order of the next epoch is known, so the end of an epoch keeps the parts the next
    one starts with: a sequential epoch under a budget of half the cache fetches about
    (cache - budget) + one part, where LRU would fetch the whole cache again."""
    bucket, prefix, manifest = published
    limit = manifest.total_size_bytes // 2
    largest = max(part.size_bytes for part in manifest.parts)
    config = node_config(cloud, bucket, prefix, tmp_path / "n", proxies[0].url, streaming=True, local_cache_limit=limit)
    if cloud.kind == "gcs":
        os.environ["STORAGE_EMULATOR_HOST"] = proxies[0].url
    try:
        reader = open_store(config, show_progress=False).open(DS, VER)
        stream = read_stream(reader, ReadOptions())
        fetched = []
        for _ in range(2):
            assert [int(label) for _, label in stream] == list(range(RECORDS))
            fetched.append(proxies[0].bytes_sent("GET", "-part-") - sum(fetched))
    finally:
        if cloud.kind == "gcs":
            os.environ["STORAGE_EMULATOR_HOST"] = cloud.server.url
    assert fetched[0] == manifest.total_size_bytes
    assert fetched[1] <= manifest.total_size_bytes - limit + 2 * largest, fetched


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_a_streamed_cache(
    s3_server: Any, tmp_path: Path, context: str
) -> None:
    """DataLoader workers (forked, or spawned: the reader is pickled) stream parts into the
    node's part cache themselves: every record once, each part fetched once by the node."""
    import torch

    from yogacache.read.options import ReadOptions
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("caches")
    manifest = publish(cloud, bucket, prefix, tmp_path / "builder")
    with FaultProxy(s3_server.endpoint_url) as proxy:
        config = node_config(cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True)
        reader = open_store(config, show_progress=False).open(DS, VER)
        dataset = CacheIterableDataset.from_options(reader, ReadOptions())
        loader = CacheDataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context=context)
        labels = torch.cat([batch[1] for batch in loader]).tolist()
        assert sorted(labels) == list(range(RECORDS))
        gets = _part_gets(proxy)
        assert sorted(set(gets)) == sorted(gets) and len(gets) == len(manifest.parts)


def test_a_dataloaders_main_process_starts_the_first_part_and_only_that(
    s3_server: Any, tmp_path: Path
) -> None:
    """``EpochReader.prefetch`` (what a CacheDataLoader's main process calls once its workers
    are started) fetches the first part the epoch reads, and nothing after it (the main process
    announces no order, so it neither fetches ahead nor keeps parts from eviction); the workers
    then find it on the node: each part is still fetched once."""
    import time

    import torch

    from yogacache.read.options import ReadOptions
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("caches")
    manifest = publish(cloud, bucket, prefix, tmp_path / "builder")
    with FaultProxy(s3_server.endpoint_url) as proxy:
        config = node_config(
            cloud, bucket, prefix, tmp_path / "node", proxy.url, streaming=True,
            local_cache_limit=manifest.total_size_bytes,
        )
        reader = open_store(config, show_progress=False).open(DS, VER)
        options = ReadOptions(shuffle=True, shuffle_seed=5, shuffle_mode="parts")
        dataset = CacheIterableDataset.from_options(reader, options)
        first = dataset.epochs.schedule.parts_needed(0)[0].part
        dataset.epochs.prefetch((0, 0))
        target = parts_dir(tmp_path / "node") / f"{manifest.build_id}-{manifest.parts[first].name}"
        deadline = time.monotonic() + 30
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert target.exists()
        time.sleep(0.3)  # a fetch ahead, were there one, would have started
        gets = _part_gets(proxy)
        assert len(gets) == 1 and gets[0].endswith(manifest.parts[first].name), gets
        loader = CacheDataLoader(dataset, batch_size=16, num_workers=2)
        labels = torch.cat([batch[1] for batch in loader]).tolist()
        assert sorted(labels) == list(range(RECORDS))
        gets = _part_gets(proxy)
        assert sorted(set(gets)) == sorted(gets) and len(gets) == len(manifest.parts)


def test_usage_sampler_counts_a_file_once_under_two_names(tmp_path: Path) -> None:
    """The sampler lists names, then stats them one by one: boto3 renaming its download onto the
    reservation between two stats shows one file under two names (as a hard link does), which
    counted twice would make a node seem one part over its budget."""
    (tmp_path / "b-part-00001.mdb").write_bytes(b"p" * 700)
    reservation = tmp_path / ".b-part-00002.mdb.tmp-1-1000-0123abcd"
    reservation.write_bytes(b"d" * 1000)
    os.link(reservation, tmp_path / ".b-part-00002.mdb.tmp-1-1000-0123abcd.a1B2c3D4")  # boto3's name
    (tmp_path / ".b-part-00002.mdb.lock").write_bytes(b"")
    assert bytes_on_disk(tmp_path) == 1700
