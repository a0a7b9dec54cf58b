"""Build benchmark (issue 24 item 3): a CPU-bound source (JPEG decode of the large records) built by
yogacache in one process, with build shards on 1 and 2 local workers and with Ray on 2 CPUs, side by
side with MosaicML ``MDSWriter`` (one process), LitData ``optimize(num_workers=2)`` and two ceiling
rows that decode the source and write nothing; and small records (100,000 x 32x32x3 uint8 + int64)
built from a ``tf.data`` source against the pack+append baseline of ``bench_write.py``. One run
prints every row, the ratios the issue sets targets for, and whether each is met.

Every measurement runs in a fresh process and times the whole build, start-up of its workers or Ray
cluster included (not the interpreter's start, and no import of yogacache, TensorFlow, LitData or
MosaicML: those run before the clock starts). The JPEGs are encoded once, outside any clock, and
every builder decodes them with Pillow (``_jpeg.py``). The peers run in ``benchmarks/.venv-peers``
(see ``bench_torch.py``); a row they cannot run says why. CPU seconds count every thread of the
measuring process and the worker processes it reaps (not Ray's, which outlive the clock).

Every row runs ``--reps`` times (default 3), the rows interleaved; the table gives each row's
median and range. A ratio is a speed ratio (the other row's seconds over this row's) taken within
each rep, between rows run a few seconds apart, and the table gives the median over the reps and
their range: the shared 2-core machine this runs on varies by 30% from one minute to the next.

The ceiling rows decode the source and write nothing, in one process and in two spawned processes:
the most any builder can reach on the machine it runs on with that many processes.

The small rows (``bench_write.py``'s kinds, each a fresh process): yogacache's build from the
``tf.data`` source, and the baseline, which reads the same source (``batch(256).prefetch(2)``), packs
each record with ``msgpack.packb`` and stores it with LMDB ``put(append=True)``, 10,000 per
transaction, then syncs and fsyncs (no hash, no manifest); the same baseline over the records in
memory (the source not counted) is a reference row without a target.

Usage: ``python benchmarks/bench_build.py [--records N] [--reps 3] [--only yogacache-w2,...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _data  # noqa: E402
import bench_write  # noqa: E402
from _clock import cpu_seconds  # noqa: E402

ROWS = {
    "yogacache-1proc": "yogacache, one process (no build shards)",
    "yogacache-w1": "yogacache, workers=1 (build shards, in process)",
    "yogacache-w2": "yogacache, workers=2 (spawned processes)",
    "yogacache-ray2": "yogacache on Ray, 2 CPUs (ray.init included)",
    "litdata": "LitData optimize(num_workers=2)",
    "mds": "MosaicML MDSWriter (one process)",
    "decode-1proc": "ceiling: JPEG decode alone, one process (nothing written)",
    "decode-2proc": "ceiling: JPEG decode alone, 2 spawned processes (nothing written)",
}
# The small-record rows: bench_write.py's kinds on its ``small`` workload.
SMALL_ROWS = {
    "small-tf": ("yogacache_tf", "small records: yogacache from the tf.data source"),
    "small-baseline-tf": ("pack_append_tf", "small records: pack+append from the same tf.data source"),
    "small-baseline-mem": ("pack_append", "small records: pack+append from memory (source not counted)"),
}
# (what, row, compared with, target speed ratio or None for a reference)
TARGETS = [
    ("one process vs MosaicML MDSWriter", "yogacache-1proc", "mds", 1.10),
    ("one process vs decode alone, one process", "yogacache-1proc", "decode-1proc", 0.90),
    ("workers=2 vs decode alone, 2 processes", "yogacache-w2", "decode-2proc", 0.85),
    ("small records from tf.data vs pack+append from the same source", "small-tf", "small-baseline-tf", 0.80),
    ("(reference) small records from tf.data vs pack+append from memory", "small-tf", "small-baseline-mem", None),
    ("(reference) workers=2 vs one process", "yogacache-w2", "yogacache-1proc", None),
    ("(reference) workers=2 vs LitData optimize(num_workers=2)", "yogacache-w2", "litdata", None),
]


def measure(kind: str, jpegs: str, directory: str) -> dict[str, Any]:
    """One yogacache build, in this (fresh) process."""
    from _jpeg import JpegRecords

    from yogacache.parallel import plan_index_shards, sharded
    from yogacache.store.local import CacheStore

    source = JpegRecords(jpegs)
    cpu, start = cpu_seconds(), time.perf_counter()
    if kind.startswith("decode-"):
        return {**_decode_only(kind, source, start), "cpu": cpu_seconds() - cpu}
    if kind == "yogacache-ray2":
        import ray

        from yogacache.parallel.ray import build_with_ray

        # Ray's workers inherit this process's PYTHONPATH (run_one sets it): no runtime_env,
        # whose workers Ray would start anew instead of using the ones it starts with.
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        manifest = build_with_ray(f"file://{directory}", "bench", "v1", plan_index_shards(source), show_progress=False)
        seconds = time.perf_counter() - start
        ray.shutdown()
    else:
        store = CacheStore(directory, show_progress=False)
        data: Any = source
        if kind != "yogacache-1proc":
            data = sharded(source, 2 if kind == "yogacache-w2" else 1)
        manifest = store.build("bench", "v1", data)
        seconds = time.perf_counter() - start
    if manifest.num_records != len(source):
        raise RuntimeError(f"{kind} cached {manifest.num_records} records, expected {len(source)}")
    used = None if kind == "yogacache-ray2" else cpu_seconds() - cpu  # Ray's workers are not reaped here
    return {"seconds": seconds, "cpu": used, "records": manifest.num_records, "bytes": manifest.num_bytes}


def _decode_only(kind: str, source: Any, start: float) -> dict[str, Any]:
    """The ceiling rows: the source decoded and dropped, in this process or split in two halves
    between two spawned processes (their start included), as a build's workers would be."""
    from _jpeg import decode_range

    records = len(source)
    if kind == "decode-1proc":
        decoded = decode_range(source.path, 0, records)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        half = records // 2
        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
            decoded = sum(pool.map(decode_range, [source.path] * 2, [0, half], [half, records]))
    return {"seconds": time.perf_counter() - start, "records": records, "bytes": decoded}


