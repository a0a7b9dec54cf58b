"""Google Cloud Storage object store; imported only when GCS is used.

Credentials come from the standard Google chain; ``STORAGE_EMULATOR_HOST`` points the client at
an emulator. Generations are the version tokens (``ifGenerationMatch``).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

from yogacache.backends import base
from yogacache.backends.base import (
    COPY_CHUNK_BYTES,
    DEFAULT_TRANSFER_THREADS,
    ObjectChecksum,
    ProgressCallback,
    TransferCancelled,
    describe_error,
    join_key,
    split_bucket_url,
)
from yogacache.errors import ConfigError
from yogacache.format.checksum import is_crc32c

try:
    import google.auth.exceptions as gauth
    import requests.adapters
    from google.api_core import exceptions as gexc
    from google.cloud import storage as gcs
except ImportError:  # pragma: no cover - exercised only without the library
    raise ImportError("GCS storage needs google-cloud-storage: pip install 'yogacache[gcs]'") from None

_CHUNK = 32 << 20
_CREDENTIALS_HINT = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run "
    "'gcloud auth application-default login', or set STORAGE_EMULATOR_HOST for an emulator"
)


def _is_transient(error: BaseException) -> bool:
    # A PreconditionFailed here is a generation that changed under a read: read again.
    # Credentials that cannot be found or refreshed stay so: no retry.
    return not isinstance(error, (gexc.NotFound, gauth.DefaultCredentialsError, gauth.RefreshError))


def _bucket_missing(error: BaseException) -> bool:
    return "bucket" in str(error).lower() and "not exist" in str(error).lower()


class _CountingReader(io.RawIOBase):
    def __init__(self, handle: Any, progress: Optional[ProgressCallback]) -> None:
        self._handle = handle
        self._progress = progress

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        if self._progress and data:
            self._progress(len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def seekable(self) -> bool:
        return True


class _CountingWriter(io.RawIOBase):
    def __init__(self, handle: Any, progress: Optional[ProgressCallback]) -> None:
        self._handle = handle
        self._progress = progress

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = self._handle.write(data)
        if self._progress:
            self._progress(len(data))
        return written


class GCSObjectStore(base.CopyableObjectStore, base.PinnedObjectStore):
    """Objects under ``gs://bucket/prefix``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        retry: base.RetryPolicy = base.RetryPolicy(),
        timeout: float = 60.0,
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
    ) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.retry = retry
        self.timeout = timeout
        self.endpoint = os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
        try:
            self._client = client or gcs.Client()
        except gauth.DefaultCredentialsError:
            raise ConfigError(f"GCS at {self.endpoint}: no credentials; {_CREDENTIALS_HINT}") from None
        # One connection per transfer thread and one for small requests beside them: the
        # default pool of 10 would discard connections under more threads.
        pool = requests.adapters.HTTPAdapter(pool_maxsize=max(10, 2 * transfer_threads))
        http = getattr(self._client, "_http", None)
        if http is not None and hasattr(http, "mount"):
            http.mount("https://", pool)
            http.mount("http://", pool)
        self._bucket = self._client.bucket(bucket)
        self.metadata_requests = 0
        self.served_versions: dict[str, str] = {}  # generations pin reads: no version ids

    @classmethod
    def from_url(cls, url: str, *, retry: base.RetryPolicy = base.RetryPolicy()) -> GCSObjectStore:
        """``gs://bucket/prefix`` (``STORAGE_EMULATOR_HOST`` selects an emulator)."""
        bucket, prefix = split_bucket_url(url)
        return cls(bucket, prefix, retry=retry)

    def __repr__(self) -> str:
        return f"GCSObjectStore({self.url()!r})"

    def url(self, key: str = "") -> str:
        return f"gs://{self.bucket_name}/{join_key(self.prefix, key)}"

    def _blob(self, key: str, chunked: bool = True) -> Any:
        # Small objects go in one request, whose response headers carry the generation.
        return self._bucket.blob(join_key(self.prefix, key), chunk_size=_CHUNK if chunked else None)

    def _run(self, what: str, key: str, call: Any) -> Any:
        def checked() -> Any:
            try:
                return call()
            except gexc.NotFound as error:
                # A LIST finds nothing under a prefix, never a 404: its 404 is the bucket's
                # (fake-gcs-server says so in other words than GCS).
                if what == "LIST" or _bucket_missing(error):
                    raise self._missing_bucket() from None
                raise

        return self.retry.run(f"{what} {self.url(key)}", checked, _is_transient, self._describe)

    def _missing_bucket(self) -> base.MissingBucketError:
        return base.MissingBucketError(f"bucket {self.bucket_name!r} does not exist at {self.endpoint}")

    def _describe(self, error: BaseException) -> str:
        """What went wrong, naming the endpoint and what to set where that is the cure (no secrets)."""
        where = f"GCS at {self.endpoint}"
        if isinstance(error, (gauth.DefaultCredentialsError, gauth.RefreshError)):
            return f"{where}: no usable credentials ({type(error).__name__}); {_CREDENTIALS_HINT}"
        if isinstance(error, gexc.Forbidden) or getattr(error, "code", None) == 401:
            return f"{where} refused the credentials ({describe_error(error)}); {_CREDENTIALS_HINT}"
        return f"{describe_error(error)} from {where}"

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        ranged = {} if max_bytes is None else {"start": 0, "end": max_bytes}

        def download(blob: Any, **conditions: Any) -> bytes:
            try:
                return bytes(blob.download_as_bytes(retry=None, timeout=self.timeout, **conditions, **ranged))
            except gexc.RequestRangeNotSatisfiable:
                # A range of an empty object is unsatisfiable (416): the whole object is empty.
                return bytes(blob.download_as_bytes(retry=None, timeout=self.timeout, **conditions))

        def call() -> Optional[tuple[bytes, str]]:
            blob = self._blob(key, chunked=False)
            try:
                data = download(blob)
                if blob.generation is not None:
                    return data, str(blob.generation)
                # The server did not say which generation it sent: pin one and read exactly
                # that, so that data and token always belong together.
                blob.reload(retry=None, timeout=self.timeout)
                generation = blob.generation
                data = download(blob, if_generation_match=generation)
            except gexc.NotFound as error:
                if _bucket_missing(error):
                    raise self._missing_bucket() from None
                return None
            return data, str(generation)

        return self._run("GET", key, call)

    def write(
        self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None
    ) -> Optional[str]:
        match: Optional[int] = 0 if if_absent else (int(if_token) if if_token is not None else None)

        def call() -> Optional[str]:
            blob = self._blob(key, chunked=False)
            try:
                blob.upload_from_string(
                    data, if_generation_match=match, retry=None, timeout=self.timeout
                )
            except gexc.PreconditionFailed:
                return None
            except gexc.NotFound:
                if if_token is not None and not if_absent:
                    return None  # the version we meant to replace is gone
                raise self._missing_bucket() from None
            return str(blob.generation)

        return self._run("PUT", key, call)

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        def call() -> bool:
            try:
                self._blob(key).delete(
                    if_generation_match=int(if_token) if if_token is not None else None,
                    retry=None,
                    timeout=self.timeout,
                )
            except (gexc.NotFound, gexc.PreconditionFailed):
                return False
            return True

        return self._run("DELETE", key, call)

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        def call() -> None:
            with open(path, "rb") as handle:
                self._blob(key).upload_from_file(
                    _CountingReader(handle, progress),
                    size=Path(path).stat().st_size,
                    retry=None,
                    timeout=self.timeout,
                )

        self._run("upload to", key, call)

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        """With ``size``, a ranged download of ``size + 1`` bytes into a ``SizedWriter``: an object
        of another size raises ObjectSizeError (its size asked of a HEAD) with at most ``size``
        bytes written."""

        def call() -> None:
            blob = self._blob(key)
            try:
                with open(path, "wb") as handle:
                    if size is None:
                        blob.download_to_file(_CountingWriter(handle, progress), retry=None, timeout=self.timeout)
                        return
                    writer = base.SizedWriter(handle, self.url(key), size, progress)
                    try:
                        blob.download_to_file(writer, start=0, end=size, retry=None, timeout=self.timeout)
                    except gexc.RequestRangeNotSatisfiable:
                        pass  # an empty object (a range of it is unsatisfiable): fewer bytes than size
                    writer.check()
            except gexc.NotFound:
                raise FileNotFoundError(f"{self.url(key)} does not exist") from None
            except base.ObjectSizeError as error:
                if error.actual is not None or size is None:
                    raise
                blob.reload(retry=None, timeout=self.timeout)  # how large it is, for the message
                raise base.ObjectSizeError(self.url(key), size, blob.size) from None

        self._run("download of", key, call)

    def list(self, prefix: str = "") -> list[base.ObjectInfo]:
        full = join_key(self.prefix, prefix)
        if prefix.endswith("/") or not prefix:
            full = full + "/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0

        def call() -> list[base.ObjectInfo]:
            return [
                base.ObjectInfo(key=blob.name[strip:], size=int(blob.size or 0))
                # Pages of 1,000 (the most GCS returns in one), each page token followed.
                for blob in self._client.list_blobs(
                    self.bucket_name, prefix=full, page_size=base.LIST_PAGE, retry=None, timeout=self.timeout
                )
            ]

        return self._run("LIST", prefix, call)

    # -- pinned reads (the base.PinnedObjectStore primitives) ------------------------------------
    def _pin(self, blob: Any) -> base.ObjectPin:
        key = blob.name[len(self.prefix) + 1 :] if self.prefix else blob.name
        return base.ObjectPin(key, int(blob.size or 0), blob.etag, None, int(blob.generation))

    def head(
        self, key: str, *, version_id: Optional[str] = None, generation: Optional[int] = None
    ) -> Optional[base.ObjectPin]:
        def call() -> Optional[base.ObjectPin]:
            self.metadata_requests += 1
            try:
                blob = self._bucket.get_blob(
                    join_key(self.prefix, key), generation=generation, retry=None, timeout=self.timeout
                )
            except gexc.NotFound:
                return None
            return None if blob is None else self._pin(blob)

        return self._run("HEAD", key, call)  # type: ignore[no-any-return]

    def list_page(
        self, prefix: str, start_at: Optional[str] = None, page_size: int = base.LIST_PAGE, token: Optional[str] = None
    ) -> base.PinnedPage:
        """One page from ``startOffset`` (or ``pageToken``)."""
        under = f"{self.prefix}/" if self.prefix else ""
        offset = {"start_offset": under + start_at} if start_at else {}
        if token is not None:
            offset = {"page_token": token}

        def call() -> base.PinnedPage:
            self.metadata_requests += 1
            blobs = self._client.list_blobs(
                self.bucket_name, prefix=under + prefix, page_size=page_size, retry=None, timeout=self.timeout,
                **offset,
            )
            page = next(iter(blobs.pages), None)
            following = blobs.next_page_token or None
            return base.PinnedPage([self._pin(blob) for blob in page or []], following is not None, following)

        return self._run("LIST", prefix, call)  # type: ignore[no-any-return]

    def read_range(self, pin: base.ObjectPin, start: int, stop: int) -> bytes:
        """A ranged read of ``pin``'s generation, ``ifGenerationMatch`` it (fake-gcs-server ignores
        the condition on reads but drops old generations: a read of a replaced one is 404)."""
        blob = self._bucket.blob(join_key(self.prefix, pin.key), generation=pin.generation)

        def call() -> bytes:
            try:
                return bytes(
                    blob.download_as_bytes(
                        start=start,
                        end=stop - 1,
                        if_generation_match=pin.generation,
                        checksum=None,
                        retry=None,
                        timeout=self.timeout,
                    )
                )
            except gexc.PreconditionFailed:
                raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=False) from None
            except gexc.NotFound:
                raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=True) from None

        return self._run("GET", pin.key, call)  # type: ignore[no-any-return]

    # -- copies (the base.CopyableObjectStore primitives) ---------------------------------------
    def checksum(self, key: str) -> Optional[ObjectChecksum]:
        """The object's metadata: GCS computes ``crc32c`` for every object, composed ones too."""

        def call() -> Optional[ObjectChecksum]:
            blob = self._bucket.get_blob(join_key(self.prefix, key), retry=None, timeout=self.timeout)
            if blob is None:
                return None
            value = blob.crc32c if is_crc32c(blob.crc32c) else None
            return ObjectChecksum(int(blob.size or 0), value)

        return self._run("HEAD", key, call)  # type: ignore[no-any-return]

    def ensure_checksum(self, key: str) -> Optional[ObjectChecksum]:
        return self.checksum(key)  # GCS keeps a CRC32C for every object

    def read_chunks(self, key: str, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        """Ranged reads of one generation (pinned by the first), so that a replacement of the
        object part-way is an error, never a mix of two versions."""
        found = self.checksum(key)
        if found is None:
            raise FileNotFoundError(f"{self.url(key)} does not exist")
        blob = self._blob(key, chunked=False)
        generation: Optional[int] = None
        start = 0
        while start < found.size:
            end = min(found.size, start + chunk_bytes) - 1
            try:
                chunk = bytes(
                    blob.download_as_bytes(
                        start=start,
                        end=end,
                        if_generation_match=generation,
                        checksum=None,
                        retry=None,
                        timeout=self.timeout,
                    )
                )
            except gexc.NotFound:
                raise FileNotFoundError(f"{self.url(key)} does not exist") from None
            except Exception as error:  # noqa: BLE001 - a failure part-way: the caller starts over
                raise base.RemoteError(f"reading {self.url(key)} failed part-way: {self._describe(error)}") from None
            if generation is None:
                generation = blob.generation
            if not chunk:
                raise base.RemoteError(f"reading {self.url(key)} ended early at byte {start} of {found.size}")
            start += len(chunk)
            yield chunk

    def write_chunks(
        self, key: str, chunks: Iterable[bytes], size: int, progress: Optional[ProgressCallback] = None
    ) -> None:
        """A resumable upload fed from ``chunks``; the library computes the CRC32C on the way and
        compares it with the one GCS computed (a mismatch deletes the object and raises)."""

        def call() -> None:
            # The library's default resumable chunk (100 MiB): one request for a part of a usual size.
            self._blob(key, chunked=False).upload_from_file(
                _ChunkReader(iter(chunks), progress), size=size, checksum="crc32c", retry=None, timeout=self.timeout
            )

        # Not retried: the chunks are consumed; the caller starts the object over.
        try:
            call()
        except (base.RemoteError, FileNotFoundError, TransferCancelled, base.ObjectSizeError):
            raise  # answers, a stop, or chunks that ran past the object's size: not upload failures
        except Exception as error:
            raise base.RemoteError(f"upload to {self.url(key)} failed: {self._describe(error)}") from None

    def copy_server_side(self, copy: base.ServerCopy) -> bool:
        """``Blob.rewrite`` (repeated until done) when the source is GCS: bytes stay in the cloud."""
        source, source_key, key = copy.source, copy.source_key, copy.key
        if not isinstance(source, GCSObjectStore):
            return False

        def call() -> None:
            target = self._blob(key, chunked=False)
            origin = source._blob(source_key, chunked=False)
            token: Optional[str] = None
            copied = 0
            while True:
                try:
                    token, written, _total = target.rewrite(origin, token=token, retry=None, timeout=self.timeout)
                except gexc.NotFound:
                    raise FileNotFoundError(f"{source.url(source_key)} does not exist") from None
                if written > copied:
                    copy.copied(written - copied)
                copied = written
                if token is None:
                    return

        self._run("copy to", key, call)
        return True


class _ChunkReader(io.RawIOBase):
    """A forward-only file over an iterator of byte chunks (what the upload pulls from)."""

    def __init__(self, chunks: Iterator[bytes], progress: Optional[ProgressCallback]) -> None:
        self._chunks = chunks
        self._progress = progress
        self._pending: list[bytes] = []  # chunks not yet handed out, joined once per read
        self._pending_bytes = 0
        self._position = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def read(self, size: int = -1) -> bytes:
        while size < 0 or self._pending_bytes < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
        joined = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        if size < 0 or size >= len(joined):
            data, rest = joined, b""
        else:
            data, rest = joined[:size], joined[size:]
        self._pending = [rest] if rest else []
        self._pending_bytes = len(rest)
        self._position += len(data)
        if self._progress and data:
            self._progress(len(data))
        return data
