"""Parts fetched per epoch by a streamed reader under a budget of half the cache.

A cache of 1,024 records of 4 KiB in small parts (256 KiB files, LMDB's pages counted: about
25 records, 41 parts) is published to a bucket of moto's S3
server (started here; or to a directory with ``--backend file``), then read by one in-process
reader, two epochs, under a ``local_cache_limit`` of half the cache's bytes, in reads of 16
records (``--read-records``; real records are larger than 4 KiB, so a read holds far fewer
records than a part, as here). The table counts each epoch's part downloads against what
docs/streaming.md promises: epoch 1 at most D + 1 parts (D: the cache's parts; one more: the
next epoch's first part, fetched ahead), epoch 2 at most (D - B) + 1 (B: the parts the budget
holds). Every epoch's records are checked: each record once, with its own values.

``--ranks 2`` adds rows of two ranks of one node (processes, each reading its shard, meeting
at every epoch's end). ``--workers 0,2,8`` reads each row at each count of DataLoader workers (0: in this process;
otherwise ``CacheIterableDataset`` through ``CacheDataLoader``, batches of ``--read-records``).
Downloads are counted in every process (forked workers append to one log).

The promise is the node's, whatever number of readers share its budget, with one term more:
a DataLoader's workers read ``workers x prefetch_factor`` batches at once, and the parts those
records span (S, printed per row) are all needed on the node at the same moment, so the budget
keeps S - 1 fewer of the parts the next epoch starts with. Epoch 2 is promised at most
(D - B) + S parts (S = 1 for one reader, the promise above). With parts of thousands of records
S is 1 or 2; this cache's parts of 25 records make it large (8 workers reading 16 records each:
256 records, 11 parts), which is what the rows with ``--read-records 4`` separate from the
workers' count.

Usage: ``.venv/bin/python benchmarks/bench_parts_budget.py [--backend s3|file] [--epochs 2]
[--runs 3] [--windows 1,2,4] [--read-records 16] [--workers 0,2,8]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import _data
import numpy as np

from yogacache.backends.base import ObjectStore
from yogacache.read import pipeline
from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import DEFAULT_PARTS_WINDOW, PartLayout

try:
    from yogacache.read.parts_shuffle import budget_window
except ImportError:  # yogacache before the window fitted the budget: it read with the window asked

    def budget_window(window: int, layout: PartLayout, budget_bytes: int) -> int:
        return window


from yogacache.read.pipeline import read_stream
from yogacache.store import streaming
from yogacache.store.remote import RemoteCacheStore

RECORDS = 1024
PART_BYTES = 256 << 10  # part files of at most 256 KiB: 41 parts of about 25 records of 4 KiB
DS, VER = "bench-parts-budget", "v1"
SEED = 7  # run r shuffles with seed SEED + r


def data() -> list[tuple[np.ndarray, int]]:
    """Record i: (int32[1024] filled with i, i)."""
    return [(np.full(1024, i, np.int32), i) for i in range(RECORDS)]


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server on a free port of 127.0.0.1 (the process, its URL)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.1)
    return process, f"http://127.0.0.1:{port}"


class Downloads:
    """Counts part downloads (``StreamingParts._download`` calls that finished) in this process and
    its forked DataLoader workers: each appends a line to one log file."""

    def __init__(self, log: Path) -> None:
        self.log = log
        log.touch()
        original = streaming.StreamingParts._download

        def counted(provider: Any, index: int, temp: Path, stopping: Any = None) -> None:
            original(provider, index, temp, stopping)
            with open(log, "a") as f:  # O_APPEND: one whole line per write, from any process
                f.write(f"{os.getpid()} {index}\n")

        streaming.StreamingParts._download = counted  # type: ignore[method-assign, assignment]

    @property
    def count(self) -> int:
        with open(self.log) as f:
            return sum(1 for _ in f)


def epoch_labels(stream: Any) -> list[int]:
    """The labels of one pass of ``stream`` (arrays filled with their label, and the labels), -1
    for a record whose values are not its label's."""
    labels = []
    for array, label in stream:
        labels_here = np.asarray(label).reshape(-1)
        right = (np.asarray(array).reshape(len(labels_here), -1) == labels_here[:, None]).all(axis=1)
        labels.extend(np.where(right, labels_here, -1).tolist())
    return labels


