"""One figure for the benchmarks' ``--plot``: matplotlib, no display, one look for every page."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def figure(path: str, *, title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False) -> Iterator[Any]:
    """The axes to draw on; labelled, gridded, given a legend and saved to ``path`` on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn, axes = plt.subplots(figsize=(8, 4.8), dpi=110)
    axes.set_prop_cycle(color=plt.get_cmap("tab20").colors)
    if logx:
        axes.set_xscale("log")
    if logy:
        axes.set_yscale("log")
    yield axes
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    drawn.tight_layout()
    drawn.savefig(path)
    plt.close(drawn)
    print(f"plot written to {path}", file=sys.stderr, flush=True)
