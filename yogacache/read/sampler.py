"""Which record indices a shard reads, in which order, from which position: pure numpy, no I/O.

These are YogaDL 0.1.4's read semantics (see docs/design.md, "Reading"):

1. with ``drop_remainder``, keep the first ``N - N % num_shards`` records;
2. rank ``r`` takes records ``r, r + S, r + 2S, ...``;
3. epoch ``e`` shuffles the shard with ``np.random.RandomState(seed + e).permutation(len)``
   (``seed`` alone when the order is not reshuffled at epoch end);
4. ``start_offset`` counts records within the shard: the first epoch is
   ``start_offset // len(shard)``, starting at ``start_offset % len(shard)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from yogacache.arguments import as_int


def shard_indices(
    num_records: int, shard_rank: int, num_shards: int, drop_remainder: bool
) -> np.ndarray:
    """The record indices of one shard, in dataset order."""
    num_records = as_int(num_records, "num_records")
    shard_rank = as_int(shard_rank, "shard_rank")
    num_shards = as_int(num_shards, "num_shards")
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    if not 0 <= shard_rank < num_shards:
        raise ValueError(f"shard_rank must be in [0, {num_shards}), got {shard_rank}")
    if num_records < 0:
        raise ValueError(f"num_records must not be negative, got {num_records}")
    end = num_records - num_records % num_shards if drop_remainder else num_records
    return np.arange(shard_rank, end, num_shards, dtype=np.int64)


def check_shuffle(shuffle: bool, reshuffle_each_epoch: bool, seed: Optional[int]) -> None:
    """Raises unless YogaDL's shard order can be computed from these shuffle arguments."""
    if reshuffle_each_epoch and not shuffle:
        raise ValueError("reshuffling at epoch end needs shuffle=True")
    if shuffle and reshuffle_each_epoch and seed is None:
        raise ValueError(
            "shuffle_seed must be set when shuffle=True and skip_shuffle_at_epoch_end=False "
            "(each epoch's order is derived from shuffle_seed + epoch)"
        )
    if seed is not None:
        as_int(seed, "shuffle_seed")


@dataclass(frozen=True)
class ShardOrder:
    """The epoch-by-epoch read order of one shard."""

    shard: np.ndarray
    shuffle: bool = False
    reshuffle_each_epoch: bool = False
    seed: Optional[int] = None

    def __post_init__(self) -> None:
        check_shuffle(self.shuffle, self.reshuffle_each_epoch, self.seed)

    def __len__(self) -> int:
        return len(self.shard)

    def epoch(self, epoch: int) -> np.ndarray:
        """The record indices of ``epoch`` in read order."""
        if not self.shuffle or len(self.shard) == 0:
            return self.shard
        seed = self.seed
        if seed is not None and self.reshuffle_each_epoch:
            seed = seed + epoch
        permutation = np.random.RandomState(seed).permutation(len(self.shard))
        return self.shard[permutation]

    def start(self, start_offset: int) -> tuple[int, int]:
        """(epoch, position) where a stream that skipped ``start_offset`` records begins."""
        start_offset = as_int(start_offset, "start_offset")
        if start_offset < 0:
            raise ValueError(f"start_offset must not be negative, got {start_offset}")
        if len(self.shard) == 0:
            return 0, 0
        return divmod(start_offset, len(self.shard))
