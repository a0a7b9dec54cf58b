"""The matrix's source data and its oracle: records that carry their index, the order YogaDL 0.1.4
promises for them, and the same records as tar shards and as a YogaDL cache.mdb.

Record ``i`` is ``{"i": int64 i, "x": float64[32] = i + arange(32) / 64, "empty": float32[0]}``
(a zero-size leaf in every element). Imported from tar shards it is the webdataset sample
``{"__key__": b"%06d" % i, "idx": b"<i>", "x": <the bytes of x>, "empty": b""}``. Module-level
functions only: spawned build workers and Ray tasks import this module to run them.
"""

from __future__ import annotations

import io
import math
import tarfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np

X_WIDTH = 32
SEED = 11


def x_of(i: int) -> np.ndarray:
    return np.float64(i) + np.arange(X_WIDTH, dtype=np.float64) / 64


def element(i: int) -> dict[str, Any]:
    return {"i": np.int64(i), "x": x_of(i), "empty": np.zeros((0,), np.float32)}


def elements(n: int, first: int = 0) -> list[dict[str, Any]]:
    """Records ``first .. first + n - 1`` (a mixture's component ``k`` starts at ``k * MIX_FIRST``)."""
    return [element(i) for i in range(first, first + n)]


def records(start: int, stop: int) -> Iterator[dict[str, Any]]:
    """A build shard of unknown length (its parts key records from 0: format 2)."""
    for i in range(start, stop):
        yield element(i)


