"""Streaming a cache larger than the budget from S3 through a bandwidth-limited link: yogacache
vs MosaicML Streaming vs LitData, reading the same records from the same server.

Starts moto's S3 server on 127.0.0.1 and, per reader, a fresh throttling proxy in front of it
(``_throttle.py``: one shared pace for all connections, default 200 MB/s, counting the body
bytes it sends). Each system writes the same large records (184x184x3 uint8 image + int64
label, ``_data.make_arrays``) in parts of the same size (``--part-bytes``, single GETs below
boto3's ranged-download threshold: moto serves a ranged GET by copying the whole object, see
/work/shared/EMULATORS.md), uploaded straight to moto. Then each reads two epochs, in dataset
order, from an empty node directory through its proxy with a budget of half the dataset
(yogacache ``local_cache_limit``, MosaicML ``cache_limit``, LitData ``max_cache_size``), in a
process of its own, one DataLoader-free consumer loop of batches of 256. Rows: time from
opening the dataset (libraries imported) to the first batch; records/s over epoch 1; bytes fetched in epochs 1 and 2.

Usage: ``.venv/bin/python benchmarks/bench_stream.py [--size 2Gi] [--rate 200M] [--no-peers]``
(the peers run in ``benchmarks/.venv-peers``, made by ``bench_torch.py``). One run; the numbers
are as noisy as the machine, whose load average the notes give: run it several times and take
medians. "of the link": epoch 1's records/s as a fraction of the link rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
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
DS, VER = "large", "v1"
PEERS_VENV = HERE / ".venv-peers"

YOGACACHE_READER = r"""
import json, sys, time
from yogacache.store import open_store
from yogacache.read.options import ReadOptions
from yogacache.read.pipeline import read_stream
import boto3  # imported before the clock starts, as the peers' libraries are
t0_wall, t0 = time.time(), time.perf_counter()
config, records, epochs, batch = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
reader = open_store(config, show_progress=False).open("large", "v1")
stream = read_stream(reader, ReadOptions())
results = []
for epoch in range(epochs):
    start_wall, start = (t0_wall, t0) if epoch == 0 else (time.time(), time.perf_counter())
    first, count, pending = None, 0, 0
    for columns in stream.batch_iterator_fn():
        n = len(columns[1])
        count += n
        pending += n
        if first is None and pending >= batch:
            first = time.perf_counter() - start
    results.append({"start": start_wall, "end": time.time(), "seconds": time.perf_counter() - start,
                    "first_batch": first, "records": count})
    assert count == records, (count, records)
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


