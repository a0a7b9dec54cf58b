"""Streaming a cache larger than the budget from S3 through a bandwidth-limited link, read the way
training reads it (shuffled, through a DataLoader with 2 workers): yogacache vs MosaicML
Streaming vs LitData, reading the same records from the same server.

Starts moto's S3 server on 127.0.0.1 and, per row, a fresh throttling proxy in front of it
(``_throttle.py``: one shared pace for all connections, counting the body bytes it sends), at
each link rate of ``--rates`` (default 50 and 200 MB/s). Each system writes the same large
records (184x184x3 uint8 image + int64 label, ``_data.make_arrays``) in parts of the same size
(``--part-bytes``; default: yogacache's default part size for object stores), uploaded straight
to moto. Then each row reads two epochs from an empty node directory through its proxy, in a
process of its own, with ``torch.utils.data.DataLoader(num_workers=2, batch_size=256)``
(yogacache's ``CacheDataLoader``, LitData's ``StreamingDataLoader``), per-record datasets
collated by the loader:

- ``yogacache parts``: ``shuffle_mode="parts"`` (the streaming order), a budget of half the
  dataset (``local_cache_limit``);
- ``yogacache global``: ``shuffle_mode="global"`` with no budget (a global order reads every part
  throughout the epoch: it streams well only when the node may keep every part);
- ``yogacache dataset order``: no shuffle, half the dataset as budget (the order the earlier
  tables of this benchmark used);
- ``MosaicML Streaming`` (tuned): ``shuffle=True``, ``shuffle_algo="py1e"``, a shuffle block of
  four shards' records (the parts yogacache mixes at a time), ``predownload`` of two batches,
  ``num_canonical_nodes=1``, ``cache_limit`` half the dataset;
- ``LitData``: ``shuffle=True``, ``max_cache_size`` half the dataset.

Columns: time from opening the dataset (libraries imported) to the first batch, and the bytes
the link carried until then (in parts); records/s over epoch 1 and its fraction of the link;
bytes fetched in epochs 1 and 2. Every epoch is checked: each record exactly once (count and
label sum). Targets (issue 24 item 2), for ``yogacache parts``: first batch <= one part's fetch
at the link rate + 0.5 s, and ahead of MosaicML's; epoch 1 >= 0.9x of the link; epoch 2 fetches
at most dataset - budget + S parts, S the parts that the workers' batches in flight span (two
workers x two batches of 256 records: two parts of 64 MiB; one for one reader).

Usage: ``.venv/bin/python benchmarks/bench_stream.py [--size 1Gi] [--rates 50M,200M]
[--part-bytes 64Mi] [--rows parts,global,none,mds,litdata] [--no-peers] [--plot first-batch.png]`` (the peers run in
``benchmarks/.venv-peers``, made by ``bench_torch.py``). One run; the numbers are as noisy as the
machine, whose load average the notes give.
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
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import _data  # noqa: E402
from _throttle import ThrottleProxy  # noqa: E402

SHAPE = (184, 184, 3)
RECORD_BYTES = 184 * 184 * 3 + 8
BATCH = 256
WORKERS = 2
DS, VER = "large", "v1"
PEERS_VENV = HERE / ".venv-peers"
# Row name -> (label, shuffle_mode or None for dataset order, budget: "half" or None).
YOGACACHE_ROWS = {
    "parts": ("yogacache parts", "parts", "half"),
    "global": ("yogacache global (no budget)", "global", None),
    "none": ("yogacache dataset order", None, "half"),
}
PEER_ROWS = {"mds": "MosaicML Streaming (tuned)", "litdata": "LitData"}

YOGACACHE_READER = r"""
import json, sys, time
import boto3, torch  # imported before the clock starts, as the peers' libraries are
from yogacache.store import open_store
from yogacache.torch import CacheDataLoader, CacheIterableDataset
t0_wall, t0 = time.time(), time.perf_counter()
args = json.loads(sys.argv[1])
reader = open_store(args["config"], show_progress=False).open("large", "v1")
mode = args["mode"]
dataset = CacheIterableDataset(reader, shuffle=mode is not None, shuffle_seed=7, shard_rank=0, num_shards=1,
                               shuffle_mode=mode or "shard")
