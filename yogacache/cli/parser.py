"""The command line: global options, each command's arguments, help text and examples."""

from __future__ import annotations

import argparse
import importlib
import textwrap
from typing import Any, Callable, NoReturn

from yogacache import redaction
from yogacache.cli.build import cmd_build
from yogacache.cli.caches import cmd_gc, cmd_info, cmd_ls, cmd_pull, cmd_push, cmd_rm, cmd_verify
from yogacache.cli.copies import cmd_copy, cmd_export, cmd_migrate
from yogacache.cli.sources import cmd_import
from yogacache.cli.stores import STORAGE_ENV
from yogacache.store import Store
from yogacache.store.local import default_cache_root
from yogacache.version import __version__

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

--storage takes a directory, an s3://bucket/prefix, gs://bucket/prefix or az://container/prefix
URL, a file:// URL, or a JSON/YAML file holding Determined's data_layer mapping; default
${STORAGE_ENV}, else the local default store ({default_cache_root()}). Global options go before or after the command.
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


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """``--storage`` and friends; a subcommand's copies default to SUPPRESS so that options given
    before the subcommand are not reset by it."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--storage",
        default=default(None),
        metavar="DIR|URL|FILE",
        help="where caches are: a directory, s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, "
        "file:///path, "
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


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, its usage errors scrubbed of secrets (``unrecognized arguments:``
    repeats what was typed, a URL with a key included)."""

    def error(self, message: str) -> NoReturn:
        super().error(redaction.redact_text(message))


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="yogacache",
        description="Manage yogacache dataset caches: local directories, S3 (s3://), GCS (gs://) and Azure (az://).",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"yogacache {__version__}")
    _add_global_options(parser, suppress=False)
    common = ArgumentParser(add_help=False)
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
        made.set_defaults(run=run, command_parser=made)
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
    part_bytes_argument(build)

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
    part_bytes_argument(made)


def part_bytes_argument(command: argparse.ArgumentParser) -> None:
    """``--part-bytes SIZE``: where the build rolls to a new part (a command that builds)."""
    command.add_argument(
        "--part-bytes",
        metavar="SIZE",
        help="the largest a part file may be, LMDB's pages included: a build rolls to a new part before a "
        "record would take it past this size (a single larger record gets a part of its own); K M G T, "
        "Ki Mi Gi Ti; at least 1Mi; default: the storage config's part_bytes, else 1Gi on a directory and "
        "64Mi on S3, GCS, Azure; smaller parts start a streamed read sooner",
    )
