"""The matrix's source data and its oracle: records that carry their index, the order YogaDL 0.1.4
promises for them, and the same records as tar shards and as a YogaDL cache.mdb.

Record ``i`` is ``{"i": int64 i, "x": float64[32] = i + arange(32) / 64, "empty": float32[0]}``
(a zero-size leaf in every element). Imported from tar shards it is the webdataset sample
``{"__key__": b"%06d" % i, "idx": b"<i>", "x": <the bytes of x>, "empty": b""}``. Module-level
functions only: spawned build workers and Ray tasks import this module to run them.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

X_WIDTH = 32
SEED = 11


def x_of(i: int) -> np.ndarray:
    return np.float64(i) + np.arange(X_WIDTH, dtype=np.float64) / 64


def element(i: int) -> dict[str, Any]:
    return {"i": np.int64(i), "x": x_of(i), "empty": np.zeros((0,), np.float32)}


def elements(n: int) -> list[dict[str, Any]]:
    return [element(i) for i in range(n)]


def records(start: int, stop: int) -> Iterator[dict[str, Any]]:
    """A build shard of unknown length (its parts key records from 0: format 2)."""
    for i in range(start, stop):
        yield element(i)


def shard_bounds(n: int, shards: int) -> list[tuple[int, int]]:
    """``shards`` contiguous index ranges covering ``range(n)`` (the build shards of a sharded build)."""
    edges = [n * s // shards for s in range(shards + 1)]
    return [(edges[s], edges[s + 1]) for s in range(shards) if edges[s] < edges[s + 1]]


# -- tar shards (webdataset samples) ---------------------------------------------------------------
def write_tar_shards(directory: Path, n: int, shards: int) -> list[Path]:
    """Writes records ``0..n-1`` as ``shards`` tar files of webdataset samples; returns them in order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, (start, stop) in enumerate(shard_bounds(n, shards)):
        path = directory / f"shard-{s:03d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(start, stop):
                for field, data in (("idx", str(i).encode()), ("x", x_of(i).tobytes()), ("empty", b"")):
                    info = tarfile.TarInfo(f"{i:06d}.{field}")
                    info.size = len(data)
                    info.mtime = 0
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


# -- YogaDL 0.1.4 cache.mdb -------------------------------------------------------------------------
def write_yogadl_cache(path: Path, n: int) -> Path:
    """A cache.mdb of records ``0..n-1`` exactly as YogaDL 0.1.4's ``submit`` writes it."""
    import tensorflow as tf
    import yogadl.tensorflow

    data = elements(n)
    dataset = tf.data.Dataset.from_tensor_slices(
        {
            "i": np.array([int(e["i"]) for e in data], np.int64),
            "x": np.stack([e["x"] for e in data]),
            "empty": np.zeros((n, 0), np.float32),
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    yogadl.tensorflow.serialize_tf_dataset_to_lmdb(dataset=dataset, checkpoint_path=path, tf_config=None)
    return path


# -- checking one record against the source ----------------------------------------------------------
def index_of(record: Any) -> int:
    """The source index of a record read back (any consumer's form), after checking every leaf
    against the source: a record that is not exactly source record ``i`` raises AssertionError."""
    if "__key__" in record:  # imported from tar shards: bytes fields
        key = _as_bytes(record["__key__"])
        i = int(_as_bytes(record["idx"]))
        assert key == b"%06d" % i, f"record {i}: __key__ {key!r}"
        assert _as_bytes(record["x"]) == x_of(i).tobytes(), f"record {i}: x differs from the source"
        assert _as_bytes(record["empty"]) == b"", f"record {i}: empty is {record['empty']!r}"
        return i
    i = int(np.asarray(record["i"]))
    x = np.asarray(record["x"])
    assert x.shape == (X_WIDTH,) and np.array_equal(x, x_of(i)), f"record {i}: x differs from the source: {x[:4]}"
    empty = np.asarray(record["empty"])
    assert empty.shape == (0,), f"record {i}: empty has shape {empty.shape}"
    return i


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    array = np.asarray(value)
    if array.dtype.kind in ("S", "O"):
        return bytes(array.item())
    return bytes(array.tobytes())


# -- the oracle ------------------------------------------------------------------------------------------
def yogadl_order(
    n: int, rank: int, shards: int, *, shuffle: bool, seed: Optional[int], start_offset: int, epochs: int
) -> list[list[int]]:
    """What YogaDL 0.1.4 reads on ``rank`` of ``shards`` (docs/design.md "Reading"): its own
    ``shard_keys`` and ``GeneratorFromKeys`` where it is installed, else the rule re-derived (rank
    ``r`` gets ``r, r+S, ...``, epoch ``e`` shuffled by ``RandomState(seed + e).permutation``).
    One list per iteration, the first from ``start_offset``."""
    keys = list(range(n))
    try:
        from yogadl._keys_operator import GeneratorFromKeys, shard_keys
    except ImportError:  # pragma: no cover - the dev install has yogadl
        shard = keys[rank::shards]
        first_epoch, position = divmod(start_offset, len(shard)) if shard else (0, 0)
        out = []
        for e in range(first_epoch, first_epoch + epochs):
            order = [shard[j] for j in np.random.RandomState(seed + e).permutation(len(shard))] if shuffle else shard
            out.append(order[position:] if e == first_epoch else order)
        return out
    shard = shard_keys(keys, rank, shards)
    if not shard:  # YogaDL divides by zero on an empty shard; docs/design.md: it yields nothing
        return [[] for _ in range(epochs)]
    generator = GeneratorFromKeys(shard, start_offset, lambda key: key, shuffle, shuffle, seed)
    return [list(generator.instantiate_generator()) for _ in range(epochs)]
