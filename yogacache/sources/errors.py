"""The errors an object source raises: a source that changed, or a source that is not what it claims."""

from __future__ import annotations

from yogacache.errors import YogaCacheError


class SourceError(YogaCacheError):
    """A source object cannot be listed or read (absent, refused, or not a readable format)."""


class SourceChangedError(SourceError):
    """A source object is not the one pinned: overwritten during a build, changed since the cache
    was built, or not matching the ``etag=`` / ``version_id=`` / ``generation=`` asked for."""


class CorruptSourceError(SourceError):
    """An archive or shard is truncated, malformed, too large to expand, or names a member unsafely."""
