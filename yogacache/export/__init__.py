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

from yogacache.export.destinations import Destination, DirectoryDestination, ObjectDestination, open_destination
from yogacache.export.errors import DestinationNotEmptyError, ExportError
from yogacache.export.exporter import (
    DEFAULT_SHARD_SIZE,
    FORMATS,
    INDEX_NAME,
    ExportResult,
    ShardInfo,
    check_format,
    export_cache,
    export_reader,
    parse_size,
)
from yogacache.export.samples import SampleEncoder, SampleField, sample_fields
from yogacache.export.tar import ShardTarWriter, UstarHeaders

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "FORMATS",
    "INDEX_NAME",
    "Destination",
    "DestinationNotEmptyError",
    "DirectoryDestination",
    "ExportError",
    "ExportResult",
    "ObjectDestination",
    "SampleEncoder",
    "SampleField",
    "ShardInfo",
    "ShardTarWriter",
    "UstarHeaders",
    "check_format",
    "export_cache",
    "export_reader",
    "open_destination",
    "parse_size",
    "sample_fields",
]
