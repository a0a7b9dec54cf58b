"""One process at the disk's limit: yogacache's single-process build against the pack+append baseline.

The baseline is what a hand-written build of the same records costs: ``msgpack.packb`` of each
record, LMDB ``put(append=True)`` 10,000 records per transaction, then ``fsync``; no hash, no
manifest. Rows (issue 13 item 1, issue 24 item 3):

- ``small`` / ``large`` from memory (a list of ``(image, label)`` numpy tuples): yogacache's
  ``CacheStore.build`` against the baseline on the same in-memory records;
- the same records from a ``tf.data`` source (``from_tensor_slices``): yogacache's build against
  the baseline fed by the same source (``batch(256).prefetch(2).as_numpy_iterator()``, the
  cheapest way Python reads a ``tf.data`` pipeline): both sides pay the source's cost. For
  reference, also against the in-memory baseline, which does not pay it: that ratio measures
  how much of TensorFlow's work the build hides on an idle second core, and so moves with the
  machine's load (about 0.95x on a quiet 2-core machine, under 0.6x at load 2-3);
- tf.data's own ``cache(filename)`` write pass (one full iteration), against the same baseline.

Every measurement runs in a fresh process (``--one``), the kinds alternating, ``--reps`` times;
the table gives the median of each, its CPU seconds (process time, every thread), and the
records are made before the clock starts. Usage::

    .venv/bin/python benchmarks/bench_write.py [--workloads small,large] [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

TXN_RECORDS = 10_000
KINDS = ("pack_append", "yogacache_mem", "tf_source", "pack_append_tf", "yogacache_tf", "tf_cache_write")


def _records(workload: str, quick: bool) -> tuple[int, tuple[int, ...]]:
    spec = _data.WORKLOADS[workload]
    records = spec["records"] // (_data.QUICK_DIVISOR if quick else 1)
    return records, tuple(spec["shape"])


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack_append(batches: Iterable[tuple[Any, Any]], directory: str) -> None:
    """The baseline: packb + put(append=True), 10k per transaction, sync + fsync, over batches
    of ``(images, labels)`` arrays (one batch for records in memory)."""
    import lmdb
    import msgpack

    path = os.path.join(directory, "baseline.mdb")
    env = lmdb.open(path, subdir=False, map_size=1 << 40, lock=False)
    key = 0
    txn = env.begin(write=True)
    cursor = txn.cursor()
    for images, labels in batches:
        for i in range(len(labels)):
            value = msgpack.packb([images[i].tobytes(), int(labels[i])])
            cursor.put(struct.pack(">Q", key), value, append=True)
            key += 1
            if key % TXN_RECORDS == 0:
                txn.commit()
                txn = env.begin(write=True)
                cursor = txn.cursor()
    txn.commit()
    env.sync(True)
    env.close()
    _fsync(path)


def measure_one(kind: str, workload: str, quick: bool) -> dict[str, Any]:
    """One timed measurement in this (fresh) process."""
    records, shape = _records(workload, quick)
    images, labels = _data.make_arrays(records, shape)
    directory = tempfile.mkdtemp(prefix=f"bench-write-{kind}-", dir=os.environ.get("BENCH_DIR"))
    run: Callable[[], None]
    try:
        if kind == "pack_append":
            def run() -> None:
                pack_append([(images, labels)], directory)
        elif kind == "yogacache_mem":
            from yogacache.store.local import CacheStore

            items = [(images[i], labels[i]) for i in range(records)]
            store = CacheStore(directory, show_progress=False)

            def run() -> None:
                store.build("bench", "v1", items)
        else:
            source = _data.make_tf_source(images, labels)
            if kind == "tf_source":
                def run() -> None:  # as bench_core's source row: batched, so TensorFlow's own
                    for _ in source.batch(_data.BATCH):  # per-element Python cost is not counted
                        pass
            elif kind == "pack_append_tf":
                def run() -> None:
                    pack_append(source.batch(_data.BATCH).prefetch(2).as_numpy_iterator(), directory)
            elif kind == "yogacache_tf":
                from yogacache.store.local import CacheStore

                store = CacheStore(directory, show_progress=False)

                def run() -> None:
                    store.build("bench", "v1", source)
            else:
                cached = source.cache(os.path.join(directory, "tfcache"))

                def run() -> None:
                    for _ in cached:
                        pass
        cpu, start = time.process_time(), time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "cpu": time.process_time() - cpu, "records": records}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def run_fresh(kind: str, workload: str, quick: bool) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--one", kind, "--workloads", workload] + (["--quick"] if quick else [])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {workload} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_kinds(workload: str, kinds: Iterable[str], reps: int, quick: bool) -> dict[str, list[dict[str, Any]]]:
    """Every kind ``reps`` times, alternating (drifts of the machine hit every kind alike)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for _ in range(max(1, reps)):
        for kind in kinds:
            runs.setdefault(kind, []).append(run_fresh(kind, workload, quick))
    return runs


def median_of(runs: list[dict[str, Any]], field: str = "seconds") -> float:
    return float(statistics.median(run[field] for run in runs))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="small,large")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a tenth of the records")
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.workloads, args.quick)))
        return 0
    rows = []
    for workload in args.workloads.split(","):
        runs = run_kinds(workload, KINDS, args.reps, args.quick)
        seconds = {kind: median_of(r) for kind, r in runs.items()}
        cpu = {kind: median_of(r, "cpu") for kind, r in runs.items()}
        records = runs["pack_append"][0]["records"]

        same_source = "pack+append from the same tf.data source"
        for what, kind, base, base_name in (
            ("in memory", "yogacache_mem", "pack_append", "pack+append, in memory"),
            ("tf.data source", "yogacache_tf", "pack_append_tf", same_source),
            ("tf.data source", "yogacache_tf", "pack_append", "pack+append, in memory (source not counted; reference)"),
            ("tf.data cache(file) write", "tf_cache_write", "pack_append_tf", same_source),
        ):
            rows.append((workload, what, records / seconds[kind], cpu[kind], base_name,
                         records / seconds[base], cpu[base], seconds[base] / seconds[kind]))
        print(f"# {workload}: " + ", ".join(f"{k} {records / v:,.0f} rec/s" for k, v in seconds.items()),
              file=sys.stderr)
    print(f"single-process build, median of {args.reps}, fresh process per measurement, kinds alternating "
          f"({os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})\n")
    print("| workload | build | records/s | CPU s | baseline | baseline records/s | baseline CPU s | ratio |")
    print("|---|---|---:|---:|---|---:|---:|---:|")
    for workload, what, value, value_cpu, base_name, base, base_cpu, ratio in rows:
        print(f"| {workload} | {what} | {value:,.0f} | {value_cpu:.2f} | {base_name} | {base:,.0f} | "
              f"{base_cpu:.2f} | {ratio:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
