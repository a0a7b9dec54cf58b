"""The composition matrix (issue 22): all-pairs cells over store x how the cache was made x delivery
x order x consumer x start x size x mix, each read by several ranks in lockstep on one node and
compared with an oracle computed from the source. ``mix=mixture`` cells (issue 25) read three
caches made, stored and delivered alike as one ``yogacache.Mixture`` (``mixture_cell``: the
mixed order computed from the manifests, checked against the mixture's contract in plain python).

Per cell:

- **records**: every record read is exactly source record ``i`` (``records.index_of`` checks
  each leaf, the zero-size one included);
- **order**: ``none`` and ``shard`` read exactly YogaDL 0.1.4's order (``records.yogadl_order``),
  from the resume point on; ``global`` and ``parts`` read every record exactly once per epoch
  across the ranks, ``ceil((N - r) / S)`` on rank ``r``, and reshuffle between epochs;
- **start**: ``zero`` reads two epochs with two ranks; ``mid`` reads part of epoch 0 with two
  ranks on one node, then the rest and a whole epoch on a fresh node from ``start_offset``
  (``none``/``shard``) or the resume state (``global``/``parts``); ``elastic`` does the same
  but resumes with three ranks (every remaining record exactly once, then whole epochs);
  ``legacy`` is ``mid`` with the state's ``parts_order`` dropped, as the release before the
  ``"parts"`` order's lead wrote it (the rest of the epoch in that order, exactly once);
  ``changed`` is ``mid`` with the first records read on a node of another budget (four parts,
  streamed, where the store streams: a narrower ``"parts"`` window, which the resume honours:
  the rest of the epoch exactly once) and the state resumed with a shuffle flag changed
  refused, naming it (issue 33: a resume is exact or refused);
- **delivery** (on the measured node): a whole sync downloads the cache once; streaming
  without a budget fetches each part exactly once; streaming under half the cache stays under
  the budget, fetches every part, and -- for orders made to stream (``none``, ``parts``) read
  through a consumer that announces its order -- fetches at most ``(D - B)`` more than one
  epoch over two epochs, plus one part per rank at each end of an epoch (docs/streaming.md,
  docs/shuffle.md); a local or shared_fs cache is read in place.

A failing cell's id is its coordinates. Combinations that cannot exist are listed with their
reasons in ``cells.EXCLUDED``.

The cells of the object stores S3 and Azure run in ``test_matrix_clouds.py`` (``run_cell`` is
shared), so that pytest-xdist's ``--dist loadfile`` (``make test``) runs the two halves of the
matrix on two workers, each module with its own ``world``.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.matrix import records as src
from tests.matrix.cells import (
    AXES,
    CELLS,
    EXCLUDED,
    EXTRA_CELLS,
    REMOTE,
    Cell,
    exclusion_reason,
    uncovered_pairs,
    valid,
)
from tests.matrix.conftest import (
    PART_NAME,
    Built,
    World,
    build,
    build_mixture,
    cache_part_downloads,
    ensure_ray,
    node_store,
    part_downloads,
)
from tests.streaming_helpers import bytes_on_disk

BATCH = 8
TORCH_WORKERS = 2  # rank 0's DataLoader workers in torch cells
GRAIN_WORKERS = 2  # rank 0's grain.DataLoader worker processes in grain cells
PREFETCH = 2  # torch's default prefetch_factor: batches each worker reads ahead
EPOCHS = 2


@dataclass(frozen=True)
class Order:
    shuffle: bool
    mode: str
    window: Optional[int] = None


ORDERS = {
    "none": Order(False, "shard"),
    "shard": Order(True, "shard"),
    "global": Order(True, "global"),
    "parts-w1": Order(True, "parts", 1),
    "parts-w2": Order(True, "parts", 2),
    "parts": Order(True, "parts"),  # the default window
}


def stream_kwargs(order: Order, rank: int, shards: int, start_offset: int = 0,
                  resume: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """``DataRef.stream`` keyword arguments of one rank."""
    kwargs: dict[str, Any] = dict(
        start_offset=start_offset,
        shuffle=order.shuffle,
        shuffle_seed=src.SEED if order.shuffle else None,
        shard_rank=rank,
        num_shards=shards,
        shuffle_mode=order.mode,
        resume_state=resume,
    )
    if order.window is not None:
        kwargs["parts_window"] = order.window
    return kwargs


# -- consumers: per rank, per epoch, an iterator of batches of records -------------------------------
# A consumer reads a source: a CacheReader (the single cells) or a yogacache.Mixture (mix=mixture).
def _ref(source: Any) -> Any:
    """The DataRef of a source: a mixture is one; a reader is wrapped in a CacheDataRef."""
    from yogacache.dataref import CacheDataRef
    from yogacache.mixture import Mixture

    return source if isinstance(source, Mixture) else CacheDataRef(source)


def _epoch_records(source: Any) -> int:
    """Records per epoch, all ranks together: a mixture's epoch size, or the cache's records."""
    from yogacache.mixture import Mixture

    return source.epoch_size if isinstance(source, Mixture) else len(source)


def _chunks(items: Iterator[Any]) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


class StreamConsumer:
    """``DataRef.stream``: each iteration is the next epoch."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        self.stream = _ref(reader).stream(**kwargs)
        rank, shards = kwargs["shard_rank"], kwargs["num_shards"]
        shard = math.ceil((_epoch_records(reader) - rank) / shards)
        assert len(self.stream) == shard, f"rank {rank} of {shards}: len(stream) {len(self.stream)}, not {shard}"

    def epoch(self) -> Iterator[list[Any]]:
        return _chunks(iter(self.stream))