def run_one(kind: str, jpegs: str, peers: Optional[str], quick: bool = False) -> dict[str, Any]:
    if kind in SMALL_ROWS:
        try:
            return bench_write.run_fresh(SMALL_ROWS[kind][0], "small", quick)
        except RuntimeError as error:
            return {"error": str(error).strip().splitlines()[-1][:200]}
    directory = tempfile.mkdtemp(prefix=f"bench-build-{kind}-")
    try:
        if kind in ("litdata", "mds"):
            if peers is None:
                return {"error": "peers' virtualenv missing (run bench_torch.py once to create it)"}
            command = [peers, os.path.join(HERE, "_peers_build.py"), kind, "--jpegs", jpegs,
                       "--dir", os.path.join(directory, "out"), "--workers", "2"]
            env = dict(os.environ)
        else:
            command = [sys.executable, __file__, "--measure", kind, "--jpegs", jpegs, "--dir", directory]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, HERE, os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:200]}
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def rows_table(runs: dict[str, list[dict[str, Any]]], records: int, small_records: int) -> str:
    lines = [
        f"| row ({records:,} records of 184x184x3 uint8 + int64, JPEG-decoded; small: {small_records:,} "
        "x 32x32x3 uint8 + int64) | seconds (median) | range | records/s | CPU s |",
        "|---|---:|---:|---:|---:|",
    ]
    labels = {**ROWS, **{kind: label for kind, (_, label) in SMALL_ROWS.items()}}
    for kind, label in labels.items():
        results = runs.get(kind)
        if not results:
            continue
        done = [r for r in results if "error" not in r]
        if not done:
            lines.append(f"| {label} | failed: {results[-1]['error']} | | | |")
            continue
        seconds = [r["seconds"] for r in done]
        cpus = [r["cpu"] for r in done if r.get("cpu") is not None]
        count = done[0]["records"]
        cpu = f"{_median(cpus):.2f}" if cpus else "-"
        lines.append(
            f"| {label} | {_median(seconds):.2f} | {min(seconds):.2f}-{max(seconds):.2f} | "
            f"{count / _median(seconds):,.0f} | {cpu} |"
        )
    return "\n".join(lines)


