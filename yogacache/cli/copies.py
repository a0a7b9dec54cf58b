"""The commands that write a cache elsewhere or in another form: copy (to another storage),
export (WebDataset shards) and migrate (from a YogaDL cache)."""

from __future__ import annotations

import argparse

from yogacache.errors import ConfigError
from yogacache.progress import format_bytes
from yogacache.store import Store


def cmd_copy(store: Store, args: argparse.Namespace) -> int:
    """Copies a published cache between storages (``store`` is not used: --from and --to say)."""
    from yogacache.store.copy import copy_cache

    if args.threads < 1:
        raise ConfigError(f"--threads must be at least 1, got {args.threads}")
    report = copy_cache(
        args.copy_from,
        args.copy_to,
        args.dataset_id,
        args.version,
        replace_other=args.replace,
        threads=args.threads,
        endpoint_url=args.endpoint_url,
    )
    copied = len(report.copied)
    outcome = "published" if report.published else "already published there"
    if report.replaced_build:
        outcome += f", replacing build {report.replaced_build}"
    print(
        f"{args.dataset_id}:{args.version} build {report.build_id} -> {report.destination}: {outcome}; "
        f"{copied} part(s) copied ({len(report.copied_server_side)} server-side), "
        f"{len(report.kept)} already there and verified; "
        f"{format_bytes(report.bytes_through_client)} through this machine"
    )
    return 0


def cmd_export(store: Store, args: argparse.Namespace) -> int:
    """Writes a cache as WebDataset tar shards plus a wids index (logic in yogacache.export)."""
    from yogacache.export import check_format, export_reader, parse_size

    check_format(args.format)
    extensions = {}
    for item in args.ext or []:
        field, sep, extension = item.partition("=")
        if not sep or not field or not extension:
            raise ConfigError(f"--ext takes FIELD=EXTENSION (e.g. raw=bin), got {item!r}")
        extensions[field] = extension
    shard_size = parse_size(args.shard_size)
    with store.open(args.dataset_id, args.version) as reader:
        result = export_reader(
            reader,
            args.to,
            format=args.format,
            shard_size=shard_size,
            shard_records=args.shard_records,
            prefix=args.prefix,
            overwrite=args.overwrite,
            extensions=extensions,
            md5=args.md5,
            endpoint_url=args.endpoint_url,
        )
    print(
        f"exported {args.dataset_id} {args.version}: {result.num_records:,} records in {len(result.shards)} "
        f"shard(s), {format_bytes(result.size_bytes)}; index {result.index_url}"
    )
    return 0


def cmd_migrate(store: Store, args: argparse.Namespace) -> int:
    """Converts a YogaDL 0.1.4 cache (``<id>/<version>/cache.mdb``) into a yogacache cache."""
    from yogacache.store import yogadl as yogadl_caches

    legacy = yogadl_caches.legacy_location(store, args.dataset_id, args.version)
    manifest = yogadl_caches.migrate(store, args.dataset_id, args.version, force=args.force)
    print(
        f"converted {legacy} into {args.dataset_id} {args.version} ({manifest.num_records:,} records) at "
        f"{store.location(args.dataset_id, args.version)}; the YogaDL cache.mdb is kept"
    )
    return 0
