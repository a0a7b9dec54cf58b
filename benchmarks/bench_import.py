"""Caching WebDataset shards from an S3 server: ``yogacache import`` vs webdataset's reader vs raw decode.

Starts moto's S3 server on 127.0.0.1 (a subprocess), writes ~``--gib`` GiB of WebDataset shards
(``<key>.jpg``: JPEG-sized incompressible bytes, 60-140 KiB; ``<key>.cls``: the class as text)
with ``webdataset.ShardWriter``, compresses each shard (``--compression gz|zst|none``), uploads
them, then measures in one run:

1. raw decode: the shards' bytes already in memory, read member by member with stdlib ``tarfile``
   (+ ``gzip`` or ``zstandard``): the ceiling of any reader of this compression;
2. plain GET: boto3 ``get_object`` of every shard, body read and dropped (what the server gives);
3. webdataset: ``webdataset.WebDataset`` over presigned http URLs of the same objects (its curl
   opener), every sample iterated;
4. yogacache's source alone: ``from_url(...).records()`` iterated (what webdataset's reader does);
5. yogacache import: ``import_source`` of ``s3://.../shard-{...}`` into a local cache store
   (list, conditional streamed GETs, decode, group, encode, LMDB write, seal);
6. the freshness check a cache hit makes, with its request count;

7. with ``--workers N`` (default 2): the same import with N processes, one build shard per object.

Usage: ``.venv/bin/python benchmarks/bench_import.py [--gib 2.0] [--compression gz] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import gzip
import io
import math
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from yogacache.parallel import sharded  # noqa: E402
from yogacache.sources import from_url  # noqa: E402
from yogacache.sources.freshness import check_pins  # noqa: E402
from yogacache.sources.importer import import_source  # noqa: E402
from yogacache.store import open_store  # noqa: E402

SHARD_BYTES = 64 << 20
SUFFIX = {"gz": ".tar.gz", "zst": ".tar.zst", "none": ".tar"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = open(workdir / "moto.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=1)
            return process, url
        except urllib.error.HTTPError:
            return process, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto did not start")


def compress(data: bytes, compression: str) -> bytes:
    if compression == "gz":
        return gzip.compress(data, compresslevel=1)
    if compression == "zst":
        import zstandard

        return zstandard.ZstdCompressor(level=1).compress(data)
    return data


def make_shards(workdir: Path, gib: float, compression: str) -> tuple[list[bytes], int]:
    """Shards written by webdataset.ShardWriter, compressed; and the number of samples."""
    import webdataset as wds

    rng = np.random.default_rng(0)
    target = int(gib * (1 << 30))
    pattern = str(workdir / "shard-%06d.tar")
    written = samples = 0
    with wds.ShardWriter(pattern, maxsize=SHARD_BYTES, verbose=0) as sink:
        while written < target:
            size = int(rng.integers(60 << 10, 140 << 10))
            sink.write({"__key__": f"img{samples:08d}", "jpg": rng.bytes(size), "cls": str(samples % 1000).encode()})
            written += size
            samples += 1
    shards = []
    for path in sorted(workdir.glob("shard-*.tar")):
        shards.append(compress(path.read_bytes(), compression))
        path.unlink()
    return shards, samples


def raw_decode(shards: list[bytes], compression: str, isal: bool = False) -> int:
    """Samples in ``shards`` read with stdlib tarfile (its own gzip), or with the whole shard
    inflated first by ``isal`` (ISA-L) and tarfile reading the plain tar."""
    samples = 0
    for data in shards:
        stream: Any = io.BytesIO(data)
        mode = "r|gz" if compression == "gz" else "r|"
        if compression == "gz" and isal:
            from isal import isal_zlib

            stream, mode = io.BytesIO(isal_zlib.decompress(data, 16 + 15)), "r|"
        if compression == "zst":
            import zstandard

            stream = zstandard.ZstdDecompressor().stream_reader(stream)
        with tarfile.open(fileobj=stream, mode=mode) as archive:
            for info in archive:
                handle = archive.extractfile(info)
                if handle is not None:
                    handle.read()
                    samples += info.name.endswith(".jpg")
    return samples


def timed(what: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = what()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=2.0, help="GiB of sample bytes (default 2.0)")
    parser.add_argument("--compression", choices=sorted(SUFFIX), default="gz")
    parser.add_argument("--workers", type=int, default=2, help="also import with this many processes (1: no)")
    args = parser.parse_args()
    import boto3
    import webdataset as wds

    workdir = Path(tempfile.mkdtemp(prefix="bench-import-"))
    moto, endpoint = start_moto(workdir)
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="bench-shards")
        shards, samples = make_shards(workdir, args.gib, args.compression)
        suffix = SUFFIX[args.compression]
        keys = [f"imagenet/shard-{i:06d}{suffix}" for i in range(len(shards))]
        for key, data in zip(keys, shards):
            client.put_object(Bucket="bench-shards", Key=key, Body=data)
        total = sum(len(data) for data in shards)
        print(f"{len(shards)} shards, {samples:,} samples, {total / (1 << 20):,.0f} MiB ({args.compression}) "
              f"on moto at {endpoint}; machine: {os.cpu_count()} cores, shared (timings are noisy)")

        rows: list[tuple[str, float, int]] = []
        start = time.perf_counter()
        decoded = raw_decode(shards, args.compression)
        seconds = time.perf_counter() - start
        assert decoded == samples
        rows.append((f"raw decode (tarfile{' + gzip' if args.compression == 'gz' else ''}, in memory)",
                     seconds, samples))
        if args.compression == "gz":
            start = time.perf_counter()
            assert raw_decode(shards, args.compression, isal=True) == samples
            rows.append(("raw decode (isal inflate + tarfile, in memory)", time.perf_counter() - start, samples))
        shards.clear()

        def plain_get() -> None:
            for key in keys:
                client.get_object(Bucket="bench-shards", Key=key)["Body"].read()

        rows.append(("plain boto3 GET of the shards (no decode)", timed(plain_get)[0], samples))

        urls = [client.generate_presigned_url("get_object", Params={"Bucket": "bench-shards", "Key": key},
                                              ExpiresIn=3600) for key in keys]

        def webdataset_reader() -> int:
            return sum(1 for _ in wds.WebDataset(urls, shardshuffle=False))

        seconds, read = timed(webdataset_reader)
        assert read == samples, (read, samples)
        rows.append(("webdataset.WebDataset (curl over http)", seconds, samples))

        pattern = f"s3://bench-shards/imagenet/shard-{{000000..{len(keys) - 1:06d}}}{suffix}"
        reading = from_url(pattern, endpoint_url=endpoint)
        seconds, read = timed(lambda: sum(1 for _ in reading.records()))
        assert read == samples
        rows.append(("yogacache from_url records only (no cache write)", seconds, samples))

        store = open_store(str(workdir / "caches"), show_progress=False)
        source = from_url(pattern, endpoint_url=endpoint)
        seconds, result = timed(lambda: import_source(store, "imagenet", source, "auto", show_progress=False))
        assert result.manifest.num_records == samples
        rows.append(("yogacache import (S3 -> LMDB cache, sealed)", seconds, samples))
        imports = [rows[-1]]
        if args.workers > 1:
            parallel_store = open_store(str(workdir / "caches-parallel"), show_progress=False)
            source = from_url(pattern, endpoint_url=endpoint)
            seconds, parallel_result = timed(lambda: import_source(
                parallel_store, "imagenet", source, "auto", show_progress=False,
                parallel=lambda whole: sharded(whole, args.workers),
            ))
            assert parallel_result.manifest.num_records == samples
            rows.append((f"yogacache import --workers {args.workers} (one build shard per object)", seconds, samples))
            imports.append(rows[-1])

        check_seconds, check = timed(lambda: check_pins(result.manifest.extra["sources"]))
        print()
        width = max(len(name) for name, _, _ in rows)
        ours = imports[0][1]
        print(f"{'path'.ljust(width)}  {'seconds':>8}  {'MiB/s':>8}  {'samples/s':>10}  {'import speed ratio':>18}")
        for name, secs, count in rows:
            print(f"{name.ljust(width)}  {secs:8.2f}  {total / (1 << 20) / secs:8.1f}  {count / secs:10,.0f}  "
                  f"{secs / ours:17.2f}x")
        print()
        print("import speed ratio: that path's time / the one-process import's time (>= 1.0x: import is as fast)")
        reference = {name: secs for name, secs, _ in rows}
        webdataset_seconds = reference["webdataset.WebDataset (curl over http)"]
        decode_seconds = min(secs for name, secs, _ in rows if name.startswith("raw decode"))
        print()
        print("| import | vs webdataset's reader (target >= 1.0x) | vs raw decode (target >= 0.9x) |")
        print("|---|---:|---:|")
        for name, secs, _ in imports:
            print(f"| {name} | {webdataset_seconds / secs:.2f}x | {decode_seconds / secs:.2f}x |")
        pages = math.ceil(check.objects / 1000)
        print(f"freshness check on a cache hit: {check.requests} request(s) for {check.objects} objects "
              f"({check_seconds * 1000:.0f} ms; at most ceil(objects / 1000) = {pages} LIST page(s), no GET)")
    finally:
        moto.terminate()
        moto.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
