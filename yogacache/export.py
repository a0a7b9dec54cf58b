"""Export a cache as WebDataset tar shards plus a ``wids`` shard index, to a directory, S3 or GCS.

Each record becomes one sample: a ``__key__`` (the record's own ``__key__`` field, else its
zero-padded index) and one tar member ``<key>.<suffix>`` per leaf of the element. The suffix of
each leaf is decided once, from the element spec, before anything is written (see
``sample_fields`` and docs/export.md):

- a leaf's own name that holds a dot (``seg.png``) or is a known extension (``jpg``, ``cls``,
  ``txt``, ...) is the suffix as it is; otherwise a suffix for the value's kind is appended:
  integer scalars ``.cls`` (decimal text), strings and bytes ``.txt`` (kept byte for byte; UTF-8
  is checked), every other number and every array ``.npy`` (``np.save`` format, no pickle);
- names in nested dicts and tuples are joined with dots (``pair.0.npy``; a tuple element's items
  are ``0``, ``1``, ...; a bare leaf is just ``<key>.npy``);
- ``.npy`` holds numbers only, ``.cls``-like suffixes hold integers or text, any other suffix
  holds bytes or text unchanged; a suffix webdataset would unpickle (``.pyd``, ``.pkl``, ...) is
  refused.

Shards are plain ustar tar files written deterministically (fixed mtime, owner and mode, members
in spec order), so two exports of one cache are byte-identical. Shards appear first; the index
is written last, so a reader that starts from the index never sees a partial export, and an
export that fails leaves no index (and removes the shards it wrote).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import functools
import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Mapping, Optional, Protocol, Sequence, Union

import numpy as np

from yogacache import progress
from yogacache.backends.base import TransferCancelled
from yogacache.errors import ConfigError, UnsupportedDatasetError, YogaCacheError
from yogacache.format.spec import STRING, Spec, TensorSpec
from yogacache.progress import format_bytes
from yogacache.read.reader import CacheReader

FORMATS = ("webdataset",)
INDEX_NAME = "shardindex.json"  # the name `widsindex create` gives an index
DEFAULT_SHARD_SIZE = 512 << 20
KEY_DIGITS = 9
WIDS_KIND = "wids-shard-index-v1"

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_END_OF_ARCHIVE = 2 * _BLOCK
_NAME_LIMIT = 100  # ustar's name field; `wids` reads no longer names (no pax, no prefix field)
_MAX_MEMBER_BYTES = 8**11 - 1  # the ustar size field
_WRITE_BUFFER = 4 << 20  # samples are small writes: gather them into large ones

# Suffixes webdataset and common loaders recognise: a field so named is written under its name.
_TEXT_LIKE = frozenset("cls cls2 class count index inx id txt text transcript".split())
_INTEGER_TEXT = frozenset("cls cls2 class count index inx id".split())
_KNOWN = _TEXT_LIKE | frozenset(
    (
        "npy npz json jsn jpg jpeg png ppm pgm pbm pnm gif bmp tif tiff webp img image "
        "flac mp3 wav ogg opus m4a mp4 avi webm mkv html htm xml csv bin ten tb mp msg msgpack cbor"
    ).split()
)
_UNPICKLED = frozenset("pyd pkl pickle pth".split())  # webdataset's decoders unpickle these
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]i?)?B?\s*", re.IGNORECASE)
_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}


class ExportError(YogaCacheError):
    """An export failed; no index was written at the destination."""


class DestinationNotEmptyError(ExportError):
    """The export destination holds files already (``overwrite=True`` replaces an export there)."""


def parse_size(text: Union[str, int]) -> int:
    """``"512M"`` (10**6), ``"64Ki"`` (2**10), ``"1.5GiB"``, ``"1000"``: a positive number of bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.fullmatch(str(text))
        if match is None:
            raise ConfigError(
                f"size {text!r} is not understood: use bytes or a number with K, M, G, T (powers of 1000) "
                "or Ki, Mi, Gi, Ti (powers of 1024), e.g. 512M or 1Gi"
            )
        value = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


