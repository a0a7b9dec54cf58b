"""The ``yogacache`` command: list, inspect, verify, remove, build, pull and push caches."""

from __future__ import annotations

import argparse
import copy
import datetime
import difflib
import importlib
import json
import logging
import os
import re
import select
import shutil
import signal
import sys
import textwrap
import threading
import warnings
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional, Sequence

from yogacache import progress
from yogacache.errors import (
    CacheNotFoundError,
    ConfigError,
    CorruptCacheError,
    IncompatibleCacheError,
    YogaCacheError,
)
from yogacache.format.manifest import Manifest
from yogacache.format.spec import Spec, TensorSpec
from yogacache.progress import format_bytes
from yogacache.store import CacheEntry, Store, open_store
from yogacache.store.local import default_cache_root
from yogacache.version import __version__

STORAGE_ENV = "YOGACACHE_STORAGE"

EXAMPLES = f"""\
examples:
  yogacache ls                               caches in the local default store
  yogacache ls --storage s3://bucket/caches  published caches and local copies
  yogacache ls --storage gs://bucket/caches --json
  yogacache info mnist v1_train              records, sizes, element spec
  yogacache build mnist v1 my_project.data:make_dataset
  yogacache push mnist v1 --storage s3://bucket/caches
  yogacache pull mnist v1 --storage data_layer.yaml
  yogacache rm mnist v1 --remote --storage s3://bucket/caches
  yogacache --storage s3://bucket/caches ls  global options also go first

--storage takes a directory, an s3://bucket/prefix or gs://bucket/prefix URL, a file:// URL, or
a JSON/YAML file holding Determined's data_layer mapping; default ${STORAGE_ENV}, else the local
default store ({default_cache_root()}). Global options go before or after the command.
"""


class HelpFormatter(argparse.HelpFormatter):
    """Fills descriptions and epilogs to the terminal's width (the options' help, as argparse
    does), but keeps indented lines (examples) and headings (``examples:``) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out: list[str] = []
        paragraph: list[str] = []

        def flush() -> None:
            if paragraph:
                out.append(textwrap.fill(" ".join(paragraph), width, initial_indent=indent, subsequent_indent=indent))
                paragraph.clear()

        for line in text.splitlines():
            if not line.strip() or line[0].isspace() or line.rstrip().endswith(":"):
                flush()
                out.append(indent + line if line.strip() else "")
            else:
                paragraph.append(line.strip())
        flush()
        return "\n".join(out)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so that the same cleanup runs."""


def _on_signal(signum: int, frame: Optional[FrameType]) -> None:
    """Ctrl-C and SIGTERM: silence progress (transfer threads winding down print nothing more),
    then raise in the main thread so that every ``finally`` and ``with`` cleans up."""
    progress.mute_all()
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


def _exit_at_once(signum: int, frame: Optional[FrameType]) -> None:
    """A second Ctrl-C while an interrupted command finishes: end the process now."""
    os._exit(130)


# -- opening the store -------------------------------------------------------------------------
def open_cli_store(
    storage: Optional[str],
    endpoint_url: Optional[str] = None,
    local_cache: Optional[str] = None,
    must_exist: bool = True,
) -> Store:
    """The store named by ``--storage``, ``$YOGACACHE_STORAGE`` or the local default; a local
    directory named explicitly must exist unless ``must_exist`` is false (a build creates it)."""
    target = storage or os.environ.get(STORAGE_ENV) or None
    # A directory named explicitly must exist: a typo is an error, not "no caches".
    store = open_store(target, endpoint_url=endpoint_url, local_cache=local_cache, must_exist=must_exist)
    if must_exist and target is not None and store.remote is None and not store.root.is_dir():
        raise ConfigError(f"storage directory {store.root} does not exist")  # named by a config file
    return store


# -- formatting --------------------------------------------------------------------------------
def _created(manifest: Manifest, seconds: bool = True) -> str:
    try:
        moment = datetime.datetime.fromisoformat(manifest.created_at)
    except ValueError:
        return manifest.created_at
    return moment.astimezone(datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC"
    )


