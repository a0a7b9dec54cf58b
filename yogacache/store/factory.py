"""``open_store``: the one place a storage description becomes a Store.

DataLayer, the CLI, the YogaDL facade and the Ray builder all come here, with a ``data_layer`` config
(dict or parsed), a storage URL (``s3://``, ``gs://``, ``file://``), a config file, a directory,
or nothing (the local default), read by the one parser of such targets (``store.target``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from yogacache.config import SharedFSConfig
from yogacache.errors import ConfigError
from yogacache.format.integrity import Verify
from yogacache.format.writer import BuildLimits
from yogacache.read.reader import CacheReader
from yogacache.sizes import parse_part_bytes
from yogacache.store.base import Store
from yogacache.store.local import CacheStore, default_cache_root
from yogacache.store.remote import RemoteCacheStore
from yogacache.store.target import StoreTarget as StoreTarget  # re-exported: what open_store takes
from yogacache.store.target import TargetLocation as TargetLocation  # re-exported
from yogacache.store.target import parse_target


def open_store(
    target: StoreTarget = None,
    *,
    local_cache: Union[str, "os.PathLike[str]", None] = None,
    endpoint_url: Optional[str] = None,
    verify: Verify = "auto",
    limits: BuildLimits = BuildLimits(),
    show_progress: bool = True,
    must_exist: bool = False,
    part_bytes: Union[int, str, None] = None,
) -> Store:
    """The store ``target`` describes.

    Args:
        target: a ``data_layer`` mapping or parsed config; a URL (``s3://bucket/prefix``,
            ``gs://bucket/prefix``, ``file:///path``); a JSON/YAML config file; a cache
            directory; or None for the local default.
        local_cache: root of node-local copies of remote caches (URL targets; a config names
            its own, else the local default).
        endpoint_url: the S3 endpoint of a URL target (default: ``$AWS_ENDPOINT_URL`` or AWS).
        must_exist: a directory or config file named by ``target`` must exist (``parse_target``).
        part_bytes: the size past which builds roll to a new part (an int or ``"64Mi"``); default:
            the config's ``part_bytes``, else the store's default.
    """
    options: dict[str, Any] = dict(verify=verify, limits=limits, show_progress=show_progress)
    location = parse_target(target, endpoint_url=endpoint_url, must_exist=must_exist)
    config = location.config
    if part_bytes is not None:
        options["part_size_bytes"] = parse_part_bytes(part_bytes)
    elif config is not None and config.part_bytes is not None:
        options["part_size_bytes"] = config.part_bytes
    if location.url is None or isinstance(config, SharedFSConfig):
        return CacheStore(location.directory or default_cache_root(), **options)
    if config is None:  # a URL
        local_root = Path(local_cache).expanduser() if local_cache else default_cache_root()
        return RemoteCacheStore(location.open_backend(), local_root, **options)
    backend = location.open_backend()
    if config.mirrors:
        if config.streaming or config.local_cache_limit is not None:
            raise ConfigError(
                "data_layer.mirrors cannot be combined with streaming or local_cache_limit yet: "
                "use the mirrors for whole copies, or stream from one storage"
            )
        from yogacache.store.mirrors import MirroredCacheStore

        mirrors = [parse_target(mirror).open_backend() for mirror in config.mirrors]
        return MirroredCacheStore(backend, mirrors, config.local_cache_path or default_cache_root(), **options)
    return RemoteCacheStore(
        backend,
        config.local_cache_path or default_cache_root(),
        **options,
        streaming=config.streaming,
        local_cache_limit=config.local_cache_limit,
        objects_factory=location.open_backend,
    )


def open_cache(dataset_id: str, dataset_version: str, storage: Any = None) -> CacheReader:
    """The reader of the cache ``(dataset_id, dataset_version)`` on ``storage``, synced or
    streamed as the storage says: what an adapter that names a cache by id (``yogacache.grain``,
    ``yogacache.ray``) opens.

    ``storage`` is a YogaDL storage (``yogacache.storage.S3Storage`` and the like, or a
    ``DataLayer``: anything holding a ``store``), a ``Store``, or a target ``open_store`` takes
    (a ``data_layer`` mapping, a URL, a config file, a directory, or None for the local default).
    A YogaDL ``cache.mdb`` counts as a cache (converted on first use, as ``Storage.fetch`` does).
    """
    from yogacache.names import validate_name
    from yogacache.store import yogadl as yogadl_caches

    validate_name(dataset_id, "dataset_id")
    validate_name(dataset_version, "dataset_version")
    held: Any = storage if _is_store(storage) else getattr(storage, "store", None)
    store: Store = held if _is_store(held) else open_store(storage, show_progress=False)
    return yogadl_caches.fetch(store, dataset_id, dataset_version)


def _is_store(value: Any) -> bool:
    """Whether ``value`` meets the ``Store`` protocol (what it opens and where it publishes)."""
    return all(hasattr(value, name) for name in ("open", "remote", "location"))
