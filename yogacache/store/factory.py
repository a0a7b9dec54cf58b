"""``open_store``: the one place a storage description becomes a Store.

DataLayer, the CLI and the YogaDL facade all come here, with a ``data_layer`` config (dict or
parsed), a storage URL (``s3://``, ``gs://``, ``file://``), a config file, a directory, or
nothing (the local default).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from yogacache.backends.registry import open_backend
from yogacache.config import SharedFSConfig, StorageConfig, load_config_file, parse_config
from yogacache.errors import ConfigError
from yogacache.format.integrity import Verify
from yogacache.format.writer import BuildLimits
from yogacache.store.base import Store
from yogacache.store.local import CacheStore, default_cache_root
from yogacache.store.remote import RemoteCacheStore

StoreTarget = Union[StorageConfig, Mapping[str, Any], str, "os.PathLike[str]", None]


def open_store(
    target: StoreTarget = None,
    *,
    local_cache: Union[str, "os.PathLike[str]", None] = None,
    endpoint_url: Optional[str] = None,
    verify: Verify = "auto",
    limits: BuildLimits = BuildLimits(),
    show_progress: bool = True,
) -> Store:
    """The store ``target`` describes.

    Args:
        target: a ``data_layer`` mapping or parsed config; a URL (``s3://bucket/prefix``,
            ``gs://bucket/prefix``, ``file:///path``); a JSON/YAML config file; a cache
            directory; or None for the local default.
        local_cache: root of node-local copies of remote caches (URL targets; a config names
            its own, else the local default).
        endpoint_url: the S3 endpoint of a URL target (default: ``$AWS_ENDPOINT_URL`` or AWS).
    """
    options: dict[str, Any] = dict(verify=verify, limits=limits, show_progress=show_progress)
    if isinstance(target, (str, os.PathLike)):
        text = os.fspath(target)
        if "://" in text:
            local_root = Path(local_cache).expanduser() if local_cache else default_cache_root()
            return RemoteCacheStore(open_backend(text, endpoint_url=endpoint_url), local_root, **options)
        path = Path(text).expanduser()
        if path.is_file():
            return _from_config(load_config_file(path), options)
        return CacheStore(path, **options)
    return _from_config(parse_config(target), options)


def _from_config(config: Optional[StorageConfig], options: dict[str, Any]) -> Store:
    if config is None or isinstance(config, SharedFSConfig):
        root = (config.storage_path if config is not None else None) or default_cache_root()
        return CacheStore(root, **options)
    backend = open_backend(config.url, **config.backend_options())
    if config.mirrors:
        if config.streaming or config.local_cache_limit is not None:
            raise ConfigError(
                "data_layer.mirrors cannot be combined with streaming or local_cache_limit yet: "
                "use the mirrors for whole copies, or stream from one storage"
            )
        from yogacache.store.mirrors import MirroredCacheStore

        mirrors = [open_backend(mirror.url, **mirror.backend_options()) for mirror in config.mirrors]
        return MirroredCacheStore(backend, mirrors, config.local_cache_path or default_cache_root(), **options)
    return RemoteCacheStore(
        backend,
        config.local_cache_path or default_cache_root(),
        **options,
        streaming=config.streaming,
        local_cache_limit=config.local_cache_limit,
        objects_factory=functools.partial(open_backend, config.url, **config.backend_options()),
    )
