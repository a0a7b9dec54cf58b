"""Shuffle quality and epoch set-up of ``shuffle_mode="parts"`` against MosaicML's ``py1e``.

Records written in class-sorted order (the hard case: a part holds few classes); for each
order, the mean KL divergence of each batch's label histogram from the dataset's (0 is a
perfectly mixed batch), and the most parts a reader needs at once (parts whose first read is
behind it and last read ahead: what it must keep on disk). ``py1e`` gets the block size that
makes it need as many parts at once as ``"parts"`` with each window, so the rows compare equal
resident bytes; ``"global"`` and ``"shard"`` (full shuffles) are the reference. Then the time
to set up an epoch of 10^5 parts (up to the first batch's record indices).

``py1e`` runs in MosaicML Streaming's own virtualenv (``benchmarks/.venv-peers``, as for
``bench_torch.py``), in a subprocess that writes its epoch order to a ``.npy`` file.

Usage: ``.venv/bin/python benchmarks/bench_shuffle.py [--records N] [--classes C]
[--part-records R] [--batch B] [--windows 2,4,8] [--peers-python PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from yogacache.read.options import ReadOptions
from yogacache.read.parts_shuffle import PartLayout
from yogacache.read.schedule import ReadSchedule

HERE = Path(__file__).resolve().parent
PEERS_PYTHON = HERE / ".venv-peers" / "bin" / "python"
if not PEERS_PYTHON.exists():  # a git worktree: the main checkout's virtualenv
    PEERS_PYTHON = Path(os.environ.get("BENCH_PEERS_PYTHON", "/work/main/benchmarks/.venv-peers/bin/python"))
SEED = 17

# Runs in the peers' virtualenv: MosaicML's own shuffle of one epoch per block size, each
# written as .npy; prints the seconds of each.
PY1E = r"""
import json, sys, time
import numpy as np
from streaming.base.shuffle import get_shuffle
args = json.loads(sys.stdin.read())
sizes = np.asarray(args["sizes"], dtype=np.int64)
seconds = []
for block, out in zip(args["blocks"], args["outs"]):
    start = time.perf_counter()
    ids = get_shuffle("py1e", sizes, 1, args["seed"], args["epoch"], block)
    seconds.append(time.perf_counter() - start)
    if out:
        np.save(out, ids)
