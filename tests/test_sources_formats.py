"""yogacache.sources on local files: every archive format, WebDataset grouping checked against the
real webdataset package, ImageFolder, decoders, and the unsafe inputs (bombs, traversal, truncation)."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from webdataset.tariterators import base_plus_ext, group_by_keys

from tests.sources_helpers import ARCHIVE_EXTENSIONS, archive_bytes, cache_files, cache_from, read_back, tar_bytes
from yogacache.errors import CacheNotFoundError
from yogacache.sources import CorruptSourceError, SourceChangedError, SourceError, from_url
from yogacache.sources.formats import split_key
from yogacache.sources.urls import expand_braces

MEMBERS = {
    "train/0001.jpg": b"\xff\xd8jpeg-one",
    "train/0001.cls": b"3",
    "train/0001.seg.png": b"png-seg-one",
    "train/0002.jpg": b"\xff\xd8jpeg-two",
    "train/0002.cls": b"7",
    "train/0002.seg.png": b"",
}


def test_brace_expansion_matches_webdataset_shard_patterns() -> None:
    assert expand_braces("s3://b/train-{000000..000002}.tar") == [
        "s3://b/train-000000.tar", "s3://b/train-000001.tar", "s3://b/train-000002.tar"
    ]
    assert expand_braces("x-{a,b}-{1..2}") == ["x-a-1", "x-a-2", "x-b-1", "x-b-2"]
    assert expand_braces("plain{}.tar") == ["plain{}.tar"]
    assert len(expand_braces("s-{0000..0146}.tar")) == 147


@pytest.mark.parametrize(
    "name",
    ["a/b.jpg", "a/b.seg.png", "x.tar.gz", "dir.v2/file.json", "nodot", "a/.hidden", "a/b.", "k.JPG", "a/b/c.d.e.f"],
)
def test_key_rule_is_webdatasets(name: str) -> None:
    """Names with several dots: key up to the first dot of the base name, the rest is the field."""
    assert split_key(name) == base_plus_ext(name)


@pytest.mark.parametrize("extension", ARCHIVE_EXTENSIONS)
def test_every_archive_format_one_record_per_file(tmp_path: Path, extension: str) -> None:
    path = tmp_path / f"data{extension}"
    path.write_bytes(archive_bytes(MEMBERS, extension))
    # A zip's central directory gives every field up front; a tar stream's first sample fixes
    # them unless fields= names them.
    fields = None if extension == ".zip" else ["jpg", "cls", "seg.png"]
    records = read_back(cache_from(tmp_path / "caches", from_url(str(path), format="archive", fields=fields)))
    got = {bytes(r["__key__"]).decode(): r for r in records}
    assert sorted(got) == sorted(MEMBERS)
    for name, data in MEMBERS.items():
        field = name.split("/")[-1].split(".", 1)[1]
        assert bytes(got[name][field]) == data  # other fields of the record are empty bytes
        assert all(bytes(v) == b"" for k, v in got[name].items() if k not in ("__key__", field))


@pytest.mark.parametrize("extension", ARCHIVE_EXTENSIONS)
def test_every_archive_format_grouped_as_webdataset_groups(tmp_path: Path, extension: str) -> None:
    path = tmp_path / f"shard{extension}"
    path.write_bytes(archive_bytes(MEMBERS, extension))
    records = read_back(cache_from(tmp_path / "caches", from_url(str(path), format="webdataset")))
    # The oracle: webdataset's own grouping of the same member sequence.
    expected = list(group_by_keys({"fname": n, "data": d, "__url__": "u"} for n, d in MEMBERS.items()))
    assert len(records) == len(expected) == 2
    for ours, theirs in zip(records, expected):
        assert bytes(ours["__key__"]).decode() == theirs["__key__"]
        assert {k: bytes(v) for k, v in ours.items() if k != "__key__"} == {
            k: v for k, v in theirs.items() if not k.startswith("__")
        }


def test_shardwriter_shards_read_like_webdatasets_reader(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shards.mkdir()
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(shards / "train-%06d.tar"), maxcount=7, verbose=0) as sink:
        for index in range(30):
            sink.write({"__key__": f"sample{index:04d}", "jpg": rng.bytes(50 + index), "cls": str(index % 4).encode(),
                        "seg.png": rng.bytes(index)})
    pattern = str(shards / "train-{000000..000004}.tar")
    ref = cache_from(tmp_path / "caches", from_url(pattern))
    ours = read_back(ref)
    theirs = list(wds.WebDataset("file:" + pattern, shardshuffle=False))
    assert len(ours) == len(theirs) == 30
    for mine, reference in zip(ours, theirs):
        assert bytes(mine["__key__"]).decode() == reference["__key__"]
        for field in ("jpg", "cls", "seg.png"):
            assert bytes(mine[field]) == reference[field]
    pins = ref.manifest.extra["sources"]
    assert [Path(p["url"]).name for p in pins["objects"]] == [f"train-00000{i}.tar" for i in range(5)]
    assert all(p["size"] == (shards / Path(p["url"]).name).stat().st_size for p in pins["objects"])


def test_imagefolder_labels_from_parent_directories(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for label, count in (("dog", 2), ("cat", 3), ("emu", 1)):
        (root / label).mkdir(parents=True)
        for i in range(count):
            (root / label / f"{i}.jpg").write_bytes(f"{label}{i}".encode())
    (root / "README").write_bytes(b"not an image of a class")
    ref = cache_from(tmp_path / "caches", from_url(str(root), format="imagefolder"))
    records = read_back(ref)
    table = ref.manifest.extra["sources"]["class_to_idx"]
    assert table == {"cat": 0, "dog": 1, "emu": 2}  # torchvision's: sorted directory names
    by_key = {bytes(r["__key__"]).decode(): r for r in records}
    assert len(records) == len(by_key) == 6  # README sits in no class directory: no sample
    for key, record in by_key.items():
        assert int(record["cls"]) == table[key.split("/")[0]]
        assert bytes(record["jpg"]) == (root / key).read_bytes()


def test_decoders_are_opt_in_and_never_unpickle(tmp_path: Path) -> None:
    members = {"a.txt": "héllo".encode(), "a.cls": b"4", "a.npy": _npy(np.arange(3))}
    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes(members))
    raw = read_back(cache_from(tmp_path / "raw", from_url(str(path))))
    assert bytes(raw[0]["cls"]) == b"4" and bytes(raw[0]["npy"]) == members["a.npy"]
    decoded = read_back(cache_from(tmp_path / "decoded", from_url(str(path), decode=True)))
    assert int(decoded[0]["cls"]) == 4
    assert bytes(decoded[0]["txt"]).decode() == "héllo"
    np.testing.assert_array_equal(decoded[0]["npy"], np.arange(3))

    class Boom:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    evil = tmp_path / "evil.tar"
    evil.write_bytes(tar_bytes({"b.pyd": pickle.dumps(Boom()), "b.cls": b"1"}))
    with pytest.raises(SourceError, match="never unpickles"):
        read_back(cache_from(tmp_path / "evil", from_url(str(evil), decode=True)))
    kept = read_back(cache_from(tmp_path / "evil-raw", from_url(str(evil))))
    assert bytes(kept[0]["pyd"]).startswith(b"\x80")  # the pickle's bytes, as they are
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(SourceError, match="pickle"):
        from_url(str(evil), decode={"pkl": "bytes"})


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_a_new_field_midway_names_the_sample_and_fields_fixes_it(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.jpg": b"1", "b.jpg": b"2", "b.txt": b"t"}))
    with pytest.raises(SourceError, match=r"sample 'b' has fields \['txt'\].*fields="):
        cache_from(tmp_path / "c1", from_url(str(path)))
    assert cache_files(tmp_path / "c1") == []
    records = read_back(cache_from(tmp_path / "c2", from_url(str(path), fields=["jpg", "txt"])))
    assert [(bytes(r["jpg"]), bytes(r["txt"])) for r in records] == [(b"1", b""), (b"2", b"t")]


def test_zip_bomb_fails_cleanly_within_the_byte_limit(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("small.txt", b"ok")
        archive.writestr("zeros.bin", bytes(64 << 20))
    assert bomb.stat().st_size < 1 << 20
    storage = tmp_path / "caches"
    with pytest.raises(CorruptSourceError, match=r"bomb\.zip: member 'zeros\.bin' would expand .*byte limit"):
        cache_from(storage, from_url(str(bomb), max_bytes=8 << 20))
    assert cache_files(storage) == []


def test_gzip_bomb_fails_cleanly_within_the_byte_limit(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(tar_bytes({"a.bin": bytes(32 << 20)}, "w:gz"))
    storage = tmp_path / "caches"
    with pytest.raises(CorruptSourceError, match=r"member 'a\.bin' would expand"):
        cache_from(storage, from_url(str(bomb), max_bytes=4 << 20))
    assert cache_files(storage) == []


@pytest.mark.parametrize("extension", [".tar", ".zip"])
def test_traversal_names_are_refused_not_written(tmp_path: Path, extension: str) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    path = work / f"evil{extension}"
    path.write_bytes(archive_bytes({"ok.txt": b"fine", "../../x.txt": b"escaped"}, extension))
    storage = work / "caches"
    with pytest.raises(CorruptSourceError, match=r"evil.*member '\.\./\.\./x\.txt' is not a safe relative name"):
        cache_from(storage, from_url(str(path), format="archive"))
    assert cache_files(storage) == []
    assert not (tmp_path / "x.txt").exists() and not (tmp_path / "a" / "x.txt").exists()


def test_truncated_tar_gz_names_object_and_member_and_leaves_nothing(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    data = tar_bytes({f"s{i}.jpg": rng.bytes(20_000) for i in range(10)}, "w:gz")
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(data[: len(data) // 2])
    storage = tmp_path / "caches"
    with pytest.raises(CorruptSourceError, match=r"cut\.tar\.gz is corrupt or truncated at member 's\d\.jpg'"):
        cache_from(storage, from_url(str(path)))
    assert cache_files(storage) == []
    with pytest.raises(CacheNotFoundError):
        from_cache_store(storage)


def from_cache_store(storage: Path) -> None:
    from yogacache.store import open_store

    open_store(str(storage)).manifest("src", "v1")


def test_local_source_changed_on_hit_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.jpg": b"1"}))
    first = read_back(cache_from(tmp_path / "c", from_url(str(path))))
    assert bytes(first[0]["jpg"]) == b"1"
    path.write_bytes(tar_bytes({"a.jpg": b"22"}))
    with pytest.raises(SourceChangedError, match=r"s\.tar: mtime_ns \d+ -> \d+.*on_source_change='rebuild'"):
        cache_from(tmp_path / "c", from_url(str(path)))


def test_no_objects_and_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        from_url(str(tmp_path / "missing.tar")).objects()
    with pytest.raises(ValueError, match="format must be one of"):
        from_url(str(tmp_path), format="parquet")
    with pytest.raises(ValueError, match="on_source_change must be one of"):
        from_url(str(tmp_path), on_source_change="sometimes")
    plain = tmp_path / "notes.txt"
    plain.write_bytes(b"x")
    with pytest.raises(SourceError, match="is not an archive"):
        cache_from(tmp_path / "c", from_url(str(plain), format="webdataset"))
    assert isinstance(tarfile.TarError(), Exception)


def test_yogadl_facade_submit_and_cacheable_take_object_sources(tmp_path: Path) -> None:
    from yogacache.storage import LFSConfigurations, LFSStorage

    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.cls": b"1", "b.cls": b"2"}))
    (tmp_path / "lfs").mkdir()
    storage = LFSStorage(LFSConfigurations(str(tmp_path / "lfs")))
    storage.submit(from_url(str(path)), "objs", "v1")
    assert [bytes(r["cls"]) for r in storage.fetch("objs", "v1").stream()] == [b"1", b"2"]
    assert storage.store.manifest("objs", "v1").extra["sources"]["objects"][0]["url"] == str(path)

    @storage.cacheable("objs", "v2")
    def make() -> object:
        return from_url(str(path))

    assert [bytes(r["cls"]) for r in make().stream()] == [b"1", b"2"]
    path.write_bytes(tar_bytes({"a.cls": b"9"}))
    with pytest.raises(SourceChangedError, match="objs:v2 changed since it was built"):
        make()  # the cache hit notices the changed source


def test_importing_sources_and_reading_local_files_loads_no_cloud_library(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.cls": b"1"}))
    script = (
        "import sys\n"
        "import yogacache.dataref\n"
        "from yogacache.sources import from_url\n"
        f"records = list(from_url({str(path)!r}).records())\n"
        "assert len(records) == 1, records\n"
        "bad = [m for m in ('boto3', 'botocore', 'google.cloud', 'tensorflow', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=str(Path(__file__).resolve().parent.parent))
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_reader_reads_what_tarfile_writes(tmp_path: Path, tar_format: int) -> None:
    """Long names (GNU 'L' entries, pax paths, ustar prefixes), non-ASCII names, directories and
    links: the members read are tarfile's own regular files, byte for byte."""
    long_dir = "d" * 90 + "/" + "e" * 60
    members = {f"{long_dir}/sample.jpg": b"long", "ünï/çödé.txt": b"unicode", "plain/a.bin": bytes(range(256)) * 3}
    if tar_format == tarfile.USTAR_FORMAT:
        members = {k: v for k, v in members.items() if k.isascii()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tar_format) as archive:
        directory = tarfile.TarInfo("plain")
        directory.type = tarfile.DIRTYPE
        archive.addfile(directory)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("plain/link.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "a.bin"
        archive.addfile(link)
    path = tmp_path / "t.tar"
    path.write_bytes(buffer.getvalue())
    records = read_back(cache_from(tmp_path / "c", from_url(str(path), format="archive",
                                                             fields=["jpg", "txt", "bin"])))
    got = {bytes(r["__key__"]).decode(): r for r in records}
    assert sorted(got) == sorted(members)
    for name, data in members.items():
        assert bytes(got[name][name.rsplit(".", 1)[1]]) == data


def test_a_damaged_tar_header_is_named_not_misread(tmp_path: Path) -> None:
    data = bytearray(tar_bytes({"a.txt": b"first", "b.txt": b"second"}))
    second_header = 512 + 512  # a.txt's header and its one block of data
    data[second_header + 10] ^= 0xFF  # a byte of b.txt's name: the checksum no longer matches
    path = tmp_path / "bad.tar"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSourceError, match=r"bad\.tar is corrupt or truncated at member 'a\.txt'.*checksum"):
        cache_from(tmp_path / "c", from_url(str(path), format="archive"))
    assert cache_files(tmp_path / "c") == []


