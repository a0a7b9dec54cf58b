"""Node-local exclusive locks on lock files (flock): released by the kernel when a holder dies.

A lock file exists only while someone holds or waits for its lock: the holder unlinks it when
it releases the lock, so finished and failed commands leave no lock files behind. Unlinking is
safe because an acquirer checks, once it holds the ``flock``, that the file it locked is still
the one at the lock's path; if the holder before it unlinked that file, it starts again with a
new one. Lock files are opened without following a symbolic link (``O_NOFOLLOW``), in a
directory reached without following a link another user planted.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional

from yogacache.errors import YogaCacheError
from yogacache.safefs import PUBLIC_FILE_MODE, make_directories, open_directory

# How often opening may find the lock's directory removed under it (by a holder that pruned it
# as it released) before giving up: in practice it happens once.
_OPEN_ATTEMPTS = 100


class LockTimeoutError(YogaCacheError, TimeoutError):
    """A lock was not acquired within its timeout."""


class LockFileError(YogaCacheError, PermissionError):
    """A lock file cannot be created or opened safely (a planted link, no permission)."""


class FileLock:
    """An exclusive ``flock`` on ``path``; a SIGKILLed holder's lock is released automatically.

    ``prune_parent``: on release, also remove the lock's directory when nothing else is left in
    it (a cache id's directory after its last version went). Only for directories whose
    creators always take this lock first, since it may vanish between their mkdir and use.

    The holder writes ``HOST:PID`` into the lock file, so that a process that has to wait can
    say for whom: ``on_wait(holder)`` is called once, before waiting.
    """

    def __init__(
        self,
        path: Path,
        timeout: Optional[float] = None,
        poll: float = 0.05,
        on_wait: Optional[Callable[[Optional[str]], None]] = None,
        *,
        prune_parent: bool = False,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.prune_parent = prune_parent
        self.on_wait = on_wait
        self._fd: Optional[int] = None
        self._dir_fd: Optional[int] = None

    def acquire(self) -> None:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        announced = self.on_wait is None
        while True:
            dir_fd, fd = self._open()
            try:
                if not announced and not _try_lock(fd):
                    announced = True
                    self.on_wait(_holder(fd))  # type: ignore[misc]
                self._flock(fd, deadline)
                if self._is_current(dir_fd, fd):
                    self._dir_fd, self._fd = dir_fd, fd
                    _write_holder(fd)
                    return
            except BaseException:
                os.close(fd)
                os.close(dir_fd)
                raise
            # The holder before us unlinked this file as it released it: lock the current one.
            os.close(fd)
            os.close(dir_fd)

    def _open(self) -> tuple[int, int]:
        """Descriptors of the lock's directory and of the lock file (created if missing)."""
        name = self.path.name
        for _ in range(_OPEN_ATTEMPTS):
            try:
                dir_fd = open_directory(self.path.parent)
            except FileNotFoundError:
                make_directories(self.path.parent)
                continue
            except PermissionError as error:
                raise LockFileError(f"cannot lock {self.path}: {error.strerror or error}") from None
            try:
                flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    return dir_fd, os.open(name, os.O_RDWR | flags, PUBLIC_FILE_MODE, dir_fd=dir_fd)
                except PermissionError:
                    # Another user's lock file in a directory both may use: a read-only
                    # descriptor takes the flock as well.
                    return dir_fd, os.open(name, os.O_RDONLY | flags, PUBLIC_FILE_MODE, dir_fd=dir_fd)
            except FileNotFoundError:
                os.close(dir_fd)  # the directory was removed after we opened it: start over
                continue
            except OSError as error:
                os.close(dir_fd)
                if error.errno == errno.ELOOP:
                    raise LockFileError(f"refusing to lock {self.path}: it is a symbolic link") from None
                if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise LockFileError(
                        f"cannot create the lock file {self.path}: {error.strerror}; "
                        f"{self.path.parent} must be writable by this user"
                    ) from None
                raise
        raise LockFileError(f"cannot lock {self.path}: its directory keeps disappearing")

    def _flock(self, fd: int, deadline: Optional[float]) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                return
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EINTR):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise LockTimeoutError(f"timed out after {self.timeout} s waiting for lock {self.path}") from None
                time.sleep(self.poll)

    def _is_current(self, dir_fd: int, fd: int) -> bool:
        """Whether the locked file is still the one at the lock's path."""
        try:
            at_path = os.stat(self.path.name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (at_path.st_dev, at_path.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self._fd is None or self._dir_fd is None:
            return
        fd, dir_fd = self._fd, self._dir_fd
        self._fd = self._dir_fd = None
        try:
            try:
                os.unlink(self.path.name, dir_fd=dir_fd)  # still ours: we hold its lock
            except OSError:
                pass  # another user's file in a sticky directory stays; it still works as a lock
            if self.prune_parent:
                try:
                    os.rmdir(self.path.parent)  # only when empty
                except OSError:
                    pass
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
                os.close(dir_fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EINTR):
            raise
        return False
    return True


def _write_holder(fd: int) -> None:
    """Writes ``HOST:PID`` into the held lock file, so that a waiter can say for whom it waits."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode(), 0)
    except OSError:  # a read-only descriptor (another user's lock file): who holds it is only for messages
        pass


def _holder(fd: int) -> Optional[str]:
    """``HOST:PID`` of the process holding the lock, as it wrote it (None if unknown)."""
    try:
        text = os.pread(fd, 300, 0).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None


def cache_lock_path(directory: Path) -> Path:
    """The lock every process that builds, downloads or removes the cache at ``directory``
    holds: ``<parent>/.<name>.lock``."""
    return directory.parent / f".{directory.name}.lock"


def busy_note(directory: Path) -> str:
    """What to add to "no cache at ``directory``" while another process holds its lock: who
    (pid, host), since when, and how to wait. Empty when nobody holds it.

    Looks without taking the lock from its holder: a shared ``flock`` tried without waiting
    fails exactly while someone holds it.
    """
    path = cache_lock_path(directory)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                return ""
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return ""  # a lock file nobody holds: no build is under way
        holder = _holder(fd) or ""
        since = datetime.datetime.fromtimestamp(os.fstat(fd).st_mtime, datetime.timezone.utc)
    finally:
        os.close(fd)
    host, _, pid = holder.rpartition(":")
    who = f"pid {pid} on {host}" if pid.isdigit() and host else "another process"
    return (
        f"; {who} is building (or downloading) it: it has held {path} since "
        f"{since.strftime('%Y-%m-%d %H:%M:%S UTC')}. Wait for that process to finish and try again "
        "(get_or_build, cacheable and the DataLayer decorators wait by themselves)"
    )
