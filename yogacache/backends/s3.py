"""S3 (and S3-compatible) object store through boto3; imported only when S3 is used."""

from __future__ import annotations

import builtins
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, Optional

from yogacache.backends import base
from yogacache.backends.base import (
    COPY_CHUNK_BYTES,
    DEFAULT_TRANSFER_THREADS,
    MissingBucketError,
    ObjectChecksum,
    ObjectInfo,
    ProgressCallback,
    RemoteError,
    RetryPolicy,
    TransferCancelled,
    describe_error,
    join_key,
    split_bucket_url,
)
from yogacache.format.checksum import Crc32c, crc32c_of, is_crc32c

try:
    import boto3
    import boto3.exceptions
    import botocore.config
    import botocore.exceptions
    import botocore.loaders
    import botocore.session
    from boto3.s3.transfer import S3Transfer, TransferConfig
    from s3transfer.exceptions import RetriesExceededError as S3TransferRetriesExceededError
    from s3transfer.manager import TransferManager
except ImportError as error:  # pragma: no cover - exercised only without boto3
    raise ImportError("S3 storage needs boto3: pip install 'yogacache[s3]'") from error

_ABSENT = {"404", "NoSuchKey", "NotFound"}
_PRECONDITION = {"412", "PreconditionFailed", "ConditionalRequestConflict"}
_MULTIPART = 64 << 20
# The server refused the credentials themselves: asking again with the same ones cannot help.
_BAD_CREDENTIALS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_MAX_COPY_OBJECT = 5 << 30  # CopyObject's limit; larger objects are copied part by part
_MIN_PART = 5 << 20  # S3's smallest multipart part (but the last)
_CREDENTIALS_HINT = (
    "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or access_key/secret_key in the config"
)


_LOADER: Optional[botocore.loaders.Loader] = None
_LOADER_LOCK = threading.Lock()


def _new_session() -> boto3.session.Session:
    """A fresh boto3 session (credentials, region and endpoint resolved anew, as each client has
    always had), sharing one loader of botocore's service models per process: the first client
    of a session parses S3's model, 150 ms of CPU, which every DataLoader worker's and Ray read
    task's copy of a reader paid again; with the loader shared a client costs about 20 ms."""
    global _LOADER
    with _LOADER_LOCK:
        if _LOADER is None:
            _LOADER = botocore.loaders.create_loader()
        core = botocore.session.get_session()
        core.register_component("data_loader", _LOADER)
        return boto3.session.Session(botocore_session=core)