def measure(result: dict[str, Any], proxy: ThrottleProxy, records: int) -> dict[str, Any]:
    epochs = result["epochs"]
    return {
        "first_batch": epochs[0]["first_batch"],
        "rate": records / epochs[0]["seconds"],
        "bytes": [proxy.bytes_between(e["start"], e["end"] + 0.5) for e in epochs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="2Gi", help="dataset size (K M G T, Ki Mi Gi Ti); default 2Gi")
    parser.add_argument("--rate", default="200M", help="link rate in bytes/s; default 200M")
    parser.add_argument("--part-bytes", default="32Mi", help="part / shard / chunk size; default 32Mi")
    parser.add_argument("--no-peers", action="store_true", help="measure yogacache only")
    parser.add_argument("--peers-venv", default=str(PEERS_VENV), help=f"the peers' virtualenv; default {PEERS_VENV}")
    args = parser.parse_args()
    size, rate, part_bytes = parse(args.size), parse(args.rate), parse(args.part_bytes)
    records = max(BATCH, size // RECORD_BYTES)
    budget = records * RECORD_BYTES // 2

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    from bench_cloud import start_moto

    workdir = Path(tempfile.mkdtemp(prefix="yogacache-stream-bench-"))
    moto, endpoint = start_moto(workdir)
    rows: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    load_before = os.getloadavg()[0]
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint)
        bucket = "bench-stream"
        client.create_bucket(Bucket=bucket)

        # -- yogacache ------------------------------------------------------------------------
        from yogacache.backends.s3 import S3ObjectStore
        from yogacache.store.remote import RemoteCacheStore

        log(f"building and publishing {records} records ({records * RECORD_BYTES / 2**30:.2f} GiB)")
        publisher = RemoteCacheStore(
            S3ObjectStore(bucket, "yogacache", endpoint_url=endpoint), workdir / "builder",
            part_size_bytes=part_bytes, show_progress=False,
        )
        manifest = publisher.get_or_build(DS, VER, lambda: make_records(records)).manifest
        shutil.rmtree(workdir / "builder")
        proxy = ThrottleProxy(endpoint, rate)
        node = workdir / "node-yogacache"
        config = {
            "type": "s3", "bucket": bucket, "bucket_directory_path": "yogacache", "endpoint_url": proxy.url,
            "local_cache_host_path": str(node), "local_cache_container_path": str(node),
            "streaming": True, "local_cache_limit": budget,
        }
        env = dict(os.environ, PYTHONPATH=str(REPO))
        log("yogacache: reading two epochs from an empty node")
        command = [sys.executable, "-c", YOGACACHE_READER, json.dumps(config), str(records), "2", str(BATCH)]
        result = run_json(command, env)
        rows["yogacache"] = measure(result, proxy, records)
        proxy.stop()
        parts = len(manifest.parts)
        notes.append(f"yogacache: {parts} parts of up to {max(p.size_bytes for p in manifest.parts)} bytes")

        # -- peers ------------------------------------------------------------------------------
        python = Path(args.peers_venv) / "bin" / "python"
        if args.no_peers:
            notes.append("peers not measured (--no-peers)")
        elif not python.exists():
            notes.append(f"peers not measured: {args.peers_venv} does not exist (run bench_torch.py once)")
        else:
            for kind, label in (("mds", "MosaicML Streaming"), ("litdata", "LitData")):
                try:
                    rows[label] = run_peer(kind, python, client, bucket, endpoint, workdir, records, budget,
                                           part_bytes, rate)
                except Exception as error:  # noqa: BLE001 - one peer failing leaves the others' rows
                    notes.append(f"{label} not measured: {str(error)[-600:]}")
    finally:
        moto.terminate()
        moto.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    load_after, cores = os.getloadavg()[0], os.cpu_count()
    notes.append(f"load average (1 min) {load_before:.1f} at the start, {load_after:.1f} at the end; {cores} cores")
    print_table(rows, records, rate, budget, notes)


def run_peer(
    kind: str, python: Path, client: Any, bucket: str, endpoint: str, workdir: Path, records: int,
    budget: int, part_bytes: int, rate: int,
) -> dict[str, Any]:
    worker = str(HERE / "_peers_stream.py")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    local = workdir / f"build-{kind}"
    log(f"{kind}: building {records} records")
    run_json([str(python), worker, "build", kind, "--dir", str(local), "--records", str(records),
              "--part-bytes", str(part_bytes)], env)
    uploaded = upload_tree(client, bucket, local, kind)
    shutil.rmtree(local)
    log(f"{kind}: {uploaded} bytes uploaded; reading two epochs from an empty node")
    proxy = ThrottleProxy(endpoint, rate)
    try:
        env.update(S3_ENDPOINT_URL=proxy.url, AWS_ENDPOINT_URL=proxy.url)
        result = run_json([str(python), worker, "read", kind, "--remote", f"s3://{bucket}/{kind}",
                           "--dir", str(workdir / f"node-{kind}"), "--limit", str(budget),
                           "--records", str(records), "--epochs", "2", "--batch", str(BATCH)], env)
        return measure(result, proxy, records)
    finally:
        proxy.stop()


def print_table(rows: dict[str, dict[str, Any]], records: int, rate: int, budget: int, notes: list[str]) -> None:
    dataset = records * RECORD_BYTES
    ours: Optional[dict[str, Any]] = rows.get("yogacache")
    print(
        f"\nStreaming {records} records of 184x184x3 uint8 + int64 ({dataset / 2**30:.2f} GiB) from moto's S3 "
        f"server through a {rate / 1e6:.0f} MB/s link (link rate = {rate / RECORD_BYTES:.0f} records/s); "
        f"budget {budget / 2**30:.2f} GiB (half the dataset); dataset order, batches of {BATCH}\n"
    )
    header = ["reader", "first batch (s)", "epoch 1 (records/s)", "of the link", "epoch 1 fetched (GiB)",
              "epoch 2 fetched (GiB)"]
    lines = [header]
    for label, row in rows.items():
        cells = [label, f"{row['first_batch']:.2f}", f"{row['rate']:.0f}", f"{row['rate'] * RECORD_BYTES / rate:.2f}x",
                 f"{row['bytes'][0] / 2**30:.2f}", f"{row['bytes'][1] / 2**30:.2f}"]
        if ours is not None and label != "yogacache":
            cells[1] += f" ({row['first_batch'] / ours['first_batch']:.1f}x)"
            cells[2] += f" ({row['rate'] / ours['rate']:.2f}x)"
            cells[5] += f" ({row['bytes'][1] / max(1, ours['bytes'][1]):.1f}x)"
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")
    print("\n(x): the peer's value relative to yogacache's; epoch 2 target: <= dataset - budget + one part "
          f"= {(dataset - budget) / 2**30:.2f} GiB + one part")
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
