"""yogacache quickstart: cache a synthetic image-classification dataset, hit the cache, train on a shard.

Run with ``make demo`` (or ``python examples/quickstart.py [--storage DIR] [--records N]``).
Nothing is downloaded: the images are drawn from a fixed random generator.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import warnings

# Quiet TensorFlow before it is imported: no C++ info lines, no oneDNN banner, no Keras chatter.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Where google-api-python-client is installed, TensorFlow imports it, and google.api_core warns
# about this Python's support window on every import: not the demo's output.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.api_core")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import yogacache  # noqa: E402

NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)


# Ten clearly different colours: the label is a function of an image's mean colour.
PALETTE = np.array(
    [
        [230, 25, 75],
        [60, 180, 75],
        [255, 225, 25],
        [0, 130, 200],
        [245, 130, 48],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [128, 128, 128],
        [20, 20, 20],
    ],
    dtype=np.int16,
)


def synthetic_images(num_records: int) -> tf.data.Dataset:
    """Images of their label's colour plus pixel noise: learnable (a tiny model gets close to
    100% in a few epochs) and deterministic."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, NUM_CLASSES, size=num_records, dtype=np.int64)
    noise = rng.integers(-40, 41, size=(num_records, *IMAGE_SHAPE), dtype=np.int16)
    images = np.clip(PALETTE[labels][:, None, None, :] + noise, 0, 255).astype(np.uint8)
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage", help="cache directory (default: the local default)")
    parser.add_argument("--records", type=int, default=20_000)
    args = parser.parse_args()

    config = {"type": "shared_fs", "host_storage_path": os.path.abspath(args.storage)} if args.storage else None
    # This process is rank 0 of 2, as one of two GPUs would be.
    layer = yogacache.DataLayer(config, rank=0, num_shards=2, seed=7)
    builds = []

    @layer.cache_train_dataset("quickstart-images", f"n{args.records}", shuffle=True)
    def make_dataset() -> tf.data.Dataset:
        builds.append(1)
        return synthetic_images(args.records)

    print(f"cache root: {layer.store.root}")
    start = time.perf_counter()
    train = make_dataset()
    first = time.perf_counter() - start
    status = "built the cache" if builds else "cache hit (built by an earlier run)"
    print(f"first call:  {status} in {first:.2f} s")

    start = time.perf_counter()
    train = make_dataset()
    next(iter(train))
    second = time.perf_counter() - start
    print(f"second call: cache hit, first element after {second * 1000:.1f} ms (builds so far: {len(builds)})")

    start = time.perf_counter()
    count = sum(int(batch["label"].shape[0]) for batch in train.batch(256))
    elapsed = time.perf_counter() - start
    print(f"read shard 0 of 2, shuffled: {count:,} records in {elapsed:.2f} s ({count / elapsed:,.0f} records/s)")

    def to_xy(batch: dict) -> tuple:
        return tf.cast(batch["image"], tf.float32) / 255.0, batch["label"]

    tf.keras.utils.set_random_seed(0)  # the same initial weights every run
    model = tf.keras.Sequential(
        [
            tf.keras.Input(IMAGE_SHAPE),
            tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.Adam(0.01),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    epochs = 5
    start = time.perf_counter()
    # Each epoch reads the cache in a new order (the decorator reshuffles with seed + epoch).
    model.fit(train.batch(64).map(to_xy).prefetch(2), epochs=epochs, shuffle=False, verbose=0)
    elapsed = time.perf_counter() - start
    _, accuracy = model.evaluate(train.batch(256).map(to_xy), verbose=0)
    print(f"trained a tiny Keras model for {epochs} epochs in {elapsed:.2f} s: final accuracy {accuracy:.2f}")
    cli = command_path()
    print(f"run `{cli} ls` to see the cache; `{cli} rm quickstart-images n{args.records}_train` removes it")


def command_path() -> str:
    """How to run this interpreter's ``yogacache`` command from here: its name where it is the
    one on PATH, else its path (``.venv/bin/yogacache`` after ``make demo``)."""
    script = os.path.join(os.path.dirname(sys.executable), "yogacache")
    found = shutil.which("yogacache")
    if found is not None and os.path.realpath(found) == os.path.realpath(script):
        return "yogacache"
    relative = os.path.relpath(script)
    return relative if not relative.startswith("..") else script


if __name__ == "__main__":
    main()
