"""Fixtures of the composition matrix: the test servers behind byte-counting proxies, and the
caches, built once per (store, how it was made, size) and shared by every cell that reads them.

Builds go straight to the servers; every read of a cell goes through the store's proxy
(S3: the config's ``endpoint_url``; Azure: its ``connection_string``; GCS:
``STORAGE_EMULATOR_HOST``, pointed at the proxy for this module's lifetime, so spawned
DataLoader workers inherit it), so the part bytes a node fetched are counted.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest

from tests.cloud_helpers import Cloud
from tests.faultproxy import FaultProxy, Logged
from tests.matrix import records as src
from tests.matrix.cells import REMOTE
from yogacache.format.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]

# size -> (records, part_size_bytes, build shards). About 10 records (3 KB) a part for "many"
# (about 30 parts, so that half the cache holds every window of two ranks reading at once):
# part_size_bytes bounds the LMDB file, whose meta pages, first leaf and a transaction's room
# take 20 KiB before any record. "blocks" (cells.EXTRA_CELLS): a mixture of 6000 + 2004 + 1203
# records, three blocks of its interleaving, in parts of about 500 records.
SIZES: dict[str, tuple[int, int, int]] = {
    "one": (37, 1 << 30, 1),
    "many": (331, (20 << 10) + 3600, 4),
    "rec1": (41, 1, 4),
    "blocks": (6000, (20 << 10) + 500 * 360, 2),
}
DATASET_VERSION = "v1"

# part-NNNNN.mdb, part-SSSSS-NNN.mdb (build shards), part-SSSSS-NNN-<attempt>.mdb (Ray)
PART_NAME = re.compile(r"part-[0-9a-f-]+\.mdb")


def part_downloads(proxy: FaultProxy, since: int, kind: str) -> list[tuple[str, int]]:
    """(part file name, body bytes) of every part download the proxy forwarded after log entry
    ``since`` (GCS: media downloads only, not metadata reads)."""
    found = []
    for entry in proxy.log[since:]:
        if entry.method != "GET" or not entry.size or "part-" not in entry.target:
            continue
        if kind == "gcs" and "alt=media" not in entry.target:
            continue
        match = PART_NAME.search(entry.target)
        if match:
            found.append((match.group(0), entry.size))
    return found


@dataclass
class Built:
    """One cache the cells read: where it is and what the source was."""

    store: str
    made: str
    size: str
    dataset_id: str
    num_records: int
    manifest: Manifest
    location: dict[str, Any]  # what a node needs to open it (see World.node_store)


@dataclass
class World:
    """The servers, their proxies, buckets and built caches of one module."""

    root: Path
    clouds: dict[str, Cloud] = field(default_factory=dict)
    proxies: dict[str, FaultProxy] = field(default_factory=dict)
    buckets: dict[str, str] = field(default_factory=dict)
    caches: dict[tuple[str, str, str, int], Built] = field(default_factory=dict)
    saved_emulator_host: Optional[str] = None
    ray: Any = None

    def cloud(self, kind: str, request: pytest.FixtureRequest) -> Cloud:
        if kind not in self.clouds:
            cloud = self.clouds[kind] = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
            self.proxies[kind] = FaultProxy(cloud.server_url)
            self.buckets[kind] = cloud.new_bucket()
            if kind == "gcs":
                self.saved_emulator_host = os.environ.get("STORAGE_EMULATOR_HOST")
                os.environ["STORAGE_EMULATOR_HOST"] = self.proxies["gcs"].url
        return self.clouds[kind]

    def remote_config(self, kind: str, prefix: str, *, proxied: bool, **extra: Any) -> dict[str, Any]:
        cloud = self.clouds[kind]
        config = cloud.config(self.buckets[kind], prefix, **extra)
        # GCS: STORAGE_EMULATOR_HOST points at its proxy already.
        return cloud.through(config, self.proxies[kind].url) if proxied else config

    def objects(self, kind: str, prefix: str) -> Any:
        return self.clouds[kind].store(self.buckets[kind], prefix)

    def close(self) -> None:
        if self.ray is not None:
            self.ray.shutdown()
        for proxy in self.proxies.values():
            proxy.stop()
        if "gcs" in self.clouds:
            if self.saved_emulator_host is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = self.saved_emulator_host


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    made = World(tmp_path_factory.mktemp("matrix"))
    try:
        yield made
    finally:
        made.close()


# -- building --------------------------------------------------------------------------------------
def _other(kind: str) -> str:
    return "gcs" if kind in ("s3", "shared_fs") else "s3"


def ensure_ray(world: World) -> Any:
    if world.ray is None:
        import ray
        import ray.data  # noqa: F401

        env = {
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "STORAGE_EMULATOR_HOST": os.environ.get("STORAGE_EMULATOR_HOST", ""),
        }
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": env})
        world.ray = ray
    return world.ray


def _call_shards(n: int, shards: int, first: int = 0) -> Any:
    from yogacache.parallel import call_shards

    return call_shards([functools.partial(src.records, a, b) for a, b in src.shard_bounds(n, shards, first)])


def build(world: World, request: pytest.FixtureRequest, store: str, made: str, size: str, component: int = 0) -> Built:
    """The cache of (store, made, size), built on first use; ``component`` ``k > 0``: the
    ``k``-th other component of the cell's mixture (``records.mix_sizes`` records from
    ``k * records.MIX_FIRST`` on), in the same store and bucket prefix as the first, with the
    same parts and build shards (as many as it has records)."""
    key = (store, made, size, component)
    if key in world.caches:
        return world.caches[key]
    from yogacache.parallel import sharded
    from yogacache.store.local import CacheStore
    from yogacache.store.remote import RemoteCacheStore

    n, part_size, shards = SIZES[size]
    n = src.mix_sizes(n)[component]
    shards = min(shards, n)
    first = component * src.MIX_FIRST
    dataset_id = f"{made}-{size}" + (f"-c{component}" if component else "")
    prefix = f"{store}-{made}-{size}"
    base = world.root / prefix
    base.mkdir(parents=True, exist_ok=True)
    version = DATASET_VERSION
    remote = store in REMOTE
    if remote or made in ("copy",):
        world.cloud(store if remote else _other(store), request)
    if made in ("copy", "mirror"):
        world.cloud(_other(store), request)

    def target_store(kind: str, at_prefix: str) -> Any:
        """A store writing into ``kind`` (a directory, or a bucket prefix) with this size's parts."""
        if kind in ("local", "shared_fs"):
            return CacheStore(base / "root", part_size_bytes=part_size, show_progress=False)
        return RemoteCacheStore(
            world.objects(kind, at_prefix), base / f"builder-{kind}", part_size_bytes=part_size, show_progress=False
        )

    location: dict[str, Any] = {"kind": store, "root": base / "root", "prefix": prefix}
    if made == "one":
        manifest = target_store(store, prefix).build(dataset_id, version, src.elements(n, first))
    elif made == "workers2":
        manifest = target_store(store, prefix).build(
            dataset_id, version, sharded(_call_shards(n, shards, first), 2)
        )
    elif made == "ray":
        from yogacache.parallel.ray import build_with_ray

        world.cloud("gcs", request)  # its proxy first: Ray's workers take STORAGE_EMULATOR_HOST at ray.init
        ensure_ray(world)
        config = world.remote_config(
            store, prefix, proxied=False,
            local_cache_host_path=str(base / "ray-copies"), local_cache_container_path=str(base / "ray-copies"),
        )
        manifest = build_with_ray(
            config, dataset_id, version, _call_shards(n, shards, first), part_size_bytes=part_size,
            show_progress=False,
        )
    elif made == "import":
        from yogacache.sources import from_url
        from yogacache.sources.importer import import_source

        tars = base / ("tars" + (f"-c{component}" if component else ""))
        src.write_tar_shards(tars, n, shards, first)
        parallel: Optional[Callable[[Any], Any]] = (lambda whole: sharded(whole, 2)) if shards > 1 else None
        manifest = import_source(
            target_store(store, prefix), dataset_id, from_url(str(tars) + "/"), version,
            show_progress=False, parallel=parallel,
        ).manifest
    elif made == "copy":
        from yogacache.store.copy import copy_cache

        origin = _other(store)
        target_store(origin, prefix + "-origin").build(dataset_id, version, src.elements(n, first))
        source = world.remote_config(origin, prefix + "-origin", proxied=False)
        destination: Any
        if store == "local":
            (base / "root").mkdir(parents=True, exist_ok=True)
            destination = str(base / "root")
        elif store == "shared_fs":
            (base / "root").mkdir(parents=True, exist_ok=True)
            destination = {"type": "shared_fs", "host_storage_path": str(base / "root")}
        else:
            destination = world.remote_config(store, prefix, proxied=False)
        report = copy_cache(source, destination, dataset_id, version, show_progress=False)
        assert report.published, report
        manifest = _published_manifest(world, store, location, dataset_id, version)
    elif made == "mirror":
        # The origin is the other cloud; the store under test is the (empty) mirror that the
        # first node to open the cache fills.
        origin = _other(store)
        manifest = target_store(origin, prefix + "-origin").build(dataset_id, version, src.elements(n, first))
        location["origin"] = (origin, prefix + "-origin")
    elif made == "migrate":
        from yogacache.store.yogadl import migrate

        legacy_dir = base / ("legacy" + (f"-c{component}" if component else ""))
        legacy = src.write_yogadl_cache(legacy_dir / "cache.mdb", n, first)
        if remote:
            world.objects(store, prefix).upload_file(legacy, f"{dataset_id}/{version}/cache.mdb")
        else:
            placed = base / "root" / dataset_id / version / "cache.mdb"
            placed.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(legacy, placed)
        manifest = migrate(target_store(store, prefix), dataset_id, version)
    else:  # pragma: no cover - the axes name no other value
        raise ValueError(made)
    built = Built(store, made, size, dataset_id, n, manifest, location)
    world.caches[key] = built
    return built


