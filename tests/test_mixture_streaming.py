"""Streamed mixtures on moto's S3 server under one node budget (issue 25, items 4 and 6).

Three caches of 1 KiB records (8, 5 and 3 parts of 16 records) published to one bucket prefix,
mixed 5:3:2 (each epoch: 128 records of the first, one whole pass; 77 of the second, rotating
through its 80; 51 of the third, a pass and a bit of the next), read streamed with
``shuffle_mode="parts"`` under a ``local_cache_limit`` of half the bytes:

- every epoch reads exactly the records, in exactly the order, of the same mixture read from
  fully synced copies of the caches (and that reference takes each component's count per epoch,
  each record once within a pass);
- the node's local parts, all components together, never exceed the budget;
- epoch 2 fetches at most ``(D - B)`` bytes plus one part per component, and one more per
  component whose pass turns over inside the epoch (that part ends one pass and is read again in
  the next), with ``D`` the bytes of the parts the epoch reads and ``B`` the budget
  (docs/streaming.md's promise for one cache, issue 25 item 4 for a mixture), counted as
  tests/test_parts_budget.py counts part downloads;
- a mixture of a streamed S3 component and a shared_fs one reads exactly as its synced twin;
- a mid-epoch resume state of two streamed ranks, resumed by three streamed ranks on fresh nodes,
  reads every remaining record of the epoch exactly once, in the reference's positions.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, unique
from tests.streaming_helpers import UsageSampler
from yogacache.mixture import Component, Mixture
from yogacache.read import pipeline
from yogacache.store import streaming
from yogacache.store.local import CacheStore
from yogacache.store.remote import RemoteCacheStore

PART_BYTES = 64 << 10  # 16 records of 1 KiB a part (part_bytes bounds the LMDB file)
READ = 6  # records per read: far fewer than a part holds, as with real records
VERSION = "v1"
# (dataset id, records, first value, weight): values of component k never meet another's
COMPONENTS = (("mix-a", 128, 0, 5), ("mix-b", 80, 10_000, 3), ("mix-c", 48, 20_000, 2))
COUNTS = (128, 77, 51)  # 5:3:2 of the 256 records the components hold together
SEED = 13
EPOCHS = 2


def data(records: int, first: int) -> list[tuple[np.ndarray, int]]:
    """Record i: (int32[256] filled with first + i, first + i)."""
    return [(np.full(256, first + i, np.int32), first + i) for i in range(records)]


def stream_args(**extra: Any) -> dict[str, Any]:
    # parts_window=1: a window no budget share narrows (``fit_budget``), so the streamed order is
    # the synced one; the default window would be narrowed to what each component's share holds.
    return dict(shuffle=True, shuffle_seed=SEED, shuffle_mode="parts", parts_window=1, **extra)


class Downloads:
    """This process's part downloads: (dataset id, part index, bytes), in order."""

    def __init__(self) -> None:
        self.fetched: list[tuple[str, int, int]] = []
        self._lock = threading.Lock()

    def wrap(self, original: Any) -> Any:
        def counted(provider: Any, index: int, temp: Path, stopping: Any = None) -> None:
            original(provider, index, temp, stopping)
            with self._lock:
                self.fetched.append((provider.manifest.dataset_id, index, provider.manifest.parts[index].size_bytes))
                if len(self.fetched) > 400:
                    raise RuntimeError(f"{len(self.fetched)} part downloads: the reader fetches parts again and again")

        return counted

    def bytes_since(self, mark: int) -> int:
        return sum(size for _, _, size in self.fetched[mark:])


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Downloads]:
    counter = Downloads()
    monkeypatch.setattr(streaming.StreamingParts, "_download", counter.wrap(streaming.StreamingParts._download))
    sizes = classmethod(lambda cls, *args: cls(full=READ, first=READ))
    monkeypatch.setattr(pipeline.ReadSizes, "for_records", sizes)
    monkeypatch.setattr(pipeline.ReadSizes, "for_manifest", sizes)
    yield counter


