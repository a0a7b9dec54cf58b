"""Source objects: listing, HEAD and conditional reads of S3 objects, GCS objects and local files.

Every read is pinned to the version that was listed: S3 reads send ``IfMatch`` (and
``VersionId`` when one is pinned), GCS reads send ``ifGenerationMatch`` for the listed
generation, and a local file must keep its size and modification time. An object overwritten
between the listing and the read therefore fails the read (``SourceChangedError``) instead of
mixing versions. boto3 and google-cloud-storage are imported only when an URL needs them.
"""

from __future__ import annotations

import io
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Optional, Protocol, Sequence, Union

from yogacache.sources.errors import SourceChangedError, SourceError
from yogacache.sources.urls import Location

LIST_PAGE = 1000
RANGE_BLOCK = 1 << 20  # the least a ranged read asks for (zip central directories, headers)
STREAM_CHUNK = 8 << 20  # GCS streams are sequential ranged reads of this size
READ_AHEAD_STREAM = 16 << 20  # the bytes of an object stream read ahead of its decoder (ReadAhead)


@dataclass(frozen=True)
class ObjectRef:
    """One source object as listed: what the manifest pins and every read is conditional on."""

    location: Location
    size: int
    etag: Optional[str] = None
    version_id: Optional[str] = None  # S3
    generation: Optional[int] = None  # GCS
    mtime_ns: Optional[int] = None  # local files

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def name(self) -> str:
        """The object's key (a path for local files)."""
        return self.location.key

    def pin(self) -> dict[str, Any]:
        """The manifest's record of this object (only the fields that are known)."""
        fields = {"url": self.url, "size": self.size, "etag": self.etag, "version_id": self.version_id,
                  "generation": self.generation, "mtime_ns": self.mtime_ns}
        return {key: value for key, value in fields.items() if value is not None}

    def differences(self, other: Optional[ObjectRef]) -> list[str]:
        """How ``other`` (the object as it is now) differs from this pin; ``["deleted"]`` when gone."""
        if other is None:
            return ["deleted"]
        changed = []
        for field in ("size", "etag", "generation", "mtime_ns"):
            mine, theirs = getattr(self, field), getattr(other, field)
            if mine is not None and theirs is not None and mine != theirs:
                changed.append(f"{field} {mine} -> {theirs}")
        return changed


def ref_from_pin(pin: dict[str, Any], location: Location) -> ObjectRef:
    return ObjectRef(
        location,
        int(pin.get("size", 0)),
        pin.get("etag"),
        pin.get("version_id"),
        pin.get("generation"),
        pin.get("mtime_ns"),
    )


class ObjectAccess(Protocol):
    """What a source needs of one storage (S3, GCS, local files). ``requests`` counts the
    listing and HEAD requests made, for the freshness check's cost."""

    requests: int

    def list(self, prefix: Location) -> list[ObjectRef]: ...

    def list_from(self, prefix: Location, start: str) -> tuple[Sequence[ObjectRef], bool]: ...

    def head(self, location: Location, version_id: Optional[str] = None,
             generation: Optional[int] = None) -> Optional[ObjectRef]: ...

    def open_stream(self, ref: ObjectRef) -> BinaryIO: ...

    def open_ranged(self, ref: ObjectRef) -> BinaryIO: ...


def _strip_etag(etag: Optional[str]) -> Optional[str]:
    return etag.strip('"') if etag else etag


