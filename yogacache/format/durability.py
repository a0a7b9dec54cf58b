"""Filesystem durability: fsync, early writeback, build and trash names, atomic directory swaps.

Everything that makes "sealed" mean "on disk and complete" lives here, so that the writer and
the stores share one implementation of each step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from yogacache.safefs import PUBLIC_FILE_MODE, create_file

TEMP_MARK = ".tmp-"
TRASH_MARK = ".trash-"


def fsync_path(path: Path) -> None:
    """fsyncs a file or directory by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes, mode: int = PUBLIC_FILE_MODE) -> None:
    """Creates ``path`` holding ``data``, with ``mode`` (less the umask's bits), and fsyncs it
    (the directory is the caller's business).

    The file must not exist: a file or symbolic link already at ``path`` raises FileExistsError
    and is left untouched, so a planted link never redirects the write.
    """
    with os.fdopen(create_file(path, mode), "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Any:
    """glibc's ``sync_file_range`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL("libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range = _load_sync_file_range()


def can_start_writeback() -> bool:
    """Whether ``start_writeback`` can work here (Linux's ``sync_file_range``)."""
    return _sync_file_range is not None


def start_writeback(path: Path) -> bool:
    """Asks the kernel to start writing ``path``'s dirty pages to disk without waiting for
    it (``sync_file_range``); False where that is unavailable."""
    if _sync_file_range is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True  # nothing to write back
    try:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)
    return True


def temp_dir_for(target: Path, build_id: str) -> Path:
    return target.parent / f".{target.name}{TEMP_MARK}{build_id}"


def leftovers_of(target: Path) -> list[Path]:
    """Temporary and trash directories a crashed build of ``target`` may have left."""
    prefixes = (f".{target.name}{TEMP_MARK}", f".{target.name}{TRASH_MARK}")
    if not target.parent.is_dir():
        return []
    return [p for p in target.parent.iterdir() if p.name.startswith(prefixes)]


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _rename_exchange(a: Path, b: Path) -> bool:
    """Atomically swaps two paths with renameat2(RENAME_EXCHANGE); False where unsupported."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def replace_directory(new: Path, target: Path) -> None:
    """Moves directory ``new`` to ``target``, atomically replacing an existing ``target``.

    Readers that already opened files of the old cache keep reading them: the files are
    only unlinked, and open LMDB maps stay valid.
    """
    try:
        os.rename(new, target)
    except OSError as error:
        if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if _rename_exchange(new, target):
            old = new  # after the swap, ``new`` names the old cache
        else:
            old = target.parent / f".{target.name}{TRASH_MARK}{uuid.uuid4().hex}"
            os.rename(target, old)
            os.rename(new, target)
        fsync_path(target.parent)
        shutil.rmtree(old, ignore_errors=True)
    fsync_path(target.parent)
