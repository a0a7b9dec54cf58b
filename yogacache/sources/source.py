"""ObjectSource: a record source over objects (S3, GCS, Azure, local files), pinned while it builds.

It lists its objects once (``listing``: LIST pages, or one HEAD for a single object), checks the
pins asked for (``etag=``, ``version_id=``, ``generation=``) before anything is written, then
streams each object through the stages its archive kind and format name (``formats``' tables)
into records, reading every object conditionally on the version listed (``objects``, through
the backends). What it read is recorded in the manifest's ``extra`` under
``"sources"`` so that a cache hit can check the sources cheaply (``freshness``).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping, Optional, Sequence, Union

from yogacache import redaction
from yogacache.format.codec import RecordCodec
from yogacache.format.sources import PythonSource
from yogacache.format.spec import Spec, TensorSpec, flattener, infer_spec
from yogacache.format.writer import BuildLimits
from yogacache.sources.decoders import Decode, decode_sample, decoder_table
from yogacache.sources.errors import SourceChangedError, SourceError
from yogacache.sources.formats import (
    ARCHIVE_SUFFIXES,
    FORMATS,
    RECORD_FORMATS,
    ArchiveKind,
    ByteBudget,
    RecordFormat,
    archive_of,
    check_name,
    file_field,
)
from yogacache.sources.listing import list_sources
from yogacache.sources.objects import Accessors, ObjectRef, ReadAhead
from yogacache.sources.urls import parse_location

SOURCES_EXTRA_KEY = "sources"
PINS_VERSION = 1
ON_SOURCE_CHANGE = ("error", "rebuild", "warn", "ignore")
ENCODE_BATCH = 256
# A parallel build reads plain files (format="files" / "imagefolder") in build shards of this many.
FILES_PER_BUILD_SHARD = 512
ENCODE_BATCH_BYTES = 8 << 20
# How far decoded records run ahead of the cache writer, in bytes (and at most 256 records): past
# it the reading thread waits, so that a large member is held about once (see _Background).
READ_AHEAD_BYTES = 32 << 20
ProgressCallback = Callable[[int, int, int], None]  # objects done, source bytes read, records


def check_policy(on_source_change: str) -> str:
    if on_source_change not in ON_SOURCE_CHANGE:
        raise ValueError(f"on_source_change must be one of {ON_SOURCE_CHANGE}, got {on_source_change!r}")
    return on_source_change


class _CountingStream:
    """Counts the bytes read from an object's stream (progress, and the truncation check)."""

    def __init__(self, stream: Any, on_bytes: Callable[[int], None]) -> None:
        self._stream = stream
        self._on_bytes = on_bytes
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        self._on_bytes(len(data))
        return data  # type: ignore[no-any-return]

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self._stream.close()


