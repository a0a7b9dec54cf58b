"""Members of source objects (tar streams, zip central directories, plain files) and how they group.

A member is ``(name, read)``: ``read()`` returns its bytes, at most once and before the next
member is asked for (a member not read is skipped), so that a finished sample is handed on
before the next member's bytes are read. Names are keys, never paths: nothing is extracted to
disk, and a name that is absolute or climbs out (``../x``) is refused. Every member's declared size is
checked against the build's byte budget before it is decompressed, so a bomb fails cleanly.

What is read how lives in three tables, as webdataset's stages and fsspec's registry do it:
``COMPRESSIONS`` (magic bytes and tar suffixes -> a decompressor), ``ARCHIVES`` (suffix -> the
member reader, streamed or through ranged reads) and ``RECORD_FORMATS`` (format name -> how
members become records). A new archive format is an entry here.

WebDataset grouping follows ``webdataset.tariterators``: a name's key is everything up to the
first dot of its last path component, its field everything after that dot, lowercased
(``a/b.seg.png`` is key ``a/b``, field ``seg.png``); consecutive members with the same key form
one sample; names without a dot and top-level ``__*__`` names are skipped.
"""

from __future__ import annotations

import bz2
import functools
import io
import lzma
import re
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Optional

from yogacache.sources.errors import CorruptSourceError

Member = tuple[str, Callable[[], bytes]]
MAX_MEMBER_BYTES = 1 << 30

_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError,
    NotImplementedError,
)


