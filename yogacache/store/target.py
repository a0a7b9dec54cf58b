"""``parse_target``: the one reading of a store target (a config, a URL, a file, a directory).

``open_store`` builds the store a target names from it, ``store.copy`` the object store a copy
reads or writes; neither reads a target another way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from yogacache import redaction
from yogacache.backends.base import ObjectStore
from yogacache.backends.registry import open_backend
from yogacache.config import SharedFSConfig, StorageConfig, load_config_file, parse_config
from yogacache.errors import ConfigError

StoreTarget = Union[StorageConfig, Mapping[str, Any], str, "os.PathLike[str]", None]


@dataclass(frozen=True)
class TargetLocation:
    """Where a store target says caches live, before anything is opened.

    Either a directory of caches (``directory``: a local or shared_fs directory) or an object
    store (``url``, opened with ``backend_options``); neither for the local default, or for a
    shared_fs config that names no directory. ``config`` is the parsed ``data_layer`` config the
    target was (None for a URL, a directory, or nothing).
    """

    directory: Optional[Path] = None
    url: Optional[str] = None
    backend_options: Mapping[str, Any] = field(default_factory=dict, repr=False)  # credentials
    config: Optional[StorageConfig] = None

    def open_backend(self) -> ObjectStore:
        """A client of the object store at ``url`` (ValueError for a directory target)."""
        if self.url is None:
            raise ValueError(f"{self} names no object store")
        return open_backend(self.url, **self.backend_options)


def parse_target(
    target: StoreTarget = None, *, endpoint_url: Optional[str] = None, must_exist: bool = False
) -> TargetLocation:
    """What ``target`` names: a ``data_layer`` mapping or parsed config; a URL (``s3://bucket/prefix``,
    ``gs://bucket/prefix``, ``file:///path``); a JSON/YAML config file; a cache directory; or None
    for the local default. ``endpoint_url`` is a URL target's S3 endpoint.

    ``must_exist``: a directory or config file named by ``target`` must exist (ConfigError, where
    a build would otherwise create the directory: a typo is an error, not an empty store).
    """
    if isinstance(target, (str, os.PathLike)):
        text = os.fspath(target)
        if redaction.redact_text(text) != text:
            raise ConfigError(
                f"storage {redaction.describe(text)} carries a secret (a key, a signature or a password): "
                "credentials go in a data_layer config (access_key/secret_key, connection_string, "
                "account_url + credential) or the standard environment variables, not in a storage URL or path"
            )
        if "://" in text:
            return TargetLocation(url=text, backend_options={"endpoint_url": endpoint_url})
        path = Path(text).expanduser()
        if must_exist and not path.exists():
            raise ConfigError(f"storage {text} does not exist (not a directory, a config file or a URL)")
        if not path.is_file():
            return TargetLocation(directory=path)
        config = load_config_file(path)
    else:
        config = parse_config(target)
    if config is None:
        return TargetLocation()
    if isinstance(config, SharedFSConfig):
        return TargetLocation(directory=config.storage_path, config=config)
    return TargetLocation(url=config.url, backend_options=config.backend_options(), config=config)
