"""The ``"parts"`` shuffle mode: each epoch permutes the cache's parts and mixes records across
a window of a few parts at a time, so that a rank (and a node) needs few parts at once and only
its share of them per epoch: the order made for streaming parts from a remote cache.

One epoch, with seed ``s`` and key epoch ``κ`` (the epoch, or 0 without reshuffling):

1. **Part order.** The parts are permuted by the keyed permutation of ``(s, κ)``; laying their
   records end to end in that order gives the epoch's record line ``Q`` (positions ``[0, N)``).
2. **Split.** ``Q`` is cut into one contiguous run per node (``ranks_per_node`` consecutive
   ranks; 1 by default), sized so that rank ``r`` of ``S`` reads ``⌈(N - r) / S⌉`` records
   (``N // S`` with ``drop_shard_remainder``), as in the other modes. A node's ranks deal its run
   out position by position (local rank ``l`` reads positions ``l, l + R, …``), so they read the
   same few parts at the same time, and a node fetches its own run's parts: its share of the
   dataset, plus the parts it shares with its neighbours at the two ends of its run.
3. **Staggered window** of ``w = parts_window`` parts. The parts of a run (the two end ones
   possibly cut) are its segments ``0 … K-1``; each segment is split into ``w`` slices of a
   keyed random subset of its records. Stage ``t`` holds slice ``t - i`` of every segment
   ``i`` in ``[t - w + 1, t]``, shuffled together by its own keyed permutation; the run reads
   stage after stage. So every stage mixes up to ``w`` parts, each part is read during ``w``
   consecutive stages, one new part starts per stage and one ends: a reader needs ``w`` parts
   at a time and one more to read ahead.
4. **Lead.** A run's first segment is cut unevenly: its slice 0 is half of it (the other half
   cut in ``w - 1`` slices), so the first stage, read while only the run's first part is on the
   node, holds half a part: a streamed reader's first batches need that one part, fetched alone
   (with equal slices the first batch of large records spanned three parts). Resume states say
   which order they were taken in (``parts_order``: 2 with the lead; a state without it, from a
   release before it, resumes in the order without it).

Nothing is stored per record: a plan maps positions to records on demand (two permutation
evaluations per record), and an epoch's set-up is O(parts) numpy work (the part permutation and
its cumulative record counts; the stage table of one run).

Resume, at any world size. A state holds the split it was taken with (``num_shards``,
``ranks_per_node``), the records each rank had read of it (``consumed``) and ``dealt`` (below),
all with the usual ``epoch``, ``seed`` and ``num_records``. Resuming with the same split goes on
where the state says. Resuming with another split cannot keep the old runs (they are cut for the
old ranks): the rest of the epoch, the unread tails of the old runs laid end to end (still in
part order), is dealt out to the new ranks position by position as in ``"global"`` mode, and
``dealt`` counts the positions of it already dealt; that holds for any number of further
restarts. Every remaining record is read exactly once; the epochs after are those of an
uninterrupted run with the new split. Only for the rest of that one epoch does each node read
all of the remaining parts instead of its share.

Pure numpy, no I/O.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Optional

import numpy as np

from yogacache.arguments import as_int
from yogacache.read.layout import PartLayout, PartUse, most_at_once, parts_read_in_order
from yogacache.read.permutation import KeyedPermutation
from yogacache.read.shuffle import SHUFFLE_MODES, EpochPlan, OrderOptions, Point, ResumeState, ShuffleMode, StridedPlan
from yogacache.read.state import ResumeStateError, say_once

__all__ = [
    "DEFAULT_PARTS_WINDOW",
    "PartLayout",
    "budget_window",
    "PartUse",
    "PartsMode",
    "PartsOptions",
    "PartsPlan",
    "RandomReadRefetch",
    "most_at_once",
    "parts_read_in_order",
    "random_read_refetch",
    "shuffle_budget_warning",
]

#: Parts mixed at a time by default: four parts resident (plus one read ahead) per reader.
DEFAULT_PARTS_WINDOW = 4
# Positions at and above this one are positions of the rest of a resumed epoch dealt out anew
# (see PartsMode): ``RESIDUAL + dealt``. Below it, records this rank read of its run.
RESIDUAL = 1 << 62
_CACHED_PERMUTATIONS = 128
# Stages up to this size keep their permutation as a table (32 KiB): one evaluation each.
_TABLE_SIZE = 1 << 12
#: The order a parts plan makes: 2 since a run's first segment leads with half its records
#: (``parts_order`` in resume states; 1, the order before, for states that do not name one).
PARTS_ORDER = 2
_ORDERS = (1, 2)


# -- one epoch: the part order and the runs cut from it ----------------------------------------


def _derived_seed(seed: int, *labels: object) -> int:
    """A seed for one use (``labels``) of ``seed``, independent of its other uses."""
    text = ":".join(str(label) for label in ("yogacache.parts/v1", seed, *labels))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class _Table:
    """A permutation evaluated once, for a small domain: ``map`` looks it up."""

    def __init__(self, permutation: KeyedPermutation) -> None:
        self.table = permutation.map(np.arange(len(permutation), dtype=np.int64))

    def map(self, positions: np.ndarray) -> np.ndarray:
        return self.table[positions]


class _Affine:
    """``o ↦ (a·o + b) mod size``, keyed by ``seed``: which records of a segment go to which
    slice (the stage permutation then orders them). ``a`` is coprime to ``size`` (a bijection)
    and near ``0.618·size``, where consecutive ``o`` land furthest apart (the three-gap
    theorem), so each slice is spread over the whole part; a random offset of up to
    ``size / 8`` and ``b`` change with the seed."""

    #: The largest segment it serves (``a·o`` stays below 2**62).
    LIMIT = 1 << 31

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        jitter, b = divmod(seed, max(1, size))
        spread = max(1, size // 4)
        a = max(1, int(size * 0.6180339887) + jitter % spread - spread // 2)
        while math.gcd(a, size) != 1:
            a += 1
        self.a, self.b = a, b

    def map(self, positions: np.ndarray) -> np.ndarray:
        return (positions * self.a + self.b) % self.size


def _slice_cuts(lengths: np.ndarray, window: int, lead: bool) -> np.ndarray:
    """Where each segment (of ``lengths`` records) is cut into its ``window`` slices: row ``i``
    holds slice starts ``0 … window`` of segment ``i`` (the last one its length). Equal slices;
    with ``lead``, segment 0's slice 0 is half of it and the rest is cut equally."""
    pieces = np.arange(window + 1, dtype=np.int64)
    cuts = (pieces[None, :] * lengths[:, None]) // window
    if lead and window > 1 and len(lengths):
        first = int(lengths[0])
        half = first // 2
        cuts[0, 1:] = half + ((pieces[1:] - 1) * (first - half)) // (window - 1)
    return cuts


