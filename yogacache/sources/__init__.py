"""Caches built straight from objects: WebDataset shards, archives and files in S3, GCS or on disk.

``from_url`` makes a source that the decorators, ``submit``/``get_or_build`` and ``yogacache
import`` accept. Its objects are pinned (ETag, VersionId or generation, size) in the manifest,
read conditionally while the cache builds, and checked cheaply on every cache hit. See
docs/sources.md. Nothing here imports boto3 or google-cloud-storage until an URL needs it.
"""

from __future__ import annotations

from yogacache.sources.errors import CorruptSourceError, SourceChangedError, SourceError
from yogacache.sources.source import ON_SOURCE_CHANGE, ObjectSource, from_url

__all__ = [
    "ON_SOURCE_CHANGE",
    "CorruptSourceError",
    "ObjectSource",
    "SourceChangedError",
    "SourceError",
    "from_url",
]
