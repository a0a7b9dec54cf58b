"""The ``yogacache`` command: list, inspect, verify and remove caches."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from yogacache import __version__
from yogacache.config import SharedFSConfig, load_config_file
from yogacache.errors import ConfigError, YogaCacheError
from yogacache.manifest import Manifest
from yogacache.progress import format_bytes
from yogacache.store import CacheStore, default_cache_root

STORAGE_ENV = "YOGACACHE_STORAGE"


def open_store(storage: Optional[str]) -> CacheStore:
    """The store named by ``--storage``, ``$YOGACACHE_STORAGE`` or the local default."""
    value = storage or os.environ.get(STORAGE_ENV)
    if not value:
        return CacheStore(default_cache_root())
    if "://" in value:
        raise ConfigError(f"storage URL {value!r} is not supported by this version; give a directory")
    path = Path(value).expanduser()
    if path.is_file():
        config = load_config_file(path)
        if config is None or isinstance(config, SharedFSConfig):
            root = config.storage_path if config is not None else None
            return CacheStore(root or default_cache_root())
        raise ConfigError(f"storage type of {path} is not available in this version of yogacache")
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


def cmd_ls(store: CacheStore, args: argparse.Namespace) -> int:
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
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    for r in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_info(store: CacheStore, args: argparse.Namespace) -> int:
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


def cmd_verify(store: CacheStore, args: argparse.Namespace) -> int:
    manifest = store.verify_cache(args.dataset_id, args.version)
    print(
        f"ok: {manifest.dataset_id} {manifest.dataset_version}: {len(manifest.parts)} part(s), "
        f"{manifest.num_records:,} records, hashes match"
    )
    return 0


def cmd_rm(store: CacheStore, args: argparse.Namespace) -> int:
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
    store.remove(args.dataset_id, args.version)
    print(f"removed {args.dataset_id} {args.version} ({path})")
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
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = parser.add_subparsers(dest="command", required=True)

    ls = sub.add_parser("ls", parents=[common], help="list caches")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(run=cmd_ls)

    for name, run, help_text in (
        ("info", cmd_info, "show a cache's manifest summary"),
        ("verify", cmd_verify, "re-hash a cache's parts (exit 1 on mismatch)"),
        ("rm", cmd_rm, "remove one cache"),
    ):
        command = sub.add_parser(name, parents=[common], help=help_text)
        command.add_argument("dataset_id")
        command.add_argument("version")
        if name == "rm":
            command.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
        if name == "info":
            command.add_argument("--json", action="store_true", help="print the manifest as JSON")
        command.set_defaults(run=run)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        store = open_store(args.storage)
        return int(args.run(store, args))
    except (YogaCacheError, OSError) as error:
        print(f"yogacache: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