class DatasetConsumer:
    """``CacheDataset`` random access, at the indices of the rank's plan (batches through
    ``__getitems__``, and single records through ``[]``); a mixture's plan is its reader's
    ``read_schedule`` (the mixed order, fitted to the node budget as a stream fits it)."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        from yogacache.mixture import Mixture
        from yogacache.read.options import ReadOptions
        from yogacache.read.parts_shuffle import PartLayout
        from yogacache.read.schedule import ReadSchedule
        from yogacache.torch import CacheDataset

        options = ReadOptions.from_stream_args(
            kwargs["start_offset"], kwargs["shuffle"], False, kwargs["shuffle_seed"], kwargs["shard_rank"],
            kwargs["num_shards"], shuffle_mode=kwargs["shuffle_mode"], resume_state=kwargs["resume_state"],
            **({"parts_window": kwargs["parts_window"]} if "parts_window" in kwargs else {}),
        )
        self.dataset = CacheDataset(reader, output="numpy")
        if isinstance(reader, Mixture):
            self.schedule: Any = reader.reader.read_schedule(options)
        else:
            self.schedule = ReadSchedule(len(reader), options, PartLayout.from_manifest(reader.manifest))
        self.point = self.schedule.start

    def epoch(self) -> Iterator[list[Any]]:
        epoch, position = self.point
        self.point = (epoch + 1, 0)
        plan = self.schedule.plan(epoch, position)
        indices = [int(i) for i in plan.indices(0, len(plan))]
        for start in range(0, len(indices), BATCH):
            chunk = indices[start : start + BATCH]
            if start // BATCH % 2:
                yield [self.dataset[i] for i in chunk]
            else:
                yield self.dataset.__getitems__(chunk)


class TFConsumer:
    """``yogacache.tensorflow.make_tf_dataset(stream)``: each iteration is the next epoch."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        from yogacache.tensorflow import make_tf_dataset

        self.dataset = make_tf_dataset(_ref(reader).stream(**kwargs))

    def epoch(self) -> Iterator[list[Any]]:
        return _chunks(iter(self.dataset.as_numpy_iterator()))


