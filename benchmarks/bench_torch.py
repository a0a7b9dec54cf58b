#!/usr/bin/env python
"""PyTorch benchmark: shuffled DataLoader reads, yogacache vs MosaicML Streaming and LitData.

For the small (100,000 x uint8[32,32,3] + int64) and large (10,000 x uint8[184,184,3] + int64)
record sets of ``_data.py``, each library gets the same records, built its own way:

* yogacache: ``CacheStore.build`` from the (image, label) tuples (one LMDB part per cache);
* MosaicML Streaming: ``MDSWriter`` with ``ndarray:uint8`` and ``int64`` columns (raw bytes, as
  ours), local shards, read by ``StreamingDataset(local=..., shuffle=True)``;
* LitData: ``litdata.optimize`` of dicts (raw numpy arrays), local, read by
  ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``.

Each reader runs a whole shuffled epoch on one rank through a DataLoader with batch 256 and two
workers (worker start-up included, as a training epoch pays it), ``--epochs`` times in one fresh
process; the best epoch is reported, and every epoch is checked to deliver each record once
(count and label sum). yogacache is read four ways: its YogaDL-compatible ("shard") shuffle and
its global shuffle, each as whole batches made by the dataset (``batched=True``,
``DataLoader(batch_size=None)``) and as single records collated by the DataLoader (what the peers
do).

The peers need their own virtualenv (mosaicml-streaming pins numpy<2.2): ``benchmarks/.venv-peers``
is created on first use with ``pip install mosaicml-streaming litdata torch==2.14.1
torchvision==0.29.1`` (both need torchvision; local wheels; the pip log is
``.venv-peers/bench-install.log``). If it cannot be created, the peers' cells say why and
yogacache is still measured.

Usage::

    .venv/bin/python benchmarks/bench_torch.py [--quick] [--workloads small,large] [--out results.json]
        [--workers 0,1,2,4 --plot docs/img/torch-workers.png]

``--workers`` with a list reads every row at each worker count (the table's rows; the ratios
against the best peer are at the same count); ``--plot`` draws records/s against workers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

PEERS_WORKER = os.path.join(HERE, "_peers.py")
DEFAULT_PEERS_VENV = os.path.join(HERE, ".venv-peers")
# torch + torchvision pairs to try for the peers (both import torchvision). The project's CPU
# build of torch 2.13.0 cannot load torchvision 0.28.0's operators (built for the CUDA one), so
# the pair that works here is 2.14.1 + 0.29.1, with its CUDA libraries (local wheels).
TORCH_PAIRS = [("2.14.1", "0.29.1"), ("2.13.0", "0.28.0")]
PEERS_CHECK = "import streaming, litdata, torchvision, torch; torch.library  # noqa"
MIB = 1 << 20

# (label, mode, batched): how yogacache is read.
YOGACACHE_READERS = [
    ("yogacache shard shuffle, batched", "shard", True),
    ("yogacache global shuffle, batched", "global", True),
    ("yogacache shard shuffle, per record", "shard", False),
    ("yogacache global shuffle, per record", "global", False),
]
PEERS = [("MosaicML Streaming (MDS)", "mds"), ("LitData", "litdata")]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# yogacache worker (runs in this interpreter, in a fresh process per measurement)


def yogacache_build(directory: str, workload: str, records: int) -> dict[str, Any]:
    from yogacache.store.local import CacheStore

    images, labels = _data.make_arrays(records, _data.WORKLOADS[workload]["shape"])
    start = time.perf_counter()
    CacheStore(directory, show_progress=False).build(workload, "v1", list(zip(images, labels)))
    return {"seconds": time.perf_counter() - start}


def yogacache_read(
    directory: str, workload: str, records: int, mode: str, batched: bool, batch: int, workers: int, epochs: int
) -> dict[str, Any]:
    import torch

    from yogacache.dataref import CacheDataRef
    from yogacache.store.local import CacheStore
    from yogacache.torch import CacheDataLoader, CacheIterableDataset

    expected_labels = int(_data.make_arrays(records, _data.WORKLOADS[workload]["shape"])[1].sum())
    ref = CacheDataRef(CacheStore(directory, show_progress=False).open(workload, "v1"))
    dataset = CacheIterableDataset(
        ref, shuffle=True, shuffle_seed=_data.SHUFFLE_SEED, shard_rank=0, num_shards=1,
        shuffle_mode=mode, batch_size=batch, batched=batched,
    )
    loader = CacheDataLoader(dataset, batch_size=None if batched else batch, num_workers=workers)
    results = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        start = time.perf_counter()
        first: Optional[float] = None
        count = label_sum = 0
        for image, label in loader:
            if first is None:
                first = time.perf_counter() - start
            count += len(label)
            label_sum += int(label.sum())
            assert image.dtype == torch.uint8
        seconds = time.perf_counter() - start
        if count != records or label_sum != expected_labels:
            raise RuntimeError(f"yogacache read {count} records (label sum {label_sum}), expected {records}")
        results.append({"seconds": seconds, "first_batch": first, "records": count})
    return {"epochs": results}


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "read"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--mode", default="shard")
    parser.add_argument("--batched", action="store_true")
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    if args.action == "build":
        result = yogacache_build(args.dir, args.workload, args.records)
    else:
        result = yogacache_read(
            args.dir, args.workload, args.records, args.mode, args.batched, args.batch, args.workers, args.epochs
        )
    print(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# orchestration


def run_json(command: list[str], log_path: str, timeout: float, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Runs a worker; its last stdout line is JSON. Raises RuntimeError with the log's tail."""
    with open(log_path, "w") as log_file:
        try:
            done = subprocess.run(
                command, stdout=subprocess.PIPE, stderr=log_file, text=True, timeout=timeout, env=env, cwd=REPO
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"timed out after {timeout:.0f} s (log: {log_path})") from None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        with open(log_path) as f:
            tail = f.read()[-600:].strip().replace("\n", " | ")
        raise RuntimeError(f"exit {done.returncode}: {tail}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def peers_python(venv: str) -> tuple[Optional[str], str]:
    """The peers' interpreter, creating the virtualenv on first use; (None, why) on failure."""
    python = os.path.join(venv, "bin", "python")
    stamp = os.path.join(venv, ".bench-installed")
    if os.path.exists(stamp):
        return python, open(stamp).read().strip()
    log(f"creating {venv} for MosaicML Streaming and LitData (local wheels; a few minutes)")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    install_log = os.path.join(venv, "bench-install.log")
    why = "not tried"
    for torch_version, vision_version in TORCH_PAIRS:
        with open(install_log, "a") as f:
            done = subprocess.run(
                [python, "-m", "pip", "install", "--disable-pip-version-check", "mosaicml-streaming", "litdata",
                 f"torch=={torch_version}", f"torchvision=={vision_version}"],
                stdout=f, stderr=subprocess.STDOUT,
            )
        if done.returncode == 0:
            check = subprocess.run([python, "-c", PEERS_CHECK], capture_output=True, text=True)
            if check.returncode != 0:
                why = f"torch=={torch_version} + torchvision=={vision_version} install but do not import: " + (
                    check.stderr.strip().splitlines() or ["?"]
                )[-1]
                continue
            versions = subprocess.run(
                [python, "-c", "import importlib.metadata as m; print(' '.join(f'{p} {m.version(p)}' for p in "
                 "('mosaicml-streaming', 'litdata', 'torch', 'torchvision', 'numpy')))"],
                capture_output=True, text=True,
            ).stdout.strip()
            with open(stamp, "w") as f:
                f.write(versions)
            return python, versions
        why = f"pip failed for torch=={torch_version} + torchvision=={vision_version} (see {install_log})"
    return None, why


def rate_row(label: str, result: dict[str, Any], records: int, record_bytes: int) -> dict[str, Any]:
    best = min(result["epochs"], key=lambda e: e["seconds"])
    return {
        "reader": label,
        "records_per_s": records / best["seconds"],
        "mib_per_s": records * record_bytes / best["seconds"] / MIB,
        "epoch_s": best["seconds"],
        "first_batch_s": result["epochs"][0]["first_batch"],
        "epochs": result["epochs"],
    }


def measure_workload(
    workload: str, records: int, args: argparse.Namespace, workdir: str, peers: Optional[str], peers_why: str
) -> dict[str, Any]:
    shape = _data.WORKLOADS[workload]["shape"]
    record_bytes = math.prod(shape) + 8
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs, exist_ok=True)
    common = ["--workload", workload, "--records", str(records)]
    me = [sys.executable, os.path.abspath(__file__), "--worker"]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    builds: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []

    yc_dir = os.path.join(workdir, "yogacache")
    log(f"[{workload}] building the yogacache cache")
    builds["yogacache"] = run_json(
        me + ["build", "--dir", yc_dir] + common,
        os.path.join(logs, f"{workload}-build-yogacache.log"),
        args.timeout,
        env,
    )
    peer_dirs = {kind: os.path.join(workdir, kind) for _, kind in PEERS}
    peer_errors: dict[str, str] = {}
    for name, kind in PEERS:
        if peers is None:
            peer_errors[kind] = peers_why
            continue
        log(f"[{workload}] building {name}")
        try:
            builds[kind] = run_json(
                [peers, PEERS_WORKER, "build", kind, "--dir", peer_dirs[kind], "--workers", str(max(args.workers))]
                + common,
                os.path.join(logs, f"{workload}-build-{kind}.log"), args.timeout,
            )
        except RuntimeError as error:
            peer_errors[kind] = str(error)

    def read_rows(workers: int) -> list[dict[str, Any]]:
        """Every reader's row at one DataLoader worker count."""
        reading = ["--batch", str(args.batch), "--workers", str(workers), "--epochs", str(args.epochs)]
        found: list[dict[str, Any]] = []
        for label, mode, batched in YOGACACHE_READERS:
            log(f"[{workload}] reading with {workers} workers: {label}")
            batching = ["--batched"] if batched else []
            command = me + ["read", "--dir", yc_dir, "--mode", mode] + batching + common + reading
            tag = f"{workload}-read-yogacache-{mode}-{'batched' if batched else 'records'}-w{workers}"
            try:
                result = run_json(command, os.path.join(logs, tag + ".log"), args.timeout, env)
                found.append(rate_row(label, result, records, record_bytes))
            except RuntimeError as error:
                found.append({"reader": label, "error": str(error)})
        for name, kind in PEERS:
            if kind in peer_errors:
                found.append({"reader": name, "error": peer_errors[kind]})
                continue
            log(f"[{workload}] reading with {workers} workers: {name}")
            try:
                result = run_json(
                    [peers or "", PEERS_WORKER, "read", kind, "--dir", peer_dirs[kind]] + common + reading,
                    os.path.join(logs, f"{workload}-read-{kind}-w{workers}.log"), args.timeout,
                )
                found.append(rate_row(name, result, records, record_bytes))
            except RuntimeError as error:
                found.append({"reader": name, "error": str(error)})
        return [{**row, "workers": workers} for row in found]

    for workers in args.workers:
        rows += read_rows(workers)
    return {"records": records, "record_bytes": record_bytes, "builds": builds, "rows": rows}


