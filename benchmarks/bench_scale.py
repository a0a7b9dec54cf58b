#!/usr/bin/env python
"""Per-process costs against the dataset's size: 10^5 to 10^10 records, yogacache and its peers.

Issue 34 items 4 and 5. For each N, each measurement runs in ``--reps`` fresh processes (3; the
medians are reported; imports before the clock) and reports, from opening the cache to the first
element: the time, the growth of ``RssAnon`` (anonymous resident memory: excludes the mapped cache
files and shared libraries) plus ``RssShmem`` (MosaicML Streaming keeps its epoch's sample ids in
shared memory) of the main process, and of one DataLoader worker from its start to its first batch,
and the resume state's size (``len(json.dumps(state))``). Rows:

* ``shard`` / ``global`` / ``parts``: ``CacheDataRef(reader).stream(shuffle=True,
  shuffle_mode=...)``, its first element; the worker column reads the same order through
  ``yogacache.torch.CacheIterableDataset`` in a ``DataLoader(num_workers=1)``.
* ``mixture``: a 3-way ``yogacache.Mixture`` (weights 0.5/0.3/0.2 of three caches of N records,
  ``epoch_size=N``, at most ``MAX_EPOCH_SIZE``), global order; the worker column as above.
* ``sampler``: ``yogacache.grain.CacheSampler`` (global order): the record of its index 0 read
  through its ``CacheDataSource``, then the keys of its first 1000 indices.
* ``read_cache``: Ray Data's planning without starting Ray (``read_cache`` starts it: 17 s
  on this 2-core machine, no part of the dataset's size): the ``CacheDatasource`` that
  ``read_cache`` makes and its read tasks (one per part, as ``read_cache`` asks by default);
  the first element is the first block of the first task, called in the process (what a Ray
  worker runs).
* ``random``: ``yogacache.torch.CacheDataset[i]`` at uniformly random ``i``, records per second
  over ``--random-reads`` reads (after 1000 warm-up reads), and the memory growth that takes.

Sizes up to 10^8 are real caches (``{"i": int64}`` records, one part per 64 MiB, built once
under ``--workdir`` and reused: 10^7 takes about a minute on 2 cores, 10^8 ten). Larger sizes
(``--synthetic-from``, default 10^9) are synthetic: a cache whose manifest describes N records
in ``--synthetic-parts`` parts (10^4: one open file each, under this machine's limit), every part
a hard link of one real part of N / parts records (format 2's ``first_key``: each part keys its
records from 0). The orders, plans, states and samplers see N records; reads hit one small file
(hot in the page cache), so the random-access rate there is an upper bound, not a measurement of
a 10^9-record disk. The peers get datasets made the same way (one real shard hard-linked).

Peers (``_peers_scale.py``, in ``benchmarks/.venv-peers``, made by ``bench_torch.py``, plus
Hugging Face ``datasets``; Grain's ``IndexSampler`` runs in the project's venv): MosaicML
Streaming's ``StreamingDataset`` (shuffled, its first element), LitData's ``StreamingDataset``
(shuffled), Grain's ``IndexSampler`` (Feistel ``index_shuffle``: its first 1000 indices), and
``datasets.interleave_datasets`` of three Arrow datasets (probabilities 0.5/0.3/0.2), each in a
fresh process. A process that passes ``--mem-cap`` GiB (anon + shmem) or ``--timeout`` seconds
is stopped and its cell says so.

Targets (issue 34 item 4), printed met or missed: from the smallest to the largest N, first
element <= 50 ms and memory growth <= 64 MB + O(parts) (1 KB a part) in every yogacache row and
worker; random access at the largest real N >= 0.8x its rate at the smallest.

Usage::

    .venv/bin/python benchmarks/bench_scale.py [--quick] [--sizes 1e5,1e6,1e7,1e9,1e10]
        [--workdir DIR] [--rows shard,global,...] [--no-peers] [--out results.json]

The table goes to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)  # this checkout's yogacache, here and (PYTHONPATH) in every measurement
PEERS_WORKER = os.path.join(HERE, "_peers_scale.py")
DEFAULT_PEERS_VENV = os.path.join(HERE, ".venv-peers")
DEFAULT_WORKDIR = os.path.join(tempfile.gettempdir(), "yogacache-bench-scale")
MB = 1_000_000
SEED = 7
WEIGHTS = (0.5, 0.3, 0.2)
ROWS = ("shard", "global", "parts", "mixture", "sampler", "read_cache", "random")
PEERS = ("mosaicml", "litdata", "grain", "hf_interleave")
FIRST_TARGET_S = 0.050
OPEN_TARGET_S = 1.0  # issue 34 item 2: a manifest of 10^5 parts opens in <= 1 s
MEMORY_TARGET = 64 * MB
# The yogacache row each peer is compared with, and whether its opening counts.
PEER_ROWS = {
    "mosaicml": ("global", True),
    "litdata": ("global", True),
    "grain": ("sampler", False),
    "hf_interleave": ("mixture", True),
}
PEER_SHARD = 10**5  # records per shard of the peers' datasets
PER_PART = 1000  # bytes of memory a part may cost ("+ O(parts)")
RANDOM_TARGET = 0.8


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- measured in a fresh process ----------------------------------------------------------------


def memory() -> int:
    """RssAnon + RssShmem of this process, in bytes."""
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


def _open(spec: dict[str, Any]) -> Any:
    from yogacache.store.local import CacheStore

    # "size": the synthetic caches' parts are hard links whose stamps would be per name.
    return CacheStore(spec["root"], verify="size", show_progress=False).open(spec["id"], spec["version"])


def _stream_args(mode: str) -> dict[str, Any]:
    return {"shuffle": True, "shuffle_seed": SEED, "shuffle_mode": mode}


def _mixture(spec: dict[str, Any]) -> Any:
    import yogacache

    readers = [_open(spec) for _ in WEIGHTS]
    return yogacache.Mixture(readers, weights=list(WEIGHTS), epoch_size=min(spec["n"], MAX_EPOCH_SIZE))


MAX_EPOCH_SIZE = 2**32  # a mixture's epoch at most (yogacache.Mixture)


def _worker_growth(source: Any, mode: str) -> dict[str, Any]:
    """One DataLoader worker's memory growth from its start to its first batch of 256 (the
    worker plans its share of the order itself)."""
    import torch.utils.data

    from yogacache.torch import CacheIterableDataset

    inner = CacheIterableDataset(
        source, batch_size=256, batched=True, output="numpy", num_shards=1, shard_rank=0, **_stream_args(mode)
    )

    class Probe(torch.utils.data.IterableDataset):  # type: ignore[misc,type-arg]
        def __iter__(self) -> Any:
            before, start = memory(), time.perf_counter()
            batch = next(iter(inner))
            yield {"growth": memory() - before, "first_s": time.perf_counter() - start, "n": len(batch["i"])}

    loader = torch.utils.data.DataLoader(Probe(), batch_size=None, num_workers=1)
    got = next(iter(loader))
    return {"worker_growth": int(got["growth"]), "worker_first_s": float(got["first_s"])}


def child(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement (``kind`` a row) in this fresh process."""
    import numpy as np  # imports before the clock

    import yogacache.store.local
    from yogacache.dataref import CacheDataRef

    out: dict[str, Any] = {}
    if kind == "read_cache":
        import yogacache.ray  # noqa: F401
    elif kind == "sampler":
        import yogacache.grain  # noqa: F401
    else:
        import torch  # noqa: F401

        import yogacache.torch  # noqa: F401
    out["module"] = os.path.dirname(yogacache.store.local.__file__)
    base, start = memory(), time.perf_counter()

    def opened() -> float:
        """Marks the cache open: the first element's clock starts here."""
        now = time.perf_counter()
        out["open_s"] = now - start
        return now

    def done(first: float) -> None:
        out["first_s"] = time.perf_counter() - first
        out["growth"] = memory() - base

    if kind in ("shard", "global", "parts"):
        reader = _open(spec)
        first = opened()
        stream = CacheDataRef(reader).stream(**_stream_args(kind))
        next(iter(stream))
        done(first)
        out["state_bytes"] = len(json.dumps(stream.state_dict(1000)))
        out.update(_worker_growth(_open(spec), kind))  # a reader of its own: the DataLoader forks
    elif kind == "mixture":
        mixture = _mixture(spec)
        first = opened()
        stream = mixture.stream(**_stream_args("global"))
        next(iter(stream))
        done(first)
        out["state_bytes"] = len(json.dumps(stream.state_dict(1000)))
        out.update(_worker_growth(_mixture(spec), "global"))
    elif kind == "sampler":
        from yogacache.grain import CacheDataSource, CacheSampler

        source = CacheDataSource(_open(spec))
        first = opened()
        sampler = CacheSampler(source, num_shards=1, shard_rank=0, **_stream_args("global"))
        source[sampler[0].record_key]
        sampler.record_keys(range(1000))
        done(first)
        out["state_bytes"] = len(json.dumps(sampler.state(1000)))
    elif kind == "read_cache":
        from yogacache.ray import CacheDatasource
        from yogacache.read.options import ReadOptions

        reader = _open(spec)
        first = opened()
        # read_cache's own planning (what it does before handing Ray the datasource), without
        # starting Ray: the datasource, then one read task per part.
        source = CacheDatasource(reader, ReadOptions.from_stream_args(**_stream_args("global")))
        tasks = source.get_read_tasks(len(reader.manifest.parts))
        out["plan_s"] = time.perf_counter() - first
        next(iter(tasks[0]()))
        done(first)
        out["tasks"] = len(tasks)
    elif kind == "random":
        from yogacache.torch import CacheDataset

        dataset = CacheDataset(_open(spec), output="numpy")
        first = opened()
        dataset[0]
        done(first)
        rng = np.random.default_rng(SEED)
        for i in rng.integers(0, len(dataset), 1000).tolist():
            dataset[i]
        reads = rng.integers(0, len(dataset), spec["random_reads"]).tolist()
        begin = time.perf_counter()
        for i in reads:
            dataset[i]
        out["rate"] = len(reads) / (time.perf_counter() - begin)
        out["growth"] = memory() - base
    else:
        raise ValueError(f"unknown row {kind!r}")
    return out


