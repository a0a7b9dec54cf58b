#!/usr/bin/env python
"""Core benchmark: yogacache vs YogaDL 0.1.4, raw lmdb and tf.data ``cache``/``snapshot``.

One invocation measures, for a small-record (100k x 32x32x3) and a large-record
(10k x 184x184x3) workload of uint8 images with int64 labels:

1. shuffled, sharded read rate through tf.data (shard 0 of 2, ``shuffle_seed=7``,
   ``make_tf_dataset(stream).batch(256).prefetch(2)``), vs YogaDL and vs the read pass of
   tf.data's ``cache(filename)`` and ``snapshot(path)``;
2. cache build rate from the tf.data source vs consuming the source alone and vs YogaDL, the
   same for a source that decodes JPEGs (as image pipelines do), and from an in-memory list
   of numpy tuples vs a raw lmdb ``putmulti(append=True)``;
3. cache-hit time to the first batch (fresh process, imports excluded) vs YogaDL and vs the
   same pipeline fed by ``tf.data.Dataset.from_generator`` over in-memory arrays;
4. anonymous memory (``RssAnon``) the reader adds while opening and iterating a shuffled stream
   over 1M tiny records, vs YogaDL.

Every measurement runs in a fresh worker process (``_worker.py``): yogacache, tf.data and raw
lmdb in this interpreter's environment, YogaDL 0.1.4 in its own virtualenv
(``benchmarks/.venv-yogadl``), created with pip on first use.

Usage::

    .venv/bin/python benchmarks/bench_core.py [--quick] [--out results.json]

The table goes to stdout; progress and worker log locations go to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

WORKER = os.path.join(HERE, "_worker.py")
DEFAULT_YOGADL_VENV = os.path.join(HERE, ".venv-yogadl")
YOGADL_VERSION = "0.1.4"

MIB = 1 << 20


# ---------------------------------------------------------------------------------------------
# options and context


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Benchmark yogacache against YogaDL 0.1.4, raw lmdb and tf.data cache/snapshot."
    )
    parser.add_argument("--quick", action="store_true", help=f"{_data.QUICK_DIVISOR}x fewer records (smoke run)")
    parser.add_argument("--out", help="also write all results as JSON to this file")
    parser.add_argument(
        "--workdir", help="directory for temporary caches (default: a new temp dir; removed at the end)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory (caches, logs)")
    parser.add_argument(
        "--workloads",
        default="small,large,memory",
        help="comma-separated subset of: small, large, memory (default: all)",
    )
    parser.add_argument("--no-yogadl", action="store_true", help="skip YogaDL (no virtualenv needed)")
    parser.add_argument(
        "--yogadl-venv",
        default=DEFAULT_YOGADL_VENV,
        help="virtualenv for YogaDL 0.1.4, created on first use (default: benchmarks/.venv-yogadl)",
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of each throughput measurement in its process; best reported (default 3, quick 1)",
    )
    parser.add_argument(
        "--read-reps",
        type=int,
        default=None,
        help="warm read passes per library and workload; best and median reported (default 5, quick 2)",
    )
    parser.add_argument(
        "--ttfe-reps",
        type=int,
        default=None,
        help="fresh processes per time-to-first-batch measurement; median reported (default 5, quick 1)",
    )
    parser.add_argument(
        "--ttfe-cold",
        action="store_true",
        help="time to first batch with the cache evicted from the page cache (default: read into it first)",
    )
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each worker, wait up to SECONDS for other processes to leave the CPUs idle",
    )
    parser.add_argument(
        "--timeout", type=int, default=None, help="per-worker timeout in seconds (default 900, quick 300)"
    )
    args = parser.parse_args(argv)
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {"small", "large", "memory"})
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    args.workload_list = wanted
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.read_reps is None:
        args.read_reps = 2 if args.quick else 5
    if args.ttfe_reps is None:
        args.ttfe_reps = 1 if args.quick else 5
    if args.timeout is None:
        args.timeout = 300 if args.quick else 900
    return args


@dataclass
class Context:
    args: argparse.Namespace
    workdir: str
    main_python: str
    yogadl_python: Optional[str]
    yogadl_reason: str
    results: dict[str, Any] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _workloads(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    div = _data.QUICK_DIVISOR if args.quick else 1
    out = {}
    for name in ("small", "large"):
        if name in args.workload_list:
            spec = _data.WORKLOADS[name]
            out[name] = {"records": spec["records"] // div, "shape": list(spec["shape"]), "reps": args.reps}
    return out


def _memory_records(args: argparse.Namespace) -> int:
    return _data.MEMORY_RECORDS // (_data.QUICK_DIVISOR if args.quick else 1)


# ---------------------------------------------------------------------------------------------
# environments


def _tensorflow_version() -> Optional[str]:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("tensorflow-cpu", "tensorflow", "tensorflow-intel"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def ensure_yogadl_python(args: argparse.Namespace) -> tuple[Optional[str], str]:
    """The YogaDL venv's python (creating/filling the venv if needed), or ``None`` and why."""
    if args.no_yogadl:
        return None, "skipped (--no-yogadl)"
    venv = os.path.abspath(args.yogadl_venv)
    python = os.path.join(venv, "bin", "python")
    tf_version = _tensorflow_version()
    if tf_version is None:
        return None, "TensorFlow is not installed in the main environment"
    requirements = [f"yogadl=={YOGADL_VERSION}", "lmdb<2", "websockets<14", f"tensorflow-cpu=={tf_version}"]
    marker = os.path.join(venv, ".bench-requirements.json")
    try:
        with open(marker) as f:
            if json.load(f) == requirements and os.path.exists(python):
                return python, "ok"
    except (OSError, ValueError):
        pass
    log_path = os.path.join(venv, "bench-install.log")
    try:
        if not os.path.exists(python):
            _log(f"creating YogaDL virtualenv {venv}")
            subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, text=True)
        _log(f"installing {' '.join(requirements)} into {venv} (log: {log_path})")
        with open(log_path, "w") as log:
            proc = subprocess.run(
                [python, "-m", "pip", "install", "--disable-pip-version-check", *requirements],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=1800,
            )
        if proc.returncode != 0:
            return None, f"pip install failed (rc={proc.returncode}): {_tail_error(log_path)}"
        check = subprocess.run(
            [python, "-c", "import yogadl.storage, yogadl.tensorflow"],
            capture_output=True,
            text=True,
            timeout=300,
            env=_worker_env(main=False),
        )
        if check.returncode != 0:
            last = (check.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"yogadl does not import in {venv}: {last}"
    except subprocess.CalledProcessError as exc:
        return None, f"cannot create virtualenv {venv}: {(exc.stderr or '').strip()[-300:]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot set up {venv}: {type(exc).__name__}: {exc}"
    with open(marker, "w") as f:
        json.dump(requirements, f)
    return python, "ok"


def _worker_env(main: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if not main:
        env.pop("PYTHONPATH", None)
    elif importlib.util.find_spec("yogacache") is None:
        # Not installed (yet): let the workers import it from the source checkout.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _tail_error(log_path: str, lines: int = 40) -> str:
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
    except OSError:
        return "(no log)"
    for line in reversed(tail):
        if "Error" in line or "error" in line:
            return line.strip()[:300]
    return (tail[-1].strip() if tail else "(empty log)")[:300]


# ---------------------------------------------------------------------------------------------
# running workers


def _cpu_busy(interval: float = 0.3) -> Optional[float]:
    """Fraction of all CPUs' time spent busy over ``interval`` (Linux; None elsewhere)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return idle, sum(fields[:8])

    try:
        idle0, total0 = sample()
        time.sleep(interval)
        idle1, total1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return None if total <= 0 else 1.0 - (idle1 - idle0) / total


BUSY_THRESHOLD = 0.2


def _wait_for_idle(ctx: Context) -> Optional[float]:
    """CPU busy fraction just before a worker starts; waits for quiet when ``--wait-idle``."""
    deadline = time.monotonic() + max(0.0, ctx.args.wait_idle)
    busy = _cpu_busy()
    while busy is not None and busy > BUSY_THRESHOLD and time.monotonic() < deadline:
        time.sleep(2.0)
        busy = _cpu_busy()
    return busy


def run_worker(ctx: Context, label: str, python: Optional[str], tasks: list[dict[str, Any]]) -> None:
    """Runs ``tasks`` in one fresh process of ``python``; stores each task's result by key."""
    if not tasks:
        return
    if python is None:
        for t in tasks:
            ctx.results[t["key"]] = {"ok": False, "error": f"YogaDL unavailable: {ctx.yogadl_reason}"}
        return
    logs = os.path.join(ctx.workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    result_path = os.path.join(logs, f"{label}.json")
    log_path = os.path.join(logs, f"{label}.log")
    busy = _wait_for_idle(ctx)
    busy_text = "" if busy is None else f" (CPUs {busy:.0%} busy before start)"
    _log(f"{label}: {', '.join(t['key'] for t in tasks)}{busy_text}")
    t0 = time.perf_counter()
    status = "ok"
    try:
        with open(log_path, "w") as log:
            proc = subprocess.run(
                [python, WORKER, result_path, json.dumps(tasks)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_worker_env(main=python == ctx.main_python),
                cwd=ctx.workdir,
                timeout=ctx.args.timeout,
            )
        if proc.returncode != 0:
            status = f"worker exited with rc={proc.returncode}: {_tail_error(log_path)}"
    except subprocess.TimeoutExpired:
        status = f"worker timed out after {ctx.args.timeout}s"
    wall = time.perf_counter() - t0
    try:
        with open(result_path) as f:
            got = json.load(f)
    except (OSError, ValueError):
        got = {}
    for t in tasks:
        res = got.get(t["key"])
        if res is None:
            res = {"ok": False, "error": f"no result ({status}; log: {log_path})"}
        ctx.results[t["key"]] = res
        if not res.get("ok"):
            _log(f"  {t['key']} FAILED: {res.get('error')}")
    ctx.workers.append(
        {
            "label": label,
            "python": python,
            "wall_seconds": wall,
            "status": status,
            "cpu_busy_before": busy,
            "loadavg_after": os.getloadavg(),
        }
    )
    _log(f"{label}: done in {wall:.1f}s")


def run_all(ctx: Context) -> None:
    args = ctx.args
    wl = _workloads(args)
    w = ctx.workdir
    main_py, ydl_py = ctx.main_python, ctx.yogadl_python

    def d(*parts: str) -> str:
        return os.path.join(w, *parts)

    # 1. tf.data-only and raw-lmdb baselines (main environment).
    tasks = []
    for name, spec in wl.items():
        tasks += [
            {"task": "source_consume", "key": f"source/{name}", **spec},
            {"task": "source_consume", "key": f"source_jpeg/{name}", "jpeg": True, **spec},
            {
                "task": "tf_cache",
                "key": f"tf_cache/{name}",
                "dir": d(name, "tf-cache"),
                "cleanup": True,
                **spec,
            },
            {
                "task": "tf_snapshot",
                "key": f"tf_snapshot/{name}",
                "dir": d(name, "tf-snapshot"),
                "cleanup": True,
                **spec,
            },
            {
                "task": "lmdb_append",
                "key": f"lmdb/{name}",
                "path": d(name, "lmdb", "raw.mdb"),
                "cleanup": True,
                **spec,
            },
        ]
    run_worker(ctx, "tfdata-lmdb", main_py, tasks)

    # 2. Builds: yogacache (tf.data source and in-memory list), then YogaDL.
    mem_n = _memory_records(args)
    memory = "memory" in args.workload_list
    for lib, python in (("yogacache", main_py), ("yogadl", ydl_py)):
        tasks = [
            {
                "task": "build_tf",
                "key": f"build/{lib}/{name}",
                "lib": lib,
                "dir": d(name, lib),
                "dataset_id": name,
                **spec,
            }
            for name, spec in wl.items()
        ]
        if lib == "yogacache":
            tasks += [
                {
                    "task": "build_tf",
                    "key": f"build_jpeg/{lib}/{name}",
                    "lib": lib,
                    "dir": d(name, f"{lib}-jpeg"),
                    "dataset_id": name,
                    "jpeg": True,
                    **spec,
                }
                for name, spec in wl.items()
            ]
            tasks += [
                {
                    "task": "build_mem",
                    "key": f"build_mem/{lib}/{name}",
                    "lib": lib,
                    "dir": d(name, f"{lib}-mem"),
                    "dataset_id": name,
                    "cleanup": True,
                    **spec,
                }
                for name, spec in wl.items()
            ]
        if memory:
            tasks.append(
                {
                    "task": "mem_build",
                    "key": f"mem_build/{lib}",
                    "lib": lib,
                    "dir": d("memory", lib),
                    "dataset_id": "tiny",
                    "records": mem_n,
                }
            )
        run_worker(ctx, f"build-{lib}", python, tasks)

    # 3. Shuffled sharded reads (fresh process per library), then reader memory (fresh process).
    for lib, python in (("yogacache", main_py), ("yogadl", ydl_py)):
        tasks = [
            {
                "task": "read",
                "key": f"read/{lib}/{name}",
                "lib": lib,
                "dir": d(name, lib),
                "dataset_id": name,
                **spec,
                "reps": args.read_reps,
            }
            for name, spec in wl.items()
        ]
        if lib == "yogacache":  # the same read, batched element by element (no rebatching)
            tasks += [
                dict(task, key=task["key"].replace("read/", "read_elements/"), per_element=True)
                for task in tasks
            ]
        run_worker(ctx, f"read-{lib}", python, tasks)
        if memory:
            run_worker(
                ctx,
                f"memory-{lib}",
                python,
                [
                    {
                        "task": "mem_read",
                        "key": f"mem_read/{lib}",
                        "lib": lib,
                        "dir": d("memory", lib),
                        "dataset_id": "tiny",
                        "records": mem_n,
                    }
                ],
            )

    # 4. Cache-hit time to first batch: one fresh process per measurement, modes interleaved.
    for rep in range(args.ttfe_reps):
        for name, spec in wl.items():
            for mode, python in (("yogacache", main_py), ("yogadl", ydl_py), ("generator", main_py)):
                dir_ = d(name, mode) if mode != "generator" else d(name)
                run_worker(
                    ctx,
                    f"ttfe-{mode}-{name}-{rep}",
                    python,
                    [
                        {
                            "task": "ttfe",
                            "key": f"ttfe/{mode}/{name}/{rep}",
                            "mode": mode,
                            "dir": dir_,
                            "dataset_id": name,
                            "cold": args.ttfe_cold,
                            **spec,
                        }
                    ],
                )
    for name in wl:
        for mode in ("yogacache", "yogadl", "generator"):
            runs = [ctx.results.get(f"ttfe/{mode}/{name}/{rep}", {}) for rep in range(args.ttfe_reps)]
            ok = [r["ms"] for r in runs if r.get("ok")]
            if ok:
                ctx.results[f"ttfe/{mode}/{name}"] = {"ok": True, "ms": statistics.median(ok), "all_ms": ok}
            else:
                errs = [r.get("error", "not run") for r in runs]
                ctx.results[f"ttfe/{mode}/{name}"] = {"ok": False, "error": errs[0] if errs else "not run"}


# ---------------------------------------------------------------------------------------------
# table


class Missing:
    def __init__(self, why: str) -> None:
        self.why = why


def _get(results: dict[str, Any], key: str, fieldname: str) -> Any:
    r = results.get(key)
    if r is None:
        return Missing("not run")
    if not r.get("ok"):
        return Missing(str(r.get("error", "failed")))
    value = r.get(fieldname)
    return Missing(f"no {fieldname}") if value is None else value


def _fmt(value: Any, unit: str) -> str:
    if isinstance(value, Missing):
        why = value.why
        if why.startswith("YogaDL unavailable"):
            return "n/a: YogaDL unavailable (see header)"
        return "n/a: " + (why if len(why) <= 70 else why[:67] + "...")
    if unit == "rec/s":
        return f"{value:,.0f} rec/s"
    if unit == "ms":
        return f"{value:,.1f} ms"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    return f"{value}"


def _row(
    metric: str,
    workload: str,
    yc: Any,
    peer: Any,
    unit: str,
    target: Optional[tuple[str, float]] = None,
) -> dict[str, Any]:
    have = not isinstance(yc, Missing) and not isinstance(peer, Missing)
    ratio = (yc / peer) if have and peer else None
    ratio_text = f"{ratio:.2f}x" if ratio is not None else "n/a"
    status = None
    target_text = "(info)"
    if target is not None:
        kind, bound = target
        if kind == "min_ratio":
            target_text = f">= {bound:g}x"
            status = None if ratio is None else ratio >= bound
        elif kind == "max_ratio":
            target_text = f"<= {bound:g}x"
            status = None if ratio is None else ratio <= bound
        elif kind == "max_delta":
            target_text = f"<= peer + {bound:g} {unit}"
            if have:
                delta = yc - peer
                ratio_text += f" ({delta:+.1f} {unit})"
                status = delta <= bound
        elif kind == "max_abs":
            target_text = f"<= {bound:g} {unit}"
            status = None if isinstance(yc, Missing) else yc <= bound
        target_text += {True: " PASS", False: " FAIL", None: " n/a"}[status]
    return {
        "metric": metric,
        "workload": workload,
        "yogacache": _fmt(yc, unit),
        "peer": _fmt(peer, unit),
        "ratio": ratio_text,
        "target": target_text,
        "unit": unit,
        "yogacache_value": None if isinstance(yc, Missing) else yc,
        "peer_value": None if isinstance(peer, Missing) else peer,
        "ratio_value": ratio,
        "pass": status,
    }


def _label(name: str, spec: dict[str, Any]) -> str:
    return f"{name} ({spec['records']:,} x {'x'.join(map(str, spec['shape']))})"


READ_TARGETS = {"small": 30.0, "large": 5.0}


def build_rows(ctx: Context) -> list[dict[str, Any]]:
    r = ctx.results
    rows = []
    wl = _workloads(ctx.args)
    for name, spec in wl.items():
        label = _label(name, spec)
        yc_read = _get(r, f"read/yogacache/{name}", "rate")
        rows += [
            _row(
                "1. shuffled sharded read vs YogaDL 0.1.4",
                label,
                yc_read,
                _get(r, f"read/yogadl/{name}", "rate"),
                "rec/s",
                ("min_ratio", READ_TARGETS[name]),
            ),
            _row(
                "1. shuffled sharded read, median warm pass, vs YogaDL 0.1.4",
                label,
                _get(r, f"read/yogacache/{name}", "median_rate"),
                _get(r, f"read/yogadl/{name}", "median_rate"),
                "rec/s",
            ),
            _row(
                "1. shuffled sharded read, first pass from a cold page cache, vs YogaDL 0.1.4",
                label,
                _get(r, f"read/yogacache/{name}", "cold_rate"),
                _get(r, f"read/yogadl/{name}", "cold_rate"),
                "rec/s",
            ),
            _row(
                "1. shuffled sharded read vs tf.data cache(file) read pass",
                label,
                yc_read,
                _get(r, f"tf_cache/{name}", "read_rate"),
                "rec/s",
                ("min_ratio", 1.0) if name == "small" else None,  # issue 8, item 7
            ),
            _row(
                "1. shuffled sharded read, a new pipeline built inside each pass, vs tf.data cache(file)",
                label,
                _get(r, f"read/yogacache/{name}", "fresh_rate"),
                _get(r, f"tf_cache/{name}", "read_rate"),
                "rec/s",
            ),
            _row(
                "1. shuffled sharded read, element by element (a map before batch), vs tf.data cache(file)",
                label,
                _get(r, f"read_elements/yogacache/{name}", "rate"),
                _get(r, f"tf_cache/{name}", "read_rate"),
                "rec/s",
            ),
            _row(
                "1. shuffled sharded read vs tf.data snapshot read pass",
                label,
                yc_read,
                _get(r, f"tf_snapshot/{name}", "read_rate"),
                "rec/s",
            ),
        ]
        yc_build = _get(r, f"build/yogacache/{name}", "rate")
        rows += [
            _row(
                "2. build from tf.data vs consuming the source",
                label,
                yc_build,
                _get(r, f"source/{name}", "rate"),
                "rec/s",
                ("min_ratio", 0.8),
            ),
            _row(
                "2. build from a JPEG-decoding tf.data source vs consuming that source",
                label,
                _get(r, f"build_jpeg/yogacache/{name}", "rate"),
                _get(r, f"source_jpeg/{name}", "rate"),
                "rec/s",
                ("min_ratio", 0.8),
            ),
            _row(
                "2. build from tf.data vs YogaDL 0.1.4 build",
                label,
                yc_build,
                _get(r, f"build/yogadl/{name}", "rate"),
                "rec/s",
            ),
            _row(
                "2. build from tf.data vs tf.data cache(file) write pass",
                label,
                yc_build,
                _get(r, f"tf_cache/{name}", "write_rate"),
                "rec/s",
            ),
            _row(
                "2. build from in-memory list vs raw lmdb putmulti append",
                label,
                _get(r, f"build_mem/yogacache/{name}", "rate"),
                _get(r, f"lmdb/{name}", "rate"),
                "rec/s",
                ("min_ratio", 0.5),
            ),
        ]
        yc_ttfe = _get(r, f"ttfe/yogacache/{name}", "ms")
        rows += [
            _row(
                "3. cache-hit time to first batch vs YogaDL 0.1.4",
                label,
                yc_ttfe,
                _get(r, f"ttfe/yogadl/{name}", "ms"),
                "ms",
                ("max_ratio", 0.5),
            ),
            _row(
                "3. cache-hit time to first batch vs in-memory from_generator",
                label,
                yc_ttfe,
                _get(r, f"ttfe/generator/{name}", "ms"),
                "ms",
                ("max_delta", 10.0),
            ),
        ]
    if "memory" in ctx.args.workload_list:
        label = f"tiny ({_memory_records(ctx.args):,} x int64)"
        rows.append(
            _row(
                "4. reader RssAnon growth (open + iterate shuffled stream) vs YogaDL 0.1.4",
                label,
                _get(r, "mem_read/yogacache", "rss_anon_peak_delta_mib"),
                _get(r, "mem_read/yogadl", "rss_anon_peak_delta_mib"),
                "MiB",
                ("max_abs", 64.0),
            )
        )
    return rows


COLUMNS = ("metric", "workload", "yogacache", "peer", "ratio", "target")


def format_table(rows: list[dict[str, Any]]) -> str:
    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(cell(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def _notes(ctx: Context) -> list[str]:
    notes = []
    for key in sorted(ctx.results):
        res = ctx.results[key]
        per_rep_ttfe = key.startswith("ttfe/") and key.count("/") == 3
        if not res.get("ok") and not per_rep_ttfe:
            error = str(res.get("error"))
            if error.startswith("YogaDL unavailable"):
                continue  # said once, in the header
            notes.append(f"- `{key}`: {error}")
    return notes


def _versions(ctx: Context) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {"python": platform.python_version(), "tensorflow": _tensorflow_version()}
    for dist in ("yogacache", "lmdb", "numpy", "msgpack"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    out["yogadl"] = YOGADL_VERSION if ctx.yogadl_python else None
    out["yogacache_source_sha256"] = _source_digest()
    return out


def _source_digest() -> Optional[str]:
    """SHA-256 over yogacache's .py files (as imported by the workers), to tell runs apart."""
    import hashlib

    spec = importlib.util.find_spec("yogacache")
    roots = list(spec.submodule_search_locations or []) if spec else []
    if not roots and os.path.isdir(os.path.join(REPO, "yogacache")):
        roots = [os.path.join(REPO, "yogacache")]
    if not roots:
        return None
    digest = hashlib.sha256()
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    digest.update(os.path.relpath(path, root).encode() + b"\0")
                    with open(path, "rb") as f:
                        digest.update(f.read())
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# main


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = time.perf_counter()
    if args.workdir:
        os.makedirs(args.workdir, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix="yogacache-bench-", dir=args.workdir)
    else:
        workdir = tempfile.mkdtemp(prefix="yogacache-bench-")
    _log(f"work directory: {workdir}")
    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        _log(f"warning: load average is {load_start[0]:.2f} before starting; timings will be noisy")
    try:
        ydl_python, ydl_reason = ensure_yogadl_python(args)
        if ydl_python is None:
            _log(f"YogaDL will not run: {ydl_reason}")
        ctx = Context(args, workdir, sys.executable, ydl_python, ydl_reason)
        run_all(ctx)
        rows = build_rows(ctx)
    finally:
        if args.keep:
            _log(f"kept work directory {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    total = time.perf_counter() - t_start
    versions = _versions(ctx)
    config = {
        "quick": args.quick,
        "workloads": _workloads(args),
        "memory_records": _memory_records(args) if "memory" in args.workload_list else None,
        "batch": _data.BATCH,
        "prefetch": _data.PREFETCH,
        "shuffle_seed": _data.SHUFFLE_SEED,
        "shard": [_data.SHARD_RANK, _data.NUM_SHARDS],
        "reps": args.reps,
        "read_reps": args.read_reps,
        "ttfe_reps": args.ttfe_reps,
        "ttfe_page_cache": "cold" if args.ttfe_cold else "warm",
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "versions": versions,
        "yogadl": ctx.yogadl_reason,
        "total_seconds": total,
    }

    print(f"# yogacache core benchmark{' (--quick)' if args.quick else ''}\n")
    print(
        f"python {versions['python']}, tensorflow {versions['tensorflow']}, "
        f"yogacache {versions['yogacache']} (source {versions['yogacache_source_sha256']}), "
        f"YogaDL {YOGADL_VERSION} ({ctx.yogadl_reason}), "
        f"lmdb {versions['lmdb']}, {os.cpu_count()} CPUs, load average at start "
        f"{load_start[0]:.2f}; best of {args.read_reps} read / {args.reps} other passes per throughput; "
        f"total {total:.0f}s\n"
    )
    print(format_table(rows))
    notes = _notes(ctx)
    if notes:
        print("\nFailures:\n" + "\n".join(notes))
    contended = [
        f"{w['label']} ({w['cpu_busy_before']:.0%})"
        for w in ctx.workers
        if w["cpu_busy_before"] is not None and w["cpu_busy_before"] > BUSY_THRESHOLD
    ]
    if contended:
        print(
            f"\nWarning: other processes kept the CPUs over {BUSY_THRESHOLD:.0%} busy just before "
            f"{len(contended)} of {len(ctx.workers)} workers started, so their timings are noisy "
            f"(--wait-idle SECONDS waits for quiet): {', '.join(contended)}"
        )
    page_cache = "cold" if args.ttfe_cold else "warm"
    print(
        "\nratio = yogacache / peer (rates: higher is better; times and memory: lower is better). "
        "Reads: shard 0 of 2, shuffle_seed=7, batch(256).prefetch(2); tf.data cache/snapshot read the "
        f"whole dataset unshuffled. Read rates: best (or median) of {args.read_reps} warm passes, cache files "
        "read into the page cache first; the cold pass evicts them first. Build and other rates: best of "
        f"{args.reps} passes. Time to first batch: median of {args.ttfe_reps} fresh processes, imports "
        f"excluded, page cache {page_cache}."
    )
    report = {"config": config, "rows": rows, "results": ctx.results, "workers": ctx.workers}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        _log(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
    sys.exit(0)
