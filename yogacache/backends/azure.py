"""Azure Blob Storage object store; imported only when Azure is used.

``az://container/prefix`` (or ``abfs[s]://container@account.dfs.core.windows.net/prefix``).
The account comes from ``connection_string`` / ``AZURE_STORAGE_CONNECTION_STRING``, else from
``account_url`` (``endpoint_url``) / ``AZURE_STORAGE_ACCOUNT_URL`` / ``AZURE_STORAGE_ACCOUNT``
with ``credential`` / ``AZURE_STORAGE_KEY`` / ``AZURE_STORAGE_SAS_TOKEN``. ETags are the version
tokens (``If-Match`` / ``If-None-Match: *``). Azure keeps no CRC32C of its own: the CRC32C of
what yogacache writes is stored in the blob's metadata (a Put Blob of any other writer replaces
the metadata, so a stale value cannot survive a rewrite) and the server checks each request's
Content-MD5 where the copy path hands it one.
"""

from __future__ import annotations

import builtins
import os
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

from yogacache import redaction
from yogacache.backends.base import (
    COPY_CHUNK_BYTES,
    DEFAULT_TRANSFER_THREADS,
    LIST_PAGE,
    CopyableObjectStore,
    MissingBucketError,
    ObjectChangedError,
    ObjectChecksum,
    ObjectInfo,
    ObjectPin,
    ObjectSizeError,
    PinnedObjectStore,
    PinnedPage,
    ProgressCallback,
    RemoteError,
    RetryPolicy,
    ServerCopy,
    SizedWriter,
    join_key,
)
from yogacache.errors import ConfigError
from yogacache.format.checksum import Crc32c, crc32c_file, is_crc32c

try:
    import requests
    import requests.adapters
    from azure.core import MatchConditions
    from azure.core import exceptions as azexc
    from azure.storage.blob import BlobBlock, BlobServiceClient
except ImportError:  # pragma: no cover - exercised only without the library
    raise ImportError("Azure storage needs azure-storage-blob: pip install 'yogacache[azure]'") from None

_CRC32C_METADATA = "crc32c"  # the blob metadata entry holding the CRC32C yogacache computed
_SINGLE_PUT = 64 << 20  # larger uploads go in blocks
_BLOCK = 16 << 20
_MAX_BLOCKS = 50_000  # Azure's limit of committed blocks per blob
_COPY_POLL_SECONDS = 0.2
_CREDENTIALS_HINT = (
    "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_URL with AZURE_STORAGE_KEY "
    "(or AZURE_STORAGE_SAS_TOKEN), or connection_string / account_url + credential in the config"
)
# Refusals that another try with the same request cannot turn around (an MD5 mismatch can: the
# bytes changed on the way, and the client holds them still).
_FINAL_CODES = {
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "AuthorizationResourceTypeMismatch",
    "InvalidAuthenticationInfo",
    "ContainerNotFound",
    "InvalidResourceName",
    "InvalidUri",
    "InvalidQueryParameterValue",
    "InvalidHeaderValue",
    "UnsupportedHeader",
}


def _code(error: BaseException) -> str:
    """The service's error code (``BlobNotFound``, ``AuthenticationFailed``...), or ""."""
    code = getattr(error, "error_code", None)
    return str(getattr(code, "value", code) or "")


def _status(error: BaseException) -> Optional[int]:
    status = getattr(error, "status_code", None)
    return status if isinstance(status, int) else None


def _is_transient(error: BaseException) -> bool:
    # Resets, timeouts, 5xx, throttling and a bare 403 (a proxy, a clock skewed for a moment) are
    # retried, as on S3 and GCS; "absent", "precondition failed", a missing container, a refusal
    # the service names (a wrong key) and credentials that cannot be had at all are not.
    if isinstance(error, (ValueError, TypeError)):  # a malformed setting, found by the client
        return False
    if isinstance(error, (azexc.ResourceNotFoundError, azexc.ResourceExistsError, azexc.ResourceModifiedError)):
        return False
    if isinstance(error, azexc.ClientAuthenticationError) and _status(error) is None:
        return False  # a credential chain that found nothing
    return _code(error) not in _FINAL_CODES


