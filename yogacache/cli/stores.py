"""Which store a command works on: ``--storage``, ``$YOGACACHE_STORAGE`` or the local default."""

from __future__ import annotations

import os
from typing import Optional

from yogacache.errors import ConfigError
from yogacache.sizes import parse_part_bytes
from yogacache.store import Store, open_store

STORAGE_ENV = "YOGACACHE_STORAGE"


def named_storage(storage: Optional[str]) -> Optional[str]:
    """What ``--storage`` or ``$YOGACACHE_STORAGE`` names; None for the local default store."""
    return storage or os.environ.get(STORAGE_ENV) or None


def open_cli_store(
    storage: Optional[str],
    endpoint_url: Optional[str] = None,
    local_cache: Optional[str] = None,
    must_exist: bool = True,
    part_bytes: Optional[str] = None,
) -> Store:
    """The store named by ``--storage``, ``$YOGACACHE_STORAGE`` or the local default; a local
    directory named explicitly must exist unless ``must_exist`` is false (a build creates it);
    ``part_bytes``: what ``--part-bytes`` says (the size past which a build rolls to a new part)."""
    target = named_storage(storage)
    size = None if part_bytes is None else parse_part_bytes(part_bytes, "--part-bytes")
    # A directory named explicitly must exist: a typo is an error, not "no caches".
    store = open_store(
        target, endpoint_url=endpoint_url, local_cache=local_cache, must_exist=must_exist, part_bytes=size
    )
    if must_exist and target is not None and store.remote is None and not store.root.is_dir():
        raise ConfigError(f"storage directory {store.root} does not exist")  # named by a config file
    return store
