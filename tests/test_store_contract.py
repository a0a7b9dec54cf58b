"""One contract for every Store: the local store, and the remote store over the directory, S3,
GCS and Azure backends (moto's server, fake-gcs-server and Azurite on 127.0.0.1), all built by
``open_store``.

Each test runs against each store kind. Remote stores are "nodes": several stores share one
published location, each with its own node-local root, as separate machines would.
"""

from __future__ import annotations

import ast
import inspect
import uuid
from pathlib import Path
from typing import Any, Callable, Generic, Protocol

import numpy as np
import pytest

from tests.cloud_helpers import Cloud
from yogacache.errors import CacheNotFoundError, ConfigError, CorruptCacheError, InvalidNameError
from yogacache.store import CacheEntry, Store, open_store
from yogacache.store.base import RemoteStore

KINDS = ["local", "remote-directory", "remote-s3", "remote-gcs", "remote-azure"]
Nodes = Callable[[str], Store]


def records(n: int = 40, fill: int = 0) -> list[dict[str, Any]]:
    return [{"x": np.full((3,), i + fill, dtype=np.int32), "name": f"r{i}".encode()} for i in range(n)]


def read_all(store: Store, dataset_id: str = "ds", version: str = "v1") -> list[int]:
    reader = store.open(dataset_id, version)
    return [int(element["x"][0]) for element in reader.read_elements(np.arange(len(reader)))]


@pytest.fixture(params=KINDS)
def nodes(request: pytest.FixtureRequest, tmp_path: Path) -> Nodes:
    """A function from a node name to that node's store; all nodes share the published caches."""
    kind = request.param
    prefix = f"caches-{uuid.uuid4().hex[:8]}"
    if kind == "local":
        target: Any = tmp_path / "shared"
    elif kind == "remote-directory":
        target = f"file://{tmp_path / 'bucket' / prefix}"
    elif kind == "remote-s3":
        server = request.getfixturevalue("s3_server")
        target = {
            "type": "s3",
            "bucket": server.new_bucket(),
            "bucket_directory_path": prefix,
            "endpoint_url": server.endpoint_url,
            "access_key": server.access_key,
            "secret_key": server.secret_key,
        }
    elif kind == "remote-azure":
        server = request.getfixturevalue("azure_server")
        target = Cloud("azure", server).config(server.new_bucket(), prefix)
    else:
        server = request.getfixturevalue("gcs_server")
        target = {"type": "gcs", "bucket": server.new_bucket(), "bucket_directory_path": prefix}

    def node(name: str) -> Store:
        local = str(tmp_path / f"node-{name}")
        if isinstance(target, dict):
            config = {**target, "local_cache_host_path": local, "local_cache_container_path": local}
            return open_store(config, show_progress=False)
        return open_store(target, local_cache=local, show_progress=False)

    return node


def test_a_missing_cache_is_not_found_everywhere(nodes: Nodes) -> None:
    store = nodes("a")
    with pytest.raises(CacheNotFoundError):
        store.open("ds", "v1")
    with pytest.raises(CacheNotFoundError):
        store.manifest("ds", "v1")
    assert store.list() == []


def test_get_or_build_builds_once_and_every_node_reads_it(nodes: Nodes) -> None:
    calls = []

    def make() -> list[dict[str, Any]]:
        calls.append(1)
        return records()

    a, b = nodes("a"), nodes("b")
    first = a.get_or_build("ds", "v1", make)
    assert len(first) == 40
    again = a.get_or_build("ds", "v1", make)
    other = b.get_or_build("ds", "v1", make)
    assert len(calls) == 1
    assert again.manifest.freshness == other.manifest.freshness == first.manifest.freshness
    assert read_all(b) == list(range(40))


def test_build_then_list_describes_the_cache(nodes: Nodes) -> None:
    store = nodes("a")
    manifest = store.build("ds", "v1", records(25))
    assert manifest.num_records == 25
    assert store.manifest("ds", "v1").build_id == manifest.build_id
    (entry,) = store.list()
    assert isinstance(entry, CacheEntry)
    assert (entry.dataset_id, entry.dataset_version) == ("ds", "v1")
    assert entry.manifest is not None and entry.manifest.num_records == 25
    assert "ds" in store.location("ds", "v1") and "v1" in store.location("ds", "v1")
    if store.remote_url is None:
        assert entry.where == "local" and entry.remote is None
    else:
        assert entry.where == "remote+local" and entry.current and entry.copy_state == "current"
        assert entry.remote_url == store.location("ds", "v1")


