"""The object-store contract, run unchanged against every backend.

``TestObjectStoreContract`` is ONE class whose tests run against FileObjectStore (a directory),
S3ObjectStore (moto's S3 server, a subprocess) and GCSObjectStore (fake-gcs-server, a
subprocess). The canaries below prove each server really refuses a conditional create of an
existing object, so the publish tests that rely on it cannot pass vacuously; and one test
documents what fake-gcs-server does NOT enforce (``ifGenerationMatch`` on DELETE) and shows that
releasing a build lease does not depend on it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.cloud_helpers import FAST_RETRY, Cloud, unique
from yogacache.backends.base import ObjectChangedError, ObjectPin, ObjectStore, RemoteError
from yogacache.backends.files import FileObjectStore
from yogacache.backends.registry import open_backend
from yogacache.store.lease import Lease


@dataclass
class Backend:
    """One backend under test: a factory of stores that share one bucket (or directory)."""

    kind: str
    make: Callable[[str], ObjectStore]  # prefix -> store
    # fake-gcs-server ignores ifGenerationMatch on DELETE (see the documentation test below);
    # real GCS, moto and the filesystem backend refuse a delete conditional on a stale token.
    enforces_conditional_delete: bool

    def fresh(self) -> ObjectStore:
        return self.make(unique("prefix"))


@pytest.fixture(params=["file", "s3", "gcs", "azure"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    kind = request.param
    if kind == "file":
        root = tmp_path / "objects"
        return Backend(kind, lambda prefix: FileObjectStore(root / prefix), True)
    server = request.getfixturevalue(f"{kind}_server")
    cloud = Cloud(kind, server)
    bucket = cloud.new_bucket()
    return Backend(kind, lambda prefix: cloud.store(bucket, prefix), kind != "gcs")


class TestObjectStoreContract:
    """What RemoteCacheStore relies on, identical for the directory, S3 and GCS backends."""

    # -- small objects ------------------------------------------------------------------
    def test_missing_object_reads_as_none(self, backend: Backend) -> None:
        store = backend.fresh()
        assert store.read("nothing/here.json") is None
        assert store.read("top-level") is None

    def test_write_then_read_returns_bytes_and_token(self, backend: Backend) -> None:
        store = backend.fresh()
        token = store.write("a/b/c.json", b'{"x": 1}')
        assert isinstance(token, str) and token
        found = store.read("a/b/c.json")
        assert found is not None
        data, read_token = found
        assert data == b'{"x": 1}'
        assert read_token == token

    def test_overwrite_changes_content_and_token(self, backend: Backend) -> None:
        store = backend.fresh()
        first = store.write("k", b"one")
        second = store.write("k", b"two")
        assert first != second
        assert store.read("k") == (b"two", second)

    def test_binary_objects_round_trip(self, backend: Backend) -> None:
        store = backend.fresh()
        blob = bytes(range(256)) * 3
        store.write("bin", blob)
        assert store.read("bin")[0] == blob  # type: ignore[index]
        # Empty objects: see test_empty_object_round_trip and the emulator note below it.

    # -- conditional create ---------------------------------------------------------------
    def test_conditional_create_succeeds_when_absent(self, backend: Backend) -> None:
        store = backend.fresh()
        token = store.write("m.json", b"first", if_absent=True)
        assert token is not None
        assert store.read("m.json") == (b"first", token)

    def test_conditional_create_of_existing_object_is_refused(self, backend: Backend) -> None:
        store = backend.fresh()
        original = store.write("m.json", b"first", if_absent=True)
        assert store.write("m.json", b"second", if_absent=True) is None
        assert store.read("m.json") == (b"first", original)  # untouched

    def test_only_one_of_many_conditional_creates_wins(self, backend: Backend) -> None:
        import threading

        store = backend.fresh()
        results: list[Any] = []
        barrier = threading.Barrier(6)

        def contend(i: int) -> None:
            barrier.wait()
            results.append((i, store.write("winner", f"writer-{i}".encode(), if_absent=True)))

        threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [i for i, token in results if token is not None]
        assert len(winners) == 1
        assert store.read("winner")[0] == f"writer-{winners[0]}".encode()  # type: ignore[index]

    # -- conditional replace by token ----------------------------------------------------
    def test_conditional_replace_with_current_token(self, backend: Backend) -> None:
        store = backend.fresh()
        token = store.write("lease", b"v1")
        new_token = store.write("lease", b"v2", if_token=token)
        assert new_token is not None and new_token != token
        assert store.read("lease") == (b"v2", new_token)

    def test_conditional_replace_with_stale_token_is_refused(self, backend: Backend) -> None:
        store = backend.fresh()
        stale = store.write("lease", b"v1")
        current = store.write("lease", b"v2")
        assert store.write("lease", b"v3", if_token=stale) is None
        assert store.read("lease") == (b"v2", current)

    def test_conditional_replace_of_missing_object_is_refused(self, backend: Backend) -> None:
        store = backend.fresh()
        token = store.write("gone", b"v1")
        assert store.delete("gone")
        assert store.write("gone", b"v2", if_token=token) is None
        assert store.read("gone") is None

    # -- delete ----------------------------------------------------------------------------
    def test_delete(self, backend: Backend) -> None:
        store = backend.fresh()
        store.write("x/y", b"1")
        store.write("x/z", b"2")
        assert store.delete("x/y") is True
        assert store.read("x/y") is None
        assert store.read("x/z") == (b"2", store.read("x/z")[1])  # type: ignore[index]
        assert store.delete("x/y") is False  # already absent
        assert store.delete("never/existed") is False

    def test_conditional_delete_with_current_token(self, backend: Backend) -> None:
        store = backend.fresh()
        token = store.write("d", b"1")
        assert store.delete("d", if_token=token) is True
        assert store.read("d") is None

    def test_conditional_delete_with_stale_token(self, backend: Backend) -> None:
        store = backend.fresh()
        stale = store.write("d", b"1")
        current = store.write("d", b"2")
        deleted = store.delete("d", if_token=stale)
        if backend.enforces_conditional_delete:
            assert deleted is False
            assert store.read("d") == (b"2", current)
        else:
            # fake-gcs-server ignores ifGenerationMatch on DELETE: the emulator deletes anyway.
            # Nothing in yogacache relies on a conditional delete (lease release is a
            # conditional *write*; see test_lease_release_does_not_need_conditional_delete).
            assert deleted is True
            assert store.read("d") is None

    # -- files -------------------------------------------------------------------------------
    def test_upload_and_download_file_with_progress(self, backend: Backend, tmp_path: Path) -> None:
        store = backend.fresh()
        source = tmp_path / "source.bin"
        payload = os.urandom(3 * 1024 * 1024 + 17)
        source.write_bytes(payload)
        uploaded: list[int] = []
        store.upload_file(source, "parts/part-00000.mdb", uploaded.append)
        assert sum(uploaded) == len(payload)
        target = tmp_path / "target.bin"
        target.write_bytes(b"old content that must be overwritten" * 1000)
        downloaded: list[int] = []
        store.download_file("parts/part-00000.mdb", target, downloaded.append)
        assert target.read_bytes() == payload
        assert sum(downloaded) == len(payload)
        # An uploaded file is an ordinary object.
        assert store.read("parts/part-00000.mdb")[0] == payload  # type: ignore[index]

    def test_upload_and_download_without_progress(self, backend: Backend, tmp_path: Path) -> None:
        store = backend.fresh()
        source = tmp_path / "s"
        source.write_bytes(b"abc")
        store.upload_file(source, "f")
        store.download_file("f", tmp_path / "t")
        assert (tmp_path / "t").read_bytes() == b"abc"

    def test_download_of_missing_object_raises_file_not_found(self, backend: Backend, tmp_path: Path) -> None:
        store = backend.fresh()
        with pytest.raises(FileNotFoundError):
            store.download_file("no/such/part.mdb", tmp_path / "x")

    # -- list --------------------------------------------------------------------------------
    def test_list_with_prefixes(self, backend: Backend) -> None:
        store = backend.fresh()
        contents = {"a/b/1": b"1", "a/b/2": b"22", "a/c/3": b"333", "ab/4": b"4444", "top": b"55555"}
        for key, data in contents.items():
            store.write(key, data)
        everything = store.list("")
        assert [(i.key, i.size) for i in everything] == sorted(
            (key, len(data)) for key, data in contents.items()
        )
        assert sorted(i.key for i in store.list()) == sorted(contents)
        assert sorted(i.key for i in store.list("a/")) == ["a/b/1", "a/b/2", "a/c/3"]
        assert sorted(i.key for i in store.list("a/b/")) == ["a/b/1", "a/b/2"]
        # A prefix without a slash is a plain string prefix.
        assert sorted(i.key for i in store.list("a")) == ["a/b/1", "a/b/2", "a/c/3", "ab/4"]
        assert store.list("zzz/") == []

    def test_list_of_empty_store_is_empty(self, backend: Backend) -> None:
        assert backend.fresh().list("") == []

    def test_list_stays_inside_the_store_prefix(self, backend: Backend) -> None:
        name = unique("shared")
        store = backend.make(name)
        # A sibling whose prefix starts with the same characters, in the same bucket.
        sibling = backend.make(name + "-other")
        store.write("mine", b"1")
        sibling.write("theirs", b"2")
        assert [i.key for i in store.list("")] == ["mine"]
        assert [i.key for i in sibling.list("")] == ["theirs"]
        assert store.read("theirs") is None

    def test_store_at_the_root_of_the_bucket(self, backend: Backend) -> None:
        store = backend.make("")
        store.write("ds/v1/manifest.json", b"m")
        store.write("ds/v2/manifest.json", b"n")
        assert [(i.key, i.size) for i in store.list("")] == [("ds/v1/manifest.json", 1), ("ds/v2/manifest.json", 1)]
        assert [i.key for i in store.list("ds/v1/")] == ["ds/v1/manifest.json"]
        assert store.read("ds/v2/manifest.json")[0] == b"n"  # type: ignore[index]

    def test_url_names_the_location_without_secrets(self, backend: Backend) -> None:
        store = backend.fresh()
        url = store.url("a/b")
        scheme = {"file": "file://", "s3": "s3://", "gcs": "gs://", "azure": "az://"}[backend.kind]
        assert url.startswith(scheme) and url.endswith("a/b")
        assert "secret" not in url.lower() and "secret" not in repr(store).lower()


@pytest.mark.parametrize("kind", ["file", "s3", "azure"])
def test_empty_object_round_trip(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if kind == "file":
        store: Any = FileObjectStore(tmp_path / "objects")
    else:
        cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
        store = cloud.store(cloud.new_bucket(), "p")
    token = store.write("empty", b"")
    assert store.read("empty") == (b"", token)
    assert [(i.key, i.size) for i in store.list("")] == [("empty", 0)]


def test_fake_gcs_cannot_serve_a_ranged_read_of_an_empty_object(gcs_server: Any) -> None:
    """DOCUMENTS AN EMULATOR GAP: fake-gcs-server answers a ranged GET of an empty object with
    416 but without the ``Content-Range: bytes */0`` header real GCS sends, so the client's
    chunked download fails there. GCSObjectStore reads small objects (manifests, leases)
    unchunked, so its reads work on the emulator; LMDB parts are never empty.
    """
    from google.api_core import exceptions as gexc

    from yogacache.backends.gcs import GCSObjectStore

    client = gcs_server.client()
    bucket = client.bucket(gcs_server.new_bucket())
    bucket.blob("empty").upload_from_string(b"")
    assert bucket.blob("empty").download_as_bytes() == b""  # unchunked: fine
    with pytest.raises(gexc.RequestRangeNotSatisfiable):
        bucket.blob("empty", chunk_size=1 << 20).download_as_bytes()
    store = GCSObjectStore(bucket.name, "", retry=FAST_RETRY)
    found = store.read("empty")
    assert found is not None and found[0] == b""


# -- failures that are not "absent" ------------------------------------------------------------
def test_missing_s3_bucket_is_an_error_not_an_absent_object(s3_server: Any) -> None:
    cloud = Cloud("s3", s3_server)
    store = cloud.store(unique("no-such-bucket"), "caches", retry=FAST_RETRY)
    with pytest.raises(RemoteError) as raised:
        store.read("ds/v1/manifest.json")
    assert "bucket" in str(raised.value)


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_conditional_create_in_a_missing_bucket_is_an_error(kind: str, request: pytest.FixtureRequest) -> None:
    """A create-if-absent cannot fail its precondition with a 404 (absence IS the precondition):
    a 404 there means the bucket is missing, which must be an error, never "someone else holds
    it" (None) -- the lease loop would otherwise wait forever for a holder that does not exist."""
    cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
    store = cloud.store(unique("no-such-bucket"), "caches", retry=FAST_RETRY)
    with pytest.raises(RemoteError):
        store.write("ds/v1/build-lease.json", b"{}", if_absent=True)


