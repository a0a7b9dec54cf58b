"""YogaDL-compatible storages: LFS over a CacheStore; S3 and GCS over a RemoteCacheStore."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path, PurePath
from typing import Any, Callable, Optional

from yogacache.config import GCSConfig, S3Config, StorageConfig
from yogacache.dataref import CacheDataRef, Storage, cached_dataref
from yogacache.names import validate_name, validate_version
from yogacache.store import open_store
from yogacache.store import yogadl as yogadl_caches

__all__ = [
    "GCSConfigurations",
    "GCSStorage",
    "LFSConfigurations",
    "LFSStorage",
    "S3Configurations",
    "S3Storage",
]


class _StoreStorage(Storage):
    """submit/fetch/cacheable over a store (a CacheStore or a RemoteCacheStore)."""

    store: Any

    def submit(
        self, data: Any, dataset_id: str, dataset_version: str, workers: Optional[int] = None
    ) -> None:
        """Caches ``data``; an existing cache "will be overwritten", as YogaDL documents: a local
        one is replaced atomically, a published one by the store's build, which replaces it
        conditionally on the manifest it saw (of two concurrent submits exactly one wins).
        A YogaDL cache.mdb in the cache's directory is replaced too, as YogaDL's submit does.

        With ``workers``, ``data`` (a map-style dataset, a sequence, or a list of build shards) is
        built by that many processes (``yogacache.parallel``); the cache is the same for any number."""
        if workers is not None:
            from yogacache.parallel import sharded

            data = sharded(data, workers)
        self.store.build(dataset_id, dataset_version, data)

    def fetch(self, dataset_id: str, dataset_version: str) -> CacheDataRef:
        """A DataRef to the cache (a remote one is first synced to the local copy; a YogaDL
        cache.mdb is converted on first use and kept)."""
        return CacheDataRef(yogadl_caches.fetch(self.store, dataset_id, dataset_version))

    def cacheable(self, dataset_id: str, dataset_version: str) -> Callable[..., Any]:
        """Decorator: the function runs only when no process has built the cache; returns a DataRef."""
        validate_name(dataset_id, "dataset_id")  # before any call
        validate_version(dataset_version)

        def wrap(make_dataset: Callable[..., Any]) -> Callable[..., CacheDataRef]:
            @functools.wraps(make_dataset)
            def create_dataref(*args: Any, **kwargs: Any) -> CacheDataRef:
                return cached_dataref(self.store, dataset_id, dataset_version, make_dataset, args, kwargs)

            return create_dataref

        return wrap


class LFSConfigurations:
    """Configuration of LFSStorage: caches live under ``storage_dir_path/<id>/<version>/``."""

    def __init__(self, storage_dir_path: str) -> None:
        self.storage_dir_path = Path(storage_dir_path)
        self.cache_format = "LMDB"


class LFSStorage(_StoreStorage):
    """Caches on a local (or shared) filesystem, as YogaDL's LFSStorage, safely built and read."""

    def __init__(self, configurations: LFSConfigurations, tensorflow_config: Any = None) -> None:
        # ``tensorflow_config`` (a TF1 ConfigProto) is accepted for compatibility and unused.
        self._configurations = configurations
        root = configurations.storage_dir_path
        if not root.is_dir():
            raise FileNotFoundError(f"LFSStorage directory {root} does not exist")
        if configurations.cache_format != "LMDB":
            raise ValueError(f"unsupported cache_format {configurations.cache_format!r}; use 'LMDB'")
        self.store = open_store(root)


def _warn_coordinator(url: Any, cert_file: Any, cert_name: Any) -> None:
    if url is not None or cert_file is not None or cert_name is not None:
        warnings.warn(
            "yogacache needs no coordinator server: url and coordinator_cert_* are ignored "
            "(builds are coordinated through the bucket itself)",
            UserWarning,
            stacklevel=3,
        )


def _object_prefix(path: "str | PurePath") -> str:
    """The object-key prefix a ``bucket_directory_path`` stands for ("" for the bucket's root)."""
    text = PurePath(path).as_posix().strip("/")
    return "" if text == "." else text


class BaseCloudConfigurations:
    """What S3 and GCS configurations share (YogaDL's constructor arguments)."""

    def __init__(
        self,
        bucket: str,
        bucket_directory_path: str,
        url: Optional[str] = None,
        local_cache_dir: str = "/tmp/",
        skip_verify: bool = False,
        coordinator_cert_file: Optional[str] = None,
        coordinator_cert_name: Optional[str] = None,
    ) -> None:
        _warn_coordinator(url, coordinator_cert_file, coordinator_cert_name)
        self.bucket = bucket
        # A pathlib.Path, as in YogaDL (its programs call ``joinpath`` on it).
        self.bucket_directory_path = Path(bucket_directory_path)
        self.url = url
        self.local_cache_dir = Path(local_cache_dir)
        self.skip_verify = skip_verify
        self.cache_format = "LMDB"

    def _common(self) -> dict[str, Any]:
        local = str(self.local_cache_dir)
        return dict(
            bucket=self.bucket,
            bucket_directory_path=_object_prefix(self.bucket_directory_path),
            local_cache_host_path=local,
            local_cache_container_path=local,
        )

    def to_config(self) -> StorageConfig:
        """The ``data_layer`` config these settings amount to."""
        raise NotImplementedError


class S3Configurations(BaseCloudConfigurations):
    """YogaDL's S3Configurations; credentials default to the standard AWS chain."""

    def __init__(
        self,
        bucket: str,
        bucket_directory_path: str,
        url: Optional[str] = None,
        access_key: Optional[str] = None,
        secret_key: Optional[str] = None,
        endpoint_url: Optional[str] = None,
        local_cache_dir: str = "/tmp/",
        skip_verify: bool = False,
        coordinator_cert_file: Optional[str] = None,
        coordinator_cert_name: Optional[str] = None,
    ) -> None:
        super().__init__(
            bucket,
            bucket_directory_path,
            url,
            local_cache_dir,
            skip_verify,
            coordinator_cert_file,
            coordinator_cert_name,
        )
        self.access_key = access_key
        self.secret_key = secret_key
        self.endpoint_url = endpoint_url

    def to_config(self) -> StorageConfig:
        return S3Config(
            **self._common(), access_key=self.access_key, secret_key=self.secret_key, endpoint_url=self.endpoint_url
        )

    def __repr__(self) -> str:
        return (
            f"S3Configurations(bucket={self.bucket!r}, "
            f"bucket_directory_path={str(self.bucket_directory_path)!r})"
        )


class GCSConfigurations(BaseCloudConfigurations):
    """YogaDL's GCSConfigurations; credentials come from the standard Google chain."""

    def to_config(self) -> StorageConfig:
        return GCSConfig(**self._common())


class BaseCloudStorage(_StoreStorage):
    """A YogaDL-compatible storage over a remote store (objects published, copies per node)."""

    def __init__(self, configurations: BaseCloudConfigurations, tensorflow_config: Any = None) -> None:
        self._configurations = configurations
        if configurations.cache_format != "LMDB":
            raise ValueError(f"unsupported cache_format {configurations.cache_format!r}; use 'LMDB'")
        self.store = open_store(configurations.to_config())


class S3Storage(BaseCloudStorage):
    """Caches published to S3 (or an S3-compatible server), synced to a local copy per node."""


class GCSStorage(BaseCloudStorage):
    """Caches published to Google Cloud Storage, synced to a local copy per node."""
