"""Creating files and directories safely where other users may write: explicit modes, no planted links.

Every file yogacache creates is created new (``O_CREAT | O_EXCL | O_NOFOLLOW``) with an explicit
mode, so a symbolic link planted where it would go is never followed, and a permissive umask
(``umask 000``) never makes it writable by others. Directories are created one component at a
time with explicit modes for the same reason (``os.makedirs`` leaves the intermediate ones to
the umask).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

# Files others read (manifests), files only their owner reads (stamps), and directories.
PUBLIC_FILE_MODE = 0o644
PRIVATE_FILE_MODE = 0o600
PUBLIC_DIR_MODE = 0o755
PRIVATE_DIR_MODE = 0o700


def describe_user(uid: int) -> str:
    """``user 'alice' (uid 1000)``, or ``uid 1000`` for a uid with no name."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_directories(path: Path, mode: int = PUBLIC_DIR_MODE) -> None:
    """Creates ``path`` and its missing parents, each with ``mode`` (less the umask's bits).

    Existing components are left as they are, whatever they are: the caller checks the one it
    relies on (see ``trusted_link``).
    """
    missing = []
    current = Path(path)
    while not os.path.lexists(current) and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            pass  # created meanwhile by another process


def trusted_link(st: os.stat_result) -> bool:
    """Whether a symbolic link (its ``lstat``) may be followed: this user's own, or root's.

    A link another user planted is never followed: it could point anywhere this user may write.
    """
    return st.st_uid in (os.geteuid(), 0)


def open_directory(path: Path) -> int:
    """A descriptor of directory ``path`` (``O_DIRECTORY``); follows ``path`` only if it is a
    trusted link. Raises PermissionError naming the link's owner otherwise."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.lstat(path)
        if not stat.S_ISLNK(st.st_mode):
            raise
        if not trusted_link(st):
            raise PermissionError(
                errno.EPERM,
                f"refusing to follow the symbolic link {path}: it belongs to {describe_user(st.st_uid)}",
            ) from None
        return os.open(path, flags)


def create_file(path: Path, mode: int, *, dir_fd: int | None = None) -> int:
    """Creates a new file and returns a write descriptor: never opens an existing file or a link.

    Raises FileExistsError when anything (a file, a link, a directory) is at ``path`` already.
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
