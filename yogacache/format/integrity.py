"""Integrity of sealed caches: part hashes, and node-local stamps that spare re-hashing unchanged files.

Verifying never writes into a cache directory: a sealed cache may sit on a read-only mount or
belong to another user. A stamp is a small file in this user's state directory (see
``state_dir``) whose name hashes a part file's identity (inode, size, mtime, ctime) together
with the content hash the manifest gives for that part (BLAKE3; SHA-256 in caches before 0.2).
It says "the file with exactly this identity was hashed and had exactly this hash". Writing to a
file changes its ctime and replacing it changes its inode, so a stamp never vouches for other
bytes. The identity leaves out the device number, which differs between the NFS clients of one
file: a state directory on a shared home serves every node. Stamps are best effort: where the
state directory cannot be written, or is not private to this user, verification re-hashes.
Stamps are created new (``mkstemp``: mode 0600, never through a link) and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import blake3

from yogacache.errors import CorruptCacheError
from yogacache.format import checksum
from yogacache.format.checksum import Crc32c
from yogacache.format.manifest import BUILD_HASH, PART_HASHES, Manifest, PartInfo
from yogacache.safefs import PRIVATE_DIR_MODE, make_directories

Verify = Literal["auto", "full", "size"]
VERIFY_MODES: tuple[Verify, ...] = ("auto", "full", "size")
STATE_DIR_ENV = "YOGACACHE_STATE_DIR"
STAMPS_DIR = "verified-parts"
# v1 stamps also named st_dev; they are never read again (their names differ) and are harmless.
_STAMP_KIND = "yogacache-verified-part-v2"

# (st_ino, st_size, st_mtime_ns, st_ctime_ns) of a part file: the same on every client of a
# shared filesystem, unlike st_dev.
FileIdentity = tuple[int, int, int, int]


def state_dir() -> Optional[Path]:
    """This user's node-local state: ``$YOGACACHE_STATE_DIR``, else ``$XDG_STATE_HOME/yogacache``,
    else ``~/.local/state/yogacache``; None when no home directory can be determined."""
    explicit = os.environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return Path(xdg) / "yogacache"
    try:
        return Path.home() / ".local" / "state" / "yogacache"
    except (RuntimeError, KeyError):
        return None


def file_identity(path: Path) -> FileIdentity:
    """What changes whenever the file's bytes may have: any write moves ctime, a replacement the inode."""
    st = os.stat(path)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def verify_parts(
    directory: Path,
    manifest: Manifest,
    mode: Verify = "full",
    opened: Optional[dict[str, Path]] = None,
) -> None:
    """Raises CorruptCacheError unless every part has its manifest size (and hash).

    ``size`` checks sizes only; ``full`` re-hashes every part; ``auto`` re-hashes the parts
    with no stamp for their current identity. ``opened`` maps part names to paths that reach
    files already held open (messages still name ``directory``). Writes nothing in ``directory``.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    for part in manifest.parts:
        shown = directory / part.name  # what messages name
        path = (opened or {}).get(part.name, shown)
        try:
            identity = file_identity(path)
        except FileNotFoundError as error:
            raise CorruptCacheError(f"cache part {shown} is missing") from error
        if identity[1] != part.size_bytes:
            raise CorruptCacheError(
                f"cache part {shown} is {identity[1]} bytes, the manifest says {part.size_bytes}: "
                "it was truncated or replaced after the cache was sealed"
            )
        if mode == "size" or (mode == "auto" and has_stamp(identity, part.hash_label)):
            continue
        # The identity was taken before hashing: a change while hashing leaves a stamp that
        # never matches again.
        if hash_file(path, part.hash_name) != part.digest:
            raise CorruptCacheError(
                f"cache part {shown} does not match its manifest hash: it was altered or damaged "
                "after the cache was sealed"
            )
        write_stamp(identity, part.hash_label)


def stamp_verified(directory: Path, manifest: Manifest) -> None:
    """Stamps the parts the caller has just hashed in its private directory (a build, a download)."""
    for part in manifest.parts:
        try:
            identity = file_identity(directory / part.name)
        except OSError:
            continue
        write_stamp(identity, part.hash_label)


def has_stamp(identity: FileIdentity, digest: str) -> bool:
    """Whether this user's state holds a stamp saying the file ``identity`` hashed to ``digest``
    (a part's ``hash_label``)."""
    stamps = _stamps_dir(create=False)
    if stamps is None:
        return False
    try:
        fd = os.open(stamps / _stamp_name(identity, digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return False
        with os.fdopen(fd, "rb", closefd=False) as handle:
            recorded = json.loads(handle.read(4096))
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return bool(recorded == _stamp_content(identity, digest))


def write_stamp(identity: FileIdentity, digest: str) -> None:
    """Records that the file ``identity`` hashed to ``digest``: atomically, best effort."""
    stamps = _stamps_dir(create=True)
    if stamps is None:
        return
    name = _stamp_name(identity, digest)
    try:
        fd, tmp = tempfile.mkstemp(dir=stamps, prefix=f".{name}.", suffix=".tmp")  # mode 0o600
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(_stamp_content(identity, digest), handle)
        os.replace(tmp, stamps / name)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _stamps_dir(create: bool) -> Optional[Path]:
    """The stamp directory, or None where it is missing (and not to be created) or not private.

    A directory another user can write to could hold forged stamps: it is neither read nor written.
    """
    root = state_dir()
    if root is None:
        return None
    stamps = root / STAMPS_DIR
    try:
        if create:
            make_directories(stamps, PRIVATE_DIR_MODE)  # parents 0700 too, as XDG asks
        st = os.lstat(stamps)  # a link is not private: never followed
    except (OSError, RuntimeError):
        return None
    private = st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return stamps if stat.S_ISDIR(st.st_mode) and private else None


def _stamp_content(identity: FileIdentity, digest: str) -> dict[str, object]:
    # The key is "sha256" for every hash: stamps written before BLAKE3 keep matching.
    return {"kind": _STAMP_KIND, "identity": list(identity), "sha256": digest}


def _stamp_name(identity: FileIdentity, digest: str) -> str:
    key = json.dumps([_STAMP_KIND, *identity, digest])
    return hashlib.sha256(key.encode("utf-8")).hexdigest() + ".json"


def part_matches(path: Path, part: PartInfo) -> bool:
    """Whether the file at ``path`` has the part's content hash (hashes it, whatever its size)."""
    return hash_file(path, part.hash_name) == part.digest


def hash_file(path: Path, algorithm: str = BUILD_HASH, chunk_size: int = 8 << 20) -> str:
    """The hex digest of a file's bytes with ``algorithm`` (one of ``PART_HASHES``)."""
    digest = new_digest(algorithm)
    _feed(path, [digest.update], chunk_size)
    return str(digest.hexdigest())


def seal_hashes(path: Path) -> tuple[str, Optional[str]]:
    """A new part's manifest hashes, from one read of the file: its BLAKE3 (``BUILD_HASH``)
    and, where google-crc32c is installed, the CRC32C that S3 and GCS compute themselves (so
    that a copy in a bucket is checked without reading it back), else None."""
    crc = Crc32c() if checksum.available() else None
    with open(path, "rb", buffering=0) as handle:
        mapped = _map_file(handle)
        digest = _seal_digest(len(mapped) if mapped is not None else 0)
        if mapped is None:
            _feed_handle(handle, [digest.update] if crc is None else [digest.update, crc.update])
            return str(digest.hexdigest()), None if crc is None else crc.value
        view = memoryview(mapped)
        try:
            if crc is None:
                digest.update(view)
            else:
                # Both hash at several GB/s with the interpreter lock released: the CRC32C on a
                # second thread takes about as long as half the BLAKE3 (measured in issue 24: a
                # page-cached 1 GB part hashed in 0.45 s instead of 0.6-0.8 s read twice, and
                # 0.2 s less CPU), both reading the page cache in place.
                with ThreadPoolExecutor(1, thread_name_prefix="yogacache-crc32c") as pool:
                    crc_pass = pool.submit(_feed_view, view, [crc.update])
                    digest.update(view)
                    crc_pass.result()
        finally:
            view.release()
            mapped.close()
    return str(digest.hexdigest()), None if crc is None else crc.value


# A part at least this large is hashed at seal by BLAKE3 on several threads: the seal of a
# build's last part waits for its hash (a 1 GiB part: 0.2 s on two threads, 0.4 s on one).
_THREADED_SEAL_BYTES = 64 << 20
_SEAL_THREADS = 4


def _seal_digest(size: int) -> Any:
    """The BLAKE3 of a part being sealed: on up to ``_SEAL_THREADS`` threads for a large one.
    With a thread count (not ``blake3.AUTO``) the threads are the hasher's own, gone with it,
    so a process forked later inherits no pool; the digest is the same either way."""
    threads = min(_SEAL_THREADS, os.cpu_count() or 1)
    if size < _THREADED_SEAL_BYTES or threads < 2:
        return new_digest("blake3")
    return blake3.blake3(max_threads=threads)


def _map_file(handle: Any) -> Optional[mmap.mmap]:
    """The open file mapped read-only, its pages mapped in at once where Linux can
    (``MAP_POPULATE``: one call instead of a fault per page); None for an empty file or where
    it cannot be mapped (the caller reads it instead)."""
    try:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return None
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        return mmap.mmap(handle.fileno(), size, flags=flags, prot=mmap.PROT_READ)
    except (OSError, ValueError, AttributeError):  # no mmap here (Windows keywords, a pipe)
        return None


def _feed_view(view: memoryview, sinks: list[Callable[[memoryview], Any]], chunk_size: int = 8 << 20) -> None:
    """Passes the bytes of ``view``, in order and in chunks, to every sink."""
    for start in range(0, len(view), chunk_size):
        chunk = view[start : start + chunk_size]
        for sink in sinks:
            sink(chunk)


def new_digest(algorithm: str) -> Any:
    """A hash object of the part hash ``algorithm`` (``format.manifest.PART_HASHES``)."""
    if algorithm == "blake3":
        return blake3.blake3()  # one thread: fork-safe (no thread pool to inherit)
    if algorithm == "sha256":
        return hashlib.sha256()
    raise CorruptCacheError(f"unknown part hash {algorithm!r}: use one of {', '.join(PART_HASHES)}")


def _feed(path: Path, sinks: list[Callable[[memoryview], Any]], chunk_size: int = 8 << 20) -> None:
    """Passes the file's bytes, in order, to every sink (one read of the file for all)."""
    with open(path, "rb", buffering=0) as handle:
        _feed_handle(handle, sinks, chunk_size)


def _feed_handle(handle: Any, sinks: list[Callable[[memoryview], Any]], chunk_size: int = 8 << 20) -> None:
    """Passes the bytes left in an open file, in order, to every sink."""
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    while True:
        read = handle.readinto(buffer)
        if not read:
            break
        for sink in sinks:
            sink(view[:read])


def part_file_verified(path: Path, part: PartInfo) -> bool:
    """Whether the file at ``path`` is a regular file of the part's size and content hash (a stamp of
    this user vouches for a file hashed before; otherwise it is hashed, and stamped)."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size != part.size_bytes:
            return False
        identity = file_identity(path)
    except OSError:
        return False
    if has_stamp(identity, part.hash_label):
        return True
    try:
        matches = part_matches(path, part)
    except OSError:
        return False
    if matches:
        write_stamp(identity, part.hash_label)
    return matches