def _code(error: BaseException) -> str:
    if isinstance(error, botocore.exceptions.ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return ""


def _is_transient(error: BaseException) -> bool:
    # Everything but "absent", "precondition failed" and missing or refused credentials is
    # worth another try: 403s from clock skew or credential refresh, 5xx, throttling,
    # timeouts and resets.
    if isinstance(error, (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError)):
        return False
    return _code(error) not in _ABSENT | _PRECONDITION | _BAD_CREDENTIALS | {"NoSuchBucket", "InvalidBucketName"}


class S3ObjectStore(base.CopyableObjectStore, base.PinnedObjectStore):
    """Objects under ``s3://bucket/prefix``. Credentials come from the standard AWS chain unless given."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: Optional[str] = None,
        access_key: Optional[str] = None,
        secret_key: Optional[str] = None,
        retry: RetryPolicy = RetryPolicy(),
        max_concurrency: int = 8,
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
        multipart_bytes: int = _MULTIPART,
        timeout: float = 60.0,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.retry = retry
        # Every transfer thread may run ``max_concurrency`` ranged or multipart requests at
        # once, plus one small request of its own: a smaller pool discards connections.
        pool_size = max(10, transfer_threads * (max_concurrency + 1))
        config = botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # RetryPolicy retries
            connect_timeout=timeout,
            read_timeout=timeout,
            max_pool_connections=pool_size,
        )
        session = _new_session()
        self._client = session.client(
            "s3",
            endpoint_url=endpoint_url,  # None: AWS_ENDPOINT_URL or AWS itself
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            config=config,
        )
        self.endpoint = str(self._client.meta.endpoint_url)
        self.metadata_requests = 0
        self.served_versions: dict[str, str] = {}
        self._transfer = TransferConfig(
            multipart_threshold=multipart_bytes,
            multipart_chunksize=multipart_bytes,
            max_concurrency=max_concurrency,
            use_threads=True,
            # s3transfer would retry a timed-out or broken GET five times on its own, inside
            # one of RetryPolicy's attempts: attempts multiplied, a timeout reported five times
            # later, and a stop (a closed reader's fetch ahead) unseen until all five were over.
            num_download_attempts=1,
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: Optional[str] = None,
        access_key: Optional[str] = None,
        secret_key: Optional[str] = None,
        retry: RetryPolicy = RetryPolicy(),
    ) -> S3ObjectStore:
        """``s3://bucket/prefix``."""
        bucket, prefix = split_bucket_url(url)
        return cls(bucket, prefix, endpoint_url=endpoint_url, access_key=access_key, secret_key=secret_key, retry=retry)

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url()!r})"

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{join_key(self.prefix, key)}"

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _run(self, what: str, key: str, call: Any) -> Any:
        def checked() -> Any:
            try:
                return call()
            except botocore.exceptions.ClientError as error:
                if _code(error) == "NoSuchBucket":
                    raise self._missing_bucket() from None
                raise

        return self.retry.run(f"{what} {self.url(key)}", checked, _is_transient, self._describe)

    def _missing_bucket(self) -> MissingBucketError:
        return MissingBucketError(f"bucket {self.bucket!r} does not exist at {self.endpoint}")

    def _describe(self, error: BaseException) -> str:
        """What went wrong, naming the endpoint and what to set where that is the cure (no secrets)."""
        where = f"S3 at {self.endpoint}"
        if isinstance(error, botocore.exceptions.NoCredentialsError):
            return f"{where}: no credentials; {_CREDENTIALS_HINT}"
        if isinstance(error, botocore.exceptions.PartialCredentialsError):
            return f"{where}: incomplete credentials; {_CREDENTIALS_HINT}"
        if _code(error) in _BAD_CREDENTIALS:
            return f"{where} refused the credentials ({_code(error)}); {_CREDENTIALS_HINT}"
        if isinstance(error, botocore.exceptions.EndpointConnectionError):
            return f"cannot connect to the S3 endpoint {self.endpoint}; {base.ENDPOINT_HINT}"
        return f"{describe_error(error)} from {where}"

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        ranged = {} if max_bytes is None else {"Range": f"bytes=0-{max_bytes}"}

        def call() -> Optional[tuple[bytes, str]]:
            try:
                try:
                    response = self._client.get_object(Bucket=self.bucket, Key=self._key(key), **ranged)
                except botocore.exceptions.ClientError as error:
                    if _code(error) != "InvalidRange":
                        raise
                    # A range of an empty object is unsatisfiable (416): the whole object is empty.
                    response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT:
                    return None
                if _code(error) == "NoSuchBucket":
                    raise self._missing_bucket() from None
                raise
            return response["Body"].read(), response["ETag"]

        return self._run("GET", key, call)

    def write(self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None) -> Optional[str]:
        extra: dict[str, str] = {}
        if if_absent:
            extra["IfNoneMatch"] = "*"
        if if_token is not None:
            extra["IfMatch"] = if_token

        def call() -> Optional[str]:
            try:
                response = self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **extra)
            except botocore.exceptions.ClientError as error:
                if extra and _code(error) in _PRECONDITION:
                    return None
                if if_token is not None and _code(error) in _ABSENT:
                    return None
                raise
            return str(response["ETag"])

        return self._run("PUT", key, call)

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        extra = {"IfMatch": if_token} if if_token is not None else {}

        def call() -> bool:
            try:
                if if_token is None:
                    # S3 answers 204 for absent keys too: ask first, so "absent" is reported.
                    self._client.head_object(Bucket=self.bucket, Key=self._key(key))
                self._client.delete_object(Bucket=self.bucket, Key=self._key(key), **extra)
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT | _PRECONDITION:
                    return False
                raise
            return True

        return self._run("DELETE", key, call)

    def _transfers(self) -> S3Transfer:
        """boto3's managed transfers, on daemon threads (``_DaemonExecutor``): a transfer stopped
        while its request waits on the network ends with the process, never holds it at exit."""
        return S3Transfer(manager=TransferManager(self._client, self._transfer, executor_cls=_DaemonExecutor))

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        def call() -> None:
            with self._transfers() as transfers:
                transfers.upload_file(str(path), self.bucket, self._key(key), callback=progress)

        self._run("upload to", key, call)

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        """With ``size`` (a part's, from its manifest), no HEAD: the first ranged GET's
        ``Content-Range`` says the object's size, so one of another size is refused before a
        byte is written; an object larger than ``multipart_bytes`` is then fetched in ranges of
        that size, ``max_concurrency`` at once, each pinned to the first answer's ETag
        (``IfMatch``), so it cannot change meanwhile (``_download_sized``). Without ``size``,
        s3transfer's managed download (a HEAD, then GETs)."""

        def call() -> None:
            try:
                if size is not None:
                    self._download_sized(key, path, size, progress)
                    return
                with self._transfers() as transfers:
                    transfers.download_file(self.bucket, self._key(key), str(path), callback=progress)
            except S3TransferRetriesExceededError as error:
                raise error.last_exception or error from None
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT:
                    raise FileNotFoundError(f"{self.url(key)} does not exist") from None
                raise
            except boto3.exceptions.RetriesExceededError as error:
                # Its one attempt failed: the policy judges (and names) what went wrong.
                raise error.last_exception or error from None

        self._run("download of", key, call)

    def _download_sized(self, key: str, path: Path, size: int, progress: Optional[ProgressCallback]) -> None:
        """A download of an object the caller knows holds ``size`` bytes (``download_file``).

        Plain GETs: s3transfer spent 1.2 CPU s per GB where a GET written to the file spends
        0.5 (``benchmarks/bench_stream_cpu.py``), and its HEAD was a round trip per part that
        the manifest makes unnecessary."""
        chunk = max(1, self._transfer.multipart_chunksize)
        url = self.url(key)
        # One range: a byte more than ``size`` is asked, so that a larger object shows at once;
        # more ranges: the first's Content-Range says the object's size.
        covered = min(size, chunk)
        last = size if size <= chunk else chunk - 1  # inclusive
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(key), Range=f"bytes=0-{last}")
        except botocore.exceptions.ClientError as error:
            if _code(error) != "InvalidRange":
                raise
            # Unsatisfiable from byte 0: the object is empty.
            if size:
                raise base.ObjectSizeError(url, size, 0) from None
            path.write_bytes(b"")
            return
        total = _object_size(response)
        if total != size:
            response["Body"].close()
            raise base.ObjectSizeError(url, size, total)
        pinned = _pin_condition(self._pin(key, size, response.get("ETag")))
        if not response.get("ContentRange"):
            covered = size  # a server that ignored the range sent the whole object in this answer
        stop = threading.Event()  # set by the first range that fails: the others end at their next read
        lock = threading.Lock()  # ranges count, and report progress, one write at a time
        written = 0
        with open(path, "wb") as handle:

            def write_range(body: Any, start: int, end: int) -> None:
                """``body`` written at ``start``; never past ``end`` (so never past ``size``)."""
                offset = start

                def write(data: bytes) -> None:
                    nonlocal offset, written
                    if offset + len(data) > end:
                        raise base.ObjectSizeError(url, size, None)
                    os.pwrite(handle.fileno(), data, offset)
                    offset += len(data)
                    with lock:
                        written += len(data)
                        if progress is not None:
                            progress(len(data))

                _copy_body(body, write, stop)  # fewer bytes: the count below says so

            def fetch_range(start: int, end: int) -> None:
                answer = self._client.get_object(
                    Bucket=self.bucket, Key=self._key(key), Range=f"bytes={start}-{end - 1}", **pinned
                )
                write_range(answer["Body"], start, end)

            write_range(response["Body"], 0, covered)
            executor = _DaemonExecutor(max_workers=self._transfer.max_concurrency)
            futures = [
                executor.submit(fetch_range, start, min(start + chunk, size)) for start in range(covered, size, chunk)
            ]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                stop.set()
                raise
            finally:
                # Every range has ended before the file is closed: none writes into a reused fd.
                executor.shutdown(wait=True)
        if written != size:
            raise base.ObjectSizeError(url, size, written)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        full = join_key(self.prefix, prefix)
        if prefix.endswith("/") or not prefix:
            full = full + "/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0

        def call() -> builtins.list[ObjectInfo]:
            found = []
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(key=item["Key"][strip:], size=int(item["Size"])))
            return found

        return self._run("LIST", prefix, call)

    # -- pinned reads (the base.PinnedObjectStore primitives) ------------------------------------
    def _pin(self, key: str, size: Any, etag: Optional[str], version_id: Optional[str] = None) -> base.ObjectPin:
        return base.ObjectPin(key, int(size), etag.strip('"') if etag else etag, version_id)

    def head(
        self, key: str, *, version_id: Optional[str] = None, generation: Optional[int] = None
    ) -> Optional[base.ObjectPin]:
        extra = {"VersionId": version_id} if version_id else {}

        def call() -> Optional[base.ObjectPin]:
            self.metadata_requests += 1
            try:
                answer = self._client.head_object(Bucket=self.bucket, Key=self._key(key), **extra)
            except botocore.exceptions.ClientError as error:
                # 400: a version id this bucket cannot have.
                if _code(error) in _ABSENT | {"NoSuchVersion", "400"}:
                    return None
                raise
            return self._pin(
                key, answer["ContentLength"], answer.get("ETag"), answer.get("VersionId") if version_id else None
            )

        return self._run("HEAD", key, call)  # type: ignore[no-any-return]

    def list_page(
        self, prefix: str, start_at: Optional[str] = None, page_size: int = base.LIST_PAGE, token: Optional[str] = None
    ) -> base.PinnedPage:
        """S3 lists *after* a key: the page starts after ``start_at`` less its last character, and
        the few keys between that and ``start_at`` are dropped here."""
        first = self._listed_key(start_at) if start_at and token is None else ""
        extra = {"StartAfter": first[:-1]} if len(first) > 1 else {}
        if token is not None:
            extra["ContinuationToken"] = token

        def call() -> base.PinnedPage:
            self.metadata_requests += 1
            page = self._client.list_objects_v2(
                Bucket=self.bucket, Prefix=self._listed_key(prefix), MaxKeys=page_size, **extra
            )
            found = [
                self._pin(item["Key"][self._strip :], item["Size"], item.get("ETag"))
                for item in page.get("Contents", [])
                if item["Key"] >= first
            ]
            more = bool(page.get("IsTruncated"))
            return base.PinnedPage(found, more, page.get("NextContinuationToken") if more else None)

        return self._run("LIST", prefix, call)  # type: ignore[no-any-return]

    def _listed_key(self, key: str) -> str:
        """``key`` under the store's prefix, as a plain string prefix (a trailing ``/`` kept)."""
        return f"{self.prefix}/{key}" if self.prefix else key

    @property
    def _strip(self) -> int:
        return len(self.prefix) + 1 if self.prefix else 0

    def _get_pinned(self, pin: base.ObjectPin, **extra: Any) -> Any:
        """GetObject conditional on ``pin`` (``IfMatch``, ``VersionId``); records the version served."""
        extra.update(_pin_condition(pin))

        def call() -> Any:
            try:
                return self._client.get_object(Bucket=self.bucket, Key=self._key(pin.key), **extra)
            except botocore.exceptions.ClientError as error:
                if _code(error) in _PRECONDITION:
                    raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=False) from None
                if _code(error) in _ABSENT | {"NoSuchVersion"}:
                    raise base.ObjectChangedError.of(self.url(pin.key), pin, deleted=True) from None
                raise

        answer = self._run("GET", pin.key, call)
        if answer.get("VersionId") and answer["VersionId"] != "null":  # a versioned bucket
            self.served_versions[pin.key] = answer["VersionId"]
        return answer

    def read_range(self, pin: base.ObjectPin, start: int, stop: int) -> bytes:
        body = self._get_pinned(pin, Range=f"bytes={start}-{stop - 1}")["Body"]
        return self._read_body(pin.key, body, -1)

    def open_stream(self, pin: base.ObjectPin) -> BinaryIO:
        """One GET of the whole object, read as it arrives."""
        return _Body(self, pin.key, self._get_pinned(pin)["Body"])  # type: ignore[return-value]

    def _read_body(self, key: str, body: Any, size: int) -> bytes:
        try:
            return bytes(body.read(None if size < 0 else size))
        except (botocore.exceptions.BotoCoreError, OSError) as error:  # a cut or short body
            raise RemoteError(
                f"reading {self.url(key)} failed part-way: {self._describe(error)}", self._describe(error)
            ) from None

    # -- copies (the base.CopyableObjectStore primitives) ---------------------------------------
    # Objects up to this size are copied with one CopyObject; larger ones with UploadPartCopy
    # in parts of this size (tests lower it to exercise the multipart path).
    copy_multipart_bytes = _MAX_COPY_OBJECT
    copy_threads = 8

    def checksum(self, key: str) -> Optional[ObjectChecksum]:
        """HEAD with ``ChecksumMode=ENABLED``: the full-object CRC32C S3 keeps (None for objects
        stored without one, or with a composite multipart checksum ``...-N``)."""

        def call() -> Optional[ObjectChecksum]:
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT:
                    return None
                raise
            value = head.get("ChecksumCRC32C")
            if head.get("ChecksumType") == "COMPOSITE" or not is_crc32c(value):
                value = None
            return ObjectChecksum(int(head["ContentLength"]), value)

        return self._run("HEAD", key, call)  # type: ignore[no-any-return]

    def ensure_checksum(self, key: str) -> Optional[ObjectChecksum]:
        found = self.checksum(key)
        if found is None or found.crc32c is not None:
            return found
        if found.size > self.copy_multipart_bytes:
            return found  # CopyObject cannot rewrite it; the caller reads it instead
        copy_source = {"Bucket": self.bucket, "Key": self._key(key)}
        self._run(
            "adding a CRC32C to",
            key,
            lambda: self._client.copy_object(
                Bucket=self.bucket,
                Key=self._key(key),
                CopySource=copy_source,
                ChecksumAlgorithm="CRC32C",
                MetadataDirective="REPLACE",  # a copy onto itself must change something
            ),
        )
        return self.checksum(key)

    def read_chunks(self, key: str, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        def call() -> Any:
            try:
                return self._client.get_object(Bucket=self.bucket, Key=self._key(key))
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT:
                    raise FileNotFoundError(f"{self.url(key)} does not exist") from None
                raise

        body = self._run("GET", key, call)["Body"]
        try:
            while True:
                try:
                    chunk = body.read(chunk_bytes)
                except Exception as error:  # a reset or timeout part-way: the caller starts over
                    raise RemoteError(f"reading {self.url(key)} failed part-way: {self._describe(error)}") from None
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    def write_chunks(
        self, key: str, chunks: Iterable[bytes], size: int, progress: Optional[ProgressCallback] = None
    ) -> None:
        """One PutObject for a small object, else a multipart upload with a FULL_OBJECT CRC32C:
        every part carries its own CRC32C and the completion the whole object's, which S3
        checks against what it received."""
        parts = _regroup(chunks, COPY_CHUNK_BYTES)
        first = next(parts, b"")
        second = next(parts, None)
        if second is None:
            data = first
            self._run(
                "PUT",
                key,
                lambda: self._client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    Body=data,
                    ChecksumAlgorithm="CRC32C",
                    ChecksumCRC32C=crc32c_of(data),
                ),
            )
            if progress and data:
                progress(len(data))
            return
        self._multipart_upload(key, _chain(first, second, parts), progress)

    def _multipart_upload(self, key: str, parts: Iterator[bytes], progress: Optional[ProgressCallback]) -> None:
        upload_id = self._run(
            "multipart upload to",
            key,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), ChecksumAlgorithm="CRC32C", ChecksumType="FULL_OBJECT"
            ),
        )["UploadId"]
        whole = Crc32c()
        done: list[dict[str, Any]] = []
        in_flight = threading.BoundedSemaphore(2)  # reading the next part overlaps two uploads

        def send(number: int, data: bytes, crc: str) -> None:
            try:
                response = self._run(
                    "upload of part to",
                    key,
                    lambda: self._client.upload_part(
                        Bucket=self.bucket,
                        Key=self._key(key),
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=data,
                        ChecksumAlgorithm="CRC32C",
                        ChecksumCRC32C=crc,
                    ),
                )
                done.append({"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32C": crc})
                if progress:
                    progress(len(data))
            finally:
                in_flight.release()

        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="yogacache-s3-part")
        futures: list[Future[None]] = []
        try:
            for number, data in enumerate(parts, start=1):
                whole.update(data)
                while not in_flight.acquire(timeout=0.1):
                    _raise_first(futures)
                _raise_first(futures)
                futures.append(pool.submit(send, number, data, crc32c_of(data)))
            for future in futures:
                future.result()
            done.sort(key=lambda part: int(part["PartNumber"]))
            self._run(
                "completing multipart upload to",
                key,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                    ChecksumCRC32C=whole.value,
                    ChecksumType="FULL_OBJECT",
                ),
            )
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            self._abort(key, upload_id)
            raise
        pool.shutdown(wait=True)

    def _abort(self, key: str, upload_id: str) -> None:
        """Best effort: an upload left behind is invisible and removed by a lifecycle rule."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        except Exception:  # noqa: BLE001 - the failure being raised matters more
            pass

    def copy_server_side(self, copy: base.ServerCopy) -> bool:
        """CopyObject (UploadPartCopy past ``copy_multipart_bytes``) when the source is a bucket of
        the same endpoint; S3 computes the copy's CRC32C itself."""
        source, source_key, key, size, crc32c = copy.source, copy.source_key, copy.key, copy.size, copy.crc32c
        if not isinstance(source, S3ObjectStore) or source.endpoint != self.endpoint:
            return False
        copy_source = {"Bucket": source.bucket, "Key": source._key(source_key)}

        def absent_is_not_found(call: Any) -> Any:
            try:
                return call()
            except botocore.exceptions.ClientError as error:
                if _code(error) in _ABSENT:
                    raise FileNotFoundError(f"{source.url(source_key)} does not exist") from None
                raise

        if size <= self.copy_multipart_bytes:
            self._run(
                "copy to",
                key,
                lambda: absent_is_not_found(
                    lambda: self._client.copy_object(
                        Bucket=self.bucket, Key=self._key(key), CopySource=copy_source, ChecksumAlgorithm="CRC32C"
                    )
                ),
            )
            copy.copied(size)
            return True
        # A FULL_OBJECT checksum needs the whole object's CRC32C at completion: known, or composite.
        kind = {"ChecksumType": "FULL_OBJECT"} if crc32c else {}
        upload_id = self._run(
            "multipart copy to",
            key,
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=self._key(key), ChecksumAlgorithm="CRC32C", **kind
            ),
        )["UploadId"]
        step = max(_MIN_PART, min(self.copy_multipart_bytes, _MAX_COPY_OBJECT))

        def copy_part(number: int) -> dict[str, Any]:
            start = (number - 1) * step
            end = min(size, start + step) - 1
            result = self._run(
                "part copy to",
                key,
                lambda: absent_is_not_found(
                    lambda: self._client.upload_part_copy(
                        Bucket=self.bucket,
                        Key=self._key(key),
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource=copy_source,
                        CopySourceRange=f"bytes={start}-{end}",
                    )
                ),
            )["CopyPartResult"]
            copy.copied(end + 1 - start)
            part = {"PartNumber": number, "ETag": result["ETag"]}
            if result.get("ChecksumCRC32C"):
                part["ChecksumCRC32C"] = result["ChecksumCRC32C"]
            return part

        count = (size + step - 1) // step
        try:
            with ThreadPoolExecutor(max_workers=self.copy_threads, thread_name_prefix="yogacache-s3-copy") as pool:
                parts = list(pool.map(copy_part, range(1, count + 1)))
            extra = {"ChecksumCRC32C": crc32c, "ChecksumType": "FULL_OBJECT"} if crc32c else {}
            self._run(
                "completing multipart copy to",
                key,
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **extra,
                ),
            )
        except BaseException:
            self._abort(key, upload_id)
            raise
        return True