def test_import_of_an_existing_version_follows_on_source_change(tmp_path: Path) -> None:
    from yogacache.sources.importer import import_source
    from yogacache.store import open_store

    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.txt": b"old"}))
    store = open_store(str(tmp_path / "caches"), show_progress=False)
    first = import_source(store, "d", from_url(str(path)), "v1", show_progress=False)
    assert first.outcome == "built"
    assert import_source(store, "d", from_url(str(path)), "v1", show_progress=False).outcome == "cached"
    os.utime(path, ns=(1, 1))  # same bytes, other modification time: a change as far as pins tell
    with pytest.raises(SourceChangedError, match=r"s\.tar: mtime_ns"):
        import_source(store, "d", from_url(str(path)), "v1", show_progress=False)
    stale = import_source(store, "d", from_url(str(path)), "v1", on_source_change="warn", show_progress=False)
    assert stale.outcome == "stale" and stale.manifest.build_id == first.manifest.build_id
    path.write_bytes(tar_bytes({"a.txt": b"new!"}))
    rebuilt = import_source(store, "d", from_url(str(path)), "v1", on_source_change="rebuild", show_progress=False)
    assert rebuilt.outcome == "rebuilt" and rebuilt.manifest.build_id != first.manifest.build_id
    pins = rebuilt.manifest.extra["sources"]["objects"][0]
    assert pins["mtime_ns"] == path.stat().st_mtime_ns != first.manifest.extra["sources"]["objects"][0]["mtime_ns"]
    assert import_source(store, "d", from_url(str(path)), "v1", show_progress=False).outcome == "cached"


