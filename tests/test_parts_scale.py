"""Parts at scale (issue 34): what a manifest of 100,000 parts, a bucket of more than one LIST
page and a streamed reader's steps cost, counted rather than timed.

- Opening a manifest decodes its parts in one pass (no part goes through the one-by-one
  checker) within a bounded allocation peak; a streamed open makes no string per part.
- A streamed reader's step (``ReadOrder.advance``, the lease's announcement, the choice of the
  parts to fetch ahead) reads the next parts of its order only, never the whole order; the
  check for nearer parts lists the part directory once.
- ``read_cache`` plans its tasks' bounds in one vectorised pass (the same bounds as one search
  per task) and maps no record through a global permutation to look for clean cuts.
- LIST pages: every cloud backend lists more than one page of keys (moto, fake-gcs-server,
  Azurite), and ``ls`` finds a cache whose manifest comes after the first page.

Speed itself is measured by the scripts named in the issue's report, not asserted here.
"""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, HttpRequests
from yogacache.format import manifest as manifest_module
from yogacache.format.manifest import Manifest, PartInfo
from yogacache.format.spec import spec_from_json
from yogacache.store import budget, streaming
from yogacache.store.readorder import ReadOrder

SPEC = {"dict": [["i", {"tensor": {"dtype": "int64", "shape": []}}]]}
MANY = 100_000


def synthetic_manifest(parts: int, records_per_part: int = 10, part_bytes: int = 1 << 20) -> Manifest:
    """A manifest describing ``parts`` parts, with no data anywhere."""
    return Manifest(
        dataset_id="ds",
        dataset_version="v1",
        num_records=parts * records_per_part,
        num_bytes=parts * records_per_part * 8,
        element_spec=spec_from_json(SPEC),
        parts=tuple(
            PartInfo(f"part-{i:05d}.mdb", i * records_per_part, records_per_part, part_bytes, blake3=f"{i:064x}")
            for i in range(parts)
        ),
        created_at="2026-01-01T00:00:00Z",
        build_id="b" * 32,
        writer_version="0.3",
    )


# -- opening a manifest -----------------------------------------------------------------------
def test_a_manifest_of_100000_parts_decodes_in_one_pass_within_a_bounded_peak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    manifest = synthetic_manifest(MANY)
    data = manifest.to_bytes()
    one_by_one = []
    checked = []
    real_part, real_check = manifest_module._part_from_json, manifest_module._check_parts
    monkeypatch.setattr(manifest_module, "_part_from_json", lambda *a: one_by_one.append(1) or real_part(*a))
    monkeypatch.setattr(manifest_module, "_check_parts", lambda *a: checked.append(1) or real_check(*a))
    tracemalloc.start()
    try:
        opened = Manifest.from_bytes(data, "scale")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert opened == manifest
    assert one_by_one == [] and checked == []  # no part went through the per-part checkers
    # The JSON text's objects and the parts (about 90 MB for 100,000 parts): the bound.
    assert peak < 200 << 20, f"opening {MANY} parts peaked at {peak >> 20} MiB"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("blake3", "A" * 64, r"parts\[99999\]\): field 'blake3' is not a hex BLAKE3"),
        ("crc32c", "not-a-crc", r"parts\[99999\]\): field 'crc32c' is not a base64 CRC32C"),
        ("num_records", -1, r"parts\[99999\]\): field 'num_records' is out of range"),
        ("name", "../escape", r"part name '\.\./escape' is not allowed"),
        ("first_record", 7, r"lists an invalid part 'part-99999\.mdb'"),
    ],
)
def test_the_last_of_100000_parts_malformed_is_named_as_the_part_by_part_checks_name_it(
    field: str, value: Any, message: str
) -> None:
    """The one-pass decode accepts exactly what the part-by-part checks accept: a wrong last
    part sends the manifest through them, which name it."""
    raw = synthetic_manifest(MANY).to_json()
    raw["parts"][-1][field] = value
    with pytest.raises(manifest_module.CorruptCacheError, match=message):
        Manifest.from_bytes(json.dumps(raw).encode(), "scale")


def _fake_store(tmp_path: Path) -> Any:
    from yogacache.backends.files import FileObjectStore

    class Local:
        root = tmp_path / "node"
        verify_mode = "auto"

        def check_root(self, create: bool) -> None:
            self.root.mkdir(parents=True, exist_ok=True)

    class Store:
        local = Local()
        objects = FileObjectStore(tmp_path / "bucket")
        transfer_threads = 4

    return Store()


