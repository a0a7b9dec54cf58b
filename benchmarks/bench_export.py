"""Export rate: ``yogacache export`` against reading the cache and webdataset's own ShardWriter.

Three measurements per workload, all in this process, each the best of ``--reps`` passes:

* **read**: every record of the cache read and decoded in index order, as the export reads them
  (whole columns for fixed-shape caches), the export's upper bound;
* **yogacache export**: ``export_reader`` to a local directory (shards synced and renamed, the
  index last);
* **webdataset ShardWriter**: the same records read and decoded from the cache, handed to
  ``webdataset.ShardWriter`` as ``{"__key__", "<field>.npy": array, "<field>.cls": int, ...}``
  samples, which it encodes itself (no fsync).

Both writers produce the same samples (same keys, members and shard size). Nothing is
downloaded: the data is numpy's ``default_rng(1234)``.

    .venv/bin/python benchmarks/bench_export.py [--quick] [--reps N] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from yogacache.export import export_reader  # noqa: E402
from yogacache.read.reader import CacheReader  # noqa: E402
from yogacache.store.local import CacheStore  # noqa: E402

SHARD_SIZE = 256 << 20


def small_records(n: int) -> Iterator[dict[str, Any]]:
    """MNIST-like: a uint8[28, 28] image and an integer label (about 0.8 KB)."""
    rng = np.random.default_rng(1234)
    for i in range(n):
        yield {"image": rng.integers(0, 255, (28, 28), dtype=np.uint8), "label": int(i % 10)}


def large_records(n: int) -> Iterator[dict[str, Any]]:
    """ImageNet-like: about 110 KB of encoded-image bytes and a class."""
    rng = np.random.default_rng(1234)
    for i in range(n):
        yield {
            "jpg": rng.integers(0, 255, 100_000 + int(rng.integers(0, 20_000)), dtype=np.uint8).tobytes(),
            "cls": i % 1000,
        }


WORKLOADS: dict[str, tuple[Callable[[int], Iterator[dict[str, Any]]], int]] = {
    "small (28x28 uint8 + label)": (small_records, 60_000),
    "large (~110 KB bytes + cls)": (large_records, 2_000),
}


def read_all(reader: CacheReader) -> int:
    """Reads and decodes every record as the export does (whole columns for fixed-shape caches)."""
    decode = reader.codec.decode
    fixed = reader.codec.layout is not None
    total = len(reader)
    count = 0
    for start in range(0, total, 1024):
        indices = np.arange(start, min(start + 1024, total))
        if fixed:
            columns = reader.read_columns(indices)
            count += sum(1 for row in range(len(indices)) if [column[row] for column in columns])
            continue
        for value in reader.read_values(indices):
            decode(value)
            count += 1
    return count


def shardwriter_all(reader: CacheReader, out: Path) -> int:
    import webdataset as wds

    out.mkdir()
    total = len(reader)
    count = 0
    with wds.ShardWriter(str(out / "wds-%06d.tar"), maxsize=SHARD_SIZE, maxcount=10**9, verbose=0, mtime=0) as sink:
        for start in range(0, total, 1024):
            for index, element in enumerate(reader.read_elements(np.arange(start, min(start + 1024, total))), start):
                sample: dict[str, Any] = {"__key__": f"{index:09d}"}
                for name, value in element.items():
                    if isinstance(value, bytes):
                        sample[name] = value
                    elif np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype, np.integer):
                        sample[f"{name}.cls"] = int(value)
                    else:
                        sample[f"{name}.npy"] = np.asarray(value)
                sink.write(sample)
                count += 1
    return count


def best_of(reps: int, run: Callable[[int], int]) -> float:
    best = float("inf")
    for rep in range(reps):
        start = time.perf_counter()
        run(rep)
        best = min(best, time.perf_counter() - start)
    return best


def measure(work: Path, dataset_id: str, reps: int) -> tuple[int, int, float, float, float]:
    """(records, tar bytes, read s, export s, ShardWriter s) for one cache, best of ``reps``."""
    store = CacheStore(work / "caches", show_progress=False)
    sizes: list[int] = []

    def export(reader: CacheReader, rep: int) -> int:
        out = work / f"export-{dataset_id}-{rep}"
        result = export_reader(reader, out, shard_size=SHARD_SIZE, show_progress=False)
        shutil.rmtree(out)
        sizes.append(result.size_bytes)
        return result.num_records

    def webdataset(reader: CacheReader, rep: int) -> int:
        out = work / f"wds-{dataset_id}-{rep}"
        done = shardwriter_all(reader, out)
        shutil.rmtree(out)
        return done

    with store.open(dataset_id, "v1") as reader:
        read_all(reader)  # warm the page cache
        read_s = best_of(reps, lambda rep: read_all(reader))
        export_s = best_of(reps, lambda rep: export(reader, rep))
        wds_s = best_of(reps, lambda rep: webdataset(reader, rep))
        return len(reader), sizes[0], read_s, export_s, wds_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10x fewer records")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-export-", dir=args.workdir))
    rows = []
    try:
        for number, (name, (make, count)) in enumerate(WORKLOADS.items()):
            dataset_id = f"w{number}"
            CacheStore(work / "caches", show_progress=False).build(
                dataset_id, "v1", make(count // 10 if args.quick else count)
            )
            row = measure(work, dataset_id, args.reps)
            print(f"{name}: read {row[2]:.2f} s, export {row[3]:.2f} s, ShardWriter {row[4]:.2f} s", file=sys.stderr)
            rows.append((name, *row))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(
        "| workload | records | tar bytes | read cache (records/s) | yogacache export (records/s) "
        "| webdataset ShardWriter (records/s) | export / read | export / ShardWriter |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, n, tar_bytes, read_s, export_s, wds_s in rows:
        print(
            f"| {name} | {n:,} | {tar_bytes / 1e6:,.1f} MB | {n / read_s:,.0f} "
            f"| {n / export_s:,.0f} ({tar_bytes / 1e6 / export_s:,.0f} MB/s) | {n / wds_s:,.0f} "
            f"| {read_s / export_s:.2f}x | {wds_s / export_s:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
