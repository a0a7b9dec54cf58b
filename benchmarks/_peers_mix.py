"""Peer worker for ``bench_mix.py``: MosaicML Streaming ``Stream``s and LitData's
``CombinedStreamingDataset`` reading a three-component mixture, locally or streamed from S3.

Runs in ``benchmarks/.venv-peers`` (see ``bench_torch.peers_python``), one measurement per
process, and prints one JSON line as its last output. It imports nothing from yogacache (numpy
and ``_data`` only at import time, so ``bench_mix.py`` imports it too, for ``component_arrays``
and ``epoch_summary``: both sides make and count the same records).

The components' records: ``_data.make_arrays(n_i, shape, seed=DATA_SEED + i)``, the label of
component ``i`` offset by ``i * LABEL_BASE``, so that a label names its component.

Usage:
  ``_peers_mix.py build {mds,litdata} --dir DIR --spec JSON``: one subdirectory ``c<i>`` per component
  ``_peers_mix.py read {mds,litdata} --dir DIR --spec JSON [--remote s3://bucket/prefix --limit BYTES]``
  (``S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL`` name the proxy when ``--remote`` is given)

The spec: ``{"records": [n_0, n_1, n_2], "weights": [...], "shape": [h, w, c], "part_bytes": B,
"epochs": 2, "batch": 256, "workers": 2}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402

#: Component ``i``'s labels are ``i * LABEL_BASE + class``.
LABEL_BASE = _data.NUM_CLASSES
SEED = 7
_ALLOW_HTTP = "BENCH_LITDATA_ALLOW_HTTP"
_SPEC_ENV = "BENCH_MIX_SPEC"
_ARRAYS: dict[int, Any] = {}


def component_arrays(component: int, records: int, shape: Sequence[int]) -> tuple[Any, Any]:
    """``(images, labels)`` of component ``component``: the same in every process."""
    images, labels = _data.make_arrays(records, tuple(shape), seed=_data.DATA_SEED + component)
    return images, labels + component * LABEL_BASE


def epoch_summary(components: Any, labels: Any, parts: int) -> dict[str, Any]:
    """Counts and label sums per component of one batch's labels (``components`` = labels //
    LABEL_BASE), and the batch's component sequence as digits."""
    import numpy as np

    return {
        "counts": np.bincount(components, minlength=parts).tolist(),
        "label_sums": np.bincount(components, weights=labels, minlength=parts).astype(np.int64).tolist(),
        "sequence": (components.astype(np.uint8) + ord("0")).tobytes().decode("ascii"),
    }


