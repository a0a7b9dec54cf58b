"""Faults between a node and Azure (Azurite behind tests/faultproxy.py), as test_remote_faults.py
injects them for S3 and GCS: transient errors are retried, persistent ones reported naming the
object and never read as "absent" (no rebuild, no write), altered or truncated parts refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.faultproxy import FaultProxy
from tests.servers import AzureServer
from tests.test_remote_faults import (
    DS,
    FAST,
    MANIFEST_NAME,
    MANIFEST_PATH,
    NEW,
    OLD,
    PART_SIZE,
    PREFIX,
    VER,
    Maker,
    _flip_byte,
    check_data,
    check_local,
    records,
    wait_for,
)
from yogacache.backends.azure import AzureObjectStore
from yogacache.backends.base import RemoteError
from yogacache.errors import CorruptCacheError
from yogacache.format.manifest import Manifest
from yogacache.store.remote import RemoteCacheStore

# The service's own answer for these statuses (XML with a code), as a proxy in front would pass on.
_ERROR_BODY = '<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>m</Message></Error>'
FAULTS: dict[str, dict[str, Any]] = {
    "500": {"action": "status", "status": 500, "body": _ERROR_BODY.format(code="InternalError").encode(),
            "content_type": "application/xml"},
    "503": {"action": "status", "status": 503, "body": _ERROR_BODY.format(code="ServerBusy").encode(),
            "content_type": "application/xml"},
    "403": {"action": "status", "status": 403},  # a bare 403 (a proxy, a clock skewed for a moment)
    "reset": {"action": "reset"},
    "timeout": {"action": "delay", "seconds": 6.0},
}


def azure_node(server: AzureServer, root_url: str, container: str, root: Path, *, timeout: float = 10.0) -> Any:
    objects = AzureObjectStore(
        container, PREFIX, connection_string=server.connection_string_at(root_url), retry=FAST, timeout=timeout
    )
    return RemoteCacheStore(objects, root, show_progress=False, part_size_bytes=PART_SIZE, wait_timeout=20)


def snapshot(server: AzureServer, container: str) -> dict[str, bytes]:
    client = server.client().get_container_client(container)
    return {blob.name: bytes(client.download_blob(blob.name).readall()) for blob in client.list_blobs()}


@pytest.fixture
def proxy(azure_server: AzureServer) -> Iterator[FaultProxy]:
    with FaultProxy(azure_server.url) as made:
        yield made


@pytest.fixture
def published(azure_server: AzureServer, tmp_path: Path) -> tuple[str, Manifest]:
    container = azure_server.new_bucket()
    node_a = azure_node(azure_server, azure_server.url, container, tmp_path / "node-a")
    return container, node_a.build(DS, VER, records(OLD))


def test_transient_500_on_manifest_get_is_retried_without_rebuild(
    azure_server: AzureServer, proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path
) -> None:
    container, build = published
    before = snapshot(azure_server, container)
    node_b = azure_node(azure_server, proxy.url, container, tmp_path / "node-b")
    proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, times=2, **FAULTS["500"])
    maker = Maker(NEW)
    check_data(node_b.get_or_build(DS, VER, maker), OLD)
    assert maker.calls == 0
    gets = proxy.requests("GET", MANIFEST_NAME)
    assert [entry.action for entry in gets[:3]] == ["status", "status", "forwarded"]
    assert proxy.requests("PUT") == []
    assert snapshot(azure_server, container) == before
    check_local(node_b, build, OLD)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_persistent_fault_on_published_manifest_is_reported_not_rebuilt(
    azure_server: AzureServer, proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path, fault: str
) -> None:
    container, build = published
    root = tmp_path / "node-b"
    check_data(azure_node(azure_server, azure_server.url, container, root).open(DS, VER), OLD)
    before = snapshot(azure_server, container)
    node_b = azure_node(azure_server, proxy.url, container, root, timeout=1.0)
    proxy.add_rule(method="GET", path_contains=MANIFEST_NAME, **FAULTS[fault])
    maker = Maker(NEW)
    with pytest.raises(RemoteError) as raised:
        node_b.get_or_build(DS, VER, maker)
    assert f"az://{container}/{MANIFEST_PATH}" in str(raised.value) and "3 attempt" in str(raised.value)
    assert "AccountKey" not in str(raised.value)
    assert maker.calls == 0
    assert wait_for(lambda: len(proxy.requests("GET", MANIFEST_NAME)) >= 3)
    assert [e for e in proxy.requests(action="forwarded") if MANIFEST_NAME in e.target] == []
    assert {e.method for e in proxy.log} == {"GET"}  # nothing but reads was attempted
    assert snapshot(azure_server, container) == before
    check_local(node_b, build, OLD)


def test_truncated_part_body_is_retried_and_the_data_is_right(
    azure_server: AzureServer, proxy: FaultProxy, published: tuple[str, Manifest], tmp_path: Path
) -> None:
    container, build = published
    node_b = azure_node(azure_server, proxy.url, container, tmp_path / "node-b")
    proxy.add_rule(method="GET", path_contains=build.parts[1].name, times=1, action="truncate", after_bytes=100)
    check_data(node_b.open(DS, VER), OLD)
    check_local(node_b, build, OLD)


def test_persistent_fault_on_part_upload_publishes_nothing(
    azure_server: AzureServer, proxy: FaultProxy, tmp_path: Path
) -> None:
    container = azure_server.new_bucket()
    node = azure_node(azure_server, proxy.url, container, tmp_path / "node")
    proxy.add_rule(method="PUT", path_contains="-part-", **FAULTS["503"])
    with pytest.raises(RemoteError, match="3 attempt"):
        node.build(DS, VER, records(OLD))
    assert not any(name.endswith(MANIFEST_NAME) for name in snapshot(azure_server, container))


def test_flipped_byte_in_part_is_refused(azure_server: AzureServer, tmp_path: Path) -> None:
    container = azure_server.new_bucket()
    node_a = azure_node(azure_server, azure_server.url, container, tmp_path / "node-a")
    node_b = azure_node(azure_server, azure_server.url, container, tmp_path / "node-b")
    build1 = node_a.build(DS, VER, records(OLD))
    check_data(node_b.open(DS, VER), OLD)
    node_a.remove(DS, VER, remote=True, local=False)
    build2 = node_a.build(DS, VER, records(NEW))
    key = f"{PREFIX}/{DS}/{VER}/{build2.build_id}-{build2.parts[1].name}"
    blob = azure_server.client().get_blob_client(container, key)
    data = bytes(blob.download_blob().readall())
    blob.upload_blob(_flip_byte(data, len(data) // 2), overwrite=True)
    with pytest.raises(CorruptCacheError) as raised:
        node_b.open(DS, VER)
    assert f"az://{container}/{blob.blob_name}" in str(raised.value)
    check_local(node_b, build1, OLD)
