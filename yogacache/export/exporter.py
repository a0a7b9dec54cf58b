"""The export: a cache's records, in index order, as WebDataset tar shards and, last, a ``wids``
shard index; a failure leaves no index and removes the shards written (see docs/export.md)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

import numpy as np

from yogacache import progress, sizes
from yogacache.errors import ConfigError
from yogacache.export.destinations import Destination, open_destination
from yogacache.export.errors import DestinationNotEmptyError, ExportError
from yogacache.export.samples import SampleEncoder, SampleField
from yogacache.export.tar import ShardTarWriter, UstarHeaders, closed_tar_bytes, sample_tar_bytes
from yogacache.progress import format_bytes
from yogacache.read.reader import CacheReader

FORMATS = ("webdataset",)
INDEX_NAME = "shardindex.json"  # the name `widsindex create` gives an index
DEFAULT_SHARD_SIZE = 512 << 20
WIDS_KIND = "wids-shard-index-v1"


def parse_size(text: Union[str, int]) -> int:
    """A positive shard size: bytes, or a number with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti
    (powers of 1024), as ``yogacache.sizes.parse_size`` reads every size."""
    value = sizes.parse_size(text, "the shard size")
    if value <= 0:
        raise ConfigError(f"the shard size must be positive, got {text!r}")
    return value


def check_format(format: str) -> None:
    """ConfigError unless ``format`` is one this module writes."""
    if format not in FORMATS:
        raise ConfigError(f"unknown export format {format!r}: the formats are {', '.join(FORMATS)}")


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
