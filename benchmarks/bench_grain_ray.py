"""Grain and Ray Data reading a yogacache cache vs the same records as ArrayRecord, Parquet and MDS (issue 26 item 4).

One run, one table per engine, the setting users run: shuffled, batches of 256, 2 workers, the
libraries imported before any clock. The records: ``_data.make_arrays(records, shape)`` as
``{"image": uint8[64, 64, 3], "label": int64}`` (``--records``, default 16,000, about 197 MB of
images); every system stores them in the same number of files (the cache's part count, parts of
``--part-bytes``, default 16 MiB), so that the engines see the same number of blocks.

**Grain** (``grain.DataLoader``, ``IndexSampler(shuffle=True, seed, num_epochs=1,
shard_options=NoSharding())``, operations ``[..., Batch(256)]``, ``worker_count=2``, default read
options), two epochs, each a fresh loader over seed ``7 + epoch`` (its clock runs from making the
loader, so it includes the 2 worker processes' start, as a user's epoch does) over:

- yogacache ``yogacache.grain.open_data_source`` of a local cache (records come out as numpy);
- ArrayRecord files of the same records (``group_size:1``, Grain's requirement for random access;
  uncompressed, as yogacache's parts are: random bytes do not compress, so zstd would only cost
  the peer time) through ``grain.sources.ArrayRecordDataSource`` and a ``grain.transforms.Map``
  decoding each record (a fixed layout: 8 bytes of little-endian label, then the image bytes: the
  cheapest decode a Grain user can write, so the peer is at its fastest);
- yogacache's own order as a Grain sampler (``yogacache.grain.CacheSampler``, ``"global"``);
- (information) the first two again with ``ReadOptions(prefetch_buffer_size=64)`` instead of
  Grain's default 500. Grain 0.2.18's prefetch iterator (``PrefetchDatasetIterator``) counts, on
  every element it hands on, the futures of its buffer that are done, from the front
  (``_measure_prefetch_depth``): the faster a source fills the buffer, the more futures each
  element polls (about 460 per record for yogacache's source, 230 for ArrayRecord's, in one
  process), so Grain's own cost grows with the source's speed; a smaller buffer bounds it.

**Ray Data** on a local cluster (``ray.init(num_cpus=2)``), one driver process and cluster per
system (yogacache, Parquet, MDS), its rows one after the other, two epochs each,
``ds.iter_batches(batch_size=256, batch_format="numpy")``, the clock from making the dataset to
the last batch. Before any clock: ``ray.init``, one tiny job that starts the 2 worker processes,
and two tasks at once that import the system's library in both workers (``yogacache.ray``,
``pyarrow.parquet``, MosaicML's ``streaming``: the peers' imports outside the clock, and
yogacache's alike). Rows:

- yogacache ``yogacache.ray.read_cache(..., shuffle=True, shuffle_mode="parts" | "global",
  shuffle_seed=7, epoch=e)``, and unshuffled (all with the read tasks Ray's parallelism asks
  for); and ``"parts"`` with ``override_num_blocks=<parts>`` (information: one task per part);
- ``ray.data.read_parquet`` of Parquet files written with pyarrow (the image as Arrow's canonical
  ``fixed_shape_tensor`` column, which Ray reads back as a uint8 ``[n, 64, 64, 3]`` array: no
  decode), shuffled the way Ray users shuffle a training read: ``randomize_block_order(seed)`` and
  ``iter_batches(local_shuffle_buffer_size=R, local_shuffle_seed=...)`` with R the records of 4
  parts: yogacache's ``"parts"`` mode mixes a window of 4 parts (its default), so both mix
  shuffled blocks through a 4-part buffer: the comparable pair (``ds.random_shuffle()``, the
  equivalent of ``"global"``, costs a full all-to-all exchange; no one trains from it on 2 CPUs);
  and unshuffled; each both through Ray 2.60's default Parquet datasource (V2: a file-listing task,
  then the files read as few large blocks) and through V1 (``DataContext.use_datasource_v2 =
  False``: a task and a block per file), which is faster at this size: the targets hold against both;
- MosaicML MDS shards through Ray: Ray 2.60 has no ``read_mds``, so a ``Datasource`` with one
  read task per shard decoding it with MosaicML's reader (``_peers_ray.py``, in
  ``benchmarks/.venv-peers``: mosaicml-streaming pins an older numpy), shuffled as Parquet, and
  unshuffled.

Before the Grain rows, one untimed Grain DataLoader with the same workers over 512 integers
warms the machine up (the first run of Grain's workers loads JAX's and Grain's modules from disk:
without it the first row's first epoch ran at 0.75x of the same row run later, whichever system
it was). Every epoch of every row is checked: each record read once (count and label sum), every batch
``uint8 [n, 64, 64, 3]``. The files of each system are read into the page cache before its row
(outside the clock): the machine pages out idle memory, and a row should not pay for the disk
because it ran later. Ratios are yogacache / peer (above 1: yogacache faster); the targets:
Grain >= 1.0x ArrayRecord, Ray >= 1.0x Parquet.

Usage: ``.venv/bin/python benchmarks/bench_grain_ray.py [--quick] [--records N] [--part-bytes 16Mi]
[--rows ...] [--peers-venv DIR] [--timeout S] [--workdir DIR]``. ``--quick``: 2,000 records, 2 MiB
parts (about 1.5 minutes). The table goes to stdout, progress to stderr. One run; the numbers are as
noisy as the machine, whose load average the notes give.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (str(HERE), str(REPO)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _data  # noqa: E402
from _peers_ray import EpochCount  # noqa: E402

BATCH = 256
WORKERS = 2
SEED = 7
EPOCHS = 2
PARTS_WINDOW = 4  # yogacache's default "parts" window: the Parquet / MDS local shuffle buffer holds as many parts
DATASET_ID, VER = "bench", "v1"
PEERS_VENV = HERE / ".venv-peers"

# Row name -> (engine, system, description, peer venv?).
ROWS: dict[str, tuple[str, str, str]] = {
    "grain-yogacache": ("grain", "yogacache", "yogacache CacheDataSource, IndexSampler shuffle"),
    "grain-yogacache-sampler": ("grain", "yogacache", "yogacache CacheDataSource, CacheSampler (global)"),
    "grain-arrayrecord": ("grain", "arrayrecord", "ArrayRecordDataSource + Map decode, IndexSampler shuffle"),
    "grain-yogacache-buffer64": ("grain", "yogacache", "yogacache CacheDataSource, IndexSampler, buffer 64"),
    "grain-arrayrecord-buffer64": ("grain", "arrayrecord", "ArrayRecordDataSource + Map, IndexSampler, buffer 64"),
    "ray-yogacache-parts": ("ray", "yogacache", "yogacache read_cache, shuffle_mode=parts"),
    "ray-yogacache-global": ("ray", "yogacache", "yogacache read_cache, shuffle_mode=global"),
    "ray-yogacache-parts-blocks": ("ray", "yogacache", "yogacache read_cache, parts, override_num_blocks=parts"),
    "ray-parquet-shuffled": ("ray", "parquet", "read_parquet, randomize_block_order + 4-part local buffer"),
    "ray-parquet-v1-shuffled": ("ray", "parquet", "read_parquet (datasource V1), as above"),
    "ray-mds-shuffled": ("ray", "mds", "MDS Datasource, randomize_block_order + 4-part local buffer"),
    "ray-yogacache-ordered": ("ray", "yogacache", "yogacache read_cache, unshuffled"),
    "ray-parquet-ordered": ("ray", "parquet", "read_parquet, unshuffled"),
    "ray-parquet-v1-ordered": ("ray", "parquet", "read_parquet (datasource V1), unshuffled"),
    "ray-mds-ordered": ("ray", "mds", "MDS Datasource, unshuffled"),
}
# (yogacache row, peer row, target ratio or None for information).
RATIOS: list[tuple[str, str, Optional[float]]] = [
    ("grain-yogacache", "grain-arrayrecord", 1.0),
    ("grain-yogacache-sampler", "grain-arrayrecord", None),
    ("grain-yogacache-buffer64", "grain-arrayrecord-buffer64", None),
    ("ray-yogacache-parts", "ray-parquet-shuffled", 1.0),
    ("ray-yogacache-parts", "ray-parquet-v1-shuffled", 1.0),
    ("ray-yogacache-global", "ray-parquet-shuffled", None),
    ("ray-yogacache-global", "ray-parquet-v1-shuffled", None),
    ("ray-yogacache-parts-blocks", "ray-parquet-v1-shuffled", None),
    ("ray-yogacache-ordered", "ray-parquet-ordered", 1.0),
    ("ray-yogacache-ordered", "ray-parquet-v1-ordered", 1.0),
    ("ray-yogacache-parts", "ray-mds-shuffled", None),
    ("ray-yogacache-ordered", "ray-mds-ordered", None),
]


def log(message: str) -> None:
    print(f"[bench_grain_ray] {message}", file=sys.stderr, flush=True)


# -- the rows, each in a process of its own ----------------------------------------------------------


def warm(directory: str) -> None:
    """Reads every file under ``directory`` once, so that the row reads from the page cache."""
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 22):
                    pass


def decode_record(raw: bytes, shape: tuple[int, ...]) -> dict[str, Any]:
    """An ArrayRecord record (8 bytes of little-endian label, then the image) as numpy."""
    import numpy as np

    return {"image": np.frombuffer(raw, dtype=np.uint8, offset=8).reshape(shape),
            "label": np.frombuffer(raw, dtype="<i8", count=1)[0]}


_DECODE: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    """``DecodeRecord``: the Grain ``Map`` a user writes to decode the ArrayRecord records, made on
    first use (so that importing this module does not import Grain); pickle finds it here in
    Grain's spawned workers."""
    if name != "DecodeRecord":
        raise AttributeError(name)
    if not _DECODE:
        import grain

        class DecodeRecord(grain.transforms.Map):  # type: ignore[misc]
            def __init__(self, shape: list[int]) -> None:
                self.shape = tuple(shape)

            def map(self, element: bytes) -> dict[str, Any]:
                return decode_record(element, self.shape)

        DecodeRecord.__module__, DecodeRecord.__qualname__ = __name__, "DecodeRecord"
        _DECODE[name] = DecodeRecord
    return _DECODE[name]


