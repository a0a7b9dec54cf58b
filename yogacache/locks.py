"""Node-local exclusive locks on lock files (flock): released by the kernel when a holder dies."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Optional

from yogacache.errors import YogaCacheError


class LockTimeoutError(YogaCacheError, TimeoutError):
    """A lock was not acquired within its timeout."""


class FileLock:
    """An exclusive ``flock`` on ``path``; a SIGKILLed holder's lock is released automatically.

    The lock file itself is left in place: deleting it would let two processes lock two
    different inodes under one name.
    """

    def __init__(self, path: Path, timeout: Optional[float] = None, poll: float = 0.05) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.poll = poll
        self._fd: Optional[int] = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
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
