"""A YogaDL 0.1.4 program, unchanged except for its imports (``yogadl`` became ``yogacache``).

Run: ``python examples/yogadl_walkthrough.py [STORAGE_DIR]``.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import yogacache as yogadl  # noqa: E402  (was: import yogadl)
import yogacache.storage  # noqa: E402,F401  (was: import yogadl.storage)
import yogacache.tensorflow  # noqa: E402,F401  (was: import yogadl.tensorflow)


def main(storage_path: str) -> None:
    # A storage backed by the local filesystem.
    os.makedirs(storage_path, exist_ok=True)
    lfs_config = yogadl.storage.LFSConfigurations(storage_path)
    storage = yogadl.storage.LFSStorage(lfs_config)

    # Store a dataset as "squares" version "1.0".
    storage.submit(tf.data.Dataset.range(12).map(lambda x: x * x), "squares", "1.0")

    # Fetch it, and say how to stream it: resume at record 4, shuffled with a fixed seed.
    dataref = storage.fetch("squares", "1.0")
    stream = dataref.stream(start_offset=4, shuffle=True, shuffle_seed=777)
    records = yogadl.tensorflow.make_tf_dataset(stream)
    # A real tf.data.Dataset: repeat() reads the next epochs, each in its own order.
    for batch in records.repeat(2).batch(5):
        print("squares:", batch.numpy().tolist())

    # The same in fewer steps: the function runs only when the cache is missing.
    @storage.cacheable("evens", "2.0")
    def make_records() -> tf.data.Dataset:
        print("cache not found, making evens v2 ...")
        return tf.data.Dataset.range(10).map(lambda x: 2 * x)

    for attempt in range(2):
        dataref = make_records()
        stream = dataref.stream(shard_rank=attempt, num_shards=2)
        values = [int(x) for x in yogadl.tensorflow.make_tf_dataset(stream)]
        print(f"evens, shard {attempt} of 2 ({len(stream)} records):", values)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as directory:
            main(directory)