class S3Access:
    """S3 and S3-compatible servers (``AWS_ENDPOINT_URL`` or ``endpoint_url`` selects one)."""

    def __init__(self, endpoint_url: Optional[str] = None) -> None:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            raise ImportError("reading s3:// sources needs boto3: pip install 'yogacache[s3]'") from None
        self._errors = botocore.exceptions
        self._failures = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
        config = botocore.config.Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=16)
        self._client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)
        self.requests = 0
        self.versions: dict[str, str] = {}  # URL -> the VersionId a read was served

    def _code(self, error: BaseException) -> str:
        if isinstance(error, self._errors.ClientError):
            return str(error.response.get("Error", {}).get("Code", ""))
        return ""

    def _fail(self, error: BaseException, url: str, ref: Optional[ObjectRef] = None) -> SourceError:
        code = self._code(error)
        if code in ("412", "PreconditionFailed") and ref is not None:
            return SourceChangedError(
                f"source object {url} changed while it was read (it was ETag {ref.etag}): it was "
                "overwritten during the build; nothing was cached. Build again once it is stable"
            )
        if code in ("404", "NoSuchKey", "NoSuchVersion", "NotFound"):
            return SourceChangedError(f"source object {url} does not exist (or no longer exists)")
        if isinstance(error, (self._errors.NoCredentialsError, self._errors.PartialCredentialsError)):
            return SourceError(f"cannot read source object {url}: no S3 credentials; set AWS_ACCESS_KEY_ID/"
                               "AWS_SECRET_ACCESS_KEY or AWS_PROFILE")
        if isinstance(error, self._errors.EndpointConnectionError):
            return SourceError(f"cannot read source object {url}: cannot connect to the S3 endpoint "
                               f"{self._client.meta.endpoint_url} (endpoint_url= or AWS_ENDPOINT_URL)")
        return SourceError(f"cannot read source object {url}: {code or type(error).__name__}")

    def list(self, prefix: Location) -> list[ObjectRef]:
        found: list[ObjectRef] = []
        token: Optional[str] = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            self.requests += 1
            try:
                page = self._client.list_objects_v2(Bucket=prefix.bucket, Prefix=prefix.key, MaxKeys=LIST_PAGE, **extra)
            except self._failures as error:
                raise self._fail(error, prefix.url) from None
            for item in page.get("Contents", []):
                found.append(ObjectRef(prefix.child(item["Key"]), int(item["Size"]), _strip_etag(item.get("ETag"))))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return found

    def list_from(self, prefix: Location, start: str) -> tuple[Sequence[ObjectRef], bool]:
        """One LIST page of the objects under ``prefix`` from the key ``start`` on, in key order
        (S3 starts *after* a key: a few keys just below ``start`` may come first), and whether
        more follow."""
        self.requests += 1
        extra = {"StartAfter": start[:-1]} if len(start) > 1 else {}
        try:
            page = self._client.list_objects_v2(Bucket=prefix.bucket, Prefix=prefix.key, MaxKeys=LIST_PAGE, **extra)
        except self._failures as error:
            raise self._fail(error, prefix.url) from None
        found = [ObjectRef(prefix.child(item["Key"]), int(item["Size"]), _strip_etag(item.get("ETag")))
                 for item in page.get("Contents", [])]
        return found, bool(page.get("IsTruncated"))

    def head(self, location: Location, version_id: Optional[str] = None,
             generation: Optional[int] = None) -> Optional[ObjectRef]:
        self.requests += 1
        extra = {"VersionId": version_id} if version_id else {}
        try:
            answer = self._client.head_object(Bucket=location.bucket, Key=location.key, **extra)
        except self._failures as error:
            if self._code(error) in ("404", "NoSuchKey", "NoSuchVersion", "NotFound", "400"):
                return None
            raise self._fail(error, location.url) from None
        return ObjectRef(location, int(answer["ContentLength"]), _strip_etag(answer.get("ETag")),
                         answer.get("VersionId") if version_id else None)

    def _get(self, ref: ObjectRef, **extra: Any) -> Any:
        if ref.etag:
            extra["IfMatch"] = f'"{ref.etag}"'
        if ref.version_id:
            extra["VersionId"] = ref.version_id
        try:
            answer = self._client.get_object(Bucket=ref.location.bucket, Key=ref.location.key, **extra)
        except self._failures as error:
            raise self._fail(error, ref.url, ref) from None
        if answer.get("VersionId") and answer["VersionId"] != "null":  # a versioned bucket
            self.versions[ref.url] = answer["VersionId"]
        return answer

    def open_stream(self, ref: ObjectRef) -> BinaryIO:
        body = self._get(ref)["Body"]
        return _GuardedStream(body, ref.url, self._errors.BotoCoreError)  # type: ignore[return-value]

    def open_ranged(self, ref: ObjectRef) -> BinaryIO:
        def fetch(start: int, stop: int) -> bytes:
            return bytes(self._get(ref, Range=f"bytes={start}-{stop - 1}")["Body"].read())

        return io.BufferedReader(RangedFile(ref.size, fetch), buffer_size=RANGE_BLOCK)  # type: ignore[return-value]


