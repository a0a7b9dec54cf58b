"""Every read bounded by what is known (issue 33, item 2; item 4's lease durations).

- A part object larger (or smaller) than its manifest says is refused as its download starts,
  never written past the manifest's size (a node process under ``RLIMIT_FSIZE`` shows it), never
  retried, and leaves nothing on the node; the published cache stays whole. Streamed parts and
  whole copies (``pull``) alike, on directories, moto S3, fake-gcs-server and Azurite.
- Small objects (manifests, build leases) are read through one capped read: an oversized lease
  costs a waiter no more than the cap (tracemalloc), and is taken over like an unreadable one.
- A lease claiming an absurd duration (1e300, infinity) is taken over after ``MAX_LEASE_SECONDS``;
  its fields are checked in one place (a ``released: "no"`` is no release).
- Tar entries: links, directories, pax and GNU long-name headers never allocate what they
  declare; negative sizes are refused naming archive and member; reads take the exact size, never
  "the rest of the stream"; a member name that is not UTF-8 is refused in one line naming both.
"""

from __future__ import annotations

import errno
import gc
import gzip
import io
import json
import logging
import os
import re
import struct
import tarfile
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, finish, python_env, start_python
from tests.sources_helpers import cache_files, cache_from, read_back, tar_bytes
from yogacache.backends.base import ObjectSizeError, read_capped
from yogacache.backends.files import FileObjectStore
from yogacache.errors import ConfigError, CorruptCacheError
from yogacache.sources import CorruptSourceError, from_url
from yogacache.sources.formats import MAX_HEADER_BYTES
from yogacache.store import keys, lease
from yogacache.store.lease import LEASE_NAME, MAX_LEASE_BYTES, MAX_LEASE_SECONDS, Lease
from yogacache.store.remote import RemoteCacheStore

KINDS = ["file", "s3", "gcs", "azure"]
PREFIX = "caches"
RECORDS = 48
PART_BYTES = 32 << 10
EXCESS = 4 << 20  # what an oversized part object holds beyond its part
FSIZE_LIMIT = 1 << 20  # a node process may write no larger file: more than a part, less than the excess


class Bucket:
    """One bucket (or directory) of one kind, with raw access that bypasses yogacache."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind = kind
        if kind == "file":
            self.root = tmp_path / "bucket"
            self.cloud = None
            self.name = str(self.root)
        else:
            self.cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
            self.name = self.cloud.new_bucket()

    def store(self) -> Any:
        if self.cloud is None:
            return FileObjectStore(self.root)
        return self.cloud.store(self.name, PREFIX)

    def raw_key(self, key: str) -> str:
        return key if self.cloud is None else f"{PREFIX}/{key}"

    def get(self, key: str) -> bytes:
        if self.cloud is None:
            return (self.root / key).read_bytes()
        return self.cloud.raw_get(self.name, self.raw_key(key))

    def put(self, key: str, data: bytes) -> None:
        if self.cloud is None:
            (self.root / key).write_bytes(data)
        else:
            self.cloud.raw_put(self.name, self.raw_key(key), data)

    def env(self) -> dict[str, str]:
        return self.cloud.node_env() if self.cloud is not None else python_env()


@pytest.fixture(params=KINDS)
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Bucket:
    return Bucket(request.param, request, tmp_path)


def records(n: int = RECORDS) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(1024, i, np.int32)} for i in range(n)]


def node_files(root: Path) -> list[str]:
    """Every file a node's local root holds but lock files and the budget's bookkeeping."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not path.name.endswith((".lock", ".json"))
    )