def _container_missing(error: BaseException) -> bool:
    return _code(error) == "ContainerNotFound"


def _parse_url(url: str) -> tuple[str, str, Optional[str]]:
    """``(container, prefix, account_url)`` of ``az://container/prefix`` or
    ``abfs[s]://container@account.dfs.core.windows.net/prefix`` (the account's blob endpoint)."""
    parsed = urlparse(url)
    if not parsed.netloc:
        raise ConfigError(f"storage URL {redaction.describe(url)} names no container")
    container, at, host = parsed.netloc.partition("@")
    account_url = None
    if at:
        account = host.split(".", 1)[0]
        suffix = host.split(".dfs.", 1)[1] if ".dfs." in host else "core.windows.net"
        account_url = f"https://{account}.blob.{suffix}"
    return container, parsed.path.strip("/"), account_url


def _service_client(
    connection_string: Optional[str], account_url: Optional[str], credential: Any, **settings: Any
) -> Any:
    """The client of the account the settings (or the standard variables) name."""
    connection_string = connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    account_url = account_url or os.environ.get("AZURE_STORAGE_ACCOUNT_URL")
    if not account_url and os.environ.get("AZURE_STORAGE_ACCOUNT") and not connection_string:
        account_url = f"https://{os.environ['AZURE_STORAGE_ACCOUNT']}.blob.core.windows.net"
    if connection_string and not account_url:
        try:
            return BlobServiceClient.from_connection_string(connection_string, **settings)
        except ValueError:
            raise ConfigError(f"the Azure connection string is malformed; {_CREDENTIALS_HINT}") from None
    if not account_url:
        raise ConfigError(f"Azure storage names no account; {_CREDENTIALS_HINT}")
    if credential is None:
        credential = os.environ.get("AZURE_STORAGE_KEY") or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if isinstance(credential, str) and "sig=" not in credential:  # an account key, not a SAS token
        parsed = urlparse(account_url)
        account = parsed.path.strip("/") or parsed.netloc.split(".", 1)[0]  # emulator: the path
        credential = {"account_name": account, "account_key": credential}
    if credential is None:
        credential = _default_credential()
    return BlobServiceClient(account_url, credential=credential, **settings)


def _default_credential() -> Any:
    """Azure's standard credential chain where azure-identity is installed; else anonymous."""
    try:
        from azure.identity import DefaultAzureCredential  # type: ignore[import-not-found]
    except ImportError:
        return None  # anonymous: public containers only
    return DefaultAzureCredential()


# Blobs per List Blobs request of a whole listing (``list``): the most Azure returns in one
# (5,000); the SDK follows each page's marker to the next.
LIST_ALL_PAGE = 5000


