"""KeyedPermutation: a pseudo-random bijection of [0, N) evaluated on any positions, never stored.

Global shuffle needs each epoch's order of the whole dataset on every rank, and storing it is not
an option at scale (a 10⁹-record epoch would be an 8 GB index array per process). Instead the
order is computed: a Feistel network over the smallest power of two of at least 4 and at least N,
with cycle walking to stay inside [0, N). A Feistel network is a bijection by construction, whatever
its round function, so every epoch reads every record exactly once; ``map`` turns an array of
positions into record indices with time and memory linear in that array only. Round keys come
from (seed, epoch) through BLAKE2b, so every process on every platform computes the same order.

Pure numpy, no I/O.
"""

from __future__ import annotations

import hashlib
import operator
from typing import Any

import numpy as np

ROUNDS = 6  # even: the two halves end where they started
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_SHIFT_30, _SHIFT_27, _SHIFT_31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit flips about half the output bits (wraps mod 2⁶⁴)."""
    values = (values ^ (values >> _SHIFT_30)) * _MIX_1
    values = (values ^ (values >> _SHIFT_27)) * _MIX_2
    return values ^ (values >> _SHIFT_31)


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(value).__name__}") from None


class KeyedPermutation:
    """The permutation of ``range(size)`` keyed by ``(seed, epoch)``.

    ``perm.map(positions)[i]`` is the record read at global position ``positions[i]``. Two
    permutations with the same size, seed and epoch are equal in every process.
    """

    def __init__(self, size: int, seed: int, epoch: int = 0) -> None:
        self.size = _as_int(size, "size")
        self.seed = _as_int(seed, "seed")
        self.epoch = _as_int(epoch, "epoch")
        if self.size < 0:
            raise ValueError(f"size must not be negative, got {self.size}")
        if self.size > 1 << 62:
            raise ValueError(f"size must be at most 2**62, got {self.size}")
        bits = max(2, (self.size - 1).bit_length())
        # x = high << low_bits | low; each round moves the low half up and mixes it into the high.
        self._high_bits = bits - bits // 2
        self._low_bits = bits // 2
        digest = hashlib.blake2b(
            f"yogacache.permutation/v1:{self.seed}:{self.epoch}".encode(), digest_size=8 * ROUNDS
        ).digest()
        self._keys = [np.uint64(key) for key in np.frombuffer(digest, dtype="<u8")]

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"KeyedPermutation(size={self.size}, seed={self.seed}, epoch={self.epoch})"

    def map(self, positions: Any) -> np.ndarray:
        """The record indices (int64) at ``positions``, each in ``[0, size)``."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.size):
            raise IndexError(f"positions must lie in [0, {self.size})")
        values = self._encrypt(positions.astype(np.uint64))
        # Cycle walking: outside [0, size), apply the network again. The cycle of an inside
        # point returns inside, so this ends, and the result is a bijection of [0, size).
        bound = np.uint64(self.size)
        outside = np.flatnonzero(values >= bound)
        while outside.size:
            values[outside] = self._encrypt(values[outside])
            outside = outside[values[outside] >= bound]
        return values.astype(np.int64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        high_bits, low_bits = self._high_bits, self._low_bits
        for key in self._keys:
            low_shift, high_shift = np.uint64(low_bits), np.uint64(high_bits)
            high = values >> low_shift
            low = values & np.uint64((1 << low_bits) - 1)
            mixed = _mix(low ^ key) & np.uint64((1 << high_bits) - 1)
            values = (low << high_shift) | (high ^ mixed)
            high_bits, low_bits = low_bits, high_bits
        return values