def check_epoch(epoch: int, labels: list[int]) -> None:
    """SystemExit unless ``labels`` (from ``epoch_labels``, of every reader of the epoch) are each
    record's once, every record with its own values."""
    if -1 in labels:
        raise SystemExit(f"epoch {epoch}: {labels.count(-1)} record(s) hold the wrong values")
    if sorted(labels) != list(range(RECORDS)):
        raise SystemExit(f"epoch {epoch}: read {len(labels)} records, not each of {RECORDS} once")


def read_epochs(
    store: RemoteCacheStore, options: ReadOptions, epochs: int, downloads: Downloads, workers: int = 0
) -> list[int]:
    """The part downloads of each epoch; every epoch's records checked against the dataset."""
    reader = store.open(DS, VER)
    try:
        stream = read_stream(reader, options) if not workers else loader_epochs(reader, options, workers)
        fetched = []
        for epoch in range(1, epochs + 1):
            before = downloads.count
            check_epoch(epoch, epoch_labels(stream))
            fetched.append(downloads.count - before)
        return fetched
    finally:
        reader.close()


def read_ranks(
    store: Callable[[], RemoteCacheStore], options: dict[str, Any], ranks: int, epochs: int, downloads: Downloads
) -> list[int]:
    """The part downloads of each epoch of ``ranks`` processes of one node (forked; ranks of one
    job, ``ranks_per_node`` of them, each reading its shard in this process and meeting the
    others at the end of every epoch, as a training step's all-reduce makes them); the ranks'
    records together checked against the dataset, each once."""
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(ranks + 1)
    labels_of = context.Queue()

    def rank_main(rank: int) -> None:
        reader = store().open(DS, VER)
        try:
            stream = read_stream(
                reader, ReadOptions(**options, shard_rank=rank, num_shards=ranks, ranks_per_node=ranks)
            )
            for _epoch in range(epochs):
                barrier.wait()
                labels_of.put(epoch_labels(stream))
                barrier.wait()
        finally:
            reader.close()

    processes = [context.Process(target=rank_main, args=(rank,), daemon=True) for rank in range(ranks)]
    for process in processes:
        process.start()
    fetched = []
    try:
        for epoch in range(1, epochs + 1):
            barrier.wait(timeout=600)
            before = downloads.count
            labels = [label for _ in range(ranks) for label in labels_of.get(timeout=600)]
            barrier.wait(timeout=600)
            check_epoch(epoch, labels)
            fetched.append(downloads.count - before)
    finally:
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()
    return fetched


