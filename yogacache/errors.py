"""Exception hierarchy: every failure yogacache raises on purpose derives from one class."""

from __future__ import annotations


class YogaCacheError(Exception):
    """Base class of the errors yogacache raises on purpose."""


class InvalidNameError(YogaCacheError, ValueError):
    """A dataset id or version is not a safe single path component."""


class UnsupportedDatasetError(YogaCacheError, ValueError):
    """The dataset cannot be cached (infinite, ragged, sparse, or of an unsupported type)."""


class CacheLimitExceededError(YogaCacheError):
    """A build went past its configured record or byte limit and was discarded."""


class CacheNotFoundError(YogaCacheError, FileNotFoundError):
    """No sealed cache exists for the requested dataset id and version."""


class CorruptCacheError(YogaCacheError):
    """A cache on disk does not match its manifest (truncated, altered or unreadable)."""


class CacheReplacedError(YogaCacheError):
    """A reader reopened in another process finds that its build was replaced or removed."""


class IncompatibleCacheError(YogaCacheError):
    """A cache was written by a newer format version than this yogacache can read."""


class BuildError(YogaCacheError):
    """Building a cache failed; nothing was published."""


class ConfigError(YogaCacheError, ValueError):
    """A storage configuration is invalid."""


class NoSpaceError(YogaCacheError):
    """This node's disk has no room for a download (a local fault, never retried as a remote one)."""


class ResumeStateError(YogaCacheError, ValueError):
    """A resume state does not fit the reader resuming it (another order, or numbers out of range):
    resuming it would read other records than the rest of the epoch it was saved in."""
