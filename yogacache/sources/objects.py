"""Source objects: listing, HEAD and conditional reads of objects, through the backends.

Sources hold no storage client of their own: each bucket (the filesystem, for local files) is
opened once through the backend registry (``backends.registry``) and read through the backend
contract's pinned reads (``backends.base.PinnedObjectStore``). Every read is pinned to the
version that was listed: S3 reads send ``IfMatch`` (and ``VersionId`` when one is pinned), GCS
reads ``ifGenerationMatch`` for the listed generation, and a local file must keep its size and
modification time. An object overwritten between the listing and the read therefore fails the
read (``SourceChangedError``) instead of mixing versions.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Optional, Sequence, Union

from yogacache.backends.base import MissingBucketError, ObjectChangedError, ObjectPin, PinnedObjectStore, RemoteError
from yogacache.backends.registry import backend_settings, open_backend
from yogacache.errors import ConfigError
from yogacache.sources.errors import SourceChangedError, SourceError
from yogacache.sources.urls import Location

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

    def store_pin(self) -> ObjectPin:
        """What the backend reads conditionally on."""
        return ObjectPin(self.location.store_key, self.size, self.etag, self.version_id, self.generation,
                         self.mtime_ns)

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


@contextlib.contextmanager
def _as_source_errors(url: str, ref: Optional[ObjectRef] = None) -> Iterator[None]:
    """The backend's errors as a source's: a changed object is SourceChangedError (nothing is
    cached), any other failure SourceError naming the object."""
    try:
        yield
    except ObjectChangedError as error:
        raise _changed(url, ref, error) from None
    except MissingBucketError as error:  # about the bucket, whatever was asked of it
        raise SourceError(f"cannot read source {url.rstrip('/')}: {error}") from None
    except RemoteError as error:
        raise SourceError(f"cannot read source object {url}: {error.reason}") from None


def _changed(url: str, ref: Optional[ObjectRef], error: ObjectChangedError) -> SourceChangedError:
    if ref is None:
        return SourceChangedError(f"source object {url} does not exist (or no longer exists)")
    pinned = ref.store_pin().describe()
    if error.deleted:
        return SourceChangedError(
            f"source object {url} changed or was deleted while it was read ({pinned} is gone); nothing was "
            "cached. Build again once it is stable"
        )
    return SourceChangedError(
        f"source object {url} changed while it was read (it was {pinned}): it was overwritten during the "
        "build; nothing was cached. Build again once it is stable"
    )


class SourceStorage:
    """One bucket (or the filesystem) as a source reads it: ``Location``s and ``ObjectRef``s in,
    the backend's pinned reads underneath, source errors out."""

    def __init__(self, store: PinnedObjectStore, root: Location) -> None:
        self.store = store
        self.root = root

    @property
    def requests(self) -> int:
        """The listing and HEAD requests made (a freshness check's cost)."""
        return self.store.metadata_requests

    @property
    def versions(self) -> dict[str, str]:
        """URL -> the version id a read was served (versioned buckets)."""
        return {self.root.at_store_key(key).url: version for key, version in self.store.served_versions.items()}

    def _ref(self, pin: ObjectPin) -> ObjectRef:
        return ObjectRef(self.root.at_store_key(pin.key), pin.size, pin.etag, pin.version_id, pin.generation,
                         pin.mtime_ns)

    def list(self, prefix: Location) -> list[ObjectRef]:
        """Every object under ``prefix`` (a key prefix; a directory for files)."""
        key = prefix.store_key
        if prefix.scheme == "file":  # a directory: what is inside it, not beside it
            key = key.rstrip("/") + "/" if key.rstrip("/") else ""
        with _as_source_errors(prefix.url):
            return [self._ref(pin) for pin in self.store.list_pinned(key)]

    def list_from(self, prefix: Location, start: str) -> tuple[Sequence[ObjectRef], bool]:
        """One LIST page of the objects under ``prefix`` from the key ``start`` on, in key order,
        and whether more follow."""
        with _as_source_errors(prefix.url):
            page = self.store.list_page(prefix.store_key, start_at=prefix.child(start).store_key)
        return [self._ref(pin) for pin in page.objects], page.more

    def head(self, location: Location, version_id: Optional[str] = None,
             generation: Optional[int] = None) -> Optional[ObjectRef]:
        with _as_source_errors(location.url):
            pin = self.store.head(location.store_key, version_id=version_id, generation=generation)
        return None if pin is None else self._ref(pin)

    def open_stream(self, ref: ObjectRef) -> BinaryIO:
        """The whole object, read as it arrives (failing when it changes)."""
        with _as_source_errors(ref.url, ref):
            stream = self.store.open_stream(ref.store_pin())
        return _Guarded(stream, ref)  # type: ignore[return-value]

    def open_ranged(self, ref: ObjectRef) -> BinaryIO:
        """A seekable file over the object (zip central directories)."""
        with _as_source_errors(ref.url, ref):
            handle = self.store.open_ranged(ref.store_pin())
        return _Guarded(handle, ref)  # type: ignore[return-value]


class _Guarded:
    """A backend's file whose errors are a source's (``_as_source_errors``)."""

    def __init__(self, handle: Any, ref: ObjectRef) -> None:
        self._handle = handle
        self._ref = ref

    def read(self, size: int = -1) -> bytes:
        with _as_source_errors(self._ref.url, self._ref):
            return bytes(self._handle.read(size))

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self._handle.tell())

    def seekable(self) -> bool:
        return bool(self._handle.seekable())

    def close(self) -> None:
        self._handle.close()


class Accessors:
    """The backends a source reads through, opened on first use: one per bucket (one for local
    files), through the registry; ``endpoint_url`` goes to the backends that take one."""

    def __init__(self, endpoint_url: Optional[str] = None) -> None:
        self.endpoint_url = endpoint_url
        self._made: dict[str, SourceStorage] = {}
        self._endpoint_schemes: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, location: Location) -> SourceStorage:
        root = location.child("")
        with self._lock:
            if root.store_url not in self._made:
                settings = {}
                if self.endpoint_url is not None and "endpoint_url" in backend_settings(location.scheme):
                    settings["endpoint_url"] = self.endpoint_url
                    self._endpoint_schemes.add(location.scheme)
                    if len(self._endpoint_schemes) > 1:  # one endpoint cannot name two services
                        raise SourceError(
                            "endpoint_url names one service's endpoint, but these sources read "
                            f"{' and '.join(f'{scheme}://' for scheme in sorted(self._endpoint_schemes))} "
                            "objects: build from one service's objects at a time, or give no endpoint_url"
                        )
                try:
                    store = open_backend(root.store_url, **settings)
                except ConfigError as error:
                    raise SourceError(f"cannot open {location.scheme}:// sources: {error}") from None
                self._made[root.store_url] = SourceStorage(store, root)  # type: ignore[arg-type]
            return self._made[root.store_url]

    @property
    def requests(self) -> int:
        return sum(storage.requests for storage in self._made.values())

    def all(self) -> Iterator[SourceStorage]:
        return iter(list(self._made.values()))


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