def _grain() -> Any:
    """Grain, its absl flags parsed (Grain reads them; a script outside absl.app parses none)."""
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return grain


def grain_row(row: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    import numpy as np  # noqa: F401

    grain = _grain()
    if row.startswith("grain-arrayrecord"):
        directory = spec["dirs"]["arrayrecord"]
        warm(directory)
        paths = sorted(str(p) for p in Path(directory).glob("*.array_record"))
        source: Any = grain.sources.ArrayRecordDataSource(paths)
        operations: list[Any] = [__getattr__("DecodeRecord")(spec["shape"])]
    else:
        import yogacache.grain as yg

        warm(spec["dirs"]["yogacache"])
        source = yg.open_data_source(DATASET_ID, VER, spec["store"])
        operations = []
    results = []
    for epoch in range(EPOCHS):
        start = time.perf_counter()
        if row == "grain-yogacache-sampler":
            import yogacache.grain as yg

            # Epoch ``epoch`` whole: the start offset counts the records of the epochs before it.
            sampler: Any = yg.CacheSampler(source, shuffle=True, shuffle_seed=SEED, shuffle_mode="global",
                                           start_offset=epoch * len(source), shard_rank=0, num_shards=1,
                                           num_epochs=1)
        else:
            sampler = grain.samplers.IndexSampler(num_records=len(source), shard_options=grain.sharding.NoSharding(),
                                                  shuffle=True, num_epochs=1, seed=SEED + epoch)
        # Grain's default read options, except in the -buffer64 rows: their prefetch buffer of 64
        # records instead of 500 (see the module's docstring).
        read_options = grain.ReadOptions(prefetch_buffer_size=64) if row.endswith("-buffer64") else None
        loader = grain.DataLoader(data_source=source, sampler=sampler,
                                  operations=[*operations, grain.transforms.Batch(BATCH)], worker_count=WORKERS,
                                  read_options=read_options)
        count = EpochCount(start, spec["shape"])
        for batch in loader:
            count.add(batch["image"], batch["label"])
        results.append(count.result())
    return results


def ray_rows(system: str, rows: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    """The Ray rows of ``system`` (yogacache or parquet), one cluster for all of them."""
    from _peers_ray import block_shuffle, run_variants, start_ray

    ray = start_ray(["yogacache.ray"] if system == "yogacache" else ["pyarrow.parquet"])
    if system == "yogacache":
        import yogacache.ray as yr
    warm(spec["dirs"][system])

    def make(row: str) -> Callable[[int], tuple[Any, dict[str, Any]]]:
        def dataset(epoch: int) -> tuple[Any, dict[str, Any]]:
            if system == "yogacache":
                mode = row.split("-")[2]
                arguments: dict[str, Any] = {} if mode == "ordered" else {
                    "shuffle": True, "shuffle_seed": SEED, "shuffle_mode": mode}
                if row.endswith("-blocks"):
                    arguments["override_num_blocks"] = spec["parts"]
                return yr.read_cache(DATASET_ID, VER, spec["store"], epoch=epoch, **arguments), {}
            # Ray 2.60 reads Parquet through its DataSource V2 by default (a file-listing task, then
            # the files read as few large blocks); V1 (a task per file) is faster at this size.
            ray.data.DataContext.get_current().use_datasource_v2 = "-v1-" not in row
            read = ray.data.read_parquet(spec["dirs"]["parquet"])
            return block_shuffle(read, spec, epoch) if row.endswith("-shuffled") else (read, {})

        return dataset

    return run_variants([(row, make(row)) for row in rows], spec)  # type: ignore[no-any-return]


def warm_grain() -> None:
    """Outside every clock, once before the Grain rows: a Grain DataLoader with the rows' workers
    over 512 integers in memory, so that the first row does not pay alone for what the machine
    loads the first time Grain's workers start (the files of Grain's and JAX's modules). Without
    it the first row's first epoch ran 0.75x of the same row run later."""
    grain = _grain()
    sampler = grain.samplers.IndexSampler(num_records=512, shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=SEED)
    loader = grain.DataLoader(data_source=list(range(512)), sampler=sampler,
                              operations=[grain.transforms.Batch(BATCH)], worker_count=WORKERS)
    if sum(len(batch) for batch in loader) != 512:
        raise RuntimeError("the Grain warm-up read a wrong count")
    print(json.dumps({"rows": {}}), flush=True)
    os._exit(0)


def row_main(rows: list[str], spec_json: str) -> None:
    """Measures ``rows`` (one Grain row, or the Ray rows of one system) and prints their epochs."""
    spec = json.loads(spec_json)
    if ROWS[rows[0]][0] == "grain":
        result = {"rows": {rows[0]: {"epochs": grain_row(rows[0], spec)}}}
    else:
        result = ray_rows(ROWS[rows[0]][1], rows, spec)
    print(json.dumps(result), flush=True)
    os._exit(0)  # Ray's and Grain's exit hooks can take seconds; the result is out


# -- building -----------------------------------------------------------------------------------------


class Bench:
    """The data, its four copies and the rows of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.shape = [int(d) for d in args.shape.split("x")]
        self.workdir = Path(tempfile.mkdtemp(prefix="yogacache-grain-ray-bench-", dir=args.workdir))
        self.python = Path(args.peers_venv) / "bin" / "python"
        self.dirs = {name: str(self.workdir / name) for name in ("yogacache", "arrayrecord", "parquet", "mds")}
        self.store = {"type": "shared_fs", "host_storage_path": self.dirs["yogacache"]}
        self.notes: list[str] = []
        self.spec: dict[str, Any] = {}
        self.label_sum = 0

    def build(self, systems: set[str]) -> dict[str, str]:
        """Writes the records in each system's format; returns the systems that failed, with why."""
        from yogacache.store import open_store

        images, labels = _data.make_arrays(self.args.records, tuple(self.shape))
        self.label_sum = int(labels.sum())
        log(f"yogacache: building {len(labels)} records")
        started = time.perf_counter()
        store = open_store(self.store, show_progress=False, part_bytes=self.args.part_bytes)
        reader = store.get_or_build(DATASET_ID, VER, lambda: (
            {"image": images[i], "label": labels[i]} for i in range(len(labels))))
        parts = [(p.first_record, p.num_records) for p in reader.manifest.parts]
        size = sum(p.size_bytes for p in reader.manifest.parts)
        self.notes.append(f"yogacache: {len(parts)} parts of {parts[0][1]} records ({size / 2**20:.0f} MiB), built in "
                          f"{time.perf_counter() - started:.1f} s; every other system writes as many files, "
                          f"of the same records")
        per_part = max(n for _, n in parts)
        self.spec = {"records": len(labels), "shape": self.shape, "store": self.store, "dirs": self.dirs,
                     "parts": len(parts),
                     "local_shuffle_buffer": PARTS_WINDOW * per_part, "epochs": EPOCHS, "seed": SEED, "batch": BATCH,
                     # MDS rolls shards on raw bytes: the image and label, plus a 4-byte offset per sample
                     "shard_bytes": per_part * (math.prod(self.shape) + 8 + 4) + 64}
        failed: dict[str, str] = {}
        if "arrayrecord" in systems:
            self.build_arrayrecord(images, labels, parts)
        if "parquet" in systems:
            self.build_parquet(images, labels, parts)
        if "mds" in systems:
            try:
                self.build_mds()
            except Exception as error:  # noqa: BLE001 - a failing peer leaves the other rows
                failed["mds"] = f"build failed: {error}"
        return failed

    def build_arrayrecord(self, images: Any, labels: Any, parts: list[tuple[int, int]]) -> None:
        from array_record.python.array_record_module import ArrayRecordWriter

        started = time.perf_counter()
        os.makedirs(self.dirs["arrayrecord"])
        for n, (first, count) in enumerate(parts):
            writer = ArrayRecordWriter(os.path.join(self.dirs["arrayrecord"], f"data-{n:05d}.array_record"),
                                       "group_size:1,uncompressed")
            for i in range(first, first + count):
                writer.write(labels[i].astype("<i8").tobytes() + images[i].tobytes())
            writer.close()
        log(f"arrayrecord: {len(parts)} files in {time.perf_counter() - started:.1f} s")

    def build_parquet(self, images: Any, labels: Any, parts: list[tuple[int, int]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        started = time.perf_counter()
        os.makedirs(self.dirs["parquet"])
        for n, (first, count) in enumerate(parts):
            table = pa.table({"image": pa.FixedShapeTensorArray.from_numpy_ndarray(images[first:first + count]),
                              "label": labels[first:first + count]})
            pq.write_table(table, os.path.join(self.dirs["parquet"], f"data-{n:05d}.parquet"))
        log(f"parquet: {len(parts)} files in {time.perf_counter() - started:.1f} s")

    def build_mds(self) -> None:
        if not self.python.exists():
            raise RuntimeError(f"{self.args.peers_venv} does not exist (run bench_torch.py once)")
        result = self.peer(["build", "mds"])
        self.notes.append(f"MDS: {result['shards']} shards (size_limit {self.spec['shard_bytes']} B)")

    # -- running ------------------------------------------------------------------------------------
    def peer(self, action: list[str]) -> dict[str, Any]:
        from bench_mix import peer_env, run_json

        return run_json([str(self.python), str(HERE / "_peers_ray.py"), *action, "--dir", self.dirs["mds"],
                         "--spec", json.dumps(self.spec)], peer_env(self.spec), self.args.timeout)

    def run_here(self, call: str) -> dict[str, Any]:
        """``bench_grain_ray.<call>`` in a fresh process of this interpreter; its printed JSON."""
        from bench_mix import run_json

        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(REPO)]))
        return run_json([sys.executable, "-c", f"import bench_grain_ray as b; b.{call}"], env, self.args.timeout)

    def warm_grain(self) -> None:
        log("warming Grain's workers up (outside every clock)")
        self.run_here("warm_grain()")

    def run_rows(self, rows: list[str]) -> dict[str, Any]:
        """``rows`` in one process: one Grain row, or the Ray rows of one system."""
        if ROWS[rows[0]][1] == "mds":
            return self.peer(["read", "mds", "--rows", ",".join(rows)])
        return self.run_here(f"row_main({rows!r}, {json.dumps(self.spec)!r})")

    def measure(self, rows: list[str]) -> dict[str, dict[str, Any]]:
        load = os.getloadavg()[0]
        log(f"{', '.join(rows)}: {EPOCHS} epochs each")
        try:
            result = self.run_rows(rows)["rows"]
        except Exception as error:  # noqa: BLE001 - one process failing leaves the others
            return {row: {"failed": str(error), "load": load} for row in rows}
        return {row: self.check(result[row]["epochs"], load) for row in rows}

    def check(self, epochs: list[dict[str, Any]], load: float) -> dict[str, Any]:
        exact = [e["records"] == self.spec["records"] and e["label_sum"] == self.label_sum and e["bad"] is None
                 for e in epochs]
        if not all(exact):
            bad = next(e for e, ok in zip(epochs, exact) if not ok)
            return {"failed": f"wrong records: {bad['records']} records, label sum {bad['label_sum']} (expected "
                              f"{self.spec['records']}, {self.label_sum}); {bad['bad'] or ''}", "load": load}
        return {"rates": [e["records"] / e["seconds"] for e in epochs], "first": [e["first_batch"] for e in epochs],
                "load": load}


def groups(rows: list[str]) -> list[list[str]]:
    """The processes to run, in order: each Grain row alone, then the Ray rows of each system together."""
    grain_rows = [[row] for row in rows if ROWS[row][0] == "grain"]
    systems: dict[str, list[str]] = {}
    for row in rows:
        if ROWS[row][0] == "ray":
            systems.setdefault(ROWS[row][1], []).append(row)
    return grain_rows + list(systems.values())


# -- printing -----------------------------------------------------------------------------------------


def versions(python: Path) -> dict[str, str]:
    import importlib.metadata as metadata

    found = {}
    for name in ("grain", "array_record", "ray", "pyarrow", "numpy"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    code = ("import importlib.metadata as m; print(' '.join(m.version(p) for p in "
            "('mosaicml-streaming', 'ray', 'numpy')))")
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60).stdout.split()
        found["mosaicml-streaming"] = f"{out[0]} (peers venv: ray {out[1]}, numpy {out[2]})"
    except Exception:  # noqa: BLE001 - the versions line says so
        found["mosaicml-streaming"] = "not available"
    return found


def print_tables(bench: Bench, tables: dict[str, dict[str, Any]]) -> None:
    from bench_mix import print_markdown

    spec = bench.spec
    record_bytes = math.prod(bench.shape) + 8
    print(f"\n{spec['records']} records of {{image: uint8[{','.join(map(str, bench.shape))}], label: int64}} "
          f"({spec['records'] * record_bytes / 1e6:.0f} MB); batches of {BATCH}, {WORKERS} workers / 2 Ray CPUs, "
          f"{EPOCHS} epochs; records/s (first batch after s)")
    for engine, title in (("grain", "Grain DataLoader (worker_count=2)"), ("ray", "Ray Data (num_cpus=2)")):
        rows = [row for row in ROWS if ROWS[row][0] == engine and row in tables]
        if not rows:
            continue
        print(f"\n### {title}\n")
        lines = [["reader", "epoch 1 (records/s)", "epoch 2 (records/s)", "first batch (s, e1 / e2)", "load"]]
        for row in rows:
            cells = tables[row]
            if "failed" in cells:
                lines.append([ROWS[row][2], f"failed: {cells['failed'][:200]}", "", "", f"{cells['load']:.1f}"])
                continue
            lines.append([ROWS[row][2], *(f"{r:,.0f}" for r in cells["rates"]),
                          " / ".join(f"{f:.2f}" for f in cells["first"]), f"{cells['load']:.1f}"])
        print_markdown(lines)
        ratio_lines = [["yogacache / peer", "epoch 1", "epoch 2", "target"]]
        for ours, theirs, target in RATIOS:
            if ROWS[ours][0] != engine or ours not in tables or theirs not in tables:
                continue
            a, b = tables[ours], tables[theirs]
            label = f"{ROWS[ours][2]} / {ROWS[theirs][2]}"
            if "failed" in a or "failed" in b:
                ratio_lines.append([label, "-", "-", "not checked (a row failed)" if target else "(info)"])
                continue
            ratios = [x / y for x, y in zip(a["rates"], b["rates"])]
            verdict = "(info)" if target is None else (
                f">= {target:.1f}x: {'met' if all(r >= target for r in ratios) else 'MISSED'}")
            ratio_lines.append([label, *(f"{r:.2f}x" for r in ratios), verdict])
        if len(ratio_lines) > 1:
            print()
            print_markdown(ratio_lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2000 records, 2Mi parts")
    parser.add_argument("--records", type=int, default=None, help="records; default 16000 (quick 2000)")
    parser.add_argument("--shape", default="64x64x3", help="image shape; default 64x64x3")
    parser.add_argument("--part-bytes", default=None, help="yogacache's part size; default 16Mi (quick 2Mi)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to measure, of {', '.join(ROWS)}")
    parser.add_argument("--peers-venv", default=str(PEERS_VENV), help=f"the MDS row's virtualenv; default {PEERS_VENV}")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per row or build; default 600 (quick 180)")
    parser.add_argument("--workdir", default=None, help="where the temporary directory goes; default the system's")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    args.records = args.records or (2000 if args.quick else 16000)
    args.part_bytes = args.part_bytes or ("2Mi" if args.quick else "16Mi")
    args.timeout = args.timeout or (180 if args.quick else 600)
    chosen = [row for row in args.rows.split(",") if row]
    unknown = [row for row in chosen if row not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}")
    load_before = os.getloadavg()
    started = time.perf_counter()
    bench = Bench(args)
    tables: dict[str, dict[str, Any]] = {}
    try:
        failed = bench.build({ROWS[row][1] for row in chosen})
        if any(ROWS[row][0] == "grain" for row in chosen):
            bench.warm_grain()
        for group in groups(chosen):
            if ROWS[group[0]][1] in failed:
                tables.update({row: {"failed": failed[ROWS[row][1]], "load": os.getloadavg()[0]} for row in group})
            else:
                tables.update(bench.measure(group))
    finally:
        if args.keep:
            log(f"kept {bench.workdir}")
        else:
            shutil.rmtree(bench.workdir, ignore_errors=True)
    load_after = os.getloadavg()
    print_tables(bench, tables)
    print()
    found = versions(bench.python)
    print("versions: " + ", ".join(f"{name} {version}" for name, version in found.items()) + f", Python "
          f"{sys.version.split()[0]}")
    for note in bench.notes:
        print(f"note: {note}")
    print(f"note: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1/5/15 min) "
          f"{'/'.join(f'{x:.2f}' for x in load_before)} at the start, {'/'.join(f'{x:.2f}' for x in load_after)} "
          f"at the end; {os.cpu_count()} cores; the run took {time.perf_counter() - started:.0f} s; the load column: "
          f"at each row's start")
    print(f"note: command: {' '.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
