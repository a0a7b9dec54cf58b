"""yogacache: cache a dataset once into LMDB, read it back sharded, shuffled and resumable.

``import yogacache`` stays light: the user-facing classes (``DataLayer``, ``DataRef``, ...) load
on first use (PEP 562), so importing a low layer such as ``yogacache.backends.base`` loads
neither LMDB nor numpy, and TensorFlow, PyTorch, boto3 and google-cloud-storage are imported
only by the modules that need them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from yogacache.errors import (
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
from yogacache.version import __version__

if TYPE_CHECKING:
    from yogacache.datalayer import DataLayer
    from yogacache.dataref import CacheDataRef, DataRef, Storage, Stream
    from yogacache.mixture import Component, Mixture

# Public names that live in heavier modules, imported when first asked for.
_LAZY = {
    "DataLayer": "yogacache.datalayer",
    "CacheDataRef": "yogacache.dataref",
    "DataRef": "yogacache.dataref",
    "Storage": "yogacache.dataref",
    "Stream": "yogacache.dataref",
    "Component": "yogacache.mixture",
    "Mixture": "yogacache.mixture",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'yogacache' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BuildError",
    "CacheDataRef",
    "CacheLimitExceededError",
    "CacheNotFoundError",
    "Component",
    "ConfigError",
    "CorruptCacheError",
    "DataLayer",
    "DataRef",
    "IncompatibleCacheError",
    "InvalidNameError",
    "Mixture",
    "Storage",
    "Stream",
    "UnsupportedDatasetError",
    "YogaCacheError",
    "__version__",
]