def split_key(name: str) -> tuple[Optional[str], Optional[str]]:
    """``(key, field)`` as webdataset's ``base_plus_ext``: ``(None, None)`` for a name without a dot."""
    match = _KEY_FIELD.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def check_name(name: str, where: str) -> str:
    """``name`` if it is a safe relative key; CorruptSourceError otherwise (absolute, ``..``, NUL,
    or not UTF-8: a key is UTF-8 text, and a name read with ``surrogateescape`` that holds bytes
    of another encoding is refused, its bytes shown escaped, rather than cached under a guess)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raw = name.encode("utf-8", "surrogateescape")
        raise CorruptSourceError(
            f"{where}: member name {raw[:200]!r} is not UTF-8 (written in another encoding, such as "
            "Latin-1); nothing was cached. Rename it in UTF-8 (convmv, or tar --format=pax) and build again"
        ) from None
    parts = name.replace("\\", "/").split("/")
    if not name or name.startswith(("/", "\\")) or ".." in parts or "\0" in name or re.match(r"^[A-Za-z]:", name):
        raise CorruptSourceError(
            f"{where}: member {name[:200]!r} is not a safe relative name (absolute or climbing out with '..'); "
            "nothing was cached. Rewrite the archive with relative member names"
        )
    return name


@dataclass
class ByteBudget:
    """Decompressed bytes left for one build: every member is checked before it is expanded."""

    limit: int
    used: int = 0

    def take(self, size: int, where: str, name: str) -> None:
        if size > MAX_MEMBER_BYTES:
            raise CorruptSourceError(
                f"{where}: member {name[:200]!r} expands to {size} bytes, more than one record may hold "
                f"({MAX_MEMBER_BYTES}); nothing was cached"
            )
        if self.used + size > self.limit:
            raise CorruptSourceError(
                f"{where}: member {name[:200]!r} would expand the source beyond the build's byte limit "
                f"({self.limit} bytes; a decompression bomb?); nothing was cached. Raise max_bytes if the "
                "data is really this large"
            )
        self.used += size


class DecompressedStream:
    """The decompressed bytes of a gzip, bzip2, xz or zstd stream (recognised by its magic bytes;
    anything else passes through). It decompresses in large steps with a bounded output per
    step (a bomb never expands in memory beyond that), so that tarfile reads a plain stream, as
    fast as it reads an uncompressed tar. Concatenated members (pigz, bgzip) are read on; a stream
    cut inside a member raises EOFError."""

    _STEP_OUTPUT = 4 << 20
    _LARGE = 1 << 20  # a read of at least this many bytes is assembled in a buffer of its own
    # ... allocated whole up to this size, grown as bytes come past it: a header may declare more
    # than the stream holds (a 74-byte archive declaring 1 GiB), and costs no more than this.
    _PREALLOCATE = 16 << 20

    def __init__(self, raw: Any, chunk: int = 1 << 20) -> None:
        self._chunk = chunk
        self._buffer = bytearray()
        self._offset = 0
        self._input = raw.read(chunk)
        self._eof = not self._input
        self._raw = raw
        compression = compression_of(self._input)
        self._make = compression.decompressor if compression is not None else None
        if compression is not None and compression.reader is not None:  # a reader that bounds its own output
            self._raw = compression.reader(_Prefixed(self._input, raw))
            self._input = b""
        self._decompressor: Any = self._make() if self._make is not None else None
        self._started = bool(self._input)

    def _step(self) -> Optional[bytes]:
        """The next piece of output; None at a clean end."""
        d = self._decompressor
        if d is None:
            data = self._input or self._raw.read(self._chunk)
            self._input = b""
            return data or None
        if not self._input and getattr(d, "needs_input", True):
            self._input = self._raw.read(self._chunk)
            if not self._input:
                if self._started:
                    raise EOFError("the compressed stream ends inside a member (truncated)")
                return None
            self._started = True
        out: bytes = d.decompress(self._input, self._STEP_OUTPUT)
        self._input = getattr(d, "unconsumed_tail", b"")
        if d.eof:  # a member ended: what follows is the next member, or the end
            self._input = d.unused_data + self._input
            self._decompressor = self._make()  # type: ignore[misc,operator]
            self._started = bool(self._input)
        return out

    def read(self, size: int = -1) -> bytes:
        wanted = (1 << 62) if size is None or size < 0 else size
        if self._LARGE <= wanted < (1 << 62) and len(self._buffer) - self._offset < wanted:
            return self._read_large(wanted)
        while len(self._buffer) - self._offset < wanted and not self._eof:
            out = self._step()
            if out is None:
                self._eof = True
            else:
                self._buffer += out
        end = min(len(self._buffer), self._offset + wanted)
        with memoryview(self._buffer) as view:
            data = bytes(view[self._offset:end])
        self._offset = end
        if self._offset >= len(self._buffer) or self._offset > (16 << 20):
            del self._buffer[: self._offset]
            self._offset = 0
        return data

    def _read_large(self, size: int) -> bytes:
        """``size`` bytes (fewer at the end of the stream) written into one buffer (allocated
        whole up to ``_PREALLOCATE``, grown past it as the bytes come) and returned without a
        copy: a large member is held once, not once in the buffer of the stream and again as the
        bytes returned."""
        out = io.BytesIO()
        out.seek(min(size, self._PREALLOCATE) - 1)
        out.write(b"\0")  # up to _PREALLOCATE at once: no growing and copying
        out.seek(0)
        with memoryview(self._buffer) as view:
            written = out.write(view[self._offset:])
        self._buffer.clear()  # what was left is taken (a read this large takes it all)
        self._offset = 0
        while written < size and not self._eof:
            piece = self._step()
            if piece is None:
                self._eof = True
                break
            need = size - written
            if len(piece) > need:
                self._buffer += piece[need:]
                piece = piece[:need]
            written += out.write(piece)
        out.truncate(written)  # fewer came than the header declared (the read then fails)
        return out.getvalue()  # BytesIO hands over its buffer when it is exactly the value


class _Prefixed:
    """``head`` then the rest of ``raw``: a stream whose first bytes were read to sniff it."""

    def __init__(self, head: bytes, raw: Any) -> None:
        self._head = head
        self._raw = raw

    def read(self, size: int = -1) -> bytes:
        if self._head:
            data, self._head = (self._head, b"") if size < 0 or size >= len(self._head) else (
                self._head[:size], self._head[size:])
            return data
        return self._raw.read(size)  # type: ignore[no-any-return]


def _fast_gzip() -> Any:
    """``isal.isal_zlib`` (Intel's ISA-L, about 2-3x zlib's inflate) when installed, else ``zlib``."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib
    return isal_zlib


