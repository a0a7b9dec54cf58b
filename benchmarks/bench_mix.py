"""A three-component mixture (70/20/10) read through a DataLoader, locally and streamed from S3
under half the bytes as budget: yogacache.Mixture vs MosaicML Streaming Streams vs LitData's
CombinedStreamingDataset, on the same records (issue 25 item 7).

Three components of records ``(uint8 image, int64 label)`` (``--shape``, default 64x63x3: about
12 KiB a record, so that an epoch holds several 10k-record windows; 64x64x3 would straddle LMDB's
pages, a 12,296-byte value taking four 4 KiB overflow pages, a third more bytes in yogacache's
parts), ``--records`` in all (default 40,000, about 0.5 GB) split 70/20/10 (``--weights``);
component ``i``'s records come from ``_data.make_arrays(n_i, shape, seed=1234 + i)``, its labels
offset by ``i * 1000`` so that a label names its component (``_peers_mix.component_arrays``).
Each system writes them in parts of ``--part-bytes`` (default 16 MiB): yogacache caches (one per
component), MDS shards, LitData chunks. The weights equal the components' sizes and the epoch
size is their sum, so every system's epoch should read every record of every component exactly
once.

Rows, each two epochs in a process of its own (libraries imported before its clock), through a
DataLoader with ``num_workers=2`` and ``batch_size=256``, per-record datasets collated by the
loader, shuffled (seed 7):

- local: yogacache ``Mixture(components, weights=...)`` of ``shared_fs`` caches through
  ``CacheIterableDataset`` + ``CacheDataLoader`` (default shuffle mode); MosaicML
  ``StreamingDataset(streams=[Stream(local=..., proportion=w)], epoch_size=N, shuffle=True)``
  (its default shuffle); LitData ``CombinedStreamingDataset(weights=w, iterate_over_all=False)``
  (with weights LitData refuses ``iterate_over_all=True``) through its ``StreamingDataLoader``.
- streamed from moto's S3 server through a byte-counting proxy at ``--rate`` (``_throttle.py``),
  from an empty node directory, budget B = half the bytes D of all parts: yogacache
  ``shuffle_mode="parts"`` with ``local_cache_limit`` B shared by the three components; MosaicML
  ``Stream(remote=...)`` with ``cache_limit`` B, tuned as ``bench_stream.py``'s row (``py1e``
  over two shards, one canonical node); LitData with ``max_cache_size`` B split by component
  size (it has no node budget), at least two chunks each (under one chunk its reader waits
  forever).

Columns: records/s of epoch 1 (from opening the dataset, libraries imported) and epoch 2; for
the streamed rows the bytes of the system's objects on the server, the bytes the proxy sent in
epoch 1 and in epoch 2, and beyond one pass (both epochs' bytes - the stored bytes: epoch-2 parts
fetched ahead while epoch 1 ended, and parts fetched twice, count here), with the GETs of part
objects per epoch under the table; the proportions of each window of ``--window`` (default
10,000) consecutive records the loader yielded, both epochs: the largest drift of any component
from its target (percentage points) and how many windows are within +-1 point; and whether each
epoch read each component's share exactly (records counted per component, and their label sums,
against the components'). Then the ratios yogacache / peer and the issue's targets, met or
missed: faster than both (epochs 1 and 2); proportions within +-1 point in every window; epoch-2
bytes within the promise (D - B) + one part per component (D: yogacache's parts, B = D / 2), and
the stricter beyond-one-pass bytes against it; each share exact.

Usage: ``.venv/bin/python benchmarks/bench_mix.py [--quick] [--records 40000] [--shape 64x63x3]
[--weights 0.7,0.2,0.1] [--window 10000] [--part-bytes 16Mi] [--rate 200M] [--rows ...]
[--no-peers] [--timeout 900]``. ``--quick``: 3,000 records, windows of 1,000, 2 MiB parts (a
smoke run, under 3 minutes). The peers run in ``benchmarks/.venv-peers`` (made by
``bench_torch.py``), in ``_peers_mix.py``. A row that fails (an error, a timeout) is printed as
failed with its reason. One run; the numbers are as noisy as the machine, whose load average the
notes give.
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
from functools import partial
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from _peers_mix import component_arrays  # noqa: E402
from _throttle import ThrottleProxy  # noqa: E402
from bench_stream import upload_tree  # noqa: E402

BATCH = 256
WORKERS = 2
VER = "v1"
PEERS_VENV = HERE / ".venv-peers"
TOLERANCE = 1.0  # percentage points, issue 25 item 7
SYSTEMS = {"yogacache": "yogacache Mixture", "mds": "MosaicML Streams", "litdata": "LitData Combined"}
# Row name -> (system, streamed).
ROWS = {
    "yogacache-local": ("yogacache", False), "mds-local": ("mds", False), "litdata-local": ("litdata", False),
    "yogacache-s3": ("yogacache", True), "mds-s3": ("mds", True), "litdata-s3": ("litdata", True),
}

YOGACACHE_READER = r"""
import json, sys, time
import boto3, numpy, torch  # imported before the clock starts, as the peers' libraries are
import yogacache
from yogacache.store import open_store
from yogacache.torch import CacheDataLoader, CacheIterableDataset
sys.path.insert(0, sys.argv[2])
from _peers_mix import EpochCounter
t0_wall, t0 = time.time(), time.perf_counter()
args = json.loads(sys.argv[1])
store = open_store(args["config"], show_progress=False)
mixture = yogacache.Mixture([store.open(f"c{i}", "v1") for i in range(len(args["weights"]))],
                            weights=args["weights"])
