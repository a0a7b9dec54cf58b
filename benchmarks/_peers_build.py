"""Peer builders for ``bench_build.py`` (run in ``benchmarks/.venv-peers``): LitData ``optimize`` and
MosaicML ``MDSWriter`` over the JPEG source of ``_jpeg.py``. Prints one JSON line.

Usage: ``_peers_build.py {litdata,mds} --jpegs FILE --dir DIR [--workers N]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _jpeg  # noqa: E402
from _clock import cpu_seconds  # noqa: E402


def litdata_item(item: tuple[str, int]) -> dict[str, Any]:
    image, label = _jpeg.decode(*item)
    return {"image": image, "label": int(label)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["litdata", "mds"])
    parser.add_argument("--jpegs", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    records = len(_jpeg.JpegRecords(args.jpegs))
    # The peer's import (3.7-11 s here) is outside its clock, as yogacache's is in bench_build.
    if args.kind == "litdata":
        from litdata import optimize
    else:
        from streaming import MDSWriter
    cpu, start = cpu_seconds(), time.perf_counter()
    if args.kind == "litdata":
        optimize(
            fn=litdata_item,
            inputs=[(args.jpegs, i) for i in range(records)],
            output_dir=args.dir,
            chunk_bytes="64MB",
            num_workers=args.workers,
        )
    else:
        source = _jpeg.JpegRecords(args.jpegs)
        shape = ",".join(str(d) for d in source[0][0].shape)
        with MDSWriter(out=args.dir, columns={"image": f"ndarray:uint8:{shape}", "label": "int64"}) as writer:
            for i in range(records):
                image, label = source[i]
                writer.write({"image": image, "label": int(label)})
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "cpu": cpu_seconds() - cpu, "records": records}))


if __name__ == "__main__":
    main()
