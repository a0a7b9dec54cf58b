"""The object-store contract every backend implements, and the retry policy they share.

A backend has a handful of primitives: read and write small objects (optionally
conditionally), transfer files, list and delete (``ObjectStore``); copy (``CopyableObjectStore``);
and, for object sources, HEAD, LIST and reads pinned to one version of an object
(``PinnedObjectStore``). "Not found" and "precondition failed" are answers; every other failure
(403, 5xx, timeouts, resets) is retried with backoff and then raised as RemoteError naming the
object, never read as "absent".
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import io
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, NamedTuple, Optional, Protocol, TypeVar
from urllib.parse import urlparse

from yogacache import redaction
from yogacache.errors import ConfigError, CorruptCacheError, YogaCacheError

log = redaction.get_logger(__name__)
T = TypeVar("T")

ProgressCallback = Callable[[int], None]  # called with bytes transferred since the last call

# Parallel part transfers of one pull or push; each may use several connections (ranged or
# multipart), so connection pools are sized from this.
DEFAULT_TRANSFER_THREADS = 4

# Local errors no retry can cure: the disk is full, or a quota is exhausted.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# ... and this process may write no larger file (``ulimit -f``): a limit of this node, not the remote.
_LOCAL_LIMITS = (*_DISK_FULL, errno.EFBIG)


class RemoteError(YogaCacheError):
    """A request to the object store failed (after retries); the cache was left untouched.

    ``reason``: what went wrong, without the request or the object (``RetryPolicy`` sets it to
    the backend's description), for callers that name the object their own way.
    """

    def __init__(self, message: str, reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.reason = reason if reason is not None else message


#: Where an S3 endpoint comes from, as a connection failure's advice says (the CLI names its
#: ``--endpoint-url`` instead when one was passed).
ENDPOINT_HINT = "check endpoint_url in the config or AWS_ENDPOINT_URL"


class MissingBucketError(RemoteError):
    """The bucket (an Azure container) does not exist: whatever the request (a LIST, a GET, a
    lease's PUT), one message naming the bucket and the endpoint, never retried."""


class ObjectChangedError(RemoteError):
    """A read pinned to one version of an object (``ObjectPin``) found another version (it was
    overwritten: S3 412 on ``IfMatch``, GCS 412 on ``ifGenerationMatch``) or none (it, or the pinned
    version, was deleted: ``deleted`` is True). Never retried: the caller starts over or gives up."""

    def __init__(self, message: str, *, deleted: bool) -> None:
        super().__init__(message)
        self.deleted = deleted

    @classmethod
    def of(cls, url: str, pin: ObjectPin, *, deleted: bool) -> ObjectChangedError:
        """The error for the object at ``url`` read as version ``pin``: gone, or another version."""
        what = f"{url} ({pin.describe()}) is gone" if deleted else f"{url} is no longer {pin.describe()}"
        return cls(what, deleted=deleted)


class TransferCancelled(YogaCacheError):
    """A transfer was stopped because its batch failed or was interrupted; never retried."""


class ObjectSizeError(CorruptCacheError):
    """An object holds another number of bytes than its reader knows it holds (a part's size in a
    manifest: ``download_file(size=...)``) or allows (a small object's cap: ``read_capped``): an
    integrity error, never retried (asking again returns the same object). ``actual`` is None
    where only "more than ``expected``" is known; ``token`` is the object's version token where
    one was read."""

    def __init__(
        self, url: str, expected: int, actual: Optional[int], *, token: Optional[str] = None, cap: bool = False
    ) -> None:
        if actual is None:
            holds = f"more than {expected} bytes"
        else:
            holds = f"{actual} bytes"
        bound = f"at most {expected}" if cap else f"{expected}"
        super().__init__(f"{url} holds {holds}, where {bound} were expected")
        self.url = url
        self.expected = expected
        self.actual = actual
        self.token = token


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
            except (RemoteError, FileNotFoundError, TransferCancelled, ObjectSizeError):
                raise  # answers, or a stop asked for: not failures
            except Exception as error:  # the backend's own exception types
                if isinstance(error, OSError) and error.errno in _LOCAL_LIMITS:
                    raise  # this node's disk or limits, not the remote: retrying cannot help
                if not is_transient(error) or attempt == self.attempts:
                    reason = redaction.redact_text(describe(error))
                    raise RemoteError(f"{what} failed after {attempt} attempt(s): {reason}", reason) from None
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


@dataclass(frozen=True)
class ObjectPin:
    """One object as it is now, with what pins its version on its service: the answer of
    ``head`` and ``list_page``, and what ``read_range`` / ``open_stream`` read conditionally on.

    ``key`` is relative to the store's prefix (a source opens its backend at the bucket root, so
    there it is the whole key). Only the fields the service has are set: S3 ``etag`` (quotes
    stripped) and ``version_id`` (a versioned bucket, where a version was asked for); GCS
    ``etag`` and ``generation``; Azure ``etag`` and ``version_id``; the directory backend
    ``mtime_ns`` (size and modification time pin a file).
    """

    key: str
    size: int
    etag: Optional[str] = None
    version_id: Optional[str] = None
    generation: Optional[int] = None
    mtime_ns: Optional[int] = None

    def describe(self) -> str:
        """The version this pin names, for messages: ``generation 5``, ``ETag abc`` or ``mtime 123``."""
        if self.generation is not None:
            return f"generation {self.generation}"
        if self.version_id is not None:
            return f"version {self.version_id}"
        if self.etag is not None:
            return f"ETag {self.etag}"
        return f"size {self.size}, mtime {self.mtime_ns}"


class PinnedPage(NamedTuple):
    """One LIST page of ``list_page``: the objects in key order, whether more follow, and the
    service's token for the next page (``list_page(..., token=page.token)``; None at the end)."""

    objects: list[ObjectPin]
    more: bool
    token: Optional[str] = None


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

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        """Downloads to ``path`` (overwriting); FileNotFoundError when the object is absent.

        ``size``: the bytes the caller knows the object holds (a part's size in its manifest). An
        object of another size raises ObjectSizeError, never retried, with no more than ``size``
        of its bytes written (a ranged read of ``size + 1`` bytes, or the size asked first, and a
        ``SizedWriter``): an object swapped for a larger one never fills the disk.
        """
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``."""
        ...


def read_capped(objects: ObjectStore, key: str, max_bytes: int) -> Optional[tuple[bytes, str]]:
    """The bytes and version token of a small object (a manifest, a lease), or None when it does
    not exist: the one way a store reads a whole object. The read is ranged (``max_bytes + 1``
    bytes), so an object larger than any real one of its kind never sits whole in memory; it
    raises ObjectSizeError naming the object (with its token, so that it can still be replaced)."""
    found = objects.read(key, max_bytes=max_bytes)
    if found is not None and len(found[0]) > max_bytes:
        raise ObjectSizeError(objects.url(key), max_bytes, None, token=found[1], cap=True)
    return found


class SizedWriter(io.RawIOBase):
    """A file that a download of an object of known ``size`` writes into: each write is passed to
    ``handle`` and counted (and reported to ``progress``), and one that would take it past
    ``size`` bytes raises ObjectSizeError instead, unwritten; ``check`` says when fewer came.
    Seeks pass through (parallel ranged downloads write each range at its offset)."""

    def __init__(self, handle: Any, url: str, size: int, progress: Optional[ProgressCallback] = None) -> None:
        self._handle = handle
        self._url = url
        self._size = size
        self._progress = progress
        self.written = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._handle.seekable())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self._handle.tell())

    def write(self, data: Any) -> int:
        count = memoryview(data).nbytes
        if self.written + count > self._size:
            raise ObjectSizeError(self._url, self._size, None)
        self._handle.write(data)
        self.written += count
        if self._progress is not None and count:
            self._progress(count)
        return count

    def check(self) -> None:
        """ObjectSizeError when the object ended before ``size`` bytes."""
        if self.written != self._size:
            raise ObjectSizeError(self._url, self._size, self.written)


# Pinned reads (what object sources need)
LIST_PAGE = 1000  # objects per LIST request of ``list_page``
RANGE_BLOCK = 1 << 20  # the least an ``open_ranged`` read asks for (zip central directories, headers)
STREAM_CHUNK = 8 << 20  # the ranged reads an ``open_stream`` over ``read_range`` is made of


class PinnedObjectStore(ObjectStore, Protocol):
    """An object store that sources read from: HEAD and LIST with the tokens that pin an
    object's version (ETag, version id, generation), and reads conditional on them, so that an
    object overwritten between the listing and the read fails the read (``ObjectChangedError``)
    instead of mixing versions. Backends subclass it explicitly and inherit ``open_ranged`` and
    (unless they have a cheaper one) ``open_stream``, both made of ``read_range``.

    Every request goes through the backend's ``RetryPolicy`` (transient failures retried, then
    RemoteError); "absent" is an answer (None), never an error. ``metadata_requests`` counts the
    HEAD and LIST requests made (one per ``head``, one per ``list_page``), which is what a
    freshness check costs; ``served_versions`` records, per key, the version id the service
    said it served a read of (S3/Azure versioned buckets; empty elsewhere), which a source adds
    to its pins. A backend's ``__init__`` sets both (``0`` and ``{}``).
    """

    metadata_requests: int
    served_versions: dict[str, str]

    def head(
        self, key: str, *, version_id: Optional[str] = None, generation: Optional[int] = None
    ) -> Optional[ObjectPin]:
        """The object's size and pin (one HEAD request), or None when it (or the version asked
        for) does not exist. ``version_id`` (S3/Azure) or ``generation`` (GCS) asks for that
        version instead of the current one; a backend ignores the one its service does not have.
        The answer carries ``version_id`` only when one was asked for (an unversioned read of a
        versioned bucket stays pinned by ETag)."""
        ...

    def list_page(
        self, prefix: str, start_at: Optional[str] = None, page_size: int = LIST_PAGE, token: Optional[str] = None
    ) -> PinnedPage:
        """One LIST request: up to ``page_size`` objects whose key starts with ``prefix`` (a plain
        string prefix, not only a "directory"), in key order, each with its pin; whether more
        follow, and the token of the next page. ``token`` (a page's ``token``) continues a
        listing; else it starts at the key ``start_at`` (inclusive; None: the first key). A
        service that cannot start a listing at a key (Azure) may start before it and drop the
        keys below ``start_at``: the page then holds fewer objects (maybe none, ``more`` still
        True); a backend that can start there does. A key ending in ``/`` (a "directory
        marker") is listed like any other; the caller skips it. The directory backend lists the
        regular files under the directory that ``prefix`` names or lies in; symbolic links are
        no objects."""
        ...

    def list_pinned(self, prefix: str) -> list[ObjectPin]:
        """Every object whose key starts with ``prefix``, with its pin: ``list_page`` after
        ``list_page`` (one request per ``LIST_PAGE`` objects)."""
        page = self.list_page(prefix)
        found = list(page.objects)
        while page.more and page.token is not None:
            page = self.list_page(prefix, token=page.token)
            found.extend(page.objects)
        return found

    def read_range(self, pin: ObjectPin, start: int, stop: int) -> bytes:
        """Bytes ``start`` to ``stop`` (exclusive) of the version ``pin`` names, read conditionally
        on it (S3 ``IfMatch`` + ``VersionId``, GCS ``ifGenerationMatch``, Azure ``If-Match`` +
        ``versionid``, files: size and mtime unchanged); fewer only at the object's end.
        ObjectChangedError when the object is no longer that version (or is gone)."""
        ...

    def open_stream(self, pin: ObjectPin) -> BinaryIO:
        """The whole object of version ``pin``, as a forward-only file (``read``, ``close``)
        conditional as ``read_range`` is: ObjectChangedError on opening (or on a later read) when
        the object changed; a transfer that fails part-way raises RemoteError. The default reads
        ranges of ``STREAM_CHUNK`` bytes in turn; S3 streams one GET."""
        return io.BufferedReader(RangedFile(pin.size, lambda a, b: self.read_range(pin, a, b)),  # type: ignore[return-value]
                                 buffer_size=STREAM_CHUNK)

    def open_ranged(self, pin: ObjectPin) -> BinaryIO:
        """A seekable file over the object of version ``pin`` (zip central directories), each read
        a conditional ``read_range`` of at least ``RANGE_BLOCK`` bytes."""
        return io.BufferedReader(RangedFile(pin.size, lambda a, b: self.read_range(pin, a, b)),  # type: ignore[return-value]
                                 buffer_size=RANGE_BLOCK)


class RangedFile(io.RawIOBase):
    """A seekable, read-only file over ranged reads (``fetch(start, stop)``) of an object of known size."""

    def __init__(self, size: int, fetch: Callable[[int, int], bytes]) -> None:
        self._size = size
        self._fetch = fetch
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        stop = min(self._size, self._position + len(view))
        if stop <= self._position:
            return 0
        data = self._fetch(self._position, stop)
        count = len(data)
        view[:count] = data
        self._position += count
        return count


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
        ``crc32c``: the source's checksum where known (S3 needs it for a multipart copy).
        Backends subclass this protocol and implement ``copy_server_side``: this is the one place
        the arguments are taken apart."""
        return self.copy_server_side(ServerCopy(source, source_key, key, size, crc32c, progress))

    def copy_server_side(self, copy: ServerCopy) -> bool:
        """``copy_from``'s work: the copy, or False (doing nothing) where ``copy.source`` is not on
        this store's service; FileNotFoundError when the source object is absent."""
        ...


@dataclass(frozen=True)
class ServerCopy:
    """One server-side copy asked of ``CopyableObjectStore.copy_from``."""

    source: ObjectStore
    source_key: str
    key: str
    size: int
    crc32c: Optional[str] = None
    progress: Optional[ProgressCallback] = None

    def copied(self, count: int) -> None:
        """Reports ``count`` more bytes copied (to ``progress``, where given)."""
        if self.progress is not None and count:
            self.progress(count)


def join_key(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def split_bucket_url(url: str) -> tuple[str, str]:
    """``scheme://bucket/some/prefix`` as ``("bucket", "some/prefix")``."""
    parsed = urlparse(url)
    if not parsed.netloc:
        raise ConfigError(f"storage URL {redaction.describe(url)} names no bucket")
    return parsed.netloc, parsed.path.strip("/")
