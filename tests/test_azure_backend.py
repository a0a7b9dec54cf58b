"""The Azure Blob backend against Azurite: what the shared contract tests do not cover (the CRC32C
it keeps in metadata, pinned reads, server-side copies, URLs and settings, errors without
secrets), and canaries recording what Azurite enforces and what it lacks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import FAST_RETRY, Cloud, HttpRequests, python_env, unique
from tests.servers import AZURITE_KEY, AzureServer, free_port
from yogacache.backends.azure import AzureObjectStore, _parse_url
from yogacache.backends.base import ObjectChangedError, ObjectChecksum, RemoteError
from yogacache.backends.registry import open_backend
from yogacache.errors import ConfigError
from yogacache.format.checksum import crc32c_of


@pytest.fixture
def azure(azure_server: AzureServer) -> Cloud:
    return Cloud("azure", azure_server)


@pytest.fixture
def store(azure: Cloud) -> AzureObjectStore:
    return azure.store(azure.new_bucket(), unique("caches"))  # type: ignore[no-any-return]


# -- URLs and settings ---------------------------------------------------------------------------
def test_urls_name_the_container_and_prefix() -> None:
    assert _parse_url("az://data/caches/x") == ("data", "caches/x", None)
    assert _parse_url("abfss://data@acct.dfs.core.windows.net/caches") == (
        "data",
        "caches",
        "https://acct.blob.core.windows.net",
    )
    with pytest.raises(ConfigError):
        _parse_url("az:///no-container")


def test_every_scheme_opens_the_backend_from_the_connection_string_variable(azure_server: AzureServer) -> None:
    container = azure_server.new_bucket()
    for scheme in ("az", "azure", "abfs"):
        store = open_backend(f"{scheme}://{container}/p-{scheme}")
        assert isinstance(store, AzureObjectStore)
        store.write("k", scheme.encode())
        assert Cloud("azure", azure_server).raw_get(container, f"p-{scheme}/k") == scheme.encode()


def test_account_url_and_key_instead_of_a_connection_string(
    azure_server: AzureServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_URL", azure_server.account_url)
    monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
    container = azure_server.new_bucket()
    store = open_backend(f"az://{container}/p")
    store.write("k", b"by key")
    assert store.read("k")[0] == b"by key"  # type: ignore[index]
    assert AZURITE_KEY not in repr(store) and AZURITE_KEY not in store.url("k")
    # ...or as a data_layer config, the key as ``credential``.
    monkeypatch.delenv("AZURE_STORAGE_KEY")
    from yogacache.config import parse_config

    config = parse_config(
        {"type": "azure", "bucket": container, "bucket_directory_path": "p", "credential": AZURITE_KEY}
    )
    assert AZURITE_KEY not in repr(config)
    assert open_backend(config.url, **config.backend_options()).read("k")[0] == b"by key"  # type: ignore
    # A URL's endpoint_url (the CLI's --endpoint-url) is the account URL.
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_URL")
    monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
    by_endpoint = open_backend(f"az://{container}/p", endpoint_url=azure_server.account_url)
    assert by_endpoint.read("k")[0] == b"by key"  # type: ignore[index]


def test_no_account_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_URL", "AZURE_STORAGE_ACCOUNT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as raised:
        open_backend("az://data/caches")
    assert "AZURE_STORAGE_CONNECTION_STRING" in str(raised.value)


def test_refused_key_is_not_retried_and_stays_secret(azure_server: AzureServer) -> None:
    wrong = "d3Jvbmcta2V5LXRoYXQtbXVzdC1uZXZlci1iZS1sb2dnZWQ="
    store = AzureObjectStore(
        azure_server.new_bucket(), "p", account_url=azure_server.account_url, credential=wrong, retry=FAST_RETRY
    )
    http = HttpRequests().attach(store)
    with pytest.raises(RemoteError) as raised:
        store.read("ds/v1/manifest.json")
    message = str(raised.value)
    assert "refused the credentials (HTTP 403" in message and "AZURE_STORAGE_CONNECTION_STRING" in message
    assert "after 1 attempt(s)" in message and len(http.sent) == 1
    assert wrong not in message and "sig=" not in message


def test_unreachable_endpoint_is_an_error_not_an_absent_object() -> None:
    store = AzureObjectStore(
        "c", "p", account_url=f"http://127.0.0.1:{free_port()}/devstoreaccount1", credential=AZURITE_KEY,
        retry=FAST_RETRY, timeout=2,
    )
    with pytest.raises(RemoteError) as raised:
        store.read("ds/v1/manifest.json")
    assert "az://c/p/ds/v1/manifest.json" in str(raised.value) and "cannot connect" in str(raised.value)
    assert AZURITE_KEY not in str(raised.value)


def test_a_missing_container_is_an_error(azure: Cloud) -> None:
    store = azure.store(unique("no-such-container"), "caches", retry=FAST_RETRY)
    for call in (lambda: store.read("m.json"), lambda: store.list(""), lambda: store.write("m", b"", if_absent=True)):
        with pytest.raises(RemoteError, match="container"):
            call()


def test_a_missing_library_is_one_import_error_with_the_install_hint() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["azure.storage.blob"] = None  # as if the azure extra were not installed
        from yogacache.backends.registry import open_backend
        try:
            open_backend("az://c/caches")
        except ImportError as error:
            print("ImportError:", error)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=python_env(), timeout=120)
    assert "pip install 'yogacache[azure]'" in out.stdout and "az:// storage needs" in out.stdout, out.stderr


# -- checksums and streamed copies ------------------------------------------------------------------
def test_written_objects_carry_their_crc32c_and_foreign_ones_none(
    azure: Cloud, store: AzureObjectStore, tmp_path: Path
) -> None:
    data = os.urandom(3 << 20)
    store.write_chunks("streamed", iter([data[:1000], data[1000:]]), len(data))
    assert store.checksum("streamed") == ObjectChecksum(len(data), crc32c_of(data))
    path = tmp_path / "part.mdb"
    path.write_bytes(data)
    store.upload_file(path, "uploaded")
    assert store.checksum("uploaded").crc32c == crc32c_of(data)  # type: ignore[union-attr]
    azure.raw_put(store.container, f"{store.prefix}/uploaded", b"rewritten by another tool")
    assert store.ensure_checksum("uploaded") == ObjectChecksum(25, None)  # Azure computes no CRC32C
    assert store.checksum("absent") is None


def test_a_large_object_is_staged_in_blocks(store: AzureObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import yogacache.backends.azure as azure_module

    monkeypatch.setattr(azure_module, "_BLOCK", 1 << 20)
    data = os.urandom((5 << 20) + 123)
    sent: list[int] = []
    store.write_chunks("big", (data[i : i + 300_000] for i in range(0, len(data), 300_000)), len(data), sent.append)
    assert sum(sent) == len(data)
    blocks = store._blob("big").get_block_list("committed")[0]
    assert [block.size for block in blocks] == [1_200_000] * 4 + [len(data) - 4_800_000]  # blocks of >= 1 MiB
    assert len({block.id[:32] for block in blocks}) == 1  # ids of this upload alone
    assert b"".join(store.read_chunks("big", chunk_bytes=1 << 20)) == data
    assert store.checksum("big").crc32c == crc32c_of(data)  # type: ignore[union-attr]


def test_read_chunks_of_a_blob_replaced_part_way_fail(azure: Cloud, store: AzureObjectStore) -> None:
    store.write("k", b"a" * 3000)
    chunks = store.read_chunks("k", chunk_bytes=1000)
    assert next(chunks) == b"a" * 1000
    azure.raw_put(store.container, f"{store.prefix}/k", b"b" * 3000)
    with pytest.raises(RemoteError, match="part-way"):
        list(chunks)
    with pytest.raises(FileNotFoundError):
        list(store.read_chunks("absent"))


def test_server_side_copy_within_the_account_keeps_the_checksum(azure: Cloud, store: AzureObjectStore) -> None:
    data = os.urandom(100_000)
    store.write_chunks("src", iter([data]), len(data))
    target = azure.store(azure.new_bucket(), "other")
    copied: list[int] = []
    assert target.copy_from(store, "src", "dst", size=len(data), progress=copied.append) is True
    assert target.read("dst")[0] == data and copied == [len(data)]  # type: ignore[index]
    assert target.checksum("dst").crc32c == crc32c_of(data)  # type: ignore[union-attr]
    with pytest.raises(FileNotFoundError):
        target.copy_from(store, "absent", "dst2", size=1)


def test_no_server_side_copy_from_another_service(store: AzureObjectStore, s3_server: Any) -> None:
    other = Cloud("s3", s3_server)
    source = other.store(other.new_bucket(), "p")
    source.write("k", b"x")
    assert store.copy_from(source, "k", "k", size=1) is False
    assert store.read("k") is None


# -- pinned reads (sources) ---------------------------------------------------------------------------
def test_head_list_page_and_reads_pinned_by_etag(azure: Cloud, store: AzureObjectStore) -> None:
    for name in ("a/1", "a/2", "a/3", "b/1"):
        store.write(name, name.encode() * 10)
    pin = store.head("a/2")
    assert pin is not None and pin.size == 30 and pin.etag and not pin.etag.startswith('"')
    assert store.head("a/9") is None
    first = store.list_page("a/", page_size=2)
    assert [p.key for p in first.objects] == ["a/1", "a/2"] and first.more and first.token
    rest = store.list_page("a/", page_size=2, token=first.token)
    assert [p.key for p in rest.objects] == ["a/3"] and not rest.more
    assert [p.key for p in store.list_page("a/", start_at="a/2").objects] == ["a/2", "a/3"]
    assert [p.key for p in store.list_page("").objects] == ["a/1", "a/2", "a/3", "b/1"]
    assert store.metadata_requests == 6  # one a HEAD, one a LIST page
    assert store.read_range(pin, 2, 8) == (b"a/2" * 10)[2:8]
    assert store.open_stream(pin).read() == b"a/2" * 10
    azure.raw_put(store.container, f"{store.prefix}/a/2", b"replaced")
    with pytest.raises(ObjectChangedError) as changed:
        store.read_range(pin, 0, 4)
    assert changed.value.deleted is False
    store.delete("a/2")
    with pytest.raises(ObjectChangedError) as gone:
        store.read_range(pin, 0, 4)
    assert gone.value.deleted is True


# -- canaries: what Azurite enforces, and what it lacks --------------------------------------------
def test_canary_azurite_refuses_conditional_writes_that_do_not_hold(azure_server: AzureServer) -> None:
    """With the emulator's own client: If-None-Match: * on an existing blob and a stale If-Match
    are refused, content kept; a delete on a stale ETag is refused too."""
    from azure.core import MatchConditions
    from azure.core import exceptions as azexc

    blob = azure_server.client().get_blob_client(azure_server.new_bucket(), "manifest.json")
    stale = blob.upload_blob(b"first")["etag"]
    blob.upload_blob(b"published", overwrite=True)
    with pytest.raises((azexc.ResourceExistsError, azexc.ResourceModifiedError)):
        blob.upload_blob(b"usurper", overwrite=True, match_condition=MatchConditions.IfMissing)
    with pytest.raises(azexc.ResourceModifiedError):
        blob.upload_blob(b"x", overwrite=True, etag=stale, match_condition=MatchConditions.IfNotModified)
    with pytest.raises(azexc.ResourceModifiedError):
        blob.delete_blob(etag=stale, match_condition=MatchConditions.IfNotModified)
    assert blob.download_blob().readall() == b"published"


def test_canary_azurite_checks_the_content_md5_of_a_block(azure_server: AzureServer) -> None:
    """write_chunks relies on the server refusing a block whose bytes do not match its MD5."""
    import base64
    import hashlib

    from azure.core import exceptions as azexc

    blob = azure_server.client().get_blob_client(azure_server.new_bucket(), "b")
    wrong = bytearray(hashlib.md5(b"other bytes").digest())
    with pytest.raises(azexc.HttpResponseError) as raised:
        blob.stage_block("00000000", b"block bytes", headers={"Content-MD5": base64.b64encode(wrong).decode()})
    assert raised.value.status_code == 400


def test_canary_azurite_keeps_no_blob_versions(azure_server: AzureServer) -> None:
    """DOCUMENTS AN EMULATOR GAP: Azurite does not support blob versioning (no ``x-ms-version-id``),
    so pins there are ETags alone and ``served_versions`` stays empty. If this starts failing,
    Azurite has versioning: test pins by version id against it."""
    container = azure_server.new_bucket()
    blob = azure_server.client().get_blob_client(container, "k")
    response = blob.upload_blob(b"v1")
    assert response.get("version_id") is None
    store = Cloud("azure", azure_server).store(container, "")
    pin = store.head("k")
    assert pin is not None and pin.version_id is None
    store.read_range(pin, 0, 2)
    assert store.served_versions == {}


def test_canary_azurite_ignores_start_from_and_the_backend_drops_earlier_keys(azure_server: AzureServer) -> None:
    """DOCUMENTS AN EMULATOR GAP: Azurite ignores List Blobs' ``startFrom`` (newer than the API
    version it implements) and lists from the first key; ``list_page`` drops the keys below
    ``start_at`` itself, so it answers the same there as on Azure. If this starts failing,
    Azurite honours ``startFrom``."""
    container = azure_server.new_bucket()
    client = azure_server.client().get_container_client(container)
    for name in ("a", "b", "c"):
        client.upload_blob(name, b"x")
    assert [blob.name for blob in client.list_blobs(start_from="b")] == ["a", "b", "c"]
    page = Cloud("azure", azure_server).store(container, "").list_page("", start_at="b")
    assert [pin.key for pin in page.objects] == ["b", "c"] and not page.more


def test_a_ranged_pull_and_a_block_push_never_discard_pooled_connections(
    azure_server: AzureServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """4 transfer threads x 4 ranged or block requests each at once: the pool holds them all."""
    import logging

    import numpy as np

    from yogacache.store.remote import RemoteCacheStore

    container = azure_server.new_bucket()

    def objects() -> AzureObjectStore:
        return AzureObjectStore(container, "caches", connection_string=azure_server.connection_string,
                                transfer_bytes=1 << 20)

    records = [{"i": np.int64(i), "x": np.full(1 << 20, i, np.uint8)} for i in range(24)]
    with caplog.at_level(logging.WARNING, logger="urllib3"):
        builder = RemoteCacheStore(objects(), tmp_path / "builder", part_size_bytes=6 << 20, show_progress=False)
        manifest = builder.build("ds", "v1", records)
        assert len(manifest.parts) >= 4
        reading = objects()
        http = HttpRequests().attach(reading)
        reader = RemoteCacheStore(reading, tmp_path / "node", show_progress=False).open("ds", "v1")
    assert reader.manifest.freshness == manifest.freshness
    assert len([r for r in http.sent if "-part-" in r and r.startswith("GET")]) > 4 * len(manifest.parts)  # ranged
    assert [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()] == []


def test_the_progress_hook_counts_every_byte_once_from_many_threads() -> None:
    """The SDK calls ``progress_hook`` from each of its transfer threads with running totals out
    of order: the bytes reported add up to the final total, never more (a terminal showed 126.7
    MiB uploaded of a 78.7 MiB cache)."""
    import sys
    import threading

    from yogacache.backends.azure import _ProgressHook

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: a check-then-set without a lock races
    try:
        for _ in range(5):
            counted: list[int] = []
            hook = _ProgressHook(counted.append)

            def worker(k: int, hook: _ProgressHook = hook) -> None:
                for i in range(3000):
                    hook((i * 8 + k) * 100, None)

            threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert sum(counted) == (2999 * 8 + 7) * 100
    finally:
        sys.setswitchinterval(switch)


def test_verbose_cli_against_azure_prints_yogacache_not_the_sdks_http_log(azure: Cloud, tmp_path: Path) -> None:
    """``-v`` logs what yogacache does; the Azure SDK's request/response header dumps (hundreds
    of lines) stay out."""
    container = azure.new_bucket()
    source = tmp_path / "src"
    source.mkdir()
    for i in range(3):
        (source / f"{i}.txt").write_text(str(i))
    url = azure.url(container, "caches")
    done = subprocess.run(
        [sys.executable, "-m", "yogacache", "-v", "--storage", url, "import", str(source), "--id", "files",
         "--version", "v1"],
        capture_output=True, text=True, env=python_env(), timeout=300,
    )
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "yogacache", "-v", "--storage", url, "ls"],
        capture_output=True, text=True, env=python_env(), timeout=300,
    )
    assert listed.returncode == 0 and "files" in listed.stdout, listed.stderr
    for output in (done.stderr, listed.stderr):
        assert "Request URL" not in output and "Response headers" not in output, output[:2000]
        assert "x-ms-" not in output, output[:2000]