class ObjectSource:
    """Records from objects: WebDataset shards, archives, or files (``from_url`` is this class).
    A source to return from a decorated function, pass to ``submit`` or to ``yogacache import``.

    Args:
        urls: an URL or a list of them: ``s3://bucket/key``, ``gs://bucket/key``, a local path or
            ``file://`` URL; braces expand (``train-{000000..000146}.tar``); a trailing ``/`` (or a
            local directory) is a prefix, every object under it.
        format: ``"webdataset"`` (tar or zip members grouped into samples by key), ``"archive"``
            (one record ``{"__key__": member name, "<ext>": bytes}`` per member), ``"files"`` (one
            record per object), ``"imagefolder"`` (one per object, ``cls`` from its parent
            directory, the class table in the manifest), or ``"auto"``: webdataset for
            tar-family objects, archive for zips, files otherwise.
        fields: the fields every record has (others dropped, absent ones empty bytes); by default
            the first sample's (every file extension, for files).
        decode: ``True`` to decode known fields (text, ints, ``.npy`` without pickles, images
            with Pillow), or a mapping of field to decoder name; pickles are always refused.
        etag: the ETag the (single) object must have, or a mapping of URL to ETag.
        version_id, generation: read this version (S3) / generation (GCS) of the single object.
        on_source_change: what a cache hit does when the objects changed since the build:
            ``"error"`` (default), ``"rebuild"``, ``"warn"`` or ``"ignore"``.
        max_bytes: the most bytes the archives may expand to (default: the free disk space
            less a reserve, as for any build of unknown length).
        endpoint_url: an S3-compatible endpoint (default: ``AWS_ENDPOINT_URL`` or AWS), given to
            every backend that takes an ``endpoint_url``.
    """

    kind = "objects"
    cardinality: Optional[int] = None  # known only once every archive is read
    is_object_source = True  # format.sources' registry recognises sources by this

    def __init__(
        self,
        urls: Union[str, Sequence[str]],
        *,
        format: str = "auto",
        fields: Optional[Sequence[str]] = None,
        decode: Decode = None,
        etag: Union[None, str, Mapping[str, str]] = None,
        version_id: Optional[str] = None,
        generation: Optional[int] = None,
        on_source_change: str = "error",
        max_bytes: Optional[int] = None,
        endpoint_url: Optional[str] = None,
    ) -> None:
        given = [urls] if isinstance(urls, (str, os.PathLike)) else list(urls)
        if not given:
            raise ValueError("from_url needs at least one URL")
        self.urls = [str(url) for url in given]
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
        self.format = format
        self.fields = None if fields is None else sorted(set(fields))
        self.decode = decode
        self._lookup = decoder_table(decode)  # checks the decoders (and refuses pickles) now
        self.etag = etag
        self.version_id = version_id
        self.generation = None if generation is None else int(generation)
        self.on_source_change = check_policy(on_source_change)
        self.max_bytes = max_bytes
        self.endpoint_url = endpoint_url
        self.access = Accessors(endpoint_url)
        self.progress: Optional[ProgressCallback] = None
        self._objects: Optional[list[ObjectRef]] = None
        self._prefixes: list[str] = []
        self._shard_versions: dict[str, str] = {}  # URL -> VersionId, read by build shards
        self._classes: Optional[dict[str, int]] = None
        self._python: Optional[PythonSource] = None
        self._spec: Optional[Spec] = None
        self._fieldset: Optional[_FieldSet] = None
        self._prefetch = _Prefetch([], self._read_whole)

    def __repr__(self) -> str:
        shown = ", ".join(self.urls[:3]) + (", ..." if len(self.urls) > 3 else "")
        return f"ObjectSource({redaction.redact_text(shown)}, format={self.format!r})"

    # -- what it is built from ---------------------------------------------------------------
    def objects(self) -> list[ObjectRef]:
        """The source objects, listed once (and checked against ``etag=`` / versions)."""
        if self._objects is None:
            listing = list_sources(self.urls, self.access, etag=self.etag, version_id=self.version_id,
                                   generation=self.generation)
            self._objects, self._prefixes = listing.objects, listing.prefixes
        return self._objects

    # -- parallel builds ------------------------------------------------------------------------
    def shard_recipes(self, files_per_shard: int = FILES_PER_BUILD_SHARD) -> list[dict[str, Any]]:
        """Plain-data recipes (``from_recipe``) of sources that each read some of this source's
        objects, in listing order: one per archive (a tar or zip shard), one per run of up to
        ``files_per_shard`` plain files. What a parallel build hands its workers: the recipes
        depend on the listing alone, and carry what must be the same in every shard (the
        listing's prefixes, the field set of plain files, imagefolder's class table)."""
        refs = self.objects()
        if self.format == "imagefolder":
            refs = [ref for ref in refs if "/" in self._relative_key(ref)]
        plain = [ref for ref in refs if self._format_of(ref).per_object]
        fields = self.fields
        if plain and fields is None:
            fields = self._file_fields(plain)
        common: dict[str, Any] = {
            "urls": self.urls,
            "format": self.format,
            "fields": fields,
            "decode": self.decode,
            "version_id": self.version_id,
            "generation": self.generation,
            "on_source_change": self.on_source_change,
            "max_bytes": self.max_bytes,
            "endpoint_url": self.endpoint_url,
            "prefixes": list(self._prefixes),
            "classes": None,
        }
        if self.format == "imagefolder":
            self._classes = common["classes"] = self._class_table()  # pinned, as in one process
        groups: list[list[ObjectRef]] = []
        run: list[ObjectRef] = []
        for ref in refs:
            if self._format_of(ref).per_object:
                run.append(ref)
                if len(run) >= files_per_shard:
                    groups.append(run)
                    run = []
                continue
            if run:
                groups.append(run)
                run = []
            groups.append([ref])
        if run:
            groups.append(run)
        return [dict(common, objects=group) for group in groups]

    @classmethod
    def from_recipe(cls, recipe: Mapping[str, Any]) -> ObjectSource:
        """The source of one ``shard_recipes`` entry (its objects as listed: no listing again)."""
        options = dict(recipe)
        objects, prefixes, classes = options.pop("objects"), options.pop("prefixes"), options.pop("classes")
        source = cls(**options)
        source._objects = list(objects)
        source._prefixes = list(prefixes)
        source._classes = classes
        return source

    # -- identity ------------------------------------------------------------------------------
    def pins(self) -> dict[str, Any]:
        """What the manifest records under ``extra["sources"]``."""
        objects = []
        served = self._read_versions()
        for ref in self.objects():
            pin = ref.pin()
            if self.version_id or self.generation is not None:
                pin["fixed"] = True  # asked for by version: a later write to the key is no change
            elif ref.url in served:
                pin["version_id"] = served[ref.url]
            objects.append(pin)
        pins: dict[str, Any] = {
            "pins_version": PINS_VERSION,
            "urls": self.urls,
            "prefixes": self._prefixes,
            "format": self.format,
            "on_source_change": self.on_source_change,
            "objects": objects,
        }
        if self.fields is not None:
            pins["fields"] = self.fields
        if self.endpoint_url:
            pins["endpoint_url"] = self.endpoint_url
        if self._classes is not None:
            pins["class_to_idx"] = self._classes
        return pins

    def auto_version(self) -> str:
        """A cache version derived from the pins (and how records are made): ``src-<hash>``, so a
        changed source gets a new cache instead of serving or replacing the old one."""
        identity = {
            "objects": [[ref.url, ref.size, ref.etag, ref.version_id, ref.generation, ref.mtime_ns]
                        for ref in self.objects()],
            "format": self.format,
            "fields": self.fields,
            "decode": self.decode if isinstance(self.decode, (bool, type(None))) else dict(self.decode),
        }
        text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
        return "src-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def _read_versions(self) -> dict[str, str]:
        """The S3 VersionIds that the build's reads were served (versioned buckets only), here or
        in the build shards of a parallel build (``merge_shard_extra``)."""
        seen: dict[str, str] = dict(self._shard_versions)
        for storage in self.access.all():
            seen.update(storage.versions)
        return seen

    @property
    def manifest_extra(self) -> dict[str, Any]:
        return {SOURCES_EXTRA_KEY: self.pins()}

    def merge_shard_extra(self, extras: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``manifest_extra`` of a parallel build of this source, given what each build
        shard's source recorded (``from_recipe`` sources, in worker processes): the pins of a
        build in one process, with the versions the shards' reads were served."""
        for extra in extras:
            shard_pins = extra.get(SOURCES_EXTRA_KEY)
            for pin in shard_pins.get("objects", []) if isinstance(shard_pins, Mapping) else []:
                if pin.get("version_id") and not pin.get("fixed"):
                    self._shard_versions[str(pin["url"])] = str(pin["version_id"])
        return self.manifest_extra

    # -- RecordSource ----------------------------------------------------------------------------
    def spec(self) -> Spec:
        if self._spec is not None:
            return self._spec
        if self._python is None:
            raise SourceError("the source has not been read yet")
        return self._python.spec()

    def encoded_batches(self) -> Iterator[list[bytes]]:
        if self._lookup is None:
            return self._encode_uniform()
        self._python = PythonSource(self.records())  # decoded values: shapes and types may vary
        return self._python.encoded_batches()

    def _encode_uniform(self) -> Iterator[list[bytes]]:
        """Records of raw fields all have the first one's structure (``_FieldSet`` sees to it) and
        scalar leaves: the spec is inferred once, not generalized record by record."""
        records = self.records()
        try:
            element = next(records, None)
            if element is None:
                raise SourceError(f"the sources at {', '.join(self.urls)} hold no records; nothing was cached")
            spec = infer_spec(element)
            codec = RecordCodec(_any_shape(spec))
            flat = flattener(spec)
            self._spec = spec
            batch: list[bytes] = []
            size = 0
            while element is not None:
                encoded = codec.encode(flat(element))
                element = None  # let the record go before the next is read (a large one is held once)
                batch.append(encoded)
                size += len(encoded)
                del encoded
                if len(batch) >= ENCODE_BATCH or size >= ENCODE_BATCH_BYTES:
                    yield batch
                    batch, size = [], 0
                element = next(records, None)
            if batch:
                yield batch
        finally:
            records.close()  # stops the reading threads at once when the writer gives up

    # -- records ---------------------------------------------------------------------------------
    def _limit(self) -> int:
        if self.max_bytes is not None:
            return int(self.max_bytes)
        bound = BuildLimits().for_unknown_length(Path.home()).max_bytes
        return bound if bound is not None else 1 << 62

    def _format_of(self, ref: ObjectRef) -> RecordFormat:
        return self._reading(ref)[0]

    def _reading(self, ref: ObjectRef) -> tuple[RecordFormat, Optional[ArchiveKind]]:
        """How ``ref`` is read (``formats``' tables): its record format, and the kind of archive
        its members come from (None: one record of the whole object)."""
        chosen = RECORD_FORMATS.get(self.format)
        if chosen is not None and chosen.per_object:
            return chosen, None
        archive = archive_of(ref.name)
        if chosen is None:  # auto: what the archive kind says, or one record of a plain file
            return (RECORD_FORMATS[archive.auto_format], archive) if archive else (RECORD_FORMATS["files"], None)
        if archive is None:
            raise SourceError(
                f"source object {ref.url} is not an archive ({', '.join(ARCHIVE_SUFFIXES[:3])}, ...) "
                f"but format={self.format!r} reads archives; use format='files' for plain files"
            )
        return chosen, archive

    def records(self) -> Generator[dict[str, Any], None, None]:
        """Every record, object by object, in listing order."""
        refs = self.objects()
        if self.format == "imagefolder":  # as torchvision: files outside a class directory are no samples
            refs = [ref for ref in refs if "/" in self._relative_key(ref)]
        budget = ByteBudget(self._limit())
        state = {"objects": 0, "bytes": 0, "records": 0}
        fields = _FieldSet(self.fields, explicit=self.fields is not None)
        if any(self._format_of(ref).per_object for ref in refs) and self.fields is None:
            fields = _FieldSet(self._file_fields(refs), explicit=False)
        self._fieldset = fields
        self._prefetch = _Prefetch(
            [ref for ref in refs if self._format_of(ref).per_object], self._read_whole
        )

        def on_bytes(count: int) -> None:
            state["bytes"] += count

        produced = _Background(self._records(refs, budget, fields, state, on_bytes))
        try:
            yield from produced
        finally:
            produced.close()
            self._prefetch.close()

    def _records(self, refs: list[ObjectRef], budget: ByteBudget, fields: _FieldSet, state: dict[str, int],
                 on_bytes: Callable[[int], None]) -> Iterator[dict[str, Any]]:
        opened: dict[int, ReadAhead] = {}  # the next streamed archive's GET starts while this one decodes
        try:
            for index, ref in enumerate(refs):
                self._open_next_stream(refs, index + 1, opened)
                where = f"source object {ref.url}"
                for sample in self._samples(ref, where, budget, on_bytes, opened.pop(index, None)):
                    sample = fields.apply(sample, where)
                    if self._lookup is not None:
                        sample = decode_sample(sample, self._lookup, where)
                    state["records"] += 1
                    yield sample
                    del sample  # not held while the next member is read
                    if self.progress is not None and state["records"] % 64 == 0:
                        self.progress(state["objects"], state["bytes"], state["records"])
                state["objects"] += 1
                if self.progress is not None:
                    self.progress(state["objects"], state["bytes"], state["records"])
        finally:
            for stream in opened.values():
                stream.close()

    def _open_next_stream(self, refs: list[ObjectRef], index: int, opened: dict[int, ReadAhead]) -> None:
        if index >= len(refs) or index in opened:
            return
        archive = self._reading(refs[index])[1]
        if archive is not None and not archive.ranged:
            opened[index] = ReadAhead(self.access(refs[index].location).open_stream(refs[index]))

    def _field_names(self, fmt: RecordFormat) -> Callable[[list[str]], None]:
        """Fixes the field set from an archive's directory of names (a zip's central directory),
        before its first record."""

        def fix(names: list[str]) -> None:
            fields = self._fieldset
            if fields is not None and fields.fields is None:
                fields.fields = sorted({field for name in names if (field := fmt.member_field(name))})

        return fix

    def _file_fields(self, refs: list[ObjectRef]) -> list[str]:
        names = {file_field(ref.name) for ref in refs}
        return sorted(names | ({"cls"} if self.format == "imagefolder" else set()))

    def _samples(self, ref: ObjectRef, where: str, budget: ByteBudget, on_bytes: Callable[[int], None],
                 opened: Optional[ReadAhead] = None) -> Iterator[dict[str, Any]]:
        """The records of one object: its archive's members (read as ``formats.ARCHIVES`` says)
        grouped by its record format, or the object as one record."""
        fmt, archive = self._reading(ref)
        if archive is None or fmt.group is None:
            yield self._file_record(ref, where, budget, on_bytes, fmt)
            return
        access = self.access(ref.location)
        if archive.ranged:
            handle = access.open_ranged(ref)
            try:
                yield from fmt.group(archive.members(handle, where, budget, self._field_names(fmt)), where)
            finally:
                handle.close()
            on_bytes(ref.size)
            return
        stream = _CountingStream(opened or ReadAhead(access.open_stream(ref)), on_bytes)
        try:
            yield from fmt.group(archive.members(stream, where, budget, None), where)  # type: ignore[arg-type]
            stream.drain()  # tar's end blocks: the object must be read to its last byte
        finally:
            stream.close()
        if stream.count != ref.size:
            raise SourceChangedError(
                f"{where} held {stream.count} bytes, not the {ref.size} listed; nothing was cached"
            )

    def _file_record(self, ref: ObjectRef, where: str, budget: ByteBudget, on_bytes: Callable[[int], None],
                     fmt: RecordFormat) -> dict[str, Any]:
        key = self._relative_key(ref)
        check_name(key, where)
        budget.take(ref.size, where, key)
        data = self._prefetch.take(ref)
        on_bytes(len(data))
        if len(data) != ref.size:
            raise SourceChangedError(f"{where} held {len(data)} bytes, not the {ref.size} listed; nothing was cached")
        record: dict[str, Any] = {"__key__": key, file_field(key): data}
        if fmt.name == "imagefolder":
            if self._classes is None:
                self._classes = self._class_table()
            label = key.split("/", 1)[0]
            record["cls"] = self._classes[label]
        return record

    def _read_whole(self, ref: ObjectRef) -> bytes:
        """The object's bytes, read up to one past its listed size (``ref.size``, budgeted):
        an object that grew since it was listed is found so (``_file_record``), never read whole."""
        stream = self.access(ref.location).open_stream(ref)
        try:
            pieces, left = [], ref.size + 1
            while left > 0:
                piece = bytes(stream.read(left))
                if not piece:
                    break
                pieces.append(piece)
                left -= len(piece)
            return b"".join(pieces)
        finally:
            stream.close()

    def _relative_key(self, ref: ObjectRef) -> str:
        """The object's name relative to the prefix it was listed under (its base name otherwise)."""
        for prefix in self._prefixes:
            root = parse_location(prefix)
            if root.scheme == ref.location.scheme and root.bucket == ref.location.bucket:
                base = root.key.rstrip("/") + "/" if root.key else ""
                if ref.name.startswith(base):
                    return ref.name[len(base):]
        return posixpath.basename(ref.name)

    def _class_table(self) -> dict[str, int]:
        """torchvision's ImageFolder table: the sorted directories under the root, numbered from 0."""
        keys = [self._relative_key(ref) for ref in self.objects()]
        classes = sorted({key.split("/", 1)[0] for key in keys if "/" in key})
        if not classes:
            raise SourceError(f"format='imagefolder' found no class directories under {', '.join(self.urls)}")
        return {name: index for index, name in enumerate(classes)}


def _any_shape(spec: Spec) -> Spec:
    """``spec`` with every shape unknown (as a Python source's codec takes its elements)."""
    if isinstance(spec, TensorSpec):
        return TensorSpec(spec.dtype, None)
    if isinstance(spec, dict):
        return {key: _any_shape(value) for key, value in spec.items()}
    return tuple(_any_shape(item) for item in spec)


def _record_bytes(record: Any) -> int:
    """The bytes a record holds (bytes, strings, arrays), as the read-ahead counts them."""
    if isinstance(record, dict):
        return sum(_record_bytes(value) for value in record.values())
    if isinstance(record, (bytes, bytearray, str)):
        return len(record)
    nbytes = getattr(record, "nbytes", None)  # numpy arrays, memoryviews
    return nbytes if isinstance(nbytes, int) else 0


class _Background:
    """Runs a generator on a thread ahead of its consumer, so that reading and decompressing the
    sources overlaps encoding and writing the cache (inflate, socket reads, LMDB writes and
    hashing release the GIL). It runs ahead while the records it handed out and the consumer has
    not let go of (the one the consumer holds until it asks for the next, and those queued) hold
    fewer than ``ahead_bytes`` (``READ_AHEAD_BYTES``), and at most ``depth`` records: a member of
    hundreds of MiB is not read while the one before it is still being written. Its exception
    is raised to the consumer; closing stops the thread and closes the generator there."""

    _DONE = object()

    def __init__(self, generator: Iterator[Any], depth: int = 256, ahead_bytes: int = READ_AHEAD_BYTES) -> None:
        self._generator = generator
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._ahead_bytes = ahead_bytes
        self._held = 0  # bytes of the records queued and the one the consumer holds
        self._room = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="yogacache-source")
        self._thread.start()

    def _run(self) -> None:
        try:
            while self._wait_for_room():
                item = next(self._generator, self._DONE)
                if item is self._DONE:
                    self._put((True, item, 0))
                    return
                size = _record_bytes(item)
                with self._room:
                    self._held += size
                if not self._put((True, item, size)):
                    return
                item = None  # not held while the next is read
        except BaseException as error:  # handed to the consumer
            self._put((False, error, 0))
        finally:
            self._generator.close()  # type: ignore[attr-defined]

    def _wait_for_room(self) -> bool:
        with self._room:
            while self._held >= self._ahead_bytes and not self._stop.is_set():
                self._room.wait(0.1)
        return not self._stop.is_set()

    def _release(self, size: int) -> None:
        if size:
            with self._room:
                self._held -= size
                self._room.notify_all()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[Any]:
        taken = 0
        while True:
            self._release(taken)  # the consumer asks for the next: it is done with the last one
            ok, item, taken = self._queue.get()
            if not ok:
                raise item
            if item is self._DONE:
                return
            yield item
            item = None  # not held while the next is awaited

    def close(self) -> None:
        self._stop.set()
        with self._room:
            self._room.notify_all()
        self._thread.join(timeout=60)  # a read stuck on the network ends with its own timeout