def test_a_new_build_replaces_the_old_one_for_later_readers(nodes: Nodes) -> None:
    store = nodes("a")
    store.build("ds", "v1", records(10))
    old = store.open("ds", "v1")
    if store.remote_url is not None:
        store.remove("ds", "v1", remote=True, local=False)  # remote stores publish once
    store.build("ds", "v1", records(10, fill=100))
    assert read_all(nodes("b")) == list(range(100, 110))
    # A reader opened before keeps reading the build it opened.
    assert [int(e["x"][0]) for e in old.read_elements(np.arange(10))] == list(range(10))


def test_remove_deletes_exactly_that_cache(nodes: Nodes) -> None:
    store = nodes("a")
    store.build("ds", "v1", records(5))
    store.build("ds", "v2", records(6))
    removed = store.remove("ds", "v1", remote=store.remote_url is not None, local=True)
    assert removed
    with pytest.raises(CacheNotFoundError):
        nodes("fresh").open("ds", "v1")
    assert [(e.dataset_id, e.dataset_version) for e in store.list()] == [("ds", "v2")]
    assert read_all(store, version="v2") == list(range(6))


def test_verify_passes_then_catches_a_flipped_bit(nodes: Nodes) -> None:
    store = nodes("a")
    manifest = store.build("ds", "v1", records(30))
    assert store.verify("ds", "v1").build_id == manifest.build_id
    part = store.root / "ds" / "v1" / manifest.parts[0].name
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(CorruptCacheError):
        store.verify("ds", "v1")


def test_pull_and_push_need_a_remote(nodes: Nodes) -> None:
    a = nodes("a")
    a.build("ds", "v1", records(8))
    if a.remote_url is None:
        with pytest.raises(ConfigError, match="remote storage"):
            a.pull("ds", "v1")
        with pytest.raises(ConfigError, match="remote storage"):
            a.push("ds", "v1")
        with pytest.raises(ConfigError, match="remote storage"):
            a.remove("ds", "v1", remote=True)
        return
    assert a.push("ds", "v1").num_records == 8  # already published: a no-op
    b = nodes("b")
    reader = b.pull("ds", "v1")
    assert reader.directory == b.root / "ds" / "v1"
    (entry,) = b.list()
    assert entry.current


@pytest.mark.parametrize("bad", ["../x", "", ".", "a/b", "/abs"])
def test_names_are_refused_before_any_io(nodes: Nodes, bad: str) -> None:
    store = nodes("a")
    for call in (
        lambda: store.open(bad, "v1"),
        lambda: store.build("ds", bad, records(1)),
        lambda: store.get_or_build(bad, "v1", lambda: records(1)),
        lambda: store.remove("ds", bad),
        lambda: store.location(bad, "v1"),
    ):
        with pytest.raises(InvalidNameError):
            call()


# -- the protocol is the whole contract: every store class has all of it, no caller asks more ------
PACKAGE = Path(__file__).resolve().parent.parent / "yogacache"