class _EpochParts:
    """One epoch's part order and record line ``Q``; runs of ``Q`` built on demand."""

    def __init__(
        self, layout: PartLayout, window: int, seed: Optional[int], key_epoch: int, order: int = PARTS_ORDER
    ) -> None:
        self.layout = layout
        self.window = window
        self.seed = seed
        self.key_epoch = key_epoch
        self.lead = order >= 2
        count = layout.num_parts
        if seed is None or count < 2:
            self.order = np.arange(count, dtype=np.int64)
        else:
            parts = KeyedPermutation(count, _derived_seed(seed, "parts"), key_epoch)
            self.order = parts.map(np.arange(count, dtype=np.int64))
        self.counts = layout.records[self.order]
        self.ends = np.cumsum(self.counts)
        self._runs: dict[tuple[int, int], _Run] = {}

    def run(self, begin: int, end: int) -> _Run:
        key = (begin, end)
        run = self._runs.get(key)
        if run is None:
            if len(self._runs) >= 64:
                self._runs.clear()
            run = self._runs[key] = _Run(self, begin, end)
        return run


class _Run:
    """Positions ``[0, end - begin)`` of one run of ``Q`` (a node's), in staggered-window order."""

    def __init__(self, epoch: _EpochParts, begin: int, end: int) -> None:
        self.epoch = epoch
        self.begin, self.end = begin, end
        self.shuffled = epoch.seed is not None
        window = self.window = epoch.window
        ends, counts = epoch.ends, epoch.counts
        # Segments: the parts (in epoch order) that overlap [begin, end), cut to it.
        lo = int(np.searchsorted(ends, begin, side="right"))
        hi = int(np.searchsorted(ends, end, side="left")) + 1 if end > begin else lo
        part_begin = ends[lo:hi] - counts[lo:hi]
        q_begin = np.maximum(part_begin, begin)
        lengths = np.minimum(ends[lo:hi], end) - q_begin
        keep = lengths > 0
        self.parts = epoch.order[lo:hi][keep]
        self.lengths = lengths[keep]
        self.offsets = (q_begin - part_begin)[keep]  # where each segment starts in its part
        self.first_records = epoch.layout.starts[self.parts] + self.offsets
        segments = len(self.lengths)
        self.cuts = _slice_cuts(self.lengths, window, epoch.lead)
        # Stage t holds slice t - i of segment i, for i in [t - window + 1, t].
        sizes = np.zeros(segments + window - 1 if segments else 0, dtype=np.int64)
        for piece in range(window if segments else 0):
            sizes[piece : piece + segments] += self.cuts[:, piece + 1] - self.cuts[:, piece]
        self.stage_starts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.stage_starts[1:])
        self._permutations: dict[tuple[str, int], KeyedPermutation | _Table | _Affine] = {}

    def __len__(self) -> int:
        return self.end - self.begin

    def _permutation(self, kind: str, number: int, size: int) -> KeyedPermutation | _Table | _Affine:
        key = (kind, number)
        permutation = self._permutations.get(key)
        if permutation is None:
            if len(self._permutations) >= _CACHED_PERMUTATIONS:
                self._permutations.clear()
            epoch = self.epoch
            if epoch.seed is None:
                raise ValueError("an unshuffled parts plan has no permutation: it needs shuffle_seed")
            if kind == "stage":
                seed = _derived_seed(epoch.seed, "stage", self.begin, self.end, number)
                keyed = KeyedPermutation(size, seed, epoch.key_epoch)
                permutation = _Table(keyed) if size <= _TABLE_SIZE else keyed
            else:  # a segment: one part, cut at the same place, is split the same way
                part, offset = int(self.parts[number]), int(self.offsets[number])
                seed = _derived_seed(epoch.seed, "part", part, offset, size)
                if size <= _Affine.LIMIT:
                    permutation = _Affine(size, _derived_seed(seed, epoch.key_epoch))
                else:
                    permutation = KeyedPermutation(size, seed, epoch.key_epoch)
            self._permutations[key] = permutation
        return permutation

    def records(self, positions: np.ndarray) -> np.ndarray:
        """The record indices at run positions ``positions`` (each in ``[0, len)``)."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffled:
            return self.begin + positions  # parts in dataset order: Q is the dataset
        out = np.empty(len(positions), dtype=np.int64)
        stages = np.searchsorted(self.stage_starts, positions, side="right") - 1
        window, segments = self.window, len(self.lengths)
        for stage in np.unique(stages).tolist():
            chosen = np.flatnonzero(stages == stage)
            start, stop = self.stage_starts[stage], self.stage_starts[stage + 1]
            within = self._permutation("stage", stage, int(stop - start)).map(positions[chosen] - start)
            members = np.arange(max(0, stage - window + 1), min(stage, segments - 1) + 1)
            slice_start = self.cuts[members, stage - members]
            slice_length = self.cuts[members, stage - members + 1] - slice_start
            bounds = np.zeros(len(members) + 1, dtype=np.int64)
            np.cumsum(slice_length, out=bounds[1:])
            which = np.searchsorted(bounds, within, side="right") - 1
            for member in np.unique(which).tolist():
                picked = np.flatnonzero(which == member)
                segment = int(members[member])
                offsets = slice_start[member] + within[picked] - bounds[member]
                shuffled = self._permutation("part", segment, int(self.lengths[segment])).map(offsets)
                out[chosen[picked]] = self.first_records[segment] + shuffled
        return out

    def segment_spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(part, first position, end position) of the stages that read each segment."""
        segments = len(self.lengths)
        if not self.shuffled:
            starts = np.zeros(segments, dtype=np.int64)
            np.cumsum(self.lengths[:-1], out=starts[1:])
            return self.parts, starts, starts + self.lengths
        index = np.arange(segments)
        last_stage = np.minimum(index + self.window - 1, len(self.stage_starts) - 2)
        return self.parts, self.stage_starts[index], self.stage_starts[last_stage + 1]