class GCSAccess:
    """Google Cloud Storage (``STORAGE_EMULATOR_HOST`` selects an emulator)."""

    def __init__(self) -> None:
        try:
            from google.api_core import exceptions as gexc
            from google.cloud import storage as gcs
        except ImportError:
            raise ImportError(
                "reading gs:// sources needs google-cloud-storage: pip install 'yogacache[gcs]'"
            ) from None
        self._gexc = gexc
        try:
            self._client = gcs.Client()
        except Exception as error:  # google.auth's DefaultCredentialsError, a missing project
            raise SourceError(
                f"cannot open Google Cloud Storage for gs:// sources ({type(error).__name__}): set "
                "GOOGLE_APPLICATION_CREDENTIALS, run 'gcloud auth application-default login', or set "
                "STORAGE_EMULATOR_HOST for an emulator"
            ) from None
        self.requests = 0

    def _fail(self, error: BaseException, url: str, ref: Optional[ObjectRef] = None) -> SourceError:
        if isinstance(error, self._gexc.PreconditionFailed) and ref is not None:
            return SourceChangedError(
                f"source object {url} changed while it was read (it was generation {ref.generation}): "
                "it was overwritten during the build; nothing was cached. Build again once it is stable"
            )
        if isinstance(error, self._gexc.NotFound) and ref is not None:
            return SourceChangedError(
                f"source object {url} changed or was deleted while it was read (generation {ref.generation} "
                "is gone); nothing was cached. Build again once it is stable"
            )
        if isinstance(error, self._gexc.NotFound):
            return SourceChangedError(f"source object {url} does not exist (or no longer exists)")
        return SourceError(f"cannot read source object {url}: {type(error).__name__}")

    def _ref(self, location: Location, blob: Any) -> ObjectRef:
        return ObjectRef(location, int(blob.size or 0), blob.etag, None, int(blob.generation))

    def list(self, prefix: Location) -> list[ObjectRef]:
        found: list[ObjectRef] = []
        try:
            pages = self._client.list_blobs(prefix.bucket, prefix=prefix.key, page_size=LIST_PAGE).pages
            for page in pages:
                self.requests += 1
                found.extend(self._ref(prefix.child(blob.name), blob) for blob in page)
        except self._gexc.GoogleAPIError as error:
            raise self._fail(error, prefix.url) from None
        return found

    def list_from(self, prefix: Location, start: str) -> tuple[Sequence[ObjectRef], bool]:
        """One LIST page of the objects under ``prefix`` from the name ``start`` on (``startOffset``),
        in name order, and whether more follow."""
        self.requests += 1
        try:
            blobs = self._client.list_blobs(prefix.bucket, prefix=prefix.key, start_offset=start, page_size=LIST_PAGE)
            page = next(iter(blobs.pages), None)
            found = [self._ref(prefix.child(blob.name), blob) for blob in page or []]
        except self._gexc.GoogleAPIError as error:
            raise self._fail(error, prefix.url) from None
        return found, bool(blobs.next_page_token)

    def head(self, location: Location, version_id: Optional[str] = None,
             generation: Optional[int] = None) -> Optional[ObjectRef]:
        self.requests += 1
        try:
            blob = self._client.bucket(location.bucket).get_blob(location.key, generation=generation)
        except self._gexc.NotFound:
            return None
        except self._gexc.GoogleAPIError as error:
            raise self._fail(error, location.url) from None
        return None if blob is None else self._ref(location, blob)

    def _fetcher(self, ref: ObjectRef) -> Callable[[int, int], bytes]:
        blob = self._client.bucket(ref.location.bucket).blob(ref.location.key, generation=ref.generation)

        def fetch(start: int, stop: int) -> bytes:
            try:
                return bytes(blob.download_as_bytes(start=start, end=stop - 1, if_generation_match=ref.generation,
                                                    checksum=None))
            except self._gexc.GoogleAPIError as error:
                raise self._fail(error, ref.url, ref) from None

        return fetch

    def open_stream(self, ref: ObjectRef) -> BinaryIO:
        raw = RangedFile(ref.size, self._fetcher(ref))
        return io.BufferedReader(raw, buffer_size=STREAM_CHUNK)  # type: ignore[return-value]

    def open_ranged(self, ref: ObjectRef) -> BinaryIO:
        return io.BufferedReader(RangedFile(ref.size, self._fetcher(ref)), buffer_size=RANGE_BLOCK)  # type: ignore[return-value]