# -- part downloads -----------------------------------------------------------------------------
NODE = r"""
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
limit = int(sys.argv[5])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from tests.cloud_helpers import Cloud, HttpRequests
from yogacache.backends.files import FileObjectStore
from yogacache.store.remote import RemoteCacheStore
kind, bucket, root, mode = sys.argv[1:5]
victim_key, victim_record = sys.argv[6], int(sys.argv[7])
objects = FileObjectStore(bucket) if kind == "file" else Cloud.from_environment(kind).store(bucket, "caches")
http = HttpRequests().attach(objects) if kind != "file" else None
node = RemoteCacheStore(objects, root, streaming=mode == "stream", show_progress=False)
out = {"error": None}
try:
    if mode == "stream":
        reader = node.open("ds", "v1")
        out["first"] = int(reader[0]["i"])
        reader[victim_record]
    else:
        node.pull("ds", "v1")
except Exception as error:
    out.update(error=type(error).__name__, message=str(error))
if http is not None:
    out["victim_requests"] = [r for r in http.sent if victim_key.rsplit("/", 1)[-1] in r]
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["stream", "pull"])
@pytest.mark.parametrize("damage", ["larger", "smaller"])
def test_a_part_object_of_another_size_is_refused_unwritten_and_never_retried(
    bucket: Bucket, tmp_path: Path, mode: str, damage: str
) -> None:
    builder = RemoteCacheStore(bucket.store(), tmp_path / "builder", part_size_bytes=PART_BYTES, show_progress=False)
    manifest = builder.get_or_build("ds", "v1", records).manifest
    assert len(manifest.parts) >= 3
    victim = manifest.parts[1]
    key = keys.part_key(manifest, victim)
    good = bucket.get(key)
    assert len(good) == victim.size_bytes
    bad = good + bytes(EXCESS) if damage == "larger" else good[: len(good) // 2]
    bucket.put(key, bad)

    node_root = tmp_path / "node"
    process = start_python(
        NODE,
        bucket.kind,
        bucket.name,
        str(node_root),
        mode,
        str(FSIZE_LIMIT),
        key,
        str(victim.first_record),
        env=bucket.env(),
    )
    out = finish(process, timeout=120)

    # One integrity error naming the cache, the part and both sizes (not an EFBIG retried five times).
    assert out["error"] == "CorruptCacheError", out
    message = out["message"]
    for text in (victim.name, "ds:v1", f"holds {len(bad)} bytes", f"manifest says {victim.size_bytes}", "not retried"):
        assert text in message, (text, message)
    if "victim_requests" in out:
        # One ranged GET (a HEAD first where the backend asks).
        assert len(out["victim_requests"]) <= 2, out["victim_requests"]
    if mode == "stream":
        assert out["first"] == 0  # the other parts stream as before
    # Nothing of the refused part on the node: no part, no temporary file; a pull left no copy.
    left = node_files(node_root)
    assert not [name for name in left if victim.name in name], left
    if mode == "pull":
        assert left == [], left

    # The published cache is untouched: with the part's bytes back, the node reads every record.
    bucket.put(key, good)
    reader = RemoteCacheStore(bucket.store(), node_root, show_progress=False).pull("ds", "v1")
    try:
        assert [int(reader[i]["i"]) for i in range(len(reader))] == list(range(RECORDS))
    finally:
        reader.close()


def test_a_download_asked_for_a_size_writes_no_more_than_it(bucket: Bucket, tmp_path: Path) -> None:
    """The backend contract: ``download_file(size=...)`` refuses an object of another size with
    ObjectSizeError naming both sizes, and the file it wrote (if any) holds at most ``size``."""
    objects = bucket.store()
    objects.write("big", bytes(range(256)) * 64)  # 16 KiB
    target = tmp_path / "got"
    with pytest.raises(ObjectSizeError, match=r"holds 16384 bytes, where 2048 were expected") as raised:
        objects.download_file("big", target, size=2048)
    assert raised.value.actual == 16384 and isinstance(raised.value, CorruptCacheError)  # an integrity error
    assert not target.exists() or target.stat().st_size <= 2048
    objects.download_file("big", target, size=16384)
    assert target.read_bytes() == bytes(range(256)) * 64


EFBIG_NODE = r"""
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
from tests.cloud_helpers import Cloud, HttpRequests
kind, bucket, target = sys.argv[1:4]
objects = Cloud.from_environment(kind).store(bucket, "caches")
http = HttpRequests().attach(objects)
out = {"error": None}
try:
    objects.download_file("big", target)
except Exception as error:
    out.update(error=type(error).__name__, errno=getattr(error, "errno", None), message=str(error))
