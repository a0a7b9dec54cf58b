#!/usr/bin/env python
"""GPU-feed benchmark: can a DataLoader keep a GPU at its synthetic-data rate? (issue 24, item 1)

Records: N x (uint8[184,184,3] image, int64 label) from ``_data.make_arrays`` (the "large"
workload's shape), written once, outside any clock, into a yogacache cache, an MDS dataset
(MosaicML ``MDSWriter``) and a LitData dataset (``litdata.optimize``), all on local disk.

Feeds, each read through a torch DataLoader, shuffled, batch 256, in a fresh process (imports
and dataset opening outside the clock; the first ``--warmup`` batches, worker start-up
included, outside it too; then ``--batches`` batches are timed, epochs wrapping as needed):

* ``batched``: yogacache's batched read path (``CacheIterableDataset(batched=True)``,
  ``CacheDataLoader(batch_size=None)``): one LMDB read and one stacked tensor per batch;
* ``records``: yogacache per record (``batched=False``, ``CacheDataLoader(batch_size=256)``):
  the DataLoader collates per-record tuples, as most PyTorch code reads;
* ``mds``: MosaicML ``StreamingDataset(local=..., shuffle=True)`` + DataLoader (collated dicts);
* ``litdata``: LitData ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``;
* ``ceiling``: the same bytes fancy-indexed out of one in-memory numpy array (made before the
  workers fork, so shared with them) by a shuffled index, one torch batch per index block, through
  the same DataLoader and workers (``batch_size=None``): what any loader pays for the gather and
  the worker-to-main copy, and nothing else;
* ``synthetic`` (GPU mode only): one batch already on the GPU, reused every step.

``--cpu`` (the always-on measure, for a small machine): loader only, records/s with
``--workers`` (default 2) workers, the median of ``--repeats`` (default 3) runs of each row,
interleaved (warm-up + timed batches fit in one epoch at the defaults); ratios per record /
batched (target >= 0.8x), batched / ceiling (target >= 0.7x), batched / MosaicML and batched /
LitData. ``pin_memory`` only where CUDA is present.

GPU mode (default; needs CUDA): for each of ``--workers-list`` (default 4,8) and ``--models``
(default resnet18,resnet50), training steps (SGD, bf16 autocast, channels_last) on batches
copied host-to-GPU on a side stream one batch ahead (pinned memory), random crop (184 -> 160)
and horizontal flip on the GPU; img/s per feed and its ratio to the synthetic row of the same
model. Plus a loader-only pass (the same copies, no model) per worker count. Targets (an
H100/H200 with 16 cores): batched >= 0.98x synthetic and per record >= 0.90x for resnet18 at 8
workers; loader-only batched >= 1.3x MosaicML at 8 workers.

The peers run in ``benchmarks/.venv-peers`` (made as ``bench_torch.py`` makes it) unless the
current interpreter already imports ``streaming`` and ``litdata`` (as on the GPU machine, with
the wheels carried there: ``../shared/DEVICE.md``), or ``--peers-python`` names one. If no such
interpreter can be had, the peers' rows say why instead of a number.

Usage::

    .venv/bin/python benchmarks/bench_gpu_feed.py --cpu [--records 16384] [--batches 48]
    python3 benchmarks/bench_gpu_feed.py [--records 49152] [--workers-list 4,8] [--models resnet18,resnet50]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402
from bench_torch import run_json  # noqa: E402  (one way to run a worker and read its JSON)

SHAPE = (184, 184, 3)
CROP = 160
WORKLOAD = "large"  # _data's workload with SHAPE; _peers.py builds it
FEEDS_CPU = ["batched", "records", "mds", "litdata", "ceiling"]
FEEDS_GPU = ["synthetic", "batched", "records", "mds", "litdata"]
LABELS = {
    "synthetic": "synthetic batches already on the GPU",
    "batched": "yogacache batched",
    "records": "yogacache per record (DataLoader collation)",
    "mds": "MosaicML Streaming",
    "litdata": "LitData",
    "ceiling": "ceiling: in-memory numpy gather",
}
PEER_FEEDS = ("mds", "litdata")
PEERS_WORKER = os.path.join(HERE, "_peers.py")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# worker side: one feed in one process (runs in the project's or the peers' interpreter: only
# the standard library and _data at import time)


def _ceiling_dataset(records: int, batch: int, seed: int) -> Any:
    import numpy as np
    import torch
    from torch.utils.data import IterableDataset, get_worker_info

    images, labels = _data.make_arrays(records, SHAPE)

    class Ceiling(IterableDataset):  # type: ignore[type-arg]
        def __init__(self) -> None:
            self.epoch = 0

        def __iter__(self) -> Iterator[Any]:
            info = get_worker_info()
            worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
            order = np.random.default_rng(seed + self.epoch).permutation(records)
            for start in range(worker * batch, records, workers * batch):
                index = np.sort(order[start : start + batch])
                yield torch.from_numpy(images[index]), torch.from_numpy(labels[index])

    return Ceiling()


def _loader(feed: str, directory: str, records: int, batch: int, workers: int, pin: bool) -> tuple[Any, Any]:
    """(loader, next_epoch callable) for ``feed``; each batch is (images, labels) or a dict."""
    import torch

    seed = _data.SHUFFLE_SEED
    common = {"num_workers": workers, "pin_memory": pin}
    if feed in ("batched", "records"):
        from yogacache.dataref import CacheDataRef
        from yogacache.store.local import CacheStore
        from yogacache.torch import CacheDataLoader, CacheIterableDataset

        ref = CacheDataRef(CacheStore(directory, show_progress=False).open(WORKLOAD, _data.DATASET_VERSION))
        batched = feed == "batched"
        dataset = CacheIterableDataset(
            ref, shuffle=True, shuffle_seed=seed, shard_rank=0, num_shards=1, batch_size=batch, batched=batched
        )
        loader = CacheDataLoader(dataset, batch_size=None if batched else batch, **common)
        return loader, dataset.next_epoch
    if feed == "ceiling":
        dataset = _ceiling_dataset(records, batch, seed)

        def next_epoch() -> None:
            dataset.epoch += 1

        return torch.utils.data.DataLoader(dataset, batch_size=None, **common), next_epoch
    if feed == "mds":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(local=directory, shuffle=True, shuffle_seed=seed, batch_size=batch)
        return torch.utils.data.DataLoader(dataset, batch_size=batch, **common), lambda: None
    if feed == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(input_dir=directory, shuffle=True, seed=seed)
        return StreamingDataLoader(dataset, batch_size=batch, **common), lambda: None
    raise ValueError(f"unknown feed {feed!r}")


def _batches(loader: Any, next_epoch: Any) -> Iterator[tuple[Any, Any]]:
    """(images, labels) batches forever, epoch after epoch."""
    while True:
        for element in loader:
            if isinstance(element, dict):
                yield element["image"], element["label"]
            else:
                yield element[0], element[1]
        next_epoch()


def _gpu_augment(images: Any, generator: Any) -> Any:
    """uint8 NHWC on the GPU -> random CROP x CROP crop per image, random horizontal flip,
    normalised float NCHW in channels_last."""
    import torch

    n, height, width, _ = images.shape
    device = images.device
    top = torch.randint(0, height - CROP + 1, (n, 1, 1), device=device, generator=generator)
    left = torch.randint(0, width - CROP + 1, (n, 1, 1), device=device, generator=generator)
    steps = torch.arange(CROP, device=device)
    rows = top + steps.view(1, CROP, 1)
    cols = left + steps.view(1, 1, CROP)
    flip = torch.rand((n, 1, 1), device=device, generator=generator) < 0.5
    cols = torch.where(flip, left + (CROP - 1) - steps.view(1, 1, CROP), cols)
    batch = torch.arange(n, device=device).view(n, 1, 1)
    crops = images[batch, rows, cols]  # N, CROP, CROP, C
    x = crops.permute(0, 3, 1, 2).float().div_(255.0).sub_(0.5).div_(0.25)
    return x.contiguous(memory_format=torch.channels_last)


def _train_steps(
    feed: str, model_name: str, batches: Iterator[tuple[Any, Any]], warmup: int, steps: int, batch: int
) -> dict[str, Any]:
    """Training steps on ``batches`` (None: the synthetic row); copies on a side stream, one
    batch ahead. Returns img/s over ``steps`` steps after ``warmup``."""
    import torch
    import torchvision

    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, model_name)(num_classes=_data.NUM_CLASSES)
    model = model.to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator(device=device)
    generator.manual_seed(0)
    copy_stream = torch.cuda.Stream()

    if feed == "synthetic":
        fixed = (
            torch.randint(0, 256, (batch, *SHAPE), dtype=torch.uint8, device=device),
            torch.randint(0, _data.NUM_CLASSES, (batch,), dtype=torch.int64, device=device),
        )

        def next_on_gpu() -> tuple[Any, Any]:
            return fixed
    else:

        def start_copy() -> tuple[Any, Any, Any]:
            images, labels = next(batches)
            with torch.cuda.stream(copy_stream):
                gpu = (images.to(device, non_blocking=True), labels.to(device, non_blocking=True))
                event = torch.cuda.Event()
                event.record(copy_stream)
            return gpu[0], gpu[1], event

        pending = [start_copy()]

        def next_on_gpu() -> tuple[Any, Any]:
            images, labels, event = pending.pop()
            torch.cuda.current_stream().wait_event(event)
            images.record_stream(torch.cuda.current_stream())
            labels.record_stream(torch.cuda.current_stream())
            pending.append(start_copy())  # the next batch's copy overlaps this step
            return images, labels

    def step() -> int:
        images, labels = next_on_gpu()
        x = _gpu_augment(images, generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return int(images.shape[0])

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    images = sum(step() for _ in range(steps))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"images": images, "seconds": seconds, "rate": images / seconds}


def _loader_only(batches: Iterator[tuple[Any, Any]], warmup: int, steps: int, to_gpu: bool) -> dict[str, Any]:
    """Records/s of the loader alone (copied to the GPU in GPU mode, labels summed otherwise)."""
    import torch

    def take() -> int:
        images, labels = next(batches)
        if to_gpu:
            images = images.to("cuda", non_blocking=True)
            labels = labels.to("cuda", non_blocking=True)
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == SHAPE
        return int(labels.shape[0])

    for _ in range(warmup):
        take()
    if to_gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    records = sum(take() for _ in range(steps))
    if to_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"images": records, "seconds": seconds, "rate": records / seconds}


def worker_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "feed"])
    parser.add_argument("--feed", default="batched")
    parser.add_argument("--dir", default="")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--model", default="", help="empty: loader only")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args(argv)
    if args.action == "build":
        from yogacache.store.local import CacheStore

        images, labels = _data.make_arrays(args.records, SHAPE)
        start = time.perf_counter()
        CacheStore(args.dir, show_progress=False).build(WORKLOAD, _data.DATASET_VERSION, list(zip(images, labels)))
        print(json.dumps({"seconds": time.perf_counter() - start}))
        return
    import torch

    if args.gpu and not torch.cuda.is_available():
        raise SystemExit("GPU mode needs CUDA, and torch.cuda.is_available() is False here")
    batches: Iterator[tuple[Any, Any]] = iter(())
    if args.feed != "synthetic":
        loader, next_epoch = _loader(
            args.feed, args.dir, args.records, args.batch, args.workers, pin=torch.cuda.is_available()
        )
        batches = _batches(loader, next_epoch)
    if args.model:
        result = _train_steps(args.feed, args.model, batches, args.warmup, args.batches, args.batch)
    else:
        result = _loader_only(batches, args.warmup, args.batches, to_gpu=args.gpu)
    print(json.dumps(result), flush=True)
    os._exit(0)  # the peers' loaders may keep worker threads alive: the result is out


# ---------------------------------------------------------------------------------------------
# orchestration


def find_peers(args: argparse.Namespace) -> tuple[Optional[str], str]:
    """The interpreter the peers run in, and their versions (or None and why not)."""
    if args.no_peers:
        return None, "--no-peers"
    if args.peers_python:
        return args.peers_python, f"{args.peers_python} (--peers-python)"
    if all(importlib.util.find_spec(name) for name in ("streaming", "litdata")):
        return sys.executable, "this interpreter"
    import bench_torch

    try:
        return bench_torch.peers_python(args.peers_venv)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"cannot make {args.peers_venv}: {error}"


def machine_line() -> str:
    try:
        import torch

        version = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        version, gpu = "not installed", "?"
    return (
        f"{platform.machine()}, {os.cpu_count()} cores, {gpu}, Python {platform.python_version()}, "
        f"torch {version}"
    )


def build_all(args: argparse.Namespace, workdir: str, peers: Optional[str], peers_why: str) -> dict[str, Any]:
    """Builds the three datasets; returns {kind: directory or error string}."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    logs = os.path.join(workdir, "logs")
    dirs: dict[str, Any] = {}
    directory = os.path.join(workdir, "yogacache")
    log(f"building the yogacache cache ({args.records:,} records)")
    run_json(
        [sys.executable, os.path.abspath(__file__), "--worker", "build", "--dir", directory,
         "--records", str(args.records)],
        os.path.join(logs, "build-yogacache.log"), args.timeout, env,
    )
    dirs["yogacache"] = directory
    for kind in PEER_FEEDS:
        if peers is None:
            dirs[kind] = RuntimeError(peers_why)
            continue
        log(f"building {LABELS[kind]}")
        directory = os.path.join(workdir, kind)
        try:
            run_json(
                [peers, PEERS_WORKER, "build", kind, "--dir", directory, "--workload", WORKLOAD,
                 "--records", str(args.records), "--workers", str(min(os.cpu_count() or 1, 8))],
                os.path.join(logs, f"build-{kind}.log"), args.timeout,
            )
            dirs[kind] = directory
        except RuntimeError as error:
            dirs[kind] = error
    return dirs


