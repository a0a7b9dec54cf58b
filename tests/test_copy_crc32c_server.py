"""An S3 endpoint whose CRC32C is not CRC32C: a moto server without its optional ``crc32c``
module (installed without ``moto[s3crc32c]``) computes the CRC32 of an object and reports it as
``ChecksumCRC32C``. A server-side copy on such an endpoint used to fail with "has CRC32C ... after
the copy, not ..." although no byte was wrong. The copy now reads such a part back, checks its
size, content hash and CRC32C itself, publishes, and says what is wrong with the endpoint.

The server is a real moto server, started here with ``crc32c`` made unimportable (what a plain
``pip install 'moto[server]'`` gives); nothing in the client is patched.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import dataset, expected_keys, reader_keys
from tests.servers import S3Server, free_port, stop, wait_for_http
from yogacache.backends.s3 import S3ObjectStore
from yogacache.format.checksum import crc32c_of, encode_crc32c
from yogacache.store.copy import copy_cache
from yogacache.store.remote import RemoteCacheStore

N = 600
WITHOUT_CRC32C = (
    "import sys\n"
    "sys.modules['crc32c'] = None  # as if moto was installed without its s3crc32c extra\n"
    "from moto.server import main\n"
    "main(sys.argv[1:])\n"
)


@pytest.fixture(scope="module")
def crc32_server(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[S3Server]:
    """A moto server without the crc32c module (same credentials as ``s3_server``)."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto-crc32") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", WITHOUT_CRC32C, "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = S3Server(f"http://127.0.0.1:{port}", s3_server.access_key, s3_server.secret_key)
    try:
        wait_for_http(server.endpoint_url + "/", process, log)
        yield server
    finally:
        stop(process)


def test_canary_this_server_reports_crc32_as_crc32c(crc32_server: S3Server) -> None:
    """The premise: without crc32c, moto's ChecksumCRC32C of a copy is the bytes' CRC32."""
    client = crc32_server.client()
    bucket = crc32_server.new_bucket()
    data = b"yogacache" * 1000
    client.put_object(Bucket=bucket, Key="a", Body=data)
    client.copy_object(Bucket=bucket, Key="b", CopySource={"Bucket": bucket, "Key": "a"}, ChecksumAlgorithm="CRC32C")
    reported = client.head_object(Bucket=bucket, Key="b", ChecksumMode="ENABLED")["ChecksumCRC32C"]
    assert reported == encode_crc32c(zlib.crc32(data)) != crc32c_of(data)


def test_a_server_side_copy_on_an_endpoint_with_a_wrong_crc32c_is_read_back_and_published(
    crc32_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = crc32_server.endpoint_url
    source_bucket, target_bucket = crc32_server.new_bucket(), crc32_server.new_bucket()
    origin = RemoteCacheStore(
        S3ObjectStore(source_bucket, "caches", endpoint_url=endpoint),
        tmp_path / "builder",
        part_size_bytes=100_000,
        show_progress=False,
    )
    built = origin.build("ds", "v1", dataset(N))
    assert len(built.parts) >= 2 and all(part.crc32c for part in built.parts)

    with caplog.at_level(logging.WARNING, logger="yogacache.store.copy"):
        report = copy_cache(
            S3ObjectStore(source_bucket, "caches", endpoint_url=endpoint),
            S3ObjectStore(target_bucket, "caches", endpoint_url=endpoint),
            "ds",
            "v1",
            show_progress=False,
        )
    assert report.published
    assert sorted(report.copied_server_side) == sorted(part.name for part in built.parts)
    assert sorted(report.read_back) == sorted(part.name for part in built.parts)
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # one clear line, not one per part
    assert endpoint in warnings[0] and "CRC32" in warnings[0] and "moto[s3crc32c]" in warnings[0], warnings

    node = RemoteCacheStore(
        S3ObjectStore(target_bucket, "caches", endpoint_url=endpoint), tmp_path / "node", show_progress=False
    )
    published = node.remote_manifest("ds", "v1")
    assert published is not None and published.freshness == built.freshness
    # The manifest keeps the true CRC32C of every part (the source's), not the endpoint's.
    assert [part.crc32c for part in published.parts] == [part.crc32c for part in built.parts]
    reader: Any = node.open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)
    reader.close()


def test_a_copy_from_a_directory_to_an_endpoint_with_a_wrong_crc32c(crc32_server: S3Server, tmp_path: Path) -> None:
    """The README's "Trying S3" server, as a plain ``pip install 'moto[server]'`` gives it: a copy
    from a directory either publishes a cache that reads back exactly, or fails leaving nothing
    behind at the destination (no orphan part, no build lease)."""
    from yogacache.store.local import CacheStore

    shared = tmp_path / "shared"
    built = CacheStore(shared, part_size_bytes=100_000, show_progress=False).build("ds", "v1", dataset(N))
    bucket = crc32_server.new_bucket()
    target = S3ObjectStore(bucket, "caches", endpoint_url=crc32_server.endpoint_url)
    try:
        report = copy_cache(str(shared), target, "ds", "v1", show_progress=False)
    except Exception as error:  # noqa: BLE001 - either outcome is checked below
        print("refused:", error)
        assert [info.key for info in target.list("")] == [], "a failed copy left objects behind"
        raise
    assert report.published
    node = RemoteCacheStore(target, tmp_path / "node", show_progress=False)
    assert node.remote_manifest("ds", "v1").freshness == built.freshness  # type: ignore[union-attr]
    reader: Any = node.open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)
    reader.close()
