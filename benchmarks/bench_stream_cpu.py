"""The CPU cost of a streamed gigabyte, stage by stage, against a local object server that costs
next to nothing per byte (issue 36 item 3).

Builds a cache of ``--size`` bytes (default 1Gi) of records of 100 KB random bytes (one uint8
array each), in parts of ``--part-bytes`` (default 64Mi, yogacache's for object stores),
published to a ``FileObjectStore`` directory, and serves that directory as an S3 bucket with
``_static_s3.py`` (a process of its own; bodies sent with ``sendfile`` from the page cache, where
moto would copy the whole object per GET). Nothing is dropped from the page cache: every stage
reads bytes already in memory, so what it measures is CPU, the server's side zero-copy. Then,
one stage after another, each timed with ``time.perf_counter()`` and ``os.times()`` (this
process: every thread, user and system apart; each stage that can run again runs three times,
and the run of median CPU is shown: the system CPU of writing new page-cache pages varies
several-fold from run to run in a virtual machine), with the server process's CPU from its
``/proc/<pid>/stat`` (or psutil) where the stage talks to it:

- link ceiling, GET: boto3's ``get_object(...)["Body"]`` of every part object read in 1 MiB
  chunks and discarded, one after another on one connection; then the same, each chunk written
  to a file (one file, rewritten per part: what writing the bytes to the page cache adds);
- link ceiling, s3transfer: s3transfer's download of every part to a temporary file, with
  ``S3ObjectStore``'s client and transfer settings, its size given (no HEAD);
- fetch: ``S3ObjectStore.download_file(key, path, size=...)`` of every part, as a streamed read
  fetches it (one ranged GET; no HEAD: its size is the manifest's; a part larger than
  ``multipart_bytes`` in ranges at once, pinned with ``If-Match``);
- hash, BLAKE3: ``format.integrity.part_matches`` of each fetched file (as ``download_part``);
- hash, CRC32C: ``format.checksum.crc32c_file`` of each (``Crc32c``: not on a streamed read's
  path; the cost of checking a part against the cloud's own checksum);
- durability: per part ``chmod``, ``fsync_path`` of the file, ``os.replace`` to its name and
  ``fsync_path`` of the directory (as ``download_part`` and ``StreamingParts._fetch``);
- first read: every record, in order, through a ``CacheReader`` of the fetched files (verify
  ``size``: hashing is the rows above), read as ``read_stream``'s whole reads
  (``batch_iterator_fn``, as the TensorFlow adapter reads), the parts' pages faulted in for the
  first time;
- end to end: ``RemoteCacheStore(S3ObjectStore, node, streaming=True)`` with no
  ``local_cache_limit`` on an empty node directory: ``open``, then every record in order as in
  the row above, then ``close`` (the S3 client is made before the clock: once per process).

The rows above the last are the parts of the last, done one at a time on one thread; the last
overlaps them (parts fetched ahead on the transfer threads while the reader reads). Each read
stage checks every record: the count, the bytes, and its first 16 bytes against what was
written; each transfer stage checks the bytes it moved against the manifest. The requests the
streamed read sent are listed under the table, with the target (CPU s per GB of the end to end
row <= 0.5), the machine's load and the command. GB: 10^9 bytes of the cache's part files.

Usage: ``.venv/bin/python benchmarks/bench_stream_cpu.py [--size 1Gi] [--part-bytes 64Mi]
[--workdir DIR]`` (``--size 256Mi``: a quick run). Needs about three times ``--size`` on disk.
One run; the numbers are as noisy as the machine, whose load it prints.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from _static_s3 import StaticS3  # noqa: E402

from yogacache.backends.files import FileObjectStore  # noqa: E402
from yogacache.format.checksum import crc32c_file  # noqa: E402
from yogacache.format.durability import fsync_path  # noqa: E402
from yogacache.format.integrity import STATE_DIR_ENV, part_matches  # noqa: E402
from yogacache.format.manifest import Manifest, PartInfo  # noqa: E402
from yogacache.read.options import ReadOptions  # noqa: E402
from yogacache.read.pipeline import read_stream  # noqa: E402
from yogacache.read.reader import CacheReader  # noqa: E402
from yogacache.sizes import parse_size  # noqa: E402
from yogacache.store import keys  # noqa: E402
from yogacache.store.remote import REMOTE_PART_SIZE, RemoteCacheStore  # noqa: E402

RECORD_BYTES = 100_000
HEAD_BYTES = 16  # the bytes of each record compared with what was written
CHUNK = 1 << 20  # the GET ceiling's read size
DS, VER = "bench-stream-cpu", "v1"
BUCKET, PREFIX = "bench", "caches"  # the bucket's directory holds the FileObjectStore under PREFIX
SEED = 36
TARGET = 0.5  # CPU s per GB of the end to end row (issue 36)


def log(message: str) -> None:
    print(f"[bench_stream_cpu] {message}", file=sys.stderr, flush=True)


def make_records(count: int, heads: list[bytes]) -> Iterator[np.ndarray]:
    """``count`` records of ``RECORD_BYTES`` random bytes; appends each one's first bytes to ``heads``."""
    rng = np.random.default_rng(SEED)
    for _ in range(count):
        record = np.frombuffer(rng.bytes(RECORD_BYTES), dtype=np.uint8)
        heads.append(record[:HEAD_BYTES].tobytes())
        yield record