class _Prefetch:
    """Reads whole small objects (files, ImageFolder) ahead of the build on a few threads, in
    order, at most ``window`` objects or ``window_bytes`` ahead: one GET per object would
    otherwise wait on every round trip in turn. An object larger than what is left of the
    window is not read ahead but in its turn, so it is held once."""

    def __init__(self, refs: list[ObjectRef], read: Callable[[ObjectRef], bytes], window: int = 32,
                 window_bytes: int = 256 << 20, threads: int = 16) -> None:
        self._refs = refs
        self._read = read
        self._window = window
        self._window_bytes = window_bytes
        self._pool: Optional[ThreadPoolExecutor] = ThreadPoolExecutor(threads) if refs else None
        self._pending: deque[tuple[ObjectRef, Future[bytes]]] = deque()
        self._next = 0

    def _fill(self) -> None:
        ahead = sum(ref.size for ref, _ in self._pending)
        while (self._pool is not None and self._next < len(self._refs) and len(self._pending) < self._window
               and ahead + self._refs[self._next].size <= self._window_bytes):  # a larger one is read in turn
            ref = self._refs[self._next]
            self._pending.append((ref, self._pool.submit(self._read, ref)))
            ahead += ref.size
            self._next += 1

    def take(self, ref: ObjectRef) -> bytes:
        """The bytes of ``ref``, the next object in order."""
        self._fill()
        if not self._pending or self._pending[0][0] != ref:
            return self._read(ref)
        _, future = self._pending.popleft()
        self._fill()
        return future.result()

    def close(self) -> None:
        if self._pool is not None:
            for _, future in self._pending:
                future.cancel()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class _FieldSet:
    """Keeps every record's structure the same: one set of fields, fixed by ``fields=`` or by the
    first sample (a listing for files). An absent field is empty bytes; a field outside the set is
    dropped when ``fields=`` chose the set, and an error otherwise."""

    def __init__(self, fields: Optional[list[str]], *, explicit: bool) -> None:
        self.fields = fields
        self.explicit = explicit

    def apply(self, sample: dict[str, Any], where: str) -> dict[str, Any]:
        if self.fields is None:
            self.fields = sorted(key for key in sample if key != "__key__")
        wanted = self.fields
        extra = [key for key in sample if key != "__key__" and key not in wanted]
        if extra and not self.explicit:
            raise SourceError(
                f"{where}: sample {sample['__key__']!r} has fields {extra} that earlier samples lack (they have "
                f"{wanted}); every record of a cache has the same fields. Pass fields=[...] to choose them "
                "(absent ones become empty bytes)"
            )
        record = {"__key__": sample["__key__"]}
        for key in wanted:
            record[key] = sample.get(key, b"")
        return record


def as_record_source(source: ObjectSource) -> ObjectSource:
    """format.sources' registry hook: an ObjectSource already is a record source."""
    return source


# ``from_url(urls, format=..., ...)`` makes an ObjectSource: the class's arguments are its arguments.
from_url = ObjectSource
