"""The peers of ``bench_scale.py``: per-process memory and first element against the dataset's size.

Run by ``bench_scale.py`` as ``python _peers_scale.py {prepare|measure} PEER SPEC_JSON`` in the
peers' virtualenv (``benchmarks/.venv-peers``; Grain in the project's), each ``measure`` in a
fresh process, its imports before the clock. ``prepare`` lays out the peer's dataset of ``n``
records once under ``work``: one real shard (chunk, Arrow file) of ``n / parts`` records
``{"i": int64}`` written by the peer's own writer, hard-linked ``parts`` times and listed that
many times in the peer's index, as ``bench_scale.py`` lays out its synthetic caches, so that
every size costs one shard's writing. ``measure`` prints one JSON line: ``first_s`` (from opening
the dataset to its first shuffled element) and ``growth`` (RssAnon + RssShmem, bytes).

* ``mosaicml``: ``streaming.StreamingDataset(local=..., shuffle=True)`` (its default ``py1e``),
  ``next(iter(dataset))``: the epoch's sample ids are made then, in shared memory.
* ``litdata``: ``litdata.StreamingDataset(input_dir, shuffle=True)``, ``next(iter(dataset))``.
* ``grain``: ``grain.python.IndexSampler(num_records=n, shuffle=True)``: its first 1000 record
  keys (a Feistel ``index_shuffle``, no data read).
* ``hf_interleave``: ``datasets.interleave_datasets`` of three Arrow datasets (``load_from_disk``,
  memory-mapped; ``select`` of the first 50%, 30% and 20% of the ``n`` records, contiguous, so
  no index mapping of their own) with probabilities 0.5/0.3/0.2: its element 0.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any

LINKS_PER_FILE = 60_000  # ext4 allows 65,000 hard links to a file


def memory() -> int:
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


def link_copies(source: str, names: list[str], directory: str) -> None:
    """Hard links of ``source`` named ``names`` in ``directory`` (a fresh copy every
    ``LINKS_PER_FILE`` names)."""
    current = source
    for k, name in enumerate(names):
        if k and k % LINKS_PER_FILE == 0:
            current = os.path.join(directory, f".copy-{k}")
            shutil.copyfile(source, current)
        target = os.path.join(directory, name)
        if not os.path.exists(target):
            os.link(current, target)


def where(spec: dict[str, Any], peer: str) -> str:
    return os.path.join(spec["work"], peer, f"n{spec['n']}-p{spec['parts']}")


def per_part(spec: dict[str, Any]) -> int:
    n, parts = spec["n"], spec["parts"]
    if n % parts:
        return n  # one shard of everything
    return int(n // parts)


def parts_of(spec: dict[str, Any]) -> int:
    return int(spec["n"] // per_part(spec))


# -- MosaicML Streaming -----------------------------------------------------------------------


def prepare_mosaicml(spec: dict[str, Any], out: str) -> None:
    import numpy as np
    from streaming import MDSWriter

    seed = os.path.join(out, "seed")
    with MDSWriter(out=seed, columns={"i": "int64"}, size_limit=(1 << 32) - 1) as writer:
        for i in range(per_part(spec)):
            writer.write({"i": np.int64(i)})
    index = json.load(open(os.path.join(seed, "index.json")))
    (shard,) = index["shards"]
    basename = shard["raw_data"]["basename"]
    names = [f"shard.{k:06d}.mds" for k in range(parts_of(spec))]
    link_copies(os.path.join(seed, basename), names, out)
    index["shards"] = [dict(shard, raw_data=dict(shard["raw_data"], basename=name)) for name in names]
    json.dump(index, open(os.path.join(out, "index.json"), "w"))
    shutil.rmtree(seed)


def measure_mosaicml(spec: dict[str, Any], out: str) -> dict[str, Any]:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    base, start = memory(), time.perf_counter()
    dataset = StreamingDataset(local=out, shuffle=True, shuffle_seed=spec["seed"], batch_size=1)
    first = next(iter(dataset))
    return {"first_s": time.perf_counter() - start, "growth": memory() - base, "first": int(first["i"])}


# -- LitData ----------------------------------------------------------------------------------


def prepare_litdata(spec: dict[str, Any], out: str) -> None:
    import numpy as np
    from litdata.streaming.writer import BinaryWriter

    seed = os.path.join(out, "seed")
    os.makedirs(seed, exist_ok=True)
    writer = BinaryWriter(seed, chunk_size=per_part(spec))
    for i in range(per_part(spec)):
        writer.add_item(i, {"i": np.int64(i)})
    writer.done()
    writer.merge(1)
    index = json.load(open(os.path.join(seed, "index.json")))
    (chunk,) = index["chunks"]
    names = [f"chunk-0-{k}.bin" for k in range(parts_of(spec))]
    link_copies(os.path.join(seed, chunk["filename"]), names, out)
    index["chunks"] = [dict(chunk, filename=name) for name in names]
    json.dump(index, open(os.path.join(out, "index.json"), "w"))
    shutil.rmtree(seed)


def measure_litdata(spec: dict[str, Any], out: str) -> dict[str, Any]:
    from litdata import StreamingDataset

    base, start = memory(), time.perf_counter()
    dataset = StreamingDataset(out, shuffle=True, seed=spec["seed"])
    first = next(iter(dataset))
    return {"first_s": time.perf_counter() - start, "growth": memory() - base, "first": int(first["i"])}


# -- Grain ------------------------------------------------------------------------------------


def prepare_grain(spec: dict[str, Any], out: str) -> None:
    del spec, out  # nothing: the sampler needs only the count


def measure_grain(spec: dict[str, Any], out: str) -> dict[str, Any]:
    import grain.python as grain

    base, start = memory(), time.perf_counter()
    sampler = grain.IndexSampler(
        num_records=spec["n"], shard_options=grain.NoSharding(), shuffle=True, num_epochs=1, seed=spec["seed"]
    )
    first = sampler[0].record_key
    result = {"first_s": time.perf_counter() - start, "first": int(first)}
    for k in range(1000):
        sampler[k]
    result["growth"] = memory() - base
    return result


# -- Hugging Face datasets --------------------------------------------------------------------


def prepare_hf_interleave(spec: dict[str, Any], out: str) -> None:
    import datasets
    import numpy as np

    seed = os.path.join(out, "seed")
    datasets.Dataset.from_dict({"i": np.arange(per_part(spec), dtype=np.int64)}).save_to_disk(seed, num_shards=1)
    state = json.load(open(os.path.join(seed, "state.json")))
    (data_file,) = state["_data_files"]
    names = [f"data-{k:06d}.arrow" for k in range(parts_of(spec))]
    link_copies(os.path.join(seed, data_file["filename"]), names, out)
    state["_data_files"] = [{"filename": name} for name in names]
    json.dump(state, open(os.path.join(out, "state.json"), "w"))
    shutil.copyfile(os.path.join(seed, "dataset_info.json"), os.path.join(out, "dataset_info.json"))
    shutil.rmtree(seed)


def measure_hf_interleave(spec: dict[str, Any], out: str) -> dict[str, Any]:
    import datasets

    datasets.disable_progress_bars()
    n = spec["n"]
    base, start = memory(), time.perf_counter()
    whole = datasets.load_from_disk(out)
    cuts = [int(n * w) for w in spec["weights"]]
    components = [whole.select(range(cut)) for cut in cuts]
    mixed = datasets.interleave_datasets(components, probabilities=list(spec["weights"]), seed=spec["seed"])
    first = mixed[0]
    return {
        "first_s": time.perf_counter() - start,
        "growth": memory() - base,
        "first": int(first["i"]),
        "rows": len(mixed),
    }


def main() -> None:
    action, peer, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    out = where(spec, peer)
    if action == "prepare":
        done = os.path.join(out, ".prepared")
        if not os.path.exists(done):
            shutil.rmtree(out, ignore_errors=True)  # what a failed attempt left
            os.makedirs(out)
            globals()[f"prepare_{peer}"](spec, out)
            open(done, "w").close()
        print(json.dumps({"prepared": out}), flush=True)
    else:
        print(json.dumps(globals()[f"measure_{peer}"](spec, out)), flush=True)
    os._exit(0)  # no teardown of the peers' threads and shared memory on the clock's side


if __name__ == "__main__":
    main()