_GZIP = _fast_gzip()


def _zstd_reader(raw: Any) -> Any:
    try:
        import zstandard
    except ImportError:
        raise ImportError("reading .tar.zst sources needs zstandard: pip install 'yogacache[sources]'") from None
    return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)


@dataclass(frozen=True)
class Compression:
    """One compression of tar streams: recognised by its first bytes (``magic``), named by its
    suffixes. ``decompressor`` makes a zlib-style one (``decompress(data, max_length)``, ``eof``,
    ``unused_data``), made again for each concatenated member; or ``reader`` wraps the raw stream
    in a reader that bounds its own output (zstandard's)."""

    name: str
    magic: bytes
    tar_suffixes: tuple[str, ...]
    decompressor: Optional[Callable[[], Any]] = None
    reader: Optional[Callable[[Any], Any]] = None


COMPRESSIONS = (
    Compression("gzip", b"\x1f\x8b", (".tar.gz", ".tar.gz2", ".tgz"), lambda: _GZIP.decompressobj(16 + zlib.MAX_WBITS)),
    Compression("bzip2", b"BZh", (".tar.bz2", ".tbz", ".tbz2"), bz2.BZ2Decompressor),
    Compression("xz", b"\xfd7zXZ\x00", (".tar.xz", ".txz"), lzma.LZMADecompressor),
    Compression("zstd", b"\x28\xb5\x2f\xfd", (".tar.zst", ".tar.zstd", ".tzst"), reader=_zstd_reader),
)


def compression_of(head: bytes) -> Optional[Compression]:
    """The compression whose magic bytes ``head`` starts with; None: not compressed (or unknown)."""
    return next((compression for compression in COMPRESSIONS if head.startswith(compression.magic)), None)


def _corrupt(where: str, member: Optional[str], error: BaseException) -> CorruptSourceError:
    at = f" at member {member[:200]!r}" if member else " before its first member"
    detail = str(error)[:200] or type(error).__name__
    return CorruptSourceError(
        f"{where} is corrupt or truncated{at} ({type(error).__name__}: {detail}); nothing was cached. "
        "Check or replace that object"
    )


class _MemberBytes:
    """``read()`` of one member: its bytes, read when first asked for; a read error becomes
    CorruptSourceError naming the object and the member."""

    def __init__(self, read: Callable[[], bytes], where: str, name: str,
                 errors: tuple[type[BaseException], ...]) -> None:
        self._read = read
        self._where = where
        self._name = name
        self._errors = errors
        self.done = False

    def __call__(self) -> bytes:
        if self.done:
            raise RuntimeError(f"{self._where}: member {self._name[:200]!r} was read already")
        self.done = True
        try:
            return self._read()
        except CorruptSourceError:
            raise
        except self._errors as error:
            raise _corrupt(self._where, self._name, error) from None


def tar_members(
    stream: BinaryIO, where: str, budget: ByteBudget, on_names: Optional[Callable[[list[str]], None]] = None
) -> Iterator[Member]:
    """The regular files of a (compressed) tar stream, in archive order; links, directories and
    other entries are skipped. Read once, front to back: nothing is seeked or written to disk;
    a member's bytes are read when its ``read()`` is called (or skipped when it is not). A tar
    has no directory of its names up front: ``on_names`` is never called."""
    member: Optional[str] = None
    errors = (*_DECOMPRESS_ERRORS, *_zstd_errors(), _GZIP.error)
    try:
        for name, size, regular, reader in TarStream(DecompressedStream(stream)):
            member = name
            if not regular:
                if size:  # an entry of a kind this reader does not know: skipped, but expanded all the same
                    budget.take(size, where, name)
                reader(size)
                continue
            check_name(name, where)
            budget.take(size, where, name)
            read = _MemberBytes(functools.partial(reader, size), where, name, errors)
            yield name, read
            if not read.done:
                read()  # skipped by the consumer: the stream moves past its bytes
    except CorruptSourceError:
        raise
    except UntrustedSizeError as error:
        raise CorruptSourceError(
            f"{where}: {error}; nothing was cached. Check or replace that object"
        ) from None
    except EmptyArchiveError:
        raise CorruptSourceError(
            f"{where} is empty: it holds no tar data at all (not even the end-of-archive blocks), so it "
            "is no tar archive (tarfile and GNU tar refuse it too); nothing was cached. Replace that object "
            "with a valid shard, or leave it out of the source's URLs"
        ) from None
    except errors as error:
        raise _corrupt(where, member, error) from None


