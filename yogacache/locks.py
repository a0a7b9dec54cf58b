"""Node-local exclusive locks on lock files (flock): released by the kernel when a holder dies."""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional

from yogacache.errors import YogaCacheError


class LockTimeoutError(YogaCacheError, TimeoutError):
    """A lock was not acquired within its timeout."""


class FileLock:
    """An exclusive ``flock`` on ``path``; a SIGKILLed holder's lock is released automatically.

    The lock file itself is left in place: deleting it would let two processes lock two
    different inodes under one name. Its holder writes ``HOST:PID`` into it, so that a process
    that has to wait can say for whom: ``on_wait(holder)`` is called once, before waiting.
    """

    def __init__(
        self,
        path: Path,
        timeout: Optional[float] = None,
        poll: float = 0.05,
        on_wait: Optional[Callable[[Optional[str]], None]] = None,
    ) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self.on_wait = on_wait
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            if self.on_wait is not None and not _try_lock(fd):
                self.on_wait(_holder(fd))
            while True:
                try:
                    flags = fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0)
                    fcntl.flock(fd, flags)
                    break
                except OSError as error:
                    if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EINTR):
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise LockTimeoutError(
                            f"timed out after {self.timeout} s waiting for lock {self.path}"
                        ) from None
                    time.sleep(self.poll)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode(), 0)
        except OSError:  # who holds it is only for messages
            pass

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

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


def _holder(fd: int) -> Optional[str]:
    """``HOST:PID`` of the process holding the lock, as it wrote it (None if unknown)."""
    try:
        text = os.pread(fd, 300, 0).decode("utf-8", "replace").strip()
    except OSError:
        return None
    return text or None