def ratios(runs: dict[str, list[dict[str, Any]]], row: str, other: str, field: str = "seconds") -> list[float]:
    """The ratio of ``other``'s ``field`` (seconds, or CPU seconds) to ``row``'s in each rep where
    both ran: for seconds, how many times as fast ``row`` ran."""
    pairs = zip(runs.get(row, []), runs.get(other, []))
    return [b[field] / a[field] for a, b in pairs if a.get(field) is not None and b.get(field) is not None]


def targets_table(runs: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| ratio (speed: the other row's seconds / this row's; median of the reps' ratios) | ratio | range "
        "| CPU-time ratio | target | |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for what, row, other, target in TARGETS:
        values = ratios(runs, row, other)
        if not values:
            continue
        ratio = _median(values)
        cpu_values = ratios(runs, row, other, "cpu")
        cpu = f"{_median(cpu_values):.2f}x" if cpu_values else "-"
        verdict = "-" if target is None else ("met" if ratio >= target else "missed")
        goal = "-" if target is None else f">= {target:.2f}x"
        lines.append(
            f"| {what} | {ratio:.2f}x | {min(values):.2f}-{max(values):.2f}x | {cpu} | {goal} | {verdict} |"
        )
    one, two = (runs.get(kind) for kind in ("decode-1proc", "decode-2proc"))
    if one and two:
        gain = _median(ratios(runs, "decode-2proc", "decode-1proc"))
        lines.append("")
        lines.append(f"Ceiling: two processes decode the source {gain:.2f}x as fast as one on this machine.")
    lines.append(
        "The CPU-time ratio is the other row's CPU seconds over this row's: what the ratio tends to when "
        "every core is busy (it counts the work, not whether a second core hid it)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=_data.WORKLOADS["large"]["records"])
    parser.add_argument("--reps", type=int, default=3, help="runs of each row, interleaved; medians are kept")
    every = [*ROWS, *SMALL_ROWS]
    parser.add_argument("--only", default=",".join(every), help="comma-separated rows: " + ", ".join(every))
    parser.add_argument("--quick", action="store_true", help="the small rows with a tenth of their records")
    parser.add_argument("--peers-venv", default=os.path.join(HERE, ".venv-peers"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--jpegs", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.jpegs, args.dir)))
        return
    from _jpeg import write_jpegs

    kinds = args.only.split(",")
    unknown = [kind for kind in kinds if kind not in every]
    if unknown:
        parser.error(f"unknown rows: {', '.join(unknown)}")
    peers = os.path.join(args.peers_venv, "bin", "python")
    work = tempfile.mkdtemp(prefix="bench-build-")
    loads = [os.getloadavg()]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        jpegs = os.path.join(work, "jpegs")
        images, labels = _data.make_arrays(args.records, _data.WORKLOADS["large"]["shape"])
        write_jpegs(jpegs, images, labels)
        del images
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(max(1, args.reps)):
            for kind in kinds:
                result = run_one(kind, jpegs, peers if os.path.exists(peers) else None, args.quick)
                print(f"{kind}: {result}", file=sys.stderr, flush=True)
                runs.setdefault(kind, []).append(result)
            loads.append(os.getloadavg())
        small = _data.WORKLOADS["small"]["records"] // (_data.QUICK_DIVISOR if args.quick else 1)
        load = "; ".join(f"{one:.2f}" for one, _, _ in loads)
        print(f"bench_build.py, {started}, {os.cpu_count()} CPUs, {args.reps} reps interleaved; "
              f"1-minute load average before and after each rep: {load}\n")
        print(rows_table(runs, args.records, small))
        print()
        print(targets_table(runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
