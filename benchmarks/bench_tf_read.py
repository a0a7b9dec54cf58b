#!/usr/bin/env python
"""TensorFlow reads of small records: yogacache vs tf.data's own ``cache(filename)`` (issue 24 item 4).

Workload: 100,000 records of (uint8[32,32,3], int64), written once, outside any clock, into a
yogacache cache and into tf.data ``cache(filename)`` files. The path measured is a YogaDL
program's: ``CacheDataRef(reader).stream(shuffle=True, shuffle_seed=7, shard_rank=0,
num_shards=2)`` read through ``make_tf_dataset(stream).batch(256).prefetch(2)``.

**Read rate** (records/s), in one fresh process, after one warm-up pass of every row (files in the
page cache), the median of ``--passes`` passes, rows interleaved:

* ``yogacache batch``: ``make_tf_dataset(stream).batch(256).prefetch(2)`` (its ``batch`` rebatches
  whole reads);
* ``yogacache element-wise batch``: ``tf.data.Dataset.batch(make_tf_dataset(stream), 256)
  .prefetch(2)``, TensorFlow's own batching element by element, as when a ``map`` or ``shuffle``
  sits before ``batch``;
* ``tf.data cache(filename)``: the read pass of ``source.shard(2, 0).cache(filename)``, i.e. the
  same 50,000 records a rank reads, in order (no shuffle), ``.batch(256).prefetch(2)``.

Each row twice: ``new pipeline per pass`` (the clock covers ``stream()``, ``make_tf_dataset()``,
``batch``, the iterator and the whole epoch; for tf.data, making the cache dataset and reading it)
and ``pipeline made once`` (each pass is one iteration of a dataset made before the clock: the
next epoch). Target: both yogacache rows >= 1.0x tf.data's read pass of the same protocol.
The same process then times, after each round of passes, what a new pipeline of each row costs
up to its first batch: making the dataset, ``iter()`` and the first ``next()`` (wall and CPU).

**First element on a cache hit** (ms), each measurement in a fresh process (TensorFlow and
yogacache imported before the clock), ``--passes`` of each, interleaved, median:

* ``yogacache``: open the cache (``CacheStore(dir).open``), ``stream(...)``, ``make_tf_dataset``,
  ``.batch(256).prefetch(2)``, ``iter`` and the first ``next()``;
* the **floor**, TensorFlow's own Python-fed pipeline: ``tf.data.Dataset.from_generator(gen,
  output_signature=<the same (TensorSpec([32,32,3], uint8), TensorSpec([], int64))>)
  .batch(256).prefetch(2)``, ``iter`` and the first ``next()``, where ``gen`` yields the first
  256 records from numpy arrays made in memory before the clock (no I/O at all).

Target: yogacache's first element <= the floor.

Both tables also give the process CPU time (all threads): per record for the read rates, per first
element for the first element. On a small machine shared with other jobs the wall times depend on
how many cores are free while a pass runs; the CPU time much less so.

Usage: ``.venv/bin/python benchmarks/bench_tf_read.py [--dir DIR] [--passes 3]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench_torch import run_json  # noqa: E402  (one way to run a worker and read its JSON)

RECORDS = 100_000
BATCH = 256
STREAM = {"shuffle": True, "shuffle_seed": 7, "shard_rank": 0, "num_shards": 2}
ROWS = ("yogacache batch", "yogacache element-wise batch", "tf.data cache(filename)")
NEW_PIPELINE = "new pipeline per pass"
PROTOCOLS = (NEW_PIPELINE, "pipeline made once")


def _arrays() -> tuple[Any, Any]:
    import numpy as np

    images = np.random.default_rng(0).integers(0, 255, (RECORDS, 32, 32, 3), dtype=np.uint8)
    return images, np.arange(RECORDS, dtype=np.int64)


def _tf_cache_file(root: str) -> str:
    return os.path.join(root, "tf-cache-shard0")


def setup(root: str) -> dict[str, Any]:
    """Writes the yogacache cache and tf.data's cache file of shard 0 (once)."""
    import tensorflow as tf

    from yogacache.store.local import CacheStore

    source = tf.data.Dataset.from_tensor_slices(_arrays())
    store = CacheStore(root)
    if not store.exists("small", "v1"):
        store.build("small", "v1", source)
    path = _tf_cache_file(root)
    if not os.path.exists(path + ".index"):
        for _ in source.shard(2, 0).cache(path).batch(1024):
            pass
    return {}


def _records(dataset: Any) -> int:
    return sum(int(labels.shape[0]) for _, labels in dataset)


