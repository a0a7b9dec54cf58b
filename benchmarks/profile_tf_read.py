#!/usr/bin/env python
"""Where the small-record shuffled read spends its CPU: the Python read vs the tf.data pipeline.

Uses the caches of ``bench_tf_read.py`` (made once under ``--dir``: 100,000 x (32x32x3 uint8,
int64) in yogacache, and tf.data's own ``cache(filename)`` of shard 0 of 2 of the same records), then
measures, in one process and interleaved, best of ``--reps`` passes, wall rate and process CPU
time per record of:

- ``python``: ``EpochReads.read`` over one epoch of shard 0 of 2, shuffled (no TensorFlow);
- ``rebatch``: ``make_tf_dataset(stream).batch(256).prefetch(2)`` (batch rebatches whole reads);
- ``elements``: the same, batched element by element (``tf.data.Dataset.batch`` itself);
- ``tf-cache``: the read pass of tf.data's ``cache(filename)`` (the same 50,000 records, in order)
  with ``batch(256).prefetch(2)``.

Usage: ``.venv/bin/python benchmarks/profile_tf_read.py [--dir DIR] [--reps N]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_tf_read  # noqa: E402  (the caches, made once, and the stream's arguments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "yogacache-bench-tf-read"))
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    bench_tf_read.setup(args.dir)
    tf_cache = bench_tf_read._tf_cache_file(args.dir)
    reader = CacheStore(args.dir).open("small", "v1")

    def stream() -> Any:
        return CacheDataRef(reader).stream(**bench_tf_read.STREAM)

    def python_read() -> int:
        reads = stream().epoch_reads
        epoch = reads.next_epoch()
        return sum(len(reads.read(epoch, i)[0]) for i in range(reads.count))

    def consume(dataset: tf.data.Dataset) -> int:
        return sum(int(batch[1].shape[0]) for batch in dataset)

    stub = (np.zeros((1, 32, 32, 3), np.uint8), np.zeros(1, np.int64))  # the file holds the records
    cached = tf.data.Dataset.from_tensor_slices(stub).cache(tf_cache)
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
