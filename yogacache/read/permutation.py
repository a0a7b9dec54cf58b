"""KeyedPermutation: a pseudo-random bijection of [0, N) evaluated on any positions, never stored.

Global shuffle needs each epoch's order of the whole dataset on every rank, and storing it is not
an option at scale (a 10⁹-record epoch would be an 8 GB index array per process). Instead the
order is computed by a Feistel network, which is a bijection by construction whatever its round
function, so every epoch reads every record exactly once. ``map`` turns an array of positions into
record indices with time and memory linear in that array only.

The network works on the mixed-radix domain ``[0, a·b)`` with ``a = ⌈√N⌉`` and ``b = ⌈N/a⌉``
(a value is a pair: high digit in base ``a``, low digit in base ``b``; each round moves the low digit
up and adds a keyed hash of it to the high one, modulo its base), so the domain exceeds N by less
than √N + 1 and the cycle walking that brings outside values back into [0, N) almost never runs.
Round keys come from (seed, epoch) through BLAKE2b: every process on every platform computes the
same order. Pure numpy, no I/O.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from yogacache.arguments import as_int

# Rounds of the network (even, so the digits end in the bases they started in). Small domains
# have few possible round functions and need more rounds to look uniformly shuffled.
ROUNDS = 8
SMALL_DOMAIN_ROUNDS = 24
SMALL_DOMAIN = 1 << 12
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_SHIFT_30, _SHIFT_27, _SHIFT_31 = np.uint64(30), np.uint64(27), np.uint64(31)
MAX_SIZE = 1 << 62


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, in place: each input bit flips about half the output bits."""
    values ^= values >> _SHIFT_30
    values *= _MIX_1  # uint64 arithmetic wraps modulo 2**64, as intended
    values ^= values >> _SHIFT_27
    values *= _MIX_2
    values ^= values >> _SHIFT_31
    return values




class KeyedPermutation:
    """The permutation of ``range(size)`` keyed by ``(seed, epoch)``.

    ``perm.map(positions)[i]`` is the record at global position ``positions[i]``. Permutations
    with the same size, seed and epoch are equal in every process.
    """

    def __init__(self, size: int, seed: int, epoch: int = 0) -> None:
        self.size = as_int(size, "size")
        self.seed = as_int(seed, "seed")
        self.epoch = as_int(epoch, "epoch")
        if not 0 <= self.size <= MAX_SIZE:
            raise ValueError(f"size must be in [0, 2**62], got {self.size}")
        high_base = max(1, math.isqrt(max(0, self.size - 1)) + 1)  # ⌈√size⌉
        low_base = max(1, -(-self.size // high_base))
        rounds = ROUNDS if self.size > SMALL_DOMAIN else SMALL_DOMAIN_ROUNDS
        # Per round: the key, the base of the low digit (which moves up) and of the high one.
        self._rounds: list[tuple[np.uint64, np.uint64, np.uint64]] = []
        for number in range(rounds):
            digest = hashlib.blake2b(
                f"yogacache.permutation/v1:{self.seed}:{self.epoch}:{number}".encode(), digest_size=8
            ).digest()
            key = np.uint64(int.from_bytes(digest, "little"))
            self._rounds.append((key, np.uint64(low_base), np.uint64(high_base)))
            high_base, low_base = low_base, high_base

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"KeyedPermutation(size={self.size}, seed={self.seed}, epoch={self.epoch})"

    def map(self, positions: Any) -> np.ndarray:
        """The record indices (int64) at ``positions``; raises IndexError outside ``[0, size)``."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.size):
            raise IndexError(f"positions must lie in [0, {self.size})")
        values = self._encrypt(positions.astype(np.uint64))
        # Cycle walking: a value outside [0, size) goes through the network again. The cycle of
        # an inside point comes back inside, so this ends, and the result stays a bijection.
        bound = np.uint64(self.size)
        outside = np.flatnonzero(values >= bound)
        while outside.size:
            values[outside] = self._encrypt(values[outside])
            outside = outside[values[outside] >= bound]
        return values.astype(np.int64)

    def _encrypt(self, values: np.ndarray) -> np.ndarray:
        """One pass of the network over ``[0, a·b)``: (high, low) → (low, high + F(low) mod a)."""
        for key, low_base, high_base in self._rounds:
            high, low = np.divmod(values, low_base)
            mixed = _mix(low ^ key)
            mixed %= high_base
            mixed += high  # both below high_base: no overflow
            mixed %= high_base
            low *= high_base
            low += mixed
            values = low
        return values