def test_fake_gcs_does_not_say_which_is_missing_bucket_or_object(gcs_server: Any) -> None:
    """DOCUMENTS AN EMULATOR GAP: fake-gcs-server answers a media GET in a missing bucket with the
    same bare 404 "Not Found" as a missing object (real GCS says "The specified bucket does not
    exist."), so GCSObjectStore.read, which tells the two apart by that message, reads a missing
    bucket as a missing object on the emulator. Tests that need the distinction use S3."""
    from google.api_core import exceptions as gexc

    from yogacache.backends.gcs import GCSObjectStore

    client = gcs_server.client()
    with pytest.raises(gexc.NotFound) as raised:
        client.bucket(unique("no-such-bucket")).blob("x", chunk_size=1 << 20).download_as_bytes()
    assert "does not exist" not in str(raised.value).lower()
    assert GCSObjectStore(unique("no-such-bucket"), "", retry=FAST_RETRY).read("x") is None


def test_unreachable_endpoint_is_an_error_not_an_absent_object(s3_server: Any) -> None:
    from tests.servers import free_port
    from yogacache.backends.s3 import S3ObjectStore

    store = S3ObjectStore(
        "b",
        "p",
        endpoint_url=f"http://127.0.0.1:{free_port()}",  # nothing listens there
        access_key="AKIA-EXAMPLE",
        secret_key="very-secret-value-123",
        retry=FAST_RETRY,
        timeout=2,
    )
    with pytest.raises(RemoteError) as raised:
        store.read("ds/v1/manifest.json")
    assert "very-secret-value-123" not in str(raised.value)
    assert "s3://b/p/ds/v1/manifest.json" in str(raised.value)


