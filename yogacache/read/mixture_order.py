"""A mixture's order: how many records of each cache an epoch reads, and in which order.

(``yogacache.mixture.Mixture`` is the user's object, ``yogacache.read.mixture_reader`` reads
the caches by index; this module computes which record each position of an epoch reads.)

A mixture of ``K`` components (caches of ``n_i`` records, equal element specs) reads, in every
epoch, exactly ``c_i`` records of component ``i`` (``mixture_counts``):

- relative ``weight``s share an epoch of ``epoch_size`` records (default: the components'
  records together, ``Σ n_i``) by largest remainders of the quotas ``q_i = w_i / Σ w · E``,
  in exact arithmetic (``apportion``; a float weight is the decimal it prints as, ``exact``):
  each count is ``floor(q_i)`` or ``ceil(q_i)``, the records left after the floors go to the
  largest remainders, a tie to the earlier component (no weights at all: each component weighs
  its records, the natural proportions, so the default epoch reads every record once); or the
  stopping rules, as Hugging Face's ``interleave_datasets`` names them, set the epoch size from
  the weights (``p_i = w_i / Σ w``, components of weight 0 left out): ``"first_exhausted"``
  ``E = floor(min n_i / p_i)``, the largest epoch whose quotas are all at most the components'
  sizes (no count past one pass, the limiting one's ``n_i - 1`` or ``n_i``), ``"all_exhausted"``
  ``E = ceil(max n_i / p_i)``, the smallest whose quotas are all at least the sizes (every
  component through at least once);
- absolute counts: ``repeat`` passes over the component per epoch (``round(repeat · n_i)``
  records, half up) or ``samples`` records per epoch.

An epoch holds at most ``MAX_EPOCH_SIZE`` records (2**32): weights that would need a longer one
(``"all_exhausted"`` with a weight of 1e-18) are refused naming the component and its weight.

Component ``i`` draws its records in passes: pass ``q`` is epoch ``q`` of the component's own
order (``shuffle_mode`` with one shard: ``"global"``'s permutation, ``"parts"``'s window order,
…), and epoch ``e`` takes draws ``e·c_i`` to ``(e+1)·c_i - 1``. A record is drawn once per pass;
an upsampled component repeats whole passes, a downsampled one rotates through all its records
across epochs before it repeats any (the interleaving of ``skip_shuffle_at_epoch_end`` stays the
same, the records rotate). A mixture read for evaluation (``rotate=False``,
``Mixture.for_evaluation``) reads epoch 0's draws every epoch: the same records.

The interleaving (``MixedOrder``) is stratified: draw ``k`` of component ``i`` gets the key
``(k + u) / c_i``, with ``u`` in ``[0, 1)`` a keyed hash of ``(seed, epoch, i, k)`` (``0.5``
unshuffled), and the epoch reads the draws in key order. Every window of ``L`` records then holds
``c_i / E · L`` records of component ``i`` within ``2 + 2·(K - 2)·c_i / E`` (``K >= 2`` the
components the epoch reads; at most ``2·(K - 1)``; half that unshuffled): each component's draws
in a window of keys number its share of the keys' span within two, and the window's length
within two per component. So every batch mixes every component (never one stream after
another), and the order is a function of the seed and the
epoch alone: the same on every node for any world size. Ranks share the mixed order as global
mode shares a permutation (``MixtureMode``): rank ``r`` of ``S`` reads positions ``c+r, c+r+S,
…`` after ``c`` consumed, so a resume state ``(epoch, c)`` is valid at any world size.

Nothing of an epoch's order is stored whole: the keys are computed on demand, and the order is
put together a block of about ``BLOCK_SIZE`` draws at a time (the draws whose keys lie in one
``1 / M`` of ``[0, 1)``), in O(K) to find a position's block and O(block) memory per process,
the same order for every block size (``MixedOrder``).

Pure numpy, no I/O; ``yogacache.mixture`` reads caches this way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from yogacache.arguments import as_int
from yogacache.read.layout import PartLayout, PartUse
from yogacache.read.permutation import _mix
from yogacache.read.plans import EpochPlan, Point, StridedPlan
from yogacache.read.schedule import ReadSchedule
from yogacache.read.shuffle import (
    MIXTURE_MODE,
    MIXTURE_SETTINGS,
    GlobalMode,
    MixtureState,
    ResumeState,
    ShuffleMode,
    is_mixture_state,
    shuffle_mode,
)
from yogacache.read.state import MAX_EPOCH, check_components, check_state

__all__ = [
    "BLOCK_SIZE",
    "MAX_EPOCH_SIZE",
    "MIXTURE_MODE",
    "STOPPING_RULES",
    "MixedOrder",
    "MixtureMode",
    "MixtureSchedule",
    "MixtureState",
    "Share",
    "apportion",
    "check_shares",
    "check_weights",
    "exact",
    "is_mixture_state",
    "mixture_counts",
]

STOPPING_RULES = ("first_exhausted", "all_exhausted")
# The most records an epoch may hold (docs/mixtures.md's Limits): an epoch set by extreme weights
# is refused, not begun. The interleaving's keys are float64 ``(k + u) / c``: below 2**32 draws
# of a component, ``k + u`` keeps 21 bits of the keyed ``u``.
MAX_EPOCH_SIZE = 2**32


# -- how many records of each component an epoch reads -----------------------------------------


@dataclass(frozen=True)
class Share:
    """What a component takes of each epoch: a relative ``weight``, or absolutely ``repeat``
    passes over it or ``samples`` records (at most one of the three; none: its records as its
    weight where no component has one, repeat 1 in a mixture of absolute shares)."""

    weight: Optional[float] = None
    repeat: Optional[float] = None
    samples: Optional[int] = None

    def __post_init__(self) -> None:
        given = [name for name in ("weight", "repeat", "samples") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"a mixture component takes one of weight, repeat and samples, got {' and '.join(given)}")
        for name in ("weight", "repeat"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _finite(value, name))
        if self.samples is not None:
            samples = as_int(self.samples, "samples")
            if samples < 0:
                raise ValueError(f"samples must not be negative, got {samples}")
            object.__setattr__(self, "samples", samples)

    @property
    def absolute(self) -> bool:
        return self.repeat is not None or self.samples is not None


def _finite(value: Any, name: str) -> Union[int, float]:
    """A weight or repeat, checked: a finite number >= 0 (an integer kept exact, as an ``int``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    # A numpy float as it prints (np.float32(0.1) is 0.1, not 0.10000000149011612: ``exact``).
    number: Union[int, float] = (
        int(value)
        if isinstance(value, (int, np.integer))
        else float(str(value))
        if isinstance(value, np.floating)
        else float(value)
    )
    if (isinstance(number, float) and not math.isfinite(number)) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


def exact(value: Union[int, float]) -> Fraction:
    """A weight or repeat as the exact number it stands for: an integer as it is, a float as the
    shortest decimal that prints it (``0.1`` is 1/10, as it was typed or as YAML read it; the
    float itself, 0.1000000000000000055…, would break the tie of ``weights=[0.3, 0.1]``'s
    quotas 1.5 and 0.5 the other way)."""
    return Fraction(repr(float(value))) if isinstance(value, float) else Fraction(value)


def _about(number: Union[int, Fraction]) -> str:
    """``number`` for a message: in full up to 15 digits, else its power of ten."""
    whole = math.ceil(number)
    return f"{whole:,}" if whole < 10**15 else f"about 1e{len(str(whole)) - 1}"


def _scaled(weights: Sequence[Union[int, float, Fraction]]) -> list[int]:
    """Integers in the exact proportions of ``weights`` (their common denominator times each)."""
    fractions = [value if isinstance(value, Fraction) else exact(value) for value in weights]
    denominator = math.lcm(*(value.denominator for value in fractions))
    return [int(value * denominator) for value in fractions]


def apportion(total: int, weights: Sequence[Union[int, float, Fraction]]) -> np.ndarray:
    """``total`` split in proportion to ``weights`` by largest remainders, in exact arithmetic
    (``exact``): each share is the floor or the ceiling of its quota ``w / Σw × total``, they
    add up to ``total``, the records left after the floors go to the largest remainders, and a
    tie goes to the earlier component."""
    scaled = _scaled(weights)
    whole = sum(scaled)
    floors, remainders = zip(*(divmod(weight * total, whole) for weight in scaled))
    counts = list(floors)
    by_remainder = sorted(range(len(scaled)), key=lambda i: (-remainders[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return np.array(counts, dtype=np.int64)


def check_shares(shares: Sequence[Share], epoch_size: Any = None, stopping: Optional[str] = None) -> Optional[int]:
    """What can be checked of a mixture's shares, epoch size and stopping rule before its caches
    are opened (a builder may build one): one line naming what is wrong. Returns the epoch size."""
    if stopping is not None and stopping not in STOPPING_RULES:
        raise ValueError(f"stopping must be one of {STOPPING_RULES} or None, got {stopping!r}")
    if any(share.absolute for share in shares):
        weighted = [i for i, share in enumerate(shares) if share.weight is not None]
        if weighted:
            raise ValueError(
                f"mixture component {weighted[0]} has a weight and others repeat or samples: give "
                "every component a weight (shares of epoch_size) or none (absolute counts)"
            )
        if epoch_size is not None or stopping is not None:
            what = "epoch_size" if epoch_size is not None else f"stopping={stopping!r}"
            raise ValueError(
                f"{what} applies to weights; repeat and samples set each component's records per epoch themselves"
            )
        return None
    unweighted = [i for i, share in enumerate(shares) if share.weight is None]
    if unweighted and len(unweighted) < len(shares):
        raise ValueError(
            f"mixture component {unweighted[0]} has no weight and others have: give every component a "
            "weight, or none (each then weighs its records: the natural proportions)"
        )
    if shares and not unweighted and not any(share.weight for share in shares):
        raise ValueError("mixture weights are all zero: at least one must be positive")
    if stopping is not None and epoch_size is not None:
        raise ValueError(f"pass epoch_size or stopping={stopping!r}, not both: the stopping rule sets the epoch size")
    if epoch_size is None:
        return None
    total = as_int(epoch_size, "epoch_size")
    if total < 1:
        raise ValueError(f"epoch_size must be at least 1, got {total}")
    if total > MAX_EPOCH_SIZE:
        raise ValueError(
            f"epoch_size {total:,} is more than the {MAX_EPOCH_SIZE:,} records (2**32) a mixture's epoch may "
            "hold (docs/mixtures.md's Limits)"
        )
    return total


def mixture_counts(
    sizes: Sequence[int],
    shares: Sequence[Share],
    epoch_size: Optional[int] = None,
    stopping: Optional[str] = None,
) -> tuple[int, ...]:
    """Records of each component in every epoch (see the module), in exact arithmetic, checked:
    one line naming what is wrong otherwise."""
    sizes = [as_int(size, "component size") for size in sizes]
    if len(shares) != len(sizes):
        raise ValueError(f"a mixture of {len(sizes)} components got {len(shares)} shares")
    if not sizes:
        raise ValueError("a mixture needs at least one component")
    empty = [i for i, size in enumerate(sizes) if size == 0]
    if empty:
        raise ValueError(f"mixture component {empty[0]} has no records: leave it out")
    total = check_shares(shares, epoch_size, stopping)
    if any(share.absolute for share in shares):
        counts = []
        for size, share in zip(sizes, shares):
            if share.samples is not None:
                counts.append(share.samples)
            else:  # round(repeat · n), half up
                counts.append(math.floor(exact(1 if share.repeat is None else share.repeat) * size + Fraction(1, 2)))
        if sum(counts) == 0:
            raise ValueError("every mixture component takes 0 records per epoch: raise a repeat or samples")
        if sum(counts) > MAX_EPOCH_SIZE:
            raise ValueError(
                f"the mixture's repeat and samples make an epoch of {_about(sum(counts))} records, more than the "
                f"{MAX_EPOCH_SIZE:,} (2**32) an epoch may hold (docs/mixtures.md's Limits): lower them"
            )
        return tuple(counts)
    # No weights at all: each component weighs its records (every record once per epoch of the
    # default size, as concatenating them would).
    given = [share.weight for share in shares]
    weights = _scaled([size if weight is None else weight for weight, size in zip(given, sizes)])
    whole = sum(weights)
    if stopping is not None:
        # The epoch whose exact quotas n_i·Σw/w_i (of the components with a weight) take the
        # limiting component exactly through: the largest that takes none past one pass, or the
        # smallest that takes every one through at least once.
        limits = {i: Fraction(size * whole, weight) for i, (size, weight) in enumerate(zip(sizes, weights)) if weight}
        first = stopping == "first_exhausted"
        limiting = (min if first else max)(limits, key=lambda i: (limits[i], i))
        total = math.floor(limits[limiting]) if first else math.ceil(limits[limiting])
        if total > MAX_EPOCH_SIZE:
            raise ValueError(
                f"stopping={stopping!r} makes an epoch of {_about(total)} records: component {limiting} "
                f"({sizes[limiting]} records) at weight {given[limiting]!r} is read once through only in an "
                f"epoch that long, more than the {MAX_EPOCH_SIZE:,} records (2**32) an epoch may hold "
                f"(docs/mixtures.md's Limits): raise its weight, or pass an epoch_size"
            )
    elif total is None:
        total = sum(sizes)
        if total > MAX_EPOCH_SIZE:
            raise ValueError(
                f"the components hold {total:,} records together, more than the {MAX_EPOCH_SIZE:,} (2**32) a "
                "mixture's epoch may hold (docs/mixtures.md's Limits): pass a smaller epoch_size"
            )
    return tuple(int(count) for count in apportion(total, weights))


def check_weights(weights: Any, components: int) -> list[Union[int, float]]:
    """A ``weights=`` list, checked against the number of components."""
    if isinstance(weights, (str, bytes, Mapping)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a list of numbers, got {type(weights).__name__}")
    if len(weights) != components:
        raise ValueError(f"weights has {len(weights)} entries for {components} mixture components")
    checked = [_finite(weight, f"weights[{i}]") for i, weight in enumerate(weights)]
    if not any(checked):
        raise ValueError("mixture weights are all zero: at least one must be positive")
    return checked


# -- the mixed order of an epoch -------------------------------------------------------------------

_KEY_SCALE = 1.0 / float(1 << 53)
#: Draws per block of the interleaving (``MixedOrder``, about): what a process computes and holds
#: of an epoch's order at a time. The order is the same for every block size.
BLOCK_SIZE = 4096
# Blocks (and block boundaries) each process keeps: a plan's reads move forward a block at a
# time, and the ranks of a node read neighbouring positions.
_KEPT_BLOCKS = 4
_KEPT_BOUNDARIES = 64
# How far from ``floor(t · c)`` a component's count of keys below ``t`` is looked for first.
_GUESS = 4


def _stable_seed(*labels: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, labels)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1)


@dataclass(frozen=True)
class _Block:
    """Epoch positions ``[start, start + len(draws))`` of one interleaving: the draws there, and
    each component's draws before them (``before``)."""

    start: int
    before: np.ndarray
    draws: np.ndarray

    @property
    def end(self) -> int:
        return self.start + len(self.draws)


class MixedOrder:
    """The records of every epoch of a mixture, in order: which component each position of the
    epoch reads (the interleaving) and which of its records (its passes).

    ``passes[i]`` is component ``i``'s own order over its ``sizes[i]`` records (a shuffle mode of
    one shard: pass ``q`` is its plan of epoch ``q``); component ``i``'s records are ``offsets[i]``
    on in the mixture's index space (its components one after the other).

    The interleaving reads the draws in the order of their keys (see the module), computed a
    block at a time: the keys of the draws of component ``i`` increase with the draw, so the
    draws whose keys lie below ``t`` are its first ``below(t)_i``, found from ``floor(t · c_i)``
    with a few key evaluations. Block ``b`` of ``M = ceil(E / block_size)`` is the draws whose
    keys lie in ``[b / M, (b + 1) / M)``, about ``block_size`` of them, sorted by key (ties to
    the earlier component): the same order as sorting the epoch's keys at once, for any block
    size, in O(K) to find a position's block and O(block_size) memory.
    """

    def __init__(
        self,
        sizes: Sequence[int],
        counts: Sequence[int],
        passes: Sequence[ShuffleMode],
        *,
        seed: Optional[int],
        shuffle: bool,
        reshuffle_each_epoch: bool,
        rotate: bool = True,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.rotate = rotate
        self.counts = np.asarray(counts, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.draw_starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self.epoch_size = int(self.counts.sum())
        self.passes = list(passes)
        self.seed = seed
        self.shuffle = shuffle
        self.reshuffle_each_epoch = reshuffle_each_epoch
        self.block_size = as_int(block_size, "block_size")
        if self.block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {self.block_size}")
        self.num_blocks = max(1, -(-self.epoch_size // self.block_size))
        self._divisors = np.maximum(self.counts, 1)  # c_i (a component of no draws has no keys)
        self._blocks: dict[tuple[int, int], _Block] = {}  # the latest blocks, by (key epoch, block)
        self._below: dict[tuple[int, int], np.ndarray] = {}  # the latest block boundaries' counts
        self._bases: dict[int, np.ndarray] = {}  # each component's key base, by key epoch
        self._plans: dict[tuple[int, int], EpochPlan] = {}  # the latest passes' plans
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_blocks={}, _below={}, _bases={}, _plans={}, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the interleaving, a block at a time ------------------------------------------------------
    def _key_epoch(self, epoch: int) -> int:
        return epoch if self.reshuffle_each_epoch else 0

    def _keys(self, key_epoch: int, components: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """The keys ``(k + u) / c_i`` of draws ``draws`` (``k``, numbered within the epoch) of
        ``components`` (``i``), float64, elementwise: ``u`` is the keyed hash of ``(seed, epoch,
        i, k)`` in ``[0, 1)``, or ``0.5`` unshuffled."""
        k = draws.astype(np.int64)
        if self.shuffle and self.seed is not None:
            bases = self._bases.get(key_epoch)
            if bases is None:
                bases = np.array(
                    [_stable_seed("yogacache.mixture/v1", self.seed, key_epoch, i) for i in range(len(self.counts))],
                    dtype=np.uint64,
                )
                self._bases[key_epoch] = bases
            jitter = (_mix(k.astype(np.uint64) ^ bases[components]) >> np.uint64(11)).astype(np.float64) * _KEY_SCALE
            return (k + jitter) / self._divisors[components]
        return (k + 0.5) / self._divisors[components]

    def _boundary(self, key_epoch: int, block: int) -> np.ndarray:
        """Each component's draws whose keys lie below block ``block``'s first key, ``block /
        num_blocks`` (all of them at ``num_blocks``)."""
        if block <= 0:
            return np.zeros(len(self.counts), dtype=np.int64)
        if block >= self.num_blocks:
            return self.counts.copy()
        with self._lock:
            found = self._below.get((key_epoch, block))
        if found is not None:
            return found
        threshold = block / self.num_blocks
        counts = self.counts
        last = np.maximum(counts - 1, 0)
        low = np.clip(np.floor(threshold * counts).astype(np.int64) - _GUESS, 0, last)
        high = np.minimum(low + 2 * _GUESS, last)
        draws = np.minimum(low[:, None] + np.arange(2 * _GUESS + 1), high[:, None])
        components = np.repeat(np.arange(len(counts)), draws.shape[1]).reshape(draws.shape)
        below = self._keys(key_epoch, components, draws) < threshold
        # Below ``low`` all are below where ``low``'s is (or ``low`` is 0); above ``high`` none
        # is where ``high``'s is not (or ``high`` is the last draw).
        found = low + (below & (draws < high[:, None])).sum(axis=1) + below[:, -1]
        sure = ((low == 0) | below[:, 0]) & ((high == last) | ~below[:, -1])
        for i in np.flatnonzero(~sure & (counts > 0)).tolist():
            found[i] = self._bisect(key_epoch, i, threshold)
        found[counts == 0] = 0
        with self._lock:
            while len(self._below) >= _KEPT_BOUNDARIES:
                del self._below[next(iter(self._below))]
            self._below[(key_epoch, block)] = found
        return found

    def _bisect(self, key_epoch: int, component: int, threshold: float) -> int:
        """Component ``component``'s draws whose keys lie below ``threshold``, by bisection."""
        low, high = 0, int(self.counts[component])
        which = np.array([component])
        while low < high:
            middle = (low + high) // 2
            if self._keys(key_epoch, which, np.array([middle]))[0] < threshold:
                low = middle + 1
            else:
                high = middle
        return low

    def _block(self, key_epoch: int, block: int) -> _Block:
        """Block ``block`` of the interleaving: its draws sorted by key, ties to the earlier
        component (and draw), as one sort of the whole epoch's keys would order them."""
        with self._lock:
            found = self._blocks.get((key_epoch, block))
        if found is not None:
            return found
        before, after = self._boundary(key_epoch, block), self._boundary(key_epoch, block + 1)
        spans = (after - before).tolist()
        components = np.repeat(np.arange(len(spans)), spans)
        draws = np.concatenate(
            [np.arange(first, last, dtype=np.int64) for first, last in zip(before.tolist(), after.tolist())]
        )
        order = np.argsort(self._keys(key_epoch, components, draws), kind="stable")
        numbered = (self.draw_starts[components] + draws)[order]
        numbered.setflags(write=False)
        found = _Block(int(before.sum()), before, numbered)
        with self._lock:
            while len(self._blocks) >= _KEPT_BLOCKS:
                del self._blocks[next(iter(self._blocks))]
            self._blocks[(key_epoch, block)] = found
        return found

    def _block_at(self, key_epoch: int, position: int) -> _Block:
        """The block that holds epoch position ``position``: from its share of the epoch, then
        the neighbours (a block's start is within K draws of its share)."""
        block = min(self.num_blocks - 1, position * self.num_blocks // max(1, self.epoch_size))
        while block > 0 and int(self._boundary(key_epoch, block).sum()) > position:
            block -= 1
        while int(self._boundary(key_epoch, block + 1).sum()) <= position:
            block += 1
        return self._block(key_epoch, block)

    def draws(self, epoch: int, positions: Any) -> np.ndarray:
        """The draws epoch ``epoch`` reads at positions ``positions``, numbered across components
        (component ``i``'s ``k``-th draw of the epoch is ``draw_starts[i] + k``)."""
        positions = np.asarray(positions, dtype=np.int64)
        out = np.empty(len(positions), dtype=np.int64)
        if len(positions) == 0:
            return out
        if positions.min() < 0 or positions.max() >= self.epoch_size:
            raise IndexError(f"mixture positions must lie in [0, {self.epoch_size})")
        key_epoch = self._key_epoch(epoch)
        ascending = bool((np.diff(positions) >= 0).all())
        order = None if ascending else np.argsort(positions, kind="stable")
        line = positions if order is None else positions[order]
        done = 0
        while done < len(line):
            block = self._block_at(key_epoch, int(line[done]))
            until = int(np.searchsorted(line, block.end, side="left"))
            found = block.draws[line[done:until] - block.start]
            if order is None:
                out[done:until] = found
            else:
                out[order[done:until]] = found
            done = until
        return out

    def draws_before(self, epoch: int, position: int) -> np.ndarray:
        """How many draws of each component epoch positions ``[0, position)`` hold."""
        if position <= 0:
            return np.zeros(len(self.sizes), dtype=np.int64)
        if position >= self.epoch_size:
            return self.counts.copy()
        block = self._block_at(self._key_epoch(epoch), position)
        within = self.component_of(block.draws[: position - block.start])
        return block.before + np.bincount(within, minlength=len(self.sizes)).astype(np.int64)

    # -- the records of the draws -------------------------------------------------------------------
    def draw_epoch(self, epoch: int) -> int:
        """The epoch whose draws epoch ``epoch`` reads: itself (a downsampled component rotates
        through its records, also where the interleaving stays the same every epoch), or 0 in a
        mixture that does not ``rotate`` (what validation reads: ``Mixture.for_evaluation``),
        whose epochs all read the same records."""
        return epoch if self.rotate else 0

    def draws_start(self, component: int) -> int:
        return int(self.draw_starts[component])

    def component_of(self, draws: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.draw_starts, draws, side="right") - 1

    def _pass_plan(self, component: int, number: int) -> EpochPlan:
        key = (component, number)
        with self._lock:
            plan = self._plans.get(key)
        if plan is None:
            plan = self.passes[component].plan(number, 0)
            with self._lock:
                mine = [k for k in self._plans if k[0] == component]
                while len(mine) >= 2:
                    del self._plans[mine.pop(0)]
                self._plans[key] = plan
        return plan

    def component_records(self, component: int, epoch: int, draws: np.ndarray) -> np.ndarray:
        """The records (component-local indices) of component ``component``'s draws ``draws``
        (numbered within the epoch) in epoch ``epoch``."""
        size = int(self.sizes[component])
        total = np.int64(self.draw_epoch(epoch)) * self.counts[component] + draws.astype(np.int64)
        numbers, positions = np.divmod(total, size)
        if len(numbers) == 0:
            return np.empty(0, dtype=np.int64)
        if numbers.min() == numbers.max():
            return self._pass_plan(component, int(numbers[0])).take(positions)
        out = np.empty(len(total), dtype=np.int64)
        for number in np.unique(numbers).tolist():
            where = numbers == number
            out[where] = self._pass_plan(component, number).take(positions[where])
        return out

    def records(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """The mixture's record indices at epoch positions ``positions``."""
        draws = self.draws(epoch, positions)
        component = self.component_of(draws)
        if len(self.sizes) == 1:
            return self.component_records(0, epoch, draws)
        out = np.empty(len(draws), dtype=np.int64)
        for i in np.unique(component).tolist():
            where = component == i
            out[where] = self.offsets[i] + self.component_records(i, epoch, draws[where] - self.draw_starts[i])
        return out


@dataclass(frozen=True)
class MixturePlan(StridedPlan):
    """Plan positions ``j`` are epoch positions ``first + j·step`` of the mixed order."""

    epoch: int
    first: int
    step: int
    length: int
    order: MixedOrder

    def _records(self, line: np.ndarray) -> np.ndarray:
        return self.order.records(self.epoch, line)


class MixtureMode(GlobalMode):
    """The mixed order dealt out to the ranks as global mode deals a permutation: positions
    count the epoch's records consumed by all ranks together (see the module)."""

    name = MIXTURE_MODE

    def __init__(self, order: MixedOrder, options: Any) -> None:
        super().__init__(order.epoch_size, options)
        self.mixed = order

    @classmethod
    def check(cls, options: Any) -> None:
        return None

    def plan(self, epoch: int, position: int) -> EpochPlan:
        first, length = self._segment(position)
        return MixturePlan(epoch, first, self.options.num_shards, length, self.mixed)


# -- resume states ---------------------------------------------------------------------------------


# -- the schedule ----------------------------------------------------------------------------------


def _pass_options(options: Any, component: int) -> Any:
    """The options of component ``component``'s own order: one shard (the mixture deals its
    mixed order out to the ranks; ``ranks_per_node`` is for splitting parts among nodes, which
    a mixture's passes do not), a seed of its own."""
    seed = options.shuffle_seed
    return dataclasses.replace(
        options,
        settings={key: value for key, value in options.settings.items() if key != "ranks_per_node"},
        shard_rank=0,
        num_shards=1,
        drop_shard_remainder=False,
        start_offset=0,
        resume_state=None,
        shuffle_seed=None if seed is None else _stable_seed("yogacache.mixture.pass/v1", seed, component) % (2**31),
    )


class MixtureSchedule(ReadSchedule):
    """The read order of one rank over a mixture (the ``ReadSchedule`` of a ``MixtureReader``):
    ``ReadSchedule``'s lengths, plans and moves over the mixed order (``MixtureMode``), with the
    mixture's own budget fitting, parts and resume states.

    ``names``, ``sizes`` and ``layouts`` describe the components, ``counts`` their records per
    epoch (``mixture_counts``); ``options.shuffle_mode`` is each component's own order.
    """

    def __init__(
        self,
        names: Sequence[str],
        sizes: Sequence[int],
        counts: Sequence[int],
        layouts: Sequence[PartLayout],
        options: Any,
        *,
        budget_bytes: Optional[int] = None,
        rotate: bool = True,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        """``rotate``: whether a downsampled component reads other records each epoch
        (``MixedOrder.draw_epoch``); ``block_size``: draws of the interleaving computed at a
        time (the order is the same for any)."""
        self.names = tuple(names)
        self.options = options
        self.layouts = list(layouts)
        passes = [
            shuffle_mode(options.shuffle_mode).with_layout(size, _pass_options(options, i), layout)
            for i, (size, layout) in enumerate(zip(sizes, layouts))
        ]
        self.mixed = MixedOrder(
            sizes,
            counts,
            passes,
            seed=options.shuffle_seed,
            shuffle=options.shuffle,
            reshuffle_each_epoch=options.reshuffle_each_epoch,
            rotate=rotate,
            block_size=block_size,
        )
        self.order = MixtureMode(self.mixed, options)
        self.num_records = self.mixed.epoch_size
        self.part_bases = np.concatenate([[0], np.cumsum([layout.num_parts for layout in layouts])[:-1]])
        self.fit_budget(budget_bytes)
        self.start: Point
        if options.resume_state is not None:
            self.start = self.resume_point(options.resume_state)
        else:
            self.start = self.order.start(options.start_offset)

    def fit_budget(self, budget_bytes: Optional[int]) -> None:
        """Fits each component's order to its share of a streamed mixture's byte budget: first
        what the smallest window needs of every component it reads (three of its largest parts:
        the one it reads, the one it moves on to, the one the next epoch starts with), then the
        rest in proportion to the bytes each reads per epoch. Shares in proportion alone left a
        small component less than one part, and the components fought over room (parts fetched
        twice in an epoch)."""
        if budget_bytes is None:
            return
        mixed = self.mixed
        reads = mixed.counts > 0
        largest = np.array([int(layout.sizes.max()) if layout.num_parts else 0 for layout in self.layouts])
        floors = np.where(reads, 3 * largest, 0)
        rates = np.array(
            [
                layout.num_bytes * count / max(1, size)
                for layout, count, size in zip(self.layouts, mixed.counts, mixed.sizes)
            ],
            dtype=np.float64,
        )
        shares = rates / rates.sum() if rates.sum() > 0 else np.full(len(rates), 1 / len(rates))
        rest = max(0, budget_bytes - int(floors.sum()))
        for mode, floor, share in zip(mixed.passes, floors.tolist(), shares.tolist()):
            mode.fit_budget(max(1, floor + int(rest * share)))

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(int(count) for count in self.mixed.counts)

    def parts_needed(self, epoch: int, position: int = 0) -> list[PartUse]:
        """The parts (numbered across components: ``part_bases``) this rank reads of ``epoch``
        from ``position`` on, in order of first use, from each component's own order:
        O(parts) where the components' orders are ``"parts"``. A part's plan positions are
        estimated from where the stratified interleaving puts its draws."""
        mixed = self.mixed
        shards = self.options.num_shards
        before = mixed.draws_before(epoch, position) if position else np.zeros(len(mixed.sizes), dtype=np.int64)
        uses: dict[int, tuple[int, int]] = {}
        for i, (size, count) in enumerate(zip(mixed.sizes.tolist(), mixed.counts.tolist())):
            if count == 0:
                continue
            drawn = mixed.draw_epoch(epoch)
            begin, end = drawn * count + int(before[i]), (drawn + 1) * count
            scale = mixed.epoch_size / count

            def at(draw: int, first_draw: int = drawn * count, scale: float = scale) -> int:
                slot = (draw - first_draw + 0.5) * scale
                return max(0, int((slot - position) // shards))

            for number in range(begin // size, (end - 1) // size + 1):
                low, high = max(begin - number * size, 0), min(end - number * size, size)
                for use in mixed.passes[i].parts_needed(number, low):
                    first = low + use.first
                    if first >= high:
                        continue
                    last = min(low + use.last, high - 1)
                    part = int(self.part_bases[i]) + use.part
                    span = (at(number * size + first), at(number * size + last))
                    seen = uses.get(part)
                    uses[part] = span if seen is None else (min(seen[0], span[0]), max(seen[1], span[1]))
        return sorted((PartUse(part, first, last) for part, (first, last) in uses.items()), key=lambda use: use.first)

    def state(self, point: Point, records: int = 0) -> dict[str, Any]:
        epoch, position = self.advance(point, records)
        return MixtureState(
            epoch,
            position,
            self.options.shuffle_seed,
            self.options.shuffle_mode,
            tuple(zip(self.names, self.mixed.sizes.tolist(), self.counts)),
            settings={key: value for key, value in self._settings().items() if key in MIXTURE_SETTINGS},
            builds=tuple(layout.build for layout in self.layouts),
            windows=self._windows(epoch, position),
        ).to_dict()

    # -- the state contract (``yogacache.read.state``) ------------------------------------------
    def _settings(self) -> dict[str, Any]:
        """What decides the mixed order besides the components, in the order to compare them."""
        options = self.options
        settings: dict[str, Any] = {"order": options.shuffle_mode, "shuffle": options.shuffle}
        if options.shuffle:
            settings["seed"] = options.shuffle_seed
            settings["reshuffle_each_epoch"] = options.reshuffle_each_epoch
        settings["rotate"] = self.mixed.rotate
        own = self.mixed.passes[0].order_settings() if self.mixed.passes else {}
        settings.update({key: own[key] for key in type(self.mixed.passes[0]).setting_keys if key in own})
        return settings

    def _pass_span(self, component: int, epoch: int, position: int) -> Optional[tuple[int, int]]:
        """The passes of component ``component`` from epoch ``epoch``'s position ``position`` to
        the pass its last draw of the epoch is in (read on into the next epoch); None if the
        component takes no records."""
        mixed = self.mixed
        count, size = int(mixed.counts[component]), int(mixed.sizes[component])
        if count == 0:
            return None
        drawn = mixed.draw_epoch(epoch) * count
        before = int(mixed.draws_before(epoch, position)[component]) if position else 0
        last = drawn + count - 1
        return min(drawn + before, last) // size, last // size

    def _windows(self, epoch: int, position: int) -> Optional[tuple[tuple[tuple[int, int], ...], ...]]:
        """Each component's windows (``PartsMode.window_runs``) over the passes the rest of the
        epoch reads; None where the components' order has no window."""
        passes = self.mixed.passes
        if not passes or not hasattr(passes[0], "window_runs"):
            return None
        found = []
        for i, mode in enumerate(passes):
            span = self._pass_span(i, epoch, min(position, self.num_records))
            found.append(() if span is None else tuple(mode.window_runs(*span)))  # type: ignore[attr-defined]
        return tuple(found)

    def order_settings(self) -> dict[str, Any]:
        """Everything that decides this rank's mixed order (``ReadSchedule.order_settings``): the
        components, their builds and counts, the settings, the windows fitted to the budget."""
        options = self.options
        windows = [getattr(mode, "window", None) for mode in self.mixed.passes]
        return {
            "mode": MIXTURE_MODE,
            "components": [list(each) for each in zip(self.names, self.mixed.sizes.tolist(), self.counts)],
            "builds": [layout.build for layout in self.layouts],
            **self._settings(),
            "shard_rank": options.shard_rank,
            "num_shards": options.num_shards,
            "drop_shard_remainder": options.drop_shard_remainder,
            "windows": windows,
        }

    def resume_point(self, resume_state: Mapping[str, Any]) -> Point:
        """The point a mixture's resume state names, refused (naming what changed) unless it was
        taken of this mixture: the same components, builds, counts and order settings
        (``check_state``), and a position in range. Windows fitted to another budget are
        honoured: each component reads the passes the state's epoch reads with the state's."""
        state = MixtureState.from_dict(resume_state)
        ours = tuple(zip(self.names, self.mixed.sizes.tolist(), self.counts))
        check_components(state.components, state.builds, ours, [layout.build for layout in self.layouts])
        check_state(
            state.to_dict(),
            self._settings(),
            {"epoch": (0, MAX_EPOCH), "consumed": (0, self.num_records)},
            reader="this mixture",
        )
        if state.windows is not None:
            for mode, runs in zip(self.mixed.passes, state.windows):
                if runs and hasattr(mode, "pin_windows"):
                    mode.pin_windows(list(runs), "share of the budget")
        point = ResumeState(MIXTURE_MODE, state.epoch, state.consumed, state.seed, self.num_records)
        return self.order.resume_point(point)
