"""``yogacache build``: a cache from a function named ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable

from yogacache.errors import ConfigError
from yogacache.progress import format_bytes
from yogacache.store import Store


def load_callable(spec: str) -> Callable[[], Any]:
    """``package.module:function`` or ``path/to/file.py:function``.

    A file is imported by its name from its directory (``data.py`` as module ``data``), like a
    module: what it defines can then be pickled by name, and processes that ``--workers``
    spawns import it the same way (they inherit ``sys.path``).
    """
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute:
        raise ConfigError(f"expected MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    try:
        if module_name.endswith(".py"):
            module = _import_file(Path(module_name).expanduser())
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ConfigError(f"cannot import {module_name!r}: {error}") from error
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(f"{module_name} has no function {attribute!r}")
    return function  # type: ignore[no-any-return]


def _import_file(path: Path) -> Any:
    """Imports ``path`` (a ``.py`` file) as the module named by its stem, from its directory."""
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    path = path.resolve()
    name = path.stem
    if "." in name or not name:
        raise ConfigError(f"cannot import {path}: its name is not a module name (rename it without dots)")
    loaded = sys.modules.get(name)
    if loaded is None:
        sys.path.insert(0, str(path.parent))
        importlib.invalidate_caches()
        loaded = importlib.import_module(name)
    origin = getattr(loaded, "__file__", None)
    if origin is None or Path(origin).resolve() != path:
        where = f"from {origin}" if origin else "built in"
        raise ConfigError(
            f"cannot import {path} as module {name!r}: a module of that name is already imported ({where}); "
            "rename the file"
        )
    return loaded


def cmd_build(store: Store, args: argparse.Namespace) -> int:
    make_data = load_callable(args.function)
    if args.workers is not None or args.build_shards is not None:
        from yogacache.parallel import parallel_maker

        make_data = parallel_maker(make_data, args.workers or 1, args.build_shards)
    where = store.location(args.dataset_id, args.version)
    replaced = _existing(store, args.dataset_id, args.version)
    if replaced is not None:  # `rm` asks; `build` rebuilds, as its help says, but not silently
        print(
            f"yogacache: replacing {args.dataset_id} {args.version} at {where} "
            f"({replaced.num_records:,} records); readers that have it open keep reading the old build",
            file=sys.stderr,
        )
    manifest = store.build(args.dataset_id, args.version, make_data())
    print(
        f"built {args.dataset_id} {args.version}: {manifest.num_records:,} records, "
        f"{format_bytes(manifest.total_size_bytes)} on disk, at {where}"
    )
    if not args.version.endswith(("_train", "_val")):
        # DataLayer.cache_train_dataset(id, v) and cache_validation_dataset read "<v>_train" and
        # "<v>_val" (YogaDL's names): a cache built as plain "<v>" is not theirs.
        print(
            f"note: DataLayer.cache_train_dataset({args.dataset_id!r}, {args.version!r}) reads version "
            f"{args.version}_train (and cache_validation_dataset {args.version}_val); build those versions "
            "for it, or read this one with store.open / CacheDataRef"
        )
    return 0


def _existing(store: Store, dataset_id: str, version: str) -> Any:
    """The manifest of the cache a build would replace, or None."""
    from yogacache.errors import CacheNotFoundError

    try:
        return store.manifest(dataset_id, version)
    except CacheNotFoundError:
        return None
