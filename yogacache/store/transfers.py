"""Part transfers: one verified download, one upload, a part streamed from one object store to
another (a copy), and the parallel batch (pull, push, copy, streaming, Ray) that stops on the
first failure or Ctrl-C.

A download goes to a temporary path, is checked against the manifest's size and content hash,
made readable (0644) and durable, and only then renamed to its name (or, for a whole copy, its
directory is: ``store.sync``). Retries are ``RetryPolicy``'s, inside the backend.

One batch runs ``work(item, on_bytes)`` for every item on a few threads. The first failure, or
an interrupt of the thread waiting for the batch (Ctrl-C raises KeyboardInterrupt there), stops
the batch: queued items never start, a running transfer stops at its next chunk (its progress
callback raises TransferCancelled), and no retry of ``RetryPolicy`` starts after the stop (a
backoff under way wakes at once). A transfer waiting on the network for its next chunk cannot be
stopped from outside: the batch waits ``CANCEL_GRACE_SECONDS`` for the running ones, then raises
and leaves them; they are daemon threads, so that they never hold the process at exit.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from yogacache import redaction
from yogacache.backends.base import (
    CopyableObjectStore,
    ObjectSizeError,
    ObjectStore,
    ProgressCallback,
    RemoteError,
    TransferCancelled,
    stop_retries_when,
)
from yogacache.errors import CorruptCacheError
from yogacache.format.checksum import Crc32c
from yogacache.format.durability import fsync_path
from yogacache.format.integrity import new_digest, part_matches
from yogacache.format.manifest import PartInfo

log = redaction.get_logger(__name__)

T = TypeVar("T")
R = TypeVar("R")

_STREAM_ATTEMPTS = 3  # a stream that breaks part-way is started over this often
_PREFETCH_CHUNKS = 2  # chunks read ahead of the upload, per streamed part
CANCEL_GRACE_SECONDS = 0.5  # how long a stopped batch waits for its running transfers
_POLL_SECONDS = 0.1  # the waiting thread wakes this often, so that Ctrl-C reaches it promptly


class _Slot:
    """One item's outcome."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self.error: Optional[BaseException] = None


def run_transfers(
    work: Callable[[T, ProgressCallback], R],
    items: Sequence[T],
    *,
    threads: int,
    add_bytes: ProgressCallback,
    name: str = "yogacache-transfer",
) -> list[R]:
    """``work(item, on_bytes)`` for every item on up to ``threads`` daemon threads; the results in
    the order of ``items``. Raises the first failure (a real one rather than a TransferCancelled it
    caused), or the interrupt, once the running transfers stopped or after a short grace."""
    if not items:
        return []
    cancel = threading.Event()
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        todo.put(index)
    slots = [_Slot() for _ in items]
    finished = threading.Condition()

    def on_bytes(count: int) -> None:
        if cancel.is_set():
            raise TransferCancelled("transfer cancelled")
        add_bytes(count)

    def worker() -> None:
        with stop_retries_when(cancel):
            while not cancel.is_set():
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                slot = slots[index]
                try:
                    slot.result = work(items[index], on_bytes)
                except BaseException as error:  # handed to the waiting thread
                    slot.error = error
                    cancel.set()  # before this thread could take the next item
                finally:
                    with finished:
                        slot.done = True
                        finished.notify_all()

    workers = [
        threading.Thread(target=worker, name=f"{name}-{number}", daemon=True)
        for number in range(max(1, min(threads, len(items))))
    ]
    for thread in workers:
        thread.start()
    try:
        with finished:
            while not cancel.is_set() and not all(slot.done for slot in slots):
                finished.wait(_POLL_SECONDS)
    except BaseException:
        cancel.set()
        _join(workers, CANCEL_GRACE_SECONDS)
        raise
    if cancel.is_set():
        _join(workers, CANCEL_GRACE_SECONDS)
        errors = [slot.error for slot in slots if slot.error is not None]
        raise next((e for e in errors if not isinstance(e, TransferCancelled)), errors[0])
    return [slot.result for slot in slots]