loader = CacheDataLoader(dataset, batch_size=args["batch"], num_workers=args["workers"])
results = []
for epoch in range(args["epochs"]):
    dataset.set_epoch(epoch)
    start_wall, start = (t0_wall, t0) if epoch == 0 else (time.time(), time.perf_counter())
    first, count, label_sum = None, 0, 0
    for image, label in loader:
        if first is None:
            first = time.perf_counter() - start
        count += len(label)
        label_sum += int(label.sum())
    results.append({"start": start_wall, "end": time.time(), "seconds": time.perf_counter() - start,
                    "first_batch": first, "records": count, "label_sum": label_sum})
print(json.dumps({"epochs": results}))
"""


def log(message: str) -> None:
    print(f"[bench_stream] {message}", file=sys.stderr, flush=True)


def parse(text: str) -> int:
    from yogacache.sizes import parse_size

    return parse_size(text, "size")


def make_records(records: int) -> Any:
    images, labels = _data.make_arrays(records, SHAPE)
    return ((images[i], labels[i]) for i in range(records))


def upload_tree(client: Any, bucket: str, directory: Path, prefix: str) -> int:
    total = 0
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(directory)}")
            total += path.stat().st_size
    return total


def run_json(command: list[str], env: dict[str, str], timeout: float = 3600) -> dict[str, Any]:
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure(result: dict[str, Any], proxy: ThrottleProxy, records: int, label_sum: int) -> dict[str, Any]:
    epochs = result["epochs"]
    for number, epoch in enumerate(epochs, 1):
        got = (epoch["records"], epoch.get("label_sum", label_sum))
        if got != (records, label_sum):
            raise RuntimeError(
                f"epoch {number} read {got[0]} records (label sum {got[1]}), "
                f"expected {records} ({label_sum}): not each record exactly once"
            )
    first = epochs[0]
    return {
        "first_batch": first["first_batch"],
        "first_bytes": proxy.bytes_between(first["start"], first["start"] + first["first_batch"]),
        "rate": records / first["seconds"],
        "bytes": [proxy.bytes_between(e["start"], e["end"] + 0.5) for e in epochs],
    }


def main() -> None:
    from yogacache.store.remote import REMOTE_PART_SIZE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1Gi", help="dataset size (K M G T, Ki Mi Gi Ti); default 1Gi")
    parser.add_argument("--rates", default="50M,200M", help="link rates in bytes/s; default 50M,200M")
    parser.add_argument(
        "--part-bytes",
        default=None,
        help=f"part / shard / chunk size; default yogacache's ({REMOTE_PART_SIZE >> 20} MiB)",
    )
    parser.add_argument(
        "--rows",
        default=",".join([*YOGACACHE_ROWS, *PEER_ROWS]),
        help=f"rows to measure, of {', '.join([*YOGACACHE_ROWS, *PEER_ROWS])}",
    )
    parser.add_argument("--no-peers", action="store_true", help="measure yogacache only")
    parser.add_argument("--peers-venv", default=str(PEERS_VENV), help=f"the peers' virtualenv; default {PEERS_VENV}")
    parser.add_argument("--plot", metavar="PNG", help="also draw the first batch's time against the link rate")
    args = parser.parse_args()
    size = parse(args.size)
    rates = [parse(rate) for rate in args.rates.split(",")]
    part_bytes = REMOTE_PART_SIZE if args.part_bytes is None else parse(args.part_bytes)
    chosen = [row for row in args.rows.split(",") if row]
    unknown = [row for row in chosen if row not in YOGACACHE_ROWS and row not in PEER_ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}")
    peers = [] if args.no_peers else [row for row in chosen if row in PEER_ROWS]
    records = max(BATCH, size // RECORD_BYTES)
    budget = records * RECORD_BYTES // 2
    label_sum = int(_data.make_arrays(records, SHAPE)[1].sum())

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from bench_cloud import start_moto

    workdir = Path(tempfile.mkdtemp(prefix="yogacache-stream-bench-"))
    moto, endpoint = start_moto(workdir)
    tables: dict[int, dict[str, dict[str, Any]]] = {rate: {} for rate in rates}
    links: dict[int, float] = {}
    notes: list[str] = []
    load_before = os.getloadavg()[0]
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint)
        bucket = "bench-stream"
        client.create_bucket(Bucket=bucket)

        from yogacache.backends.s3 import S3ObjectStore
        from yogacache.store.remote import RemoteCacheStore

        log(f"building and publishing {records} records ({records * RECORD_BYTES / 2**30:.2f} GiB)")
        publisher = RemoteCacheStore(
            S3ObjectStore(bucket, "yogacache", endpoint_url=endpoint),
            workdir / "builder",
            part_size_bytes=part_bytes,
            show_progress=False,
        )
        manifest = publisher.get_or_build(DS, VER, lambda: make_records(records)).manifest
        shutil.rmtree(workdir / "builder")
        largest = max(p.size_bytes for p in manifest.parts)
        notes.append(f"yogacache: {len(manifest.parts)} parts of up to {largest / 2**20:.1f} MiB")

        python = Path(args.peers_venv) / "bin" / "python"
        if peers and not python.exists():
            notes.append(f"peers not measured: {args.peers_venv} does not exist (run bench_torch.py once)")
            peers = []
        built: dict[str, int] = {}
        for kind in peers:
            try:
                built[kind] = build_peer(kind, python, client, bucket, workdir, records, part_bytes)
            except Exception as error:  # noqa: BLE001 - one peer failing leaves the others' rows
                notes.append(f"{PEER_ROWS[kind]} not built: {str(error)[-600:]}")

        for rate in rates:
            links[rate] = measure_link(client, bucket, endpoint, rate)
            for row in chosen:
                run = f"{rate // 10**6}MBps-{row}"
                try:
                    if row in YOGACACHE_ROWS:
                        label, mode, row_budget = YOGACACHE_ROWS[row]
                        result, proxy = run_yogacache(
                            workdir / f"node-{run}",
                            endpoint,
                            bucket,
                            rate,
                            mode,
                            budget if row_budget else None,
                            records,
                        )
                    elif row in built:
                        label = PEER_ROWS[row]
                        result, proxy = run_peer(
                            row, python, bucket, endpoint, workdir / f"node-{run}", records, budget, part_bytes, rate
                        )
                    else:
                        continue
                    tables[rate][label] = measure(result, proxy, records, label_sum)
                except Exception as error:  # noqa: BLE001 - one row failing leaves the others
                    notes.append(f"{run} not measured: {str(error)[-600:]}")
                shutil.rmtree(workdir / f"node-{run}", ignore_errors=True)
    finally:
        moto.terminate()
        moto.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    load_after, cores = os.getloadavg()[0], os.cpu_count()
    notes.append(f"load average (1 min) {load_before:.1f} at the start, {load_after:.1f} at the end; {cores} cores")
    for rate in rates:
        print_table(tables[rate], records, rate, budget, largest, links.get(rate))
    for note in notes:
        print(f"note: {note}")
    if args.plot:
        plot_first_batch(tables, largest, args.plot)


def plot_first_batch(tables: dict[int, dict[str, dict[str, Any]]], part: int, path: str) -> None:
    """Seconds to the first batch against the link rate, one line per row, beside the target (one
    part's fetch at that rate + 0.5 s) and the part's fetch alone: the gap to the fetch line is the
    fixed cost of opening, the workers' start and the first collation."""
    import _plot

    rates = sorted(tables)
    title = f"First shuffled batch from an empty node, parts of {part / 2**20:.0f} MiB, 2 DataLoader workers"
    with _plot.figure(
        path, title=title, xlabel="link rate (MB/s)", ylabel="seconds to the first batch", logx=True, logy=True
    ) as axes:
        for label in dict.fromkeys(label for rate in rates for label in tables[rate]):
            points = [(rate / 1e6, tables[rate][label]["first_batch"]) for rate in rates if label in tables[rate]]
            axes.plot(*zip(*points), "-" if label.startswith("yogacache") else "--", marker="o", label=label)
        axes.plot([r / 1e6 for r in rates], [part / r + 0.5 for r in rates], "k:", label="target: one part + 0.5 s")
        axes.plot(
            [r / 1e6 for r in rates], [part / r for r in rates], color="grey", linewidth=0.8, label="one part's fetch"
        )
        axes.set_xticks([r / 1e6 for r in rates], [f"{r / 1e6:.0f}" for r in rates])
        axes.minorticks_off()


def measure_link(client: Any, bucket: str, endpoint: str, rate: int) -> float:
    """Bytes/s the link delivers on this machine: every yogacache part downloaded (read into
    memory, nothing else) on two threads through a fresh proxy; moto and the proxy share the
    cores with everything else, so this can fall short of the rate the proxy enforces."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    proxy = ThrottleProxy(endpoint, rate)
    try:
        through = boto3.client("s3", endpoint_url=proxy.url)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="yogacache")
        keys = [item["Key"] for page in pages for item in page.get("Contents", []) if item["Key"].endswith(".mdb")]
        start = time.perf_counter()
        with ThreadPoolExecutor(2) as pool:
            total = sum(pool.map(lambda key: len(through.get_object(Bucket=bucket, Key=key)["Body"].read()), keys))
        return total / (time.perf_counter() - start)
    finally:
        proxy.stop()


def run_yogacache(
    node: Path, endpoint: str, bucket: str, rate: int, mode: Optional[str], budget: Optional[int], records: int
) -> tuple[dict[str, Any], ThrottleProxy]:
    proxy = ThrottleProxy(endpoint, rate)
    config = {
        "type": "s3",
        "bucket": bucket,
        "bucket_directory_path": "yogacache",
        "endpoint_url": proxy.url,
        "local_cache_host_path": str(node),
        "local_cache_container_path": str(node),
        "streaming": True,
        "local_cache_limit": budget,
    }
    log(f"yogacache {mode or 'dataset order'} at {rate / 1e6:.0f} MB/s: two epochs from an empty node")
    arguments = {"config": config, "mode": mode, "batch": BATCH, "workers": WORKERS, "epochs": 2}
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        return run_json([sys.executable, "-c", YOGACACHE_READER, json.dumps(arguments)], env), proxy
    finally:
        proxy.stop()


def build_peer(kind: str, python: Path, client: Any, bucket: str, workdir: Path, records: int, part_bytes: int) -> int:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    local = workdir / f"build-{kind}"
    log(f"{kind}: building {records} records")
    run_json(
        [
            str(python),
            str(HERE / "_peers_stream.py"),
            "build",
            kind,
            "--dir",
            str(local),
            "--records",
            str(records),
            "--part-bytes",
            str(part_bytes),
        ],
        env,
    )
    uploaded = upload_tree(client, bucket, local, kind)
    shutil.rmtree(local)
    log(f"{kind}: {uploaded} bytes uploaded")
    return uploaded


def run_peer(
    kind: str,
    python: Path,
    bucket: str,
    endpoint: str,
    node: Path,
    records: int,
    budget: int,
    part_bytes: int,
    rate: int,
) -> tuple[dict[str, Any], ThrottleProxy]:
    log(f"{kind} at {rate / 1e6:.0f} MB/s: two epochs from an empty node")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proxy = ThrottleProxy(endpoint, rate)
    try:
        env.update(S3_ENDPOINT_URL=proxy.url, AWS_ENDPOINT_URL=proxy.url)
        return run_json(
            [
                str(python),
                str(HERE / "_peers_stream.py"),
                "read",
                kind,
                "--remote",
                f"s3://{bucket}/{kind}",
                "--dir",
                str(node),
                "--limit",
                str(budget),
                "--records",
                str(records),
                "--epochs",
                "2",
                "--batch",
                str(BATCH),
                "--workers",
                str(WORKERS),
                "--shuffle",
                "--part-bytes",
                str(part_bytes),
            ],
            env,
        ), proxy
    finally:
        proxy.stop()


def print_table(
    rows: dict[str, dict[str, Any]], records: int, rate: int, budget: int, part: int, delivered: Optional[float]
) -> None:
    dataset = records * RECORD_BYTES
    fetch = part / rate
    ours: Optional[dict[str, Any]] = rows.get(YOGACACHE_ROWS["parts"][0])
    mosaic: Optional[dict[str, Any]] = rows.get(PEER_ROWS["mds"])
    print(
        f"\n{rate / 1e6:.0f} MB/s link ({rate / RECORD_BYTES:.0f} records/s): {records} records of 184x184x3 uint8 "
        f"+ int64 ({dataset / 2**30:.2f} GiB) from moto's S3 server, budget {budget / 2**30:.2f} GiB (half), "
        f"parts of {part / 2**20:.0f} MiB (one part's fetch: {fetch:.2f} s), DataLoader: {WORKERS} workers, "
        f"batch {BATCH}"
    )
    if delivered:
        print(
            f"The link alone (every part downloaded on two threads, nothing read) delivered "
            f"{delivered / 1e6:.0f} MB/s here ({delivered / rate:.2f}x of {rate / 1e6:.0f} MB/s)."
        )
    print()
    header = [
        "reader",
        "first batch (s)",
        "fetched by then (parts)",
        "epoch 1 (records/s)",
        "of the link",
        "epoch 1 fetched (GiB)",
        "epoch 2 fetched (GiB)",
    ]
    lines = [header]
    for label, row in rows.items():
        cells = [
            label,
            f"{row['first_batch']:.2f}",
            f"{row['first_bytes'] / part:.1f}",
            f"{row['rate']:.0f}",
            f"{row['rate'] * RECORD_BYTES / rate:.2f}x",
            f"{row['bytes'][0] / 2**30:.2f}",
            f"{row['bytes'][1] / 2**30:.2f}",
        ]
        if ours is not None and row is not ours:
            cells[1] += f" ({row['first_batch'] / ours['first_batch']:.1f}x)"
            cells[3] += f" ({row['rate'] / ours['rate']:.2f}x)"
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    print("\n(x): the row's value relative to yogacache parts'")
    if ours is None:
        return
    target_first = fetch + 0.5
    span = _data.parts_read_at_once(WORKERS * _data.PREFETCH * BATCH, max(1, part // RECORD_BYTES))
    epoch2 = dataset - budget + span * part
    checks = [
        (
            f"first batch {ours['first_batch']:.2f} s <= one part's fetch + 0.5 s = {target_first:.2f} s",
            ours["first_batch"] <= target_first,
        ),
        (
            f"epoch 1 at {ours['rate'] * RECORD_BYTES / rate:.2f}x of the link >= 0.9x",
            ours["rate"] * RECORD_BYTES / rate >= 0.9,
        ),
        (
            f"epoch 2 fetched {ours['bytes'][1] / 2**30:.2f} GiB <= dataset - budget + S = {span} part(s) = "
            f"{epoch2 / 2**30:.2f} GiB",
            ours["bytes"][1] <= epoch2,
        ),
    ]
    if mosaic is not None:
        checks.append(
            (
                f"first batch ahead of MosaicML's ({mosaic['first_batch']:.2f} s)",
                ours["first_batch"] < mosaic["first_batch"],
            )
        )
    for text, met in checks:
        print(f"target (yogacache parts): {text}: {'met' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
