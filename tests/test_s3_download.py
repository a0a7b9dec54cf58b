"""A part's download from S3 (``S3ObjectStore.download_file(size=...)``), against moto's server:
one ranged GET per part and no HEAD (the manifest knows the size); an object of another size
refused before a byte is written; an object larger than ``multipart_bytes`` fetched in ranges
at once, each pinned to the first answer's ETag, so that a replacement during the download is
an error, never a file of two versions.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, HttpRequests
from yogacache.backends.base import ObjectSizeError, RemoteError, TransferCancelled
from yogacache.backends.s3 import S3ObjectStore
from yogacache.store.remote import RemoteCacheStore

MiB = 1 << 20


def _objects(s3_server: Any, bucket: str, **options: Any) -> S3ObjectStore:
    return S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url, **options)


def _payload(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_a_streamed_part_is_one_ranged_get_and_no_head(s3_server: Any, tmp_path: Path) -> None:
    bucket = Cloud("s3", s3_server).new_bucket()
    records = [{"i": np.int64(i), "x": np.full(64 << 10, i % 251, np.uint8)} for i in range(40)]
    built = RemoteCacheStore(
        _objects(s3_server, bucket), tmp_path / "builder", part_size_bytes=512 << 10, show_progress=False
    ).build("ds", "v1", records)
    assert len(built.parts) >= 4

    objects = _objects(s3_server, bucket)
    http = HttpRequests().attach(objects)
    reader = RemoteCacheStore(objects, tmp_path / "node", show_progress=False, streaming=True).open("ds", "v1")
    try:
        elements = reader.read_elements(range(40))
    finally:
        reader.close()
    assert [int(element["i"]) for element in elements] == list(range(40))
    assert all((element["x"] == i % 251).all() for i, element in enumerate(elements))
    for part in built.parts:
        sent = [request for request in http.sent if part.name in request]
        assert len(sent) == 1 and sent[0].startswith("GET "), (part.name, sent)
    assert not [request for request in http.sent if request.startswith("HEAD ")], http.sent


@pytest.mark.parametrize("found", [0, 3 * MiB - 1, 3 * MiB + 1, 5 * MiB])
def test_an_object_of_another_size_is_refused_before_a_byte_is_written(
    s3_server: Any, tmp_path: Path, found: int
) -> None:
    bucket = Cloud("s3", s3_server).new_bucket()
    objects = _objects(s3_server, bucket, multipart_bytes=1 * MiB)
    s3_server.client().put_object(Bucket=bucket, Key="caches/part", Body=_payload(found, 1))
    http = HttpRequests().attach(objects)
    written: list[int] = []
    target = tmp_path / "part"

    with pytest.raises(ObjectSizeError) as raised:
        objects.download_file("part", target, written.append, size=3 * MiB)
    assert raised.value.actual == found and raised.value.expected == 3 * MiB
    assert f"holds {found} bytes" in str(raised.value) and "caches/part" in str(raised.value)
    assert sum(written) == 0 and (not target.exists() or target.stat().st_size == 0)
    assert len(http.sent) == 1, http.sent  # refused on the first answer: never retried, nothing more asked


@pytest.mark.parametrize("size", [1, MiB - 1, MiB, MiB + 1, 3 * MiB + 12345])
def test_ranges_at_once_give_the_object_byte_for_byte(s3_server: Any, tmp_path: Path, size: int) -> None:
    bucket = Cloud("s3", s3_server).new_bucket()
    objects = _objects(s3_server, bucket, multipart_bytes=MiB)
    data = _payload(size, size)
    s3_server.client().put_object(Bucket=bucket, Key="caches/part", Body=data)
    http = HttpRequests().attach(objects)
    counted: list[int] = []

    objects.download_file("part", tmp_path / "part", counted.append, size=size)
    assert (tmp_path / "part").read_bytes() == data
    assert sum(counted) == size
    ranges = -(-max(size - MiB, 0) // MiB) if size > MiB else 0
    assert len(http.sent) == 1 + ranges and all(request.startswith("GET ") for request in http.sent)


def test_an_object_replaced_during_a_ranged_download_is_an_error_not_a_mix(s3_server: Any, tmp_path: Path) -> None:
    bucket = Cloud("s3", s3_server).new_bucket()
    objects = _objects(s3_server, bucket, multipart_bytes=MiB)
    client = s3_server.client()
    old, new = _payload(3 * MiB, 1), _payload(3 * MiB, 2)
    client.put_object(Bucket=bucket, Key="caches/part", Body=old)
    replaced: list[bool] = []

    def replace_after_the_first_range(count: int) -> None:
        if not replaced:  # the first range is in: the object changes before the others are asked
            client.put_object(Bucket=bucket, Key="caches/part", Body=new)
            replaced.append(True)

    with pytest.raises(RemoteError) as raised:
        objects.download_file("part", tmp_path / "part", replace_after_the_first_range, size=3 * MiB)
    assert "caches/part" in str(raised.value)
    assert "412" in str(raised.value) or "Precondition" in str(raised.value)


def test_a_stop_asked_by_the_progress_callback_ends_every_range(s3_server: Any, tmp_path: Path) -> None:
    """A closed reader's fetch ahead stops (its callback raises TransferCancelled) in the middle of
    a ranged download: the error comes out, and no range writes after the call returned."""
    bucket = Cloud("s3", s3_server).new_bucket()
    objects = _objects(s3_server, bucket, multipart_bytes=MiB)
    s3_server.client().put_object(Bucket=bucket, Key="caches/part", Body=_payload(6 * MiB, 3))
    seen: list[int] = []

    def stop_after_two_mib(count: int) -> None:
        seen.append(count)
        if sum(seen) > 2 * MiB:
            raise TransferCancelled("stopped")

    with pytest.raises(TransferCancelled):
        objects.download_file("part", tmp_path / "part", stop_after_two_mib, size=6 * MiB)
    size_after = (tmp_path / "part").stat().st_size
    total_after = sum(seen)
    time.sleep(0.5)
    assert (tmp_path / "part").stat().st_size == size_after and sum(seen) == total_after
