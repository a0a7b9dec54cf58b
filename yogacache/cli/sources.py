"""The commands about object sources (yogacache.sources): import, ``verify --source`` and the
pins ``info`` shows."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from yogacache.cli.stores import open_cli_store
from yogacache.format.manifest import Manifest
from yogacache.progress import format_bytes
from yogacache.store import Store


def source_pin_lines(manifest: Manifest) -> list[str]:
    """The lines ``info`` prints about the source objects a cache was imported from."""
    from yogacache.sources.importer import pin_lines

    return pin_lines(manifest)


def verify_source(store: Store, args: argparse.Namespace) -> int:
    """``verify --source``: whether the source objects are unchanged, downloading none of them."""
    from yogacache.sources.importer import verify_sources

    check = verify_sources(store.manifest(args.dataset_id, args.version))
    print(
        f"ok: {args.dataset_id} {args.version}: {check.objects:,} source object(s) unchanged "
        f"({check.requests} request(s))"
    )
    return 0


def cmd_import(store: Store, args: argparse.Namespace) -> int:
    from yogacache.sources import from_url
    from yogacache.sources.importer import import_source

    workers = args.workers or 1
    quiet_store = open_cli_store(
        args.storage, args.endpoint_url, args.local_cache, must_exist=False, part_bytes=args.part_bytes
    )
    # The import draws its own progress line (objects, bytes, records): the build's stays off,
    # except with workers, which report through it. The upload of a published cache that follows
    # is reported by the store as it goes.
    if workers == 1:
        quiet_store.local.show_progress = False
    source = from_url(
        args.sources,
        format=args.format,
        etag=args.etag,
        version_id=args.version_id,
        generation=args.generation,
        fields=args.fields.split(",") if args.fields else None,
        on_source_change=args.on_source_change,
        max_bytes=args.max_bytes,
        endpoint_url=args.source_endpoint_url or args.endpoint_url,
    )
    parallel = None
    if workers > 1:
        from yogacache.parallel import sharded

        def parallel(whole: Any) -> Any:
            return sharded(whole, workers)

    result = import_source(quiet_store, args.dataset_id, source, args.cache_version, parallel=parallel)
    manifest = result.manifest
    where = quiet_store.location(manifest.dataset_id, manifest.dataset_version)
    if result.outcome == "stale":
        print(f"yogacache: warning: the sources of {manifest.dataset_id} {manifest.dataset_version} changed since "
              f"it was built ({'; '.join(result.check.changes[:5]) if result.check else ''}); kept the cache",
              file=sys.stderr)
    verb = {"built": "imported", "rebuilt": "re-imported", "cached": "already cached", "stale": "kept"}[result.outcome]
    print(
        f"{verb} {manifest.dataset_id} {manifest.dataset_version}: {manifest.num_records:,} records, "
        f"{format_bytes(manifest.total_size_bytes)} on disk, at {where}"
    )
    return 0