def loader_epochs(reader: Any, options: ReadOptions, workers: int) -> Any:
    """An iterable whose each pass is the next epoch, read by a DataLoader's ``workers`` (batches)."""
    from yogacache.dataref import CacheDataRef
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    read = pipeline.ReadSizes.for_records().full
    dataset = CacheIterableDataset.from_options(CacheDataRef(reader), options, batch_size=read, output="numpy")
    loader = CacheDataLoader(dataset, batch_size=read, num_workers=workers, multiprocessing_context="fork")

    class Epochs:
        epoch = 0

        def __iter__(self) -> Any:
            dataset.set_epoch(self.epoch)
            self.epoch += 1
            return iter(loader)

    return Epochs()


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", choices=["s3", "file"], default="s3")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="fresh nodes per row (each run's count shown)")
    parser.add_argument("--windows", default=f"1,2,{DEFAULT_PARTS_WINDOW}")
    parser.add_argument("--read-records", type=int, default=16, help="records per read")
    parser.add_argument("--workers", default="0", help="DataLoader worker counts, each a row (0: in this process)")
    parser.add_argument("--ranks", default="", help="ranks of one node (processes, 0 workers each), each a row: 2")
    args = parser.parse_args(argv)
    read = args.read_records
    pipeline.ReadSizes.for_records = classmethod(  # type: ignore[method-assign, assignment]
        lambda cls, *cache: cls(full=read, first=read)
    )

    work = Path(tempfile.mkdtemp(prefix="bench-parts-budget-"))
    downloads = Downloads(work / "downloads.log")
    moto: Optional[subprocess.Popen[bytes]] = None
    try:
        objects: Callable[[], ObjectStore]
        if args.backend == "s3":
            from yogacache.backends.s3 import S3ObjectStore

            moto, url = start_moto()
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            S3ObjectStore(bucket, "caches", endpoint_url=url)._client.create_bucket(Bucket=bucket)
            objects = lambda: S3ObjectStore(bucket, "caches", endpoint_url=url)  # noqa: E731
        else:
            from yogacache.backends.files import FileObjectStore

            objects = lambda: FileObjectStore(work / "bucket")  # noqa: E731
        builder = RemoteCacheStore(objects(), work / "builder", part_size_bytes=PART_BYTES, show_progress=False)
        manifest = builder.get_or_build(DS, VER, data).manifest
        parts = len(manifest.parts)
        limit = manifest.total_size_bytes // 2
        budget_parts = limit // max(part.size_bytes for part in manifest.parts)

        rows: list[tuple[str, Callable[[int], dict[str, Any]]]] = [("sequential", lambda seed: {})]
        layout = PartLayout.from_manifest(manifest)
        for window in (int(w) for w in args.windows.split(",")):
            name = f"`parts`, window {window}" + (" (default)" if window == DEFAULT_PARTS_WINDOW else "")
            if budget_window(window, layout, limit) < window:  # what the reader now does
                name += f", read with {budget_window(window, layout, limit)}"
            rows.append(
                (
                    name,
                    lambda seed, window=window: dict(  # type: ignore[misc]
                        shuffle=True,
                        shuffle_seed=seed,
                        reshuffle_each_epoch=True,
                        shuffle_mode="parts",
                        parts_window=window,
                    ),
                )
            )
        print(
            f"Parts fetched per epoch, {args.runs} runs each (seeds {SEED}..{SEED + args.runs - 1}): {parts} "
            f"parts ({manifest.total_size_bytes} bytes) on {args.backend}, budget of half (B = {budget_parts} "
            f"parts), reads of {read} records; promised: epoch 1 <= {parts + 1}, epoch 2 <= "
            f"{parts - budget_parts} + S (S: the parts the records read at once span)\n"
        )
        print(
            "| order | ranks x workers | records read at once | S | "
            + " | ".join(f"epoch {e}" for e in range(1, args.epochs + 1))
            + " | promise: epoch 1, later | |"
        )
        print("|---|---:|---:|---:|" + "---:|" * args.epochs + "---:|---|")
        counts = [(1, int(w)) for w in args.workers.split(",")] + [(int(r), 0) for r in args.ranks.split(",") if r]
        for name, options in rows:
            for ranks, workers in counts:
                at_once = ranks * read * (workers * _data.PREFETCH if workers else 1)
                span = _data.parts_read_at_once(at_once, RECORDS / parts)
                promised = [parts + 1] + [parts - budget_parts + span] * (args.epochs - 1)
                runs = []
                for run in range(args.runs):  # a fresh node and another seed each run
                    node = work / f"node-{uuid.uuid4().hex[:8]}"

                    def store(node: Path = node) -> RemoteCacheStore:
                        return RemoteCacheStore(
                            objects(), node, show_progress=False, streaming=True, local_cache_limit=limit
                        )

                    if ranks == 1:
                        fetched = read_epochs(
                            store(), ReadOptions(**options(SEED + run)), args.epochs, downloads, workers
                        )
                    else:
                        fetched = read_ranks(store, options(SEED + run), ranks, args.epochs, downloads)
                    runs.append(fetched)
                cells = [" / ".join(str(run[e]) for run in runs) for e in range(args.epochs)]
                kept = all(run[e] <= promised[e] for run in runs for e in range(args.epochs))
                print(
                    f"| {name} | {ranks} x {workers} | {at_once} | {span} | "
                    + " | ".join(cells)
                    + f" | {promised[0]}, {promised[-1]} | {'kept' if kept else 'MISSED'} |",
                    flush=True,
                )
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
