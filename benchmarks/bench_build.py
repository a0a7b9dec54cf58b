"""Parallel build benchmark: a CPU-bound source (JPEG decode of the large records) built by yogacache
with 1 and 2 local workers and with Ray on 2 CPUs, side by side with LitData ``optimize(num_workers=2)``
and MosaicML ``MDSWriter`` on the same source. One run; a table with ratios.

Every measurement runs in a fresh process and times the whole build, start-up of its workers or
Ray cluster included (not the interpreter's start). The JPEGs are encoded once, outside any clock,
and every builder decodes them with Pillow (``_jpeg.py``). The peers run in ``benchmarks/.venv-peers``
(see ``bench_torch.py``); a row they cannot run says why.

Every row is run ``--reps`` times (default 3), the rows interleaved, and its fastest run is kept:
the shared 2-core machines this runs on vary by 30% from one run to the next.

Two ceiling rows decode the source and write nothing, in one process and in two: their ratio is
the most any builder can gain from a second process on the machine it runs on.

Usage: ``python benchmarks/bench_build.py [--records N] [--reps 3] [--only yogacache-w2,...]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import _data  # noqa: E402

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
BASELINE = "yogacache-w1"
ONE_PROCESS = "yogacache-1proc"


def measure(kind: str, jpegs: str, directory: str) -> dict[str, Any]:
    """One yogacache build, in this (fresh) process."""
    from _jpeg import JpegRecords

    from yogacache.parallel import plan_index_shards, sharded
    from yogacache.store.local import CacheStore

    source = JpegRecords(jpegs)
    start = time.perf_counter()
    if kind.startswith("decode-"):
        return _decode_only(kind, source, start)
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
    return {"seconds": seconds, "records": manifest.num_records, "bytes": manifest.num_bytes}


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


def run_one(kind: str, jpegs: str, peers: Optional[str]) -> dict[str, Any]:
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


def table(results: dict[str, dict[str, Any]], records: int) -> str:
    base = results.get(BASELINE, {}).get("seconds")
    single = results.get(ONE_PROCESS, {}).get("seconds")
    lines = [
        f"| builder ({records:,} records of 184x184x3 uint8 + int64, JPEG-decoded) "
        "| seconds | records/s | vs workers=1 | vs one process |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, label in ROWS.items():
        result = results.get(kind)
        if result is None:
            continue
        if "error" in result:
            lines.append(f"| {label} | failed: {result['error']} | | | |")
            continue
        seconds = result["seconds"]
        ratio = f"{base / seconds:.2f}x" if base else "-"
        versus_single = f"{single / seconds:.2f}x" if single else "-"
        lines.append(f"| {label} | {seconds:.2f} | {records / seconds:,.0f} | {ratio} | {versus_single} |")
    one, two = (results.get(kind, {}).get("seconds") for kind in ("decode-1proc", "decode-2proc"))
    if one and two:
        lines.append("")
        lines.append(f"Ceiling: two processes decode the source {one / two:.2f}x as fast as one on this machine.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=_data.WORKLOADS["large"]["records"])
    parser.add_argument("--reps", type=int, default=3, help="runs of each row, interleaved; the fastest is kept")
    parser.add_argument("--only", default=",".join(ROWS), help="comma-separated rows: " + ", ".join(ROWS))
    parser.add_argument("--peers-venv", default=os.path.join(HERE, ".venv-peers"))
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--jpegs", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.jpegs, args.dir)))
        return
    from _jpeg import write_jpegs

    peers = os.path.join(args.peers_venv, "bin", "python")
    work = tempfile.mkdtemp(prefix="bench-build-")
    try:
        jpegs = os.path.join(work, "jpegs")
        images, labels = _data.make_arrays(args.records, _data.WORKLOADS["large"]["shape"])
        write_jpegs(jpegs, images, labels)
        del images
        results: dict[str, dict[str, Any]] = {}
        for _ in range(max(1, args.reps)):
            for kind in args.only.split(","):
                result = run_one(kind, jpegs, peers if os.path.exists(peers) else None)
                print(f"{kind}: {result}", file=sys.stderr, flush=True)
                best = results.get(kind)
                if best is None or "error" in best or result.get("seconds", float("inf")) < best.get("seconds", 0):
                    results[kind] = result
        print(table(results, args.records))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
