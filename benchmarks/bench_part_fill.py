#!/usr/bin/env python
"""How full part files come out now that ``part_bytes`` bounds the file, LMDB's pages included.

For each (record size, ``part_bytes``) row, builds a local cache of about three parts' worth of
``{"x": uint8[record]}`` records with ``CacheStore(part_size_bytes=...)`` and prints the number
of parts and the largest and mean part file (the last part excluded from the mean) as fractions
of ``part_bytes``. A fraction above 1.00 would break the bound; well below 1.00 is space lost
to the writer's upper estimate of what a transaction adds.

    .venv/bin/python benchmarks/bench_part_fill.py
"""

from __future__ import annotations

import tempfile

import numpy as np

from yogacache.store.local import CacheStore

MiB = 1 << 20
ROWS = [(4096, 64 * MiB), (100, 64 * MiB), (4096, 1 * MiB), (200_000, 16 * MiB), (1024, 256 << 10)]
MAX_RECORDS = 400_000


def main() -> None:
    print("| records | part_bytes | parts | largest file / part_bytes | mean / part_bytes |")
    print("|---|---|---|---|---|")
    for record, part in ROWS:
        n = min(3 * part // record, MAX_RECORDS)
        with tempfile.TemporaryDirectory() as root:
            store = CacheStore(root, part_size_bytes=part, show_progress=False)
            store.build("fill", "v1", ({"x": np.full(record, i % 251, np.uint8)} for i in range(n)))
            sizes = [p.size_bytes for p in store.manifest("fill", "v1").parts]
        full = sizes[:-1] or sizes
        print(
            f"| {n:,} × {record:,} B | {part / MiB:g} MiB | {len(sizes)} | {max(sizes) / part:.2f} "
            f"| {np.mean(full) / part:.2f} |"
        )


if __name__ == "__main__":
    main()