print(json.dumps({"seconds": seconds}))
"""


def peer_shuffle(python: Path, sizes: list[int], blocks: list[int], outs: list[str]) -> list[float]:
    """Runs MosaicML's py1e in its virtualenv, once per block size (orders go to ``outs``, when
    named); returns the seconds of each."""
    args = {"sizes": sizes, "seed": SEED, "epoch": 0, "blocks": blocks, "outs": outs}
    result = subprocess.run(
        [str(python), "-c", PY1E], input=json.dumps(args), check=True, capture_output=True, text=True, timeout=3600
    )
    return [float(x) for x in json.loads(result.stdout.strip().splitlines()[-1])["seconds"]]


def yogacache_order(layout: PartLayout, mode: str, window: int = 4) -> np.ndarray:
    options = ReadOptions(
        shuffle=True, reshuffle_each_epoch=True, shuffle_seed=SEED, shuffle_mode=mode, parts_window=window
    )
    plan = ReadSchedule(layout.num_records, options, layout).plan(0)
    return plan.indices(0, len(plan))


def batch_kl(order: np.ndarray, labels: np.ndarray, classes: int, batch: int) -> float:
    """Mean over full batches of KL(batch label histogram ‖ dataset label histogram), in nats."""
    dataset = np.bincount(labels, minlength=classes) / len(labels)
    batches = len(order) // batch
    hist = np.zeros((batches, classes))
    rows = np.repeat(np.arange(batches), batch)
    np.add.at(hist, (rows, labels[order[: batches * batch]]), 1)
    p = hist / batch
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p / dataset), 0.0)
    return float(terms.sum(axis=1).mean())


def parts_at_once(order: np.ndarray, layout: PartLayout) -> tuple[int, float]:
    """(most, mean) parts live at once: first read at or behind a position, last at or ahead."""
    parts = layout.part_of(order)
    positions = np.arange(len(order))
    first = np.full(layout.num_parts, len(order))
    last = np.full(layout.num_parts, -1)
    np.minimum.at(first, parts, positions)
    np.maximum.at(last, parts, positions)
    used = last >= 0
    change = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(change, first[used], 1)
    np.add.at(change, last[used] + 1, -1)
    live = np.cumsum(change)[:-1]
    return int(live.max()), float(live.mean())


def matched_py1e(
    python: Path, layout: PartLayout, target: int, workdir: str
) -> tuple[int, np.ndarray, int]:
    """The py1e order (and its block size) that needs the most parts at once without exceeding
    ``target``: the largest block size, in steps of half a part, that stays within it."""
    part = int(layout.records.max())
    blocks = [part * k // 2 for k in range(2, 2 * target + 3)]
    outs = [os.path.join(workdir, f"py1e-{block}.npy") for block in blocks]
    peer_shuffle(python, layout.records.tolist(), blocks, outs)
    best: Optional[tuple[int, np.ndarray, int]] = None
    for block, out in zip(blocks, outs):
        order = np.load(out)
        most = parts_at_once(order, layout)[0]
        if best is None or most <= target:
            best = (block, order, most)
    assert best is not None
    return best


def setup_seconds(layout: PartLayout, mode: str, shards: int = 8, batch: int = 256) -> float:
    """Seconds from nothing to the first batch's record indices, for rank 0 of ``shards``."""
    start = time.perf_counter()
    options = ReadOptions(
        shuffle=True, reshuffle_each_epoch=True, shuffle_seed=SEED, shuffle_mode=mode, num_shards=shards
    )
    ReadSchedule(layout.num_records, options, layout).plan(0).indices(0, batch)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--part-records", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--windows", default="2,4,8")
    parser.add_argument("--setup-parts", type=int, default=100_000)
    parser.add_argument("--peers-python", type=Path, default=PEERS_PYTHON)
    args = parser.parse_args()

    n, classes = args.records, args.classes
    labels = (np.arange(n) * classes // n).astype(np.int64)  # class-sorted records
    counts = [args.part_records] * (n // args.part_records) + ([n % args.part_records] if n % args.part_records else [])
    layout = PartLayout.from_counts(counts)
    print(
        f"{n} records in {classes} classes, written class-sorted, {layout.num_parts} parts of "
        f"{args.part_records} records ({args.part_records * classes // n} classes each); batches of {args.batch}",
        file=sys.stderr,
    )
    rows: list[tuple[str, int, float, float]] = []
    for mode in ("global", "shard"):
        order = yogacache_order(layout, mode)
        most, mean = parts_at_once(order, layout)
        rows.append((f'yogacache "{mode}" (full shuffle)', most, mean, batch_kl(order, labels, classes, args.batch)))
    peers_ok = args.peers_python.exists()
    with tempfile.TemporaryDirectory() as workdir:
        for window in (int(w) for w in args.windows.split(",")):
            order = yogacache_order(layout, "parts", window)
            most, mean = parts_at_once(order, layout)
            kl = batch_kl(order, labels, classes, args.batch)
            rows.append((f'yogacache "parts", parts_window={window}', most, mean, kl))
            if peers_ok:
                block, peer, peer_most = matched_py1e(args.peers_python, layout, most, workdir)
                peer_mean = parts_at_once(peer, layout)[1]
                peer_kl = batch_kl(peer, labels, classes, args.batch)
                rows.append((f"MosaicML py1e, block {block} samples", peer_most, peer_mean, peer_kl))
        # Epoch set-up for 10^5 parts.
        setup_layout = PartLayout.from_counts([100] * args.setup_parts)
        big_layout = PartLayout.from_counts([10_000] * args.setup_parts)
        setups = [
            (f'yogacache "parts", {args.setup_parts} parts x 100 records', setup_seconds(setup_layout, "parts")),
            (f'yogacache "parts", {args.setup_parts} parts x 10^4 records', setup_seconds(big_layout, "parts")),
            (f'yogacache "global", {args.setup_parts} parts x 100 records', setup_seconds(setup_layout, "global")),
            (f'yogacache "shard" (YogaDL), {args.setup_parts} parts x 100 rec.', setup_seconds(setup_layout, "shard")),
        ]
        if peers_ok:
            (seconds,) = peer_shuffle(args.peers_python, [100] * args.setup_parts, [100 * 4], [""])
            setups.append((f"MosaicML py1e, {args.setup_parts} shards x 100 samples", seconds))

    print("\n### Shuffle quality (class-sorted records)\n")
    print("| order | parts at once (most) | parts at once (mean) | batch KL (nats) | KL / global |")
    print("|---|---:|---:|---:|---:|")
    reference = rows[0][3]
    for name, most, mean, kl in rows:
        print(f"| {name} | {most} | {mean:.1f} | {kl:.3f} | {kl / reference:.1f}x |")
    pairs = [(rows[i], rows[i + 1]) for i in range(2, len(rows) - 1, 2)] if peers_ok else []
    if pairs:
        print("\n| window | py1e KL / parts KL (same parts at once; >1: parts mixes better) |")
        print("|---|---:|")
        for ours, theirs in pairs:
            print(f"| {ours[0].split('=')[-1]} ({ours[1]} vs {theirs[1]} parts) | {theirs[3] / ours[3]:.2f}x |")
    print("\n### Epoch set-up (to the first batch's indices, rank 0 of 8)\n")
    print("| order | seconds | vs parts |")
    print("|---|---:|---:|")
    base = setups[0][1]
    for name, seconds in setups:
        print(f"| {name} | {seconds:.4f} | {seconds / base:.1f}x |")
    if not peers_ok:
        print(f"\n(MosaicML rows left out: no {args.peers_python})")


if __name__ == "__main__":
    main()
