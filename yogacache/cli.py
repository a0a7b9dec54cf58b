"""The ``yogacache`` command: list, inspect, verify, remove, pull and push caches."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from yogacache import __version__
from yogacache.config import load_config_file
from yogacache.datalayer import make_store
from yogacache.errors import ConfigError, YogaCacheError
from yogacache.manifest import Manifest
from yogacache.progress import format_bytes
from yogacache.remote.sync import RemoteCacheStore
from yogacache.store import CacheStore, default_cache_root

STORAGE_ENV = "YOGACACHE_STORAGE"


AnyStore = Union[CacheStore, RemoteCacheStore]


def open_store(
    storage: Optional[str], endpoint_url: Optional[str] = None, local_cache: Optional[str] = None
) -> AnyStore:
    """The store named by ``--storage``, ``$YOGACACHE_STORAGE`` or the local default."""
    value = storage or os.environ.get(STORAGE_ENV)
    if not value:
        return CacheStore(default_cache_root())
    if "://" in value:
        from yogacache.remote import object_store_from_url

        local_root = Path(local_cache).expanduser() if local_cache else default_cache_root()
        return RemoteCacheStore(object_store_from_url(value, endpoint_url), local_root)
    path = Path(value).expanduser()
    if path.is_file():
        return make_store(load_config_file(path))
    return CacheStore(path)


def _created(manifest: Manifest) -> str:
    try:
        moment = datetime.datetime.fromisoformat(manifest.created_at)
    except ValueError:
        return manifest.created_at
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _manifest_summary(manifest: Manifest, path: Path) -> dict[str, Any]:
    return {
        "dataset_id": manifest.dataset_id,
        "dataset_version": manifest.dataset_version,
        "records": manifest.num_records,
        "size_bytes": manifest.total_size_bytes,
        "created_at": manifest.created_at,
        "build_id": manifest.build_id,
        "where": "local",
        "path": str(path),
    }


def cmd_ls(store: AnyStore, args: argparse.Namespace) -> int:
    if isinstance(store, RemoteCacheStore):
        return _ls_remote(store, args)
    entries = store.list()
    rows: list[dict[str, Any]] = []
    for entry in entries:
        if entry.manifest is None:
            rows.append(
                {
                    "dataset_id": entry.dataset_id,
                    "dataset_version": entry.dataset_version,
                    "records": None,
                    "size_bytes": None,
                    "created_at": None,
                    "where": "local",
                    "path": str(entry.path),
                    "error": entry.error,
                }
            )
        else:
            rows.append(_manifest_summary(entry.manifest, entry.path))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no caches under {store.root}")
        return 0
    header = ["DATASET", "VERSION", "RECORDS", "SIZE", "CREATED", "WHERE"]
    table = [header]
    for row, entry in zip(rows, entries):
        if entry.manifest is None:
            table.append([row["dataset_id"], row["dataset_version"], "?", "?", "unreadable", row["path"]])
        else:
            table.append(
                [
                    row["dataset_id"],
                    row["dataset_version"],
                    f"{row['records']:,}",
                    format_bytes(row["size_bytes"]),
                    _created(entry.manifest),
                    f"local {row['path']}",
                ]
            )
    _print_table(table)
    return 0


def _ls_remote(store: RemoteCacheStore, args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for entry in store.list():
        manifest = entry.remote or entry.local
        if manifest is None:  # pragma: no cover - list() only yields entries with a manifest
            continue
        where = "+".join(w for w, m in (("remote", entry.remote), ("local", entry.local)) if m)
        rows.append(
            {
                "dataset_id": entry.dataset_id,
                "dataset_version": entry.dataset_version,
                "records": manifest.num_records,
                "size_bytes": manifest.total_size_bytes,
                "created_at": manifest.created_at,
                "build_id": manifest.build_id,
                "where": where,
                "remote_url": store.objects.url(store.key(entry.dataset_id, entry.dataset_version))
                if entry.remote
                else None,
                "local_path": str(entry.local_path) if entry.local else None,
                "local_current": entry.current,
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no caches at {store.objects.url()} or under {store.local.root}")
        return 0
    header = ["DATASET", "VERSION", "RECORDS", "SIZE", "CREATED", "WHERE", "LOCAL COPY"]
    table = [header]
    for row, entry in zip(rows, store.list()):
        manifest = entry.remote or entry.local
        copy_state = (
            "current" if row["local_current"] else "stale" if entry.local and entry.remote
            else "only local" if entry.local else "none"
        )
        table.append(
            [
                row["dataset_id"],
                row["dataset_version"],
                f"{row['records']:,}",
                format_bytes(row["size_bytes"]),
                _created(manifest) if manifest else "?",
                row["where"],
                copy_state,
            ]
        )
    _print_table(table)
    return 0


def _print_table(table: list[list[Any]]) -> None:
    widths = [max(len(str(r[i])) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())


def _local(store: AnyStore) -> CacheStore:
    return store.local if isinstance(store, RemoteCacheStore) else store


def cmd_info(store: AnyStore, args: argparse.Namespace) -> int:
    if isinstance(store, RemoteCacheStore):
        manifest = store.remote_manifest(args.dataset_id, args.version) or store.local.manifest(
            args.dataset_id, args.version
        )
        path: Any = store.objects.url(store.key(args.dataset_id, args.version))
    else:
        manifest = store.manifest(args.dataset_id, args.version)
        path = store.cache_dir(args.dataset_id, args.version)
    if args.json:
        print(json.dumps(manifest.to_json(), indent=2))
        return 0
    print(f"dataset:   {manifest.dataset_id}")
    print(f"version:   {manifest.dataset_version}")
    print(f"path:      {path}")
    print(f"records:   {manifest.num_records:,}")
    print(f"size:      {format_bytes(manifest.total_size_bytes)} in {len(manifest.parts)} part(s)")
    print(f"created:   {_created(manifest)}")
    print(f"build id:  {manifest.build_id}")
    print(f"writer:    {manifest.writer_version} (format {manifest.format_version}, from {manifest.source})")
    print("element:   " + json.dumps(manifest.to_json()["element_spec"]))
    return 0


def cmd_verify(store: AnyStore, args: argparse.Namespace) -> int:
    manifest = _local(store).verify_cache(args.dataset_id, args.version)
    print(
        f"ok: {manifest.dataset_id} {manifest.dataset_version}: {len(manifest.parts)} part(s), "
        f"{manifest.num_records:,} records, hashes match"
    )
    return 0


def cmd_rm(store: AnyStore, args: argparse.Namespace) -> int:
    if isinstance(store, RemoteCacheStore):
        remote = args.remote
        local = args.local or not args.remote
        manifest = (store.remote_manifest(args.dataset_id, args.version) if remote else None) or (
            store.local.manifest(args.dataset_id, args.version)
        )
        where = " and ".join(
            w for w, flag in (("remote cache", remote), ("local copy", local)) if flag
        )
        path: Any = f"{store.objects.url(store.key(args.dataset_id, args.version))} ({where})"
    else:
        if args.remote:
            raise ConfigError("--remote needs a remote storage (s3://, gs:// or an s3/gcs config)")
        manifest = store.manifest(args.dataset_id, args.version)
        path = store.cache_dir(args.dataset_id, args.version)
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
    if isinstance(store, RemoteCacheStore):
        store.remove(args.dataset_id, args.version, remote=remote, local=local)
    else:
        store.remove(args.dataset_id, args.version)
    print(f"removed {args.dataset_id} {args.version} ({path})")
    return 0


def _remote(store: AnyStore, command: str) -> RemoteCacheStore:
    if not isinstance(store, RemoteCacheStore):
        raise ConfigError(f"{command} needs a remote storage (s3://, gs:// or an s3/gcs config file)")
    return store


def cmd_pull(store: AnyStore, args: argparse.Namespace) -> int:
    remote = _remote(store, "pull")
    reader = remote.open(args.dataset_id, args.version)
    print(f"local copy of {args.dataset_id} {args.version} is current: {reader.directory}")
    return 0


def cmd_push(store: AnyStore, args: argparse.Namespace) -> int:
    remote = _remote(store, "push")
    manifest = remote.push(args.dataset_id, args.version)
    print(
        f"published {args.dataset_id} {args.version} ({manifest.num_records:,} records) to "
        f"{remote.objects.url(remote.key(args.dataset_id, args.version))}"
    )
    return 0


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
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    # Progress: a live line on a terminal, log lines otherwise (CI, pipes).
    logging.getLogger("yogacache.progress").setLevel(logging.INFO)
    try:
        store = open_store(args.storage, args.endpoint_url, args.local_cache)
        return int(args.run(store, args))
    except (YogaCacheError, OSError) as error:
        print(f"yogacache: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
