"""tf.data iterator checkpoints: save mid-epoch, restore in a new process, continue exactly.

Each case runs in two fresh interpreters: one reads part of an epoch, saves
``tf.train.Checkpoint(iterator=...)`` and reads on; the other builds the same dataset, restores
the checkpoint and reads on. What the two read after the save point must be identical, through
the end of the epoch and into the following ones (``repeat``), in every shuffle mode.

The interpreters are shared by the module's cases, each in a cache root of its own: one runs
every case's save, then another every restore (importing TensorFlow costs seconds, ten
times over otherwise). A restore still runs in a process that never saw its case's save.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

SCRIPT = r"""
import json, os, sys, traceback
import numpy as np
import tensorflow as tf
import yogacache.read.epochs as epochs
from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

# Many reads per epoch (16, 32, 64, 64, ...), so that reads happen on both sides of the save.
epochs.FULL_READ_RECORDS, epochs.FIRST_READ_RECORDS, epochs.FIRST_READ_BYTES = 64, 16, 0


def run(root, phase, kwargs, batches, repeat, next_epoch):
    store = CacheStore(root)
    if not store.exists("ck", "v1"):
        store.build("ck", "v1", tf.data.Dataset.range(1000).map(lambda x: {"x": x, "v": tf.fill([3], x)}))
    stream = CacheDataRef(store.open("ck", "v1")).stream(**kwargs)
    dataset = make_tf_dataset(stream)
    if repeat:
        dataset = dataset.repeat(3)
    dataset = dataset.batch(8)
    iterator = iter(dataset)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    prefix = os.path.join(root, "checkpoints", "it")
    if phase == "save":
        for _ in range(batches):
            next(iterator)
        checkpoint.save(prefix)
    else:
        checkpoint.restore(tf.train.latest_checkpoint(os.path.dirname(prefix))).assert_consumed()
    rest = [batch["x"].numpy().tolist() for batch in iterator]
    if next_epoch:
        rest += [b["x"].numpy().tolist() for b in dataset]
    for batch in dataset.take(2):
        assert batch["v"].numpy().tolist() == [[x] * 3 for x in batch["x"].numpy().tolist()]
    return rest


phase, cases = sys.argv[1], json.loads(sys.argv[2])
for case in cases:
    try:
        out = {"rest": run(case["root"], phase, case["kwargs"], case["batches"], case["repeat"], case["next_epoch"])}
    except BaseException:
        out = {"error": traceback.format_exc()}
    print("CASE " + json.dumps({"id": case["id"], **out}), flush=True)
"""

# id -> (stream kwargs, batches read before the save, repeat(3), the next epoch read after the iterator)
CASES: dict[str, tuple[dict[str, Any], int, bool, bool]] = {
    "shard-mode": ({"shuffle": True, "shuffle_seed": 11, "shard_rank": 1, "num_shards": 3}, 30, True, False),
    "global-mode": (
        {"shuffle": True, "shuffle_seed": 11, "shard_rank": 1, "num_shards": 3, "shuffle_mode": "global"},
        30,
        True,
        False,
    ),
    "resumed-global-second-epoch": (
        {"shuffle": True, "shuffle_seed": 2, "start_offset": 150, "shuffle_mode": "global"},
        130,
        True,
        False,
    ),
    "skip-shuffle": ({"shuffle": True, "shuffle_seed": 2, "skip_shuffle_at_epoch_end": True}, 100, True, False),
    # Without repeat: the iteration after a restored one reads the epoch after it.
    "next-epoch": ({"shuffle": True, "shuffle_seed": 5}, 40, False, True),
}
RESTORE_CASES = [case for case in CASES if CASES[case][2]]


def _run(phase: str, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One fresh interpreter running ``phase`` for every case; each case's output or traceback."""
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, phase, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("CASE "):
            case = json.loads(line[len("CASE ") :])
            found[case.pop("id")] = case
    missing = [case["id"] for case in cases if case["id"] not in found]
    assert result.returncode == 0 and not missing, f"{phase}: no output for {missing}: {result.stderr[-3000:]}"
    return found


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Case id -> (what the saving process read after its save, what the restoring one read):
    every case saved in one fresh interpreter, then restored in another."""
    cases = [
        {"id": case, "root": str(tmp_path_factory.mktemp(case)), "kwargs": kwargs, "batches": batches,
         "repeat": repeat, "next_epoch": next_epoch}
        for case, (kwargs, batches, repeat, next_epoch) in CASES.items()
    ]  # fmt: skip
    saved = _run("save", cases)
    restored = _run("restore", [{**case, "batches": 0} for case in cases])
    return {case["id"]: (saved[case["id"]], restored[case["id"]]) for case in cases}


def _outputs(checkpointed: dict[str, Any], case: str) -> tuple[list[list[int]], list[list[int]]]:
    saved, restored = checkpointed[case]
    assert "error" not in saved, f"save: {saved['error']}"
    assert "error" not in restored, f"restore: {restored['error']}"
    return saved["rest"], restored["rest"]


@pytest.mark.slow
@pytest.mark.parametrize("case", RESTORE_CASES)
def test_an_iterator_checkpoint_restores_exactly_in_a_new_process(checkpointed: dict[str, Any], case: str) -> None:
    saved, restored = _outputs(checkpointed, case)
    assert restored == saved
    assert sum(len(batch) for batch in saved) > 500  # the rest of this epoch and two more


@pytest.mark.slow
def test_a_restored_iterator_is_followed_by_the_next_epoch(checkpointed: dict[str, Any]) -> None:
    """Without repeat: the iteration after a restored one reads the epoch after it."""
    saved, restored = _outputs(checkpointed, "next-epoch")
    assert saved == restored
    second_epoch = sorted(x for batch in restored[-125:] for x in batch)
    assert second_epoch == list(range(1000))