def _join(threads: list[threading.Thread], seconds: float) -> None:
    """Waits up to ``seconds`` in all for ``threads`` to end."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def part_size_error(part: PartInfo, cache: Optional[str], url: str, actual: Optional[int]) -> CorruptCacheError:
    """The error for the object ``url`` of part ``part`` of ``cache`` (``ID:VERSION``, where
    known) that holds ``actual`` bytes (None: more than the manifest says) where its manifest
    says otherwise."""
    holds = f"more than {part.size_bytes}" if actual is None else f"{actual}"
    of = f" of {cache}" if cache else ""
    return CorruptCacheError(
        f"part {part.name}{of} at {url} holds {holds} bytes, but its manifest says "
        f"{part.size_bytes}: the object was altered or swapped; refused (an integrity error, not "
        "retried; nothing of it was kept). Publish the cache again"
    )


def download_part(
    objects: ObjectStore,
    key: str,
    part: PartInfo,
    temp: Path,
    *,
    cache: str,
    on_bytes: Optional[ProgressCallback] = None,
    when_missing: Callable[[], BaseException],
    target: Optional[Path] = None,
) -> None:
    """Downloads the part object ``key`` of ``cache`` (``ID:VERSION``) to ``temp`` and checks it
    against ``part``: an object of another size is refused as the download starts, or at the
    manifest's size at the latest (``ObjectStore.download_file(size=...)``), so a part never
    takes more of the disk than its manifest says; then its content hash. Either mismatch is a
    CorruptCacheError naming the cache, the part and the object, never retried. Then the part is
    made 0644 (as the parts a build writes, whatever the umask) and durable, and renamed to
    ``target`` if given (removing ``temp`` on any failure). An absent object raises
    ``when_missing()``."""
    url = objects.url(key)
    try:
        try:
            objects.download_file(key, temp, on_bytes, size=part.size_bytes)
        except FileNotFoundError:
            raise when_missing() from None
        except ObjectSizeError as error:
            raise part_size_error(part, cache, url, error.actual) from None
        if temp.stat().st_size != part.size_bytes:
            raise part_size_error(part, cache, url, temp.stat().st_size)
        if not part_matches(temp, part):
            raise CorruptCacheError(
                f"part {part.name} of {cache} at {url} does not match its manifest's content hash "
                "(altered or swapped); refused"
            )
        os.chmod(temp, 0o644)
        fsync_path(temp)
        if target is not None:
            os.replace(temp, target)
    except BaseException:
        if target is not None:
            temp.unlink(missing_ok=True)
        raise


def upload_files(
    objects: ObjectStore,
    files: Sequence[tuple[Path, str]],
    *,
    threads: int,
    add_bytes: ProgressCallback = lambda count: None,
    adopt: bool = False,
) -> None:
    """Uploads every ``(path, key)`` in parallel (a batch of ``run_transfers``). ``adopt``: the
    files are handed over, never to change again, so that a shared directory on their filesystem
    may link them instead of copying (``adopt_file``, where the backend has it)."""
    upload = getattr(objects, "adopt_file", objects.upload_file) if adopt else objects.upload_file
    run_transfers(
        lambda item, on_bytes: upload(item[0], item[1], on_bytes), files, threads=threads, add_bytes=add_bytes
    )


def stream_part(
    src: CopyableObjectStore, dst: CopyableObjectStore, source_key: str, key: str, part: PartInfo, on_bytes: Any
) -> str:
    """Streams one part object from ``src`` to ``dst`` through this process (no local file);
    returns its CRC32C after checking its size and content hash against the manifest (a mismatch
    deletes the destination object). A stream that breaks part-way (the backend's retries spent)
    is started over, ``_STREAM_ATTEMPTS`` times in all."""
    for attempt in range(1, _STREAM_ATTEMPTS + 1):
        hashed = HashedChunks(
            src.read_chunks(source_key), part.hash_name, size=part.size_bytes, url=src.url(source_key)
        )
        sent = 0

        def counted(count: int) -> None:
            nonlocal sent
            sent += count
            on_bytes(count)

        try:
            dst.write_chunks(key, _prefetched(hashed), part.size_bytes, counted)
        except ObjectSizeError as error:  # the source holds more than the part: stopped there
            with contextlib.suppress(RemoteError):
                dst.delete(key)
            raise part_size_error(part, None, src.url(source_key), error.actual) from None
        except RemoteError as error:
            if attempt == _STREAM_ATTEMPTS:
                raise
            log.warning("copying %s to %s failed (%s); starting the part over", source_key, dst.url(key), error)
            on_bytes(-sent)
            continue
        if hashed.size != part.size_bytes or hashed.digest != part.digest:
            dst.delete(key)
            raise CorruptCacheError(
                f"part {part.name} at {src.url(source_key)} does not match its manifest "
                f"({hashed.size} bytes, {part.hash_name} {hashed.digest[:16]}...): the source is damaged; "
                "nothing was published"
            )
        return hashed.crc32c
    raise AssertionError("unreachable")  # pragma: no cover


class HashedChunks:
    """Chunks passed through, the part's content hash (BLAKE3 or SHA-256), CRC32C and size
    computed on the way. With ``size`` (the part's, as its manifest says), a chunk that takes
    the object past it raises ObjectSizeError naming ``url``: no more of it is read or passed on;
    and chunks that end short of it raise it too, before the consumer sees their end (an upload
    of them is never completed)."""

    def __init__(self, chunks: Iterable[bytes], algorithm: str, *, size: Optional[int] = None, url: str = "") -> None:
        self._chunks = chunks
        self._content = new_digest(algorithm)
        self._crc32c = Crc32c()
        self._limit = size
        self._url = url
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            if self._limit is not None and self.size + len(chunk) > self._limit:
                raise ObjectSizeError(self._url, self._limit, None)
            self._content.update(chunk)
            self._crc32c.update(chunk)
            self.size += len(chunk)
            yield chunk
        if self._limit is not None and self.size != self._limit:
            raise ObjectSizeError(self._url, self._limit, self.size)

    @property
    def digest(self) -> str:
        return str(self._content.hexdigest())

    @property
    def crc32c(self) -> str:
        return self._crc32c.value


def _prefetched(chunks: Iterable[bytes], depth: int = _PREFETCH_CHUNKS) -> Iterator[bytes]:
    """``chunks``, read ahead by a thread, so that downloading overlaps uploading."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=_POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not put(chunk):
                    return
            put(end)
        except BaseException as error:  # handed to the consumer
            put(error)

    reader = threading.Thread(target=produce, name="yogacache-copy-read", daemon=True)
    reader.start()
    try:
        while True:
            item = buffer.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        reader.join(timeout=5)
