"""Stores: where caches live (a local directory, an object store with node-local copies).

``open_store`` is the one factory; every store meets the ``Store`` protocol and lists
``CacheEntry`` values.
"""

from yogacache.store.base import CacheEntry, Store
from yogacache.store.factory import open_store

__all__ = ["CacheEntry", "Store", "open_store"]