def check_format(format: str) -> None:
    """ConfigError unless ``format`` is one this module writes."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: the formats are {', '.join(FORMATS)}")


# -- the mapping from records to samples ------------------------------------------------------
@dataclass(frozen=True)
class SampleField:
    """One leaf of the element as one tar member: ``<key>.<suffix>`` holds ``encoding`` of it.

    ``encoding``: ``npy`` (``np.save`` format), ``decimal`` (an integer as ASCII digits),
    ``bytes`` (the leaf's bytes unchanged) or ``utf8`` (unchanged, checked to be UTF-8 text).
    """

    leaf: int
    path: str
    suffix: str
    encoding: str


def _leaf_paths(spec: Spec, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], TensorSpec]]:
    """Every leaf with its path, in the flattening order of ``format.spec``."""
    if isinstance(spec, TensorSpec):
        yield prefix, spec
    elif isinstance(spec, dict):
        for key in sorted(spec):
            yield from _leaf_paths(spec[key], (*prefix, key))
    else:
        for index, item in enumerate(spec):
            yield from _leaf_paths(item, (*prefix, str(index)))


def _default_extension(leaf: TensorSpec) -> str:
    if leaf.dtype == STRING:
        return "txt"
    if leaf.shape == () and (leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")):
        return "cls"
    return "npy"


def _encoding(path: str, suffix: str, leaf: TensorSpec, defaulted: bool) -> str:
    extension = suffix.rsplit(".", 1)[-1].lower()
    kind = f"{leaf.dtype}{list(leaf.shape) if leaf.shape is not None else '[any shape]'}"
    if extension in _UNPICKLED:
        raise UnsupportedDatasetError(
            f"field {path!r} would be written as .{extension}, which webdataset's decoders unpickle: "
            "yogacache never writes such a member; rename the field"
        )
    if leaf.dtype == STRING:
        if leaf.shape != ():
            raise UnsupportedDatasetError(
                f"field {path!r} is an array of strings ({kind}); WebDataset has no standard member "
                "for it: only single strings or bytes can be exported"
            )
        if extension == "npy":
            raise UnsupportedDatasetError(f"field {path!r} holds bytes or text and cannot be written as .npy")
        return "utf8" if defaulted else "bytes"
    if extension == "npy":
        if leaf.dtype == "bfloat16":
            raise UnsupportedDatasetError(
                f"field {path!r} is bfloat16, which the .npy format cannot name (numpy would read it back "
                "as raw void bytes)"
            )
        return "npy"
    integer = leaf.dtype == "bool" or leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")
    if extension in _TEXT_LIKE and integer and leaf.shape == ():
        return "decimal"
    raise UnsupportedDatasetError(
        f"field {path!r} holds {kind}, which cannot be written as .{extension}: numbers and arrays go "
        f"to .npy (name the field without an extension, or {path.rsplit('.', 1)[0]}.npy), single integers "
        f"also to .{'/.'.join(sorted(_INTEGER_TEXT))}/.txt; .{extension} holds bytes or text"
    )


def _fits(suffix: str, leaf: TensorSpec) -> bool:
    """Whether a leaf can be written under ``suffix`` as it is (an array fits .npy, not .image)."""
    try:
        _encoding(suffix, suffix, leaf, False)
    except UnsupportedDatasetError:
        return False
    return True


def _check_component(name: str, path: str) -> None:
    if not name or any(not part for part in name.split(".")):
        raise UnsupportedDatasetError(
            f"field {path!r} cannot name a tar member: names must be non-empty, with no empty part between dots"
        )
    if "/" in name or any(ord(char) < 32 for char in name):
        raise UnsupportedDatasetError(f"field {path!r} cannot name a tar member: it holds '/' or a control character")
    if name.startswith("__") and name.endswith("__"):
        raise UnsupportedDatasetError(
            f"field {path!r} is reserved: webdataset keeps __name__ fields for its own metadata "
            "(only __key__ is used, as the sample key)"
        )


def sample_fields(
    spec: Spec, extensions: Optional[Mapping[str, str]] = None
) -> tuple[Optional[int], list[SampleField]]:
    """The sample key's leaf (None: keys are record indices) and one ``SampleField`` per other leaf.

    ``extensions`` maps a field's path (``"image"``, ``"pair.0"``) to the suffix to append to it
    instead of the default one (e.g. ``{"raw": "bin"}``). Raises UnsupportedDatasetError, before
    anything is written, for an element that cannot be exported.
    """
    extensions = dict(extensions or {})
    key_leaf: Optional[int] = None
    fields: list[SampleField] = []
    seen: dict[str, str] = {}
    for index, (parts, leaf) in enumerate(_leaf_paths(spec)):
        path = ".".join(parts)
        if parts == ("__key__",) and isinstance(spec, dict):
            integer = leaf.dtype.startswith("int") or leaf.dtype.startswith("uint")
            if leaf.shape != () or not (leaf.dtype == STRING or integer):
                raise UnsupportedDatasetError(
                    f"field '__key__' is the sample key and must be a single string or integer, not {leaf.dtype}"
                )
            key_leaf = index
            continue
        for part in parts:
            _check_component(part, path)
        own = parts[-1] if parts else ""
        override = extensions.pop(path, None)
        if override is not None:
            _check_component(override, path)
            suffix, defaulted = (f"{path}.{override}" if path else override), False
        elif own and "." in own:
            suffix, defaulted = path, False
        elif own.lower() in _KNOWN and _fits(path, leaf):
            suffix, defaulted = path, False  # "jpg", "cls", "txt": webdataset's own names
        else:
            extension = _default_extension(leaf)
            suffix, defaulted = (f"{path}.{extension}" if path else extension), True
        encoding = _encoding(path or "(element)", suffix, leaf, defaulted)
        folded = suffix.lower()  # webdataset lower-cases suffixes when it groups a sample
        if folded in seen:
            raise UnsupportedDatasetError(
                f"fields {seen[folded]!r} and {path!r} would both be written as .{suffix} "
                "(webdataset compares suffixes in lower case): rename one"
            )
        seen[folded] = path
        fields.append(SampleField(index, path or "(element)", suffix, encoding))
    if extensions:
        raise ConfigError(f"extensions name fields the element does not have: {sorted(extensions)}")
    if not fields:
        raise UnsupportedDatasetError("the element holds only a __key__: a sample needs at least one other field")
    return key_leaf, fields


@functools.lru_cache(maxsize=256)
def _npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    """The ``np.save`` header of a C-ordered array (the bytes ``np.save`` writes before the data)."""
    buffer = io.BytesIO()
    descr = np.lib.format.dtype_to_descr(dtype)
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def _npy(value: Any) -> bytes:
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise UnsupportedDatasetError("an object array cannot be written as .npy (it would need pickle)")
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # (np.ascontiguousarray would make a scalar 1-d)
    return _npy_header(array.dtype, array.shape) + array.tobytes()


class SampleEncoder:
    """Turns decoded records (flat leaf lists) into ``(key, [(suffix, bytes), ...])`` samples."""

    def __init__(self, spec: Spec, num_records: int, extensions: Optional[Mapping[str, str]] = None) -> None:
        self.key_leaf, self.fields = sample_fields(spec, extensions)
        self.digits = max(KEY_DIGITS, len(str(max(num_records - 1, 0))))
        self._previous_key: Optional[str] = None
        longest = max(len(f.suffix.encode("utf-8")) for f in self.fields)
        if self.key_leaf is None and self.digits + 1 + longest > _NAME_LIMIT:
            raise UnsupportedDatasetError(
                f"a member name would be longer than the {_NAME_LIMIT} bytes a tar header holds: "
                "shorten the field names"
            )

    def key(self, index: int, leaves: Sequence[Any]) -> str:
        if self.key_leaf is None:
            return f"{index:0{self.digits}d}"
        value = leaves[self.key_leaf]
        if isinstance(value, bytes):
            try:
                key = value.decode("utf-8")
            except UnicodeDecodeError:
                raise ExportError(f"record {index}: its __key__ is not UTF-8 text") from None
        else:
            key = str(int(value))
        if not key or "." in key or "/" in key or any(ord(char) < 32 for char in key):
            raise ExportError(
                f"record {index}: its __key__ {key!r} cannot be a WebDataset key (it must be non-empty, "
                "with no '.', '/' or control character: readers split member names at the first dot)"
            )
        if key == self._previous_key:
            raise ExportError(
                f"record {index}: its __key__ {key!r} is the previous record's too; readers would merge "
                "the two samples into one"
            )
        self._previous_key = key
        return key

    def encode(self, index: int, leaves: Sequence[Any]) -> tuple[str, list[tuple[str, bytes]]]:
        key = self.key(index, leaves)
        members = []
        for item in self.fields:
            value = leaves[item.leaf]
            if item.encoding == "npy":
                data = _npy(value)
            elif item.encoding == "decimal":
                data = str(int(value)).encode("ascii")
            else:
                data = bytes(value)
                if item.encoding == "utf8":
                    try:
                        data.decode("utf-8")
                    except UnicodeDecodeError:
                        raise ExportError(
                            f"record {index}: field {item.path!r} holds bytes that are not UTF-8 text, so they "
                            f"cannot go to .{item.suffix}: give the field its own extension, e.g. "
                            f"extensions={{{item.path!r}: 'bin'}} (CLI: --ext {item.path}=bin)"
                        ) from None
            name = f"{key}.{item.suffix}"
            if len(name.encode("utf-8")) > _NAME_LIMIT:
                raise ExportError(
                    f"record {index}: member name {name!r} is longer than the {_NAME_LIMIT} bytes a tar header holds"
                )
            if len(data) > _MAX_MEMBER_BYTES:
                raise ExportError(f"record {index}: field {item.path!r} is larger than a tar member can be (8 GiB)")
            members.append((name, data))
        return key, members


# -- tar shards --------------------------------------------------------------------------------
def _padded(size: int) -> int:
    return -size % _BLOCK


def sample_tar_bytes(members: Sequence[tuple[str, bytes]]) -> int:
    """Bytes a sample takes in a tar file: a header block per member, its data, padding."""
    return sum(_BLOCK + len(data) + _padded(len(data)) for _, data in members)


def closed_tar_bytes(content: int) -> int:
    """The size of a tar file whose members take ``content`` bytes, once closed (end blocks,
    padding to whole records, as ``tarfile`` writes them)."""
    total = content + _END_OF_ARCHIVE
    return total + (-total % _RECORD)


class UstarHeaders:
    """Tar headers for regular files with one owner (0:0, no names), mode 0444 and mtime: the
    bytes ``tarfile.TarInfo.tobuf(USTAR_FORMAT)`` gives, from a template (tarfile builds each
    header field by field, which dominated the export of small records)."""

    def __init__(self, mtime: int) -> None:
        info = tarfile.TarInfo("")
        info.size = 0
        info.mtime = mtime
        info.mode = 0o444
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        template = bytearray(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict"))
        template[148:156] = b" " * 8  # the checksum is summed with its own field as spaces
        self._template = bytes(template)
        self._sum = sum(template) - sum(template[124:136])  # without the size field

    def header(self, name: bytes, size: int) -> bytes:
        size_field = b"%011o\0" % size
        header = bytearray(self._template)
        header[: len(name)] = name
        header[124:136] = size_field
        header[148:156] = b"%06o\0 " % (self._sum + sum(name) + sum(size_field))
        return bytes(header)


class ShardTarWriter:
    """Writes samples into one ustar file: fixed owner, mode and mtime, members in order."""

    def __init__(self, handle: IO[bytes], headers: UstarHeaders, md5: bool = False) -> None:
        self.handle = handle
        self.headers = headers
        self.offset = 0
        self.samples = 0
        self.md5 = hashlib.md5(usedforsecurity=False) if md5 else None

    def _write(self, data: bytes) -> None:
        self.handle.write(data)
        if self.md5 is not None:
            self.md5.update(data)
        self.offset += len(data)

    def add(self, members: Sequence[tuple[str, bytes]]) -> None:
        parts = []
        for name, data in members:
            parts.append(self.headers.header(name.encode("utf-8"), len(data)))
            parts.append(data)
            if _padded(len(data)):
                parts.append(b"\0" * _padded(len(data)))
        self._write(b"".join(parts))
        self.samples += 1

    def close(self) -> int:
        """Ends the archive as ``tarfile`` does; returns the file's size."""
        end = closed_tar_bytes(self.offset) - self.offset
        self._write(b"\0" * end)
        return self.offset


# -- destinations ------------------------------------------------------------------------------
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


# -- the export --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardInfo:
    name: str
    num_samples: int
    size_bytes: int
    md5: Optional[str] = None


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote: its shards, in order, and the index naming them."""

    destination: str
    index_url: str
    num_records: int
    shards: tuple[ShardInfo, ...]
    fields: tuple[SampleField, ...] = field(default=())

    @property
    def size_bytes(self) -> int:
        return sum(shard.size_bytes for shard in self.shards)


def _mtime(created_at: str) -> int:
    try:
        return max(0, int(datetime.datetime.fromisoformat(created_at).timestamp()))
    except ValueError:
        return 0


def _index_bytes(reader: CacheReader, name: str, shards: Sequence[ShardInfo], fields: Sequence[SampleField]) -> bytes:
    manifest = reader.manifest
    index = {
        "__kind__": WIDS_KIND,
        "wids_version": 1,
        "name": name,
        "shardlist": [
            {
                "url": shard.name,
                "nsamples": shard.num_samples,
                "filesize": shard.size_bytes,
                **({"md5sum": shard.md5} if shard.md5 else {}),
            }
            for shard in shards
        ],
        "yogacache": {
            "dataset_id": manifest.dataset_id,
            "dataset_version": manifest.dataset_version,
            "build_id": manifest.build_id,
            "created_at": manifest.created_at,
            "num_records": manifest.num_records,
            "fields": {item.path: item.suffix for item in fields},
        },
    }
    return (json.dumps(index, indent=2) + "\n").encode("utf-8")


def _shard_pattern(prefix: str) -> re.Pattern[str]:
    return re.compile(re.escape(prefix) + r"-\d{6,}\.tar")


def export_reader(
    reader: CacheReader,
    destination: Union[str, "os.PathLike[str]", Destination],
    *,
    format: str = "webdataset",
    shard_size: Union[int, str] = DEFAULT_SHARD_SIZE,
    shard_records: Optional[int] = None,
    prefix: Optional[str] = None,
    overwrite: bool = False,
    extensions: Optional[Mapping[str, str]] = None,
    md5: bool = False,
    endpoint_url: Optional[str] = None,
    show_progress: bool = True,
    temp_dir: Optional[Path] = None,
) -> ExportResult:
    """Writes every record of ``reader``'s cache, in index order, as WebDataset shards and a
    ``wids`` index (``shardindex.json``) at ``destination``.

    Args:
        destination: a directory, a ``file://`` URL, or ``s3://bucket/prefix`` / ``gs://bucket/prefix``.
        shard_size: the largest shard in bytes (``"512M"``, ``"1Gi"``); a sample larger than
            this alone makes a shard of its own.
        shard_records: the most samples per shard (no limit by default).
        prefix: shards are ``<prefix>-000000.tar``, ... (default ``<id>-<version>``).
        overwrite: replace an export at a destination that is not empty (its index is removed
            first, shards of the old export that the new index does not name are removed last;
            other files are left alone). Without it a non-empty destination is refused.
        extensions: the suffix to append to a field instead of its default (``{"raw": "bin"}``).
        md5: record each shard's MD5 in the index (``md5sum``, as ``widsindex create`` does;
            hashing costs about as much as writing).
        endpoint_url: the S3 endpoint of an ``s3://`` destination.
        temp_dir: where shards bound for an object store are staged (default: the temp directory).

    Raises:
        ConfigError: an unknown format, a bad size or prefix, extensions for fields that do not exist.
        UnsupportedDatasetError: the element cannot be exported (before anything is written).
        DestinationNotEmptyError: the destination holds files and ``overwrite`` is false.
        ExportError: the export failed part-way; no index was written and the shards written
            so far were removed.
    """
    check_format(format)
    limit = parse_size(shard_size)
    if shard_records is not None and shard_records <= 0:
        raise ConfigError(f"shard_records must be positive, got {shard_records}")
    manifest = reader.manifest
    name = prefix or f"{manifest.dataset_id}-{manifest.dataset_version}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", name):
        raise ConfigError(f"shard prefix {name!r} must be letters, digits, '_', '.' or '-'")
    encoder = SampleEncoder(manifest.element_spec, manifest.num_records, extensions)
    target = (
        open_destination(destination, endpoint_url=endpoint_url, temp_dir=temp_dir)
        if isinstance(destination, (str, os.PathLike))
        else destination
    )
    what = f"{manifest.dataset_id} {manifest.dataset_version}"
    written: list[str] = []
    try:
        existing = target.names()
        if existing and not overwrite:
            shown = ", ".join(existing[:3]) + (", ..." if len(existing) > 3 else "")
            raise DestinationNotEmptyError(
                f"export destination {target.url()} is not empty ({len(existing)} file(s): {shown}): choose an "
                "empty destination, or pass --overwrite (overwrite=True) to replace the export there"
            )
        try:
            if INDEX_NAME in existing:
                target.remove(INDEX_NAME)  # from here on no reader sees the old export
            shards = _write_shards(
                reader, encoder, target, name, limit, shard_records, md5, written, show_progress, what
            )
            target.write_index(INDEX_NAME, _index_bytes(reader, name, shards, encoder.fields), replace=overwrite)
        except BaseException as error:
            target.cancel()
            _discard(target, written)
            if not isinstance(error, Exception):
                raise  # Ctrl-C, SIGTERM: the caller says what was stopped
            raise ExportError(
                f"export of {what} to {target.url()} failed: {_describe(error)}; no index was written "
                f"and the {len(written)} shard(s) written were removed"
            ) from error
        stale = _shard_pattern(name)
        current = {shard.name for shard in shards}
        for old in existing:
            if stale.fullmatch(old) and old not in current:
                target.remove(old)  # a previous, longer export's last shards
    finally:
        target.close()
    return ExportResult(
        target.url(), target.url(INDEX_NAME), manifest.num_records, tuple(shards), tuple(encoder.fields)
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and error.errno is not None and error.strerror:
        where = f" on {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return str(error) or type(error).__name__


def _discard(target: Destination, written: Sequence[str]) -> None:
    """Removes the shards this export put in place (best effort: the remote may be failing)."""
    with contextlib.suppress(BaseException):
        target.wait()
    for name in written:
        with contextlib.suppress(Exception):
            target.remove(name)


def _write_shards(
    reader: CacheReader,
    encoder: SampleEncoder,
    target: Destination,
    name: str,
    limit: int,
    shard_records: Optional[int],
    md5: bool,
    written: list[str],
    show_progress: bool,
    what: str,
) -> list[ShardInfo]:
    manifest = reader.manifest
    total = manifest.num_records
    headers = UstarHeaders(_mtime(manifest.created_at))
    batch = max(1, min(4096, (8 << 20) // max(manifest.average_record_bytes, 1)))
    shown = progress.Progress(f"exporting {what}", enabled=show_progress, total=total)
    shards: list[ShardInfo] = []
    done = 0
    size = 0

    def line(short: bool = False) -> str:
        elapsed = max(time.monotonic() - shown.start, 1e-9)
        rate = done / elapsed
        eta = f", ETA {progress.format_duration((total - done) / rate)}" if 0 < rate and done < total else ""
        if short:
            return f"{done:,}/{total:,} records, {len(shards)} shard(s){eta}"
        return (
            f"{done:,} of {total:,} records, {format_bytes(size)} in {len(shards)} shard(s) "
            f"({rate:,.0f} records/s, {format_bytes(size / elapsed)}/s{eta})"
        )

    index = 0

    def samples() -> Iterator[list[tuple[str, bytes]]]:
        nonlocal index
        decode = reader.codec.decode
        fixed = reader.codec.layout is not None  # fixed-shape numbers: read whole columns
        for start in range(0, total, batch):
            indices = np.arange(start, min(start + batch, total))
            if fixed:
                columns = reader.read_columns(indices)
                for row in range(len(indices)):
                    yield encoder.encode(index, [column[row] for column in columns])[1]
                    index += 1
                continue
            for value in reader.read_values(indices):
                yield encoder.encode(index, decode(value))[1]
                index += 1

    stream = samples()
    pending_sample = next(stream, None)
    while pending_sample is not None or not shards:  # an empty cache: one empty shard
        shard_name = f"{name}-{len(shards):06d}.tar"
        with target.new_shard(shard_name) as handle:
            tar = ShardTarWriter(handle, headers, md5)
            while pending_sample is not None:
                grows = sample_tar_bytes(pending_sample)
                full = tar.samples > 0 and (
                    closed_tar_bytes(tar.offset + grows) > limit
                    or (shard_records is not None and tar.samples >= shard_records)
                )
                if full:
                    break
                tar.add(pending_sample)
                done += 1
                shown.emit(line, log_prefix="", completed=done, total=total)
                pending_sample = next(stream, None)
            shard_size = tar.close()
        written.append(shard_name)
        size += shard_size
        shards.append(ShardInfo(shard_name, tar.samples, shard_size, tar.md5.hexdigest() if tar.md5 else None))
    target.wait()
    shown.emit(
        lambda short=False: f"{done:,} records, {format_bytes(size)} in {len(shards)} shard(s)",
        final=True,
        completed=done,
        total=total,
    )
    return shards


def export_cache(
    dataset_id: str,
    dataset_version: str,
    destination: Union[str, "os.PathLike[str]"],
    *,
    storage: Any = None,
    store: Any = None,
    **options: Any,
) -> ExportResult:
    """Exports the cache ``dataset_id`` ``dataset_version`` (see ``export_reader`` for ``options``).

    ``storage`` is what ``open_store`` takes (a directory, a URL, a config; None: the local
    default); or pass an open ``store``. A remote cache is synced to this node first.
    """
    if store is None:
        from yogacache.store import open_store

        store = open_store(storage, endpoint_url=options.get("endpoint_url"))
    with store.open(dataset_id, dataset_version) as reader:
        return export_reader(reader, destination, **options)
