"""Node-local roots: where a store keeps caches on this node, made safe on a shared ``/tmp``; and
each local copy's ``origin.json`` (the remote it came from or was built for).

YogaDL's default keeps a node's copies of remote caches in ``/tmp/yogadl_local_cache``. On a node
several users share, the first user would own that directory (others get a raw PermissionError),
and anyone could create it first, or plant a symbolic link there, and have the others write
into, or read from, a place of their choosing. So the copies root under a parent directory
``P`` is:

- ``P/yogadl_local_cache-<uid>`` when ``P`` is writable by every user (``/tmp``, ``/var/tmp``):
  one root per user, created 0700, and used only while it is a directory owned by this user
  (reached, if through a link at all, through this user's or root's). Another user's directory
  under that name is refused with a ConfigError, for reading as for writing.
- ``P/yogadl_local_cache`` elsewhere, as in YogaDL's layout: created 0755 on first write; a
  planted link, a non-directory, or a directory this user cannot write is refused with a
  ConfigError that names the owner and what to set instead.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from yogacache.errors import ConfigError
from yogacache.safefs import PRIVATE_DIR_MODE, PUBLIC_DIR_MODE, describe_user, make_directories, trusted_link

LOCAL_CACHE_DIR = "yogadl_local_cache"
ORIGIN_NAME = "origin.json"  # in a local copy: which remote it was fetched from or published to
_HINT = (
    "choose a directory of yours: local_cache_host_path (--local-cache) for copies of remote caches, "
    "host_storage_path (--storage) for local ones"
)


@dataclass(frozen=True)
class LocalRoot:
    """A store's root directory on this node; ``private`` roots are this user's alone (0700)."""

    path: Path
    private: bool = False


def shared_directory(path: Path) -> bool:
    """Whether every user may create entries in directory ``path`` (like ``/tmp``)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_IWOTH)


def local_copies_root(parent: Path | str) -> LocalRoot:
    """The root of this user's copies of remote caches under ``parent`` (see the module doc)."""
    parent = Path(parent).expanduser().absolute()
    if shared_directory(parent):
        return LocalRoot(parent / f"{LOCAL_CACHE_DIR}-{os.geteuid()}", private=True)
    return LocalRoot(parent / LOCAL_CACHE_DIR)


def check_root(root: LocalRoot, *, create: bool) -> bool:
    """Checks a store's root before use, creating it first if ``create``; False when it does not
    exist (and ``create`` is False). Raises ConfigError when the root is unsafe or unusable.

    A private root must be a directory this user owns, and is made 0700 again if its mode
    drifted. Any root must be a directory reached through no link another user planted; one to
    be written must be writable by this user.
    """
    path = root.path
    me = os.geteuid()
    if create:
        try:
            make_directories(path, PRIVATE_DIR_MODE if root.private else PUBLIC_DIR_MODE)
        except PermissionError:
            existing = _existing_ancestor(path)
            raise ConfigError(
                f"cannot create cache directory {path}: {existing} belongs to "
                f"{describe_user(existing.stat().st_uid)} and you ({describe_user(me)}) cannot write to it; {_HINT}"
            ) from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if create:
            raise ConfigError(f"cache directory {path} vanished while it was being created") from None
        return False
    if stat.S_ISLNK(st.st_mode):
        if not trusted_link(st):
            raise ConfigError(
                f"cache directory {path} is a symbolic link that belongs to {describe_user(st.st_uid)}: "
                f"refusing to follow it; remove it, or {_HINT}"
            )
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ConfigError(f"cache directory {path} is a symbolic link to nothing; {_HINT}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"cache directory {path} is not a directory; remove it, or {_HINT}")
    if root.private:
        if st.st_uid != me:
            raise ConfigError(
                f"cache directory {path} belongs to {describe_user(st.st_uid)}, not to you "
                f"({describe_user(me)}): {path.parent} is writable by every user, so only a directory "
                f"of your own is used there; have its owner remove it, or {_HINT}"
            )
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(path, PRIVATE_DIR_MODE)
    elif create and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(
            f"cache directory {path} belongs to {describe_user(st.st_uid)} and you "
            f"({describe_user(me)}) cannot write to it; {_HINT}"
        )
    return True


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


# -- a local copy's origin ---------------------------------------------------------------------


def _origin_record(directory: Path) -> dict[str, Any]:
    try:
        with open(directory / ORIGIN_NAME, "rb") as handle:
            raw = json.loads(handle.read(65536))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def read_origin(directory: Path) -> Optional[str]:
    """The remote URL a local copy came from, was published to, or was built for (None: unknown,
    e.g. a copy made before this was kept)."""
    url = _origin_record(directory).get("url")
    return url if isinstance(url, str) else None


def is_unpublished(directory: Path) -> bool:
    """Whether the local copy was built for its remote and never published there (its publish
    failed, or was interrupted or killed): it is not the remote's cache."""
    return _origin_record(directory).get("published") is False


def write_origin(directory: Path, url: str, *, published: bool = True) -> None:
    """Records ``url`` as the copy's origin (``published`` False: built for it, not yet published
    there): a new private file renamed over the old one."""
    temp = directory / f".{ORIGIN_NAME}.{uuid.uuid4().hex}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    record: dict[str, Any] = {"url": url} if published else {"url": url, "published": False}
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write((json.dumps(record) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, directory / ORIGIN_NAME)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