class LocalAccess:
    """Files on a local or mounted filesystem, pinned by size and modification time."""

    def __init__(self) -> None:
        self.requests = 0

    @staticmethod
    def _ref(location: Location, stat: os.stat_result) -> ObjectRef:
        return ObjectRef(location, stat.st_size, mtime_ns=stat.st_mtime_ns)

    def list(self, prefix: Location) -> list[ObjectRef]:
        root = Path(prefix.key)
        found = []
        for directory, subdirs, files in os.walk(root):
            subdirs.sort()
            for name in sorted(files):
                path = Path(directory) / name
                stat = path.lstat()
                if path.is_file() and not path.is_symlink():
                    found.append(self._ref(prefix.child(str(path)), stat))
        return sorted(found, key=lambda ref: ref.name)

    def list_from(self, prefix: Location, start: str) -> tuple[Sequence[ObjectRef], bool]:
        """The files whose path starts with ``prefix`` (a path or any start of one), from ``start`` on."""
        directory = prefix.key if prefix.key.endswith(os.sep) else os.path.dirname(prefix.key)
        found = self.list(prefix.child(directory or os.curdir))
        return [ref for ref in found if ref.name.startswith(prefix.key) and ref.name >= start], False

    def head(self, location: Location, version_id: Optional[str] = None,
             generation: Optional[int] = None) -> Optional[ObjectRef]:
        try:
            stat = os.stat(location.key)
        except FileNotFoundError:
            return None
        return self._ref(location, stat) if Path(location.key).is_file() else None

    def _open(self, ref: ObjectRef) -> BinaryIO:
        try:
            handle = open(ref.name, "rb")
        except FileNotFoundError:
            raise SourceChangedError(f"source file {ref.url} no longer exists") from None
        if self._ref(ref.location, os.fstat(handle.fileno())).differences(ref):
            handle.close()
            raise SourceChangedError(f"source file {ref.url} changed since it was listed; nothing was cached")
        return handle

    def open_stream(self, ref: ObjectRef) -> BinaryIO:
        return self._open(ref)

    def open_ranged(self, ref: ObjectRef) -> BinaryIO:
        return self._open(ref)


class RangedFile(io.RawIOBase):
    """A seekable, read-only file over ranged reads of an object of known size."""

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


class ReadAhead:
    """Reads a stream on a thread, up to ``ahead`` bytes before its reader, so that the network
    and the decoding overlap; the thread's error is raised to the reader."""

    def __init__(self, stream: Any, chunk: int = 1 << 20, ahead: int = READ_AHEAD_STREAM) -> None:
        self._stream = stream
        self._chunks: queue.Queue[Union[bytes, BaseException]] = queue.Queue(maxsize=max(1, ahead // chunk))
        self._buffer = b""
        self._done = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, args=(chunk,), daemon=True, name="yogacache-read-ahead")
        self._thread.start()

    def _pump(self, chunk: int) -> None:
        try:
            while not self._stop.is_set():
                data = self._stream.read(chunk)
                self._put(data)
                if not data:
                    return
        except BaseException as error:  # handed to the reader
            self._put(error)

    def _put(self, item: Union[bytes, BaseException]) -> None:
        while not self._stop.is_set():
            try:
                self._chunks.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _next(self) -> bytes:
        item = self._chunks.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if not item:
            self._done = True
        return item

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            parts = [self._buffer]
            while not self._done:
                parts.append(self._next())
            self._buffer = b""
            return b"".join(parts)
        while len(self._buffer) < size and not self._done:
            more = self._next()
            self._buffer = self._buffer + more if self._buffer else more
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._stream.close()


class _GuardedStream:
    """A streamed body whose transport errors (a connection cut, a short body) become SourceError."""

    def __init__(self, body: Any, url: str, transport_error: type[BaseException]) -> None:
        self._body = body
        self._url = url
        self._transport_error = transport_error

    def read(self, size: int = -1) -> bytes:
        try:
            return bytes(self._body.read(None if size < 0 else size))
        except (self._transport_error, OSError) as error:
            raise SourceError(f"reading source object {self._url} failed: {type(error).__name__}") from None

    def close(self) -> None:
        self._body.close()


_ACCESS: dict[str, Callable[..., ObjectAccess]] = {"s3": S3Access, "gs": GCSAccess, "file": LocalAccess}


class Accessors:
    """One access object per scheme, made on first use (one S3 client for every s3:// URL)."""

    def __init__(self, endpoint_url: Optional[str] = None) -> None:
        self.endpoint_url = endpoint_url
        self._made: dict[str, ObjectAccess] = {}

    def __call__(self, scheme: str) -> ObjectAccess:
        if scheme not in self._made:
            self._made[scheme] = S3Access(self.endpoint_url) if scheme == "s3" else _ACCESS[scheme]()
        return self._made[scheme]

    @property
    def requests(self) -> int:
        return sum(access.requests for access in self._made.values())

    def all(self) -> Iterator[ObjectAccess]:
        return iter(self._made.values())
