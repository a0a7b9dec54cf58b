"""Remote storage: the object-store contract, its S3/GCS/directory backends, and sync.

Backends import boto3 or google-cloud-storage only when they are constructed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union
from urllib.parse import urlparse

from yogacache.config import GCSConfig, S3Config
from yogacache.errors import ConfigError
from yogacache.remote.objects import ObjectInfo, ObjectStore, RemoteError, RetryPolicy
from yogacache.remote.sync import RemoteCacheStore

__all__ = [
    "ObjectInfo",
    "ObjectStore",
    "RemoteCacheStore",
    "RemoteError",
    "RetryPolicy",
    "object_store_for",
    "object_store_from_url",
]


def object_store_for(config: Union[S3Config, GCSConfig], retry: RetryPolicy = RetryPolicy()) -> ObjectStore:
    """The object store a ``data_layer`` config names."""
    if isinstance(config, S3Config):
        from yogacache.remote.s3 import S3ObjectStore

        return S3ObjectStore(
            config.bucket,
            config.bucket_directory_path,
            endpoint_url=config.endpoint_url,
            access_key=config.access_key,
            secret_key=config.secret_key,
            retry=retry,
        )
    from yogacache.remote.gcs import GCSObjectStore

    return GCSObjectStore(config.bucket, config.bucket_directory_path, retry=retry)


def object_store_from_url(url: str, endpoint_url: Optional[str] = None) -> ObjectStore:
    """``s3://bucket/prefix``, ``gs://bucket/prefix`` or ``file:///path`` as an object store."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        from yogacache.remote.s3 import S3ObjectStore

        return S3ObjectStore(parsed.netloc, parsed.path, endpoint_url=endpoint_url)
    if parsed.scheme in ("gs", "gcs"):
        from yogacache.remote.gcs import GCSObjectStore

        return GCSObjectStore(parsed.netloc, parsed.path)
    if parsed.scheme == "file":
        from yogacache.remote.files import FileObjectStore

        return FileObjectStore(Path(parsed.path))
    raise ConfigError(f"unsupported storage URL {url!r}: use s3://, gs:// or a directory")
