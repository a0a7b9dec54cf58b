"""The CLI reference, generated from the argparse parser so it cannot drift from ``yogacache -h``.

An MkDocs hook (``hooks:`` in mkdocs.yml): ``on_page_markdown`` replaces the marker
``<!-- cli-reference -->`` in docs/cli.md with one section per command (usage, arguments,
options, examples), rendered by ``render()``. ``python docs/gen_cli.py`` prints that Markdown.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

from yogacache.cli.parser import build_parser
from yogacache.store.local import default_cache_root

MARKER = "<!-- cli-reference -->"
WIDTH = 100  # usage lines wrap here, whatever the terminal of whoever builds the docs


def _neutral(text: str) -> str:
    """Help text without this machine's home directory (the local default store's path)."""
    root = str(default_cache_root())
    text = re.sub(rf"the local default(\s+)store \({re.escape(root)}\)", r"the local default\1store", text)
    return text.replace(root, "the local default store")


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return parser.formatter_class(prog=parser.prog, width=WIDTH)  # type: ignore[call-arg]


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:  # type: ignore[type-arg]
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = _formatter(parser)
    if not action.option_strings:
        return formatter._metavar_formatter(action, action.dest)(1)[0]
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"{option} {metavar}" for option in action.option_strings)


def _arguments(parser: argparse.ArgumentParser, skip: set[str]) -> list[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.dest in skip:
            continue
        if action.help == argparse.SUPPRESS:
            continue
        text = _neutral(_formatter(parser)._expand_help(action)) if action.help else ""
        if action.choices and not isinstance(action.choices, dict):
            text = f"{text} (one of: {', '.join(f'`{choice}`' for choice in action.choices)})".strip()
        if action.required and action.option_strings:
            text += " (required)"
        lines.append(f"- `{_invocation(parser, action)}`" + (f": {text}" if text else ""))
    return lines


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = _formatter(parser)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="usage: ")
    return _neutral(formatter.format_help().strip())


def _epilog(parser: argparse.ArgumentParser) -> list[str]:
    if not parser.epilog:
        return []
    return ["```text", _neutral(parser.epilog.strip("\n")), "```", ""]


GLOBAL = {"storage", "endpoint_url", "local_cache", "verbose"}


def render(parser: Any = None) -> str:
    """The Markdown of the reference: the global options, then each command in parser order."""
    parser = parser or build_parser()
    commands = _subcommands(parser)
    out = [
        f"`{parser.prog}`: {parser.description}",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        "## Global options",
        "",
        "They go before or after the command (`yogacache --storage s3://bucket/caches ls`).",
        "",
        *_arguments(parser, skip=set()),
        "",
        *_epilog(parser),
        "## Commands",
        "",
    ]
    for choice in commands._choices_actions:
        out.append(f"- [`{parser.prog} {choice.dest}`](#{parser.prog}-{choice.dest}): {choice.help}")
    out.append("")
    for name, sub in commands.choices.items():
        out += [
            f"### {parser.prog} {name}",
            "",
            f"{sub.description[0].upper()}{sub.description[1:]}." if sub.description else "",
            "",
            "```text",
            _usage(sub),
            "```",
            "",
            *_arguments(sub, skip=GLOBAL),
            "",
            *_epilog(sub),
        ]
    return "\n".join(out).rstrip("\n") + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """The MkDocs hook: the CLI page gets the reference where its marker is."""
    if MARKER in markdown:
        return markdown.replace(MARKER, render())
    return markdown


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", str(WIDTH))
    print(render(), end="")
