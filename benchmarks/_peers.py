"""Peer worker for ``bench_torch.py``: builds and reads MosaicML Streaming (MDS) and LitData.

Runs in ``benchmarks/.venv-peers`` (their pins conflict with the project's: mosaicml-streaming
wants numpy<2.2), one measurement per process, and prints one JSON line as its last output.
It imports nothing from yogacache; the records come from ``_data.py``, like yogacache's.

Usage: ``_peers.py {build,read} {mds,litdata} --dir DIR --workload NAME [--records N] ...``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

_ARRAYS: Optional[tuple[Any, Any]] = None
_SPEC: dict[str, Any] = {}


def _arrays() -> tuple[Any, Any]:
    """The workload's (images, labels), made once per process (spawned optimize workers too:
    they learn the workload from the environment)."""
    global _ARRAYS
    if _ARRAYS is None:
        if not _SPEC:
            _SPEC.update(json.loads(os.environ["BENCH_PEERS_SPEC"]))
        _ARRAYS = _data.make_arrays(_SPEC["records"], tuple(_SPEC["shape"]))
    return _ARRAYS


def litdata_item(index: int) -> dict[str, Any]:
    images, labels = _arrays()
    return {"image": images[index], "label": int(labels[index])}


def build_mds(directory: str) -> dict[str, Any]:
    from streaming import MDSWriter

    images, labels = _arrays()
    shape = ",".join(str(d) for d in images.shape[1:])
    start = time.perf_counter()
    with MDSWriter(out=directory, columns={"image": f"ndarray:uint8:{shape}", "label": "int64"}) as writer:
        for image, label in zip(images, labels):
            writer.write({"image": image, "label": int(label)})
    return {"seconds": time.perf_counter() - start}


def build_litdata(directory: str, workers: int) -> dict[str, Any]:
    from litdata import optimize

    _arrays()  # made before the clock starts, as for the other builders
    start = time.perf_counter()
    optimize(
        fn=litdata_item,
        inputs=list(range(_SPEC["records"])),
        output_dir=directory,
        chunk_bytes="64MB",
        num_workers=workers,
    )
    return {"seconds": time.perf_counter() - start}


def read(kind: str, directory: str, batch: int, workers: int, epochs: int, seed: int) -> dict[str, Any]:
    import torch

    expected_labels = int(_arrays()[1].sum())
    records = _SPEC["records"]
    if kind == "mds":
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = StreamingDataset(local=directory, shuffle=True, shuffle_seed=seed, batch_size=batch)
        loader: Any = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    else:
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(input_dir=directory, shuffle=True, seed=seed)
        loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
    results = []
    for _ in range(epochs):
        start = time.perf_counter()
        first: Optional[float] = None
        count = label_sum = 0
        for element in loader:
            if first is None:
                first = time.perf_counter() - start
            labels = element["label"]
            count += len(labels)
            label_sum += int(labels.sum())
            assert element["image"].dtype == torch.uint8
        seconds = time.perf_counter() - start
        if count != records or label_sum != expected_labels:
            raise RuntimeError(f"{kind} read {count} records (label sum {label_sum}), expected {records}")
        results.append({"seconds": seconds, "first_batch": first, "records": count})
    return {"epochs": results}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "read"])
    parser.add_argument("kind", choices=["mds", "litdata"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--batch", type=int, default=_data.BATCH)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=_data.SHUFFLE_SEED)
    args = parser.parse_args()
    _SPEC.update(records=args.records, shape=_data.WORKLOADS[args.workload]["shape"])
    os.environ["BENCH_PEERS_SPEC"] = json.dumps(_SPEC)
    if args.action == "build":
        result = build_mds(args.dir) if args.kind == "mds" else build_litdata(args.dir, args.workers)
    else:
        result = read(args.kind, args.dir, args.batch, args.workers, args.epochs, args.seed)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