def test_boto3_honours_aws_endpoint_url(s3_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint given: the standard AWS_ENDPOINT_URL variable points boto3 at the server."""
    from yogacache.backends.s3 import S3ObjectStore

    bucket = s3_server.new_bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    store = open_backend(f"s3://{bucket}/some/prefix")
    assert isinstance(store, S3ObjectStore)
    store.write("k", b"through AWS_ENDPOINT_URL")
    raw = s3_server.client().get_object(Bucket=bucket, Key="some/prefix/k")["Body"].read()
    assert raw == b"through AWS_ENDPOINT_URL"


def test_gcs_client_honours_storage_emulator_host(gcs_server: Any) -> None:
    """GCSObjectStore builds its own default client; STORAGE_EMULATOR_HOST points it at the emulator."""
    from yogacache.backends.gcs import GCSObjectStore

    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs_server.url
    bucket = gcs_server.new_bucket()
    store = open_backend(f"gs://{bucket}/some/prefix")
    assert isinstance(store, GCSObjectStore)
    store.write("k", b"through the emulator")
    raw = gcs_server.client().bucket(bucket).blob("some/prefix/k").download_as_bytes()
    assert raw == b"through the emulator"


# -- canaries: the servers really enforce conditional creates ---------------------------------
def test_canary_moto_rejects_conditional_create_of_existing_object(s3_server: Any) -> None:
    """With the server's own client: If-None-Match: * on an existing key is 412, content kept."""
    import botocore.exceptions

    client = s3_server.client()
    bucket = s3_server.new_bucket()
    client.put_object(Bucket=bucket, Key="manifest.json", Body=b"published")
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        client.put_object(Bucket=bucket, Key="manifest.json", Body=b"usurper", IfNoneMatch="*")
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert client.get_object(Bucket=bucket, Key="manifest.json")["Body"].read() == b"published"
    # ...and a replace conditional on a stale ETag is refused as well (lease takeover).
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        client.put_object(Bucket=bucket, Key="manifest.json", Body=b"x", IfMatch='"0123456789abcdef"')
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412


def test_canary_fake_gcs_rejects_conditional_create_of_existing_object(gcs_server: Any) -> None:
    """With the server's own client: ifGenerationMatch=0 on an existing object is 412, content kept."""
    from google.api_core import exceptions as gexc

    client = gcs_server.client()
    bucket = client.bucket(gcs_server.new_bucket())
    bucket.blob("manifest.json").upload_from_string(b"published")
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("manifest.json").upload_from_string(b"usurper", if_generation_match=0)
    assert bucket.blob("manifest.json").download_as_bytes() == b"published"
    blob = bucket.get_blob("manifest.json")
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("manifest.json").upload_from_string(b"x", if_generation_match=blob.generation + 1)
    assert bucket.blob("manifest.json").download_as_bytes() == b"published"


def test_canary_filesystem_link_refuses_existing_name(tmp_path: Path) -> None:
    """The directory backend's conditional create is link(2), which fails on an existing name."""
    (tmp_path / "existing").write_bytes(b"published")
    (tmp_path / "new").write_bytes(b"usurper")
    with pytest.raises(FileExistsError):
        os.link(tmp_path / "new", tmp_path / "existing")
    assert (tmp_path / "existing").read_bytes() == b"published"


# -- what the GCS emulator lacks, and why it does not matter -------------------------------------
def test_fake_gcs_does_not_enforce_if_generation_match_on_delete(gcs_server: Any) -> None:
    """DOCUMENTS AN EMULATOR GAP: fake-gcs-server deletes an object even when the request's
    ifGenerationMatch names another generation (real GCS answers 412 and keeps it).

    If this test starts failing, the emulator has been fixed: tighten
    TestObjectStoreContract.test_conditional_delete_with_stale_token for GCS.
    """
    client = gcs_server.client()
    bucket = client.bucket(gcs_server.new_bucket())
    blob = bucket.blob("lease.json")
    blob.upload_from_string(b"held by someone")
    wrong_generation = blob.generation + 12345
    bucket.blob("lease.json").delete(if_generation_match=wrong_generation)  # no 412 raised
    assert bucket.get_blob("lease.json") is None  # ...and the object is gone


def test_lease_release_does_not_need_conditional_delete(gcs_server: Any) -> None:
    """On the emulator that ignores conditional DELETE, releasing a lease that another node has
    meanwhile taken over leaves the other node's lease intact: release is a write conditional
    on the releaser's own generation (enforced by the emulator), never a delete."""
    from yogacache.backends.gcs import GCSObjectStore

    bucket = gcs_server.new_bucket()
    store = GCSObjectStore(bucket, "caches")
    key = "ds/v1/build-lease.json"

    # A normal release leaves an expired lease object behind rather than deleting it.
    lease = Lease(store, key, "build-1", duration=60)
    acquired, _ = lease.try_acquire()
    assert acquired
    lease.release()
    released = Lease.read(store, key)
    assert released is not None and released.expires_at == 0.0 and released.build_id == "build-1"

    # A node takes the lease; while it holds it, another node overwrites it (a takeover after
    # our lease looked stale to it). Our release must not clobber or delete its lease.
    mine = Lease(store, key, "build-2", duration=60)
    acquired, previous = mine.try_acquire()
    assert acquired and previous is not None and previous.build_id == "build-1"
    theirs = json.dumps({"owner": "other-node:42", "build_id": "build-3", "expires_at": time.time() + 60})
    current = store.read(key)
    assert current is not None
    assert store.write(key, theirs.encode(), if_token=current[1]) is not None
    mine.release()
    after = Lease.read(store, key)
    assert after is not None
    assert (after.owner, after.build_id) == ("other-node:42", "build-3")
    assert after.expires_at > time.time()


@pytest.mark.parametrize("kind", ["file", "s3", "gcs", "azure"])
def test_exactly_one_contender_takes_over_a_stale_lease(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    import threading

    if kind == "file":
        store: Any = FileObjectStore(tmp_path / "objects")
    else:
        cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
        store = cloud.store(cloud.new_bucket(), "caches")
    key = "ds/v1/build-lease.json"
    # A dead holder's lease (it promised renewals within 0.5 s); its wall-clock expiry is not
    # trusted: each contender first watches the lease stay unchanged for that long itself.
    dead = {"owner": "dead:1", "build_id": "old", "expires_at": time.time() - 30, "duration": 0.5}
    store.write(key, json.dumps(dead).encode())
    leases = [Lease(store, key, f"build-{i}", duration=60) for i in range(5)]
    results: list[bool] = [False] * 5
    barrier = threading.Barrier(5)

    def contend(i: int) -> None:
        assert leases[i].try_acquire()[0] is False  # first sight: not known to be stale yet
        time.sleep(0.6)
        barrier.wait()
        results[i] = leases[i].try_acquire()[0]

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert sum(results) == 1
        winner = results.index(True)
        state = Lease.read(store, key)
        assert state is not None and state.build_id == f"build-{winner}"
        assert state.expires_at > time.time()
    finally:
        for lease in leases:
            lease.release()


def test_a_shared_directory_adopts_a_handed_over_file_by_linking_and_copies_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ray task's finished part is linked into a shared directory on the same filesystem (no
    second write of its bytes); ``upload_file`` always copies (the caller keeps its file)."""
    import errno

    import yogacache.backends.files as files

    store = FileObjectStore(tmp_path / "bucket")
    source = tmp_path / "part.mdb"
    source.write_bytes(os.urandom(3 << 20))
    sizes: list[int] = []
    store.adopt_file(source, "a/adopted.mdb", sizes.append)
    store.upload_file(source, "a/copied.mdb")
    adopted, copied = tmp_path / "bucket/a/adopted.mdb", tmp_path / "bucket/a/copied.mdb"
    assert adopted.stat().st_ino == source.stat().st_ino and sum(sizes) == 3 << 20
    assert copied.stat().st_ino != source.stat().st_ino and copied.read_bytes() == source.read_bytes()

    def cross_device(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(files.os, "link", cross_device)
    store.adopt_file(source, "a/other-filesystem.mdb")
    other = tmp_path / "bucket/a/other-filesystem.mdb"
    assert other.stat().st_ino != source.stat().st_ino and other.read_bytes() == source.read_bytes()
    assert [info.key for info in store.list("a/")] == ["a/adopted.mdb", "a/copied.mdb", "a/other-filesystem.mdb"]


class TestPinnedReadsContract:
    """What object sources read through (``PinnedObjectStore``): HEAD and LIST with the tokens that
    pin a version, and reads conditional on them; identical for every backend."""

    def test_head_of_missing_object_is_none(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        assert store.head("nothing/here.bin") is None

    def test_head_gives_size_and_a_pin_and_finds_that_version(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        store.write("d/a.bin", b"0123456789")
        pin = store.head("d/a.bin")
        assert isinstance(pin, ObjectPin) and pin.key == "d/a.bin" and pin.size == 10
        assert pin.etag or pin.generation is not None or pin.mtime_ns is not None
        again = store.head("d/a.bin", version_id=pin.version_id, generation=pin.generation)
        assert again is not None and (again.size, again.etag, again.generation) == (10, pin.etag, pin.generation)
        store.write("d/a.bin", b"changed, longer")
        changed = store.head("d/a.bin")
        assert changed is not None and changed.size == 15
        assert (changed.etag, changed.generation, changed.mtime_ns) != (pin.etag, pin.generation, pin.mtime_ns)

    def test_head_and_list_count_their_requests(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        store.write("d/a.bin", b"a")
        before = store.metadata_requests
        store.head("d/a.bin")
        store.head("d/missing.bin")
        store.list_page("d/")
        # One per request; the directory backend sends none.
        assert store.metadata_requests - before == (0 if backend.kind == "file" else 3)
        assert isinstance(store.served_versions, dict)

    def test_list_page_lists_a_plain_prefix_in_key_order_with_pins(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        for key in ["d/b.bin", "d/a.bin", "d/ab.bin", "d/sub/c.bin", "e/x.bin"]:
            store.write(key, key.encode())
        page = store.list_page("d/")
        assert [pin.key for pin in page.objects] == ["d/a.bin", "d/ab.bin", "d/b.bin", "d/sub/c.bin"]
        assert not page.more and page.token is None
        assert [pin.size for pin in page.objects] == [len(pin.key) for pin in page.objects]
        assert all(pin == store.head(pin.key) for pin in page.objects)  # the pins HEAD gives
        assert [pin.key for pin in store.list_page("d/a").objects] == ["d/a.bin", "d/ab.bin"]
        assert store.list_page("f/").objects == []

    def test_list_page_starts_at_a_key_and_pages_on(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        keys = [f"d/{i:02d}.bin" for i in range(5)]
        for key in keys:
            store.write(key, b"x")
        assert [pin.key for pin in store.list_page("d/", start_at="d/02.bin").objects] == keys[2:]
        assert [pin.key for pin in store.list_page("d/", start_at="d/025").objects] == keys[3:]
        first = store.list_page("d/", page_size=2)
        assert [pin.key for pin in first.objects] == keys[:2] and first.more and first.token is not None
        second = store.list_page("d/", page_size=2, token=first.token)
        assert [pin.key for pin in second.objects] == keys[2:4] and second.more
        third = store.list_page("d/", page_size=2, token=second.token)
        assert [pin.key for pin in third.objects] == keys[4:] and not third.more
        assert [pin.key for pin in store.list_pinned("d/")] == keys

    def test_pinned_reads_return_the_bytes(self, backend: Backend) -> None:
        store: Any = backend.fresh()
        data = bytes(range(256)) * 40
        store.write("obj.bin", data)
        pin = store.head("obj.bin")
        assert store.read_range(pin, 2, 5) == data[2:5]
        assert store.read_range(pin, len(data) - 3, len(data)) == data[-3:]
        stream = store.open_stream(pin)
        try:
            assert stream.read(10) == data[:10] and stream.read() == data[10:] and stream.read(1) == b""
        finally:
            stream.close()
        ranged = store.open_ranged(pin)
        try:
            ranged.seek(-7, os.SEEK_END)
            assert ranged.read() == data[-7:]
            ranged.seek(100)
            assert ranged.read(5) == data[100:105]
        finally:
            ranged.close()

    @pytest.mark.parametrize("change", ["overwritten", "deleted"])
    def test_a_read_of_a_changed_object_fails(self, backend: Backend, change: str) -> None:
        store: Any = backend.fresh()
        store.write("obj.bin", b"first version")
        pin = store.head("obj.bin")
        if change == "deleted":
            store.delete("obj.bin")
        else:
            store.write("obj.bin", b"the second version")
        with pytest.raises(ObjectChangedError) as caught:
            store.read_range(pin, 0, 5)
        assert "obj.bin" in str(caught.value)
        assert caught.value.deleted or change == "overwritten"  # an old version may be gone too (fake GCS)
        with pytest.raises(ObjectChangedError):
            stream = store.open_stream(pin)
            try:
                stream.read()
            finally:
                stream.close()
