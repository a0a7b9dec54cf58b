"""Epoch plans: the records one rank reads in (the rest of) an epoch, mapped from positions on demand.

A plan is what a shuffle mode (``yogacache.read.shuffle``) hands out for one epoch: ``indices``
of a slice of positions, or ``take`` of any positions. Pure numpy, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from yogacache.read.permutation import KeyedPermutation

__all__ = ["ArrayPlan", "EpochPlan", "GlobalPlan", "Point", "StridedPlan"]

Point = tuple[int, int]  # (epoch, position): where a rank is in its epochs


class EpochPlan(Protocol):
    """The records one rank reads in (the rest of) one epoch, in order."""

    @property
    def epoch(self) -> int: ...

    def __len__(self) -> int: ...

    def indices(self, start: int, stop: int) -> np.ndarray:
        """Record indices at plan positions ``[start, stop)`` (clipped to the plan)."""
        ...

    def take(self, positions: np.ndarray) -> np.ndarray:
        """Record indices at the plan positions ``positions`` (each in ``[0, len)``)."""
        ...


@dataclass(frozen=True)
class ArrayPlan:
    """A plan held as an index array (YogaDL's shard order)."""

    epoch: int
    order: np.ndarray

    def __len__(self) -> int:
        return len(self.order)

    def indices(self, start: int, stop: int) -> np.ndarray:
        return self.order[start:stop]

    def take(self, positions: np.ndarray) -> np.ndarray:
        return self.order[positions]


class StridedPlan:
    """A plan whose positions ``j`` are line positions ``first + j·step``; ``_records`` says
    which records a line's positions hold."""

    first: int
    step: int
    length: int

    def __len__(self) -> int:
        return self.length

    def indices(self, start: int, stop: int) -> np.ndarray:
        start, stop = max(0, start), min(stop, self.length)
        return self.take(np.arange(start, max(start, stop), dtype=np.int64))

    def take(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.length):
            raise IndexError(f"plan positions must lie in [0, {self.length})")
        return self._records(self.first + self.step * positions)

    def _records(self, line: np.ndarray) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class GlobalPlan(StridedPlan):
    """Plan positions ``j`` are global positions ``first + j·step`` of a (permuted) epoch."""

    epoch: int
    first: int
    step: int
    length: int
    permutation: Optional[KeyedPermutation]  # None: dataset order

    def _records(self, line: np.ndarray) -> np.ndarray:
        return line if self.permutation is None else self.permutation.map(line)