_BLOCK = 512


class EmptyArchiveError(tarfile.ReadError):
    """A tar stream of zero bytes (after decompression): an empty object, not an empty archive,
    which holds at least its end-of-archive blocks."""

class UntrustedSizeError(tarfile.ReadError):
    """A tar entry declares a size no reader may act on: negative (a base-256 field or a pax
    record that lies), or more than an entry of its kind holds."""

    def __init__(self, name: str, size: int, why: str) -> None:
        super().__init__(f"entry {name[:200]!r} declares {size} bytes ({why})")


_REGULAR = (b"0", b"\0", b"7")
# Hard and symbolic links, devices, directories, FIFOs: no data follows their header, whatever
# size it declares (tarfile and GNU tar read them so); it is neither read nor skipped.
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")
_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK = b"x", b"g", b"L", b"K"
_METADATA = (_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK)
MAX_HEADER_BYTES = 1 << 20  # the most a pax header or a GNU long name may hold (names are < 4 KiB)
_SKIP_CHUNK = 1 << 20  # the data of an entry skipped is read in pieces this large, never held whole


class TarStream:
    """A minimal reader of a tar stream (ustar, pax and GNU long names, as ``tarfile`` and
    ``webdataset.ShardWriter`` write them): each header is checked (its checksum) and parsed for
    name, size and type only, about five times faster than ``tarfile``'s stream mode, whose
    per-member header parsing dominated a shard's decoding. Yields ``(name, size, is_regular,
    read)``; ``read(size)`` must be called once per entry and returns its data (padding skipped),
    or, for an entry that is no regular file, skips it without holding it (and returns nothing).

    Every read is bounded by what the header may declare: a negative size, or a pax header or
    GNU long name larger than ``MAX_HEADER_BYTES``, raises UntrustedSizeError naming the entry;
    links, directories, devices and FIFOs declare 0 bytes here whatever their header says; a
    read asks for exactly the declared bytes, never "the rest of the stream"."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _exactly(self, count: int) -> bytes:
        data = self._stream.read(count)
        if len(data) != count:
            raise EOFError(f"the archive ends {count - len(data)} bytes early")
        return data  # type: ignore[no-any-return]

    def _data(self, size: int) -> bytes:
        data = self._exactly(size)
        padding = -size % _BLOCK
        if padding:
            self._exactly(padding)
        return data

    def _skip(self, size: int) -> bytes:
        """Moves past ``size`` bytes of data (and their padding), ``_SKIP_CHUNK`` at a time."""
        left = size + (-size % _BLOCK)
        while left:
            step = min(left, _SKIP_CHUNK)
            self._exactly(step)
            left -= step
        return b""

    def __iter__(self) -> Iterator[tuple[str, int, bool, Callable[[int], bytes]]]:
        pax: dict[str, str] = {}
        long_name: Optional[str] = None
        first = True
        while True:
            header = self._stream.read(_BLOCK)
            if not header and first:
                raise EmptyArchiveError("empty file")
            first = False
            if not header or header == bytes(_BLOCK):
                return  # the end-of-archive blocks (or a tar without them)
            if len(header) != _BLOCK:
                raise EOFError("the archive ends inside a header")
            _check_header(header)
            kind = header[156:157]
            if kind in _METADATA:
                size = _number(header[124:136])
                if not 0 <= size <= MAX_HEADER_BYTES:
                    why = "negative" if size < 0 else f"a pax or long-name header holds at most {MAX_HEADER_BYTES}"
                    raise UntrustedSizeError(_header_name(header), size, why)
                data = self._data(size)
                if kind == _PAX_LOCAL:
                    pax.update(_parse_pax(data))
                elif kind == _GNU_LONGNAME:
                    long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                continue  # a global pax header, or a GNU long link name: nothing a key needs
            size = int(pax["size"]) if "size" in pax else _number(header[124:136])
            name = pax.get("path") or long_name or _header_name(header)
            pax, long_name = {}, None
            if size < 0:
                raise UntrustedSizeError(name, size, "negative")
            if kind in _NO_DATA:
                yield name, 0, False, self._skip
            elif kind in _REGULAR:
                yield name, size, True, self._data
            else:
                yield name, size, False, self._skip


def _check_header(header: bytes) -> None:
    stored = header[148:156].rstrip(b"\0 ").strip()
    try:
        wanted = int(stored, 8) if stored else -1
    except ValueError:
        raise tarfile.ReadError("a header's checksum field is not a number") from None
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32  # the checksum field counts as spaces
    if wanted == unsigned:
        return
    signed = 256 + sum(struct.unpack_from("148b8x356b", header))  # some old tars sum signed bytes
    if wanted != signed:
        raise tarfile.ReadError("a header's checksum does not match (not a tar, or corrupt)")


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256 (GNU), for sizes of 8 GiB and more
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field[1:]))) if field[0] & 0x40 else value
    text = field.rstrip(b"\0 ").strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise tarfile.ReadError(f"a header's number field is not octal: {field[:12]!r}") from None


def _header_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes) -> dict[str, str]:
    """``"<length> <key>=<value>\\n"`` records (POSIX pax extended headers)."""
    records: dict[str, str] = {}
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0:
            break
        try:
            length = int(data[position:space])
        except ValueError:
            raise tarfile.ReadError("a pax header is malformed") from None
        if length <= 0:
            raise tarfile.ReadError("a pax header is malformed")
        record = data[space + 1 : position + length - 1]
        key, _, value = record.partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


def _zstd_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError,)


def zip_members(
    handle: BinaryIO, where: str, budget: ByteBudget, on_names: Optional[Callable[[list[str]], None]] = None
) -> Iterator[Member]:
    """The files of a zip read through ranged reads: its central directory first (its file names
    go to ``on_names``), then each member's bytes when its ``read()`` is called (CRC-checked by
    ``zipfile``); declared sizes are budgeted before expansion, and a member declaring more
    compressed bytes than the whole archive holds is refused unread (``zipfile`` would allocate
    what it declares for its first read: a 118-byte zip declaring 256 MiB cost 256 MiB)."""
    member: Optional[str] = None
    archive_size = handle.seek(0, io.SEEK_END)
    handle.seek(0)

    def contents(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
        with archive.open(info) as opened:
            data = opened.read(info.file_size + 1)
        if len(data) != info.file_size:
            raise zipfile.BadZipFile(f"member holds {len(data)} bytes, its header says {info.file_size}")
        return data

    try:
        with zipfile.ZipFile(handle) as archive:
            if on_names is not None:
                on_names([info.filename for info in archive.infolist() if not info.is_dir()])
            for info in archive.infolist():
                member = info.filename
                if info.is_dir():
                    continue
                check_name(info.filename, where)
                if info.compress_size > archive_size:
                    raise CorruptSourceError(
                        f"{where}: member {info.filename[:200]!r} declares {info.compress_size} compressed bytes, "
                        f"more than the whole archive holds ({archive_size}); nothing was cached. Check or "
                        "replace that object"
                    )
                budget.take(info.file_size, where, info.filename)
                yield info.filename, _MemberBytes(functools.partial(contents, archive, info), where, info.filename,
                                                  _DECOMPRESS_ERRORS)
    except CorruptSourceError:
        raise
    except _DECOMPRESS_ERRORS as error:
        raise _corrupt(where, member, error) from None


def webdataset_samples(members: Iterator[Member], where: str) -> Iterator[dict[str, Any]]:
    """Samples grouped as ``webdataset.tariterators.group_by_keys`` groups them (see the module
    doc). A sample is handed on as soon as the next member's name starts another one, before
    that member's bytes are read: two large samples are never held at once here."""
    current: Optional[dict[str, Any]] = None
    for name, read in members:
        if "/" not in name and name.startswith("__") and name.endswith("__"):
            continue
        if _META.match(name):
            continue
        key, field = split_key(name)
        if key is None or field is None:
            continue
        field = field.lower()
        if current is None or key != current["__key__"]:
            if current is not None:
                yield current
            current = {"__key__": key}
        if field in current:
            raise CorruptSourceError(f"{where}: sample {key!r} has two {field!r} files; nothing was cached")
        current[field] = read()
    if current is not None:
        yield current