mode = {"shuffle_mode": args["mode"]} if args["mode"] else {}
dataset = CacheIterableDataset(mixture, shuffle=True, shuffle_seed=7, shard_rank=0, num_shards=1, **mode)
loader = CacheDataLoader(dataset, batch_size=args["batch"], num_workers=args["workers"])
results = []
for epoch in range(args["epochs"]):
    dataset.set_epoch(epoch)
    start_wall, start = (t0_wall, t0) if epoch == 0 else (time.time(), time.perf_counter())
    counter = EpochCounter(len(args["weights"]))
    for image, label in loader:
        if counter.first is None:
            counter.first = time.perf_counter() - start
        counter.add(label.numpy())
    results.append(counter.result(start_wall, start))
print(json.dumps({"epochs": results}))
"""


class RecordingProxy(ThrottleProxy):
    """``ThrottleProxy`` that also records each request's (wall-clock time, method, path), so that
    a row's GETs can be told apart: an epoch that fetches a part twice, or the next epoch's
    parts fetched ahead."""

    def __init__(self, upstream_url: str, bytes_per_second: float) -> None:
        self.requests: list[tuple[float, str, str]] = []
        super().__init__(upstream_url, bytes_per_second)

    def _serve_one(self, conn: Any, reader: Any) -> bool:
        return super()._serve_one(conn, _FirstLine(reader, self.requests))  # type: ignore[arg-type]

    def gets(self, start: float, end: float) -> list[str]:
        """Paths (query dropped) of the GETs received between ``start`` and ``end``."""
        return [path.split("?")[0] for when, method, path in list(self.requests)
                if method == "GET" and start <= when < end]


class _FirstLine:
    """A request reader that records its request line (the first line read) with the time."""

    def __init__(self, reader: Any, requests: list[tuple[float, str, str]]) -> None:
        self.reader, self.requests, self.first = reader, requests, True

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self.reader.readline(limit)
        if self.first and line:
            self.first = False
            method, path = (line.decode("latin-1").split(" ") + ["", ""])[:2]
            self.requests.append((time.time(), method, path))
        return line

    def read(self, size: int = -1) -> bytes:
        return self.reader.read(size)  # type: ignore[no-any-return]


def log(message: str) -> None:
    print(f"[bench_mix] {message}", file=sys.stderr, flush=True)


def parse(text: str) -> int:
    from yogacache.sizes import parse_size

    return parse_size(text, "size")


def split_records(records: int, weights: list[float]) -> list[int]:
    """Component sizes in the weights' proportions (the last takes the rounding)."""
    total = sum(weights)
    sizes = [round(records * w / total) for w in weights[:-1]]
    return [*sizes, records - sum(sizes)]


