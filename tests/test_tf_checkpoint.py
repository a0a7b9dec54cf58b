"""tf.data iterator checkpoints: save mid-epoch, restore in a new process, continue exactly.

Each case runs two fresh interpreters: one reads part of an epoch, saves
``tf.train.Checkpoint(iterator=...)`` and reads on; the other builds the same dataset, restores
the checkpoint and reads on. What the two read after the save point must be identical, through
the end of the epoch and into the following ones (``repeat``), in every shuffle mode.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = r"""
import json, os, sys
import numpy as np
import tensorflow as tf
import yogacache.read.epochs as epochs
from yogacache.dataref import CacheDataRef
from yogacache.store.local import CacheStore
from yogacache.tensorflow import make_tf_dataset

# Many reads per epoch (16, 32, 64, 64, ...), so that reads happen on both sides of the save.
epochs.FULL_READ_RECORDS, epochs.FIRST_READ_RECORDS, epochs.FIRST_READ_BYTES = 64, 16, 0
root, phase, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
store = CacheStore(root)
if not store.exists("ck", "v1"):
    store.build("ck", "v1", tf.data.Dataset.range(1000).map(lambda x: {"x": x, "v": tf.fill([3], x)}))
stream = CacheDataRef(store.open("ck", "v1")).stream(**kwargs)
dataset = make_tf_dataset(stream).repeat(3).batch(8)
iterator = iter(dataset)
checkpoint = tf.train.Checkpoint(iterator=iterator)
prefix = os.path.join(root, "checkpoints", "it")
if phase == "save":
    for _ in range(int(sys.argv[4])):
        next(iterator)
    checkpoint.save(prefix)
else:
    checkpoint.restore(tf.train.latest_checkpoint(os.path.dirname(prefix))).assert_consumed()
rest = [batch["x"].numpy().tolist() for batch in iterator]
assert all(batch["v"].numpy().tolist() == [[x] * 3 for x in batch["x"].numpy().tolist()] for batch in dataset.take(2))
print(json.dumps(rest))
"""


def _run(root: Path, phase: str, kwargs: dict, batches: int = 0, script: str = SCRIPT) -> list[list[int]]:
    result = subprocess.run(
        [sys.executable, "-c", script, str(root), phase, json.dumps(kwargs), str(batches)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, batches",
    [
        ({"shuffle": True, "shuffle_seed": 11, "shard_rank": 1, "num_shards": 3}, 30),
        ({"shuffle": True, "shuffle_seed": 11, "shard_rank": 1, "num_shards": 3, "shuffle_mode": "global"}, 30),
        ({"shuffle": True, "shuffle_seed": 2, "start_offset": 150, "shuffle_mode": "global"}, 130),
        ({"shuffle": True, "shuffle_seed": 2, "skip_shuffle_at_epoch_end": True}, 100),
    ],
    ids=["shard-mode", "global-mode", "resumed-global-second-epoch", "skip-shuffle"],
)
def test_an_iterator_checkpoint_restores_exactly_in_a_new_process(
    tmp_path: Path, kwargs: dict, batches: int
) -> None:
    saved = _run(tmp_path, "save", kwargs, batches)
    restored = _run(tmp_path, "restore", kwargs)
    assert restored == saved
    assert sum(len(batch) for batch in saved) > 500  # the rest of this epoch and two more


@pytest.mark.slow
def test_a_restored_iterator_is_followed_by_the_next_epoch(tmp_path: Path) -> None:
    """Without repeat: the iteration after a restored one reads the epoch after it."""
    script = SCRIPT.replace(".repeat(3)", "")
    script = script.replace(
        "rest = [batch[\"x\"].numpy().tolist() for batch in iterator]",
        "rest = [batch[\"x\"].numpy().tolist() for batch in iterator] + [b[\"x\"].numpy().tolist() for b in dataset]",
    )
    kwargs = {"shuffle": True, "shuffle_seed": 5}
    outputs = [_run(tmp_path, "save", kwargs, 40, script), _run(tmp_path, "restore", kwargs, 0, script)]
    assert outputs[0] == outputs[1]
    second_epoch = sorted(x for batch in outputs[1][-125:] for x in batch)
    assert second_epoch == list(range(1000))