class _Body:
    """A GetObject body as a forward-only file whose transport errors are RemoteError."""

    def __init__(self, store: S3ObjectStore, key: str, body: Any) -> None:
        self._store = store
        self._key = key
        self._body = body

    def read(self, size: int = -1) -> bytes:
        return self._store._read_body(self._key, self._body, size)

    def close(self) -> None:
        self._body.close()


class _DaemonExecutor:
    """The executor s3transfer runs a transfer's requests on (``submit``, ``shutdown``), on daemon
    threads. ``ThreadPoolExecutor``'s threads are joined at interpreter exit: a request that waits
    for a server that does not answer held a Ctrl-C'd pull for minutes after its message."""

    def __init__(self, max_workers: Optional[int] = None) -> None:
        self._max_workers = max(1, max_workers or 1)
        self._work: queue.SimpleQueue[Optional[tuple[Future[Any], Any, Any, Any]]] = queue.SimpleQueue()
        self._threads: builtins.list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._serve, name="yogacache-s3transfer", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle -= 1
        return future

    def _serve(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as error:  # handed to whoever waits for the future
                    future.set_exception(error)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()


_BODY_READ = 1 << 20  # bytes per read of a GET's body


def _pin_condition(pin: base.ObjectPin) -> dict[str, str]:
    """GetObject's arguments that serve ``pin``'s version or fail (``IfMatch``, ``VersionId``)."""
    condition = {}
    if pin.etag:
        condition["IfMatch"] = f'"{pin.etag}"'
    if pin.version_id:
        condition["VersionId"] = pin.version_id
    return condition


def _object_size(response: dict[str, Any]) -> int:
    """The whole object's size from a ranged GET's answer (``Content-Range: bytes 0-N/SIZE``; a
    server that ignored the range answered the whole object)."""
    found = str(response.get("ContentRange") or "")
    if "/" in found and found.rsplit("/", 1)[1].strip().isdigit():
        return int(found.rsplit("/", 1)[1])
    return int(response["ContentLength"])


def _copy_body(body: Any, write: Any, stop: threading.Event) -> None:
    """A GET's body passed to ``write`` in reads of ``_BODY_READ``, until it ends or ``stop`` is set."""
    try:
        for data in body.iter_chunks(_BODY_READ):
            if stop.is_set():
                raise TransferCancelled("another range of this download failed")
            write(data)
    finally:
        body.close()


def _regroup(chunks: Iterable[bytes], size: int) -> Iterator[bytes]:
    """``chunks`` joined into pieces of ``size`` bytes (the last one shorter)."""
    buffer = bytearray()
    for chunk in chunks:
        if not buffer and len(chunk) == size:
            yield chunk  # already the right size: no copy
            continue
        buffer += chunk
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


def _chain(first: bytes, second: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield second
    yield from rest


def _raise_first(futures: list[Future[None]]) -> None:
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
