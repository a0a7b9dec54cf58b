"""Publish and fetch of a ~1 GiB cache against an S3 server: yogacache vs plain boto3 vs YogaDL.

Starts moto's S3 server on 127.0.0.1 (a subprocess), builds one cache locally, then measures in
one run:

1. publish: yogacache (parts in parallel, manifest last) vs plain boto3 ``upload_file`` of the
   same part files;
2. fetch on a fresh node: yogacache (download, SHA-256 verification, atomic swap) vs plain boto3
   ``download_file`` of the same objects;
3. a cache hit on a node whose copy is current: the number of S3 requests it costs;
4. YogaDL 0.1.4's ``S3Storage.fetch`` of the same records against the same server, where its
   virtualenv (``benchmarks/.venv-yogadl``, made by bench_core.py) exists.

Usage: ``.venv/bin/python benchmarks/bench_cloud.py [--gib 1.0] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from yogacache.backends.s3 import S3ObjectStore  # noqa: E402
from yogacache.store.remote import RemoteCacheStore  # noqa: E402

IMAGE = (184, 184, 3)
RECORD_BYTES = int(np.prod(IMAGE)) + 8
YOGADL_PYTHON = REPO / "benchmarks" / ".venv-yogadl" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(workdir / "moto.log", "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            time.sleep(0.1)
    return process, url


def records(count: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(1234)
    block = rng.integers(0, 256, size=(64, *IMAGE), dtype=np.uint8)
    for i in range(count):
        yield block[i % 64], np.int64(i)


def timed(fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="cache size in GiB")
    parser.add_argument("--quick", action="store_true", help="a 0.1 GiB smoke run")
    parser.add_argument("--no-yogadl", action="store_true")
    args = parser.parse_args()
    size = 0.1 if args.quick else args.gib
    count = int(size * (1 << 30) / RECORD_BYTES)

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    workdir = Path(tempfile.mkdtemp(prefix="yogacache-cloud-bench-"))
    moto, endpoint = start_moto(workdir)
    rows: list[tuple[str, str, str, str, str]] = []
    try:
        import boto3
        from boto3.s3.transfer import TransferConfig

        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench")
        objects = S3ObjectStore("bench", "yogacache", endpoint_url=endpoint)

        node_a = RemoteCacheStore(objects, workdir / "node-a", show_progress=False)
        seconds, manifest = timed(lambda: node_a.local.build("images", "v1", records(count)))
        total = manifest.total_size_bytes
        print(
            f"built {count:,} records, {total / (1 << 30):.2f} GiB in {len(manifest.parts)} parts in {seconds:.1f} s",
            file=sys.stderr,
        )
        directory = node_a.local.cache_dir("images", "v1")

        # 1. publish vs plain upload_file of the same part files.
        config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=8)
        plain_up, _ = timed(
            lambda: [
                client.upload_file(str(directory / p.name), "bench", f"plain/{p.name}", Config=config)
                for p in manifest.parts
            ]
        )
        ours_up, published = timed(lambda: node_a.publish_locked(manifest))
        assert published
        rows.append(
            (
                "publish (upload)",
                f"{total / ours_up / 1e6:,.0f} MB/s",
                f"{total / plain_up / 1e6:,.0f} MB/s (boto3 upload_file)",
                f"{plain_up / ours_up:.2f}x",
                ">= 0.9x",
            )
        )

        # 2. fetch on a fresh node vs plain download_file of the same objects.
        plain_dir = workdir / "plain-download"
        plain_dir.mkdir()
        plain_down, _ = timed(
            lambda: [
                client.download_file("bench", f"plain/{p.name}", str(plain_dir / p.name), Config=config)
                for p in manifest.parts
            ]
        )
        node_b = RemoteCacheStore(objects, workdir / "node-b", show_progress=False)
        ours_down, reader = timed(lambda: node_b.open("images", "v1"))
        assert len(reader) == count
        rows.append(
            (
                "fetch (download + SHA-256 verify + swap)",
                f"{total / ours_down / 1e6:,.0f} MB/s",
                f"{total / plain_down / 1e6:,.0f} MB/s (boto3 download_file, no verify)",
                f"{plain_down / ours_down:.2f}x",
                ">= 0.9x",
            )
        )

        # 3. a cache hit on a node whose copy is current.
        calls: list[str] = []
        objects._client.meta.events.register("before-call.s3.*", lambda model, **kw: calls.append(model.name))
        hit, _ = timed(lambda: node_b.open("images", "v1"))
        rows.append(
            (
                "cache hit, local copy current",
                f"{len(calls)} request(s): {', '.join(calls)}; {hit * 1000:.1f} ms",
                "-",
                "-",
                "1 small request",
            )
        )

        # 4. YogaDL 0.1.4 S3Storage.fetch of the same records on the same server.
        if args.no_yogadl or not YOGADL_PYTHON.exists():
            rows.append(
                (
                    "YogaDL 0.1.4 S3Storage fetch",
                    "-",
                    "not run (no benchmarks/.venv-yogadl; run bench_core.py once to create it)",
                    "-",
                    "(info)",
                )
            )
        else:
            script = textwrap.dedent(f"""
                import json, os, time, numpy as np, tensorflow as tf
                from yogadl import storage
                count = {count}
                rng = np.random.default_rng(1234)
                block = rng.integers(0, 256, size=(64, 184, 184, 3), dtype=np.uint8)
                ds = tf.data.Dataset.range(count).map(lambda i: (tf.gather(block, i % 64), i))
                def make(local):
                    cfg = storage.S3Configurations(bucket="bench", bucket_directory_path="yogadl",
                        url="ws://127.0.0.1:1", endpoint_url="{endpoint}", local_cache_dir=local)
                    return storage.S3Storage(cfg)
                os.makedirs("{workdir}/ydl-a")
                # YogaDL's fetch on a fresh node writes its metadata before creating the
                # directory: make it, as a YogaDL user would have to.
                os.makedirs("{workdir}/ydl-b/yogadl_local_cache/images/v1")
                make("{workdir}/ydl-a").submit(ds, "images", "v1")
                start = time.perf_counter()
                make("{workdir}/ydl-b").fetch("images", "v1")
                print(json.dumps({{"fetch": time.perf_counter() - start}}))
            """)
            result = subprocess.run(
                [str(YOGADL_PYTHON), "-c", script],
                capture_output=True,
                text=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                timeout=1800,
            )
            if result.returncode == 0:
                ydl = json.loads(result.stdout.strip().splitlines()[-1])["fetch"]
                rows.append(
                    (
                        "fetch vs YogaDL 0.1.4 S3Storage.fetch (same records, no verify)",
                        f"{ours_down:.2f} s",
                        f"{ydl:.2f} s",
                        f"{ydl / ours_down:.2f}x",
                        "(info)",
                    )
                )
            else:
                rows.append(
                    (
                        "YogaDL 0.1.4 S3Storage fetch",
                        "-",
                        "failed: " + result.stderr.strip().splitlines()[-1][:120],
                        "-",
                        "(info)",
                    )
                )
    finally:
        moto.terminate()
        moto.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)

    print(
        f"# yogacache cloud benchmark: {count:,} records of {RECORD_BYTES:,} bytes "
        f"({size:.2f} GiB) against moto's S3 server on 127.0.0.1\n"
    )
    print("| metric | yogacache | peer | ratio (yogacache speed / peer) | target |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