def test_a_source_without_records_is_an_error_and_caches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "empty.tar"
    path.write_bytes(tar_bytes({}))
    with pytest.raises(SourceError, match=r"empty\.tar hold no records; nothing was cached"):
        cache_from(tmp_path / "c", from_url(str(path)))
    assert cache_files(tmp_path / "c") == []


def test_rebuild_uses_a_cache_another_process_already_rebuilt(tmp_path: Path) -> None:
    from yogacache.sources.freshness import ensure_fresh
    from yogacache.store import open_store

    path = tmp_path / "s.tar"
    path.write_bytes(tar_bytes({"a.txt": b"old"}))
    store = open_store(str(tmp_path / "caches"), show_progress=False)
    store.build("d", "v1", from_url(str(path), on_source_change="rebuild"))
    stale = store.open("d", "v1")
    path.write_bytes(tar_bytes({"a.txt": b"newer"}))
    rebuilt = store.build("d", "v1", from_url(str(path), on_source_change="rebuild"))  # another rank

    def must_not_build() -> object:
        raise AssertionError("built again")

    fresh = ensure_fresh(store, "d", "v1", stale, must_not_build)
    assert fresh.manifest.build_id == rebuilt.build_id
    fresh.close()


@pytest.mark.parametrize("extension", [".tar", ".tar.gz", ".tar.zst", ".zip"])
def test_a_zero_byte_shard_among_valid_ones_is_refused_naming_it(tmp_path: Path, extension: str) -> None:
    """An empty object is no archive (tarfile: "empty file", GNU tar: "does not look like a tar
    archive"): the build fails naming it, instead of caching the other shards' records only."""
    shards = tmp_path / "shards"
    shards.mkdir()
    for shard in range(3):
        members = {f"s{shard}-{i}.txt": f"{shard}:{i}".encode() for i in range(5)}
        (shards / f"train-{shard}{extension}").write_bytes(archive_bytes(members, extension))
    (shards / f"train-1b{extension}").write_bytes(b"")  # listed between two valid shards
    storage = tmp_path / "caches"
    said = "is corrupt or truncated before its first member" if extension == ".zip" else "is empty: it holds no tar"
    name = f"train-1b{extension}".replace(".", "[.]")
    with pytest.raises(CorruptSourceError, match=rf"{name} {said}.*nothing was cached"):
        cache_from(storage, from_url(str(shards) + "/", format="archive"))
    assert cache_files(storage) == []
    (shards / f"train-1b{extension}").unlink()
    records = read_back(cache_from(storage, from_url(str(shards) + "/", format="archive")))
    assert len(records) == 15  # nothing of the valid shards was lost


@pytest.mark.parametrize("mode", ["w:gz", "zstd"])
def test_a_compressed_stream_of_no_bytes_is_no_tar(tmp_path: Path, mode: str) -> None:
    """A valid gzip / zstd frame holding zero bytes is no tar either (tarfile: "empty file")."""
    import gzip

    import zstandard

    path = tmp_path / ("nothing.tar.gz" if mode == "w:gz" else "nothing.tar.zst")
    path.write_bytes(gzip.compress(b"") if mode == "w:gz" else zstandard.ZstdCompressor().compress(b""))
    good = tmp_path / "good.tar"
    good.write_bytes(tar_bytes({"a.txt": b"1"}))
    with pytest.raises(CorruptSourceError, match=rf"{path.name.replace('.', '[.]')} is empty"):
        cache_from(tmp_path / "c", from_url([str(good), str(path)], format="archive"))
    assert cache_files(tmp_path / "c") == []