def throughput(root: str, passes: int) -> dict[str, Any]:
    """records/s of every row and protocol: median of ``passes``, interleaved."""
    import numpy as np
    import tensorflow as tf

    from yogacache.dataref import CacheDataRef
    from yogacache.store.local import CacheStore
    from yogacache.tensorflow import make_tf_dataset

    reader = CacheStore(root).open("small", "v1")
    stub = tf.data.Dataset.from_tensor_slices((np.zeros((1, 32, 32, 3), np.uint8), np.zeros(1, np.int64)))

    def pipeline(row: str) -> Any:
        if row == ROWS[2]:
            return stub.cache(_tf_cache_file(root)).batch(BATCH).prefetch(2)
        dataset = make_tf_dataset(CacheDataRef(reader).stream(**STREAM))
        if row == ROWS[1]:
            return tf.data.Dataset.batch(dataset, BATCH).prefetch(2)
        return dataset.batch(BATCH).prefetch(2)

    made = {row: pipeline(row) for row in ROWS}
    runs: dict[str, Callable[[], int]] = {}
    for row in ROWS:
        for protocol in PROTOCOLS:
            fresh = protocol == NEW_PIPELINE
            runs[f"{row}|{protocol}"] = (
                (lambda row=row: _records(pipeline(row))) if fresh else (lambda row=row: _records(made[row]))
            )
    rates: dict[str, list[float]] = {key: [] for key in runs}
    cpu: dict[str, list[float]] = {key: [] for key in runs}
    setups: dict[str, list[list[float]]] = {row: [] for row in ROWS}
    for rep in range(passes + 1):  # the first round warms up (page cache, first-use costs)
        for key, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            count = run()
            elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
            if count != RECORDS // 2:
                raise RuntimeError(f"{key} read {count} records, expected {RECORDS // 2}")
            if rep:
                rates[key].append(count / elapsed)
                cpu[key].append(used / count * 1e6)
        for row in ROWS:  # what a new pipeline costs before its first batch
            start, start_cpu = time.perf_counter(), time.process_time()
            dataset = pipeline(row)
            built = time.perf_counter()
            iterator = iter(dataset)
            started = time.perf_counter()
            next(iterator)
            done, used = time.perf_counter(), time.process_time() - start_cpu
            del iterator
            if rep:
                setups[row].append([(built - start) * 1e3, (started - built) * 1e3, (done - started) * 1e3, used * 1e3])
    return {"rates": rates, "cpu": cpu, "setups": setups}


def first_element(root: str, kind: str) -> dict[str, Any]:
    """Milliseconds to the first batch in this (fresh) process, by phase."""
    import tensorflow as tf

    from yogacache.dataref import CacheDataRef
    from yogacache.store.local import CacheStore
    from yogacache.tensorflow import make_tf_dataset

    phases: dict[str, float] = {}
    if kind == "floor":
        images, labels = _arrays()
        images, labels = images[:BATCH].copy(), labels[:BATCH].copy()

        def records() -> Any:
            for i in range(BATCH):
                yield images[i], labels[i]

        signature = (tf.TensorSpec([32, 32, 3], tf.uint8), tf.TensorSpec([], tf.int64))
        start, start_cpu = time.perf_counter(), time.process_time()
        dataset = tf.data.Dataset.from_generator(records, output_signature=signature)
        phases["from_generator"] = time.perf_counter() - start
        batch = next(iter(dataset.batch(BATCH).prefetch(2)))
    else:
        start, start_cpu = time.perf_counter(), time.process_time()
        reader = CacheStore(root).open("small", "v1")
        phases["open"] = time.perf_counter() - start
        stream = CacheDataRef(reader).stream(**STREAM)
        phases["stream"] = time.perf_counter() - start - sum(phases.values())
        dataset = make_tf_dataset(stream)
        phases["make_tf_dataset"] = time.perf_counter() - start - sum(phases.values())
        batched = tf.data.Dataset.batch(dataset, BATCH) if kind == "elements" else dataset.batch(BATCH)
        batch = next(iter(batched.prefetch(2)))
    total, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    phases["first next()"] = total - sum(phases.values())
    if int(batch[1].shape[0]) != BATCH:
        raise RuntimeError(f"the first batch holds {batch[1].shape[0]} records")
    return {"total": total * 1e3, "cpu": cpu * 1e3, "phases": {name: value * 1e3 for name, value in phases.items()}}