def file_field(name: str) -> str:
    """The field of a file's record: its webdataset suffix, lowercased, or ``data`` without one."""
    _, field = split_key(name.rsplit("/", 1)[-1])
    return field.lower() if field else "data"


def file_records(members: Iterator[Member], where: str = "") -> Iterator[dict[str, Any]]:
    """One record per file: ``{"__key__": name, "<field>": bytes}``."""
    for name, read in members:
        yield {"__key__": name, file_field(name): read()}


def sample_field(name: str) -> Optional[str]:
    """The field a member gives its webdataset sample (``webdataset_samples``), None for none."""
    _, field = split_key(name.rsplit("/", 1)[-1])
    return field.lower() if field else None


# -- the tables ---------------------------------------------------------------------------------
MemberReader = Callable[[BinaryIO, str, ByteBudget, Optional[Callable[[list[str]], None]]], Iterator[Member]]


@dataclass(frozen=True)
class ArchiveKind:
    """One kind of archive: the suffixes that name it, how its members are read (``members(file,
    where, budget, on_names)``), whether that needs ranged reads (a zip's central directory is at
    its end) or reads a stream front to back, and the record format ``format="auto"`` reads it as."""

    name: str
    suffixes: tuple[str, ...]
    members: MemberReader
    ranged: bool
    auto_format: str


