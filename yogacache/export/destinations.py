"""Where an export goes: a local directory (temporary name, sync, rename) or an object store
prefix (a local temporary file per shard, uploaded by a background thread)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import tempfile
import threading
import uuid
from pathlib import Path
from typing import IO, Any, Iterator, Optional, Protocol, Union

from yogacache.backends.base import TransferCancelled
from yogacache.export.errors import ExportError

_WRITE_BUFFER = 4 << 20  # samples are small writes: gather them into large ones


class Destination(Protocol):
    """Where shards and the index go: a local directory or an object store prefix."""

    def url(self, name: str = "") -> str: ...

    def names(self) -> list[str]:
        """Every file or object there now."""
        ...

    def new_shard(self, name: str) -> contextlib.AbstractContextManager[IO[bytes]]:
        """A file to write the shard into; it is put in place (or queued for upload) on a clean exit."""
        ...

    def wait(self) -> None:
        """Returns once every shard handed over is in place."""
        ...

    def cancel(self) -> None:
        """Stops an upload under way at its next chunk (the export failed or was interrupted)."""
        ...

    def write_index(self, name: str, data: bytes, replace: bool) -> None: ...

    def remove(self, name: str) -> None: ...

    def close(self) -> None: ...


class DirectoryDestination:
    """A local directory; each shard is written under a temporary name, synced, then renamed."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser().absolute()
        if self.path.exists() and not self.path.is_dir():
            raise ExportError(f"export destination {self.path} is a file, not a directory")

    def url(self, name: str = "") -> str:
        return str(self.path / name) if name else str(self.path)

    def names(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(os.listdir(self.path))

    def _temp(self, name: str) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        return self.path / f".{name}.tmp-{uuid.uuid4().hex}"

    @contextlib.contextmanager
    def new_shard(self, name: str) -> Iterator[IO[bytes]]:
        temp = self._temp(name)
        try:
            with open(temp, "xb", buffering=_WRITE_BUFFER) as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path / name)
        finally:
            temp.unlink(missing_ok=True)

    def wait(self) -> None:
        pass

    def cancel(self) -> None:
        pass

    def write_index(self, name: str, data: bytes, replace: bool) -> None:
        temp = self._temp(name)
        try:
            with open(temp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            _sync_directory(self.path)  # the shards' renames, before the index names them
            if replace:
                os.replace(temp, self.path / name)
            else:
                try:
                    os.link(temp, self.path / name)  # create only if absent
                except FileExistsError:
                    raise ExportError(f"{self.url(name)} appeared during the export (another export?)") from None
            _sync_directory(self.path)
        finally:
            temp.unlink(missing_ok=True)

    def remove(self, name: str) -> None:
        (self.path / name).unlink(missing_ok=True)

    def close(self) -> None:
        pass


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ObjectDestination:
    """An object store prefix (``s3://``, ``gs://``): each shard is written to a local temporary
    file and uploaded by one background thread while the next shard is written (at most two
    shards are on local disk at once)."""

    def __init__(self, backend: Any, temp_dir: Optional[Path] = None) -> None:
        self.backend = backend
        self._temp = tempfile.TemporaryDirectory(prefix="yogacache-export-", dir=temp_dir)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="yogacache-export")
        self._upload: Optional[concurrent.futures.Future[None]] = None
        self._cancelled = threading.Event()

    def url(self, name: str = "") -> str:
        return str(self.backend.url(name))

    def names(self) -> list[str]:
        return sorted(info.key for info in self.backend.list(""))

    def _upload_and_remove(self, path: Path, name: str) -> None:
        try:
            self.backend.upload_file(path, name, self._check_cancelled)
        finally:
            path.unlink(missing_ok=True)

    def _check_cancelled(self, count: int) -> None:
        if self._cancelled.is_set():
            raise TransferCancelled(f"upload of {self.url()} cancelled")

    def cancel(self) -> None:
        self._cancelled.set()

    @contextlib.contextmanager
    def new_shard(self, name: str) -> Iterator[IO[bytes]]:
        path = Path(self._temp.name) / name
        try:
            with open(path, "xb", buffering=_WRITE_BUFFER) as handle:
                yield handle
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        self.wait()  # the previous shard is up before this one is handed over
        self._upload = self._pool.submit(self._upload_and_remove, path, name)

    def wait(self) -> None:
        upload = self._upload
        if upload is not None:
            upload.result()  # interrupted (Ctrl-C), it stays pending: the clean-up waits for it again
            self._upload = None

    def write_index(self, name: str, data: bytes, replace: bool) -> None:
        if self.backend.write(name, data, if_absent=not replace) is None:
            raise ExportError(f"{self.url(name)} appeared during the export (another export?)")

    def remove(self, name: str) -> None:
        self.backend.delete(name)

    def close(self) -> None:
        upload, self._upload = self._upload, None
        if upload is not None:
            upload.cancel()
            concurrent.futures.wait([upload])
        self._pool.shutdown(wait=True)
        self._temp.cleanup()


def open_destination(
    target: Union[str, "os.PathLike[str]"], *, endpoint_url: Optional[str] = None, temp_dir: Optional[Path] = None
) -> Destination:
    """A directory (a path or ``file://`` URL), or an object store prefix (``s3://``, ``gs://``)."""
    text = os.fspath(target)
    if text.startswith("file://"):
        return DirectoryDestination(Path(text[len("file://") :]))
    if "://" not in text:
        return DirectoryDestination(Path(text))
    from yogacache.backends.registry import open_backend

    return ObjectDestination(open_backend(text, endpoint_url=endpoint_url), temp_dir)