def measure(
    args: argparse.Namespace, feed: str, dirs: dict[str, Any], peers: Optional[str], workers: int,
    model: str, logs: str, repeat: int = 0,
) -> dict[str, Any]:
    source = dirs.get("yogacache" if feed in ("batched", "records") else feed, "")
    if isinstance(source, Exception):
        return {"error": str(source)}
    python = peers if feed in PEER_FEEDS else sys.executable
    if python is None:
        return {"error": "no interpreter for the peers"}
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    command = [
        python, os.path.abspath(__file__), "--worker", "feed", "--feed", feed, "--dir", source or "",
        "--records", str(args.records), "--batch", str(args.batch), "--workers", str(workers),
        "--warmup", str(args.warmup), "--batches", str(args.batches),
    ] + (["--model", model] if model else []) + ([] if args.cpu else ["--gpu"])
    tag = f"{feed}-{workers}w-{model or 'loader'}-{repeat}"
    log(f"measuring {tag}")
    try:
        return run_json(command, os.path.join(logs, tag + ".log"), args.timeout, env)
    except RuntimeError as error:
        return {"error": str(error)}


def ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> Optional[float]:
    if "rate" in numerator and "rate" in denominator:
        return float(numerator["rate"]) / float(denominator["rate"])
    return None


def fmt_ratio(value: Optional[float], target: Optional[float] = None) -> str:
    if value is None:
        return "—"
    if target is None:
        return f"{value:.3f}x"
    return f"{value:.3f}x ({'met' if value >= target else 'missed'}: ≥ {target}x)"


