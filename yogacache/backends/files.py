"""A directory as an object store: the shared-filesystem backend of the object-store contract.

Writes go to a temporary file and are renamed into place; conditional creates use
``link()``, which fails if the name exists; version tokens are a content hash.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import posixpath
import stat as stat_kinds
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Optional
from urllib.parse import urlparse

from yogacache.backends import base
from yogacache.backends.base import (
    COPY_CHUNK_BYTES,
    ObjectChecksum,
    ObjectInfo,
    ProgressCallback,
    join_key,
)
from yogacache.format.durability import fsync_path
from yogacache.locks import FileLock

_COPY_CHUNK = 8 << 20


def _token(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FileObjectStore(base.CopyableObjectStore, base.PinnedObjectStore):
    """Objects as files under ``root`` (a local or shared filesystem)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()
        self.metadata_requests = 0
        self.served_versions: dict[str, str] = {}  # size and mtime pin files: no version ids

    @classmethod
    def from_url(cls, url: str) -> FileObjectStore:
        """``file:///path``."""
        return cls(Path(urlparse(url).path))

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self.root)!r})"

    def url(self, key: str = "") -> str:
        return f"file://{self.root}/{key}" if key else f"file://{self.root}"

    def _path(self, key: str) -> Path:
        path = (self.root / join_key(key)).absolute()
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"object key {key!r} escapes {self.root}")
        return path

    def _temp_beside(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        return path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        try:
            with open(self._path(key), "rb") as handle:
                if max_bytes is None:
                    data = handle.read()
                    return data, _token(data)
                # The token is the whole file's hash; only the first max_bytes + 1 bytes are kept.
                data = handle.read(max_bytes + 1)
                digest = hashlib.sha256(data)
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
                return data, digest.hexdigest()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def write(
        self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None
    ) -> Optional[str]:
        path = self._path(key)
        temp = self._temp_beside(path)
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            if if_absent:
                try:
                    os.link(temp, path)  # atomic create-if-absent
                except FileExistsError:
                    return None
                return _token(data)
            if if_token is not None:
                with FileLock(path.parent / f".{path.name}.lock"):
                    current = self.read(key)
                    if current is None or current[1] != if_token:
                        return None
                    os.replace(temp, path)
                return _token(data)
            os.replace(temp, path)
            return _token(data)
        finally:
            if temp.exists():
                temp.unlink()

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        path = self._path(key)
        if if_token is not None:
            with FileLock(path.parent / f".{path.name}.lock"):
                current = self.read(key)
                if current is None or current[1] != if_token:
                    return False
                path.unlink()
                return True
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        self._put_file(path, key, progress, link=False)

    def adopt_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        """``upload_file`` of a file its caller hands over (never to be changed again): on the
        same filesystem it is hard-linked and synced, not copied."""
        self._put_file(path, key, progress, link=True)

    def _put_file(self, path: Path, key: str, progress: Optional[ProgressCallback], link: bool) -> None:
        target = self._path(key)
        temp = self._temp_beside(target)
        try:
            if link and _hard_link(Path(path), temp):
                fsync_path(temp)
                if progress:
                    progress(temp.stat().st_size)
            else:
                _copy(Path(path), temp, progress)
            os.replace(temp, target)
        finally:
            if temp.exists():
                temp.unlink()

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        source = self._path(key)
        if not source.is_file():
            raise FileNotFoundError(f"{self.url(key)} does not exist")
        if size is None:
            _copy(source, Path(path), progress)
            return
        if source.stat().st_size != size:
            raise base.ObjectSizeError(self.url(key), size, source.stat().st_size)
        _copy(source, Path(path), progress, size=size, url=self.url(key))  # it may grow meanwhile

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        found: builtins.list[ObjectInfo] = []
        if not self.root.is_dir():
            return found
        for directory, _, files in os.walk(self.root):
            for name in files:
                if name.startswith("."):
                    continue
                full = Path(directory) / name
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    found.append(ObjectInfo(key=key, size=full.stat().st_size))
        return sorted(found, key=lambda info: info.key)

    # -- pinned reads (the base.PinnedObjectStore primitives) ------------------------------------
    # A file is pinned by its size and modification time; no request is counted (nothing is sent).
    def _pin(self, key: str, stat: os.stat_result) -> base.ObjectPin:
        return base.ObjectPin(key, stat.st_size, mtime_ns=stat.st_mtime_ns)

    def head(
        self, key: str, *, version_id: Optional[str] = None, generation: Optional[int] = None
    ) -> Optional[base.ObjectPin]:
        path = self._path(key)
        try:
            stat = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return self._pin(key, stat) if path.is_file() else None

    def list_page(
        self, prefix: str, start_at: Optional[str] = None, page_size: int = base.LIST_PAGE, token: Optional[str] = None
    ) -> base.PinnedPage:
        """``token`` is the next page's first key."""
        found = self._pins(prefix, token if token is not None else start_at)
        more = len(found) > page_size
        return base.PinnedPage(found[:page_size], more, found[page_size].key if more else None)

    def list_pinned(self, prefix: str) -> builtins.list[base.ObjectPin]:
        return self._pins(prefix, None)  # one walk of the directory, not one per page

    def _pins(self, prefix: str, start_at: Optional[str]) -> builtins.list[base.ObjectPin]:
        """The regular files (not symbolic links) of the directory ``prefix`` names (ending in
        ``/``) or lies in whose key starts with ``prefix``, from ``start_at`` on, in key order."""
        directory = self._path(prefix if prefix.endswith("/") else posixpath.dirname(prefix))
        found: builtins.list[base.ObjectPin] = []
        for folder, subdirs, files in os.walk(directory):
            subdirs.sort()
            for name in files:
                path = Path(folder) / name
                key = path.relative_to(self.root).as_posix()
                if key.startswith(prefix) and (start_at is None or key >= start_at):
                    stat = path.lstat()
                    if stat_is_file(stat):
                        found.append(self._pin(key, stat))
        return sorted(found, key=lambda pin: pin.key)

    def read_range(self, pin: base.ObjectPin, start: int, stop: int) -> bytes:
        with self._open_pinned(pin) as handle:
            handle.seek(start)
            return handle.read(stop - start)

    def open_stream(self, pin: base.ObjectPin) -> BinaryIO:
        return self._open_pinned(pin)

    def open_ranged(self, pin: base.ObjectPin) -> BinaryIO:
        return self._open_pinned(pin)

    def _open_pinned(self, pin: base.ObjectPin) -> BinaryIO:
        """The file, open, if it still has the size and modification time of ``pin``."""
        try:
            handle = open(self._path(pin.key), "rb")
        except FileNotFoundError:
            raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=True) from None
        now = os.fstat(handle.fileno())
        if now.st_size != pin.size or (pin.mtime_ns is not None and now.st_mtime_ns != pin.mtime_ns):
            handle.close()
            raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=False)
        return handle

    # -- copies (the base.CopyableObjectStore primitives) ---------------------------------------
    def checksum(self, key: str) -> Optional[ObjectChecksum]:
        """A directory keeps no checksums: the file is read to compute its CRC32C."""
        from yogacache.format.checksum import crc32c_file

        path = self._path(key)
        try:
            if not path.is_file():
                return None
            return ObjectChecksum(path.stat().st_size, crc32c_file(path))
        except FileNotFoundError:
            return None

    def ensure_checksum(self, key: str) -> Optional[ObjectChecksum]:
        return self.checksum(key)

    def read_chunks(self, key: str, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        path = self._path(key)
        if not path.is_file():
            raise FileNotFoundError(f"{self.url(key)} does not exist")
        with open(path, "rb") as handle:
            while chunk := handle.read(chunk_bytes):
                yield chunk

    def write_chunks(
        self, key: str, chunks: Iterable[bytes], size: int, progress: Optional[ProgressCallback] = None
    ) -> None:
        """Written to a temporary file beside the object, synced, then renamed into place."""
        target = self._path(key)
        temp = self._temp_beside(target)
        try:
            with open(temp, "wb") as handle:
                for chunk in chunks:
                    handle.write(chunk)
                    if progress:
                        progress(len(chunk))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        finally:
            if temp.exists():
                temp.unlink()

    def copy_server_side(self, copy: base.ServerCopy) -> bool:
        """Never server-side: a directory's bytes pass through this process anyway."""
        return False


def stat_is_file(stat: os.stat_result) -> bool:
    """A regular file (``lstat``: a symbolic link is not one)."""
    return stat_kinds.S_ISREG(stat.st_mode)


def _hard_link(source: Path, target: Path) -> bool:
    """False where ``source`` cannot be linked (another filesystem, or one without hard links)."""
    try:
        os.link(source, target)
    except OSError:
        return False
    return True


def _copy(
    source: Path, target: Path, progress: Optional[ProgressCallback], *, size: Optional[int] = None, url: str = ""
) -> None:
    """Copies ``source`` to ``target``; with ``size``, no more than that (``base.SizedWriter``)."""
    with open(source, "rb") as reader, open(target, "wb") as handle:
        writer = handle if size is None else base.SizedWriter(handle, url, size)
        while chunk := reader.read(_COPY_CHUNK):
            writer.write(chunk)
            if progress:
                progress(len(chunk))
        if isinstance(writer, base.SizedWriter):
            writer.check()
        handle.flush()
        os.fsync(handle.fileno())