def run_json(command: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    # In a session of its own: on a timeout the whole group goes (loader workers that a peer
    # spawned hold the pipes open, and would keep the wait for their end going forever).
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"timed out after {timeout:.0f} s") from None
    if process.returncode != 0:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        raise RuntimeError(f"exit {process.returncode}: {lines[-1].strip()[-300:] if lines else 'no message'}")
    return json.loads(stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def peer_env(spec: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


class Bench:
    """The data, the stores and the rows of one run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.weights = [float(w) for w in args.weights.split(",")]
        self.shape = [int(d) for d in args.shape.split("x")]
        self.sizes = split_records(args.records, self.weights)
        self.record_bytes = 8 + int(__import__("math").prod(self.shape))
        self.part_bytes = parse(args.part_bytes)
        self.rate = parse(args.rate)
        self.python = Path(args.peers_venv) / "bin" / "python"
        self.label_sums = [int(component_arrays(i, n, self.shape)[1].sum()) for i, n in enumerate(self.sizes)]
        self.notes: list[str] = []
        self.workdir = Path(tempfile.mkdtemp(prefix="yogacache-mix-bench-", dir=args.workdir))
        self.spec = {"records": self.sizes, "weights": self.weights, "shape": self.shape,
                     "part_bytes": self.part_bytes, "epochs": 2, "batch": BATCH, "workers": WORKERS}
        self.built: set[str] = set()
        self.dataset_bytes = 0
        self.largest_parts: list[int] = []
        self.stored: dict[str, int] = {}

    # -- building ---------------------------------------------------------------------------
    def records(self, component: int) -> Any:
        images, labels = component_arrays(component, self.sizes[component], self.shape)
        return ((images[i], labels[i]) for i in range(len(labels)))

    def build_yogacache(self, config: dict[str, Any]) -> list[Any]:
        from yogacache.store import open_store

        store = open_store(config, show_progress=False, part_bytes=self.part_bytes)
        return [store.get_or_build(f"c{i}", VER, partial(self.records, i)).manifest for i in range(len(self.sizes))]

    def build_peer(self, kind: str) -> Path:
        local = self.workdir / f"build-{kind}"
        log(f"{kind}: building {sum(self.sizes)} records in {len(self.sizes)} components")
        result = run_json([str(self.python), str(HERE / "_peers_mix.py"), "build", kind, "--dir", str(local),
                           "--spec", json.dumps(self.spec)], peer_env(self.spec), self.args.timeout)
        log(f"{kind}: built in {result['seconds']:.1f} s")
        return local

    # -- reading ----------------------------------------------------------------------------
    def read_yogacache(self, config: dict[str, Any], mode: Optional[str]) -> dict[str, Any]:
        arguments = {"config": config, "mode": mode, "weights": self.weights, "batch": BATCH,
                     "workers": WORKERS, "epochs": 2}
        env = dict(os.environ, PYTHONPATH=str(REPO))
        return run_json([sys.executable, "-c", YOGACACHE_READER, json.dumps(arguments), str(HERE)], env,
                        self.args.timeout)

    def read_peer(self, kind: str, directory: Path, remote: str = "", limit: int = 0,
                  endpoint: Optional[str] = None) -> dict[str, Any]:
        env = peer_env(self.spec)
        if endpoint:
            env.update(S3_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL=endpoint)
        command = [str(self.python), str(HERE / "_peers_mix.py"), "read", kind, "--dir", str(directory),
                   "--spec", json.dumps(self.spec)]
        if remote:
            command += ["--remote", remote, "--limit", str(limit)]
        return run_json(command, env, self.args.timeout)

    def measure(self, result: dict[str, Any], proxy: Optional[RecordingProxy], stored: int = 0) -> dict[str, Any]:
        """A row's numbers; ``stored``: the bytes of the system's parts and indexes on the server."""
        import numpy as np

        epochs = result["epochs"]
        target = np.array(self.weights) / sum(self.weights)
        window = self.args.window
        drifts, within, windows = [], 0, 0
        exact = []
        for epoch in epochs:
            exact.append(epoch["counts"] == self.sizes and epoch["label_sums"] == self.label_sums)
            order = np.frombuffer(epoch["sequence"].encode("ascii"), dtype=np.uint8) - ord("0")
            whole = len(order) // window
            if whole:
                blocks = order[: whole * window].reshape(whole, window)
                shares = np.stack([(blocks == c).sum(axis=1) for c in range(len(target))], axis=1) / window
                drift = np.abs(shares - target).max(axis=1) * 100
                drifts.extend(drift.tolist())
                within += int((drift <= TOLERANCE).sum())
                windows += whole
        row: dict[str, Any] = {
            "rates": [e["records"] / e["seconds"] for e in epochs],
            "records": [e["records"] for e in epochs],
            "counts": [e["counts"] for e in epochs],
            "exact": exact,
            "drift": max(drifts) if drifts else None,
            "within": within,
            "windows": windows,
        }
        if proxy is not None:
            total = proxy.total()
            second = proxy.bytes_between(epochs[1]["start"], epochs[1]["end"] + 0.5)
            row["bytes"] = [total - second, second]
            row["beyond"] = total - stored
            split = epochs[1]["start"]
            first_gets = [path for path in proxy.gets(0, split) if is_data(path)]
            second_gets = [path for path in proxy.gets(split, float("inf")) if is_data(path)]
            row["gets"] = (len(first_gets), len(set(first_gets)), len(second_gets), len(set(second_gets)))
        return row

    # -- the run ------------------------------------------------------------------------------
    def run(self, chosen: list[str]) -> dict[str, dict[str, Any]]:
        tables: dict[str, dict[str, Any]] = {}
        peers = {ROWS[row][0] for row in chosen} - {"yogacache"}
        if peers and not self.python.exists():
            self.fail_rows(tables, chosen, peers, f"{self.args.peers_venv} does not exist (run bench_torch.py once)")
            peers = set()
        builds: dict[str, Path] = {}
        for kind in sorted(peers):
            try:
                builds[kind] = self.build_peer(kind)
            except Exception as error:  # noqa: BLE001 - one peer failing leaves the others' rows
                self.fail_rows(tables, chosen, {kind}, f"build failed: {error}")
        local_rows = [row for row in chosen if not ROWS[row][1]]
        if local_rows:
            log("yogacache: building the local caches")
            local_root = self.workdir / "yogacache-local"
            manifests = self.build_yogacache({"type": "shared_fs", "host_storage_path": str(local_root)})
            self.dataset_bytes = sum(p.size_bytes for m in manifests for p in m.parts)
        for row in local_rows:
            kind = ROWS[row][0]
            if row in tables:
                continue
            log(f"{row}: two epochs")
            load = os.getloadavg()[0]
            try:
                if kind == "yogacache":
                    result = self.read_yogacache({"type": "shared_fs", "host_storage_path": str(local_root)}, None)
                else:
                    result = self.read_peer(kind, builds[kind])
                tables[row] = self.measure(result, None)
            except Exception as error:  # noqa: BLE001 - one row failing leaves the others
                tables[row] = {"failed": str(error)}
            tables[row]["load"] = load
        streamed = [row for row in chosen if ROWS[row][1]]
        if streamed:
            self.run_streamed(streamed, builds, tables)
        return tables

    def fail_rows(self, tables: dict[str, Any], chosen: list[str], kinds: set[str], reason: str) -> None:
        for row in chosen:
            if ROWS[row][0] in kinds:
                tables[row] = {"failed": reason}

    def run_streamed(self, rows: list[str], builds: dict[str, Path], tables: dict[str, Any]) -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        import boto3
        from bench_cloud import start_moto

        moto, endpoint = start_moto(self.workdir)
        try:
            client = boto3.client("s3", endpoint_url=endpoint)
            bucket = "bench-mix"
            client.create_bucket(Bucket=bucket)
            log("yogacache: publishing the caches to S3")
            builder = {"type": "s3", "bucket": bucket, "bucket_directory_path": "yogacache", "endpoint_url": endpoint,
                       "local_cache_host_path": str(self.workdir / "builder"),
                       "local_cache_container_path": str(self.workdir / "builder")}
            manifests = self.build_yogacache(builder)
            shutil.rmtree(self.workdir / "builder", ignore_errors=True)
            self.dataset_bytes = sum(p.size_bytes for m in manifests for p in m.parts)
            self.largest_parts = [max(p.size_bytes for p in m.parts) for m in manifests]
            self.notes.append(
                f"yogacache streamed: {sum(len(m.parts) for m in manifests)} parts "
                f"({', '.join(str(len(m.parts)) for m in manifests)} by component), D = "
                f"{self.dataset_bytes / 2**20:.0f} MiB, largest parts "
                f"{', '.join(f'{p / 2**20:.1f}' for p in self.largest_parts)} MiB")
            self.stored["yogacache"] = self.dataset_bytes
            for kind, local in builds.items():
                uploaded = upload_tree(client, bucket, local, kind)
                self.stored[kind] = uploaded
                log(f"{kind}: {uploaded} bytes uploaded")
            budget = self.dataset_bytes // 2
            for row in rows:
                kind = ROWS[row][0]
                if row in tables:
                    continue
                node = self.workdir / f"node-{row}"
                proxy = RecordingProxy(endpoint, self.rate)
                log(f"{row}: two epochs from an empty node at {self.rate / 1e6:.0f} MB/s")
                load = os.getloadavg()[0]
                try:
                    if kind == "yogacache":
                        config = {"type": "s3", "bucket": bucket, "bucket_directory_path": "yogacache",
                                  "endpoint_url": proxy.url, "local_cache_host_path": str(node),
                                  "local_cache_container_path": str(node), "streaming": True,
                                  "local_cache_limit": budget}
                        result = self.read_yogacache(config, "parts")
                    else:
                        result = self.read_peer(kind, node, f"s3://{bucket}/{kind}", budget, proxy.url)
                    tables[row] = self.measure(result, proxy, self.stored[kind])
                except Exception as error:  # noqa: BLE001 - one row failing leaves the others
                    tables[row] = {"failed": str(error)}
                finally:
                    proxy.stop()
                tables[row]["load"] = load
                shutil.rmtree(node, ignore_errors=True)
        finally:
            moto.terminate()
            moto.wait(timeout=30)

    # -- printing -----------------------------------------------------------------------------
    def print_tables(self, tables: dict[str, dict[str, Any]]) -> None:
        total = sum(self.sizes)
        mib = 2**20
        print(
            f"\nMixture of 3 components, weights {'/'.join(f'{w:g}' for w in self.weights)}: "
            f"{'/'.join(str(n) for n in self.sizes)} records of {'x'.join(map(str, self.shape))} uint8 + int64 "
            f"({total} records, {total * self.record_bytes / 2**20:.0f} MiB), parts of "
            f"{self.part_bytes / mib:g} MiB; DataLoader: {WORKERS} workers, batch {BATCH}, shuffled; "
            f"windows of {self.args.window} records, both epochs"
        )
        budget = self.dataset_bytes // 2
        promise = self.dataset_bytes - budget + sum(self.largest_parts)
        for streamed in (False, True):
            rows = {row: tables[row] for row in ROWS if row in tables and ROWS[row][1] == streamed}
            if not rows:
                continue
            if streamed:
                print(f"\nStreamed from moto's S3 server through a {self.rate / 1e6:.0f} MB/s proxy, from an empty "
                      f"node: D = {self.dataset_bytes / mib:.1f} MiB, budget B = {budget / mib:.1f} MiB (half), "
                      f"promise (D - B) + one part per component = {promise / mib:.1f} MiB\n")
            else:
                print("\nLocal (yogacache shared_fs caches, MDS / LitData directories on the same disk)\n")
            header = ["reader", "epoch 1 (records/s)", "epoch 2 (records/s)"]
            if streamed:
                header += ["stored (MiB)", "epoch 1 fetched (MiB)", "epoch 2 fetched (MiB)", "beyond one pass (MiB)"]
            header += ["records per epoch", "largest drift (pp)", "windows within +-1", "each share exact (e1, e2)",
                       "load"]
            lines = [header]
            ours = rows.get(f"yogacache-{'s3' if streamed else 'local'}")
            for row, cells in rows.items():
                label = SYSTEMS[ROWS[row][0]]
                if "failed" in cells:
                    lines.append([label, f"failed: {cells['failed'][:150]}"] + [""] * (len(header) - 2))
                    continue
                line = [label] + [f"{r:.0f}" for r in cells["rates"]]
                if ours is not None and cells is not ours and "failed" not in ours:
                    line[1:3] = [f"{r:.0f} ({o / r:.2f}x)" for r, o in zip(cells["rates"], ours["rates"])]
                if streamed:
                    line += [f"{self.stored[ROWS[row][0]] / mib:.1f}", f"{cells['bytes'][0] / mib:.1f}",
                             f"{cells['bytes'][1] / mib:.1f}", f"{cells['beyond'] / mib:.1f}"]
                shares = ", ".join("yes" if e else "no" for e in cells["exact"])
                counts = "; ".join("/".join(map(str, c)) for c in cells["counts"])
                drift = "-" if cells["drift"] is None else f"{cells['drift']:.2f}"
                line += [counts, drift, f"{cells['within']}/{cells['windows']}", shares, f"{cells['load']:.1f}"]
                lines.append(line)
            print_markdown(lines)
            if streamed:
                print()
                for row, cells in rows.items():
                    if "gets" in cells:
                        g = cells["gets"]
                        print(f"{SYSTEMS[ROWS[row][0]]}: epoch 1: {g[0]} GETs of {g[1]} part objects; epoch 2: "
                              f"{g[2]} GETs of {g[3]}")
            self.print_targets(rows, ours, streamed, promise)
        print("\n(x): yogacache's rate / the row's (above 1: yogacache faster). records per epoch: by component, "
              "epoch 1; epoch 2. Drift: the largest |share - target| of any component in any window.")

    def print_targets(self, rows: dict[str, dict[str, Any]], ours: Optional[dict[str, Any]], streamed: bool,
                      promise: int) -> None:
        where = "streamed" if streamed else "local"
        if ours is None or "failed" in ours:
            print(f"\ntargets ({where}): yogacache's row {'not measured' if ours is None else 'failed'}: not checked")
            return
        print()
        for row, cells in rows.items():
            if cells is ours:
                continue
            name = SYSTEMS[ROWS[row][0]]
            if "failed" in cells:
                print(f"target ({where}): faster than {name}: not checked ({name} failed)")
                continue
            ratios = [o / r for o, r in zip(ours["rates"], cells["rates"])]
            met = all(r > 1 for r in ratios)
            print(f"target ({where}): faster than {name}: epoch 1 {ratios[0]:.2f}x, epoch 2 {ratios[1]:.2f}x: "
                  f"{'met' if met else 'MISSED'}")
        if ours["drift"] is None:
            print(f"target ({where}): proportions within +-1 pp in every window: no whole window (fewer records than "
                  f"--window)")
        else:
            met = ours["within"] == ours["windows"]
            print(f"target ({where}): proportions within +-1 pp in every window of {self.args.window}: largest drift "
                  f"{ours['drift']:.2f} pp, {ours['within']}/{ours['windows']} windows: {'met' if met else 'MISSED'}")
        print(f"target ({where}): each epoch reads each component's share exactly (counts and label sums): "
              f"{'met' if all(ours['exact']) else 'MISSED'}")
        if streamed:
            mib = 2**20
            second, beyond = ours["bytes"][1], ours["beyond"]
            print(f"target ({where}): epoch-2 bytes {second / mib:.1f} MiB ({second} B) <= (D - B) + one part per "
                  f"component = {promise / mib:.1f} MiB ({promise} B): {'met' if second <= promise else 'MISSED'}")
            print(f"target ({where}), stricter: bytes beyond one pass over both epochs (what epoch 1 fetched for "
                  f"epoch 2 or twice included) {beyond / mib:.1f} MiB ({beyond} B) <= {promise / mib:.1f} MiB: "
                  f"{'met' if beyond <= promise else 'MISSED'}")


def is_data(path: str) -> bool:
    """A GET of a part / shard / chunk (not an index, a manifest or a listing)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith((".mdb", ".mds", ".bin")) or name.startswith(("part", "shard", "chunk"))


def print_markdown(lines: list[list[str]]) -> None:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for n, line in enumerate(lines):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (width + 2) for width in widths) + "|")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3000 records, windows of 1000, 2Mi parts")
    parser.add_argument("--records", type=int, default=None, help="records of all components; default 40000")
    parser.add_argument("--shape", default="64x63x3", help="image shape; default 64x63x3")
    parser.add_argument("--weights", default="0.7,0.2,0.1", help="component weights (and sizes); default 0.7,0.2,0.1")
    parser.add_argument("--window", type=int, default=None, help="records per proportion window; default 10000")
    parser.add_argument("--part-bytes", default=None, help="part / shard / chunk size; default 16Mi")
    parser.add_argument("--rate", default="200M", help="the streamed rows' link rate in bytes/s; default 200M")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"rows to measure, of {', '.join(ROWS)}")
    parser.add_argument("--no-peers", action="store_true", help="measure yogacache only")
    parser.add_argument("--peers-venv", default=str(PEERS_VENV), help=f"the peers' virtualenv; default {PEERS_VENV}")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per row or build; default 900 (quick 120)")
    parser.add_argument("--workdir", default=None, help="where the temporary directory goes; default the system's")
    args = parser.parse_args()
    args.records = args.records or (3000 if args.quick else 40000)
    args.window = args.window or (1000 if args.quick else 10000)
    args.part_bytes = args.part_bytes or ("2Mi" if args.quick else "16Mi")
    args.timeout = args.timeout or (120 if args.quick else 900)
    chosen = [row for row in args.rows.split(",") if row]
    unknown = [row for row in chosen if row not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}")
    if args.no_peers:
        chosen = [row for row in chosen if ROWS[row][0] == "yogacache"]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    bench = Bench(args)
    try:
        tables = bench.run(chosen)
    finally:
        shutil.rmtree(bench.workdir, ignore_errors=True)
    load_after, cores = os.getloadavg()[0], os.cpu_count()
    bench.print_tables(tables)
    print()
    for note in bench.notes:
        print(f"note: {note}")
    print(f"note: load average (1 min) {load_before:.1f} at the start, {load_after:.1f} at the end; {cores} cores; "
          f"the run took {time.perf_counter() - started:.0f} s; the load column: at each row's start")
    print(f"note: command: {' '.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
