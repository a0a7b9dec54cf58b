"""The matrix's axes, the combinations that cannot exist (each with its reason), and the all-pairs
cells: every pair of values of two axes that some valid combination holds is in at least one cell.

``allpairspy`` generates the cells under ``valid``; a pair it leaves out (a constraint can make
its greedy search miss one) is added with the first valid combination that holds it, so the
covering is checked, not hoped for (``uncovered_pairs``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

AXES: dict[str, tuple[str, ...]] = {
    "store": ("local", "shared_fs", "s3", "gcs", "azure"),
    "made": ("one", "workers2", "ray", "import", "copy", "mirror", "migrate"),
    "delivery": ("sync", "stream-full", "stream-half"),
    "order": ("none", "shard", "global", "parts-w1", "parts-w2", "parts"),
    # "grain": yogacache.grain's CacheSampler and CacheDataSource through grain.DataLoader; "ray":
    # yogacache.ray.read_cache's Dataset on a local Ray cluster (issue 26).
    "consumer": ("stream", "dataset", "tf", "torch", "grain", "ray"),
    # "legacy": a mid-epoch resume state as a release before the "parts" order's lead wrote it
    # (no ``parts_order``): the rest of its epoch in that order, then this release's.
    # "changed": "mid" resumed with a setting changed (issue 33): the state was saved on a node
    # with another budget (four parts: a narrower "parts" window), which the resume honours
    # exactly; a changed shuffle flag is refused, naming it.
    "start": ("zero", "mid", "elastic", "legacy", "changed"),
    "size": ("one", "many", "rec1"),
    # "mixture": three caches made, stored and delivered alike (the first of the size's records,
    # the others smaller), read as one ``yogacache.Mixture`` at weights 5:3:2 (issue 25).
    "mix": ("one", "mixture"),
}
NAMES = tuple(AXES)

REMOTE = ("s3", "gcs", "azure")
RESUMABLE_AT_ANY_WORLD_SIZE = ("global", "parts-w1", "parts-w2", "parts")

# Why a combination cannot exist: (axis, value, axis, value, reason) means that those two values
# never meet. Each reason is what the documentation says.
EXCLUDED: tuple[tuple[str, str, str, str, str], ...] = tuple(
    [
        (
            "store", store, "delivery", delivery,
            "a local or shared_fs storage is read in place: nothing is synced or streamed (docs/streaming.md)",
        )
        for store in ("local", "shared_fs")
        for delivery in ("stream-full", "stream-half")
    ]
    + [
        (
            "store", store, "made", "ray",
            "a Ray build publishes to an object store (S3, GCS, or a file:// bucket layout), not into a "
            "directory store's sealed cache directories (docs/parallel-build.md)",
        )
        for store in ("local", "shared_fs")
    ]
    + [
        ("store", store, "made", "mirror", "mirrors are S3 or GCS storages (docs/copy.md)")
        for store in ("local", "shared_fs")
    ]
    + [
        (
            "made", "mirror", "delivery", delivery,
            "mirrors cannot be combined with streaming or local_cache_limit yet (store.factory raises ConfigError)",
        )
        for delivery in ("stream-full", "stream-half")
    ]
    + [
        (
            "size", "one", "delivery", "stream-half",
            "half of a one-part cache is below the smallest budget a streamed read works in (one part: "
            "store.streaming.minimum_budget refuses it with ConfigError)",
        )
    ]
    + [
        (
            "order", order, "start", "elastic",
            "a resume state of YogaDL's shard order is valid for the same rank and number of ranks only "
            "(docs/shuffle.md); its mid-epoch resume is the 'mid' start",
        )
        for order in ("none", "shard")
    ]
    + [
        (
            "mix", "mixture", "start", "legacy",
            "a mixture's resume state (mode 'mixture') is a position in the mixed order: there is no "
            "state of a mixture without parts_order, which only single caches' states of the parts "
            "orders before the lead lacked (yogacache.read.mixture_order.MixtureState, docs/shuffle.md)",
        )
    ]
    + [
        (
            "size", "one", "start", "changed",
            "a one-part cache is read in one window whatever the node budget (docs/shuffle.md): a budget "
            "changed between save and resume changes nothing in its order ('mid' resumes it)",
        )
    ]
    + [
        (
            "order", order, "start", "legacy",
            "a state without parts_order differs from this release's only in the parts orders "
            "(docs/shuffle.md: the lead); YogaDL's shard order resumes by start_offset",
        )
        for order in ("none", "shard", "global")
    ]
)


def _excluded_pairs() -> dict[frozenset[tuple[str, str]], str]:
    return {frozenset({(a, x), (b, y)}): reason for a, x, b, y, reason in EXCLUDED}


_EXCLUDED = _excluded_pairs()


def valid(values: Sequence[str]) -> bool:
    """Whether the (partial) combination ``values``, in the order of ``AXES``, can exist."""
    named = list(zip(NAMES, values))
    return not any(frozenset(pair) in _EXCLUDED for pair in itertools.combinations(named, 2))


def exclusion_reason(cell: dict[str, str]) -> Optional[str]:
    for pair in itertools.combinations(cell.items(), 2):
        reason = _EXCLUDED.get(frozenset(pair))
        if reason:
            return reason
    return None


@dataclass(frozen=True)
class Cell:
    store: str
    made: str
    delivery: str
    order: str
    consumer: str
    start: str
    size: str
    mix: str = "one"

    @property
    def id(self) -> str:
        return "-".join(f"{name}={getattr(self, name)}" for name in NAMES)

    @property
    def slow(self) -> bool:
        return self.made == "ray" or self.consumer in HEAVY_CONSUMERS

    def values(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in NAMES)


def _valid_pairs(names: Sequence[str] = NAMES) -> set[frozenset[tuple[str, str]]]:
    """Every pair of values (of two axes of ``names``) that some valid full combination holds.

    The exclusions are pairwise, so a pair is possible when it is not excluded itself and each
    other axis has a value compatible with both (checked directly, without the full product)."""
    pairs = set()
    for (a, b) in itertools.combinations(names, 2):
        for x in AXES[a]:
            for y in AXES[b]:
                if frozenset({(a, x), (b, y)}) in _EXCLUDED:
                    continue
                if _completion({a: x, b: y}) is not None:
                    pairs.add(frozenset({(a, x), (b, y)}))
    return pairs


def _completion(fixed: dict[str, str]) -> Optional[tuple[str, ...]]:
    """The first valid full combination holding ``fixed`` (depth-first, in axis order)."""

    def extend(prefix: list[str]) -> Optional[list[str]]:
        if len(prefix) == len(NAMES):
            return prefix
        name = NAMES[len(prefix)]
        for value in ([fixed[name]] if name in fixed else AXES[name]):
            if valid(prefix + [value]):
                found = extend(prefix + [value])
                if found:
                    return found
        return None

    found = extend([])
    return tuple(found) if found else None


def _pairs_of(values: Sequence[str]) -> set[frozenset[tuple[str, str]]]:
    return {frozenset(pair) for pair in itertools.combinations(zip(NAMES, values), 2)}


def uncovered_pairs(cells: Sequence[Cell], names: Sequence[str] = NAMES) -> set[frozenset[tuple[str, str]]]:
    """The possible pairs of values of two axes of ``names`` that no cell holds."""
    covered: set[frozenset[tuple[str, str]]] = set()
    for cell in cells:
        covered |= _pairs_of(cell.values())
    return _valid_pairs(names) - covered


# The axes of single caches: the cells over them are generated first, as they were before the
# "mix" axis (each reading one cache); the mixture's pairs are then added by greedy rows, so a
# new axis adds its own cells without reshuffling the others.
SINGLE = tuple(name for name in NAMES if name != "mix")


# Values added after the first cells were generated: their pairs are covered by greedy rows
# added to those cells (as the "mix" axis's), not by generating every cell anew.
LATER: dict[str, tuple[str, ...]] = {"start": ("changed",)}


def generate() -> list[Cell]:
    """The all-pairs cells, deterministic (allpairspy's search is, and so is the top-up)."""
    from allpairspy import AllPairs

    first = [[value for value in AXES[name] if value not in LATER.get(name, ())] for name in SINGLE]
    rows = [tuple(row) for row in AllPairs(first, filter_func=valid)]
    cells = [Cell(*row) for row in rows]
    missing = uncovered_pairs(cells, SINGLE)
    while missing:
        row = _greedy_row(min(missing, key=sorted), missing)
        cells.append(Cell(*row))
        missing -= _pairs_of(row)
    cells = _cheapened(cells, SINGLE)
    single = len(cells)
    missing = uncovered_pairs(cells)  # the mixture's pairs
    while missing:
        row = _greedy_row(min(missing, key=sorted), missing)
        cells.append(Cell(*row))
        missing -= _pairs_of(row)
    return _cheapened(cells, NAMES, first=single)


# Heavy values, and what a cell may take instead where no pair needs the heavy one there.
HEAVY_CONSUMERS = ("torch", "grain", "ray")
CHEAPER: tuple[tuple[str, str, tuple[str, ...]], ...] = tuple(
    [("consumer", heavy, ("stream", "dataset", "tf")) for heavy in HEAVY_CONSUMERS]
    + [("made", "ray", ("one", "workers2"))]
)


def _cheapened(cells: list[Cell], names: Sequence[str] = NAMES, first: int = 0) -> list[Cell]:
    """``cells`` with each heavy value (a torch, Grain or Ray consumer, a Ray build) replaced by a cheap one
    wherever every pair (of axes of ``names``) stays covered, from cell ``first`` on: spawned
    DataLoader workers and Ray tasks cost seconds each, and all-pairs needs only as many of them
    as the pairs they take part in."""
    cells = list(cells)
    for i in range(first, len(cells)):
        for name, heavy, cheap in CHEAPER:
            if getattr(cells[i], name) != heavy:
                continue
            for value in cheap:
                values = dict(zip(NAMES, cells[i].values()))
                values[name] = value
                trial = Cell(**values)
                if not valid(trial.values()):
                    continue
                others = cells[:i] + [trial] + cells[i + 1 :]
                if not uncovered_pairs(others, names):
                    cells[i] = trial
                    break
    unique: dict[str, Cell] = {}
    for cell in cells:
        unique.setdefault(cell.id, cell)
    return list(unique.values())


def _greedy_row(pair: frozenset[tuple[str, str]], missing: set[frozenset[tuple[str, str]]]) -> tuple[str, ...]:
    """A valid combination holding ``pair`` that, axis by axis, takes the value covering the most
    ``missing`` pairs with the values chosen so far (AETG's greedy step)."""
    fixed = dict(pair)
    chosen: dict[str, str] = dict(fixed)
    for name in NAMES:
        if name in chosen:
            continue
        best: Optional[tuple[int, str]] = None
        for value in AXES[name]:
            trial = {**chosen, name: value}
            if _completion(trial) is None:
                continue
            gain = sum(frozenset({(name, value), item}) in missing for item in chosen.items())
            if best is None or gain > best[0]:
                best = (gain, value)
        assert best is not None, (pair, chosen)
        chosen[name] = best[1]
    return tuple(chosen[name] for name in NAMES)


CELLS = generate()

# Cells outside the all-pairs covering: a value that matters where one construction is, read by
# a few cells of its own rather than paired with every value of every axis. Size "blocks": a
# mixture whose epoch spans three blocks of its interleaving (BLOCK_SIZE draws each,
# yogacache.read.mixture_order, issue 34), so reads, ranks and resumes cross block boundaries
# (a "mid" state lands near the first); its oracle sorts each epoch's keys at once.
EXTRA_CELLS: tuple[Cell, ...] = (
    Cell("local", "one", "sync", "global", "stream", "mid", "blocks", "mixture"),
    Cell("s3", "workers2", "stream-full", "parts", "dataset", "elastic", "blocks", "mixture"),
    Cell("shared_fs", "one", "sync", "none", "tf", "zero", "blocks", "mixture"),
    Cell("local", "workers2", "sync", "parts-w1", "stream", "changed", "blocks", "mixture"),
)
