"""The commands about caches in a storage: ls, info, verify, rm, pull, push and gc."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any, Optional

from yogacache.cli.sources import source_pin_lines, verify_source
from yogacache.cli.tables import format_created, print_table, spec_lines
from yogacache.errors import CacheNotFoundError, ConfigError, CorruptCacheError, IncompatibleCacheError
from yogacache.format.manifest import Manifest
from yogacache.progress import format_bytes
from yogacache.store import CacheEntry, Store, open_store


def _row(entry: CacheEntry, published: bool = True) -> dict[str, Any]:
    manifest = entry.manifest
    return {
        "dataset_id": entry.dataset_id,
        "dataset_version": entry.dataset_version,
        "records": manifest.num_records if manifest else None,
        "size_bytes": manifest.total_size_bytes if manifest else None,  # on disk (LMDB files)
        "record_bytes": manifest.num_bytes if manifest else None,  # encoded record data
        "created_at": manifest.created_at if manifest else None,
        "build_id": manifest.build_id if manifest else None,
        "where": entry.where,
        "path": str(entry.local_path) if entry.local_path else None,
        "remote_url": entry.remote_url,
        "local_path": str(entry.local_path) if entry.local_path and entry.local else None,
        # A store without a remote: its cache is the local copy, current by definition.
        "local_current": entry.current if published else entry.local is not None,
        **({"error": entry.error} if entry.error else {}),
    }


def cmd_ls(store: Store, args: argparse.Namespace) -> int:
    # A storage that cannot be listed (no such bucket, no credentials, no server) is an error,
    # as for ``info``: the local copies alone may belong to another storage. Stores mark an
    # unreadable cache in its entry instead of failing the listing.
    entries = store.list()
    usage = _local_usage(store)
    if args.json:
        mirrors = _mirror_fields(store)
        listed = [{**_row(entry, store.remote_url is not None), **_usage_fields(usage, entry)} for entry in entries]
        if mirrors is not None:  # a storage with mirrors: which of them holds which build
            for fields in listed:
                fields["mirrors"] = mirrors.get((fields["dataset_id"], fields["dataset_version"]), [])
        print(json.dumps(listed, indent=2))
        return 0
    if not entries:
        beyond = f"{store.remote_url} or under " if store.remote_url else "under "
        print(f"no caches {beyond}{store.root}")
        return 0
    published = store.remote_url is not None
    header = ["DATASET", "VERSION", "RECORDS", "DISK", "CREATED"] + (["WHERE", "LOCAL COPY"] if published else ["PATH"])
    if published:  # this node's bytes of each cache (whole copy and streamed parts), and its use
        header[5:5] = ["LOCAL", "IN USE"]
    rows, problems = [], []
    for entry in entries:
        manifest = entry.manifest
        if manifest is None or entry.error:
            problems.append(entry)
        if manifest is None:
            row = [entry.dataset_id, entry.dataset_version, "?", "?", f"unreadable [{len(problems)}]"]
        else:
            row = [
                entry.dataset_id,
                entry.dataset_version,
                f"{manifest.num_records:,}",
                format_bytes(manifest.total_size_bytes),
                format_created(manifest, seconds=False) + (f" [{len(problems)}]" if entry.error else ""),
            ]
        if published:
            fields = _usage_fields(usage, entry)
            row += [format_bytes(fields["local_bytes"]), "yes" if fields["in_use"] else "no"]
            # No whole copy, but parts of it streamed to this node: say so, not "none".
            state = "streamed" if entry.copy_state == "none" and fields["streamed_bytes"] else entry.copy_state
            row += [entry.where, state]
        else:
            row += [str(entry.local_path) if entry.local_path else ""]
        rows.append(row)
    print_table(
        header,
        rows,
        right=("RECORDS", "DISK", "LOCAL"),
        fold=("DATASET", "VERSION"),
        path=None if published else "PATH",
        dates=("CREATED",),
        optional=("IN USE", "WHERE", "LOCAL"),  # LOCAL COPY says where a cache is, too
    )
    for number, entry in enumerate(problems, 1):
        print(f"[{number}] {entry.dataset_id} {entry.dataset_version}: {entry.error or 'manifest unreadable'}")
    _print_mirrors(store)
    return 0


def _mirror_fields(store: Store) -> Optional[dict[tuple[str, str], list[dict[str, Any]]]]:
    """For a storage with mirrors (else None): per published cache, each storage (the origin
    first, then the mirrors nearest first) with the build it holds and its role."""
    builds = store.remote.mirror_builds() if store.remote is not None else None
    if builds is None:
        return None
    fields: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for dataset_id, version, url, build in builds:
        role = "origin" if url == store.remote_url else ("empty" if build is None else "mirror")
        fields.setdefault((dataset_id, version), []).append({"storage": url, "build_id": build, "role": role})
    return fields


def _print_mirrors(store: Store) -> None:
    """For a storage with mirrors: which of them holds which build of each published cache."""
    fields = _mirror_fields(store)
    if fields is None:
        return
    rows = [
        [dataset_id, version, held["storage"], held["build_id"] or "-", held["role"]]
        for (dataset_id, version), storages in fields.items()
        for held in storages
    ]
    if rows:
        print()
        print_table(["DATASET", "VERSION", "STORAGE", "BUILD", "ROLE"], rows, fold=("DATASET", "VERSION", "STORAGE"))


def cmd_info(store: Store, args: argparse.Namespace) -> int:
    manifest = store.manifest(args.dataset_id, args.version)
    if args.json:
        print(json.dumps(manifest.to_json(), indent=2))
        return 0
    print(f"dataset:     {manifest.dataset_id}")
    print(f"version:     {manifest.dataset_version}")
    print(f"location:    {store.location(args.dataset_id, args.version)}")
    print(f"records:     {manifest.num_records:,}")
    average = format_bytes(manifest.average_record_bytes)
    print(f"record data: {format_bytes(manifest.num_bytes)} (encoded records, {average} each on average)")
    print(f"on disk:     {format_bytes(manifest.total_size_bytes)} in {len(manifest.parts)} LMDB part file(s)")
    print(f"created:     {format_created(manifest)}")
    print(f"build id:    {manifest.build_id}")
    print(f"writer:      {manifest.writer_version} (format {manifest.format_version}, from {manifest.source})")
    for line in source_pin_lines(manifest):
        print(line)
    print("element:")
    leaves = spec_lines(manifest.element_spec)
    width = max(len(path) for path, _, _ in leaves)
    dtype_width = max(len(dtype) for _, dtype, _ in leaves)
    for path, dtype, shape in leaves:
        print(f"  {path.ljust(width)}  {dtype.ljust(dtype_width)}  {shape}")
    return 0


def cmd_verify(store: Store, args: argparse.Namespace) -> int:
    if getattr(args, "check_source", False):
        return verify_source(store, args)
    manifest = store.verify(args.dataset_id, args.version)
    print(
        f"ok: {manifest.dataset_id} {manifest.dataset_version}: {len(manifest.parts)} part(s), "
        f"{manifest.num_records:,} records, hashes match"
    )
    return 0


def _local_copy_path(store: Store, dataset_id: str, version: str) -> Path:
    return store.root / dataset_id / version


def cmd_rm(store: Store, args: argparse.Namespace) -> int:
    if args.remote and store.remote_url is None:
        raise ConfigError("--remote needs a remote storage (s3://, gs:// or an s3/gcs config)")
    remote = args.remote
    local = args.local or not args.remote
    # The cache a user most needs to delete may be one whose manifest cannot be read (empty,
    # corrupt, oversized, of a newer format): that is said in the question, never a refusal.
    # Any other error (403, a server down) stops here, before anything is deleted.
    try:
        manifest: Optional[Manifest] = store.manifest(args.dataset_id, args.version)
        unreadable = ""
    except (CorruptCacheError, IncompatibleCacheError) as error:
        manifest, unreadable = None, str(error)
    except CacheNotFoundError:
        if not remote:
            raise
        # No manifest: rm --remote still removes what a publish that never finished left there.
        manifest, unreadable = None, "no manifest"
    targets = []
    if remote:
        targets.append(f"the published cache {store.location(args.dataset_id, args.version)}")
    if local:
        what = "the local copy " if store.remote_url is not None else ""
        targets.append(f"{what}{_local_copy_path(store, args.dataset_id, args.version)}")
    target_text = " and ".join(targets)
    if not args.yes:
        if manifest is not None:
            about = f"{manifest.num_records:,} records, {format_bytes(manifest.total_size_bytes)}"
        else:
            about = f"manifest unreadable: {unreadable}"
        question = f"Remove cache {args.dataset_id} {args.version} ({about}): delete {target_text}? [y/N] "
        try:
            answer = input(question)
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("not removed (pass -y to skip this question)", file=sys.stderr)
            return 1
    store.remove(args.dataset_id, args.version, remote=remote, local=local)
    print(f"removed {args.dataset_id} {args.version}: {target_text}")
    return 0


def cmd_pull(store: Store, args: argparse.Namespace) -> int:
    reader = store.pull(args.dataset_id, args.version)
    print(f"local copy of {args.dataset_id} {args.version} is current: {reader.directory}")
    return 0


def cmd_push(store: Store, args: argparse.Namespace) -> int:
    publisher = _publisher(store, args)
    manifest = publisher.push(args.dataset_id, args.version)
    print(
        f"published {args.dataset_id} {args.version} ({manifest.num_records:,} records) to "
        f"{store.location(args.dataset_id, args.version)}"
    )
    return 0


def _publisher(store: Store, args: argparse.Namespace) -> Store:
    """The store that publishes: the remote store, reading the local cache from ``--from`` or,
    when the remote store's local copies do not hold it, from the local default store (where
    ``yogacache ls`` without ``--storage`` finds it)."""
    remote = store.remote
    if remote is None:
        return store
    if args.source:
        directory = Path(args.source).expanduser().absolute()
        if not directory.is_dir():
            raise ConfigError(f"--from directory {directory} does not exist")
        source = open_store(directory).local
    elif remote.local.exists(args.dataset_id, args.version):
        return store
    else:
        source = open_store(None).local  # the local default store
        if not source.exists(args.dataset_id, args.version):
            raise CacheNotFoundError(
                f"no local cache {args.dataset_id} {args.version} to push: looked under {remote.local.root} "
                f"and {source.root} (use --from DIR for another directory)"
            )
    publisher = copy.copy(remote)
    publisher.local = source
    return publisher


# -- node-local bytes: ls columns and gc -------------------------------------------------------
def _local_usage(store: Store) -> dict[tuple[str, str], Any]:
    """Per cache: node-local bytes (whole copy and streamed parts) and whether it is in use."""
    if store.remote_url is None:
        return {}
    from yogacache.store.eviction import local_usage

    return local_usage(store.root)


def _usage_fields(usage: dict[tuple[str, str], Any], entry: CacheEntry) -> dict[str, Any]:
    found = usage.get((entry.dataset_id, entry.dataset_version))
    return {
        "local_bytes": found.total if found else 0,
        "streamed_bytes": found.part_bytes if found else 0,
        "in_use": bool(found and found.in_use),
    }


def cmd_gc(store: Store, args: argparse.Namespace) -> int:
    """Brings node-local copies and streamed parts under the budget by the eviction policy."""
    from yogacache.sizes import parse_size
    from yogacache.store.eviction import collect

    remote = store.remote
    limit = parse_size(args.limit, "--limit") if args.limit is not None else None  # a typo is an error anywhere
    if remote is None:
        print(
            f"nothing to collect under {store.root}: its caches are the only copies "
            "(shared_fs or local, never evicted)"
        )
        return 0
    if limit is None:
        limit = remote.local_cache_limit
    if limit is None:
        raise ConfigError(
            'gc needs a budget: pass --limit SIZE (e.g. 200Gi) or set "local_cache_limit" in the storage config'
        )
    result = collect(remote, limit, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for eviction in result.evicted:
        print(f"{verb} {eviction.item.item} ({format_bytes(eviction.item.size)}): {eviction.reason}")
    for url in result.stranded:
        print(f"{verb} {url}: stranded part (no published manifest names it)")
    print(
        f"{store.root}: {format_bytes(result.before)} before, {format_bytes(result.after)} after "
        f"(limit {format_bytes(limit)}; {format_bytes(result.kept_in_use)} in use by live processes)"
    )
    if result.after > limit:
        print(
            "yogacache: warning: still over the limit: the rest is in use or the only copy of a cache",
            file=sys.stderr,
        )
    return 0
