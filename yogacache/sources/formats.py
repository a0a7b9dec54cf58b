"""Members of source objects (tar streams, zip central directories, plain files) and how they group.

A member is ``(name, bytes)``. Names are keys, never paths: nothing is extracted to disk, and a
name that is absolute or climbs out (``../x``) is refused. Every member's declared size is
checked against the build's byte budget before it is decompressed, so a bomb fails cleanly.

WebDataset grouping follows ``webdataset.tariterators``: a name's key is everything up to the
first dot of its last path component, its field everything after that dot, lowercased
(``a/b.seg.png`` is key ``a/b``, field ``seg.png``); consecutive members with the same key form
one sample; names without a dot and top-level ``__*__`` names are skipped.
"""

from __future__ import annotations

import lzma
import re
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Optional

from yogacache.sources.errors import CorruptSourceError

Member = tuple[str, bytes]
MAX_MEMBER_BYTES = 1 << 30

TAR_SUFFIXES = (".tar", ".tar.gz", ".tar.gz2", ".tgz", ".tar.bz2", ".tbz", ".tbz2", ".tar.xz", ".txz", ".tar.zst",
                ".tar.zstd", ".tzst")
ZIP_SUFFIXES = (".zip",)
ARCHIVE_SUFFIXES = TAR_SUFFIXES + ZIP_SUFFIXES
_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")
_DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (
    tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError,
    NotImplementedError,
)


def archive_kind(name: str) -> Optional[str]:
    """``"tar"``, ``"zip"`` or None, by the object name's suffix."""
    lowered = name.lower()
    if lowered.endswith(ZIP_SUFFIXES):
        return "zip"
    if lowered.endswith(TAR_SUFFIXES):
        return "tar"
    return None


def split_key(name: str) -> tuple[Optional[str], Optional[str]]:
    """``(key, field)`` as webdataset's ``base_plus_ext``: ``(None, None)`` for a name without a dot."""
    match = _KEY_FIELD.match(name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def check_name(name: str, where: str) -> str:
    """``name`` if it is a safe relative key; CorruptSourceError otherwise (absolute, ``..``, NUL)."""
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


def _decompressed(stream: BinaryIO, name: str) -> Any:
    """The stream a tar reader reads: zstd is unwrapped here (tarfile reads gz, bz2, xz itself)."""
    if name.lower().endswith((".tar.zst", ".tar.zstd", ".tzst")):
        try:
            import zstandard
        except ImportError:
            raise ImportError("reading .tar.zst sources needs zstandard: pip install 'yogacache[sources]'") from None
        return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    return stream


def _corrupt(where: str, member: Optional[str], error: BaseException) -> CorruptSourceError:
    at = f" at member {member[:200]!r}" if member else " before its first member"
    detail = str(error)[:200] or type(error).__name__
    return CorruptSourceError(
        f"{where} is corrupt or truncated{at} ({type(error).__name__}: {detail}); nothing was cached. "
        "Check or replace that object"
    )


def tar_members(stream: BinaryIO, where: str, budget: ByteBudget) -> Iterator[Member]:
    """The regular files of a (compressed) tar stream, in archive order; links and directories
    are skipped. Read once, front to back: nothing is seeked or written to disk."""
    member: Optional[str] = None
    try:
        zstd_errors = _zstd_errors()
        with tarfile.open(fileobj=_decompressed(stream, where), mode="r|*") as archive:
            for info in archive:
                member = info.name
                if not info.isreg():
                    continue
                check_name(info.name, where)
                budget.take(info.size, where, info.name)
                handle = archive.extractfile(info)
                data = handle.read() if handle is not None else b""
                if len(data) != info.size:
                    raise EOFError(f"member holds {len(data)} of its {info.size} bytes")
                yield info.name, data
    except CorruptSourceError:
        raise
    except _DECOMPRESS_ERRORS + zstd_errors as error:
        raise _corrupt(where, member, error) from None


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
    go to ``on_names``), then each member's bytes (CRC-checked by ``zipfile``); declared sizes
    are budgeted before expansion."""
    member: Optional[str] = None
    try:
        with zipfile.ZipFile(handle) as archive:
            if on_names is not None:
                on_names([info.filename for info in archive.infolist() if not info.is_dir()])
            for info in archive.infolist():
                member = info.filename
                if info.is_dir():
                    continue
                check_name(info.filename, where)
                budget.take(info.file_size, where, info.filename)
                with archive.open(info) as opened:
                    data = opened.read(info.file_size + 1)
                if len(data) != info.file_size:
                    raise zipfile.BadZipFile(f"member holds {len(data)} bytes, its header says {info.file_size}")
                yield info.filename, data
    except CorruptSourceError:
        raise
    except _DECOMPRESS_ERRORS as error:
        raise _corrupt(where, member, error) from None


def webdataset_samples(members: Iterator[Member], where: str) -> Iterator[dict[str, Any]]:
    """Samples grouped as ``webdataset.tariterators.group_by_keys`` groups them (see the module doc)."""
    current: Optional[dict[str, Any]] = None
    for name, data in members:
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
        current[field] = data
    if current is not None:
        yield current


def file_field(name: str) -> str:
    """The field of a file's record: its webdataset suffix, lowercased, or ``data`` without one."""
    _, field = split_key(name.rsplit("/", 1)[-1])
    return field.lower() if field else "data"


def file_records(members: Iterator[Member]) -> Iterator[dict[str, Any]]:
    """One record per file: ``{"__key__": name, "<field>": bytes}``."""
    for name, data in members:
        yield {"__key__": name, file_field(name): data}