def server_cpu(pid: int) -> float:
    """CPU seconds (user and system, every thread) of process ``pid`` so far."""
    try:
        import psutil
    except ImportError:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()  # after the command's name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


@dataclass(frozen=True)
class Row:
    stage: str
    bytes: int
    wall: float
    cpu: float
    server_cpu: Optional[float]  # None: the stage does not talk to the server
    user: float = 0.0  # of ``cpu``: in this process's own code and libraries
    system: float = 0.0  # of ``cpu``: in the kernel (copies, page-cache pages, fsync)


REPS = 3  # runs of each stage that can run again; the median by CPU is shown


def measure(stage: str, size: int, work: Callable[[], int], server: Optional[StaticS3] = None, reps: int = REPS) -> Row:
    """Runs ``work`` (which returns the bytes it handled: they must be ``size``) ``reps`` times
    and keeps the run of median CPU."""
    log(stage)
    runs = []
    for _ in range(reps):
        served = server_cpu(server.pid) if server is not None else 0.0
        wall, before = time.perf_counter(), os.times()
        handled = work()
        wall, after = time.perf_counter() - wall, os.times()
        if handled != size:
            raise SystemExit(f"{stage}: handled {handled} bytes, expected {size}")
        user, system = after.user - before.user, after.system - before.system
        runs.append(
            Row(stage, size, wall, user + system, server_cpu(server.pid) - served if server else None, user, system)
        )
    return sorted(runs, key=lambda row: row.cpu)[len(runs) // 2]


def read_records(reader: CacheReader, heads: list[bytes]) -> int:
    """Reads every record of ``reader`` in order (read_stream's whole reads); checks each record's
    size and first bytes against ``heads``; returns the cache's part bytes when all match."""
    seen: list[bytes] = []
    payload = 0
    batches = read_stream(reader, ReadOptions()).batch_iterator_fn
    if batches is None:
        raise SystemExit("the cache's records do not stack: no whole reads")
    for columns in batches():
        (records,) = columns
        payload += records.nbytes
        seen.extend(row.tobytes() for row in records[:, :HEAD_BYTES])
    if payload != len(heads) * RECORD_BYTES or seen != heads:
        wrong = next((i for i, (a, b) in enumerate(zip(seen, heads)) if a != b), min(len(seen), len(heads)))
        raise SystemExit(f"read {len(seen)} records ({payload} bytes) of {len(heads)}; the first wrong one: {wrong}")
    return reader.manifest.total_size_bytes


def requests_sent(lines: list[str]) -> str:
    """The server's log lines (``METHOD KEY RANGE IF-MATCH STATUS``) counted by kind."""
    kinds: Counter[str] = Counter()
    for line in lines:
        method, key, asked, pin, status = line.split(" ")
        what = "manifest" if key.endswith("/manifest.json") else "part" if key.endswith(".mdb") else key
        notes = [note for note, sent in (("ranged", asked != "-"), ("If-Match", pin != "-")) if sent]
        kinds[f"{method} {what}{' (' + ', '.join(notes) + ')' if notes else ''} -> {status}"] += 1
    return "; ".join(f"{count} x {kind}" for kind, count in kinds.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", default="1Gi", help="the cache's records' bytes (K M G T, Ki Mi Gi Ti); default 1Gi")
    parser.add_argument(
        "--part-bytes", default=f"{REMOTE_PART_SIZE >> 20}Mi", help="the parts' size; default yogacache's (64Mi)"
    )
    parser.add_argument("--workdir", help="where the bucket and the node go (a new directory under it)")
    args = parser.parse_args()
    count = max(1, parse_size(args.size, "--size") // RECORD_BYTES)
    part_bytes = parse_size(args.part_bytes, "--part-bytes")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")

    work = Path(tempfile.mkdtemp(prefix="bench-stream-cpu-", dir=args.workdir))
    os.environ[STATE_DIR_ENV] = str(work / "state")  # the stamps of hashed parts: removed with the rest
    try:
        heads: list[bytes] = []
        log(f"building and publishing {count} records of {RECORD_BYTES} bytes in parts of {part_bytes} bytes")
        builder = RemoteCacheStore(
            FileObjectStore(work / "bucket" / PREFIX),
            work / "builder",
            part_size_bytes=part_bytes,
            show_progress=False,
        )
        with builder.get_or_build(DS, VER, lambda: make_records(count, heads)) as built:
            manifest = built.manifest
        shutil.rmtree(work / "builder")
        with StaticS3(work / "bucket", BUCKET, log=work / "requests.log") as server:
            rows, streamed = measure_stages(manifest, server, work, heads)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(rows, manifest, streamed)
    python = os.path.relpath(sys.executable) if Path(sys.executable).is_relative_to(Path.cwd()) else sys.executable
    print(f"\n`{shlex.join([python, *sys.argv])}`")


def measure_stages(manifest: Manifest, server: StaticS3, work: Path, heads: list[bytes]) -> tuple[list[Row], str]:
    """Every stage's row, in order, and the requests the end to end row sent (``requests_sent``)."""
    import boto3
    from s3transfer.manager import TransferManager
    from s3transfer.subscribers import BaseSubscriber

    from yogacache.backends.s3 import S3ObjectStore

    objects = S3ObjectStore(BUCKET, PREFIX, endpoint_url=server.url)
    client = boto3.session.Session().client("s3", endpoint_url=server.url)
    parts = [(f"{PREFIX}/{keys.part_key(manifest, part)}", part) for part in manifest.parts]
    size = manifest.total_size_bytes
    fetched = work / "fetched"
    fetched.mkdir()

    def get_ceiling(write: bool) -> int:
        total = 0
        for number, (key, _) in enumerate(parts):
            body = client.get_object(Bucket=BUCKET, Key=key)["Body"]
            # One file per part, as a fetch writes them (new page-cache pages, not one file's again).
            with open(work / f"ceiling-{number}.tmp", "wb") if write else nullcontext() as handle:
                while chunk := body.read(CHUNK):
                    total += len(chunk)
                    if handle is not None:
                        handle.write(chunk)
        for number in range(len(parts)):
            (work / f"ceiling-{number}.tmp").unlink(missing_ok=True)
        return total

    class KnownSize(BaseSubscriber):  # type: ignore[misc]
        """Gives s3transfer the object's size, so that it sends no HEAD."""

        def __init__(self, size: int) -> None:
            self.size = size

        def on_queued(self, future: Any, **kwargs: Any) -> None:
            future.meta.provide_transfer_size(self.size)

    def transfer_ceiling() -> int:
        total = 0
        # S3ObjectStore's own client and transfer settings (thread count, multipart threshold).
        with TransferManager(objects._client, objects._transfer) as manager:
            for number, (key, part) in enumerate(parts):
                temp = work / f"ceiling-{number}.tmp"
                manager.download(BUCKET, key, str(temp), subscribers=[KnownSize(part.size_bytes)]).result()
                total += temp.stat().st_size
        for number in range(len(parts)):
            (work / f"ceiling-{number}.tmp").unlink()
        return total

    def temp(part: PartInfo) -> Path:
        return fetched / f".{part.name}.download"

    def fetch() -> int:
        for _, part in parts:
            objects.download_file(keys.part_key(manifest, part), temp(part), size=part.size_bytes)
        return sum(temp(part).stat().st_size for _, part in parts)

    def blake3() -> int:
        for _, part in parts:
            if not part_matches(temp(part), part):
                raise SystemExit(f"{part.name} does not match its manifest's hash")
        return size

    def crc32c() -> int:
        for _, part in parts:
            value = crc32c_file(temp(part))
            if part.crc32c is not None and value != part.crc32c:
                raise SystemExit(f"{part.name}: CRC32C {value}, its manifest says {part.crc32c}")
        return size

    def durability() -> int:
        for _, part in parts:
            os.chmod(temp(part), 0o644)
            fsync_path(temp(part))
            os.replace(temp(part), fetched / part.name)
            fsync_path(fetched)
        return size

    def first_read() -> int:
        with CacheReader(fetched, manifest, verify="size") as reader:
            return read_records(reader, heads)

    nodes = iter(range(1_000_000))

    def end_to_end() -> int:
        node = work / f"node-{next(nodes)}"  # an empty node each run; the last run's removed
        for old in work.glob("node-*"):
            shutil.rmtree(old)
        store = RemoteCacheStore(objects, node, streaming=True, show_progress=False)
        with store.open(DS, VER) as reader:
            if not reader.streamed:
                raise SystemExit("the end to end read did not stream")
            return read_records(reader, heads)

    rows = [
        measure("link ceiling: get_object, 1 MiB reads, discarded", size, lambda: get_ceiling(False), server),
        measure("link ceiling: get_object, 1 MiB reads, to a file", size, lambda: get_ceiling(True), server),
        measure("link ceiling: s3transfer download to a file", size, transfer_ceiling, server),
        measure("fetch: S3ObjectStore.download_file(size=...)", size, fetch, server),
        measure("hash: BLAKE3 (part_matches)", size, blake3),
        measure("hash: CRC32C (crc32c_file)", size, crc32c),
        measure("durability: chmod, fsync, rename, fsync dir", size, durability, reps=1),
        measure("first read: CacheReader of the files, every record", size, first_read),
    ]
    rows.append(measure("end to end: streamed read through S3", size, end_to_end, server))
    start = len(server.requests())
    end_to_end()  # once more, for the requests of one streamed read
    return rows, requests_sent(server.requests()[start:])


def print_table(rows: list[Row], manifest: Manifest, streamed: str) -> None:
    largest = max(part.size_bytes for part in manifest.parts)
    print(
        f"\nCPU per streamed GB: {manifest.num_records} records of {RECORD_BYTES} random bytes, "
        f"{manifest.total_size_bytes / 1e9:.3f} GB in {len(manifest.parts)} parts of up to "
        f"{largest / 2**20:.1f} MiB, served by _static_s3.py (sendfile) on 127.0.0.1; every byte in the "
        "page cache (nothing dropped): CPU, not disk\n"
    )
    header = [
        "stage",
        "GB",
        "wall s",
        "GB/s",
        "CPU s",
        "CPU s per GB",
        "of it user",
        "of it system",
        "server CPU s per GB",
    ]
    lines = [header]
    for row in rows:
        gb = row.bytes / 1e9
        served = "" if row.server_cpu is None else f"{row.server_cpu / gb:.3f}"
        lines.append(
            [
                row.stage,
                f"{gb:.3f}",
                f"{row.wall:.3f}",
                f"{gb / row.wall:.2f}",
                f"{row.cpu:.3f}",
                f"{row.cpu / gb:.3f}",
                f"{row.user / gb:.3f}",
                f"{row.system / gb:.3f}",
                served,
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for number, line in enumerate(lines):
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(line, widths))
        ]
        print("| " + " | ".join(cells) + " |")
        if number == 0:
            print(
                "|" + "|".join(("-" * (w + 2)) if i == 0 else ("-" * (w + 1) + ":") for i, w in enumerate(widths)) + "|"
            )
    end = rows[-1]
    per_gb = end.cpu / (end.bytes / 1e9)
    print(
        f"\ntarget (issue 36): end to end <= {TARGET} CPU s per GB: {'met' if per_gb <= TARGET else 'missed'} "
        f"({per_gb:.3f})"
    )
    print(f"the streamed read sent: {streamed}")
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"load average (1, 5, 15 min) at the end: {load}; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
