"""Tar shards as WebDataset readers (``tarfile``, ``wids``' own parser) expect them: ustar headers
with names of at most 100 bytes (``wids`` reads neither pax headers nor the prefix field), one
owner, mode and mtime for every member, and the end of archive ``tarfile`` writes."""

from __future__ import annotations

import hashlib
import tarfile
from typing import IO, Sequence

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_END_OF_ARCHIVE = 2 * _BLOCK
NAME_LIMIT = 100  # ustar's name field; `wids` reads no longer names (no pax, no prefix field)
MAX_MEMBER_BYTES = 8**11 - 1  # the ustar size field


def _padded(size: int) -> int:
    return -size % _BLOCK


def sample_tar_bytes(members: Sequence[tuple[str, bytes]]) -> int:
    """Bytes a sample takes in a tar file: a header block per member, its data, padding."""
    return sum(_BLOCK + len(data) + _padded(len(data)) for _, data in members)


def closed_tar_bytes(content: int) -> int:
    """The size of a tar file whose members take ``content`` bytes, once closed (end blocks,
    padding to whole records, as ``tarfile`` writes them)."""
    total = content + _END_OF_ARCHIVE
    return total + (-total % _RECORD)


class UstarHeaders:
    """Tar headers for regular files with one owner (0:0, no names), mode 0444 and mtime: the
    bytes ``tarfile.TarInfo.tobuf(USTAR_FORMAT)`` gives, from a template (tarfile builds each
    header field by field, which dominated the export of small records)."""

    def __init__(self, mtime: int) -> None:
        info = tarfile.TarInfo("")
        info.size = 0
        info.mtime = mtime
        info.mode = 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        template = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
        template[148:156] = b" " * 8  # the checksum is summed with its own field as spaces
        self._template = bytes(template)
        self._sum = sum(template) - sum(template[124:136])  # without the size field

    def header(self, name: bytes, size: int) -> bytes:
        size_field = b"%011o\0" % size
        header = bytearray(self._template)
        header[: len(name)] = name
        header[124:136] = size_field
        header[148:156] = b"%06o\0 " % (self._sum + sum(name) + sum(size_field))
        return bytes(header)


class ShardTarWriter:
    """Writes samples into one ustar file: fixed owner, mode and mtime, members in order."""

    def __init__(self, handle: IO[bytes], headers: UstarHeaders, md5: bool = False) -> None:
        self.handle = handle
        self.headers = headers
        self.offset = 0
        self.samples = 0
        self.md5 = hashlib.md5(usedforsecurity=False) if md5 else None

    def _write(self, data: bytes) -> None:
        self.handle.write(data)
        if self.md5 is not None:
            self.md5.update(data)
        self.offset += len(data)

    def add(self, members: Sequence[tuple[str, bytes]]) -> None:
        parts = []
        for name, data in members:
            parts.append(self.headers.header(name.encode("utf-8"), len(data)))
            parts.append(data)
            if _padded(len(data)):
                parts.append(b"\0" * _padded(len(data)))
        self._write(b"".join(parts))
        self.samples += 1

    def close(self) -> int:
        """Ends the archive as ``tarfile`` does; returns the file's size."""
        end = closed_tar_bytes(self.offset) - self.offset
        self._write(b"\0" * end)
        return self.offset
