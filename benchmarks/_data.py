"""Workload definitions and deterministic synthetic data, shared by the orchestrator and workers.

This module imports only the standard library at import time (numpy and TensorFlow are
imported lazily), so ``bench_core.py`` stays cheap to import and this file works unchanged in
the YogaDL virtualenv.
"""

from __future__ import annotations

import math
from typing import Any

# Records in the two image workloads (full run); ``--quick`` divides by QUICK_DIVISOR.
WORKLOADS: dict[str, dict[str, Any]] = {
    "small": {"records": 100_000, "shape": (32, 32, 3)},
    "large": {"records": 10_000, "shape": (184, 184, 3)},
}
# Records in the reader-memory workload (an int64 label only).
MEMORY_RECORDS = 1_000_000
QUICK_DIVISOR = 10

DATA_SEED = 1234
NUM_CLASSES = 1000

# The consumer and stream arguments used by every read measurement.
BATCH = 256
PREFETCH = 2
SHUFFLE_SEED = 7
SHARD_RANK = 0
NUM_SHARDS = 2

DATASET_VERSION = "v1"


def parts_read_at_once(records: int, records_per_part: float) -> int:
    """S of docs/streaming.md's promise (epoch 2 fetches at most (D - B) + S parts): the parts
    that ``records`` read at once span (a DataLoader's workers x ``PREFETCH`` batches; 1 for one
    reader reading within a part)."""
    return max(1, math.ceil(records / records_per_part))


def make_arrays(records: int, shape: tuple[int, ...], seed: int = DATA_SEED) -> tuple[Any, Any]:
    """``(images uint8[records, *shape], labels int64[records])``, identical in every process."""
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(records, *shape), dtype=np.uint8)
    labels = rng.integers(0, NUM_CLASSES, size=records, dtype=np.int64)
    return images, labels


def make_tf_source(images: Any, labels: Any) -> Any:
    """The tf.data source: ``from_tensor_slices`` over the arrays (converted to tensors once)."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((tf.convert_to_tensor(images), tf.convert_to_tensor(labels)))


def shard_order(records: int) -> Any:
    """Indices of shard ``SHARD_RANK`` of ``NUM_SHARDS`` (strided, as YogaDL), shuffled."""
    import numpy as np

    indices = np.arange(SHARD_RANK, records, NUM_SHARDS, dtype=np.int64)
    np.random.default_rng(SHUFFLE_SEED).shuffle(indices)
    return indices


def make_jpeg_source(images: Any, labels: Any) -> Any:
    """A decoding tf.data source, as image pipelines have: the images JPEG-encoded once (in
    memory, outside any clock), then ``map(decode_jpeg)`` on every pass."""
    import tensorflow as tf

    encoded = tf.data.Dataset.from_tensor_slices(tf.convert_to_tensor(images)).map(
        lambda image: tf.io.encode_jpeg(image, quality=90)
    )
    jpegs = tf.convert_to_tensor(list(encoded.as_numpy_iterator()), dtype=tf.string)
    shape = images.shape[1:]

    def decode(jpeg: Any, label: Any) -> Any:
        image = tf.io.decode_jpeg(jpeg, channels=3)
        image.set_shape(shape)
        return image, label

    return tf.data.Dataset.from_tensor_slices((jpegs, tf.convert_to_tensor(labels))).map(decode)
