#!/usr/bin/env python
"""Where the small-record shuffled read spends its CPU: the Python read vs the tf.data pipeline.

Builds (once, under ``--dir``) a cache of 100,000 x (32x32x3 uint8, int64) and tf.data's own
``cache(filename)`` of the same records, then measures, in one process and interleaved, best of
``--reps`` passes, wall rate and process CPU time per record of:

- ``python``: ``EpochReads.read`` over one epoch of shard 0 of 2, shuffled (no TensorFlow);
- ``rebatch``: ``make_tf_dataset(stream).batch(256).prefetch(2)`` (batch rebatches whole reads);
- ``elements``: the same, batched element by element (``tf.data.Dataset.batch`` itself);
- ``tf-cache``: the read pass of tf.data's ``cache(filename)`` with ``batch(256).prefetch(2)``.

Usage: ``.venv/bin/python benchmarks/profile_tf_read.py [--dir DIR] [--reps N]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

RECORDS = 100_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "yogacache-profile-tf-read"))
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    images = np.random.default_rng(0).integers(0, 255, (RECORDS, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(RECORDS, dtype=np.int64)
    source = tf.data.Dataset.from_tensor_slices((images, labels))
    store = CacheStore(args.dir)
    if not store.exists("small", "v1"):
        store.build("small", "v1", source)
    tf_cache = os.path.join(args.dir, "tf-cache")
    if not os.path.exists(tf_cache + ".index"):
        for _ in source.cache(tf_cache).batch(1024):
            pass
    reader = store.open("small", "v1")

    def stream() -> Any:
        return CacheDataRef(reader).stream(shuffle=True, shuffle_seed=7, shard_rank=0, num_shards=2)

    def python_read() -> int:
        reads = stream().epoch_reads
        epoch = reads.next_epoch()
        return sum(len(reads.read(epoch, i)[0]) for i in range(reads.count))

    def consume(dataset: tf.data.Dataset) -> int:
        return sum(int(batch[1].shape[0]) for batch in dataset)

    cached = tf.data.Dataset.from_tensor_slices((images[:1], labels[:1])).cache(tf_cache)
    passes: dict[str, Callable[[], int]] = {
        "python": python_read,
        "rebatch": lambda: consume(make_tf_dataset(stream()).batch(256).prefetch(2)),
        "elements": lambda: consume(tf.data.Dataset.batch(make_tf_dataset(stream()), 256).prefetch(2)),
        "tf-cache": lambda: consume(cached.batch(256).prefetch(2)),
    }
    best: dict[str, tuple[float, float]] = {name: (0.0, float("inf")) for name in passes}
    for _ in range(args.reps):
        for name, run in passes.items():
            wall, cpu = time.perf_counter(), time.process_time()
            count = run()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rate, per_record = best[name]
            best[name] = (max(rate, count / wall), min(per_record, cpu / count * 1e6))
    print("| pass | records/s (best) | CPU µs/record (min) | vs tf-cache |")
    print("|---|---:|---:|---:|")
    for name, (rate, per_record) in best.items():
        print(f"| {name} | {rate:,.0f} | {per_record:.2f} | {rate / best['tf-cache'][0]:.2f}x |")


if __name__ == "__main__":
    main()