# -- splits -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Split:
    """``Q`` cut for ``shards`` ranks, ``per_node`` consecutive ranks to a node (a run each)."""

    num_records: int
    shards: int
    per_node: int

    def count(self, rank: int, drop: bool) -> int:
        """Records rank ``rank`` reads of a whole epoch."""
        q, m = divmod(self.num_records, self.shards)
        return q if drop else q + (rank < m)

    def most(self, drop: bool) -> int:
        return self.count(0, drop)

    def _before(self, rank: int) -> int:
        """Records of the runs of ranks ``[0, rank)`` (without dropping)."""
        q, m = divmod(self.num_records, self.shards)
        return rank * q + min(rank, m)

    @property
    def nodes(self) -> int:
        return self.shards // self.per_node

    def run(self, node: int) -> tuple[int, int]:
        """The ``Q`` range of node ``node``'s run. Dropping reads less of it, never another."""
        return self._before(node * self.per_node), self._before((node + 1) * self.per_node)

    def read(self, node: int, consumed: int) -> int:
        """Positions of node ``node``'s run read once each of its ranks read ``consumed``."""
        begin, end = self.run(node)
        return min(consumed * self.per_node, end - begin)


@dataclass(frozen=True)
class _Residual:
    """The rest of epoch ``epoch`` after each rank of ``split`` read ``consumed`` records: the
    unread tails of its runs end to end, dealt out position by position."""

    epoch: int
    split: _Split
    consumed: int
    tails: tuple[tuple[int, int, int], ...]  # per node: (run begin, run end, first unread)
    starts: np.ndarray  # where each tail starts in the residual line

    @classmethod
    def of(cls, epoch: int, split: _Split, consumed: int) -> _Residual:
        tails = []
        for node in range(split.nodes):
            begin, end = split.run(node)
            tails.append((begin, end, split.read(node, consumed)))
        lengths = np.array([end - begin - read for begin, end, read in tails], dtype=np.int64)
        starts = np.zeros(len(tails) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        return cls(epoch, split, consumed, tuple(tails), starts)

    @property
    def size(self) -> int:
        return int(self.starts[-1])


# -- plans --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartsPlan(StridedPlan):
    """Plan positions ``j`` are positions ``first + j·step`` of a line made of run pieces
    ``(run, first unread position)``, laid end to end from ``piece_starts``."""

    epoch: int
    first: int
    step: int
    length: int
    pieces: tuple[tuple[_Run, int], ...]
    piece_starts: np.ndarray

    def _records(self, line: np.ndarray) -> np.ndarray:
        if len(self.pieces) == 1:
            run, offset = self.pieces[0]
            return run.records(offset + line)
        out = np.empty(len(line), dtype=np.int64)
        owner = np.searchsorted(self.piece_starts, line, side="right") - 1
        for piece in np.unique(owner).tolist():
            chosen = np.flatnonzero(owner == piece)
            run, offset = self.pieces[piece]
            out[chosen] = run.records(offset + line[chosen] - self.piece_starts[piece])
        return out

    def parts_needed(self) -> list[PartUse]:
        """The parts this plan reads, in order of first use, from the stage table alone."""
        found: dict[int, tuple[int, int]] = {}
        for (run, offset), base in zip(self.pieces, self.piece_starts.tolist()):
            parts, begin, end = run.segment_spans()
            # Line positions of the stages, clipped to the unread part of the run.
            begin = base + np.maximum(begin, offset) - offset
            end = base + np.minimum(end, len(run)) - offset
            # Plan positions j with first + j·step in [begin, end).
            low = np.maximum(0, -((self.first - begin) // self.step))
            high = np.minimum(self.length, -((self.first - end) // self.step))
            for part, a, b in zip(parts.tolist(), low.tolist(), high.tolist()):
                if a < b:
                    old = found.get(part)
                    found[part] = (a, b - 1) if old is None else (min(old[0], a), max(old[1], b - 1))
        uses = [PartUse(part, a, b) for part, (a, b) in found.items()]
        return sorted(uses, key=lambda use: (use.first, use.last))


# -- the mode -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PartsOptions:
    """The ``"parts"`` mode's settings, checked when made; ``ReadOptions`` (and every facade:
    ``DataRef.stream``, the DataLayer decorators, the torch dataset) takes them as keywords.

    Attributes:
        parts_window: parts mixed at a time (each rank then needs as many parts, and one more
            to read ahead).
        ranks_per_node: consecutive ranks that share a node (each node reads one run of parts,
            its ranks together); None: unknown, a run per rank.
    """

    parts_window: int = DEFAULT_PARTS_WINDOW
    ranks_per_node: Optional[int] = None

    def __post_init__(self) -> None:
        window = as_int(self.parts_window, "parts_window")
        if window < 1:
            raise ValueError(f"parts_window must be at least 1 (parts mixed at a time), got {window}")
        object.__setattr__(self, "parts_window", window)
        if self.ranks_per_node is not None:
            per_node = as_int(self.ranks_per_node, "ranks_per_node")
            if per_node < 1:
                raise ValueError(f"ranks_per_node must be at least 1, got {per_node}")
            object.__setattr__(self, "ranks_per_node", per_node)

    @property
    def per_node(self) -> int:
        """Ranks per node (1 when unknown)."""
        return self.ranks_per_node or 1

    @classmethod
    def of(cls, options: OrderOptions) -> PartsOptions:
        """The parts settings ``options`` hold (the defaults where they hold none)."""
        settings = options.mode_options
        return settings if isinstance(settings, cls) else cls()


class PartsMode(ShuffleMode):
    """Each epoch the parts permuted, cut into one run per node, mixed ``parts_window`` at a time."""

    name: ClassVar[str] = "parts"
    state_keys: ClassVar[tuple[str, ...]] = ("num_shards", "ranks_per_node", "window", "dealt", "parts_order")
    # Keys a state from an earlier release may lack (``parts_order``: 1 then).
    _optional_keys: ClassVar[tuple[str, ...]] = ("parts_order",)
    # ``parts_window`` as asked; ``window`` (a state key) is the window read, fitted to a budget.
    setting_keys: ClassVar[tuple[str, ...]] = ("parts_window",)
    options_type: ClassVar[Optional[type[Any]]] = PartsOptions

    def __init__(self, num_records: int, options: OrderOptions, layout: Optional[PartLayout] = None) -> None:
        super().__init__(num_records, options)
        if layout is None:
            raise ValueError(
                "shuffle_mode='parts' orders the parts of a cache, so it needs their layout: "
                "pass layout=PartLayout.from_manifest(manifest) to ReadSchedule (DataRef.stream, "
                "DataLayer and the torch dataset do)"
            )
        if layout.num_records != num_records:
            raise ValueError(f"the part layout holds {layout.num_records} records, the dataset {num_records}")
        self.layout = self.parts = layout
        settings = PartsOptions.of(options)
        self.asked = self.window = settings.parts_window
        self.split = _Split(num_records, options.num_shards, settings.per_node)
        self._budget: Optional[int] = None  # the node budget fitted to (``fit_budget``)
        # Epochs read with another window than ``window``: (last epoch, window), in epoch order
        # (``pin_windows``: the rest of an epoch resumed from a state of another budget's window).
        self._pins: list[tuple[int, int]] = []
        self._residual: Optional[_Residual] = None
        # The epoch resumed from a state taken in the order before the lead (``parts_order``
        # 1): the rest of it is read in that order, the epochs after in this one.
        self._order_one_epoch: Optional[int] = None
        self._epochs: dict[tuple[int, int, int], _EpochParts] = {}  # the latest two epochs' part orders
        self._lock = threading.Lock()  # plans of neighbouring epochs may be made in threads

    @classmethod
    def with_layout(cls, num_records: int, options: OrderOptions, layout: Optional[PartLayout] = None) -> ShuffleMode:
        return cls(num_records, options, layout)

    def fit_budget(self, budget_bytes: Optional[int]) -> Optional[str]:
        """Narrows the window to what ``budget_bytes`` holds (``budget_window``), so that a
        streamed reader never fetches a part twice for want of room; says so, or None."""
        if budget_bytes is None:
            return None
        self._budget = budget_bytes
        asked = self.window
        fitted = budget_window(asked, self.parts, budget_bytes)
        if fitted >= asked:
            return None
        with self._lock:
            self.window = fitted
            self._epochs.clear()
        largest = int(self.parts.sizes.max())
        return (
            f"shuffle_mode='parts' reads with parts_window={fitted}, not {asked}: local_cache_limit "
            f"{_size(budget_bytes)} holds {budget_bytes // largest} of this cache's parts, {asked} need "
            f"{2 * asked + 1} (docs/shuffle.md); raise local_cache_limit to {_size((2 * asked + 1) * largest)} "
            "or lower parts_window"
        )

    def __getstate__(self) -> dict[str, Any]:
        # Sent to a spawned DataLoader worker: the orders are recomputed there, the lock new.
        state = dict(self.__dict__)
        state["_epochs"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @classmethod
    def check(cls, options: OrderOptions) -> None:
        cls.check_seeded(options, "the same order of the parts")
        per_node = PartsOptions.of(options).per_node
        if options.num_shards % per_node:
            raise ValueError(
                f"num_shards ({options.num_shards}) must be a multiple of ranks_per_node ({per_node}): "
                "every node runs as many ranks"
            )

    # -- the epoch's order ------------------------------------------------------------------
    def _order(self, epoch: int) -> int:
        """The order epoch ``epoch`` is read in (``PARTS_ORDER``, or 1 for a resumed one)."""
        return 1 if epoch == self._order_one_epoch else PARTS_ORDER

    def window_of(self, epoch: int) -> int:
        """The window epoch ``epoch`` is read with: ``window``, or a pinned one (``pin_windows``)."""
        for last, window in self._pins:
            if epoch <= last:
                return window
        return self.window

    def window_runs(self, first: int, last: int) -> list[tuple[int, int]]:
        """The windows of epochs ``first`` to ``last``: ``(last epoch, window)`` runs, in order."""
        runs: list[tuple[int, int]] = []
        start = first
        for end, window in self._pins:
            if end < start:
                continue
            if start > last:
                break
            runs.append((min(end, last), window))
            start = end + 1
        if start <= last:
            runs.append((last, self.window))
        merged: list[tuple[int, int]] = []
        for end, window in runs:
            if merged and merged[-1][1] == window:
                merged[-1] = (end, window)
            else:
                merged.append((end, window))
        return merged

    def pin_windows(self, runs: list[tuple[int, int]], why: str) -> None:
        """Reads the epochs up to each ``(last epoch, window)`` of ``runs`` (in epoch order) with
        that window, exactly as a resume state names them (a window fitted to another budget),
        and says so once; the epochs after with this reader's own. Refuses a window that this
        node's budget cannot read an epoch with at all (its parts and the next one: ``w + 1``)."""
        largest = int(self.parts.sizes.max()) if self.parts.num_parts else 0
        for _, window in runs:
            need = (window + 1) * largest
            if window != self.window and self._budget is not None and largest and need > self._budget:
                raise ResumeStateError(
                    f"the resume state was saved with window={window} (parts_window fitted to the node budget "
                    f"then), this reader has window={self.window}: this node's {why} ({_size(self._budget)}, "
                    f"local_cache_limit) holds {self._budget // largest} of this cache's parts (up to "
                    f"{_size(largest)} each), and the rest of the epoch needs {window + 1} ({window} mixed at a "
                    f"time and the next). Raise local_cache_limit to at least {_size(need)} to resume, or start "
                    "the epoch over without the state"
                )
        if all(window == self.window for _, window in runs):
            return
        with self._lock:
            self._pins = sorted(runs)
            self._epochs.clear()
        shown = ", ".join(f"window={window} through epoch {last}" for last, window in runs if window != self.window)
        say_once(
            f"shuffle_mode='parts' resumes with {shown}, as the resume state was saved (a window fitted to "
            f"another node budget), then reads with window={self.window}, fitted to this node's {why}"
        )

    def _epoch(self, epoch: int) -> _EpochParts:
        options = self.options
        window = self.window_of(epoch)
        key = (epoch if options.reshuffle_each_epoch else 0, self._order(epoch), window)
        with self._lock:
            parts = self._epochs.get(key)
            if parts is None:
                seed = options.shuffle_seed if options.shuffle else None
                while len(self._epochs) >= 2:
                    del self._epochs[min(self._epochs)]
                parts = self._epochs[key] = _EpochParts(self.parts, window, seed, key[0], key[1])
        return parts

    def _dealt_end(self, residual: _Residual, dealt: int) -> int:
        """Where dealing the residual line ends, from any point ``dealt`` of it."""
        left = max(0, residual.size - dealt)
        shards = self.options.num_shards
        return dealt + (left - left % shards if self.options.drop_shard_remainder else left)

    def _residual_of(self, epoch: int, position: int) -> tuple[_Residual, int]:
        residual = self._residual
        if residual is None or residual.epoch != epoch:
            raise ValueError(
                f"position {position} of epoch {epoch} belongs to the rest of an epoch resumed "
                "with another split, and this reader did not resume it"
            )
        return residual, position - RESIDUAL

    # -- ShuffleMode --------------------------------------------------------------------------
    def remaining(self, position: int) -> int:
        rank, shards = self.options.shard_rank, self.options.num_shards
        if position >= RESIDUAL:
            if self._residual is None:
                raise ValueError("a position of a resumed epoch, and this reader did not resume one")
            dealt = position - RESIDUAL
            return max(0, -(-(self._dealt_end(self._residual, dealt) - dealt - rank) // shards))
        return max(0, self.split.count(rank, self.options.drop_shard_remainder) - position)

    def advance(self, point: Point, records: int) -> Point:
        epoch, position = point
        if position < RESIDUAL:
            return super().advance(point, records)
        records = as_int(records, "records")
        if records < 0:
            raise ValueError(f"records must not be negative, got {records}")
        left = self.remaining(position)
        if records < left:
            return epoch, position + records * self.options.num_shards
        return super().advance((epoch + 1, 0), records - left)

    def plan(self, epoch: int, position: int) -> EpochPlan:
        options = self.options
        parts = self._epoch(epoch)
        if position >= RESIDUAL:
            residual, dealt = self._residual_of(epoch, position)
            pieces = tuple((parts.run(begin, end), read) for begin, end, read in residual.tails)
            first = dealt + options.shard_rank
            return PartsPlan(epoch, first, options.num_shards, self.remaining(position), pieces, residual.starts)
        node, local = divmod(options.shard_rank, self.split.per_node)
        run = parts.run(*self.split.run(node))
        first = local + position * self.split.per_node
        starts = np.zeros(2, dtype=np.int64)
        starts[1] = len(run)
        return PartsPlan(epoch, first, self.split.per_node, self.remaining(position), ((run, 0),), starts)

    def parts_needed(self, epoch: int, position: int = 0) -> list[PartUse]:
        plan = self.plan(epoch, position)
        if not isinstance(plan, PartsPlan):
            raise TypeError(f"the parts mode planned a {type(plan).__name__}, not a PartsPlan")
        return plan.parts_needed()

    def state_fields(self, epoch: int, position: int) -> dict[str, Any]:
        if position >= RESIDUAL:
            residual, dealt = self._residual_of(epoch, position)
            split, consumed = residual.split, residual.consumed
        else:
            split, consumed, dealt = self.split, position, 0
        return {
            "consumed": consumed,
            "num_shards": split.shards,
            "ranks_per_node": split.per_node,
            "window": self.window_of(epoch),
            "dealt": dealt,
            "parts_order": self._order(epoch),
        }

    # -- the state contract ---------------------------------------------------------------------
    def order_settings(self) -> dict[str, Any]:
        # The window asked for is compared; the one read (fitted to a budget) is honoured
        # (``resume_point``), and the split too (the rest of the epoch dealt anew).
        return {**super().order_settings(), "parts_window": self.asked}

    def reader_settings(self) -> dict[str, Any]:
        return {"window": self.window, "ranks_per_node": self.split.per_node}

    def state_limits(self, state: ResumeState) -> dict[str, tuple[int, int]]:
        fields = {key: state.get(key) for key in self.state_keys}
        missing = sorted(key for key, value in fields.items() if value is None and key not in self._optional_keys)
        if missing:
            raise ResumeStateError(
                f"a parts-mode resume state names {', '.join(self.state_keys)}; this one lacks {missing}"
            )
        shards, per_node = int(fields["num_shards"] or 0), int(fields["ranks_per_node"] or 0)
        if shards < 1 or per_node < 1 or shards % per_node:
            raise ResumeStateError(f"the resume state's split ({shards} ranks, {per_node} per node) is not valid")
        split = _Split(self.num_records, shards, per_node)
        most = split.most(False)
        consumed = min(max(0, state.consumed), most)
        limits = {
            **super().state_limits(state),
            # Fitting to a budget only narrows the window asked for.
            "window": (1, max(self.asked, self.parts.num_parts)),
            "parts_order": (min(_ORDERS), max(_ORDERS)),
            "consumed": (0, most),
            # The rest of the epoch after ``consumed``, dealt anew: no further than its end.
            "dealt": (0, _Residual.of(state.epoch, split, consumed).size),
        }
        return limits

    def resume_point(self, state: ResumeState) -> Point:
        fields = {key: state.get(key) for key in self.state_keys}
        order = 1 if fields["parts_order"] is None else int(fields["parts_order"])
        window, dealt = int(fields["window"] or 0), int(fields["dealt"] or 0)
        shards, per_node = int(fields["num_shards"] or 0), int(fields["ranks_per_node"] or 0)
        split = _Split(self.num_records, shards, per_node)
        consumed = state.consumed
        self._residual = None
        with self._lock:
            self._order_one_epoch = state.epoch if order == 1 else None
            self._epochs.clear()
        # A window fitted to another budget: the rest of this epoch as the state names it.
        self.pin_windows([(state.epoch, window)], "budget")
        if split == self.split and dealt == 0 or consumed == dealt == 0:
            if consumed >= self.split.most(self.options.drop_shard_remainder):
                return state.epoch + 1, 0
            return state.epoch, consumed
        residual = _Residual.of(state.epoch, split, consumed)
        if self._dealt_end(residual, dealt) == dealt:  # nothing left for any rank
            return state.epoch + 1, 0
        self._residual = residual
        return state.epoch, RESIDUAL + dealt


def budget_window(window: int, layout: PartLayout, budget_bytes: int) -> int:
    """The largest window up to ``window`` that a node-local budget of ``budget_bytes`` holds
    without fetching a part twice: ``2w + 1`` parts (of the largest size) -- the ``w`` parts a
    reader mixes, the one it moves on to, and at an epoch's end the ``w`` parts the next epoch
    starts with, which the budget keeps instead of fetching them again. At least 1 (the two
    parts of the smallest budget a streamed read accepts)."""
    largest = int(layout.sizes.max()) if layout.num_parts else 0
    if largest <= 0:
        return window
    return max(1, min(window, (budget_bytes // largest - 1) // 2))


# -- budgets ------------------------------------------------------------------------------------


class RandomReadRefetch(NamedTuple):
    """What reading a cache at random costs a node per epoch under a local byte budget."""

    fetched_bytes: int  # expected bytes fetched per epoch
    cache_bytes: int
    budget_bytes: int


def random_read_refetch(layout: PartLayout, budget_bytes: int, records: int, read_records: int) -> RandomReadRefetch:
    """The bytes a node fetches per epoch when it reads ``records`` records at uniformly random
    places of the cache (``"shard"`` and ``"global"`` modes), ``read_records`` per read, and keeps
    at most ``budget_bytes`` of parts.

    A read needs every part one of its records lies in; with parts read at random, a part is
    resident at a read with probability ``budget / cache`` (what LRU, FIFO or random eviction
    give for uniform references), so each part a read needs is fetched (whole) with probability
    ``1 - budget / cache``. Over an epoch that is ``reads x E[bytes of the parts one read
    needs] x (1 - budget / cache)``, and at least each part the epoch touches, once.
    """
    budget_bytes = as_int(budget_bytes, "budget_bytes")
    records, read_records = as_int(records, "records"), as_int(read_records, "read_records")
    if budget_bytes < 0 or records < 0 or read_records < 1:
        raise ValueError("budget_bytes and records must not be negative, read_records must be at least 1")
    total, count = layout.num_bytes, layout.num_records
    if not count or not records:
        return RandomReadRefetch(0, total, budget_bytes)
    share = layout.records / count  # the chance that one random record lies in each part
    sizes = layout.sizes.astype(np.float64)
    touched = float(np.sum(sizes * -np.expm1(records * np.log1p(-np.minimum(share, 1 - 1e-16)))))
    if budget_bytes >= total:
        return RandomReadRefetch(round(touched), total, budget_bytes)
    reads = math.ceil(records / read_records)
    per_read = float(np.sum(sizes * -np.expm1(min(records, read_records) * np.log1p(-np.minimum(share, 1 - 1e-16)))))
    misses = reads * per_read * (1 - budget_bytes / total)
    return RandomReadRefetch(round(max(touched, misses)), total, budget_bytes)


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def shuffle_budget_warning(
    mode: str, layout: PartLayout, budget_bytes: int, records: int, read_records: int
) -> Optional[str]:
    """The warning to give once when ``mode`` reads a cache larger than the node's byte budget
    at random (``None`` when it fits, or for ``"parts"``, which reads a few parts at a time).

    ``records`` is what the node reads per epoch (its ranks' shards), ``read_records`` the
    records of one read (``ReadSizes.full``).
    """
    if mode == PartsMode.name or layout.num_bytes <= budget_bytes:
        return None
    cost = random_read_refetch(layout, budget_bytes, records, read_records)
    ratio = cost.fetched_bytes / max(1, cost.cache_bytes)
    return (
        f"shuffle_mode={mode!r} reads every part of the cache at random throughout an epoch: with a "
        f"local budget of {_size(budget_bytes)} for a cache of {_size(cost.cache_bytes)}, this node "
        f"fetches about {_size(cost.fetched_bytes)} per epoch ({ratio:.1f}x the cache). Use "
        "shuffle_mode='parts' (each node fetches about its share of the parts per epoch) or a "
        f"budget of at least {_size(cost.cache_bytes)}"
    )


SHUFFLE_MODES[PartsMode.name] = PartsMode