class TorchConsumer:
    """``CacheIterableDataset`` through ``CacheDataLoader``: rank 0 with 2 spawned workers, the
    other ranks in-process (each spawned worker imports torch afresh, seconds on the shared
    2-core machine; rank 0's two workers per epoch are what the matrix needs)."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        from yogacache.torch import CacheIterableDataset

        self.dataset = CacheIterableDataset(reader, output="numpy", **kwargs)
        self.workers = TORCH_WORKERS if kwargs["shard_rank"] == 0 else 0
        self.first = True

    def epoch(self) -> Iterator[list[Any]]:
        from yogacache.torch import CacheDataLoader

        if not self.first:
            self.dataset.next_epoch()
        self.first = False
        spawn: dict[str, Any] = {"multiprocessing_context": "spawn"} if self.workers else {}
        loader = CacheDataLoader(self.dataset, batch_size=BATCH, num_workers=self.workers, **spawn)
        promised, handed = len(self.dataset), 0  # len(): what this iteration yields, from the resume point
        for batch in loader:
            size = len(batch["__key__"]) if "__key__" in batch else len(batch["i"])
            handed += size
            yield [{name: value[j] for name, value in batch.items()} for j in range(size)]
        epoch = self.dataset.epoch
        assert handed == promised, f"epoch {epoch}: len() said {promised} records, the loader gave {handed}"


class GrainConsumer:
    """``yogacache.grain``: a ``CacheSampler`` (the rank's order, over all the epochs) and a
    ``CacheDataSource`` through ``grain.DataLoader``, rank 0 with 2 worker processes (the reader
    sent to each), the other ranks in-process; one loader for every epoch, cut at the sampler's
    epoch lengths."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        import grain
        from absl import flags

        from yogacache.grain import CacheDataSource, CacheSampler

        if not flags.FLAGS.is_parsed():  # Grain's worker processes read its flags (absl)
            flags.FLAGS.mark_as_parsed()
        self.source = CacheDataSource(reader)
        self.sampler = CacheSampler(self.source, num_epochs=EPOCHS, **kwargs)
        assert len(self.sampler) == self.sampler.first_epoch_length + (EPOCHS - 1) * self.sampler.epoch_length
        workers = GRAIN_WORKERS if kwargs["shard_rank"] == 0 else 0
        loader = grain.DataLoader(data_source=self.source, sampler=self.sampler, worker_count=workers)
        self.records = iter(loader)
        self.lengths = iter([self.sampler.first_epoch_length] + [self.sampler.epoch_length] * (EPOCHS - 1))

    def epoch(self) -> Iterator[list[Any]]:
        count = next(self.lengths)
        return _chunks(next(self.records) for _ in range(count))


class RayConsumer:
    """``yogacache.ray.read_cache``: the rank's records of each epoch as a Ray Data Dataset on the
    local cluster (read tasks in Ray's worker processes), iterated in order; ``count()`` from the
    plan, checked against what the Dataset yields."""

    def __init__(self, reader: Any, kwargs: dict[str, Any]) -> None:
        self.reader = reader
        self.kwargs = kwargs
        self.epochs = 0

    def epoch(self) -> Iterator[list[Any]]:
        from yogacache.ray import read_cache

        first = self.epochs == 0
        self.epochs += 1
        kwargs = dict(self.kwargs) if first else {**self.kwargs, "start_offset": 0, "resume_state": None}
        epoch = None if first else self._start_epoch() + self.epochs - 1
        dataset = read_cache(self.reader, **kwargs, epoch=epoch)
        promised = dataset.count()
        handed = 0
        for batch in dataset.iter_batches(batch_size=BATCH, batch_format="numpy"):
            size = len(next(iter(batch.values())))
            handed += size
            yield [{name: value[j] for name, value in batch.items()} for j in range(size)]
        assert handed == promised, f"count() said {promised} records, the dataset gave {handed}"

    def _start_epoch(self) -> int:
        from yogacache.read.epochs import EpochReader
        from yogacache.read.options import ReadOptions

        return EpochReader(_ref(self.reader).reader, ReadOptions.from_stream_args(**self.kwargs)).start[0]


CONSUMERS = {
    "stream": StreamConsumer,
    "dataset": DatasetConsumer,
    "tf": TFConsumer,
    "torch": TorchConsumer,
    "grain": GrainConsumer,
    "ray": RayConsumer,
}


def read_lockstep(consumers: Sequence[Any], epochs: int) -> list[list[list[int]]]:
    """Reads ``epochs`` epochs on every rank, batch by batch in turn (ranks of one node in
    lockstep); returns ``[epoch][rank] -> source indices``, every record checked."""
    out = []
    for _ in range(epochs):
        iterators = [consumer.epoch() for consumer in consumers]
        got: list[list[int]] = [[] for _ in consumers]
        live = list(range(len(consumers)))
        while live:
            for rank in list(live):
                batch = next(iterators[rank], None)
                if batch is None:
                    live.remove(rank)
                else:
                    got[rank].extend(src.index_of(record) for record in batch)
        out.append(got)
    return out


def read_partially(
    readers: Sequence[Any], order: Order, shards: int, records: int, *, legacy: bool = False
) -> tuple[list[list[int]], Any]:
    """Each rank reads ``records`` records of epoch 0 through ``DataRef.stream``; returns what
    each read and rank 0's resume state after them (every rank's must be the same where the
    state is valid at any world size). ``legacy``: epoch 0 is read in the "parts" order before
    the lead, as the release before it read it (a start state without ``parts_order``)."""
    read, states = [], []
    for rank, reader in enumerate(readers):
        resume = None
        if legacy:
            resume = _ref(reader).stream(**stream_kwargs(order, rank, shards)).state_dict(0)
            del resume["parts_order"]
        stream = _ref(reader).stream(**stream_kwargs(order, rank, shards, 0, resume))
        got = []
        for element in stream:
            got.append(src.index_of(element))
            if len(got) == records:
                break
        read.append(got)
        states.append(stream.state_dict(records))
    if order.mode != "shard" or states[0].get("mode") == "mixture":
        assert all(state == states[0] for state in states), f"ranks at the same count differ: {states}"
    return read, states[0]


def changed_node(built: Any, delivery: str, budget: Optional[int]) -> tuple[str, Optional[int]]:
    """(delivery, budget) of the node a ``changed`` cell reads its first records on: streamed
    under ``budget``, another than the cell's, where the store streams (a mirror does not: the
    cell's own delivery)."""
    if built.store not in REMOTE or built.made == "mirror":
        return delivery, None
    return ("stream-half", budget) if budget is not None else ("stream-full", None)


def check_changed_refused(where: str, source: Any, order: Order, shards: int, state: dict[str, Any]) -> None:
    """A state resumed with a shuffle flag changed is refused, naming the setting and both values
    (``skip_shuffle_at_epoch_end`` for a shuffled order, ``shuffle`` for an unshuffled one)."""
    from yogacache.errors import ResumeStateError

    kwargs = stream_kwargs(order, 0, shards, 0, state)
    if order.shuffle:
        kwargs["skip_shuffle_at_epoch_end"] = True
        said = r"saved with reshuffle_each_epoch=True .*, this (reader|mixture) has reshuffle_each_epoch=False"
    else:
        kwargs.update(shuffle=True, shuffle_seed=src.SEED)
        said = r"saved with shuffle=False, this (reader|mixture) has shuffle=True"
    with pytest.raises(ResumeStateError, match=said):
        _ref(source).stream(**kwargs)
    print(f"{where}: refused as it should be")


class PeakSampler:
    """The most bytes the node's streamed parts (temporary files included) held while it read,
    in one directory or several (a mixture's components) together."""

    def __init__(self, directory: Any) -> None:
        self.directories = list(directory) if isinstance(directory, (list, tuple)) else [directory]
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(bytes_on_disk(directory) for directory in self.directories))
            self._stop.wait(0.005)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the cells --------------------------------------------------------------------------------------
def _param(cell: Cell) -> Any:
    marks = [pytest.mark.slow] if cell.slow else []
    return pytest.param(cell, id=cell.id, marks=marks)


#: The stores whose cells run in ``test_matrix_clouds.py``.
CLOUD_HALF = ("s3", "azure")


def cell_params(*, clouds: bool) -> list[Any]:
    """The cells of one half of the matrix: those on ``CLOUD_HALF``'s stores, or the others."""
    return [_param(cell) for cell in CELLS + list(EXTRA_CELLS) if (cell.store in CLOUD_HALF) == clouds]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("cell", cell_params(clouds=False))