def fmt_rate(result: dict[str, Any]) -> str:
    return f"{result['rate']:,.0f}" if "rate" in result else f"error: {result['error'][:200]}"


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (its spread in ``range``), or the first error."""
    rated = sorted((run for run in runs if "rate" in run), key=lambda run: float(run["rate"]))
    if len(rated) < len(runs):
        return next(run for run in runs if "rate" not in run)
    middle = dict(rated[len(rated) // 2])
    middle["range"] = (rated[0]["rate"], rated[-1]["rate"])
    middle["runs"] = runs
    return middle


def fmt_range(result: dict[str, Any]) -> str:
    if "range" not in result or len(result["runs"]) < 2:
        return ""
    low, high = result["range"]
    return f"{low:,.0f}–{high:,.0f}"


def cpu_table(rows: dict[str, dict[str, Any]], workers: int) -> str:
    batched, records, ceiling = rows["batched"], rows["records"], rows["ceiling"]
    lines = [
        f"| feed ({workers} workers, loader only) | records/s (median) | runs: min–max | ratio | target |",
        "|---|---:|---:|---:|---|",
    ]
    ratios = {
        "batched": ("batched / ceiling", ratio(batched, ceiling), 0.7),
        "records": ("per record / batched", ratio(records, batched), 0.8),
        "mds": ("batched / MosaicML", ratio(batched, rows["mds"]), None),
        "litdata": ("batched / LitData", ratio(batched, rows["litdata"]), None),
        "ceiling": ("", None, None),
    }
    for feed in FEEDS_CPU:
        name, value, target = ratios[feed]
        shown = f"{name}: {fmt_ratio(value)}" if name else ""
        verdict = "" if target is None or value is None else f"≥ {target}x: {'met' if value >= target else 'missed'}"
        lines.append(f"| {LABELS[feed]} | {fmt_rate(rows[feed])} | {fmt_range(rows[feed])} | {shown} | {verdict} |")
    return "\n".join(lines)


def gpu_tables(results: dict[str, Any], workers_list: list[int]) -> str:
    head = " | ".join(f"{w} workers | vs synthetic" for w in workers_list)
    lines = [f"| model | feed | {head} |", "|---|---|" + "---:|---:|" * len(workers_list)]
    for model, per_model in results["train"].items():
        synthetic = per_model["synthetic"]
        lines.append(f"| {model} | {LABELS['synthetic']} | {fmt_rate(synthetic)} img/s | 1.000x |" + " | |" * (
            len(workers_list) - 1))
        for feed in FEEDS_GPU[1:]:
            cells = []
            for w in workers_list:
                result = per_model[feed][str(w)]
                target = None
                if model == "resnet18" and w == 8 and feed in ("batched", "records"):
                    target = 0.98 if feed == "batched" else 0.90
                cells.append(f"{fmt_rate(result)} | {fmt_ratio(ratio(result, synthetic), target)}")
            lines.append(f"| {model} | {LABELS[feed]} | " + " | ".join(cells) + " |")
    lines += ["", "| loader only (no model, copied to the GPU) | " + " | ".join(f"{w} workers" for w in workers_list)
              + " |", "|---|" + "---:|" * len(workers_list)]
    loader = results["loader"]
    for feed in ("batched", "records", "mds", "litdata"):
        lines.append(f"| {LABELS[feed]} | " + " | ".join(fmt_rate(loader[feed][str(w)]) for w in workers_list) + " |")
    cells = []
    for w in workers_list:
        target = 1.3 if w == 8 else None
        cells.append(fmt_ratio(ratio(loader["batched"][str(w)], loader["mds"][str(w)]), target))
    lines.append("| yogacache batched / MosaicML | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="loader-only rows on CPU (the always-on measure)")
    parser.add_argument("--records", type=int, help="records built (default 49,152; 16,384 with --cpu)")
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers with --cpu (default 2)")
    parser.add_argument("--workers-list", default="4,8", help="DataLoader workers in GPU mode (default 4,8)")
    parser.add_argument("--models", default="resnet18,resnet50", help="GPU mode models (torchvision names)")
    parser.add_argument("--warmup", type=int, help="batches before the clock (default 8 with --cpu, 20 on GPU)")
    parser.add_argument("--batches", type=int, help="timed batches (default 48 with --cpu, 150 on GPU)")
    parser.add_argument("--repeats", type=int, default=3, help="--cpu: interleaved runs per row, median shown")
    parser.add_argument("--workdir", help="where data is built (default: a new temp dir, removed unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="measure yogacache and the ceiling only")
    parser.add_argument("--peers-python", help="interpreter with streaming and litdata (default: see above)")
    parser.add_argument("--peers-venv", default=os.path.join(HERE, ".venv-peers"))
    parser.add_argument("--timeout", type=float, default=900, help="per worker process, seconds")
    parser.add_argument("--out", help="also write every number as JSON")
    args = parser.parse_args()
    args.records = args.records or (16_384 if args.cpu else 49_152)
    args.warmup = args.warmup if args.warmup is not None else (8 if args.cpu else 20)
    args.batches = args.batches or (48 if args.cpu else 150)
    if not args.cpu:
        import torch

        if not torch.cuda.is_available():
            parser.exit(2, "bench_gpu_feed.py: GPU mode needs CUDA (torch.cuda.is_available() is False); "
                           "run with --cpu for the loader-only rows\n")
    command_line = "python " + " ".join(["benchmarks/bench_gpu_feed.py"] + sys.argv[1:])

    peers, peers_why = find_peers(args)
    workdir = tempfile.mkdtemp(prefix="bench-gpu-feed-", dir=args.workdir)
    logs = os.path.join(workdir, "logs")
    os.makedirs(logs)
    results: dict[str, Any] = {"machine": machine_line(), "command": command_line, "records": args.records,
                               "peers": peers_why if peers else f"unavailable: {peers_why}"}
    try:
        dirs = build_all(args, workdir, peers, peers_why)
        if args.cpu:
            runs: dict[str, list[dict[str, Any]]] = {feed: [] for feed in FEEDS_CPU}
            for repeat in range(args.repeats):  # interleaved: a busy moment hits every row alike
                for feed in FEEDS_CPU:
                    runs[feed].append(measure(args, feed, dirs, peers, args.workers, "", logs, repeat))
            rows = {feed: median_of(feed_runs) for feed, feed_runs in runs.items()}
            results["loader"] = rows
            table = cpu_table(rows, args.workers)
        else:
            workers_list = [int(w) for w in args.workers_list.split(",")]
            results["train"] = {}
            for model in args.models.split(","):
                per_model: dict[str, Any] = {"synthetic": measure(args, "synthetic", dirs, peers, 0, model, logs)}
                for feed in FEEDS_GPU[1:]:
                    per_model[feed] = {
                        str(w): measure(args, feed, dirs, peers, w, model, logs) for w in workers_list
                    }
                results["train"][model] = per_model
            results["loader"] = {
                feed: {str(w): measure(args, feed, dirs, peers, w, "", logs) for w in workers_list}
                for feed in ("batched", "records", "mds", "litdata")
            }
            table = gpu_tables(results, workers_list)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"Command: {command_line}")
    print(f"Machine: {results['machine']}")
    print(f"Records: {args.records:,} x uint8{list(SHAPE)} + int64, local disk; batch {args.batch}, shuffled; "
          f"{args.warmup} warm-up + {args.batches} timed batches per run, one process per run"
          + (f", {args.repeats} interleaved runs per row" if args.cpu else ""))
    print(f"Peers: {results['peers']}\n")
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
