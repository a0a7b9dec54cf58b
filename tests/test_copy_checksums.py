"""The CRC32C primitives of the backends, and canaries for what the emulators do differently from
the clouds (see /work/shared/EMULATORS.md).

What the copy relies on, checked here on the real servers:
- S3 CopyObject / GCS rewrite with CRC32C report the true CRC32C of the copied bytes.
- A multipart stream (S3 FULL_OBJECT CRC32C) and a multipart server-side copy (UploadPartCopy)
  of a part larger than one chunk arrive whole and report the whole object's CRC32C.
Where moto differs from S3, a canary asserts moto's behaviour, so that a moto upgrade that fixes
it is noticed (and the tests can then check more).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, unique, without_crc32c
from yogacache.backends.files import FileObjectStore
from yogacache.format.checksum import crc32c_of
from yogacache.store.copy import copy_cache
from yogacache.store.remote import RemoteCacheStore

BIG = 18 << 20  # past one 16 MiB chunk: multipart paths


def big_dataset() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.integers(0, 255, size=1 << 20, dtype=np.uint8) for _ in range(BIG >> 20)]


def test_the_directory_backend_computes_the_checksum(tmp_path: Path) -> None:
    store = FileObjectStore(tmp_path)
    store.write("a/b", b"hello")
    found = store.checksum("a/b")
    assert found is not None and found.size == 5 and found.crc32c == crc32c_of(b"hello")
    assert store.checksum("a/missing") is None
    store.write_chunks("a/c", iter([b"he", b"llo"]), 5)
    assert store.read("a/c") is not None and store.read("a/c")[0] == b"hello"  # type: ignore[index]
    assert b"".join(store.read_chunks("a/c", 2)) == b"hello"
    with pytest.raises(FileNotFoundError):
        list(store.read_chunks("a/missing"))


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_cloud_checksums_are_read_without_the_bytes(kind: str, request: pytest.FixtureRequest) -> None:
    cloud = Cloud(kind, request.getfixturevalue("s3_server" if kind == "s3" else "gcs_server"))
    bucket = cloud.new_bucket()
    store = cloud.store(bucket, "p")
    data = np.random.default_rng(1).bytes(300_000)
    store.write_chunks("obj", iter([data[:100_000], data[100_000:]]), len(data))
    found = store.checksum("obj")
    assert found is not None and found.size == len(data) and found.crc32c == crc32c_of(data)
    assert b"".join(store.read_chunks("obj", 70_000)) == data
    assert store.checksum("missing") is None
    with pytest.raises(FileNotFoundError):
        list(store.read_chunks("missing"))
    # An object stored without a CRC32C (S3's default is another checksum) gets one on request.
    cloud.raw_put(bucket, "p/plain", data)
    if kind == "s3":
        assert store.checksum("plain").crc32c is None
    ensured = store.ensure_checksum("plain")
    assert ensured is not None and ensured.crc32c == crc32c_of(data)
    assert cloud.raw_get(bucket, "p/plain") == data


@pytest.mark.slow
@pytest.mark.parametrize(
    ("source_kind", "target_kind"),
    [("s3", "s3b"), ("s3", "s3"), ("s3", "gcs"), ("gcs", "s3"), ("s3", "azure"), ("azure", "azure")],
)
def test_parts_larger_than_a_chunk_copy_whole(
    source_kind: str, target_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    servers = {"s3": "s3_server", "s3b": "s3_server_b", "gcs": "gcs_server", "azure": "azure_server"}
    source = Cloud("s3" if source_kind == "s3b" else source_kind, request.getfixturevalue(servers[source_kind]))
    target = Cloud("s3" if target_kind == "s3b" else target_kind, request.getfixturevalue(servers[target_kind]))
    source_bucket, target_bucket = source.new_bucket(), target.new_bucket()
    objects = source.store(source_bucket, "c")
    manifest = (
        RemoteCacheStore(objects, tmp_path / "b", part_size_bytes=64 << 20, show_progress=False)
        .get_or_build("big", "v1", big_dataset)
        .manifest
    )
    assert len(manifest.parts) == 1 and manifest.parts[0].size_bytes > BIG
    destination: Any = target.store(target_bucket, "c")
    if target_kind == "s3":
        destination.copy_multipart_bytes = 8 << 20  # server-side copies use UploadPartCopy
    report = copy_cache(objects, destination, "big", "v1", show_progress=False)
    assert report.published
    assert bool(report.copied_server_side) == (source_kind == target_kind)
    key = f"c/big/v1/{manifest.build_id}-{manifest.parts[0].name}"
    data = target.raw_get(target_bucket, key)
    assert len(data) == manifest.parts[0].size_bytes
    found = destination.checksum(key[2:])
    assert found is not None and found.crc32c == crc32c_of(data)


# -- canaries: what the emulators do ------------------------------------------------------------
def test_canary_moto_stores_a_wrong_client_crc32c_unchecked(s3_server: Any) -> None:
    """Real S3 refuses a PutObject whose x-amz-checksum-crc32c does not match the body (BadDigest);
    moto stores and reports the wrong value. So no test here can show S3 catching a corrupted
    upload by its checksum: the tests alter stored bytes instead, which both catch."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    wrong = base64.b64encode(b"\0\0\0\0").decode()
    client.put_object(Bucket=bucket, Key="k", Body=b"data", ChecksumAlgorithm="CRC32C", ChecksumCRC32C=wrong)
    head = client.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == wrong != crc32c_of(b"data")