def test_cell(cell: Cell, world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    run_cell(cell, world, request, tmp_path)


def run_cell(cell: Cell, world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if cell.consumer == "ray":
        world.cloud("gcs", request)  # its proxy first: Ray's workers take STORAGE_EMULATOR_HOST at ray.init
        ensure_ray(world)
    if cell.mix == "mixture":
        return mixture_cell(cell, world, request, tmp_path)
    built = build(world, request, cell.store, cell.made, cell.size)
    order = ORDERS[cell.order]
    n = built.num_records
    shards, resumed_shards = 2, 3 if cell.start == "elastic" else 2
    consumer = CONSUMERS[cell.consumer]

    # Phase 1 (mid, elastic): two ranks read part of epoch 0 on node "a".
    before: list[list[int]] = [[] for _ in range(shards)]
    start_offset, resume = 0, None
    if cell.start != "zero":
        delivery_a, limit_a = cell.delivery, None
        if cell.start == "changed":
            # Four of its largest parts: a "parts" window of 1 (2w + 1 parts kept), narrower
            # than any the cell's budget (half the cache) or none fits.
            largest = max(part.size_bytes for part in built.manifest.parts)
            delivery_a, limit_a = changed_node(built, cell.delivery, 4 * largest)
        store_a = node_store(world, built, tmp_path / "node-a", delivery_a, limit_a)
        readers = [store_a.open(built.dataset_id, "v1") for _ in range(shards)]
        records = max(1, (n // shards) // 3)
        before, resume = read_partially(readers, order, shards, records, legacy=cell.start == "legacy")
        if cell.start == "legacy":  # as the release before the lead wrote it
            assert resume is not None and resume.pop("parts_order") == 1
        if cell.start == "changed":
            check_changed_refused(f"[{cell.id}]", readers[0], order, shards, resume)
        if order.mode == "shard":
            start_offset, resume = records, None
        for reader in readers:
            reader.close()

    # Phase 2 (or the whole cell): the rest of epoch 0 and one more epoch. Whole syncs and
    # unbudgeted streams: every rank on one node ("node-b"), in lockstep. Under a budget: one node
    # per rank, each with its own budget, read one after the other and measured apart (nodes are
    # independent; the read sizes of a cache this small span every part, so ranks sharing one
    # small budget would not be in lockstep part by part as ranks of a real cache are).
    proxy = world.proxies.get(cell.store) if cell.store in REMOTE else None
    kwargs = [stream_kwargs(order, rank, resumed_shards, start_offset, resume) for rank in range(resumed_shards)]
    groups = [list(range(resumed_shards))] if cell.delivery != "stream-half" else [[r] for r in range(resumed_shards)]
    epochs: list[list[list[int]]] = [[[] for _ in range(resumed_shards)] for _ in range(EPOCHS)]
    nodes = []
    for group in groups:
        node = tmp_path / f"node-b{group[0]}"
        since = len(proxy.log) if proxy is not None else 0
        store = node_store(world, built, node, cell.delivery)
        readers = [store.open(built.dataset_id, "v1") for _ in group]
        consumers = [consumer(reader, kwargs[rank]) for rank, reader in zip(group, readers)]
        with PeakSampler(node / "yogadl_local_cache" / ".parts" / built.dataset_id / "v1") as sampler:
            read = read_lockstep(consumers, EPOCHS)
        for reader in readers:
            reader.close()
        for e in range(EPOCHS):
            for rank, got in zip(group, read[e]):
                epochs[e][rank] = got
        fetched = part_downloads(proxy, since, cell.store) if proxy is not None else []
        nodes.append(Node(group, readers, fetched, sampler.peak))

    check_order(cell, order, n, shards, resumed_shards, before, epochs, start_offset)
    check_delivery(cell, order, built, nodes, proxy, resumed_shards)
    if cell.delivery == "stream-half" and cell.consumer != "dataset" and (order.mode == "parts" or not order.shuffle):
        check_one_reader_under_half(cell, order, world, built, tmp_path / "node-solo", consumer)
    if cell.made == "mirror":
        check_mirror_filled(world, built)


@dataclass
class Node:
    """What one node of a cell did: its ranks, their readers, the part downloads it made
    (file name, bytes) and the most bytes of streamed parts it held."""

    ranks: list[int]
    readers: list[Any]
    fetched: list[tuple[str, int]]
    peak: int


def check_order(cell: Cell, order: Order, n: int, shards: int, resumed_shards: int, before: list[list[int]],
                epochs: list[list[list[int]]], start_offset: int) -> None:
    where = f"[{cell.id}]"
    if order.mode == "shard":  # none and shard: YogaDL's exact order, from the resume point on
        for rank in range(resumed_shards):
            expected = src.yogadl_order(n, rank, shards, shuffle=order.shuffle, seed=src.SEED,
                                        start_offset=start_offset, epochs=EPOCHS)
            if start_offset:
                first = src.yogadl_order(n, rank, shards, shuffle=order.shuffle, seed=src.SEED,
                                         start_offset=0, epochs=1)[0]
                assert before[rank] == first[:start_offset], f"{where} rank {rank}: the first records read"
            for e in range(EPOCHS):
                assert epochs[e][rank] == expected[e], (
                    f"{where} rank {rank} epoch {e}: expected {expected[e][:12]}..., got {epochs[e][rank][:12]}..."
                )
        return
    # global and parts: every record exactly once per epoch across the ranks
    first = sorted([i for got in before for i in got] + [i for got in epochs[0] for i in got])
    assert first == list(range(n)), f"{where} epoch 0 (before and after the resume): {_diff(first, n)}"
    for e in range(1, EPOCHS):
        whole = sorted(i for got in epochs[e] for i in got)
        assert whole == list(range(n)), f"{where} epoch {e}: {_diff(whole, n)}"
        lengths = [len(got) for got in epochs[e]]
        assert lengths == [math.ceil((n - r) / resumed_shards) for r in range(resumed_shards)], (
            f"{where} epoch {e}: records per rank {lengths}"
        )
    if cell.start == "zero" and n > 8:
        assert epochs[0] != epochs[1], f"{where}: epoch 1 repeats epoch 0's order"


def _diff(got: list[int], n: int) -> str:
    counts = np.bincount(np.asarray(got, dtype=np.int64), minlength=n) if got else np.zeros(n, np.int64)
    missing = [int(i) for i in np.flatnonzero(counts == 0)][:10]
    doubled = [int(i) for i in np.flatnonzero(counts > 1)][:10]
    return f"{len(got)} records of {n}; missing {missing}, read twice {doubled}"


def check_delivery(cell: Cell, order: Order, built: Built, nodes: Sequence[Node], proxy: Any, ranks: int) -> None:
    where = f"[{cell.id}]"
    manifest = built.manifest
    total = manifest.total_size_bytes
    readers = [reader for node in nodes for reader in node.readers]
    if proxy is None:  # local, shared_fs: read in place, never copied
        root = built.location["root"].resolve()
        for reader in readers:
            assert Path(reader.directory).resolve().is_relative_to(root), f"{where} read from {reader.directory}"
        return
    streamed = [".parts" in str(reader.directory) for reader in readers]
    all_parts = sorted(_part_name(part.name) for part in manifest.parts)
    if cell.delivery == "sync":
        (node,) = nodes
        fetched_bytes = sum(size for _, size in node.fetched)
        assert not any(streamed), f"{where}: a whole sync streamed"
        assert fetched_bytes == total, f"{where}: a whole sync fetched {fetched_bytes} bytes of a {total}-byte cache"
        return
    assert all(streamed), f"{where}: the cache was not streamed"
    if cell.delivery == "stream-full":
        (node,) = nodes
        names = [name for name, _ in node.fetched]
        twice = sorted({name for name in names if names.count(name) > 1})
        assert not twice, f"{where}: parts fetched more than once by one node without a budget: {twice}"
        assert sorted(names) == all_parts, f"{where}: fetched {sorted(names)}, the cache has {all_parts}"
        assert sum(size for _, size in node.fetched) == total, f"{where}: fetched other bytes than the cache's {total}"
        return
    limit = total // 2
    largest = max(part.size_bytes for part in manifest.parts)
    fetched_names = sorted({name for node in nodes for name, _ in node.fetched})
    assert fetched_names == all_parts, f"{where}: the nodes fetched {fetched_names}, the cache has {all_parts}"
    for node in nodes:
        held = f"{where} rank {node.ranks}: its node held {node.peak} bytes of parts"
        assert 0 < node.peak <= limit, f"{held}, budget {limit}"
    if cell.consumer == "dataset":
        return  # random access announces no read order: nothing is promised about refetches
    # What may be fetched ahead into the epoch after the last one read: a quarter of the budget.
    ahead = limit // 4
    if cell.consumer == "ray" and (order.mode == "parts" or not order.shuffle):
        # Each epoch is a Dataset of its own, whose read tasks each stream their range of parts
        # and release them when done: no epoch keeps what the next starts with (docs/ray.md), so
        # each epoch fetches at most the node's share of the cache, and a part at each task's end.
        share = total if not order.shuffle or cell.start == "elastic" else total // ranks + 3 * largest
        bound = EPOCHS * (share + 2 * largest) + ahead
        what = "its share of the cache per epoch (one Dataset each), and a part at each end of its run"
    elif not order.shuffle:
        # A sequential epoch: the whole cache, then (cache - budget) and a part (docs/streaming.md).
        bound = total + (total - limit) + 2 * largest + ahead
        what = "one epoch, then (cache - budget) and a part, and a quarter of the budget ahead"
    elif order.mode == "parts":
        # Per epoch, a node's share of the parts plus the one it shares with each neighbour
        # (docs/shuffle.md); after an elastic resume, the rest of that epoch's parts on every node.
        share = total // ranks + 3 * largest
        bound = (total if cell.start == "elastic" else share) + share + ahead
        what = "its share of the parts and one at each end of its run per epoch, and a quarter of the budget ahead"
    else:
        return  # "shard" and "global" re-fetch at random under a budget (docs/shuffle.md): the budget holds
    for node in nodes:
        fetched_bytes = sum(size for _, size in node.fetched)
        print(f"{where} rank {node.ranks}: fetched {fetched_bytes} of {total} bytes ({len(node.fetched)} downloads, "
              f"{len(all_parts)} parts), peak {node.peak}, budget {limit}, bound {bound}")
        assert fetched_bytes <= bound, (
            f"{where} rank {node.ranks}: its node fetched {fetched_bytes} bytes over {EPOCHS} epochs "
            f"({fetched_bytes / total:.2f} x the cache, {len(node.fetched)} downloads of {len(all_parts)} parts, "
            f"budget {limit}); promised at most {what}: {bound}"
        )


def spread_parts(consumer: Any, built: Built) -> int:
    """S, the parts a node's readers read at once (docs/streaming.md, "What a reader fetches per
    epoch"): DataLoader workers are readers of their own, each ``PREFETCH`` batches ahead, and
    worker ``w`` reads every ``W``-th batch, so a node with ``W`` workers reads ``W x PREFETCH``
    batches at once; each of grain.DataLoader's workers reads its records on
    ``ReadOptions().num_threads`` threads at once. The parts those records span may be fetched
    again once per epoch. None for one reader."""
    if consumer is TorchConsumer:
        records = TORCH_WORKERS * PREFETCH * BATCH
    elif consumer is GrainConsumer:
        import grain

        records = GRAIN_WORKERS * grain.ReadOptions().num_threads
    else:
        return 0
    smallest = min(part.num_records for part in built.manifest.parts)
    return -(-records // max(1, smallest)) + 1


def check_one_reader_under_half(
    cell: Cell, order: Order, world: World, built: Built, node: Path, consumer: Any
) -> None:
    """One rank alone on a node whose budget is half the cache, two epochs from the start: every
    record once per epoch (in YogaDL's order for ``none``), and at most the whole cache in
    the first epoch and (cache - budget) in the second, plus a part at each epoch's end and what
    is fetched ahead into the next epoch (a quarter of the budget): docs/streaming.md's promise
    for a sequential epoch, and docs/shuffle.md's for ``parts``."""
    where = f"[{cell.id}] one reader under half the cache"
    proxy = world.proxies[cell.store]
    since = len(proxy.log)
    reader = node_store(world, built, node, "stream-half").open(built.dataset_id, "v1")
    with PeakSampler(node / "yogadl_local_cache" / ".parts" / built.dataset_id / "v1") as sampler:
        epochs = read_lockstep([consumer(reader, stream_kwargs(order, 0, 1))], EPOCHS)
    reader.close()
    n, total = built.num_records, built.manifest.total_size_bytes
    for e, (got,) in enumerate(epochs):
        if order.shuffle:
            assert sorted(got) == list(range(n)), f"{where} epoch {e}: {_diff(sorted(got), n)}"
        else:
            assert got == list(range(n)), f"{where} epoch {e}: not the dataset order"
    limit = total // 2
    largest = max(part.size_bytes for part in built.manifest.parts)
    fetched = part_downloads(proxy, since, cell.store)
    fetched_bytes = sum(size for _, size in fetched)
    bound = total + (total - limit) + 2 * largest + limit // 4 + EPOCHS * spread_parts(consumer, built) * largest
    if consumer is RayConsumer:  # an epoch per Dataset: nothing kept across epochs (check_delivery)
        bound = EPOCHS * (total + 2 * largest) + limit // 4
    print(f"{where}: fetched {fetched_bytes} of {total} bytes ({len(fetched)} downloads of "
          f"{len(built.manifest.parts)} parts), peak {sampler.peak}, budget {limit}, bound {bound}")
    assert 0 < sampler.peak <= limit, f"{where}: the node held {sampler.peak} bytes of parts, budget {limit}"
    assert fetched_bytes <= bound, (
        f"{where}: two epochs fetched {fetched_bytes} bytes ({fetched_bytes / total:.2f} x the cache, "
        f"{len(fetched)} downloads of {len(built.manifest.parts)} parts); promised at most the cache, then "
        f"(cache - budget) and a part, and a quarter of the budget ahead: {bound}"
    )


def _part_name(name: str) -> str:
    match = PART_NAME.search(name)
    assert match, name
    return match.group(0)


def check_mirror_filled(world: World, built: Built) -> None:
    """The mirror (the store under test) now holds the origin's build, which the node read."""
    from yogacache.format.manifest import Manifest

    found = world.objects(built.store, built.location["prefix"]).read(f"{built.dataset_id}/v1/manifest.json")
    assert found is not None, f"the mirror {built.store} was not filled"
    assert Manifest.from_bytes(found[0], "mirror").build_id == built.manifest.build_id


# -- mixture cells ------------------------------------------------------------------------------------
def open_mixture(store: Any, components: Sequence[Built]) -> Any:
    """The cell's mixture: its components opened through one node's store, at weights 5:3:2."""
    from yogacache.mixture import Component, Mixture

    return Mixture([
        Component(store.open(built.dataset_id, "v1"), weight=weight)
        for built, weight in zip(components, src.MIX_WEIGHTS)
    ])


def mixture_cell(cell: Cell, world: World, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A cell of ``mix=mixture``: three caches made, stored and delivered as the cell says, read as
    one mixture by every rank (each rank its own ``Mixture`` over its node's store), checked
    against the mixed order computed from the manifests (``records.mixture_order``), which is
    itself checked against the mixture's contract in plain python (``records.mix_counts``,
    ``check_mixture_contract``; without shuffling, ``unshuffled_mixture`` exactly). Ranks share
    the mixed order: rank ``r`` of ``S`` reads positions ``c + r, c + r + S, ...`` after ``c``
    consumed, so ``mid`` and ``elastic`` both resume from the state (at any world size)."""
    where = f"[{cell.id}]"
    components = build_mixture(world, request, cell.store, cell.made, cell.size)
    order = ORDERS[cell.order]
    sizes = [built.num_records for built in components]
    counts = src.mix_counts(sizes)
    total_bytes = sum(built.manifest.total_size_bytes for built in components)
    limit = total_bytes // 2 if cell.delivery == "stream-half" else None
    shards, resumed_shards = 2, 3 if cell.start == "elastic" else 2
    consumer = CONSUMERS[cell.consumer]

    oracle = src.mixture_order([built.manifest for built in components], counts, stream_kwargs(order, 0, 1),
                               limit, EPOCHS)
    src.check_mixture_contract(oracle, sizes, counts, shuffled=order.shuffle)
    if not order.shuffle:
        assert oracle == src.unshuffled_mixture(sizes, counts, EPOCHS), f"{where}: the unshuffled mixed order"

    # Phase 1 (mid, elastic, changed): two ranks read part of epoch 0 on node "a".
    before: list[list[int]] = [[] for _ in range(shards)]
    consumed, resume = 0, None
    if cell.start != "zero":
        delivery_a, limit_a = cell.delivery, limit
        if cell.start == "changed":  # another budget: half of the bytes, or none under half
            delivery_a, limit_a = changed_node(components[0], cell.delivery, None if limit else total_bytes // 2)
            if limit_a != limit:
                manifests = [built.manifest for built in components]
                records = max(1, (sum(counts) // shards) // 3)
                oracle = src.mixture_order(manifests, counts, stream_kwargs(order, 0, 1), limit, EPOCHS,
                                           resumed=(limit_a, shards * records))
                src.check_mixture_contract(oracle, sizes, counts, shuffled=order.shuffle)
        store_a = node_store(world, components[0], tmp_path / "node-a", delivery_a, limit_a)
        mixtures = [open_mixture(store_a, components) for _ in range(shards)]
        assert [list(m.counts) for m in mixtures] == [counts] * shards, f"{where}: counts {mixtures[0].counts}"
        records = max(1, (sum(counts) // shards) // 3)
        before, resume = read_partially(mixtures, order, shards, records)
        assert resume["mode"] == "mixture" and resume["consumed"] == shards * records, f"{where}: {resume}"
        if cell.start == "changed":
            check_changed_refused(where, mixtures[0], order, shards, resume)
        consumed = shards * records
        for mixture in mixtures:
            mixture.close()
        for rank in range(shards):
            assert before[rank] == oracle[0][rank:consumed:shards], f"{where} rank {rank}: the first records read"

    # Phase 2: the rest of epoch 0 and one more, every rank on one node, or (stream-half) each on
    # its own node under its own budget, as the single cells read.
    proxy = world.proxies.get(cell.store) if cell.store in REMOTE else None
    kwargs = [stream_kwargs(order, rank, resumed_shards, 0, resume) for rank in range(resumed_shards)]
    groups = [list(range(resumed_shards))] if cell.delivery != "stream-half" else [[r] for r in range(resumed_shards)]
    epochs: list[list[list[int]]] = [[[] for _ in range(resumed_shards)] for _ in range(EPOCHS)]
    nodes = []
    ids = [built.dataset_id for built in components]
    for group in groups:
        node = tmp_path / f"node-b{group[0]}"
        since = len(proxy.log) if proxy is not None else 0
        store = node_store(world, components[0], node, cell.delivery, limit)
        mixtures = [open_mixture(store, components) for _ in group]
        consumers = [consumer(mixture, kwargs[rank]) for rank, mixture in zip(group, mixtures)]
        parts = [node / "yogadl_local_cache" / ".parts" / dataset_id / "v1" for dataset_id in ids]
        with PeakSampler(parts) as sampler:
            read = read_lockstep(consumers, EPOCHS)
        for mixture in mixtures:
            mixture.close()
        for e in range(EPOCHS):
            for rank, got in zip(group, read[e]):
                epochs[e][rank] = got
        fetched = cache_part_downloads(proxy, since, cell.store, ids) if proxy is not None else []
        read_here = {i for e in range(EPOCHS) for got in read[e] for i in got}
        nodes.append(MixtureNode(group, [r for m in mixtures for r in m.reader.readers], fetched, sampler.peak,
                                 parts_of(components, read_here)))

    for rank in range(resumed_shards):
        for e in range(EPOCHS):
            expected = oracle[e][(consumed if e == 0 else 0) + rank :: resumed_shards]
            got = epochs[e][rank]
            assert got == expected, (
                f"{where} rank {rank} of {resumed_shards} epoch {e}: expected {expected[:12]}..., got {got[:12]}... "
                f"({len(got)} records, {len(expected)} expected)"
            )
    first = sorted([i for got in before for i in got] + [i for got in epochs[0] for i in got])
    assert first == sorted(oracle[0]), f"{where}: epoch 0 across the resume is not the epoch's records once each"
    check_mixture_delivery(cell, order, components, nodes, proxy, limit)


@dataclass
class MixtureNode:
    """What one node of a mixture cell did: its ranks, its components' readers, the part
    downloads it made (dataset id, part file name, bytes) and the most bytes of parts it held."""

    ranks: list[int]
    readers: list[Any]
    fetched: list[tuple[str, str, int]]
    peak: int
    parts: dict[tuple[str, str], int]  # the parts of the records it read: (dataset id, part file name) -> bytes


def parts_of(components: Sequence[Built], indices: Any) -> dict[tuple[str, str], int]:
    """The parts (dataset id, part file name) holding source records ``indices``, and their bytes:
    a downsampled component reads only some of its records in two epochs, so only some parts."""
    out = {}
    for k, built in enumerate(components):
        edges = np.cumsum([0] + [part.num_records for part in built.manifest.parts])
        local = np.array([i - k * src.MIX_FIRST for i in indices if src.component_of(i) == k], dtype=np.int64)
        for p in np.unique(np.searchsorted(edges, local, side="right") - 1).tolist():
            part = built.manifest.parts[p]
            out[(built.dataset_id, _part_name(part.name))] = part.size_bytes
    return out


def check_mixture_delivery(cell: Cell, order: Order, components: Sequence[Built], nodes: Sequence[MixtureNode],
                           proxy: Any, limit: Optional[int]) -> None:
    """As ``check_delivery``, over the components together: a sync downloads each cache once;
    streaming without a budget fetches each part of each component once; under half the bytes
    of all components, one budget for them all holds, every part is fetched, and -- for orders
    made to stream, read through a consumer that announces its order -- a node (one rank that
    reads the whole mixed order's share, so every part) fetches at most the bytes once, then
    (D - B) and a part per component (issue 25 item 4), a part more at the first epoch's end,
    and a quarter of the budget ahead."""
    where = f"[{cell.id}]"
    readers = [reader for node in nodes for reader in node.readers]
    total = sum(built.manifest.total_size_bytes for built in components)
    if proxy is None:
        root = components[0].location["root"].resolve()
        for reader in readers:
            assert Path(reader.directory).resolve().is_relative_to(root), f"{where} read from {reader.directory}"
        return
    streamed = [".parts" in str(reader.directory) for reader in readers]
    if cell.delivery == "sync":
        (node,) = nodes
        fetched_bytes = sum(size for _, _, size in node.fetched)
        assert not any(streamed), f"{where}: a whole sync streamed"
        assert fetched_bytes == total, f"{where}: a whole sync fetched {fetched_bytes} bytes of {total}-byte caches"
        return
    assert all(streamed), f"{where}: the caches were not streamed"
    if cell.delivery == "stream-full":
        (node,) = nodes
        names = [(dataset_id, name) for dataset_id, name, _ in node.fetched]
        twice = sorted({name for name in names if names.count(name) > 1})
        assert not twice, f"{where}: parts fetched more than once by one node without a budget: {twice}"
        # Every part of the records read, and perhaps some of the epoch after (fetched ahead).
        assert set(node.parts) <= set(names), (
            f"{where}: {len(node.parts)} parts hold the records read, {sorted(set(node.parts) - set(names))[:8]} "
            "of them were never fetched"
        )
        return
    assert limit is not None
    largest = max(part.size_bytes for built in components for part in built.manifest.parts)
    for node in nodes:
        names = {(dataset_id, name) for dataset_id, name, _ in node.fetched}
        held = f"{where} rank {node.ranks}: its node"
        assert set(node.parts) <= names, f"{held} never fetched parts it read: {set(node.parts) - names}"
        assert 0 < node.peak <= limit, f"{held} held {node.peak} bytes of parts, budget {limit}"
    if cell.consumer == "dataset" or (order.shuffle and order.mode != "parts"):
        return  # random access, and the "shard" and "global" orders, re-fetch at random: the budget holds
    spread = EPOCHS * spread_parts(CONSUMERS[cell.consumer], components[-1]) * largest
    for node in nodes:
        d = sum(node.parts.values())  # D: the bytes of the parts the node's records are in
        bound = d + max(0, d - limit) + (len(components) + 1) * largest + limit // 4 + spread
        fetched_bytes = sum(size for _, _, size in node.fetched)
        print(f"{where} rank {node.ranks}: fetched {fetched_bytes} of D = {d} bytes ({len(node.fetched)} downloads, "
              f"{len(node.parts)} parts), peak {node.peak}, budget {limit}, bound {bound}")
        assert fetched_bytes <= bound, (
            f"{where} rank {node.ranks}: its node fetched {fetched_bytes} bytes over {EPOCHS} epochs "
            f"({fetched_bytes / d:.2f} x D = {d}, {len(node.fetched)} downloads of {len(node.parts)} parts, "
            f"budget {limit}); promised at most D once, then (D - B) and a part per component, a part "
            f"and a quarter of the budget ahead: {bound}"
        )


# -- the matrix itself ------------------------------------------------------------------------------
def test_the_cells_cover_every_possible_pair() -> None:
    assert uncovered_pairs(CELLS) == set()
    mixtures = [cell for cell in CELLS if cell.mix == "mixture"]
    assert 0 < len(mixtures) <= 10 and not any(cell.start == "legacy" for cell in mixtures), mixtures
    assert all(valid(cell.values()) for cell in CELLS)
    assert len({cell.id for cell in CELLS}) == len(CELLS)
    for name, values in AXES.items():
        assert {getattr(cell, name) for cell in CELLS} == set(values), name


def test_the_extra_cells_are_valid_and_cross_block_boundaries() -> None:
    """The "blocks" cells can exist, are new, and their mixture's epoch spans three blocks of
    its interleaving, which their oracle computes in one."""
    from tests.matrix.conftest import SIZES
    from yogacache.read.mixture_order import BLOCK_SIZE

    assert all(valid(cell.values()) and cell.mix == "mixture" for cell in EXTRA_CELLS)
    assert not {cell.id for cell in EXTRA_CELLS} & {cell.id for cell in CELLS}
    epoch = sum(src.mix_sizes(SIZES["blocks"][0]))
    assert -(-epoch // BLOCK_SIZE) == 3, epoch


def test_every_dropped_combination_says_why() -> None:
    for a, x, b, y, reason in EXCLUDED:
        assert x in AXES[a] and y in AXES[b] and reason
        assert exclusion_reason({a: x, b: y}) == reason


# -- sizes, varied by hypothesis (local store, in place: the read path without a server) --------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(min_value=1, max_value=60),
    records_per_part=st.sampled_from([1, 2, 7, 1000]),
    shards=st.integers(min_value=1, max_value=4),
    sharded_build=st.booleans(),
    order_name=st.sampled_from(sorted(ORDERS)),
    offset_fraction=st.floats(min_value=0, max_value=1.5),
)
def test_sizes(tmp_path_factory: pytest.TempPathFactory, n: int, records_per_part: int, shards: int,
               sharded_build: bool, order_name: str, offset_fraction: float) -> None:
    """Any number of records, parts of 1..many records, a build with shards (keys from 0) or
    without, any order: one epoch from an offset and one whole epoch match the oracle."""
    from yogacache.dataref import CacheDataRef
    from yogacache.parallel import call_shards, sharded
    from yogacache.store.local import CacheStore

    root = tmp_path_factory.mktemp("sizes")
    # part_size_bytes bounds the file: 20 KiB of LMDB's own pages, then about 360 bytes a record.
    part_bytes = 1 if records_per_part == 1 else (20 << 10) + 360 * records_per_part
    store = CacheStore(root, part_size_bytes=part_bytes, show_progress=False)
    if sharded_build:
        import functools

        bounds = src.shard_bounds(n, 3)
        data: Any = sharded(call_shards([functools.partial(src.records, a, b) for a, b in bounds]), 1)
    else:
        data = src.elements(n)
    store.build("sizes", "v1", data)
    reader = store.open("sizes", "v1")
    order = ORDERS[order_name]
    ref = CacheDataRef(reader)
    per_rank = [math.ceil((n - r) / shards) for r in range(shards)]
    if order.mode == "shard":
        for rank in range(shards):
            offset = int(per_rank[rank] * offset_fraction)
            got = [[src.index_of(e) for e in ref.stream(**stream_kwargs(order, rank, shards, offset))]]
            expected = src.yogadl_order(n, rank, shards, shuffle=order.shuffle, seed=src.SEED,
                                        start_offset=offset, epochs=1)
            assert got == expected, (n, records_per_part, shards, rank, offset)
    else:
        streams = [ref.stream(**stream_kwargs(order, rank, shards)) for rank in range(shards)]
        for _ in range(2):
            epoch = [[src.index_of(e) for e in stream] for stream in streams]
            assert sorted(i for got in epoch for i in got) == list(range(n))
            assert [len(got) for got in epoch] == per_rank
    reader.close()
