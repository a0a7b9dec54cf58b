"""Peer worker for ``bench_stream.py``: MosaicML Streaming (MDS) and LitData, streaming from S3.

Runs in ``benchmarks/.venv-peers`` (see ``bench_torch.peers_python``), one measurement per
process, and prints one JSON line as its last output. It imports nothing from yogacache; the
records come from ``_data.py`` like yogacache's.

Usage:
  ``_peers_stream.py build {mds,litdata} --dir DIR --records N --part-bytes B``
  ``_peers_stream.py read {mds,litdata} --remote s3://bucket/prefix --dir CACHE --limit BYTES
  --records N --epochs 2 --batch 256 [--workers 2] [--shuffle --part-bytes B]``
  (``S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL`` name the proxy)

Shuffled MosaicML reads are tuned for streaming under a budget: ``shuffle_algo="py1e"`` over
blocks of two shards' samples, ``num_canonical_nodes=1`` (one node), ``predownload`` left at its
default (eight batches). Blocks of four shards (the window yogacache mixes) failed under a budget
of half the dataset: either "Relative sample index ... is not present in the shard" or, worse,
an epoch of wrong labels (shards evicted under their readers); ``predownload`` of one batch ran
at a quarter of the rate. LitData's loader workers are spawned: its obstore client
does not survive fork (forked workers hang on their first chunk).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

SHAPE = (184, 184, 3)
_ARRAYS: dict[str, Any] = {}


def _arrays() -> tuple[Any, Any]:
    if not _ARRAYS:
        records = int(os.environ["BENCH_STREAM_RECORDS"])
        _ARRAYS["data"] = _data.make_arrays(records, SHAPE)
    return _ARRAYS["data"]  # type: ignore[no-any-return]


_ALLOW_HTTP = "BENCH_LITDATA_ALLOW_HTTP"


def allow_http() -> None:
    """The test server speaks plain http, which LitData's obstore client refuses by default."""
    import litdata.streaming.downloader as downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


if os.environ.get(_ALLOW_HTTP):  # a spawned LitData worker, importing this module as __mp_main__
    allow_http()


def litdata_item(index: int) -> dict[str, Any]:
    images, labels = _arrays()
    return {"image": images[index], "label": int(labels[index])}


def build(kind: str, directory: str, part_bytes: int) -> dict[str, Any]:
    images, labels = _arrays()
    start = time.perf_counter()
    if kind == "mds":
        from streaming import MDSWriter

        shape = ",".join(str(d) for d in SHAPE)
        columns = {"image": f"ndarray:uint8:{shape}", "label": "int64"}
        with MDSWriter(out=directory, columns=columns, size_limit=part_bytes) as writer:
            for image, label in zip(images, labels):
                writer.write({"image": image, "label": int(label)})
    else:
        from litdata import optimize

        optimize(
            fn=litdata_item,
            inputs=list(range(len(labels))),
            output_dir=directory,
            chunk_bytes=part_bytes,
            num_workers=1,
        )
    return {"seconds": time.perf_counter() - start}


def read(
    kind: str, remote: str, directory: str, limit: int, epochs: int, batch: int, workers: int, shuffle: bool,
    part_bytes: int,
) -> dict[str, Any]:
    import torch

    records = int(os.environ["BENCH_STREAM_RECORDS"])
    if kind == "mds":
        import streaming  # noqa: F401 - imported before the clock starts
    else:
        import litdata  # noqa: F401
    opened_wall, opened = time.time(), time.perf_counter()  # the first batch is timed from here
    if kind == "mds":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        tuning: dict[str, Any] = {}
        if shuffle:
            record_bytes = _data_record_bytes()
            tuning = dict(shuffle_algo="py1e", shuffle_block_size=2 * max(1, part_bytes // record_bytes),
                          num_canonical_nodes=1, shuffle_seed=7)
        dataset: Any = StreamingDataset(
            remote=remote, local=directory, shuffle=shuffle, batch_size=batch, cache_limit=limit, **tuning
        )
        loader: Any = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    else:
        from litdata import StreamingDataLoader, StreamingDataset
        from litdata.streaming.resolver import Dir

        os.environ[_ALLOW_HTTP] = "1"  # for spawned workers too, which import this module anew
        allow_http()

        endpoint = os.environ["AWS_ENDPOINT_URL"]
        dataset = StreamingDataset(
            input_dir=Dir(path=directory, url=remote),
            shuffle=shuffle,
            seed=7,
            max_cache_size=limit,
            storage_options={"endpoint_url": endpoint},
        )
        # LitData's obstore client does not survive fork (its workers hang on their first chunk).
        context = "spawn" if workers else None
        loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, multiprocessing_context=context)
    results = []
    for epoch in range(epochs):
        start_wall, start = (opened_wall, opened) if epoch == 0 else (time.time(), time.perf_counter())
        first = None
        count = label_sum = 0
        for element in loader:
            if first is None:
                first = time.perf_counter() - start
            count += len(element["label"])
            label_sum += int(element["label"].sum())
        results.append(
            {"start": start_wall, "end": time.time(), "seconds": time.perf_counter() - start,
             "first_batch": first, "records": count, "label_sum": label_sum}
        )
        if count != records:
            raise RuntimeError(f"{kind} read {count} records in an epoch, expected {records}")
    return {"epochs": results}


def _data_record_bytes() -> int:
    return SHAPE[0] * SHAPE[1] * SHAPE[2] + 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "read"])
    parser.add_argument("kind", choices=["mds", "litdata"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--part-bytes", type=int, default=32 << 20)
    parser.add_argument("--remote", default="")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--shuffle", action="store_true")
    args = parser.parse_args()
    os.environ["BENCH_STREAM_RECORDS"] = str(args.records)
    if args.action == "build":
        result = build(args.kind, args.dir, args.part_bytes)
    else:
        result = read(args.kind, args.remote, args.dir, args.limit, args.epochs, args.batch, args.workers,
                      args.shuffle, args.part_bytes)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
