"""Stores: where caches live (a local directory, an object store with node-local copies).

``open_store`` is the one factory; every store meets the ``Store`` protocol (a store that
publishes to an object store answers ``store.remote``, a ``RemoteStore``) and lists
``CacheEntry`` values.
"""

from yogacache.store.base import CacheEntry, RemoteStore, Store
from yogacache.store.factory import open_cache, open_store

__all__ = ["CacheEntry", "RemoteStore", "Store", "open_cache", "open_store"]
