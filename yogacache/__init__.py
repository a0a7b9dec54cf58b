"""yogacache: cache a dataset once into LMDB, read it back sharded, shuffled and resumable.

``import yogacache`` stays light: TensorFlow, boto3 and google-cloud-storage are imported
only by the modules that need them.
"""

from __future__ import annotations

from yogacache.version import __version__  # noqa: E402

from yogacache.datalayer import DataLayer  # noqa: E402
from yogacache.dataref import CacheDataRef, DataRef, Storage, Stream  # noqa: E402
from yogacache.errors import (  # noqa: E402
    BuildError,
    CacheLimitExceededError,
    CacheNotFoundError,
    ConfigError,
    CorruptCacheError,
    IncompatibleCacheError,
    InvalidNameError,
    UnsupportedDatasetError,
    YogaCacheError,
)

__all__ = [
    "BuildError",
    "CacheDataRef",
    "CacheLimitExceededError",
    "CacheNotFoundError",
    "ConfigError",
    "CorruptCacheError",
    "DataLayer",
    "DataRef",
    "IncompatibleCacheError",
    "InvalidNameError",
    "Storage",
    "Stream",
    "UnsupportedDatasetError",
    "YogaCacheError",
    "__version__",
]
