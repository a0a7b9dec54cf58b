"""Peer worker for ``bench_grain_ray.py``: writes MosaicML MDS shards and reads them through Ray Data.

Runs in ``benchmarks/.venv-peers`` (mosaicml-streaming pins numpy<2.2, the project's venv has a newer
numpy; ``bench_grain_ray.py`` adds ``ray[data]`` there, the version of the project's venv), one
measurement per process, and prints one JSON line as its last output. It imports nothing from
yogacache; the records come from ``_data.py``, like every other system's. ``EpochCount`` (the
consumer every row of ``bench_grain_ray.py`` runs, here or there) lives here so that both
interpreters import the same code.

Ray 2.60 has no ``read_mds``, so the MDS row reads the shards the way a Ray user would without
one: a ``ray.data.Datasource`` with one read task per shard, each decoding its shard's samples
with MosaicML's own reader (``reader_from_json(...).get_item(i)``) into a block of numpy
columns (``BlockAccessor.batch_to_block``: the image as Ray's tensor column).

Usage: ``_peers_ray.py {build,read} mds --dir DIR --spec JSON [--rows ray-mds-shuffled,ray-mds-ordered]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from typing import Any, Callable, Iterable, Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _data  # noqa: E402


class EpochCount:
    """Counts one epoch's batches (records, label sum, batches of the wrong shape or type) and
    times it from ``start`` (``time.perf_counter()``, taken by the caller) to the last batch."""

    def __init__(self, start: float, shape: list[int]) -> None:
        self.start, self.shape = start, tuple(shape)
        self.records = self.label_sum = self.batches = 0
        self.first: Optional[float] = None
        self.bad: Optional[str] = None

    def add(self, image: Any, label: Any) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.start
        self.batches += 1
        if self.bad is None and (str(image.dtype) != "uint8" or tuple(image.shape[1:]) != self.shape
                                 or len(image) != len(label)):
            self.bad = f"batch {self.batches}: image {image.dtype} {tuple(image.shape)}, {len(label)} labels"
        self.records += len(label)
        self.label_sum += int(label.sum())

    def result(self) -> dict[str, Any]:
        return {"seconds": time.perf_counter() - self.start, "first_batch": self.first, "records": self.records,
                "label_sum": self.label_sum, "batches": self.batches, "bad": self.bad}


def start_ray(modules: Sequence[str] = ()) -> Any:
    """A local Ray cluster of 2 CPUs, its worker processes started and ``modules`` imported in
    both (the libraries a reader's tasks import: outside the clock, as the driver's imports)."""
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.range(8, override_num_blocks=2).map_batches(lambda batch: batch).take_all()

    @ray.remote(num_cpus=1)
    def load(names: list[str]) -> int:
        import importlib

        for name in names:
            importlib.import_module(name)
        time.sleep(0.5)  # both tasks at once: one in each of the two workers
        return os.getpid()

    ray.get([load.remote(list(modules)) for _ in range(2)])
    return ray


def block_shuffle(dataset: Any, spec: dict[str, Any], epoch: int) -> tuple[Any, dict[str, Any]]:
    """A shuffled training read as Ray users write it: the blocks in a seeded random order, and a
    local shuffle buffer of ``spec["local_shuffle_buffer"]`` records (the records of 4 parts)."""
    seed = spec["seed"] + epoch
    return dataset.randomize_block_order(seed=seed), {"local_shuffle_buffer_size": spec["local_shuffle_buffer"],
                                                       "local_shuffle_seed": seed}


def run_variants(variants: list[tuple[str, Callable[[int], tuple[Any, dict[str, Any]]]]],
                 spec: dict[str, Any]) -> dict[str, Any]:
    """Each variant (row name, ``make(epoch) -> (dataset, iter_batches options)``) for
    ``spec["epochs"]`` epochs, one after the other; each epoch timed from making its dataset to
    its last batch."""
    rows = {}
    for row, make in variants:
        epochs = []
        for epoch in range(spec["epochs"]):
            start = time.perf_counter()
            dataset, options = make(epoch)
            count = EpochCount(start, spec["shape"])
            for batch in dataset.iter_batches(batch_size=spec["batch"], batch_format="numpy", **options):
                count.add(batch["image"], batch["label"])
            epochs.append(count.result())
        rows[row] = {"epochs": epochs}
    return {"rows": rows}


def build_mds(directory: str, spec: dict[str, Any]) -> dict[str, Any]:
    from streaming import MDSWriter

    images, labels = _data.make_arrays(spec["records"], tuple(spec["shape"]))
    shape = ",".join(str(d) for d in images.shape[1:])
    start = time.perf_counter()
    with MDSWriter(out=directory, columns={"image": f"ndarray:uint8:{shape}", "label": "int64"},
                   size_limit=spec["shard_bytes"]) as writer:
        for image, label in zip(images, labels):
            writer.write({"image": image, "label": int(label)})
    with open(os.path.join(directory, "index.json")) as f:
        shards = len(json.load(f)["shards"])
    return {"seconds": time.perf_counter() - start, "shards": shards}


def mds_datasource(directory: str) -> Any:
    """A Ray ``Datasource`` over the MDS shards of ``directory``: one read task per shard."""
    import numpy as np
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

    with open(os.path.join(directory, "index.json")) as f:
        shards = json.load(f)["shards"]

    def read_shard(info: dict[str, Any]) -> Iterable[Any]:
        from streaming.base.format import reader_from_json

        reader = reader_from_json(directory, None, info)
        samples = [reader.get_item(i) for i in range(reader.samples)]
        yield BlockAccessor.batch_to_block({"image": np.stack([s["image"] for s in samples]),
                                            "label": np.array([s["label"] for s in samples], dtype=np.int64)})

    class MDSDatasource(Datasource):  # type: ignore[misc]
        def estimate_inmemory_data_size(self) -> Optional[int]:
            return sum(int(s["raw_data"]["bytes"]) for s in shards)

        def get_read_tasks(self, parallelism: int, per_task_row_limit: Optional[int] = None,
                           data_context: Any = None) -> list[Any]:
            return [ReadTask(functools.partial(read_shard, info),
                             BlockMetadata(num_rows=info["samples"], size_bytes=int(info["raw_data"]["bytes"]),
                                           input_files=None, exec_stats=None),
                             per_task_row_limit=per_task_row_limit)
                    for info in shards]

    return MDSDatasource()


def read_mds(directory: str, spec: dict[str, Any], rows: list[str]) -> dict[str, Any]:
    ray = start_ray(["streaming.base.format", "numpy"])

    def make(row: str) -> Callable[[int], tuple[Any, dict[str, Any]]]:
        def dataset(epoch: int) -> tuple[Any, dict[str, Any]]:
            read = ray.data.read_datasource(mds_datasource(directory))
            return block_shuffle(read, spec, epoch) if row.endswith("-shuffled") else (read, {})

        return dataset

    return run_variants([(row, make(row)) for row in rows], spec)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["build", "read"])
    parser.add_argument("kind", choices=["mds"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--rows", default="ray-mds-shuffled,ray-mds-ordered", help="read: the variants, in order")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    if args.action == "build":
        result = build_mds(args.dir, spec)
    else:
        result = read_mds(args.dir, spec, args.rows.split(","))
    print(json.dumps(result), flush=True)
    os._exit(0)  # Ray's and MosaicML's atexit hooks can take seconds; the result is out


if __name__ == "__main__":
    main()