def test_a_streamed_open_of_100000_parts_makes_no_string_per_part(tmp_path: Path) -> None:
    manifest = synthetic_manifest(MANY)
    tracemalloc.start()
    try:
        reader = streaming.stream_cache(_fake_store(tmp_path), manifest, limit=64 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        provider = reader._provider
        assert isinstance(provider, streaming.StreamingParts)
        # A key and a URL of every part were ~38 MB here; what is left is per-reader state.
        assert peak < 8 << 20, f"a streamed open of {MANY} parts peaked at {peak >> 20} MiB"
        assert len(provider.file_names) == MANY
        assert provider.file_names[MANY - 1] == f"{'b' * 32}-part-{MANY - 1:05d}.mdb"
        assert provider.file_names[1:3] == [f"{'b' * 32}-part-00001.mdb", f"{'b' * 32}-part-00002.mdb"]
    finally:
        reader.close()


# -- a streamed reader's steps ----------------------------------------------------------------
class CountedOrder(list):  # type: ignore[type-arg]
    """A read order that counts the elements every slice of it copies, and refuses a walk of
    the whole of it (iteration, ``in``, ``index``)."""

    def __init__(self, items: Any) -> None:
        super().__init__(items)
        self.copied: list[int] = []

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        if isinstance(index, slice):
            self.copied.append(len(found))
        return found

    def __iter__(self) -> Any:
        raise AssertionError("a step walked the whole read order")

    def __contains__(self, item: object) -> bool:
        raise AssertionError("a step searched the whole read order")

    def index(self, *args: Any) -> int:
        raise AssertionError("a step searched the whole read order")


def test_a_streamed_readers_step_reads_only_the_next_parts_of_its_order(tmp_path: Path) -> None:
    manifest = synthetic_manifest(MANY)
    reader = streaming.stream_cache(_fake_store(tmp_path), manifest, limit=64 << 20)
    provider = reader._provider
    assert isinstance(provider, streaming.StreamingParts)
    chosen: list[int] = []
    provider._submit_ahead = lambda index, distance: chosen.append(index)  # type: ignore[method-assign]
    try:
        provider.expect(list(range(MANY)) + list(range(MANY)), MANY)  # this epoch, then the next
        order = CountedOrder(provider._reading.order)
        provider._reading.order = order
        steps = 50
        for index in range(steps):
            with provider._lock:
                provider._reading.advance(index)
            provider._announce()
            provider._fetch_ahead()
        # Each step copies at most the announcement's parts and the window ahead, whatever
        # the order's length (200,000 here).
        assert order.copied and max(order.copied) <= budget.UPCOMING_LIMIT
        assert sum(order.copied) <= steps * (budget.UPCOMING_LIMIT + 2 * streaming.MAX_AHEAD)
        # What it announced and chose is what the whole order says: the parts from its position.
        lease = budget.process_lease(provider.root)
        assert lease._upcoming[provider._key] == [provider.item(i) for i in range(steps - 1, steps - 1 + 1024)]
        assert chosen[0] == 0 and sorted(set(chosen)) == list(range(max(chosen) + 1))
    finally:
        reader.close()


def test_a_read_off_the_order_searches_the_later_epochs_once() -> None:
    reading = ReadOrder()
    reading.set(list(range(1000)) + list(range(1000)), 1000)
    reading.advance(3)
    order = CountedOrder(reading.order)
    reading.order = order
    for _ in range(100):
        reading.advance(5000)  # in no announced epoch (a random read): where it is stays
    assert reading.position == 3
    assert order.copied == [1000]  # the next epochs' parts, made into a set once
    parts, _keep, start = reading.needed(10)
    assert (parts, start) == (list(range(3, 13)), 3)


def test_the_parts_needed_sooner_are_checked_with_one_listing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``_nearer_missing`` (may a fetch ahead take room?) lists the part directory once for all
    the parts before it, and still sees which of them are on their way."""
    manifest = synthetic_manifest(100)
    reader = streaming.stream_cache(_fake_store(tmp_path), manifest, limit=64 << 20)
    provider = reader._provider
    assert isinstance(provider, streaming.StreamingParts)
    try:
        provider._submit_ahead = lambda index, distance: None  # type: ignore[method-assign]
        provider.expect(list(range(100)), 100)
        directory = provider.directory
        (directory / provider.file_names[0]).write_bytes(b"")  # on the node
        for index in (1, 2, 3):  # on their way
            budget.create_reservation(directory, provider.file_names[index], 1)
        for index in range(20):
            (directory / f"other-{index}").write_bytes(b"")
        listings = []
        real_scandir = budget.os.scandir
        monkeypatch.setattr(budget.os, "scandir", lambda path: listings.append(path) or real_scandir(path))
        assert not provider._nearer_missing(4)  # 0 is here, 1-3 are being fetched
        assert provider._nearer_missing(5)  # 4 is neither
        assert len(listings) == 2  # one listing per question, not one per part before it
    finally:
        reader.close()


# -- read_cache's plan ------------------------------------------------------------------------
def _bounds_one_search_per_task(total: int, count: int, cuts: np.ndarray) -> list[int]:
    """``CacheDatasource.task_bounds``'s bounds as computed before (one search per task)."""
    even = [round(k * total / count) for k in range(count + 1)]
    if count == 1:
        return even
    if len(cuts):
        tolerance = total / count / 2
        for k in range(1, count):
            at = int(np.searchsorted(cuts, even[k]))
            near = [int(cuts[i]) for i in (at - 1, at) if 0 <= i < len(cuts)]
            best = min(near, key=lambda cut: abs(cut - even[k]))
            if abs(best - even[k]) <= tolerance:
                even[k] = best
    return sorted(set(even))


class _NoParts:
    """A part provider that is never asked for a part: planning reads none."""

    keep_open = 1
    limit: Optional[int] = None

    def acquire(self, index: int) -> Path:
        raise AssertionError(f"planning read part {index}")

    def release(self, index: int) -> None:
        pass

    def expect(self, order: Any) -> None:
        pass


def _planned_reader(parts: int, records_per_part: int) -> Any:
    from yogacache.read.reader import CacheReader

    return CacheReader(
        Path("/nonexistent/ds/v1"), synthetic_manifest(parts, records_per_part), part_provider=_NoParts()
    )


def test_read_cache_task_bounds_are_the_bounds_one_search_per_task_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    import yogacache.ray as yr

    source = yr.CacheDatasource(_planned_reader(200, 1))
    random = np.random.default_rng(34)
    for _ in range(200):
        total = int(random.integers(2, 5000))
        cuts = np.unique(random.integers(1, total, size=int(random.integers(0, 60)))).astype(np.int64)
        count = int(random.integers(1, min(total, 200) + 1))
        monkeypatch.setattr(type(source), "__len__", lambda self, total=total: total)
        monkeypatch.setattr(type(source), "_clean_cuts", lambda self, cuts=cuts: cuts)
        assert source.task_bounds(count) == _bounds_one_search_per_task(total, count, cuts), (total, count, cuts)


def test_read_cache_plans_10000_parts_without_a_search_per_task_or_a_record_mapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yogacache.ray as yr
    from yogacache.read import permutation
    from yogacache.read.options import ReadOptions

    reader = _planned_reader(10_000, 5)
    searches: list[int] = []
    real_search = np.searchsorted
    monkeypatch.setattr(yr.np, "searchsorted", lambda *a, **k: searches.append(1) or real_search(*a, **k))
    source = yr.CacheDatasource(reader)  # cache order: every part boundary is a clean cut
    tasks = source.get_read_tasks(10_000)
    assert [task.metadata.num_rows for task in tasks] == [5] * 10_000  # one task per part
    assert len(searches) < 100  # one per chunk of the plan (and one for all the tasks), not per task
    mapped: list[int] = []
    real_map = permutation.KeyedPermutation.map
    monkeypatch.setattr(
        permutation.KeyedPermutation, "map", lambda self, x: mapped.append(np.size(x)) or real_map(self, x)
    )
    options = ReadOptions.from_stream_args(shuffle=True, shuffle_mode="global", shuffle_seed=3)
    tasks = yr.CacheDatasource(reader, options).get_read_tasks(100)
    assert sum(task.metadata.num_rows for task in tasks) == 50_000 and len(tasks) == 100
    assert sum(mapped) == 0  # no record of the epoch mapped to plan the tasks


# -- LIST pages -------------------------------------------------------------------------------
PAGE_KEYS = 1001  # more than one LIST page of 1,000 keys


def _put_empty_objects(cloud: Cloud, bucket: str, keys: list[str]) -> None:
    if cloud.kind == "s3":
        client = cloud.server.client()
        put = lambda key: client.put_object(Bucket=bucket, Key=key, Body=b"")  # noqa: E731
    elif cloud.kind == "azure":
        container = cloud.server.client().get_container_client(bucket)
        put = lambda key: container.upload_blob(key, b"")  # noqa: E731
    else:
        gcs_bucket = cloud.server.client().bucket(bucket)
        put = lambda key: gcs_bucket.blob(key).upload_from_string(b"")  # noqa: E731
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_listing_pages_past_the_first_thousand_keys_and_ls_finds_the_cache_after_them(
    kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    from yogacache.backends import azure as azure_backend
    from yogacache.store import open_store

    cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
    bucket = cloud.new_bucket()
    # Parts of a cache whose manifest is not there yet (keys "aa/…"), then one published cache
    # ("zz/v1/manifest.json") that sorts after all of them: on the second page of a listing.
    filler = [f"caches/aa/v1/{'c' * 32}-part-{i:05d}.mdb" for i in range(PAGE_KEYS)]
    _put_empty_objects(cloud, bucket, filler)
    published = dataclasses.replace(synthetic_manifest(0), dataset_id="zz")
    cloud.raw_put(bucket, "caches/zz/v1/manifest.json", published.to_bytes())

    if kind == "azure":
        monkeypatch.setattr(azure_backend, "LIST_ALL_PAGE", 1000)
    objects = cloud.store(bucket, "caches")
    http = HttpRequests().attach(objects)
    listed = objects.list("")
    assert sorted(info.key for info in listed) == sorted(key[len("caches/") :] for key in filler) + [
        "zz/v1/manifest.json"
    ]
    pinned = objects.list_pinned("")
    assert len(pinned) == PAGE_KEYS + 1 and pinned[-1].key == "zz/v1/manifest.json"
    # Each listing took two pages: 1,000 keys, then the rest (S3 and GCS return at most 1,000 a
    # page; Azure 5,000, lowered to 1,000 above so that 1,001 keys cross a page there too).
    lists = [line for line in http.sent if line.startswith("GET")]
    assert len(lists) == 4, "\n".join(lists)

    store = open_store(cloud.config(bucket, "caches"), show_progress=False)
    entries = {(entry.dataset_id, entry.dataset_version): entry for entry in store.list()}
    assert set(entries) == {("zz", "v1")} and entries[("zz", "v1")].remote == published


def test_ls_reads_the_published_manifests_many_at_once(tmp_path: Path) -> None:
    """``list`` (what ``yogacache ls`` shows) reads one manifest per cache: of many caches, many at
    once, not one after another (10^4 caches: seconds, not minutes). Counted, not timed: the
    most manifest reads in flight together."""
    import threading
    import time

    from yogacache.backends.files import FileObjectStore
    from yogacache.store.remote import LIST_READ_THREADS, RemoteCacheStore

    objects = FileObjectStore(tmp_path / "bucket")
    builder = RemoteCacheStore(objects, tmp_path / "builder", show_progress=False)
    for i in range(24):
        builder.build(f"ds{i:02d}", "v1", [{"x": i}])

    class Slow(FileObjectStore):
        in_flight = peak = 0
        lock = threading.Lock()

        def read(self, key: str, max_bytes: Optional[int] = None) -> Any:
            with Slow.lock:
                Slow.in_flight += 1
                Slow.peak = max(Slow.peak, Slow.in_flight)
            try:
                time.sleep(0.05)  # a round trip: readers overlap only if they are concurrent
                return super().read(key, max_bytes)
            finally:
                with Slow.lock:
                    Slow.in_flight -= 1

    entries = RemoteCacheStore(Slow(tmp_path / "bucket"), tmp_path / "node", show_progress=False).list()
    assert [e.dataset_id for e in entries] == [f"ds{i:02d}" for i in range(24)]
    assert all(e.remote is not None and e.remote.num_records == 1 for e in entries)
    assert 4 <= Slow.peak <= LIST_READ_THREADS, Slow.peak