def test_canary_moto_full_object_multipart_computes_the_crc32c_but_accepts_a_wrong_one(s3_server: Any) -> None:
    """S3 computes a FULL_OBJECT multipart CRC32C and refuses a completion whose CRC32C differs
    (BadDigest); moto (5.2, with the crc32c module) computes the true value too but accepts the
    wrong one silently. So the multipart stream's checksum is tested for real (it is the
    server's), but not S3's refusal of a wrong one. (A *composite* multipart CRC32C, without
    ChecksumType=FULL_OBJECT, is no object CRC32C on either: EMULATORS.md.)"""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    key = unique("mp")
    upload = client.create_multipart_upload(
        Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32C", ChecksumType="FULL_OBJECT"
    )["UploadId"]
    body = b"x" * (5 << 20)
    part = client.upload_part(
        Bucket=bucket,
        Key=key,
        UploadId=upload,
        PartNumber=1,
        Body=body,
        ChecksumAlgorithm="CRC32C",
        ChecksumCRC32C=crc32c_of(body),
    )
    wrong = base64.b64encode(b"\1\2\3\4").decode()
    client.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload,
        ChecksumCRC32C=wrong,
        ChecksumType="FULL_OBJECT",
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"], "ChecksumCRC32C": crc32c_of(body)}]},
    )
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == crc32c_of(body) != wrong
    assert head["ChecksumType"] == "FULL_OBJECT"


def test_canary_moto_upload_part_copy_reports_no_part_checksum(s3_server: Any) -> None:
    """S3's UploadPartCopy into a CRC32C multipart upload returns the part's CRC32C; moto returns
    none (the copy completes without part checksums there)."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="src", Body=b"y" * 1000)
    upload = client.create_multipart_upload(Bucket=bucket, Key="dst", ChecksumAlgorithm="CRC32C")["UploadId"]
    result = client.upload_part_copy(
        Bucket=bucket, Key="dst", UploadId=upload, PartNumber=1, CopySource={"Bucket": bucket, "Key": "src"}
    )["CopyPartResult"]
    assert "ChecksumCRC32C" not in result
    client.abort_multipart_upload(Bucket=bucket, Key="dst", UploadId=upload)


def test_canary_moto_copy_object_computes_the_true_crc32c(s3_server: Any) -> None:
    """What the server-side S3 copy relies on: CopyObject with ChecksumAlgorithm=CRC32C makes the
    server compute the CRC32C of the copy (moto needs the crc32c module for it, else it reports a
    CRC32 under the CRC32C name)."""
    client = s3_server.client()
    bucket = s3_server.new_bucket()
    data = b"z" * 12345
    client.put_object(Bucket=bucket, Key="src", Body=data)
    client.copy_object(
        Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"}, ChecksumAlgorithm="CRC32C"
    )
    head = client.head_object(Bucket=bucket, Key="dst", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == crc32c_of(data)


def test_canary_fake_gcs_reports_the_true_crc32c_after_a_rewrite(gcs_server: Any) -> None:
    client = gcs_server.client()
    bucket = client.bucket(gcs_server.new_bucket())
    data = b"w" * 54321
    bucket.blob("src").upload_from_string(data)
    token, _, _ = bucket.blob("dst").rewrite(bucket.blob("src"))
    assert token is None
    assert bucket.get_blob("dst").crc32c == crc32c_of(data)


# -- the manifest field -----------------------------------------------------------------------
def _manifest_bytes(tmp_path: Path) -> bytes:
    from yogacache.store.local import CacheStore

    store = CacheStore(tmp_path / "c", show_progress=False)
    store.get_or_build("m", "v1", lambda: list(range(50)))
    return without_crc32c((store.cache_dir("m", "v1") / "manifest.json").read_bytes())


def test_a_manifest_without_crc32c_keeps_its_bytes_and_one_with_it_round_trips(tmp_path: Path) -> None:
    import dataclasses
    import json

    from yogacache.format.manifest import Manifest

    data = _manifest_bytes(tmp_path)
    manifest = Manifest.from_bytes(data, "test")
    assert b"crc32c" not in data and manifest.to_bytes() == data  # unchanged for older releases
    with_crc = dataclasses.replace(
        manifest, parts=tuple(dataclasses.replace(p, crc32c=crc32c_of(b"x")) for p in manifest.parts)
    )
    again = Manifest.from_bytes(with_crc.to_bytes(), "test")
    assert again == with_crc and again.parts[0].crc32c == crc32c_of(b"x")
    assert again.content_json() == manifest.content_json()  # the same cache, part for part
    raw = json.loads(with_crc.to_bytes())
    raw["parts"][0]["crc32c"] = "not-a-crc"
    from yogacache.errors import CorruptCacheError

    with pytest.raises(CorruptCacheError, match="field 'crc32c' is not a base64 CRC32C"):
        Manifest.from_bytes(json.dumps(raw).encode(), "test")