@pytest.fixture(scope="module")
def published(s3_server: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three caches, published once to one bucket prefix."""
    cloud = Cloud("s3", s3_server)
    bucket, prefix = cloud.new_bucket(), unique("mixtures")
    objects = cloud.store(bucket, prefix)
    builder = RemoteCacheStore(
        objects, tmp_path_factory.mktemp("builder"), part_size_bytes=PART_BYTES, show_progress=False
    )
    manifests = {
        name: builder.get_or_build(name, VERSION, lambda n=n, first=first: data(n, first)).manifest
        for name, n, first, _ in COMPONENTS
    }
    assert [len(manifests[name].parts) for name, *_ in COMPONENTS] == [8, 5, 3]
    return {"objects": objects, "manifests": manifests}


def open_mixture(
    objects: Any,
    node: Path,
    *,
    limit: Any = None,
    streamed: bool = True,
    names: Sequence[str] = tuple(c[0] for c in COMPONENTS),
) -> Mixture:
    extra = dict(streaming=True, local_cache_limit=limit) if streamed else {}
    store = RemoteCacheStore(objects, node, show_progress=False, **extra)
    weights = {name: weight for name, _, _, weight in COMPONENTS}
    return Mixture([Component(store.open(name, VERSION), weight=weights[name]) for name in names])


def labels_of(stream: Any) -> list[int]:
    out = []
    for array, label in stream:
        assert (np.asarray(array) == label).all(), f"record {label} holds other values"
        out.append(int(label))
    return out


def component_of(label: int) -> int:
    return label // 10_000


def check_reference(
    epochs: list[list[int]],
    counts: Sequence[int] = COUNTS,
    components: Sequence[tuple[str, int, int, int]] = COMPONENTS,
) -> None:
    """The synced reference keeps the mixture's promises: each epoch takes each component's count,
    and each component's draws, over the epochs in order, are whole passes (each record once)."""
    draws: list[list[int]] = [[] for _ in components]
    for e, labels in enumerate(epochs):
        assert len(labels) == sum(counts)
        per = [sum(component_of(x) == k for x in labels) for k in range(len(components))]
        assert per == list(counts), f"epoch {e}: {per} records per component, not {list(counts)}"
        for x in labels:
            draws[component_of(x)].append(x)
    for k, (_, n, first, _) in enumerate(components):
        for start in range(0, len(draws[k]), n):
            chunk = draws[k][start : start + n]
            assert len(set(chunk)) == len(chunk), f"component {k}: a record twice within a pass"
            assert set(chunk) <= set(range(first, first + n))
    assert epochs[0] != epochs[1], "epoch 1 repeats epoch 0's order"


def Peak(node: Path) -> UsageSampler:
    """The most bytes of streamed parts the node held, every component's together."""
    return UsageSampler(
        node, [node / "yogadl_local_cache" / ".parts" / name / VERSION for name, *_ in COMPONENTS], 0.005
    )


def synced_reference(objects: Any, node: Path, **args: Any) -> list[list[int]]:
    mixture = open_mixture(objects, node, streamed=False)
    try:
        stream = mixture.stream(**stream_args(**args))
        return [labels_of(stream) for _ in range(EPOCHS)]
    finally:
        mixture.close()


def test_the_streamed_components_share_the_room_they_fetch_ahead_into(
    published: dict[str, Any], tmp_path: Path
) -> None:
    """Each streamed component fetches ahead from its share of the budget: the parts every
    component holds and fetches ahead, all together, fit the budget (counting the whole budget
    each, three components fetched two ahead each into eight parts' room, and a fetch ahead
    evicted a part kept for later: the promise below went one part over about one run in six)."""
    manifests = published["manifests"]
    total = sum(manifest.total_size_bytes for manifest in manifests.values())
    mixture = open_mixture(published["objects"], tmp_path / "node", limit=total // 2)
    try:
        providers = [reader._provider for reader in mixture.reader.readers]
        assert [provider.sharing for provider in providers] == [3, 3, 3]
        fits = (total // 2) // max(provider.largest_part for provider in providers)
        assert fits == 8
        assert sum(1 + provider._ahead_count() for provider in providers) <= fits
    finally:
        mixture.close()


# Serial: it measures fetches, which a second busy test process slows unevenly. Its epoch 2 went
# one part over the promise about one run in six, alone too, until the components fetched ahead
# from their shares of the budget (the test above); 40 runs since, none over.
@pytest.mark.serial
def test_a_streamed_mixture_under_half_the_bytes_reads_the_synced_order_and_keeps_the_budget(
    published: dict[str, Any], tmp_path: Path, downloads: Downloads
) -> None:
    objects, manifests = published["objects"], published["manifests"]
    reference = synced_reference(objects, tmp_path / "synced")
    check_reference(reference)
    assert not downloads.fetched, "the synced reference streamed"

    total = sum(manifest.total_size_bytes for manifest in manifests.values())
    limit = total // 2
    largest = {name: max(part.size_bytes for part in m.parts) for name, m in manifests.items()}
    mixture = open_mixture(objects, tmp_path / "node", limit=limit)
    try:
        assert mixture.reader.streaming_budget == limit
        stream = mixture.stream(**stream_args())
        fetched, touched = [], []
        with Peak(tmp_path / "node") as peak:
            for e in range(EPOCHS):
                mark = len(downloads.fetched)
                got = labels_of(stream)
                assert got == reference[e], f"epoch {e}: the streamed mixture read another order than the synced one"
                fetched.append(downloads.bytes_since(mark))
                touched.append({(name, part) for name, part, _ in downloads.fetched[mark:]})
    finally:
        mixture.close()
    # D: the bytes of the parts epoch 2 reads (every part of every component here: its records
    # span them all), B: the budget.
    parts_read = sum(len(m.parts) for m in manifests.values())
    epoch2 = reference[1]
    for name, n, first, _ in COMPONENTS:
        read = {x - first for x in epoch2 if first <= x < first + n}
        edges = np.cumsum([0] + [part.num_records for part in manifests[name].parts])
        spanned = {int(np.searchsorted(edges, r, side="right") - 1) for r in read}
        assert spanned == set(range(len(manifests[name].parts))), f"{name}: epoch 2 reads parts {sorted(spanned)}"
    d = total
    # One part per component, and one more per component whose pass turns over inside epoch 2:
    # the part that ends one pass and is read again in the next is read at both ends of the
    # epoch, and the budget does not keep it in between (docs/mixtures.md, "Streaming").
    turning = [
        name
        for name, n, _, _ in COMPONENTS
        for count in (COUNTS[[c[0] for c in COMPONENTS].index(name)],)
        if (1 * count) // n != (2 * count - 1) // n
    ]
    assert turning == ["mix-b", "mix-c"]
    bound = (d - limit) + sum(largest.values()) + sum(largest[name] for name in turning)
    print(
        f"DEBUG {downloads.fetched[-16:]} "
        f"mixture: {parts_read} parts, {total} bytes, budget {limit}, peak {peak.peak}, "
        f"fetched per epoch {fetched}, epoch-2 bound {bound}"
    )
    assert 0 < peak.peak <= limit, f"the node held {peak.peak} bytes of parts, budget {limit}"
    assert fetched[0] >= total, f"epoch 1 fetched {fetched[0]} bytes of {total}: not every part"
    assert fetched[1] <= bound, (
        f"epoch 2 fetched {fetched[1]} bytes ({len(touched[1])} parts); promised at most (D - B) + one part "
        f"per component + one per pass turning over = ({d} - {limit}) + {sum(largest.values())} + "
        f"{sum(largest[name] for name in turning)} = {bound}"
    )


def test_a_mixture_of_a_streamed_s3_cache_and_a_shared_fs_cache_reads_exactly(
    published: dict[str, Any], tmp_path: Path, downloads: Downloads
) -> None:
    objects, manifests = published["objects"], published["manifests"]
    shared = CacheStore(tmp_path / "shared", part_size_bytes=PART_BYTES, show_progress=False)
    shared.build("mix-b", VERSION, data(80, 10_000))

    def mixture(node: Path, **remote: Any) -> Mixture:
        a = RemoteCacheStore(objects, node, show_progress=False, **remote).open("mix-a", VERSION)
        b = CacheStore(tmp_path / "shared", show_progress=False).open("mix-b", VERSION)
        return Mixture([Component(a, weight=5), Component(b, weight=3)])

    synced = mixture(tmp_path / "synced")
    limit = manifests["mix-a"].total_size_bytes // 2
    streamed = mixture(tmp_path / "node", streaming=True, local_cache_limit=limit)
    try:
        assert synced.counts == streamed.counts == (130, 78)  # 5:3 of 208
        assert ".parts" in str(streamed.reader.readers[0].directory)
        assert Path(streamed.reader.readers[1].directory).resolve().is_relative_to((tmp_path / "shared").resolve())
        reference = [labels_of(s) for s in [synced.stream(**stream_args())] for _ in range(EPOCHS)]
        check_reference(reference, synced.counts, COMPONENTS[:2])
        mark = len(downloads.fetched)
        stream = streamed.stream(**stream_args())
        with Peak(tmp_path / "node") as peak:
            got = [labels_of(stream) for _ in range(EPOCHS)]
        assert got == reference, "the streamed + shared_fs mixture read another order than its synced twin"
        assert {name for name, _, _ in downloads.fetched[mark:]} == {"mix-a"}
        assert 0 < peak.peak <= limit, f"the node held {peak.peak} bytes of parts, budget {limit}"
    finally:
        synced.close()
        streamed.close()


def test_a_streamed_mixture_resumed_mid_epoch_by_three_ranks_reads_the_rest_exactly_once(
    published: dict[str, Any], tmp_path: Path, downloads: Downloads
) -> None:
    objects, manifests = published["objects"], published["manifests"]
    reference = synced_reference(objects, tmp_path / "synced")
    limit = sum(manifest.total_size_bytes for manifest in manifests.values()) // 2
    head, before, states = 50, [], []
    for rank in range(2):  # two ranks on their own nodes read 50 records each
        mixture = open_mixture(objects, tmp_path / f"node-a{rank}", limit=limit)
        stream = mixture.stream(**stream_args(shard_rank=rank, num_shards=2))
        got = []
        for array, label in stream:
            assert (np.asarray(array) == label).all()
            got.append(int(label))
            if len(got) == head:
                break
        states.append(stream.state_dict(head))
        before.append(got)
        mixture.close()
    assert states[0] == states[1] and states[0]["mode"] == "mixture" and states[0]["consumed"] == 2 * head
    consumed = 2 * head
    for rank in range(2):
        assert before[rank] == reference[0][rank:consumed:2], f"rank {rank} of 2: not the mixed order's positions"
    after = []
    for rank in range(3):  # three ranks on fresh nodes: the rest of epoch 0, then epoch 1
        mixture = open_mixture(objects, tmp_path / f"node-b{rank}", limit=limit)
        stream = mixture.stream(**stream_args(shard_rank=rank, num_shards=3, resume_state=states[0]))
        with Peak(tmp_path / f"node-b{rank}") as peak:
            rest = labels_of(stream)
            whole = labels_of(stream)
        mixture.close()
        assert rest == reference[0][consumed + rank :: 3], f"rank {rank} of 3: the rest of epoch 0"
        assert whole == reference[1][rank::3], f"rank {rank} of 3: epoch 1"
        assert 0 < peak.peak <= limit, f"rank {rank}: the node held {peak.peak} bytes, budget {limit}"
        after.append(rest)
    everything = sorted(x for got in before + after for x in got)
    assert everything == sorted(reference[0]), "epoch 0 across the resume: not every record of the epoch once"