def _published_manifest(world: World, store: str, location: dict[str, Any], dataset_id: str, version: str) -> Manifest:
    from yogacache.store import open_store

    if store in ("local", "shared_fs"):
        return open_store(str(location["root"]), show_progress=False).manifest(dataset_id, version)
    return open_store(world.remote_config(store, location["prefix"], proxied=False), show_progress=False).manifest(
        dataset_id, version
    )


def build_mixture(world: World, request: pytest.FixtureRequest, store: str, made: str, size: str) -> list[Built]:
    """The components of the cell's mixture: the single cells' cache and two smaller ones."""
    return [build(world, request, store, made, size, k) for k in range(len(src.MIX_WEIGHTS))]


def node_store(world: World, built: Built, node: Path, delivery: str, limit: Optional[int] = None) -> Any:
    """The store one node of a cell reads ``built`` through (its own local root ``node``);
    ``limit``: its budget under ``stream-half`` (default: half of ``built``)."""
    from yogacache.store import open_store

    kind, root = built.store, built.location["root"]
    if kind == "local":
        return open_store(str(root), show_progress=False)
    if kind == "shared_fs":
        return open_store({"type": "shared_fs", "host_storage_path": str(root)}, show_progress=False)
    local = {"local_cache_host_path": str(node), "local_cache_container_path": str(node)}
    if built.made == "mirror":
        origin, origin_prefix = built.location["origin"]
        config = world.remote_config(origin, origin_prefix, proxied=False, **local)
        config["mirrors"] = [world.remote_config(kind, built.location["prefix"], proxied=True)]
        return open_store(config, show_progress=False)
    extra: dict[str, Any] = {}
    if delivery != "sync":
        extra["streaming"] = True
    if delivery == "stream-half":
        extra["local_cache_limit"] = built.manifest.total_size_bytes // 2 if limit is None else limit
    return open_store(world.remote_config(kind, built.location["prefix"], proxied=True, **local, **extra),
                      show_progress=False)


def cache_part_downloads(
    proxy: FaultProxy, since: int, kind: str, dataset_ids: list[str]
) -> list[tuple[str, str, int]]:
    """(dataset id, part file name, body bytes) of every part download of the caches
    ``dataset_ids`` (of one store prefix) that the proxy forwarded after log entry ``since``."""
    ids = "|".join(re.escape(dataset_id) for dataset_id in sorted(dataset_ids, key=len, reverse=True))
    of_cache = re.compile(rf"(?:/|%2F)({ids})(?:/|%2F)")
    found = []
    for entry in proxy.log[since:]:
        if entry.method != "GET" or not entry.size or "part-" not in entry.target:
            continue
        if kind == "gcs" and "alt=media" not in entry.target:
            continue
        match, cache = PART_NAME.search(entry.target), of_cache.search(entry.target)
        if match:
            assert cache, f"a part download of none of {dataset_ids}: {entry.target}"
            found.append((cache.group(1), match.group(0), entry.size))
    return found


__all__ = [
    "PART_NAME", "Built", "Logged", "SIZES", "World", "build", "build_mixture", "cache_part_downloads",
    "node_store", "part_downloads",
]