def _shape(shape: Optional[tuple[Optional[int], ...]]) -> str:
    if shape is None:
        return "any shape"
    if not shape:
        return "scalar"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def spec_lines(spec: Spec, name: str = "") -> list[tuple[str, str, str]]:
    """``(path, dtype, shape)`` per leaf: ``image uint8 (28, 28)``, ``pair[0] int64 scalar``."""
    if isinstance(spec, TensorSpec):
        return [(name or "(element)", spec.dtype, _shape(spec.shape))]
    rows: list[tuple[str, str, str]] = []
    if isinstance(spec, dict):
        for key in sorted(spec):
            rows += spec_lines(spec[key], f"{name}.{key}" if name else key)
    else:
        for index, item in enumerate(spec):
            rows += spec_lines(item, f"{name}[{index}]")
    return rows


def _columns() -> Optional[int]:
    """The width tables must fit: ``$COLUMNS``, the terminal's, or none when piped."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def shorten_path(path: str, width: int) -> str:
    """``.../on/mnist/v1``: the end of a path (what tells caches apart) within ``width``."""
    home = str(Path.home())
    if home not in ("", "/") and (path == home or path.startswith(home + "/")):
        path = "~" + path[len(home) :]
    if len(path) <= width:
        return path
    tail = path[-(width - 3) :]
    cut = tail.find("/")
    return "..." + (tail[cut:] if 0 <= cut < len(tail) - 8 else tail)


def wrap_name(name: str, width: int) -> str:
    """``name`` on lines of at most ``width`` characters, broken only after a ``-``, ``_``, ``.``
    or ``/`` (never inside a word: what is left is still the id, read top to bottom); a word
    longer than ``width`` stays whole on its own line."""
    lines = [""]
    for word in re.findall(r"[^-_./]+[-_./]*|[-_./]+", name):
        if lines[-1] and len(lines[-1]) + len(word) > width:
            lines.append("")
        lines[-1] += word
    return "\n".join(lines)


def _cell_width(cell: str) -> int:
    return max((len(line) for line in cell.split("\n")), default=0)


def print_table(
    header: list[str],
    rows: list[list[str]],
    *,
    right: Sequence[str] = (),
    fold: Sequence[str] = (),
    path: Optional[str] = None,
    dates: Sequence[str] = (),
    optional: Sequence[str] = (),
) -> None:
    """A plain table fitted to the terminal (``$COLUMNS``, the terminal's; piped, nothing is
    cut). Headers and numbers are never cut. When a line would not fit, in this order: ``dates``
    lose their time, ``optional`` columns are left out (first named first; ``--json`` has them
    all), the ``path`` column keeps its end, and the ``fold`` columns (names) wrap after a
    separator, never inside a word."""
    from rich.console import Console
    from rich.table import Table

    width = _columns()
    if width is not None:
        header, rows = _fit(header, rows, width, fold=fold, path=path, dates=dates, optional=optional)
    console = Console(width=10_000, highlight=False, soft_wrap=False, emoji=False, markup=False)
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 2, 0, 0))
    for name in header:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    with console.capture() as captured:
        console.print(table)
    for line in captured.get().splitlines():
        print(line.rstrip())


def _fit(
    header: list[str],
    rows: list[list[str]],
    width: int,
    *,
    fold: Sequence[str],
    path: Optional[str],
    dates: Sequence[str],
    optional: Sequence[str],
) -> tuple[list[str], list[list[str]]]:
    """The table's header and rows made to fit ``width`` columns (see ``print_table``)."""
    header, rows = list(header), [list(row) for row in rows]

    def column_width(rows: list[list[str]], i: int) -> int:
        return max(_cell_width(r[i]) for r in [header, *rows])

    def total(rows: list[list[str]]) -> int:
        return sum(column_width(rows, i) for i in range(len(header))) + 2 * (len(header) - 1)

    def with_column(rows: list[list[str]], i: int, cells: list[str]) -> list[list[str]]:
        return [r[:i] + [cell] + r[i + 1 :] for r, cell in zip(rows, cells)]

    for i, name in enumerate(header):
        if name in dates and total(rows) > width:
            rows = with_column(rows, i, [r[i][:10] for r in rows])
    for name in optional:
        if name in header and total(rows) > width:
            i = header.index(name)
            header, rows = header[:i] + header[i + 1 :], [r[:i] + r[i + 1 :] for r in rows]
    paths = header.index(path) if path in header else None
    full_paths = [r[paths] for r in rows] if paths is not None else []

    def fit_paths(rows: list[list[str]], column: int) -> list[list[str]]:
        """Paths (in ``column``) shortened from the left to what the other columns leave (16 at least)."""
        budget = max(16, width - (total(rows) - column_width(rows, column)))
        return with_column(rows, column, [shorten_path(full, budget) for full in full_paths])

    if paths is not None and total(rows) > width:
        rows = fit_paths(rows, paths)
    names = [i for i, name in enumerate(header) if name in fold and i != paths]
    while total(rows) > width and names:
        # The widest name column wraps to what the line needs; one that cannot shrink is done.
        i = max(names, key=lambda c: column_width(rows, c))
        current = max(_cell_width(r[i]) for r in rows)
        target = max(len(header[i]), current - (total(rows) - width))
        wrapped = with_column(rows, i, [wrap_name(r[i].replace("\n", ""), target) for r in rows])
        if max(_cell_width(r[i]) for r in wrapped) >= current:
            names.remove(i)
            continue
        rows = wrapped
        if paths is not None:
            rows = fit_paths(rows, paths)  # the path takes what wrapping left
    return header, rows


