"""One process at the disk's limit: yogacache's single-process build against the pack+append baseline.

The baseline is what a build cannot beat by much: ``msgpack.packb`` of each record, LMDB
``put(append=True)`` 10,000 records per transaction, then ``fsync``. Rows (issue 13, item 1):

- ``small`` / ``large`` from memory (a list of ``(image, label)`` numpy tuples): yogacache's
  ``CacheStore.build`` against the baseline on the same records;
- the same records from a ``tf.data`` source: yogacache against min(source alone, consumed in
  batches of 256, baseline), and
  tf.data's own ``cache(filename)`` write pass (one full iteration) for reference.

Every measurement runs in a fresh process (``--one``), alternating, best of ``--reps``; the
records are made before the clock starts. Usage::

    .venv/bin/python benchmarks/bench_write.py [--workloads small,large] [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

TXN_RECORDS = 10_000
KINDS = ("pack_append", "yogacache_mem", "tf_source", "yogacache_tf", "tf_cache_write")


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


def pack_append(images: Any, labels: Any, directory: str) -> None:
    """The baseline: packb + put(append=True), 10k per transaction, sync + fsync."""
    import lmdb
    import msgpack

    path = os.path.join(directory, "baseline.mdb")
    env = lmdb.open(path, subdir=False, map_size=1 << 40, lock=False)
    count = len(labels)
    for start in range(0, count, TXN_RECORDS):
        with env.begin(write=True) as txn:
            cursor = txn.cursor()
            for i in range(start, min(count, start + TXN_RECORDS)):
                value = msgpack.packb([images[i].tobytes(), int(labels[i])])
                cursor.put(struct.pack(">Q", i), value, append=True)
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
                pack_append(images, labels, directory)
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
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.reps):
            for kind in KINDS:  # alternating, so drifts of the machine hit every row alike
                result = run_fresh(kind, workload, args.quick)
                if kind not in best or result["seconds"] < best[kind]["seconds"]:
                    best[kind] = result
        rate = {kind: r["records"] / r["seconds"] for kind, r in best.items()}
        rows.append((workload, "in memory", rate["yogacache_mem"], rate["pack_append"], "pack+append"))
        tf_bound = min(rate["tf_source"], rate["pack_append"])
        rows.append((workload, "tf.data source", rate["yogacache_tf"], tf_bound, "min(source, pack+append)"))
        rows.append((workload, "tf.data cache(file) write", rate["tf_cache_write"], tf_bound,
                     "min(source, pack+append)"))
        print(f"# {workload}: " + ", ".join(f"{k} {v:,.0f} rec/s" for k, v in rate.items()), file=sys.stderr)
    print(f"single-process build, best of {args.reps}, fresh process per measurement "
          f"({os.cpu_count()} CPUs)\n")
    print("| workload | build | records/s | baseline | baseline records/s | ratio |")
    print("|---|---|---:|---|---:|---:|")
    for workload, what, value, base, base_name in rows:
        print(f"| {workload} | {what} | {value:,.0f} | {base_name} | {base:,.0f} | {value / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