ARCHIVES = (
    ArchiveKind("zip", (".zip",), zip_members, ranged=True, auto_format="archive"),
    ArchiveKind("tar", (".tar", *(s for c in COMPRESSIONS for s in c.tar_suffixes)), tar_members, ranged=False,
                auto_format="webdataset"),
)
ARCHIVE_SUFFIXES = tuple(suffix for archive in ARCHIVES for suffix in archive.suffixes)


def archive_of(name: str) -> Optional[ArchiveKind]:
    """The archive kind the object name's suffix says, or None for a plain file."""
    lowered = name.lower()
    return next((archive for archive in ARCHIVES if lowered.endswith(archive.suffixes)), None)


@dataclass(frozen=True)
class RecordFormat:
    """How a source format makes records: from an archive's members (``group(members, where)``),
    or, with ``group`` None, one record per object (its bytes under ``member_field`` of its name).
    ``member_field``: the field a member's (or a file's) name gives, None for a name that makes none."""

    name: str
    group: Optional[Callable[[Iterator[Member], str], Iterator[dict[str, Any]]]]
    member_field: Callable[[str], Optional[str]]

    @property
    def per_object(self) -> bool:
        return self.group is None


RECORD_FORMATS = {
    "webdataset": RecordFormat("webdataset", webdataset_samples, sample_field),
    "archive": RecordFormat("archive", file_records, file_field),
    "files": RecordFormat("files", None, file_field),
    "imagefolder": RecordFormat("imagefolder", None, file_field),
}
FORMATS = ("auto", *RECORD_FORMATS)  # what from_url's format= (and ``yogacache import --format``) take
