"""The ``yogacache`` command: list, inspect, verify, remove, build, pull and push caches.

``main`` runs it (``entry``); ``build_parser`` is its command line (``parser``); the
commands live by what they work on: ``caches`` (ls, info, verify, rm, pull, push, gc), ``build``,
``copies`` (copy, export, migrate) and ``sources`` (import); ``tables`` formats what they print,
``stores`` opens the storage they name.
"""

from yogacache.cli.build import cmd_build, load_callable
from yogacache.cli.caches import cmd_gc, cmd_info, cmd_ls, cmd_pull, cmd_push, cmd_rm, cmd_verify
from yogacache.cli.copies import cmd_copy, cmd_export, cmd_migrate
from yogacache.cli.entry import EXIT_STDOUT_GONE, Terminated, main
from yogacache.cli.parser import EXAMPLES, HelpFormatter, build_parser, positive_int
from yogacache.cli.sources import cmd_import
from yogacache.cli.stores import STORAGE_ENV, open_cli_store
from yogacache.cli.tables import print_table, shorten_path, spec_lines, wrap_name

__all__ = [
    "EXAMPLES",
    "EXIT_STDOUT_GONE",
    "STORAGE_ENV",
    "HelpFormatter",
    "Terminated",
    "build_parser",
    "cmd_build",
    "cmd_copy",
    "cmd_export",
    "cmd_gc",
    "cmd_import",
    "cmd_info",
    "cmd_ls",
    "cmd_migrate",
    "cmd_pull",
    "cmd_push",
    "cmd_rm",
    "cmd_verify",
    "load_callable",
    "main",
    "open_cli_store",
    "positive_int",
    "print_table",
    "shorten_path",
    "spec_lines",
    "wrap_name",
]
