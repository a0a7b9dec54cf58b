"""The object-store contract every backend implements, and the retry policy they share.

A backend has a handful of primitives: read and write small objects (optionally
conditionally), transfer files, list and delete. "Not found" and "precondition failed" are
answers; every other failure (403, 5xx, timeouts, resets) is retried with backoff and then
raised as RemoteError naming the object, never read as "absent".
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import logging
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Protocol, TypeVar
from urllib.parse import urlparse

from yogacache.errors import ConfigError, YogaCacheError

log = logging.getLogger(__name__)
T = TypeVar("T")

ProgressCallback = Callable[[int], None]  # called with bytes transferred since the last call

# Parallel part transfers of one pull or push; each may use several connections (ranged or
# multipart), so connection pools are sized from this.
DEFAULT_TRANSFER_THREADS = 4

# Local errors no retry can cure: the disk is full, or a quota is exhausted.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class RemoteError(YogaCacheError):
    """A request to the object store failed (after retries); the cache was left untouched."""


class TransferCancelled(YogaCacheError):
    """A transfer was stopped because its batch failed or was interrupted; never retried."""


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` is a local "no space left" (a fault of this node, not of the remote)."""
    return isinstance(error, OSError) and error.errno in _DISK_FULL


# Set by ``stop_retries_when``: an event that ends the retries of this thread's calls.
_retry_stop: contextvars.ContextVar[Optional[threading.Event]] = contextvars.ContextVar(
    "yogacache_retry_stop", default=None
)


@contextlib.contextmanager
def stop_retries_when(event: threading.Event) -> Iterator[None]:
    """Within the block, a call of this thread that ``RetryPolicy`` retries stops with
    TransferCancelled once ``event`` is set: a backoff under way wakes at once, and no further
    attempt starts (a fetch ahead whose reader was closed, against a server that is gone)."""
    token = _retry_stop.set(event)
    try:
        yield
    finally:
        _retry_stop.reset(token)


@dataclass(frozen=True)
class ObjectInfo:
    """One listed object: key relative to the store's prefix, size, and version token."""

    key: str
    size: int


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 5.0

    def run(
        self,
        what: str,
        call: Callable[[], T],
        is_transient: Callable[[BaseException], bool],
        describe: Callable[[BaseException], str] = lambda error: describe_error(error),
    ) -> T:
        """Runs ``call``; retries failures ``is_transient`` accepts, then raises RemoteError.

        ``describe`` says what went wrong without secrets (the backend may name its endpoint).
        Inside ``stop_retries_when(event)``, a set ``event`` ends the retries (TransferCancelled).
        """
        stop = _retry_stop.get()
        for attempt in range(1, self.attempts + 1):
            if stop is not None and stop.is_set():
                raise TransferCancelled(f"{what} cancelled")
            try:
                return call()
            except (RemoteError, FileNotFoundError, TransferCancelled):
                raise  # answers, or a stop asked for: not failures
            except Exception as error:  # the backend's own exception types
                if is_disk_full(error):
                    raise  # this node's disk, not the remote: retrying cannot help
                if not is_transient(error) or attempt == self.attempts:
                    raise RemoteError(
                        f"{what} failed after {attempt} attempt(s): {describe(error)}"
                    ) from None
                delay = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
                delay *= 0.5 + random.random()
                if stop is not None and stop.is_set():
                    raise TransferCancelled(f"{what} cancelled ({describe(error)})") from None
                log.warning("%s failed (%s); retrying in %.1f s", what, describe(error), delay)
                if stop is None:
                    time.sleep(delay)
                elif stop.wait(delay):
                    raise TransferCancelled(f"{what} cancelled ({describe(error)})") from None
        raise AssertionError("unreachable")  # pragma: no cover