def global_over_shard(rates: dict[str, Any], kind: str) -> str:
    shard = rates.get(f"yogacache shard shuffle, {kind}")
    global_ = rates.get(f"yogacache global shuffle, {kind}")
    return f"{global_ / shard:.2f}" if shard and global_ else "—"


def format_table(results: dict[str, Any]) -> str:
    lines = [
        "| workload | workers | reader | records/s | MiB/s | epoch (s) | first batch (s) | vs best peer |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for workload, result in results["workloads"].items():
        for row in result["rows"]:
            workers = row.get("workers", "")
            if "error" in row:
                lines.append(f"| {workload} | {workers} | {row['reader']} | — | — | — | — | {row['error'][:160]} |")
                continue
            peer_rates = [r["records_per_s"] for r in result["rows"] if not r["reader"].startswith("yogacache")
                          and r.get("workers") == row.get("workers") and "records_per_s" in r]
            ratio = f"{row['records_per_s'] / max(peer_rates):.2f}x" if peer_rates else "—"
            lines.append(
                f"| {workload} | {workers} | {row['reader']} | {row['records_per_s']:,.0f} | {row['mib_per_s']:,.0f} | "
                f"{row['epoch_s']:.2f} | {row['first_batch_s']:.2f} | {ratio} |"
            )
    lines.append("")
    lines.append(
        "| workload | global / shard shuffle (batched) | global / shard shuffle (per record) "
        "| build (s): yogacache / MDS / LitData |"
    )
    lines.append("|---|---:|---:|---|")
    for workload, result in results["workloads"].items():
        most = max(r.get("workers", 0) for r in result["rows"])  # the ratios at the most workers
        rates = {r["reader"]: r.get("records_per_s") for r in result["rows"] if r.get("workers", 0) == most}
        builds = result["builds"]
        build = " / ".join(
            f"{builds[k]['seconds']:.1f}" if k in builds else "—" for k in ("yogacache", "mds", "litdata")
        )
        ratios = [global_over_shard(rates, kind) for kind in ("batched", "per record")]
        lines.append(f"| {workload} | {ratios[0]} | {ratios[1]} | {build} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{_data.QUICK_DIVISOR}x fewer records (smoke run)")
    parser.add_argument("--workloads", default="small,large", help="comma-separated subset of: small, large")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per reader, best reported (default 3)")
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=lambda text: [int(n) for n in text.split(",")], default=[2],
                        help="DataLoader workers (default 2); a list such as 0,1,2,4 reads every row at each")
    parser.add_argument("--workdir", help="where data is built (default: a new temp dir, removed unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="measure yogacache only")
    parser.add_argument("--peers-venv", default=DEFAULT_PEERS_VENV)
    parser.add_argument("--timeout", type=float, default=900, help="per worker process, seconds")
    parser.add_argument("--out", help="also write every number as JSON")
    parser.add_argument("--plot", metavar="PNG", help="also draw records/s against DataLoader workers (matplotlib)")
    args = parser.parse_args()

    peers, peers_why = (None, "--no-peers") if args.no_peers else peers_python(args.peers_venv)
    workdir = tempfile.mkdtemp(prefix="bench-torch-", dir=args.workdir)
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "peers": peers_why if peers else f"unavailable: {peers_why}",
        "workloads": {},
    }
    try:
        for workload in args.workloads.split(","):
            records = _data.WORKLOADS[workload]["records"] // (_data.QUICK_DIVISOR if args.quick else 1)
            results["workloads"][workload] = measure_workload(
                workload, records, args, os.path.join(workdir, workload), peers, peers_why
            )
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    workers = ", ".join(map(str, args.workers))
    print(f"Machine: {results['machine']}; batch {args.batch}, {workers} DataLoader workers, one rank, "
          f"best of {args.epochs} epochs{' (quick)' if args.quick else ''}")
    print(f"Peers: {results['peers']}\n")
    print(format_table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    if args.plot:
        plot_workers(results, args.plot)


def plot_workers(results: dict[str, Any], path: str) -> None:
    """Records/s against DataLoader workers, one line per reader and workload: where a line flattens,
    the loader's workers no longer add throughput (on this machine's cores)."""
    import _plot

    title = f"Shuffled epoch through a DataLoader against its workers ({results['machine']})"
    with _plot.figure(path, title=title, xlabel="DataLoader workers", ylabel="records/s (best epoch)",
                      logy=True) as axes:
        for style, (workload, result) in zip(("-", "--", ":"), results["workloads"].items()):
            for reader in dict.fromkeys(row["reader"] for row in result["rows"]):
                points = [(row["workers"], row["records_per_s"]) for row in result["rows"]
                          if row["reader"] == reader and "records_per_s" in row]
                if points:
                    axes.plot(*zip(*sorted(points)), style, marker="o", label=f"{workload}: {reader}")
        axes.set_xticks(sorted({row["workers"] for result in results["workloads"].values() for row in result["rows"]}))


if __name__ == "__main__":
    main()
