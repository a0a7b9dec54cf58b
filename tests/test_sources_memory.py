"""What reading a source holds in memory: a large archive member is held once (no second copy
while it is assembled), and the read-ahead of decoded records is bounded in bytes, not only in
records, so a member of hundreds of MiB costs about its own size, not several times it."""

from __future__ import annotations

import gc
import hashlib
import io
import os
import tarfile
import tracemalloc
from pathlib import Path
from typing import Any, Iterator

import pytest
import zstandard

from yogacache.sources import from_url

MEMBER = 64 << 20
MEMBERS = 3


def write_big_tar(path: Path, compress: bool) -> list[str]:
    """A tar of ``MEMBERS`` members of ``MEMBER`` random bytes (and a small one after each);
    returns their SHA-256 digests, in order. Written piece by piece, never all in memory."""
    digests = []
    raw = path.with_suffix(".raw") if compress else path
    with tarfile.open(raw, "w") as archive:
        for index in range(MEMBERS):
            data = os.urandom(MEMBER)
            digests.append(hashlib.sha256(data).hexdigest())
            for name, payload in ((f"big{index}.bin", data), (f"big{index}.txt", b"small")):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
            del data
    if compress:
        with open(raw, "rb") as source, open(path, "wb") as target:
            zstandard.ZstdCompressor(level=1).copy_stream(source, target)
        raw.unlink()
    return digests


def peak_while_reading(records: Iterator[dict[str, Any]]) -> tuple[int, list[str]]:
    """Peak traced bytes while a consumer takes each record, hashes it (slower than reading it)
    and lets it go before asking for the next, as the cache writer does."""
    digests = []
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        while True:
            record = next(records, None)
            if record is None:
                break
            digests.append(hashlib.sha256(record["bin"]).hexdigest())
            assert bytes(record["txt"]) == b"small"
            del record
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, digests


@pytest.mark.slow
@pytest.mark.parametrize("extension", [".tar", ".tar.zst"])
def test_a_large_member_is_held_about_once(tmp_path: Path, extension: str) -> None:
    path = tmp_path / f"big{extension}"
    expected = write_big_tar(path, compress=extension != ".tar")
    source = from_url(str(path), max_bytes=1 << 40)
    peak, digests = peak_while_reading(source.records())
    assert digests == expected  # every member, whole and in order
    ratio = peak / MEMBER
    assert ratio <= 1.5, f"reading {MEMBER >> 20} MiB members peaked at {peak >> 20} MiB ({ratio:.2f}x a member)"


@pytest.mark.slow
def test_a_build_of_large_members_holds_each_about_twice(tmp_path: Path) -> None:
    """The whole build (read, encode, store): a member is in memory as itself and as its
    record, not more (the encoder's doubling buffer and the writer's queue of three batches held
    it six times). The cache holds every member, whole."""
    from yogacache.store.local import CacheStore

    path = tmp_path / "big.tar"
    expected = write_big_tar(path, compress=False)
    source = from_url(str(path), max_bytes=1 << 40)
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        CacheStore(tmp_path / "caches", show_progress=False).build("big", "v1", source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    ratio = peak / MEMBER
    assert ratio <= 2.5, f"building {MEMBER >> 20} MiB members peaked at {peak >> 20} MiB ({ratio:.2f}x a member)"
    reader = CacheStore(tmp_path / "caches").open("big", "v1")
    try:
        assert [hashlib.sha256(reader[i]["bin"]).hexdigest() for i in range(len(reader))] == expected
    finally:
        reader.close()