out["gets"] = len([r for r in http.sent if r.startswith("GET") and "big" in r])
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_a_file_size_limit_of_this_node_is_not_retried(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``ulimit -f`` (EFBIG) is this node's limit, as a full disk is: retrying the download cannot
    cure it (it was retried five times, each attempt writing up to the limit again)."""
    bucket = Bucket(kind, request, tmp_path)
    bucket.store().write("big", bytes(4 << 20))
    out = finish(start_python(EFBIG_NODE, kind, bucket.name, str(tmp_path / "got"), env=bucket.env()), timeout=120)
    assert out["error"] == "OSError" and out["errno"] == errno.EFBIG, out
    assert out["gets"] == 1, out


@pytest.mark.parametrize("damage", ["larger", "smaller"])
def test_a_streamed_copy_stops_at_the_parts_size(tmp_path: Path, damage: str) -> None:
    """A copy streams parts through this process (directory to directory here): a source part
    object of another size than its manifest says is refused naming the part and both sizes,
    and the destination keeps nothing of it."""
    from yogacache.store.copy import copy_cache

    source = FileObjectStore(tmp_path / "source")
    builder = RemoteCacheStore(source, tmp_path / "builder", part_size_bytes=PART_BYTES, show_progress=False)
    manifest = builder.get_or_build("ds", "v1", records).manifest
    assert all(part.crc32c for part in manifest.parts)  # so the copy streams, checking as it goes
    victim = manifest.parts[1]
    path = tmp_path / "source" / keys.part_key(manifest, victim)
    good = path.read_bytes()
    path.write_bytes(good + bytes(EXCESS) if damage == "larger" else good[: len(good) // 2])
    with pytest.raises(CorruptCacheError) as raised:
        copy_cache(source, FileObjectStore(tmp_path / "destination"), "ds", "v1", threads=1, show_progress=False)
    message = str(raised.value)
    holds = f"more than {victim.size_bytes}" if damage == "larger" else f"{len(good) // 2}"
    assert victim.name in message and f"holds {holds} bytes" in message, message
    assert f"manifest says {victim.size_bytes}" in message, message
    left = sorted(p.name for p in (tmp_path / "destination").rglob("*") if p.is_file())
    assert not [name for name in left if victim.name in name], left
    assert not [name for name in left if name == "manifest.json"], left  # nothing was published


# -- small objects: one capped read ---------------------------------------------------------------
def _peak(call: Callable[[], Any]) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def _refusal_peak(call: Callable[[], Any]) -> tuple[str, int]:
    """The message of the CorruptSourceError ``call`` raises, and the peak of what it allocated."""

    def refused() -> str:
        with pytest.raises(CorruptSourceError) as raised:
            call()
        return str(raised.value)

    return _peak(refused)


def test_an_oversized_lease_costs_a_waiter_no_more_than_the_cap(bucket: Bucket) -> None:
    objects = bucket.store()
    key = f"ds/v1/{LEASE_NAME}"
    objects.write(key, b"{" + b" " * (16 << 20) + b"}")
    objects.read("ds/v1/absent")  # the client's first request (a cloud client loads its models)
    state, peak = _peak(lambda: Lease.read(objects, key))
    assert peak < 4 << 20, f"reading a 16 MiB lease object peaked at {peak >> 20} MiB"
    assert state is not None and state.unreadable == f"larger than {MAX_LEASE_BYTES} bytes"
    assert state.build_id == "?" and state.duration is None and not state.released
    # The one capped read refuses it by name (what a manifest's read says too).
    with pytest.raises(ObjectSizeError, match=rf"{key} holds more than {MAX_LEASE_BYTES} bytes") as raised:
        read_capped(objects, key, MAX_LEASE_BYTES)
    assert raised.value.token == state.token


def test_a_waiter_takes_over_an_oversized_lease_and_says_which(
    bucket: Bucket, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = bucket.store()
    objects.write(f"ds/v1/{LEASE_NAME}", b"x" * (MAX_LEASE_BYTES + 1))
    store = RemoteCacheStore(
        objects, tmp_path / "node", lease_seconds=0.5, poll_seconds=0.05, wait_timeout=60, show_progress=False
    )
    with caplog.at_level(logging.WARNING, logger="yogacache"):
        reader = store.get_or_build("ds", "v1", lambda: records(8))
    assert [int(reader[i]["i"]) for i in range(len(reader))] == list(range(8))
    reader.close()
    said = " ".join(record.getMessage() for record in caplog.records)
    assert objects.url(f"ds/v1/{LEASE_NAME}") in said and f"larger than {MAX_LEASE_BYTES} bytes" in said


# -- lease durations and fields -------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _foreign_lease(**fields: Any) -> bytes:
    body = {"owner": "elsewhere:1", "build_id": "theirs", "expires_at": 4e9, "renewal": 1, **fields}
    return json.dumps(body).encode()


OWN = 2.0  # the waiter's own lease duration


@pytest.mark.parametrize(
    "fields, taken_after, read_as",
    [
        ('"duration": 1e300', MAX_LEASE_SECONDS, MAX_LEASE_SECONDS),
        ('"duration": 1e400', MAX_LEASE_SECONDS, MAX_LEASE_SECONDS),  # what JSON reads as infinity
        ('"duration": Infinity', MAX_LEASE_SECONDS, MAX_LEASE_SECONDS),
        ('"duration": ' + "9" * 400, MAX_LEASE_SECONDS, MAX_LEASE_SECONDS),  # an integer no float holds
        ('"duration": NaN', OWN, None),
        ('"duration": -5', OWN, None),
        ('"duration": 0', OWN, None),
        ('"duration": "120"', OWN, None),  # not a number: says nothing
        ('"duration": 30, "released": "no"', OWN, None),  # a string is no release: unreadable, watched
        ('"duration": 30, "owner": 7', OWN, None),  # unreadable
        ('"duration": 30, "process": {"pid": "1"}', 30.0, 30.0),  # a malformed process is ignored
    ],
)
def test_a_lease_is_taken_over_within_the_ceiling_whatever_it_claims(
    fields: str, taken_after: float, read_as: Optional[float], tmp_path: Path
) -> None:
    objects = FileObjectStore(tmp_path / "bucket")
    key = f"ds/v1/{LEASE_NAME}"
    # Written as a foreign or broken writer would (JSON's last duplicate key wins).
    objects.write(key, _foreign_lease()[:-1] + b", " + fields.encode() + b"}")
    clock = Clock()
    waiter = Lease(objects, key, "mine", OWN, monotonic=clock)
    assert waiter.try_acquire()[0] is False  # starts watching
    clock.now += taken_after - 0.01
    assert waiter.try_acquire()[0] is False, "taken over too early"
    clock.now += 0.02
    acquired, previous = waiter.try_acquire()
    try:
        assert acquired, f"a lease claiming {fields} was not taken over after {taken_after} s unchanged"
        assert previous is not None and previous.duration == read_as
    finally:
        waiter.release()


def test_durations_are_bounded_where_a_holder_is_made(tmp_path: Path) -> None:
    objects = FileObjectStore(tmp_path / "bucket")
    for bad in (1e300, float("inf"), float("nan"), 0, -1, MAX_LEASE_SECONDS + 1):
        with pytest.raises(ConfigError, match=r"lease_seconds .*at most 3600"):
            Lease(objects, "k", "b", bad)
        with pytest.raises(ConfigError, match="MAX_LEASE_SECONDS"):
            RemoteCacheStore(objects, tmp_path / "node", lease_seconds=bad)
    assert Lease(objects, "k", "b", MAX_LEASE_SECONDS).duration == MAX_LEASE_SECONDS


def test_a_builder_takes_over_a_lease_claiming_1e300_seconds(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end on moto: the ceiling lowered to a second, a builder facing a dead holder's
    lease that claims 1e300 s builds after about that second (before: it waited for ever)."""
    monkeypatch.setattr(lease, "MAX_LEASE_SECONDS", 1.0)
    cloud = Cloud("s3", s3_server)
    objects = cloud.store(cloud.new_bucket(), PREFIX)
    objects.write(f"ds/v1/{LEASE_NAME}", _foreign_lease(duration=1e300))
    store = RemoteCacheStore(
        objects, tmp_path / "node", lease_seconds=0.5, poll_seconds=0.05, wait_timeout=30, show_progress=False
    )
    reader = store.get_or_build("ds", "v1", lambda: records(8))
    try:
        assert [int(reader[i]["i"]) for i in range(len(reader))] == list(range(8))
    finally:
        reader.close()


# -- tar entries ----------------------------------------------------------------------------------
def _header(name: bytes, size_field: bytes, kind: bytes) -> bytes:
    """A ustar header with a raw 12-byte size field and a correct checksum."""
    header = bytearray(512)
    header[0 : len(name)] = name
    header[100:108] = b"0000644\0"
    header[108:116] = header[116:124] = b"0000000\0"
    header[124:136] = size_field
    header[136:148] = b"00000000000\0"
    header[156:157] = kind
    header[257:263] = b"ustar\0"
    header[263:265] = b"00"
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _octal(size: int) -> bytes:
    return b"%011o\0" % size


def _with_entry(entry: bytes, after: dict[str, bytes]) -> bytes:
    """``entry`` (headers and data), then a tar of ``after`` (its end blocks included)."""
    return entry + tar_bytes(after)


def _members_peak(path: Path, **options: Any) -> tuple[list[dict[str, Any]], int]:
    source = from_url(str(path), format="archive", **options)

    def read_all() -> list[dict[str, Any]]:
        return [dict(record) for record in source.records()]

    return _peak(read_all)


DECLARED = 64 << 20  # what a lying header declares: much more than the stream holds


@pytest.mark.parametrize(
    "kind", [b"5", b"2", b"1", b"3", b"6"], ids=["directory", "symlink", "hardlink", "device", "fifo"]
)
def test_entries_without_data_never_allocate_their_declared_size(tmp_path: Path, kind: bytes) -> None:
    path = tmp_path / "lying.tar.gz"
    path.write_bytes(gzip.compress(_with_entry(_header(b"d", _octal(DECLARED), kind), {"a.txt": b"after"})))
    assert path.stat().st_size < 200
    got, peak = _members_peak(path, max_bytes=1 << 40)
    assert [r["__key__"] for r in got] == ["a.txt"] and bytes(got[0]["txt"]) == b"after"
    assert peak < 8 << 20, f"a {path.stat().st_size}-byte archive cost {peak >> 20} MiB"


@pytest.mark.parametrize("kind", [b"x", b"g", b"L", b"K"], ids=["pax", "pax-global", "gnu-longname", "gnu-longlink"])
def test_oversized_pax_and_long_name_headers_are_refused_unread(tmp_path: Path, kind: bytes) -> None:
    path = tmp_path / "lying.tar.gz"
    path.write_bytes(gzip.compress(_with_entry(_header(b"././@LongLink", _octal(DECLARED), kind), {"a.txt": b"x"})))
    storage = tmp_path / "caches"
    message, peak = _refusal_peak(lambda: cache_from(storage, from_url(str(path), format="archive", max_bytes=1 << 40)))
    assert "lying.tar.gz" in message and "'././@LongLink'" in message
    assert f"declares {DECLARED} bytes" in message and str(MAX_HEADER_BYTES) in message
    assert "\n" not in message
    assert peak < 16 << 20
    assert cache_files(storage) == []


def test_a_pax_header_of_an_ordinary_size_is_still_read(tmp_path: Path) -> None:
    long_name = "n" * 300 + ".txt"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo(long_name)
        info.size = 5
        info.pax_headers = {"comment": "c" * 4000}
        archive.addfile(info, io.BytesIO(b"hello"))
    path = tmp_path / "pax.tar"
    path.write_bytes(buffer.getvalue())
    got = read_back(cache_from(tmp_path / "caches", from_url(str(path), format="archive")))
    assert [bytes(r["__key__"]).decode() for r in got] == [long_name]


def _negative(value: int) -> bytes:
    """A GNU base-256 size field holding ``value`` (< 0)."""
    return bytes([0xFF]) + (value % (1 << 88)).to_bytes(11, "big")


@pytest.mark.parametrize("how", ["base-256", "pax"])
def test_a_negative_size_is_refused_naming_archive_and_member(tmp_path: Path, how: str) -> None:
    rest = {f"z{i}.bin": bytes(4 << 20) for i in range(16)}  # 64 MiB after it, ~64 KiB compressed
    if how == "base-256":
        entry = _header(b"neg.bin", _negative(-1), b"0")
    else:
        record = b"13 size=-512\n"
        entry = _header(b"PaxHeader", _octal(len(record)), b"x") + record.ljust(512, b"\0")
        entry += _header(b"neg.bin", _octal(0), b"0")
    path = tmp_path / "negative.tar.gz"
    path.write_bytes(gzip.compress(_with_entry(entry, rest)))
    assert path.stat().st_size < 200 << 10
    storage = tmp_path / "caches"
    message, peak = _refusal_peak(lambda: cache_from(storage, from_url(str(path), format="archive", max_bytes=1 << 40)))
    assert "negative.tar.gz" in message and "'neg.bin'" in message and "negative" in message, message
    assert peak < 24 << 20, f"refusing it read {peak >> 20} MiB of the stream"  # one decompression step
    assert cache_files(storage) == []


def test_a_regular_member_declaring_more_than_the_stream_holds_costs_little(tmp_path: Path) -> None:
    path = tmp_path / "short.tar.gz"
    path.write_bytes(gzip.compress(_header(b"big.bin", _octal(100 << 20), b"0") + b"only this"))
    assert path.stat().st_size < 200
    message, peak = _refusal_peak(lambda: list(from_url(str(path), format="archive", max_bytes=1 << 40).records()))
    assert re.search(r"short\.tar\.gz is corrupt or truncated at member 'big\.bin'", message), message
    assert peak < 40 << 20, f"a {path.stat().st_size}-byte archive cost {peak >> 20} MiB"


def test_unknown_entry_kinds_are_skipped_in_pieces_and_budgeted(tmp_path: Path) -> None:
    data = bytes(64 << 20)
    entry = _header(b"volume", _octal(len(data)), b"V") + data
    path = tmp_path / "unknown.tar.gz"
    path.write_bytes(gzip.compress(_with_entry(entry, {"a.txt": b"kept"})))
    del data, entry
    got, peak = _members_peak(path, max_bytes=1 << 40)
    assert [r["__key__"] for r in got] == ["a.txt"]
    assert peak < 24 << 20, f"skipping a 64 MiB entry held {peak >> 20} MiB"
    with pytest.raises(CorruptSourceError, match=r"member 'volume' would expand .*byte limit"):
        list(from_url(str(path), format="archive", max_bytes=1 << 20).records())


def test_a_zip_member_declaring_more_than_the_archive_holds_is_refused_unread(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("a.bin", b"0123456789")
    data = bytearray(buffer.getvalue())
    entry = data.find(b"PK\x01\x02")  # the central directory's entry: compressed and full sizes
    struct.pack_into("<II", data, entry + 20, DECLARED, DECLARED)
    path = tmp_path / "lying.zip"
    path.write_bytes(bytes(data))
    message, peak = _refusal_peak(lambda: list(from_url(str(path), format="archive", max_bytes=1 << 40).records()))
    assert "lying.zip" in message and "'a.bin'" in message and f"declares {DECLARED} compressed bytes" in message
    assert peak < 4 << 20, f"a {len(data)}-byte zip cost {peak >> 20} MiB"


# -- names that are not UTF-8 ---------------------------------------------------------------------
def test_a_tar_member_name_that_is_not_utf8_is_refused_naming_both(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT, encoding="latin-1") as archive:
        for name, data in (("ok.txt", b"ok"), ("caf\xe9.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path = tmp_path / "latin.tar"
    path.write_bytes(buffer.getvalue())
    storage = tmp_path / "caches"
    with pytest.raises(CorruptSourceError) as raised:
        cache_from(storage, from_url(str(path), format="archive"))
    message = str(raised.value)
    assert "latin.tar" in message and r"b'caf\xe9.txt'" in message and "not UTF-8" in message
    assert "\n" not in message
    assert cache_files(storage) == []


def test_a_file_name_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    (root / "good.txt").write_bytes(b"good")
    with open(os.path.join(os.fsencode(root), b"caf\xe9.txt"), "wb") as handle:
        handle.write(b"bad")
    storage = tmp_path / "caches"
    with pytest.raises(CorruptSourceError, match=r"b'caf\\xe9\.txt' is not UTF-8") as raised:
        cache_from(storage, from_url(str(root), format="files"))
    assert "\n" not in str(raised.value)
    assert cache_files(storage) == []