def protocol_members(protocol: type) -> set[str]:
    """The names a Protocol class declares (methods, properties, annotated attributes), its bases' too."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object, Protocol, Generic) or not getattr(cls, "_is_protocol", False):
            continue
        names |= {name for name in vars(cls) if not name.startswith("_")}
        names |= {name for name in getattr(cls, "__annotations__", {}) if not name.startswith("_")}
    return names


def every_store(tmp_path: Path) -> list[Store]:
    """One instance of each store class there is, local and remote."""
    from yogacache.backends.files import FileObjectStore
    from yogacache.store.mirrors import MirroredCacheStore

    mirror = FileObjectStore(tmp_path / "mirror")
    return [
        open_store(tmp_path / "local", show_progress=False),
        open_store(f"file://{tmp_path / 'bucket'}", local_cache=tmp_path / "node", show_progress=False),
        MirroredCacheStore(FileObjectStore(tmp_path / "origin"), [mirror], tmp_path / "node-m", show_progress=False),
    ]


def test_every_store_class_has_every_member_of_the_protocol(tmp_path: Path) -> None:
    stores = every_store(tmp_path)
    assert {"local", "remote", "open", "get_or_build"} <= protocol_members(Store)
    assert {"objects", "key", "local_manifest", "mirror_builds"} <= protocol_members(RemoteStore)
    for store in stores:
        for name in protocol_members(Store):
            assert hasattr(store, name), f"{type(store).__name__} lacks Store.{name}"
        assert store.local.local is store.local and store.local.remote is None
        remote = store.remote
        if remote is None:
            assert store.remote_url is None and store.local is store
            continue
        assert remote is store and remote.remote_url == remote.objects.url()
        for name in protocol_members(RemoteStore):
            assert hasattr(remote, name), f"{type(store).__name__} lacks RemoteStore.{name}"
        for name in protocol_members(RemoteStore) | protocol_members(Store):
            declared = getattr(RemoteStore, name, None)
            if callable(declared) and not isinstance(declared, property):
                expected = list(inspect.signature(declared).parameters)[1:]
                assert list(inspect.signature(getattr(remote, name)).parameters) == expected, name
    assert [store.remote.mirror_builds() if store.remote else None for store in stores] == [None, None, []]


def _modules_outside_store() -> list[tuple[Path, ast.Module]]:
    """Every module that could hold a store but is not one: all but store/ and the backends
    below it (which never see a store: an import contract keeps them from importing one)."""
    return [
        (path, ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "store" not in path.parents and PACKAGE / "backends" not in path.parents
    ]


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


STORE_CLASSES = {"Store", "RemoteStore", "CacheStore", "RemoteCacheStore", "MirroredCacheStore"}


def test_no_caller_outside_the_store_probes_a_store_or_uses_its_private_names() -> None:
    found = []
    for path, tree in _modules_outside_store():
        where = path.relative_to(PACKAGE.parent)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("yogacache.store"):
                found += [f"{where}:{node.lineno} imports {a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                if any("store" in name.lower() for name in _names_in(node.value)):
                    found.append(f"{where}:{node.lineno} uses {ast.unparse(node)}")
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args):
                continue
            if node.func.id in ("getattr", "hasattr") and any("store" in n.lower() for n in _names_in(node.args[0])):
                found.append(f"{where}:{node.lineno} probes {ast.unparse(node)}")
            if node.func.id in ("isinstance", "issubclass") and len(node.args) == 2:
                if _names_in(node.args[1]) & STORE_CLASSES:
                    found.append(f"{where}:{node.lineno} asks the class: {ast.unparse(node)}")
    assert found == []


def test_stores_are_built_only_by_the_factory_outside_the_store() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for path, tree in _modules_outside_store()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _names_in(node.func) & STORE_CLASSES
    ]
    assert found == []


def test_one_parser_reads_every_spelling_of_a_store_target(tmp_path: Path) -> None:
    from yogacache.store.target import parse_target

    config_file = tmp_path / "storage.json"
    config_file.write_text('{"type": "shared_fs", "host_storage_path": "/data/caches"}')
    assert parse_target(None).directory is None and parse_target(None).url is None
    assert parse_target(tmp_path).directory == tmp_path
    assert parse_target(str(config_file)).directory == Path("/data/caches")
    assert parse_target({"type": "shared_fs"}).directory is None
    url = parse_target("s3://bucket/prefix", endpoint_url="http://127.0.0.1:1")
    assert (url.url, url.config) == ("s3://bucket/prefix", None)
    assert dict(url.backend_options) == {"endpoint_url": "http://127.0.0.1:1"}
    cloud = parse_target({"type": "gcs", "bucket": "b", "bucket_directory_path": "caches/"})
    assert cloud.url == "gs://b/caches" and cloud.config is not None and cloud.directory is None
    assert parse_target(tmp_path / "typo").directory == tmp_path / "typo"  # a build creates it
    with pytest.raises(ConfigError, match=r"typo does not exist \(not a directory, a config file or a URL\)"):
        parse_target(tmp_path / "typo", must_exist=True)
    with pytest.raises(ValueError, match="names no object store"):
        parse_target(tmp_path).open_backend()
