"""The ``yogacache`` command: list, inspect, verify, remove, pull and push caches."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from typing import Any, Optional, Sequence

from yogacache.errors import ConfigError, YogaCacheError
from yogacache.format.manifest import Manifest
from yogacache.progress import format_bytes
from yogacache.store import CacheEntry, Store, open_store
from yogacache.store.local import default_cache_root
from yogacache.version import __version__

STORAGE_ENV = "YOGACACHE_STORAGE"


def open_cli_store(
    storage: Optional[str], endpoint_url: Optional[str] = None, local_cache: Optional[str] = None
) -> Store:
    """The store named by ``--storage``, ``$YOGACACHE_STORAGE`` or the local default."""
    target = storage or os.environ.get(STORAGE_ENV) or None
    return open_store(target, endpoint_url=endpoint_url, local_cache=local_cache)


def _created(manifest: Manifest) -> str:
    try:
        moment = datetime.datetime.fromisoformat(manifest.created_at)
    except ValueError:
        return manifest.created_at
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _row(entry: CacheEntry) -> dict[str, Any]:
    manifest = entry.manifest
    return {
        "dataset_id": entry.dataset_id,
        "dataset_version": entry.dataset_version,
        "records": manifest.num_records if manifest else None,
        "size_bytes": manifest.total_size_bytes if manifest else None,
        "created_at": manifest.created_at if manifest else None,
        "build_id": manifest.build_id if manifest else None,
        "where": entry.where,
        "path": str(entry.local_path) if entry.local_path else None,
        "remote_url": entry.remote_url,
        "local_path": str(entry.local_path) if entry.local_path and entry.local else None,
        "local_current": entry.current,
        **({"error": entry.error} if entry.error else {}),
    }


def cmd_ls(store: Store, args: argparse.Namespace) -> int:
    entries = store.list()
    if args.json:
        print(json.dumps([_row(entry) for entry in entries], indent=2))
        return 0
    if not entries:
        beyond = f"{store.remote_url} or under " if store.remote_url else "under "
        print(f"no caches {beyond}{store.root}")
        return 0
    published = store.remote_url is not None
    header = ["DATASET", "VERSION", "RECORDS", "SIZE", "CREATED", "WHERE"] + (["LOCAL COPY"] if published else [])
    table = [header]
    for entry in entries:
        manifest = entry.manifest
        where = entry.where if published else f"{entry.where} {entry.local_path}"
        if manifest is None:
            row = [entry.dataset_id, entry.dataset_version, "?", "?", "unreadable", where]
        else:
            row = [
                entry.dataset_id,
                entry.dataset_version,
                f"{manifest.num_records:,}",
                format_bytes(manifest.total_size_bytes),
                _created(manifest),
                where,
            ]
        table.append(row + ([entry.copy_state] if published else []))
    _print_table(table)
    return 0


def _print_table(table: list[list[Any]]) -> None:
    widths = [max(len(str(r[i])) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def cmd_info(store: Store, args: argparse.Namespace) -> int:
    manifest = store.manifest(args.dataset_id, args.version)
    if args.json:
        print(json.dumps(manifest.to_json(), indent=2))
        return 0
    print(f"dataset:   {manifest.dataset_id}")
    print(f"version:   {manifest.dataset_version}")
    print(f"path:      {store.location(args.dataset_id, args.version)}")
    print(f"records:   {manifest.num_records:,}")
    print(f"size:      {format_bytes(manifest.total_size_bytes)} in {len(manifest.parts)} part(s)")
    print(f"created:   {_created(manifest)}")
    print(f"build id:  {manifest.build_id}")
    print(f"writer:    {manifest.writer_version} (format {manifest.format_version}, from {manifest.source})")
    print("element:   " + json.dumps(manifest.to_json()["element_spec"]))
    return 0


def cmd_verify(store: Store, args: argparse.Namespace) -> int:
    manifest = store.verify(args.dataset_id, args.version)
    print(
        f"ok: {manifest.dataset_id} {manifest.dataset_version}: {len(manifest.parts)} part(s), "
        f"{manifest.num_records:,} records, hashes match"
    )
    return 0


def cmd_rm(store: Store, args: argparse.Namespace) -> int:
    if args.remote and store.remote_url is None:
        raise ConfigError("--remote needs a remote storage (s3://, gs:// or an s3/gcs config)")
    remote = args.remote
    local = args.local or not args.remote
    manifest = store.manifest(args.dataset_id, args.version)
    path = store.location(args.dataset_id, args.version)
    if store.remote_url is not None:
        where = " and ".join(w for w, flag in (("remote cache", remote), ("local copy", local)) if flag)
        path = f"{path} ({where})"
    if not args.yes:
        question = (
            f"Remove cache {args.dataset_id} {args.version} at {path} "
            f"({manifest.num_records:,} records, {format_bytes(manifest.total_size_bytes)})? [y/N] "
        )
        try:
            answer = input(question)
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("not removed (pass -y to skip this question)", file=sys.stderr)
            return 1
    store.remove(args.dataset_id, args.version, remote=remote, local=local)
    print(f"removed {args.dataset_id} {args.version} ({path})")
    return 0


def cmd_pull(store: Store, args: argparse.Namespace) -> int:
    reader = store.pull(args.dataset_id, args.version)
    print(f"local copy of {args.dataset_id} {args.version} is current: {reader.directory}")
    return 0


def cmd_push(store: Store, args: argparse.Namespace) -> int:
    manifest = store.push(args.dataset_id, args.version)
    print(
        f"published {args.dataset_id} {args.version} ({manifest.num_records:,} records) to "
        f"{store.location(args.dataset_id, args.version)}"
    )
    return 0


# -- migrate (YogaDL caches) -----------------------------------------------------------------
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


def add_migrate_command(sub: Any, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "migrate",
        parents=[common],
        help="convert a YogaDL 0.1.4 cache (<id>/<version>/cache.mdb) into a yogacache cache",
        description="Convert the YogaDL 0.1.4 cache <storage>/<id>/<version>/cache.mdb into a "
        "yogacache cache beside it (published too, for s3:// and gs:// storages). Its pickles are "
        "read by a restricted unpickler that never runs code; cache.mdb itself is left as it was.",
    )
    command.add_argument("dataset_id")
    command.add_argument("version")
    command.add_argument(
        "--force", action="store_true", help="convert again even if a converted cache is in place"
    )
    command.set_defaults(run=cmd_migrate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yogacache", description="Manage yogacache dataset caches.")
    parser.add_argument("--version", action="version", version=f"yogacache {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--storage",
        help="cache directory or config file (JSON/YAML with a data_layer mapping); "
        f"default ${STORAGE_ENV}, else {default_cache_root()}",
    )
    common.add_argument("--endpoint-url", help="S3 endpoint URL (default: $AWS_ENDPOINT_URL or AWS)")
    common.add_argument(
        "--local-cache", help="root of node-local copies of remote caches (default: the local default)"
    )
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("ls", parents=[common], help="list caches")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(run=cmd_ls)

    for name, run, help_text in (
        ("info", cmd_info, "show a cache's manifest summary"),
        ("verify", cmd_verify, "re-hash a cache's parts (exit 1 on mismatch)"),
        ("rm", cmd_rm, "remove one cache (remote storages: the local copy, --remote, or both)"),
        ("pull", cmd_pull, "download (or refresh) the local copy of a remote cache"),
        ("push", cmd_push, "publish a local cache to the remote storage"),
    ):
        command = sub.add_parser(name, parents=[common], help=help_text)
        command.add_argument("dataset_id")
        command.add_argument("version")
        if name == "rm":
            command.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
            command.add_argument("--remote", action="store_true", help="remove the published cache")
            command.add_argument(
                "--local", action="store_true", help="remove the local copy (default without --remote)"
            )
        if name == "info":
            command.add_argument("--json", action="store_true", help="print the manifest as JSON")
        command.set_defaults(run=run)
    add_migrate_command(sub, common)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    # Progress: a live line on a terminal, log lines otherwise (CI, pipes).
    logging.getLogger("yogacache.progress").setLevel(logging.INFO)
    try:
        store = open_cli_store(args.storage, args.endpoint_url, args.local_cache)
        return int(args.run(store, args))
    except (YogaCacheError, OSError) as error:
        print(f"yogacache: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
