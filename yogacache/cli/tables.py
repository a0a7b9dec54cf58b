"""What the commands print: fixed-width tables fitted to the terminal, dates, element specs."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Optional, Sequence

from yogacache.format.manifest import Manifest
from yogacache.format.spec import Spec, TensorSpec


def format_created(manifest: Manifest, seconds: bool = True) -> str:
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


def _without(header: list[str], rows: list[list[str]], names: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """The table without the columns ``names``."""
    keep = [i for i, name in enumerate(header) if name not in names]
    return [header[i] for i in keep], [[r[i] for i in keep] for r in rows]


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
    full_header, full_rows = header, rows
    left_out: list[str] = []
    for name in optional:
        if name in header and total(rows) > width:
            left_out.append(name)
            header, rows = _without(full_header, full_rows, left_out)
    # A column left out to make room that the room made fits again comes back (the last one
    # left out first: it was needed least), in its place.
    for name in reversed(list(left_out)):
        trial = [other for other in left_out if other != name]
        trial_header, trial_rows = _without(full_header, full_rows, trial)
        widths = [max(_cell_width(r[c]) for r in [trial_header, *trial_rows]) for c in range(len(trial_header))]
        if sum(widths) + 2 * (len(widths) - 1) <= width:
            left_out, header, rows = trial, trial_header, trial_rows
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