def shard_bounds(n: int, shards: int, first: int = 0) -> list[tuple[int, int]]:
    """``shards`` contiguous index ranges covering ``range(first, first + n)`` (the build shards
    of a sharded build)."""
    edges = [first + n * s // shards for s in range(shards + 1)]
    return [(edges[s], edges[s + 1]) for s in range(shards) if edges[s] < edges[s + 1]]


# -- tar shards (webdataset samples) ---------------------------------------------------------------
def write_tar_shards(directory: Path, n: int, shards: int, first: int = 0) -> list[Path]:
    """Writes records ``first..first+n-1`` as ``shards`` tar files of webdataset samples; returns
    them in order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for s, (start, stop) in enumerate(shard_bounds(n, shards, first)):
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
def write_yogadl_cache(path: Path, n: int, first: int = 0) -> Path:
    """A cache.mdb of records ``first..first+n-1`` exactly as YogaDL 0.1.4's ``submit`` writes it."""
    import tensorflow as tf
    import yogadl.tensorflow

    data = elements(n, first)
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


# -- the mixture oracle ------------------------------------------------------------------------------
MIX_WEIGHTS = (5, 3, 2)
MIX_FIRST = 100_000  # component k's record j is source record k * MIX_FIRST + j


def mix_sizes(n: int) -> tuple[int, ...]:
    """Records of a mixture's three components, the first as big as the size's single cache."""
    return (n, n // 3 + 4, n // 5 + 3)


def mix_counts(sizes: Sequence[int], weights: Sequence[int] = MIX_WEIGHTS) -> list[int]:
    """Each component's records per epoch, exactly: ``weight / sum · sum(sizes)`` rounded by
    largest remainders (ties to the earlier component), in exact fractions."""
    total, whole = sum(sizes), sum(weights)
    quotas = [Fraction(w * total, whole) for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def component_of(i: int) -> int:
    return i // MIX_FIRST


def unshuffled_mixture(sizes: Sequence[int], counts: Sequence[int], epochs: int) -> list[list[int]]:
    """The mixed order without shuffling, from the contract alone (yogacache.read.mixture_order's
    docstring): draw ``k`` of component ``i`` has the key ``(k + 1/2) / c_i`` (ties to the earlier
    component), and epoch ``e``'s draw ``k`` is record ``(e · c_i + k) mod n_i`` (passes in the
    component's own order, sequential here)."""
    out = []
    for e in range(epochs):
        keyed = sorted(((k + 0.5) / c, i, k) for i, c in enumerate(counts) for k in range(c))
        out.append([i * MIX_FIRST + (e * counts[i] + k) % sizes[i] for _, i, k in keyed])
    return out


def mixture_order(manifests: Sequence[Any], counts: Sequence[int], stream_args: dict[str, Any],
                  budget: Optional[int], epochs: int,
                  resumed: Optional[tuple[Optional[int], int]] = None) -> list[list[int]]:
    """Each epoch's mixed order (all ranks together: rank ``r`` of ``S`` reads positions
    ``c + r, c + r + S, ...`` after ``c`` consumed), in source indices: ``MixedOrder`` over each
    component's own order (its shuffle mode over its parts, fitted to its share of the node
    budget as a streamed mixture fits it), from the manifests alone -- no reader, pipeline or
    consumer. ``resumed=(budget_a, c)``: epoch 0's first ``c`` positions were read under
    ``budget_a`` and the rest resumed from the state there under ``budget`` (the windows the
    state names honoured; ``check_mixture_contract`` then checks the passes stay whole). The
    interleaving is computed in one block, each epoch's keys sorted at once, where readers
    compute it in blocks of ``BLOCK_SIZE`` draws."""
    from yogacache.read.layout import PartLayout
    from yogacache.read.mixture_order import MixtureSchedule
    from yogacache.read.options import ReadOptions

    def schedule_of(budget: Optional[int], state: Optional[dict[str, Any]] = None) -> Any:
        args = {**stream_args, "shard_rank": 0, "num_shards": 1, "start_offset": 0, "resume_state": state}
        return MixtureSchedule(
            [f"{m.dataset_id}:{m.dataset_version}" for m in manifests],
            [m.num_records for m in manifests],
            counts,
            [PartLayout.from_manifest(m) for m in manifests],
            ReadOptions.from_stream_args(**args),
            budget_bytes=budget,
            block_size=max(1, sum(counts)),  # one block: the epoch's keys sorted at once
        )

    schedule = schedule_of(budget)
    first: Optional[np.ndarray] = None
    if resumed is not None:
        before = schedule_of(resumed[0])
        schedule = schedule_of(budget, before.state((0, 0), resumed[1]))
        first = np.concatenate([before.mixed.records(0, np.arange(resumed[1])),
                                schedule.mixed.records(0, np.arange(resumed[1], sum(counts)))])
    offsets = np.cumsum([0] + [m.num_records for m in manifests])
    out = []
    for e in range(epochs):
        mixed = first if e == 0 and first is not None else schedule.mixed.records(e, np.arange(sum(counts)))
        component = np.searchsorted(offsets, mixed, side="right") - 1
        out.append([int(k * MIX_FIRST + m - offsets[k]) for k, m in zip(component.tolist(), mixed.tolist())])
    return out


def check_mixture_contract(order: Sequence[Sequence[int]], sizes: Sequence[int], counts: Sequence[int],
                           shuffled: bool) -> None:
    """What every mixed order keeps, checked in plain python: each epoch holds each component's
    count; a component's records, epoch after epoch, are whole passes over it (each record once
    within a pass); a shuffled order reshuffles between epochs; every window of 64 records holds
    each component's share give or take two (stratified: no runs of one component)."""
    draws: list[list[int]] = [[] for _ in sizes]
    for e, records in enumerate(order):
        per = [0] * len(sizes)
        for i in records:
            per[component_of(i)] += 1
            draws[component_of(i)].append(i - component_of(i) * MIX_FIRST)
        assert per == list(counts), f"epoch {e}: {per} records of each component, not {list(counts)}"
        total = sum(counts)
        for start in range(0, total - 64 + 1, 16):
            window = [component_of(i) for i in records[start : start + 64]]
            for k, c in enumerate(counts):
                share = c * 64 / total
                assert abs(window.count(k) - share) <= 2, (
                    f"epoch {e}: records {start}..{start + 63} hold {window.count(k)} of component {k}, "
                    f"its share is {share:.1f}"
                )
    for k, (n, got) in enumerate(zip(sizes, draws)):
        for start in range(0, len(got), n):
            one_pass = got[start : start + n]
            assert len(set(one_pass)) == len(one_pass) and set(one_pass) <= set(range(n)), (
                f"component {k}: pass {start // n} reads a record twice or one it does not hold"
            )
    if shuffled and len(order) > 1:
        assert order[0] != order[1], "a shuffled mixture repeats epoch 0's order"