def _row(entry: CacheEntry) -> dict[str, Any]:
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
        "local_current": entry.current,
        **({"error": entry.error} if entry.error else {}),
    }


# -- commands ----------------------------------------------------------------------------------
def cmd_ls(store: Store, args: argparse.Namespace) -> int:
    # A storage that cannot be listed (no such bucket, no credentials, no server) is an error,
    # as for ``info``: the local copies alone may belong to another storage. Stores mark an
    # unreadable cache in its entry instead of failing the listing.
    entries = store.list()
    usage = _local_usage(store)
    if args.json:
        mirrors = _mirror_fields(store)
        listed = [{**_row(entry), **_usage_fields(usage, entry)} for entry in entries]
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
                _created(manifest, seconds=False) + (f" [{len(problems)}]" if entry.error else ""),
            ]
        if published:
            fields = _usage_fields(usage, entry)
            row += [format_bytes(fields["local_bytes"]), "yes" if fields["in_use"] else "no"]
            row += [entry.where, entry.copy_state]
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
    print(f"created:     {_created(manifest)}")
    print(f"build id:    {manifest.build_id}")
    print(f"writer:      {manifest.writer_version} (format {manifest.format_version}, from {manifest.source})")
    for line in _source_pin_lines(manifest):
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
        return _verify_source(store, args)
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
    if remote is None:
        print(
            f"nothing to collect under {store.root}: its caches are the only copies "
            "(shared_fs or local, never evicted)"
        )
        return 0
    limit = parse_size(args.limit, "--limit") if args.limit is not None else remote.local_cache_limit
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


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_build(store: Store, args: argparse.Namespace) -> int:
    make_data = load_callable(args.function)
    if args.workers is not None or args.build_shards is not None:
        from yogacache.parallel import parallel_maker

        make_data = parallel_maker(make_data, args.workers or 1, args.build_shards)
    manifest = store.build(args.dataset_id, args.version, make_data())
    print(
        f"built {args.dataset_id} {args.version}: {manifest.num_records:,} records, "
        f"{format_bytes(manifest.total_size_bytes)} on disk, at {store.location(args.dataset_id, args.version)}"
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


# -- object sources (yogacache.sources) ----------------------------------------------------------
def _source_pin_lines(manifest: Manifest) -> list[str]:
    from yogacache.sources.importer import pin_lines

    return pin_lines(manifest)


def _verify_source(store: Store, args: argparse.Namespace) -> int:
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

    target = args.storage or os.environ.get(STORAGE_ENV) or None
    workers = args.workers or 1
    quiet_store = open_store(target, endpoint_url=args.endpoint_url, local_cache=args.local_cache)
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


def _add_import_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    made = command(
        "import",
        cmd_import,
        "cache objects (WebDataset shards, archives, files) from S3, GCS or a directory, pinned",
        "examples:\n"
        "  yogacache import 's3://bucket/imagenet/train-{000000..000146}.tar' \\\n"
        "      --id imagenet\n"
        "  yogacache import gs://bucket/images/ --id pets --format imagefolder \\\n"
        "      --version v1\n"
        "  yogacache import s3://bucket/data.zip --id data \\\n"
        "      --etag 9b2cf535f27731c974343645a3985328\n"
        "\nThe cache records each object's URL, ETag, VersionId or generation and size; every read is\n"
        "conditional on them. --version auto (the default) derives the version from the pins, so a\n"
        "changed source gets a new cache. See docs/sources.md.",
    )
    made.add_argument("sources", nargs="+", metavar="SOURCE", help="URL, brace pattern, prefix/ or path")
    made.add_argument("--id", dest="dataset_id", required=True, help="the cache's dataset id")
    made.add_argument("--version", dest="cache_version", default="auto", help="cache version, or auto (default)")
    made.add_argument("--format", default="auto", choices=importlib.import_module("yogacache.sources.formats").FORMATS)
    made.add_argument("--etag", help="the ETag the (single) source object must have")
    made.add_argument("--version-id", help="read this S3 VersionId of the single source object")
    made.add_argument("--generation", type=int, help="read this GCS generation of the single source object")
    made.add_argument("--fields", help="comma-separated fields every record has (default: the first sample's)")
    made.add_argument("--on-source-change", default="error", choices=["error", "rebuild", "warn", "ignore"],
                      help="when the cache exists and its sources changed (default: error)")
    made.add_argument("--max-bytes", type=int, help="the most bytes the sources may expand to")
    made.add_argument("--source-endpoint-url", help="S3 endpoint of the sources (default: --endpoint-url)")
    made.add_argument(
        "--workers",
        type=positive_int,
        help="read and cache with this many processes, one archive (or run of files) at a time each "
        "(the cache is the same for any number of workers above 1)",
    )


# -- errors ------------------------------------------------------------------------------------
def _suggestions(store: Store, dataset_id: str, version: str) -> list[str]:
    """Caches whose names are close to the one asked for (``n20000`` -> ``n20000_train``)."""
    try:
        entries = store.list()
    except Exception:  # a suggestion is a courtesy: never let it hide the real error
        return []
    versions = [e.dataset_version for e in entries if e.dataset_id == dataset_id]
    if versions:
        close = [v for v in versions if v.startswith(version) and v != version]
        close += [v for v in difflib.get_close_matches(version, versions, n=4, cutoff=0.6) if v not in close]
        return [f"{dataset_id} {v}" for v in close[:4]]
    ids = sorted({e.dataset_id for e in entries})
    return [
        f"{i} {version}"
        for i in difflib.get_close_matches(dataset_id, ids, n=4, cutoff=0.6)
        if any(e.dataset_id == i and e.dataset_version == version for e in entries)
    ] or [f"{i} ..." for i in difflib.get_close_matches(dataset_id, ids, n=3, cutoff=0.6)]


def _not_found_message(store: Store, args: argparse.Namespace, error: CacheNotFoundError) -> str:
    dataset_id, version = getattr(args, "dataset_id", None), getattr(args, "version", None)
    if dataset_id is None or version is None:
        return str(error)
    try:
        where = store.location(dataset_id, version)
    except YogaCacheError:
        return str(error)
    # About a remote cache: name the remote, not the local copies' directory.
    about_remote = args.command in ("info", "pull") or (args.command == "rm" and args.remote)
    if store.remote_url is not None and about_remote:
        message = f"no cache {dataset_id} {version} at {where}"
    else:
        message = str(error)
    suggestions = _suggestions(store, dataset_id, version)
    if suggestions:
        message += "; did you mean: " + ", ".join(suggestions) + "?"
    return message


def _missing_library(error: ImportError) -> str:
    text = str(error)
    if "pip install" in text:
        return text
    name = error.name or text
    return f"a library this needs is not installed ({name}): {text}"


# What a program killed by SIGPIPE exits with (``yes | head``): the reader of stdout went away.
EXIT_STDOUT_GONE = 128 + 13


def _stdout_gone() -> bool:
    """Whether the reader of stdout went away (``yogacache ls | head``); if so, stdout is pointed
    at /dev/null, as Python's documentation of SIGPIPE advises, so that the interpreter's last
    flush on exit does not fail again."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        gone = any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll, or stdout is no file
        return False
    if gone:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return gone


# -- the parser --------------------------------------------------------------------------------
def _add_global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """``--storage`` and friends; a subcommand's copies default to SUPPRESS so that options given
    before the subcommand are not reset by it."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--storage",
        default=default(None),
        metavar="DIR|URL|FILE",
        help="where caches are: a directory, s3://bucket/prefix, gs://bucket/prefix, file:///path, "
        f"or a JSON/YAML data_layer config file (default ${STORAGE_ENV}, else {default_cache_root()})",
    )
    parser.add_argument(
        "--endpoint-url", default=default(None), help="S3 endpoint URL (default: $AWS_ENDPOINT_URL or AWS)"
    )
    parser.add_argument(
        "--local-cache",
        default=default(None),
        metavar="DIR",
        help="root of node-local copies of remote caches (default: the local default store)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=default(False), help="log what happens")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="yogacache",
        description="Manage yogacache dataset caches: local directories, S3 (s3://) and GCS (gs://).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"yogacache {__version__}")
    _add_global_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, suppress=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(
        name: str, run: Callable[[Store, argparse.Namespace], int], help_text: str, epilog: str = ""
    ) -> argparse.ArgumentParser:
        made = sub.add_parser(
            name,
            parents=[common],
            help=help_text,
            description=help_text,
            epilog=epilog or None,
            formatter_class=HelpFormatter,
        )
        made.set_defaults(run=run)
        return made

    def cache_arguments(made: argparse.ArgumentParser) -> None:
        made.add_argument("dataset_id")
        made.add_argument("version")

    ls = command(
        "ls",
        cmd_ls,
        "list caches",
        "examples:\n  yogacache ls\n  yogacache ls --storage s3://bucket/caches --endpoint-url http://localhost:9000\n"
        "\nRECORDS: records in the cache; DISK: bytes of its LMDB files. A cache whose manifest\n"
        "cannot be read is listed with a number pointing to the reason below the table.",
    )
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")

    info = command(
        "info", cmd_info, "show a cache's records, sizes and element spec", "example:\n  yogacache info mnist v1"
    )
    cache_arguments(info)
    info.add_argument("--json", action="store_true", help="print the manifest as JSON")

    verify = command("verify", cmd_verify, "re-hash a cache's parts (exit 1 on mismatch)")
    cache_arguments(verify)
    verify.add_argument(
        "--source", dest="check_source", action="store_true",
        help="check instead that the source objects it was imported from are unchanged (no download)",
    )

    rm = command(
        "rm",
        cmd_rm,
        "remove one cache (remote storages: the local copy, --remote, or both)",
        "examples:\n  yogacache rm mnist v1\n  yogacache rm mnist v1 --remote --local -y --storage s3://bucket/caches",
    )
    cache_arguments(rm)
    rm.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    rm.add_argument("--remote", action="store_true", help="remove the published cache")
    rm.add_argument("--local", action="store_true", help="remove the local copy (default without --remote)")

    build = command(
        "build",
        cmd_build,
        "build (or rebuild) a cache from a function returning a dataset",
        "examples:\n  yogacache build mnist v1 my_project.data:make_dataset\n"
        "  yogacache build mnist v1 data.py:make --workers 2",
    )
    cache_arguments(build)
    build.add_argument(
        "function",
        metavar="MODULE:FUNCTION",
        help="a function taking no arguments that returns a tf.data.Dataset, torch dataset or iterable",
    )
    build.add_argument(
        "--workers",
        type=positive_int,
        help="build with this many processes (the cache is the same for any number)",
    )
    build.add_argument(
        "--build-shards",
        type=positive_int,
        metavar="K",
        help="call FUNCTION(shard_index=i, num_shards=K) for i < K, one build shard each (a tf.data builder)",
    )

    pull = command("pull", cmd_pull, "download (or refresh) the local copy of a remote cache")
    cache_arguments(pull)

    push = command(
        "push",
        cmd_push,
        "publish a local cache to the remote storage",
        "The cache is taken from the remote storage's local copies, else from the local default\n"
        f"store ({default_cache_root()}), or from --from DIR.\n\n"
        "example:\n  yogacache push mnist v1 --storage s3://bucket/caches",
    )
    cache_arguments(push)
    push.add_argument("--from", dest="source", metavar="DIR", help="the cache directory to publish from")

    copy_command = command(
        "copy",
        cmd_copy,
        "copy a published cache to another storage (bucket, region, cloud, shared directory)",
        "The copy keeps the cache's build id, creation time and part hashes; parts go first and\n"
        "are checked against the CRC32C the destination computed, then the manifest is created\n"
        "conditionally. Within one S3 endpoint, or within GCS, parts are copied server-side.\n"
        "Run the same command again after an interruption: verified parts are kept.\n\n"
        "examples:\n  yogacache copy mnist v1 --from s3://far-bucket/caches \\\n      --to s3://near-bucket/caches\n"
        "  yogacache copy mnist v1 --from s3://bucket/caches --to gs://bucket/caches",
    )
    cache_arguments(copy_command)
    copy_command.add_argument("--from", dest="copy_from", metavar="SRC", required=True, help="storage to copy from")
    copy_command.add_argument("--to", dest="copy_to", metavar="DST", required=True, help="storage to copy to")
    copy_command.add_argument(
        "--replace", action="store_true", help="replace another build published at the destination"
    )
    copy_command.add_argument("--threads", type=int, default=8, help="parts copied at once (default 8)")

    migrate = command(
        "migrate",
        cmd_migrate,
        "convert a YogaDL 0.1.4 cache (<id>/<version>/cache.mdb) into a yogacache cache",
        "The cache beside it is published too, for s3:// and gs:// storages. Its pickles are read\n"
        "by a restricted unpickler that never runs code; cache.mdb itself is left as it was.\n\n"
        "example:\n  yogacache migrate mnist v1 --storage /data/yogadl",
    )
    cache_arguments(migrate)
    migrate.add_argument("--force", action="store_true", help="convert again even if a converted cache is in place")

    gc = command(
        "gc",
        cmd_gc,
        "evict node-local copies and streamed parts down to a byte budget",
        "Never removes what a live process reads, nor a cache's only copy (an unpublished local\n"
        "cache, a shared_fs cache); removes what is needed furthest in the future first.\n\n"
        "examples:\n  yogacache gc --dry-run --storage config.yaml\n  yogacache gc --limit 200Gi --storage s3://bucket/caches",
    )
    gc.add_argument("--dry-run", action="store_true", help="show what would be removed, remove nothing")
    gc.add_argument("--limit", metavar="SIZE", help="the budget (K M G T, Ki Mi Gi Ti); default: local_cache_limit")

    export = command(
        "export",
        cmd_export,
        "write a cache as WebDataset tar shards plus a wids index (shardindex.json)",
        "Each record becomes one sample: arrays as .npy, integers as .cls, strings as .txt, bytes\n"
        "unchanged under the field's own extension (docs/export.md has the rules). The index is\n"
        "written last: a failed export leaves none.\n\n"
        "examples:\n  yogacache export mnist v1 --to /data/mnist-wds\n"
        "  yogacache export mnist v1 --to s3://bucket/mnist-wds --shard-size 256Mi \\\n"
        "      --storage s3://bucket/caches",
    )
    cache_arguments(export)
    export.add_argument("--to", required=True, metavar="DIR|URL", help="a directory, file://, s3:// or gs:// URL")
    export.add_argument("--format", default="webdataset", help="the export format (webdataset)")
    export.add_argument(
        "--shard-size", default="512Mi", metavar="SIZE", help="largest shard: bytes, or K M G (1000s), Ki Mi Gi (1024s)"
    )
    export.add_argument("--shard-records", type=int, metavar="N", help="most samples per shard (default: no limit)")
    export.add_argument("--prefix", help="shard names <prefix>-000000.tar, ... (default <id>-<version>)")
    export.add_argument("--overwrite", action="store_true", help="replace an export at a destination that is not empty")
    export.add_argument("--md5", action="store_true", help="record each shard's MD5 in the index (md5sum)")
    export.add_argument(
        "--ext", action="append", metavar="FIELD=EXT", help="append EXT to FIELD, not its default suffix (repeatable)"
    )
    _add_import_command(command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not args.verbose:
        # The cloud libraries' notices about this Python's support window are not the
        # command's output (google.api_core warns on every import within a year of an EOL).
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    # Progress: a live line on a terminal, log lines otherwise (CI, pipes).
    logging.getLogger("yogacache.progress").setLevel(logging.INFO)
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        for wanted in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(wanted) is not signal.SIG_IGN:  # nohup'd, or in the background
                previous[wanted] = signal.signal(wanted, _on_signal)
    store: Optional[Store] = None
    try:
        store = open_cli_store(
            args.storage, args.endpoint_url, args.local_cache, must_exist=args.command not in ("build", "import")
        )
        code = int(args.run(store, args))
        sys.stdout.flush()  # here, where a reader gone away (``| head``) is handled below
        return code
    except BrokenPipeError as error:
        if not _stdout_gone():
            progress.close_all()
            print(f"yogacache: error: {error}", file=sys.stderr)
            return 1
        progress.close_all()
        return EXIT_STDOUT_GONE
    except KeyboardInterrupt as interrupt:
        progress.close_all()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, _exit_at_once)  # a second Ctrl-C while we finish ends it
            previous.pop(signal.SIGINT, None)
        what = "terminated (SIGTERM)" if isinstance(interrupt, Terminated) else "interrupted"
        outcome = {
            "build": "nothing was cached",
            "import": "nothing was cached",
            "pull": "the local copy is as it was",
            "push": "nothing was published",
            "rm": "see what is left with yogacache ls",
            "copy": "nothing was published; run the same command again to resume",
            "export": "no index was written",
        }.get(args.command, "nothing was changed")
        print(f"yogacache: {what}: {args.command} stopped, {outcome}", file=sys.stderr)
        return 143 if isinstance(interrupt, Terminated) else 130
    except CacheNotFoundError as error:
        progress.close_all()
        message = _not_found_message(store, args, error) if store is not None else str(error)
        print(f"yogacache: error: {message}", file=sys.stderr)
        return 1
    except (YogaCacheError, OSError) as error:
        progress.close_all()
        print(f"yogacache: error: {error}", file=sys.stderr)
        return 1
    except ImportError as error:
        progress.close_all()
        print(f"yogacache: error: {_missing_library(error)}", file=sys.stderr)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