def describe_error(error: BaseException) -> str:
    """A short, secret-free description of a backend error."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        info = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        error_code = str(info.get("Code", ""))
        return f"HTTP {status}" if error_code in ("", str(status)) else f"HTTP {status} {error_code}"
    code = getattr(error, "code", None)
    if isinstance(code, int):  # google.api_core exceptions
        return f"HTTP {code} {type(error).__name__}"
    return type(error).__name__


class ObjectStore(Protocol):
    """Objects under one prefix of one bucket (or directory). Keys are relative to the prefix."""

    def url(self, key: str = "") -> str:
        """``s3://bucket/prefix/key`` or similar, for messages (never holds credentials)."""
        ...

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        """The object's bytes and version token, or None when it does not exist.

        ``max_bytes``: read at most ``max_bytes + 1`` bytes (a ranged read), so that a caller
        can refuse an object larger than it expects without holding all of it in memory.
        """
        ...

    def write(
        self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None
    ) -> Optional[str]:
        """Stores ``data``; returns the new token, or None when the precondition failed.

        ``if_absent`` creates only if no object exists (S3 ``If-None-Match: *``, GCS
        ``ifGenerationMatch=0``); ``if_token`` replaces only the version with that token.
        """
        ...

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        """Deletes the object; False when it was absent or the precondition failed."""
        ...

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        ...

    def download_file(self, key: str, path: Path, progress: Optional[ProgressCallback] = None) -> None:
        """Downloads to ``path`` (overwriting); FileNotFoundError when the object is absent."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``."""
        ...


# Chunks of a copy that streams through the client: large enough for S3's 5 MiB minimum
# multipart part, small enough that a few in flight per transfer stay cheap.
COPY_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class ObjectChecksum:
    """An object's size and full-object CRC32C, as the store itself reports them.

    ``crc32c`` is base64 of the four big-endian bytes (see ``format.checksum``); None when the
    store keeps no full-object CRC32C for this object (an S3 object uploaded without one, or
    with a composite multipart checksum).
    """

    size: int
    crc32c: Optional[str]


class CopyableObjectStore(ObjectStore, Protocol):
    """An object store that can take part in a cache copy: it reports the checksum it computed
    for an object without sending its bytes, streams objects in and out without a local file,
    and copies server-side where the source lives on the same service."""

    def checksum(self, key: str) -> Optional[ObjectChecksum]:
        """The object's size and CRC32C (one metadata request; the directory backend reads the
        file to compute it); None when the object does not exist."""
        ...

    def ensure_checksum(self, key: str) -> Optional[ObjectChecksum]:
        """As ``checksum``, but where the store keeps no CRC32C for the object it is asked to
        compute one without the bytes passing through the client (S3: the object copied onto
        itself with ``ChecksumAlgorithm=CRC32C``; same bytes, new ETag). ``crc32c`` stays None
        only where the store cannot."""
        ...

    def read_chunks(self, key: str, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        """The object's bytes in order, in chunks of about ``chunk_bytes``; FileNotFoundError
        when it is absent. A failure part-way raises RemoteError (the caller starts over)."""
        ...

    def write_chunks(
        self, key: str, chunks: Iterable[bytes], size: int, progress: Optional[ProgressCallback] = None
    ) -> None:
        """Stores the concatenated ``chunks`` (``size`` bytes in all) as one object, with its
        CRC32C computed on the way and handed to the store (which checks it where it can), so that
        ``checksum`` reports it afterwards. Nothing touches the local disk."""
        ...

    def copy_from(
        self,
        source: ObjectStore,
        source_key: str,
        key: str,
        *,
        size: int,
        crc32c: Optional[str] = None,
        progress: Optional[ProgressCallback] = None,
    ) -> bool:
        """Copies ``source_key`` of ``source`` to ``key`` server-side (no byte through the client);
        False, doing nothing, when ``source`` is not on the same service as this store.
        ``crc32c``: the source's checksum where known (S3 needs it for a multipart copy)."""
        ...


def join_key(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def split_bucket_url(url: str) -> tuple[str, str]:
    """``scheme://bucket/some/prefix`` as ``("bucket", "some/prefix")``."""
    parsed = urlparse(url)
    if not parsed.netloc:
        raise ConfigError(f"storage URL {url!r} names no bucket")
    return parsed.netloc, parsed.path.strip("/")
