"""Faults between a node and Azure (Azurite behind tests/faultproxy.py) beyond those that
test_remote_faults.py injects for GCS and Azure alike: a truncated part body is retried, a
failing part upload publishes nothing, a streamed copy's failed block is sent again."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.cloud_helpers import Cloud
from tests.faultproxy import FaultProxy
from tests.servers import AzureServer
from tests.test_remote_faults import (
    CLOUD_FAULTS,
    DS,
    MANIFEST_NAME,
    OLD,
    VER,
    check_data,
    check_local,
    cloud_node,
    cloud_snapshot,
    records,
)
from yogacache.backends.base import RemoteError


@pytest.fixture
def azure(azure_server: AzureServer) -> Cloud:
    return Cloud("azure", azure_server)


@pytest.fixture
def proxy(azure: Cloud) -> Iterator[FaultProxy]:
    with FaultProxy(azure.server_url) as made:
        yield made


def test_truncated_part_body_is_retried_and_the_data_is_right(azure: Cloud, proxy: FaultProxy, tmp_path: Path) -> None:
    container = azure.new_bucket()
    build = cloud_node(azure, container, azure.server_url, tmp_path / "node-a").build(DS, VER, records(OLD))
    node_b = cloud_node(azure, container, proxy.url, tmp_path / "node-b")
    proxy.add_rule(method="GET", path_contains=build.parts[1].name, times=1, action="truncate", after_bytes=100)
    check_data(node_b.open(DS, VER), OLD)
    check_local(node_b, build, OLD)


def test_persistent_fault_on_part_upload_publishes_nothing(azure: Cloud, proxy: FaultProxy, tmp_path: Path) -> None:
    container = azure.new_bucket()
    node = cloud_node(azure, container, proxy.url, tmp_path / "node")
    proxy.add_rule(method="PUT", path_contains="-part-", **CLOUD_FAULTS["azure"]["500"])
    with pytest.raises(RemoteError, match="3 attempt"):
        node.build(DS, VER, records(OLD))
    assert not any(name.endswith(MANIFEST_NAME) for name in cloud_snapshot(azure, container))


def test_a_block_that_fails_on_the_way_is_sent_again(
    azure: Cloud, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A streamed copy's blocks are each retried with the bytes in hand (the chunks feeding them
    cannot be read again), and the commit after them too."""
    import os

    import yogacache.backends.azure as azure_module
    from yogacache.backends.azure import AzureObjectStore
    from yogacache.format.checksum import crc32c_of

    monkeypatch.setattr(azure_module, "_BLOCK", 1 << 20)
    container = azure.new_bucket()
    store = AzureObjectStore(container, "c", connection_string=azure.server.connection_string_at(proxy.url))
    proxy.add_rule(method="PUT", path_contains="comp=block&", times=1, **CLOUD_FAULTS["azure"]["500"])
    proxy.add_rule(method="PUT", path_contains="comp=blocklist", times=1, action="reset")
    data = os.urandom(3 << 20)
    store.write_chunks("k", (data[i : i + 500_000] for i in range(0, len(data), 500_000)), len(data))
    assert azure.raw_get(container, "c/k") == data
    assert store.checksum("k").crc32c == crc32c_of(data)  # type: ignore[union-attr]
    assert [e.action for e in proxy.requests("PUT", "comp=block&")][:2] == ["status", "forwarded"]
    assert [e.action for e in proxy.requests("PUT", "comp=blocklist")] == ["reset", "forwarded"]