def _child(mode: str, root: str, passes: int, log_path: str) -> dict[str, Any]:
    command = [sys.executable, os.path.abspath(__file__), "--child", mode, "--dir", root, "--passes", str(passes)]
    return run_json(command, log_path, timeout=900)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "yogacache-bench-tf-read"))
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--only", choices=("rate", "first"), help="measure one part only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.child == "setup":
            result = setup(args.dir)
        elif args.child == "throughput":
            result = throughput(args.dir, args.passes)
        else:
            result = first_element(args.dir, args.child)
        print(json.dumps(result))
        return

    os.makedirs(args.dir, exist_ok=True)
    log_path = os.path.join(args.dir, "worker.log")
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    _child("setup", args.dir, args.passes, log_path)
    firsts: dict[str, list[dict[str, Any]]] = {"yoga": [], "elements": [], "floor": []}
    for _ in range(args.passes if args.only != "rate" else 0):  # fresh processes, interleaved
        for kind in firsts:
            firsts[kind].append(_child(kind, args.dir, args.passes, log_path))
    measured = _child("throughput", args.dir, args.passes, log_path) if args.only != "first" else {}
    load_after = os.getloadavg()

    print(f"# TensorFlow reads, small records ({RECORDS:,} x uint8[32,32,3] + int64), shard 0 of 2, shuffled")
    print(
        f"# {started:%Y-%m-%d %H:%M} UTC, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
        f"median of {args.passes} interleaved passes"
    )
    if measured:
        _print_rates(measured["rates"], measured["cpu"])
        _print_setups(measured["setups"])
    if firsts["floor"]:
        _print_firsts(firsts)


def _print_rates(rates: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    def median_rate(row: str, protocol: str) -> float:
        return statistics.median(rates[f"{row}|{protocol}"])

    def spread(values: list[float]) -> str:
        return f"{min(values):,.0f}-{max(values):,.0f}"

    print()

    def cpu_us(row: str, protocol: str) -> str:
        return f"{statistics.median(cpu[f'{row}|{protocol}']):.2f}"

    print(
        "| read rate (records/s: median, range) | yogacache | tf.data cache(filename) | ratio | target "
        "| CPU µs/record, yogacache / tf.data |"
    )
    print("|---|---:|---:|---:|---|---:|")
    for protocol in PROTOCOLS:
        base = median_rate(ROWS[2], protocol)
        for row in ROWS[:2]:
            ours = median_rate(row, protocol)
            ratio = ours / base
            verdict = "met" if ratio >= 1.0 else "missed"
            print(
                f"| {row}, {protocol} | {ours:,.0f} ({spread(rates[f'{row}|{protocol}'])}) "
                f"| {base:,.0f} ({spread(rates[f'{ROWS[2]}|{protocol}'])}) | {ratio:.2f}x | >= 1.0x {verdict} "
                f"| {cpu_us(row, protocol)} / {cpu_us(ROWS[2], protocol)} |"
            )


def _print_setups(setups: dict[str, list[list[float]]]) -> None:
    print()
    print("| a new pipeline, to its first batch (ms, median) | make the dataset | iter() | first next() | wall | CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for row, runs in setups.items():
        make, start, first, cpu = (statistics.median(run[i] for run in runs) for i in range(4))
        print(f"| {row} | {make:.1f} | {start:.1f} | {first:.1f} | {make + start + first:.1f} | {cpu:.1f} |")


def _print_firsts(firsts: dict[str, list[dict[str, Any]]]) -> None:
    print()
    floor = statistics.median(run["total"] for run in firsts["floor"])
    floor_cpu = statistics.median(run["cpu"] for run in firsts["floor"])
    print("| first element (fresh process) | ms (median) | phases (median ms) | vs floor | target | CPU ms, vs floor |")
    print("|---|---:|---|---:|---|---:|")
    labels = {
        "yoga": "yogacache `.batch(256)`",
        "elements": "yogacache element-wise `batch(256)`",
        "floor": "floor: from_generator + batch(256)",
    }
    for kind, runs in firsts.items():
        total = statistics.median(run["total"] for run in runs)
        phases = ", ".join(
            f"{name} {statistics.median(run['phases'][name] for run in runs):.1f}" for name in runs[0]["phases"]
        )
        target = "" if kind == "floor" else ("<= floor " + ("met" if total <= floor else "missed"))
        if kind == "elements":
            target = "(info)"
        cpu = statistics.median(run["cpu"] for run in runs)
        print(
            f"| {labels[kind]} | {total:.1f} | {phases} | {total / floor:.2f}x | {target} "
            f"| {cpu:.1f}, {cpu / floor_cpu:.2f}x |"
        )


if __name__ == "__main__":
    main()
