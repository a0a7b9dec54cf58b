"""``main()``: runs a command and turns how it ended into a message and an exit code (errors,
Ctrl-C and SIGTERM, a reader of stdout gone away)."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import select
import signal
import sys
import threading
import warnings
from types import FrameType
from typing import Any, Optional, Sequence

from yogacache import progress, redaction
from yogacache.backends.base import ENDPOINT_HINT
from yogacache.cli.parser import build_parser
from yogacache.cli.stores import open_cli_store
from yogacache.errors import CacheNotFoundError, CorruptCacheError, YogaCacheError
from yogacache.store import Store


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


# -- errors ------------------------------------------------------------------------------------
def _hint(entries: list[Any], dataset_id: str, version: str) -> str:
    """What to say after "no cache X V": the caches whose names are close to the one asked for
    (``n20000`` -> ``n20000_train``), else, for a dataset that exists, its versions."""
    versions = sorted({e.dataset_version for e in entries if e.dataset_id == dataset_id} - {version})
    if versions:
        close = [v for v in versions if v.startswith(version)]
        close += [v for v in difflib.get_close_matches(version, versions, n=4, cutoff=0.6) if v not in close]
        if not close:
            shown = ", ".join(versions[:8]) + (f" and {len(versions) - 8} more" if len(versions) > 8 else "")
            return f"; {dataset_id} has version(s): {shown}"
        suggestions = [f"{dataset_id} {v}" for v in close[:4]]
    else:
        ids = sorted({e.dataset_id for e in entries} - {dataset_id})
        suggestions = [
            f"{i} {version}"
            for i in difflib.get_close_matches(dataset_id, ids, n=4, cutoff=0.6)
            if any(e.dataset_id == i and e.dataset_version == version for e in entries)
        ] or [f"{i} ..." for i in difflib.get_close_matches(dataset_id, ids, n=3, cutoff=0.6)]
    return "; did you mean: " + ", ".join(suggestions) + "?" if suggestions else ""


def _not_found_message(store: Store, args: argparse.Namespace, error: CacheNotFoundError) -> str:
    dataset_id, version = getattr(args, "dataset_id", None), getattr(args, "version", None)
    if dataset_id is None or version is None:
        return str(error)
    try:
        where = store.location(dataset_id, version)
    except YogaCacheError:
        return str(error)
    try:
        entries = list(store.list())
    except Exception:  # a hint is a courtesy: never let it hide the real error
        entries = []
    # About a remote cache: name the remote, not the local copies' directory.
    about_remote = args.command in ("info", "pull") or (args.command == "rm" and args.remote)
    if store.remote_url is None or not about_remote:
        message = str(error)
        published = any(e.dataset_id == dataset_id and e.dataset_version == version for e in entries)
        if store.remote_url is not None and published:
            # Published, with no copy on this node: the name was right, the copy is missing.
            also = ""
            if args.command == "rm":
                also = f"; `yogacache rm {dataset_id} {version} --remote` removes the published one"
            return (
                f"no local copy of {dataset_id} {version} on this node (it is published at {where}): "
                f"`yogacache pull {dataset_id} {version}` fetches it{also}"
            )
    else:
        message = f"no cache {dataset_id} {version} at {where}"
    return message + _hint(entries, dataset_id, version)


def _corrupt_next_step(store: Store, args: argparse.Namespace) -> str:
    """What to do about a damaged cache the command named: fetch a good copy where one is
    published, else remove it and build it again."""
    dataset_id, version = getattr(args, "dataset_id", None), getattr(args, "version", None)
    if dataset_id is None or version is None:
        return ""
    if store.remote_url is not None and args.command not in ("push",):
        return (
            f"; next: `yogacache pull {dataset_id} {version}` fetches the published copy again "
            f"(`yogacache rm {dataset_id} {version}` removes this node's copy)"
        )
    return f"; next: `yogacache rm {dataset_id} {version}` and build it again"


def _in_cli_terms(message: str, command: Optional[argparse.ArgumentParser]) -> str:
    """The library's messages name its keyword arguments (``on_source_change='rebuild'``); from
    the command line, the same advice names the command's options (``--on-source-change rebuild``)."""
    if command is None:
        return message
    for action in command._actions:  # argparse keeps no public list of a parser's options
        flags = [flag for flag in action.option_strings if flag.startswith("--")]
        if not flags:
            continue
        keyword = flags[0][2:].replace("-", "_")
        message = re.sub(rf"\b{keyword}=(['\"])([^'\"]*)\1", rf"{flags[0]} \2", message)
    return message


def _missing_library(error: ImportError) -> str:
    text = str(error)
    if "pip install" in text:
        return text
    name = error.name or text
    return f"a library this needs is not installed ({name}): {text}"


def _print_error(message: str, error: Optional[BaseException] = None) -> None:
    """``yogacache: error: message`` on stderr, after ``error``'s traceback when given (a
    failure no handler names: a bug's, or a library's); both scrubbed of secrets
    (``yogacache.redaction``)."""
    if error is not None:
        print(redaction.format_exception(error), end="", file=sys.stderr)
    print(f"yogacache: error: {redaction.redact_text(message)}", file=sys.stderr)


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):  # no command: say which there are
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    redaction.add_to_handlers(logging.getLogger().handlers)  # what -v prints, any library's records too
    # -v says what yogacache does; the cloud SDKs' per-request INFO records (Azure logs every
    # request's and response's headers) are theirs: their warnings and errors still show.
    for sdk in ("azure", "botocore", "boto3", "s3transfer", "google", "urllib3"):
        logging.getLogger(sdk).setLevel(logging.WARNING)
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
            args.storage,
            args.endpoint_url,
            args.local_cache,
            must_exist=args.command not in ("build", "import"),
            part_bytes=getattr(args, "part_bytes", None),
        )
        code = int(args.run(store, args))
        sys.stdout.flush()  # here, where a reader gone away (``| head``) is handled below
        return code
    except BrokenPipeError as error:
        if not _stdout_gone():
            progress.close_all()
            _print_error(str(error))
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
        _print_error(message)
        return 1
    except (YogaCacheError, OSError) as error:
        progress.close_all()
        message = _in_cli_terms(str(error), getattr(args, "command_parser", None))
        if getattr(args, "endpoint_url", None):  # the endpoint that failed is the one passed
            message = message.replace(ENDPOINT_HINT, "check --endpoint-url")
        if isinstance(error, CorruptCacheError) and store is not None:
            message += _corrupt_next_step(store, args)
        _print_error(message)
        return 1
    except ImportError as error:
        progress.close_all()
        _print_error(_missing_library(error))
        return 1
    except Exception as error:  # a bug, or a library's failure no handler above names: its traceback
        progress.close_all()
        _print_error(f"{type(error).__name__}: {error}", error)
        return 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