# -- caches ---------------------------------------------------------------------------------------


def real_cache(root: str, n: int) -> dict[str, Any]:
    """The real cache of ``n`` records under ``root`` (built once)."""
    import numpy as np

    from yogacache.store.local import CacheStore

    store = CacheStore(root, show_progress=False)
    version = f"n{n}"
    if not store.exists("real", version):
        log(f"building the real cache of {n:,} records (once; reused from {root})")
        begin = time.perf_counter()
        store.build("real", version, ({"i": np.int64(i)} for i in range(n)))
        log(f"  built in {time.perf_counter() - begin:.1f} s")
    return {
        "root": root,
        "id": "real",
        "version": version,
        "n": n,
        "synthetic": False,
        "parts": len(store.manifest("real", version).parts),
    }


def synthetic_cache(root: str, n: int, parts: int) -> dict[str, Any]:
    """A cache whose manifest describes ``n`` records in ``parts`` parts, every part a hard link
    of one real part of ``n // parts`` records keyed from 0 (format 2's ``first_key``)."""
    import numpy as np

    from yogacache.store.local import CacheStore

    if n % parts:
        raise SystemExit(f"--synthetic-parts {parts} must divide {n}")
    per_part = n // parts
    store = CacheStore(root, part_size_bytes=1 << 40, show_progress=False)
    seed_version = f"r{per_part}"
    if not store.exists("seed", seed_version):
        log(f"building one part of {per_part:,} records for the synthetic caches")
        store.build("seed", seed_version, ({"i": np.int64(i)} for i in range(per_part)))
    version = f"n{n}-p{parts}"
    target = store.cache_dir("synthetic", version)
    if not (target / "manifest.json").exists():
        log(f"laying out the synthetic cache of {n:,} records ({parts:,} hard-linked parts)")
        seed_dir = store.cache_dir("seed", seed_version)
        raw = json.loads((seed_dir / "manifest.json").read_text())
        (part,) = raw["parts"]
        links = [1 + (k // 60_000) for k in range(parts)]  # ext4 allows 65,000 links a file
        target.mkdir(parents=True, exist_ok=True)
        for copy in sorted(set(links)):
            source = seed_dir / part["name"]
            if copy > 1:
                source = target / f".copy-{copy}"
                if not source.exists():
                    with open(seed_dir / part["name"], "rb") as f, open(source, "wb") as g:
                        g.write(f.read())
            for k in [k for k in range(parts) if links[k] == copy]:
                name = target / f"part-{k:05d}.mdb"
                if not name.exists():
                    os.link(source, name)
        raw.update(
            parts=[dict(part, name=f"part-{k:05d}.mdb", first_record=k * per_part, first_key=0) for k in range(parts)],
            num_records=n,
            num_bytes=raw["num_bytes"] * parts,
            format_version=2,
            dataset_id="synthetic",
            dataset_version=version,
        )
        (target / "manifest.json").write_text(json.dumps(raw))
    return {"root": root, "id": "synthetic", "version": version, "n": n, "synthetic": True, "parts": parts}


# -- the orchestrator -----------------------------------------------------------------------------


def run_capped(argv: list[str], timeout: float, cap: int, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Runs ``argv`` (printing one JSON line last), stopping it past ``timeout`` seconds or
    ``cap`` bytes of anon + shmem memory; returns its result or {"error": why}."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=REPO)
        begin, peak, why = time.monotonic(), 0, None
        while process.poll() is None:
            used = _process_memory(process.pid)
            peak = max(peak, used)
            if used > cap:
                why = f"over {cap / 2**30:.0f} GiB after {time.monotonic() - begin:.0f} s"
            elif time.monotonic() - begin > timeout:
                why = f"over {timeout:.0f} s"
            if why:
                process.kill()
                process.wait()
                return {"error": why, "peak": peak}
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            tail = err.read().strip().splitlines()[-1:] or [f"exit {process.returncode}"]
            return {"error": tail[0][:200]}
        result: dict[str, Any] = json.loads(lines[-1])
        return result


def _process_memory(pid: int) -> int:
    """RssAnon + RssShmem of ``pid`` and its children (a DataLoader worker), in bytes."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(each) for each in f.read().split()]
    except OSError:
        pass
    for each in pids:
        try:
            with open(f"/proc/{each}/status") as f:
                for line in f:
                    if line.startswith(("RssAnon:", "RssShmem:")):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def peers_python(venv: str) -> tuple[Optional[str], str]:
    """The peers' interpreter (``bench_torch.peers_python``'s virtualenv) with ``datasets`` added
    the same way on first use; (None, why) on failure."""
    sys.path.insert(0, HERE)
    import bench_torch

    python, why = bench_torch.peers_python(venv)
    if python is None:
        return None, why
    if subprocess.run([python, "-c", "import datasets"], capture_output=True).returncode != 0:
        log(f"installing datasets into {venv}")
        with open(os.path.join(venv, "bench-install.log"), "a") as f:
            done = subprocess.run(
                # transformers (there for MosaicML and LitData) needs huggingface-hub < 1.0
                [python, "-m", "pip", "install", "--disable-pip-version-check", "datasets", "huggingface-hub<1.0"],
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        if done.returncode != 0:
            return python, why + " (datasets failed to install)"
    version = subprocess.run(
        [python, "-c", "import datasets; print(datasets.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    return python, f"{why} datasets {version}"


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each number's median over the fresh processes ``runs`` (the first failure if one failed)."""
    failed = [run for run in runs if "error" in run]
    if failed:
        return failed[0]
    merged = dict(runs[0], reps=len(runs))
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = sorted(run[key] for run in runs)
            merged[key] = values[len(values) // 2]
    return merged


def _commit() -> str:
    """The checkout's commit, marked ``+changes`` when its yogacache/ differs from it."""
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "yogacache"], capture_output=True, text=True)
    return head.stdout.strip() + (" +changes" if dirty.stdout.strip() else "")


def size(text: str) -> int:
    return int(float(text))


def fmt_s(seconds: Optional[float]) -> str:
    if seconds is None:
        return "–"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def fmt_mb(value: Optional[float]) -> str:
    return "–" if value is None else f"{value / MB:.1f} MB"


def cell(result: dict[str, Any], key: str, fmt: Any) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    return str(fmt(result.get(key)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e5,1e6,1e7,1e9,1e10", help="record counts (add 1e8 to build it once)")
    parser.add_argument("--quick", action="store_true", help="10^5 and 10^6 only")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--peers-venv", default=DEFAULT_PEERS_VENV)
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR, help="where the caches persist between runs")
    parser.add_argument("--synthetic-from", type=size, default=10**9)
    parser.add_argument("--synthetic-parts", type=int, default=10_000)
    parser.add_argument("--random-reads", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3, help="fresh processes per row and size; medians reported")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per measurement")
    parser.add_argument("--mem-cap", type=float, default=4.0, help="GiB (anon + shmem) per measurement")
    parser.add_argument("--out")
    parser.add_argument(
        "--combine", nargs="+", metavar="JSON", help="print the table of earlier --out files (rows and peers merged)"
    )
    parser.add_argument("--plot", metavar="PNG", help="also draw memory growth against records (matplotlib)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = child(args.child, json.loads(args.spec))
        print(json.dumps(result), flush=True)
        os._exit(0)

    if args.combine:
        print(combined(args.combine))
        if args.plot:
            plot_memory(merge(args.combine), args.plot)
        return
    if args.quick:
        args.reps = 1
    sizes = [10**5, 10**6] if args.quick else sorted(size(s) for s in args.sizes.split(","))
    rows = [r for r in args.rows.split(",") if r]
    peers = [] if args.no_peers else [p for p in args.peers.split(",") if p]
    root = os.path.join(args.workdir, "caches")
    os.makedirs(root, exist_ok=True)
    cap = int(args.mem_cap * 2**30)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    peers_py, peers_why = (None, "--no-peers") if not peers else peers_python(args.peers_venv)
    log(f"sizes {sizes}; rows {rows}; peers {peers} ({peers_why})")

    results: dict[str, Any] = {
        "sizes": sizes,
        "rows": {},
        "peers": {},
        "peers_versions": peers_why,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "load": os.getloadavg()[0],
    }
    specs = {}
    for n in sizes:
        spec = synthetic_cache(root, n, args.synthetic_parts) if n >= args.synthetic_from else real_cache(root, n)
        spec["random_reads"] = args.random_reads
        specs[n] = spec
    for n in sizes:
        spec = specs[n]
        for row in rows:
            log(f"{row} at {n:,}")
            runs = []
            for _ in range(args.reps):
                argv = [sys.executable, __file__, "--child", row, "--spec", json.dumps(spec)]
                runs.append(run_capped(argv, args.timeout, cap, env))
                if "error" in runs[-1]:
                    break  # a process over the cap or the clock would be again
            result = median_of(runs)
            results["rows"].setdefault(row, {})[str(n)] = result
            log(f"  {result}")
        for peer in peers:
            python = sys.executable if peer == "grain" else peers_py
            if python is None:
                results["peers"].setdefault(peer, {})[str(n)] = {"error": peers_why}
                continue
            log(f"{peer} at {n:,}")
            work = os.path.join(args.workdir, "peers")
            # Shards of 10^5 records (10^4 of them at most, as the synthetic caches).
            parts = min(args.synthetic_parts, max(1, n // PEER_SHARD))
            peer_spec = {"n": n, "work": work, "parts": parts, "seed": SEED, "weights": WEIGHTS}
            argv = [python, PEERS_WORKER, "prepare", peer, json.dumps(peer_spec)]
            result = run_capped(argv, args.timeout * 4, cap)
            if "error" not in result:
                argv[2] = "measure"
                result = run_capped(argv, args.timeout, cap)
            results["peers"].setdefault(peer, {})[str(n)] = result
            log(f"  {result}")
    results["specs"] = {str(n): specs[n] for n in sizes}
    print(report(results, sizes, rows, peers))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot_memory(results, args.plot)


def combined(paths: list[str]) -> str:
    """The report of several ``--out`` files: the rows and peers of each, later files winning."""
    merged = merge(paths)
    sizes = sorted(int(n) for n in merged["specs"])
    rows = [r for r in ROWS if r in merged["rows"]]
    peers = [p for p in PEERS if p in merged["peers"]]
    return report(merged, sizes, rows, peers)


def plot_memory(results: dict[str, Any], path: str) -> None:
    """Memory growth of one process against the records, log-log, one line per row and peer (a
    failed cell ends its line, marked x): where a line rises, that library's cost grows with N."""
    import _plot

    title = "Per-process memory against dataset size (x: failed, over 4 GiB or 60 s)"
    with _plot.figure(path, title=title, xlabel="records in the dataset", ylabel="memory growth per process (MB)",
                      logx=True, logy=True) as axes:
        series = [(f"yogacache {row}", by, "-") for row, by in results["rows"].items() if row != "shard"]
        series.append(("yogacache shard (YogaDL's order)", results["rows"].get("shard", {}), ":"))
        series += [(peer, by, "--") for peer, by in results["peers"].items()]
        for label, by_size, style in series:
            done = sorted((int(n), r) for n, r in by_size.items())
            points = [(n, max(r["growth"], 64 * 1024) / MB) for n, r in done if "error" not in r and "growth" in r]
            if not points:
                continue
            line = axes.plot(*zip(*points), style, marker="o", label=label)[0]
            failed = [n for n, r in done if "error" in r]
            if failed:
                axes.plot([failed[0]], [4096], "x", color=line.get_color(), markersize=10)
        synthetic = [int(n) for n, spec in results.get("specs", {}).items() if spec.get("synthetic")]
        if synthetic:  # what the step there is: the caches' parts, not their records
            parts = max(results["specs"][str(n)].get("parts", 0) for n in synthetic)
            axes.axvspan(min(synthetic) / 1.5, max(synthetic) * 1.5, color="grey", alpha=0.08)
            axes.text(min(synthetic) / 1.4, 0.08, f"synthetic caches of {parts:,} parts: O(parts)", fontsize=7)


def merge(paths: list[str]) -> dict[str, Any]:
    """The rows and peers of several ``--out`` files, later files winning."""
    merged: dict[str, Any] = {"rows": {}, "peers": {}, "specs": {}, "peers_versions": ""}
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        for key in ("rows", "peers"):
            for name, by_size in part[key].items():
                merged[key].setdefault(name, {}).update(by_size)
        merged["specs"].update(part["specs"])
        if part["rows"]:
            merged["commit"], merged["load"] = part.get("commit", "?"), part.get("load", 0)
        if part["peers"]:
            merged["peers_versions"] = part["peers_versions"]
    return merged


def report(results: dict[str, Any], sizes: list[int], rows: list[str], peers: list[str]) -> str:
    specs = results["specs"]
    lines = []
    head = (
        "| row | "
        + " | ".join(f"10^{len(str(n)) - 1}{' (synthetic)' if specs[str(n)]['synthetic'] else ''}" for n in sizes)
        + " |"
    )
    lines += [
        "Opening the cache (or mixture); then the first element; memory growth from before opening "
        "(RssAnon + RssShmem) of the main process / of one DataLoader worker from its start to its "
        "first batch of 256; the resume state's size.",
        "",
        head,
        "|---|" + "---|" * len(sizes),
    ]
    for row in rows:
        got = results["rows"].get(row, {})
        cells = []
        for n in sizes:
            r = got.get(str(n), {"error": "not run"})
            if "error" in r:
                cells.append(f"failed: {short(r['error'])}")
                continue
            text = f"open {fmt_s(r['open_s'])}, first {fmt_s(r['first_s'])}; {fmt_mb(r['growth'])}"
            if "worker_growth" in r:
                text += f" / {fmt_mb(r['worker_growth'])}"
            if "state_bytes" in r:
                text += f"; state {r['state_bytes']} B"
            if "rate" in r:
                text += f"; {r['rate']:,.0f} reads/s"
            if "plan_s" in r:
                text += f"; planned {r['tasks']} tasks in {fmt_s(r['plan_s'])}"
            cells.append(text)
        lines.append(f"| yogacache {row} | " + " | ".join(cells) + " |")
    for peer in peers:
        got = results["peers"].get(peer, {})
        cells = []
        for n in sizes:
            r = got.get(str(n), {"error": "not run"})
            cells.append(
                f"failed: {short(r['error'])}" if "error" in r else f"{fmt_s(r['first_s'])}; {fmt_mb(r['growth'])}"
            )
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")
    lines += ["", f"Peers: {results['peers_versions']}", ""]
    lines += [f"yogacache at {results.get('commit', '?')}, load average {results.get('load', 0):.1f} at the start.", ""]
    lines += targets(results, sizes, rows, peers)
    return "\n".join(lines)


def targets(results: dict[str, Any], sizes: list[int], rows: list[str], peers: list[str]) -> list[str]:
    out = ["Targets (issue 34 item 4):", ""]
    for row in rows:
        got = results["rows"].get(row, {})
        misses: list[str] = []
        for n in sizes:
            r = got.get(str(n), {"error": "not run"})
            if "error" in r:
                misses.append(f"10^{len(str(n)) - 1}: {short(r['error'])}")
                continue
            parts = results["specs"][str(n)]["parts"]
            bound = MEMORY_TARGET + PER_PART * parts
            if r["first_s"] > FIRST_TARGET_S:
                misses.append(f"10^{len(str(n)) - 1}: first {fmt_s(r['first_s'])}")
            if r["open_s"] > OPEN_TARGET_S:
                misses.append(f"10^{len(str(n)) - 1}: open {fmt_s(r['open_s'])}")
            for key in ("growth", "worker_growth"):
                if key in r and r[key] > bound:
                    misses.append(f"10^{len(str(n)) - 1}: {key.replace('_', ' ')} {fmt_mb(r[key])} > {fmt_mb(bound)}")
        verdict = "met" if not misses else "missed (" + "; ".join(misses) + ")"
        out.append(
            f"- {row}: first element <= 50 ms after opening (<= 1 s), memory <= 64 MB + 1 KB/part, "
            f"at every N: {verdict}"
        )
    random = results["rows"].get("random", {})
    real = [n for n in sizes if not results["specs"][str(n)]["synthetic"] and "rate" in random.get(str(n), {})]
    if len(real) >= 2:
        low, high = random[str(real[0])]["rate"], random[str(real[-1])]["rate"]
        ratio = high / low
        out.append(
            f"- random access at 10^{len(str(real[-1])) - 1} >= 0.8x its rate at 10^{len(str(real[0])) - 1}: "
            f"{ratio:.2f}x ({high:,.0f} vs {low:,.0f} reads/s): {'met' if ratio >= RANDOM_TARGET else 'missed'}"
        )
    if peers:
        out += [
            "",
            "Ratios at each N (yogacache's time to the first element, from opening, / the peer's; Grain's "
            "IndexSampler opens nothing, so against the sampler's first element alone; memory growth of "
            "the main process):",
            "",
        ]
        for peer in peers:
            row, with_open = PEER_ROWS[peer]
            ours = results["rows"].get(row, {})
            got = results["peers"].get(peer, {})
            cells = []
            for n in sizes:
                a, b = ours.get(str(n), {}), got.get(str(n), {})
                if "first_s" in a and "first_s" in b:
                    ours_first = a["first_s"] + (a["open_s"] if with_open else 0.0)
                    cells.append(
                        f"{power(n)}: first {ours_first / max(b['first_s'], 1e-9):.2g}x, "
                        f"memory {fmt_mb(a['growth'])} vs {fmt_mb(b['growth'])}"
                    )
                elif "error" in b:
                    cells.append(f"{power(n)}: the peer failed ({short(b['error'])})")
            out.append(f"- {peer} vs yogacache {row}: " + "; ".join(cells) + f" — {_flat(got, sizes)}")
    return out


def _flat(got: dict[str, Any], sizes: list[int]) -> str:
    """Whether a peer's memory stays flat: within 64 MB over every size, none failed."""
    done = [got[str(n)]["growth"] for n in sizes if "growth" in got.get(str(n), {})]
    if len(done) == len(sizes) and max(done) - min(done) <= MEMORY_TARGET:
        return "the peer is flat too"
    return "the peer grows with N"


def power(n: int) -> str:
    return f"10^{len(str(n)) - 1}"


def short(error: str) -> str:
    """An error as a table cell: numpy's allocation failure as its size."""
    found = re.search(r"Unable to allocate ([0-9.]+ \w+)", error)
    return f"cannot allocate {found.group(1)}" if found else error


if __name__ == "__main__":
    main()