class EpochCounter:
    """Accumulates what a loader yields in one epoch: records, per-component counts and label
    sums, and the order of components (as a string of digits)."""

    def __init__(self, parts: int) -> None:
        self.parts = parts
        self.counts = [0] * parts
        self.label_sums = [0] * parts
        self.sequence: list[str] = []
        self.first: Any = None

    def add(self, labels: Any) -> None:
        import numpy as np

        values = np.asarray(labels, dtype=np.int64)
        summary = epoch_summary(values // LABEL_BASE, values, self.parts)
        self.counts = [a + b for a, b in zip(self.counts, summary["counts"])]
        self.label_sums = [a + b for a, b in zip(self.label_sums, summary["label_sums"])]
        self.sequence.append(summary["sequence"])

    def result(self, start_wall: float, start: float) -> dict[str, Any]:
        return {"start": start_wall, "end": time.time(), "seconds": time.perf_counter() - start,
                "first_batch": self.first, "records": sum(self.counts), "counts": self.counts,
                "label_sums": self.label_sums, "sequence": "".join(self.sequence)}


def _spec() -> dict[str, Any]:
    return json.loads(os.environ[_SPEC_ENV])  # type: ignore[no-any-return]


def _component_data(component: int) -> tuple[Any, Any]:
    if component not in _ARRAYS:
        spec = _spec()
        _ARRAYS[component] = component_arrays(component, spec["records"][component], spec["shape"])
    return _ARRAYS[component]  # type: ignore[no-any-return]


def litdata_item(item: tuple[int, int]) -> dict[str, Any]:
    component, index = item
    images, labels = _component_data(component)
    return {"image": images[index], "label": int(labels[index])}


def allow_http() -> None:
    """The test server speaks plain http, which LitData's obstore client refuses by default."""
    import litdata.streaming.downloader as downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


if os.environ.get(_ALLOW_HTTP):  # a spawned LitData worker, importing this module as __mp_main__
    allow_http()


def build(kind: str, directory: str, spec: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    for component, records in enumerate(spec["records"]):
        out = os.path.join(directory, f"c{component}")
        if kind == "mds":
            from streaming import MDSWriter

            images, labels = _component_data(component)
            shape = ",".join(str(d) for d in spec["shape"])
            columns = {"image": f"ndarray:uint8:{shape}", "label": "int64"}
            with MDSWriter(out=out, columns=columns, size_limit=spec["part_bytes"]) as writer:
                for image, label in zip(images, labels):
                    writer.write({"image": image, "label": int(label)})
        else:
            from litdata import optimize

            optimize(fn=litdata_item, inputs=[(component, i) for i in range(records)], output_dir=out,
                     chunk_bytes=spec["part_bytes"], num_workers=1)
    return {"seconds": time.perf_counter() - start}


def read(kind: str, directory: str, spec: dict[str, Any], remote: str, limit: int) -> dict[str, Any]:
    import torch

    records, weights, batch, workers = spec["records"], spec["weights"], spec["batch"], spec["workers"]
    parts = len(records)
    if kind == "mds":
        import streaming  # noqa: F401 - imported before the clock starts
    else:
        import litdata  # noqa: F401
    opened_wall, opened = time.time(), time.perf_counter()  # epoch 1 is timed from here
    if kind == "mds":
        from streaming import Stream, StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        streams = [
            Stream(remote=f"{remote}/c{i}" if remote else None, local=os.path.join(directory, f"c{i}"),
                   proportion=weight)
            for i, weight in enumerate(weights)
        ]
        tuning: dict[str, Any] = {}
        if remote:  # tuned for streaming under a budget, as bench_stream.py's row
            record_bytes = 8 + int(__import__("math").prod(spec["shape"]))
            tuning = dict(shuffle_algo="py1e", shuffle_block_size=2 * max(1, spec["part_bytes"] // record_bytes),
                          num_canonical_nodes=1, cache_limit=limit)
        dataset: Any = StreamingDataset(streams=streams, epoch_size=sum(records), shuffle=True, shuffle_seed=SEED,
                                        batch_size=batch, **tuning)
        loader: Any = torch.utils.data.DataLoader(dataset, batch_size=batch, num_workers=workers)
    else:
        from litdata import CombinedStreamingDataset, StreamingDataLoader, StreamingDataset
        from litdata.streaming.resolver import Dir

        context = None
        options: dict[str, Any] = {}
        if remote:
            os.environ[_ALLOW_HTTP] = "1"  # for spawned workers too, which import this module anew
            allow_http()
            options = {"storage_options": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}}
            # LitData's obstore client does not survive fork (its workers hang on their first chunk).
            context = "spawn" if workers else None
        datasets = []
        for i in range(parts):
            local = os.path.join(directory, f"c{i}")
            if remote:
                # LitData has no node budget: each component may hold the whole budget (its share of it
                # hung the reader, waiting for room, when a component's share was a few chunks).
                datasets.append(StreamingDataset(input_dir=Dir(path=local, url=f"{remote}/c{i}"), shuffle=True,
                                                 seed=SEED, max_cache_size=limit, **options))
            else:
                datasets.append(StreamingDataset(input_dir=local, shuffle=True, seed=SEED))
        dataset = CombinedStreamingDataset(datasets, seed=SEED, weights=weights, iterate_over_all=False)
        loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers,
                                     multiprocessing_context=context)
    results = []
    for epoch in range(spec["epochs"]):
        start_wall, start = (opened_wall, opened) if epoch == 0 else (time.time(), time.perf_counter())
        counter = EpochCounter(parts)
        for element in loader:
            if counter.first is None:
                counter.first = time.perf_counter() - start
            counter.add(element["label"].numpy())
        results.append(counter.result(start_wall, start))
    return {"epochs": results}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "read"])
    parser.add_argument("kind", choices=["mds", "litdata"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--spec", required=True, help="JSON: records, weights, shape, part_bytes, epochs, ...")
    parser.add_argument("--remote", default="")
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    os.environ[_SPEC_ENV] = args.spec  # spawned optimize / loader workers read it too
    spec = _spec()
    if args.action == "build":
        result = build(args.kind, args.dir, spec)
    else:
        result = read(args.kind, args.dir, spec, args.remote, args.limit)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
