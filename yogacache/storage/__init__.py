"""YogaDL-compatible storages: ``LFSConfigurations``/``LFSStorage`` over a CacheStore."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

from yogacache.dataref import CacheDataRef, Storage
from yogacache.store import CacheStore

__all__ = ["LFSConfigurations", "LFSStorage"]


class LFSConfigurations:
    """Configuration of LFSStorage: caches live under ``storage_dir_path/<id>/<version>/``."""

    def __init__(self, storage_dir_path: str) -> None:
        self.storage_dir_path = Path(storage_dir_path)
        self.cache_format = "LMDB"


class LFSStorage(Storage):
    """Caches on a local (or shared) filesystem, as YogaDL's LFSStorage, safely built and read."""

    def __init__(self, configurations: LFSConfigurations, tensorflow_config: Any = None) -> None:
        # ``tensorflow_config`` (a TF1 ConfigProto) is accepted for compatibility and unused.
        self._configurations = configurations
        root = configurations.storage_dir_path
        if not root.is_dir():
            raise FileNotFoundError(f"LFSStorage directory {root} does not exist")
        if configurations.cache_format != "LMDB":
            raise ValueError(f"unsupported cache_format {configurations.cache_format!r}; use 'LMDB'")
        self.store = CacheStore(root)

    def submit(self, data: Any, dataset_id: str, dataset_version: str) -> None:
        """Caches ``data``, replacing an existing cache of the same id and version atomically."""
        self.store.build(dataset_id, dataset_version, data)

    def fetch(self, dataset_id: str, dataset_version: str) -> CacheDataRef:
        return CacheDataRef(self.store.open(dataset_id, dataset_version))

    def cacheable(self, dataset_id: str, dataset_version: str) -> Callable[..., Any]:
        """Decorator: calls the function only when the cache is missing; returns a DataRef."""
        self.store.cache_dir(dataset_id, dataset_version)  # validate before any call

        def wrap(make_dataset: Callable[..., Any]) -> Callable[..., CacheDataRef]:
            @functools.wraps(make_dataset)
            def create_dataref(*args: Any, **kwargs: Any) -> CacheDataRef:
                reader = self.store.get_or_build(
                    dataset_id, dataset_version, lambda: make_dataset(*args, **kwargs)
                )
                return CacheDataRef(reader)

            return create_dataref

        return wrap
