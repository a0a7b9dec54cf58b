"""Sources read through the backends: their schemes are the registry's, their objects are read
through ``PinnedObjectStore`` (one backend per bucket), and the archive formats live in one
table that the CLI's choices come from."""

from __future__ import annotations

import argparse
import io
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from tests.servers import S3Server
from tests.sources_helpers import ARCHIVE_EXTENSIONS, archive_bytes, tar_bytes
from yogacache.backends.files import FileObjectStore
from yogacache.backends.registry import ALIASES, BACKENDS
from yogacache.backends.s3 import S3ObjectStore
from yogacache.cli import build_parser
from yogacache.sources import SourceChangedError, SourceError, formats, from_url
from yogacache.sources.objects import Accessors
from yogacache.sources.urls import parse_location


def test_every_registry_scheme_and_alias_is_a_source_scheme() -> None:
    for scheme in [*BACKENDS, *ALIASES]:
        if scheme == "file":
            continue
        location = parse_location(f"{scheme}://bucket/some/key.tar")
        assert location.scheme == ALIASES.get(scheme, scheme) and location.bucket == "bucket"
        assert location.key == "some/key.tar"
    assert parse_location("gcs://b/k").url == "gs://b/k"
    with pytest.raises(SourceError, match=r"unsupported source URL 'ftp://b/k': use .*, file:// or a") as caught:
        parse_location("ftp://b/k")
    assert all(f"{scheme}://" in str(caught.value) for scheme in BACKENDS)


def test_sources_open_one_registry_backend_per_bucket(s3_server: S3Server) -> None:
    access = Accessors(s3_server.endpoint_url)
    one = access(parse_location("s3://bucket-a/x.tar"))
    assert access(parse_location("s3://bucket-a/other/y.tar")) is one
    other = access(parse_location("s3://bucket-b/x.tar"))
    assert other is not one
    assert isinstance(one.store, S3ObjectStore) and one.store.endpoint == s3_server.endpoint_url
    assert one.store.url() == "s3://bucket-a/"
    local = access(parse_location("/tmp/some/file.bin"))
    assert isinstance(local.store, FileObjectStore) and local.store.root == Path("/")
    assert list(access.all()) == [one, other, local]


def test_one_endpoint_is_not_sent_to_two_services() -> None:
    """An S3 endpoint given with sources that also read az:// objects would be taken by Azure as
    its account URL: refused, naming both schemes, before any request."""
    access = Accessors("http://127.0.0.1:9/s3-endpoint")
    access(parse_location("s3://bucket-a/x.tar"))
    access(parse_location("/tmp/some/file.bin"))  # takes no endpoint: no conflict
    with pytest.raises(SourceError, match=r"endpoint_url names one service's endpoint.*az:// and s3://"):
        access(parse_location("az://container/y.tar"))


def test_a_local_directory_lists_its_regular_files_dotfiles_too_and_no_symlinks(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_bytes(b"A")
    (root / ".hidden.txt").write_bytes(b"H")
    (root / "sub" / "b.txt").write_bytes(b"B")
    (root / "link.txt").symlink_to(root / "a.txt")
    (tmp_path / "data-beside.txt").write_bytes(b"not under data/")
    source = from_url(str(root), format="files")
    assert [ref.name for ref in source.objects()] == [
        str(root / ".hidden.txt"), str(root / "a.txt"), str(root / "sub" / "b.txt")
    ]
    assert all(ref.mtime_ns is not None and ref.etag is None for ref in source.objects())


def test_a_local_file_changed_after_listing_fails_the_build(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(tar_bytes({"a.txt": b"A"}))
    source = from_url(str(path))
    source.objects()
    time.sleep(0.01)
    path.write_bytes(tar_bytes({"a.txt": b"A", "b.txt": b"longer"}))
    with pytest.raises(SourceChangedError, match=r"x\.tar changed while it was read \(it was size \d+, mtime"):
        list(source.records())
    path.unlink()
    with pytest.raises(SourceChangedError, match=r"x\.tar changed or was deleted while it was read"):
        list(source.records())


def test_the_cli_format_choices_are_the_table() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    made = subparsers.choices["import"]
    choices = next(a.choices for a in made._actions if a.dest == "format")
    assert list(choices) == list(formats.FORMATS) == ["auto", *formats.RECORD_FORMATS]


def test_every_suffix_names_its_archive_kind_and_every_compression_is_recognised() -> None:
    tar, zip_kind = formats.archive_of("x.tar"), formats.archive_of("x.zip")
    assert tar is not None and zip_kind is not None and not tar.ranged and zip_kind.ranged
    for extension in ARCHIVE_EXTENSIONS:
        kind = formats.archive_of("shard" + extension.upper())
        assert kind is not None and kind.name == ("zip" if extension == ".zip" else "tar")
        if kind.name == "tar" and extension != ".tar":
            data = archive_bytes({"a.txt": b"A"}, extension)
            compression = formats.compression_of(data)
            assert compression is not None and extension in compression.tar_suffixes
    assert formats.archive_of("notes.txt") is None and formats.compression_of(b"plain") is None


def test_a_compression_is_one_table_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A new tar compression (a toy ``.tar.zz``: a zlib stream) read through the stages by adding
    its entry to the tables, nothing else."""
    toy = formats.Compression("zlib", b"\x78\x9c", (".tar.zz",), zlib.decompressobj)
    monkeypatch.setattr(formats, "COMPRESSIONS", (*formats.COMPRESSIONS, toy))
    tar = next(kind for kind in formats.ARCHIVES if kind.name == "tar")
    widened = formats.ArchiveKind("tar", (*tar.suffixes, ".tar.zz"), tar.members, tar.ranged, tar.auto_format)
    monkeypatch.setattr(formats, "ARCHIVES", tuple(widened if kind is tar else kind for kind in formats.ARCHIVES))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in {"s0.txt": b"zero", "s1.txt": b"one"}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (tmp_path / "toy.tar.zz").write_bytes(zlib.compress(buffer.getvalue()))
    records = list(from_url(str(tmp_path / "toy.tar.zz")).records())
    assert [(r["__key__"], bytes(r["txt"])) for r in records] == [("s0", b"zero"), ("s1", b"one")]


def test_a_missing_bucket_is_an_error_naming_the_object(s3_server: S3Server) -> None:
    source = from_url("s3://no-such-bucket-here/x.tar", endpoint_url=s3_server.endpoint_url)
    missing = r"cannot read source s3://no-such-bucket-here/x\.tar: bucket 'no-such-bucket-here' does not exist at http"
    with pytest.raises(SourceError, match=missing):
        source.objects()