class AzureObjectStore(CopyableObjectStore, PinnedObjectStore):
    """Objects under ``az://container/prefix`` of one storage account."""

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        connection_string: Optional[str] = None,
        account_url: Optional[str] = None,
        credential: Any = None,
        retry: RetryPolicy = RetryPolicy(),
        timeout: float = 60.0,
        transfer_threads: int = DEFAULT_TRANSFER_THREADS,
        max_concurrency: int = 4,
        transfer_bytes: int = _SINGLE_PUT,
    ) -> None:
        self.container = container
        self.prefix = prefix.strip("/")
        self.retry = retry
        self.max_concurrency = max_concurrency
        # Every transfer thread may run ``max_concurrency`` ranged or block requests at once,
        # plus one small request of its own: a smaller pool discards connections.
        session = requests.Session()
        adapter = requests.adapters.HTTPAdapter(pool_maxsize=max(10, transfer_threads * (max_concurrency + 1)))
        session.mount("https://", adapter)
        session.mount("http://", adapter)
        self._service = _service_client(
            connection_string,
            account_url,
            credential,
            retry_total=0,  # RetryPolicy retries
            connection_timeout=timeout,
            read_timeout=timeout,
            session=session,
            # Objects past ``transfer_bytes`` go in blocks, and come in ranges, of that size at most
            # (``max_concurrency`` at once); tests lower it to exercise those paths.
            max_single_put_size=transfer_bytes,
            max_block_size=min(_BLOCK, transfer_bytes),
            max_single_get_size=transfer_bytes,
            max_chunk_get_size=min(_BLOCK, transfer_bytes),
        )
        parsed = urlparse(self._service.url)
        self.endpoint = f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"  # no SAS query
        self._container = self._service.get_container_client(container)
        self.metadata_requests = 0
        self.served_versions: dict[str, str] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        endpoint_url: Optional[str] = None,
        account_url: Optional[str] = None,
        connection_string: Optional[str] = None,
        credential: Any = None,
        retry: RetryPolicy = RetryPolicy(),
    ) -> AzureObjectStore:
        """``az://container/prefix`` (``endpoint_url`` is the account URL, as ``account_url``)."""
        container, prefix, from_host = _parse_url(url)
        return cls(
            container,
            prefix,
            connection_string=connection_string,
            account_url=account_url or endpoint_url or from_host,
            credential=credential,
            retry=retry,
        )

    def __repr__(self) -> str:
        return f"AzureObjectStore({self.url()!r})"

    def url(self, key: str = "") -> str:
        return f"az://{self.container}/{join_key(self.prefix, key)}"

    def _blob(self, key: str) -> Any:
        return self._container.get_blob_client(join_key(self.prefix, key))

    def _run(self, what: str, key: str, call: Any) -> Any:
        def checked() -> Any:
            try:
                return call()
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                raise

        return self.retry.run(f"{what} {self.url(key)}", checked, _is_transient, self._describe)

    def _describe(self, error: BaseException) -> str:
        """What went wrong, naming the endpoint and what to set where that is the cure (no secrets:
        never the error's own text, which may quote a request's signed URL)."""
        where = f"Azure at {self.endpoint}"
        status, code = _status(error), _code(error)
        if isinstance(error, azexc.ClientAuthenticationError) or status in (401, 403):
            return f"{where} refused the credentials (HTTP {status}{' ' + code if code else ''}); {_CREDENTIALS_HINT}"
        if isinstance(error, azexc.ServiceRequestError):
            return f"cannot connect to {where} ({type(error).__name__}); check the account URL or connection string"
        if status is not None:
            return f"HTTP {status}{' ' + code if code else ''} from {where}"
        return f"{type(error).__name__} from {where}"

    def _missing_container(self) -> MissingBucketError:
        return MissingBucketError(f"container {self.container!r} does not exist at {self.endpoint}")

    # -- small objects ----------------------------------------------------------------------
    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        ranged = {} if max_bytes is None else {"offset": 0, "length": max_bytes + 1}

        def call() -> Optional[tuple[bytes, str]]:
            try:
                # The client pins every further chunk of one download to the first one's ETag.
                try:
                    download = self._blob(key).download_blob(**ranged)
                except azexc.HttpResponseError as error:
                    if _code(error) != "InvalidRange":
                        raise
                    # A range of an empty blob is unsatisfiable (416): the whole blob is empty.
                    download = self._blob(key).download_blob()
                data = download.readall()
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                return None
            return bytes(data), str(download.properties.etag)

        return self._run("GET", key, call)  # type: ignore[no-any-return]

    def write(
        self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None
    ) -> Optional[str]:
        conditions: dict[str, Any] = {}
        if if_absent:
            conditions = {"match_condition": MatchConditions.IfMissing}  # If-None-Match: *
        elif if_token is not None:
            conditions = {"etag": if_token, "match_condition": MatchConditions.IfNotModified}

        def call() -> Optional[str]:
            try:
                response = self._blob(key).upload_blob(data, overwrite=True, **conditions)
            except (azexc.ResourceModifiedError, azexc.ResourceExistsError):
                if conditions:
                    return None
                raise
            except azexc.ResourceNotFoundError as error:
                if if_token is not None and not _container_missing(error):
                    return None  # the version we meant to replace is gone
                raise self._missing_container() from None
            return str(response["etag"])

        return self._run("PUT", key, call)  # type: ignore[no-any-return]

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        conditions = {} if if_token is None else {"etag": if_token, "match_condition": MatchConditions.IfNotModified}

        def call() -> bool:
            try:
                self._blob(key).delete_blob(**conditions)
            except (azexc.ResourceNotFoundError, azexc.ResourceModifiedError):
                return False
            return True

        return self._run("DELETE", key, call)  # type: ignore[no-any-return]

    # -- files ------------------------------------------------------------------------------
    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        """Put Blob, or blocks past 64 MiB, in parallel; the file's CRC32C goes into the metadata."""
        crc = crc32c_file(Path(path))
        hook = _ProgressHook(progress)  # one per file: a retry does not count its bytes again

        def call() -> None:
            with open(path, "rb") as handle:
                self._blob(key).upload_blob(
                    handle,
                    length=Path(path).stat().st_size,
                    overwrite=True,
                    metadata={_CRC32C_METADATA: crc},
                    max_concurrency=self.max_concurrency,
                    progress_hook=hook if progress else None,
                )

        self._run("upload to", key, call)

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        """With ``size``, a ranged download of ``size + 1`` bytes into a ``SizedWriter``: a blob of
        another size raises ObjectSizeError (its size asked of a HEAD) with at most ``size`` bytes
        written."""
        hook = _ProgressHook(progress)  # one per file: a retry does not count its bytes again

        def call() -> None:
            ranged = {} if size is None else {"offset": 0, "length": size + 1}
            try:
                try:
                    download = self._blob(key).download_blob(
                        max_concurrency=self.max_concurrency, progress_hook=hook if progress else None, **ranged
                    )
                except azexc.HttpResponseError as error:
                    if size is None or _code(error) != "InvalidRange":
                        raise
                    # A range of an empty blob is unsatisfiable (416): the whole blob is empty.
                    raise ObjectSizeError(self.url(key), size, 0) from None
                with open(path, "wb") as handle:
                    if size is None:
                        download.readinto(handle)
                        return
                    writer = SizedWriter(handle, self.url(key), size)
                    download.readinto(writer)
                    writer.check()
            except azexc.ResourceNotFoundError:
                raise FileNotFoundError(f"{self.url(key)} does not exist") from None
            except ObjectSizeError as error:
                if error.actual is not None or size is None:
                    raise
                properties = self._properties(key)  # how large it is, for the message
                raise ObjectSizeError(self.url(key), size, properties and int(properties.size)) from None

        self._run("download of", key, call)

    def list(self, prefix: str = "") -> builtins.list[ObjectInfo]:
        full = join_key(self.prefix, prefix)
        if prefix.endswith("/") or not prefix:
            full = full + "/" if full else ""
        strip = len(self.prefix) + 1 if self.prefix else 0

        def call() -> builtins.list[ObjectInfo]:
            try:
                return [
                    ObjectInfo(key=blob.name[strip:], size=int(blob.size or 0))
                    for blob in self._container.list_blobs(
                        name_starts_with=full or None, include=["metadata"], results_per_page=LIST_ALL_PAGE
                    )
                    # A hierarchical-namespace account lists its directories as empty blobs.
                    if (blob.metadata or {}).get("hdi_isfolder") != "true"
                ]
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                raise

        return self._run("LIST", prefix, call)  # type: ignore[no-any-return]

    # -- copies (the CopyableObjectStore primitives) ---------------------------------------
    def _properties(self, key: str) -> Any:
        """The blob's properties (one HEAD), or None when it does not exist."""

        def call() -> Any:
            try:
                return self._blob(key).get_blob_properties()
            except azexc.ResourceNotFoundError:
                return None

        return self._run("HEAD", key, call)

    def checksum(self, key: str) -> Optional[ObjectChecksum]:
        """The size, and the CRC32C yogacache stored in the metadata when it wrote the blob (None
        for a blob another tool wrote: Azure computes MD5 and CRC64, never CRC32C)."""
        properties = self._properties(key)
        if properties is None:
            return None
        value = (properties.metadata or {}).get(_CRC32C_METADATA)
        return ObjectChecksum(int(properties.size), value if is_crc32c(value) else None)

    def ensure_checksum(self, key: str) -> Optional[ObjectChecksum]:
        return self.checksum(key)  # Azure cannot compute a CRC32C: the caller reads the bytes

    def read_chunks(self, key: str, chunk_bytes: int = COPY_CHUNK_BYTES) -> Iterator[bytes]:
        """Ranged reads of one version (``If-Match`` the first HEAD's ETag), so that a replacement
        of the blob part-way is an error, never a mix of two versions."""
        properties = self._properties(key)
        if properties is None:
            raise FileNotFoundError(f"{self.url(key)} does not exist")
        size, etag = int(properties.size), properties.etag
        blob = self._blob(key)
        start = 0
        while start < size:
            length = min(chunk_bytes, size - start)
            try:
                chunk = blob.download_blob(
                    offset=start, length=length, etag=etag, match_condition=MatchConditions.IfNotModified
                ).readall()
            except azexc.ResourceNotFoundError:
                raise FileNotFoundError(f"{self.url(key)} does not exist") from None
            except Exception as error:  # noqa: BLE001 - a failure part-way: the caller starts over
                raise RemoteError(f"reading {self.url(key)} failed part-way: {self._describe(error)}") from None
            if not chunk:
                raise RemoteError(f"reading {self.url(key)} ended early at byte {start} of {size}")
            start += len(chunk)
            yield bytes(chunk)

    def write_chunks(
        self, key: str, chunks: Iterable[bytes], size: int, progress: Optional[ProgressCallback] = None
    ) -> None:
        """Blocks staged as the chunks come (each with its Content-MD5, which the server checks;
        each request retried, its bytes in hand), committed with the whole object's CRC32C in the
        metadata; one Put Blob for one chunk."""
        blob = self._blob(key)
        whole = Crc32c()
        # Enough bytes a block that the blob stays within Azure's block count.
        block_bytes = max(_BLOCK, -(-size // _MAX_BLOCKS))
        blocks: builtins.list[BlobBlock] = []
        pending: builtins.list[bytes] = []
        pending_bytes = 0
        upload = uuid.uuid4().hex  # this upload's own block ids: a concurrent one cannot mix its blocks in

        def stage(data: bytes) -> None:
            block_id = f"{upload}-{len(blocks):08d}"
            self._run(
                "upload of a block to",
                key,
                lambda: blob.stage_block(block_id, data, length=len(data), validate_content=True),
            )
            blocks.append(BlobBlock(block_id=block_id))
            if progress:
                progress(len(data))

        for chunk in chunks:
            whole.update(chunk)
            pending.append(bytes(chunk))
            pending_bytes += len(chunk)
            if pending_bytes >= block_bytes:
                stage(b"".join(pending))
                pending, pending_bytes = [], 0
        metadata = {_CRC32C_METADATA: whole.value}
        rest = b"".join(pending)
        if not blocks:
            self._run(
                "PUT", key, lambda: blob.upload_blob(rest, overwrite=True, metadata=metadata, validate_content=True)
            )
            if progress and rest:
                progress(len(rest))
            return
        if rest:
            stage(rest)
        self._run("committing the blocks of", key, lambda: blob.commit_block_list(blocks, metadata=metadata))

    def copy_server_side(self, copy: ServerCopy) -> bool:
        """Copy Blob (polled until done) when the source is a container of the same account: bytes
        stay in the cloud, and the copy keeps the source's metadata (its CRC32C)."""
        source = copy.source
        if not isinstance(source, AzureObjectStore) or source.endpoint != self.endpoint:
            return False
        origin = source._blob(copy.source_key)
        target = self._blob(copy.key)

        def call() -> None:
            try:
                started = target.start_copy_from_url(origin.url)
            except azexc.ResourceNotFoundError as error:
                if _code(error) == "ContainerNotFound":
                    raise self._missing_container() from None
                raise FileNotFoundError(f"{source.url(copy.source_key)} does not exist") from None
            status = started.get("copy_status")
            while status == "pending":
                time.sleep(_COPY_POLL_SECONDS)
                status = target.get_blob_properties().copy.status
            if status != "success":
                raise RemoteError(f"copy of {source.url(copy.source_key)} to {self.url(copy.key)} ended {status}")

        self._run("copy to", copy.key, call)
        copy.copied(copy.size)
        return True

    # -- pinned reads (what object sources need) ------------------------------------------
    def head(
        self, key: str, *, version_id: Optional[str] = None, generation: Optional[int] = None
    ) -> Optional[ObjectPin]:
        """Get Blob Properties (of ``version_id`` where asked: a versioned account)."""

        def call() -> Optional[ObjectPin]:
            self.metadata_requests += 1
            try:
                properties = self._blob(key).get_blob_properties(version_id=version_id)
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                return None
            return ObjectPin(key, int(properties.size), etag=_unquoted(properties.etag), version_id=version_id)

        return self._run("HEAD", key, call)  # type: ignore[no-any-return]

    def list_page(
        self, prefix: str, start_at: Optional[str] = None, page_size: int = LIST_PAGE, token: Optional[str] = None
    ) -> PinnedPage:
        """One List Blobs request, from ``start_at`` (``startFrom``; keys below it that a service
        without it lists are dropped here) or continuing at ``token`` (the service's marker)."""
        base = f"{self.prefix}/" if self.prefix else ""
        first = base + start_at if start_at is not None and token is None else None

        def call() -> PinnedPage:
            self.metadata_requests += 1
            extra = {"start_from": first} if first is not None else {}
            pages = self._container.list_blobs(
                name_starts_with=base + prefix or None, include=["metadata"], results_per_page=page_size, **extra
            ).by_page(continuation_token=token)
            try:
                page = builtins.list(next(pages))
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                raise
            found = [
                ObjectPin(blob.name[len(base) :], int(blob.size or 0), etag=_unquoted(blob.etag))
                for blob in page
                if (first is None or blob.name >= first)
                # A hierarchical-namespace account lists its directories as empty blobs.
                and (blob.metadata or {}).get("hdi_isfolder") != "true"
            ]
            following = pages.continuation_token
            return PinnedPage(found, following is not None, following)

        return self._run("LIST", prefix, call)  # type: ignore[no-any-return]

    def read_range(self, pin: ObjectPin, start: int, stop: int) -> bytes:
        """A ranged Get Blob, ``If-Match`` the pin's ETag (and of its version, where it names one)."""
        if stop <= start or start >= pin.size:
            return b""

        def call() -> bytes:
            try:
                download = self._blob(pin.key).download_blob(
                    offset=start,
                    length=min(stop, pin.size) - start,
                    version_id=pin.version_id,
                    etag=f'"{pin.etag}"',
                    match_condition=MatchConditions.IfNotModified,
                )
                data = bytes(download.readall())
            except azexc.ResourceModifiedError:
                # Azure answers 412 for a blob that is gone, too: tell the two apart.
                if self.head(pin.key, version_id=pin.version_id) is None:
                    raise ObjectChangedError(f"{self.url(pin.key)} is gone ({pin.describe()})", deleted=True) from None
                raise ObjectChangedError(f"{self.url(pin.key)} changed since {pin.describe()}", deleted=False) from None
            except azexc.ResourceNotFoundError as error:
                if _container_missing(error):
                    raise self._missing_container() from None
                raise ObjectChangedError(f"{self.url(pin.key)} is gone ({pin.describe()})", deleted=True) from None
            served = getattr(download.properties, "version_id", None)
            if served:
                self.served_versions[pin.key] = str(served)
            return data

        return self._run("GET", pin.key, call)  # type: ignore[no-any-return]


def _unquoted(etag: Optional[str]) -> Optional[str]:
    return etag.strip('"') if etag else None


class _ProgressHook:
    """The client's ``progress_hook(current, total)`` as byte counts since the last call. The
    client calls it from each of its ``max_concurrency`` threads, the counts out of order: the
    most seen so far is kept under a lock, so every byte counts once."""

    def __init__(self, progress: Optional[ProgressCallback]) -> None:
        self._progress = progress
        self._done = 0
        self._lock = threading.Lock()

    def __call__(self, current: int, total: Optional[int]) -> None:
        with self._lock:
            added, self._done = max(0, current - self._done), max(self._done, current)
        if self._progress and added:
            self._progress(added)
