"""ReadOptions: every argument of how a rank reads a cache, as one frozen, validated object.

The facade (``DataRef.stream``, the DataLayer decorators, the torch dataset's constructor) keeps
YogaDL's loose keyword arguments and converts them once with ``ReadOptions.from_stream_args``;
everything below takes a ``ReadOptions``.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from yogacache.arguments import as_int
from yogacache.read.parts_shuffle import DEFAULT_PARTS_WINDOW, parts_window, ranks_per_node
from yogacache.read.schedule import ResumeState
from yogacache.read.shuffle import ShardMode, shuffle_mode

__all__ = ["DEFAULT_SHUFFLE_MODE", "ReadOptions"]

log = logging.getLogger(__name__)

DEFAULT_SHUFFLE_MODE = ShardMode.name


@dataclass(frozen=True)
class ReadOptions:
    """How one rank reads a cache (see DESIGN.md, "Reading").

    Attributes:
        start_offset: records of this rank already consumed (YogaDL's meaning): reading starts
            in epoch ``start_offset // len(shard)`` at ``start_offset % len(shard)``.
        shuffle: shuffle the records (otherwise dataset order).
        reshuffle_each_epoch: epoch ``e`` uses its own order derived from ``shuffle_seed`` and
            ``e``; otherwise every epoch uses the order of ``shuffle_seed`` (YogaDL's
            ``skip_shuffle_at_epoch_end=True``).
        shuffle_seed: the seed every shuffled order derives from.
        shard_rank: this rank, in ``[0, num_shards)``.
        num_shards: how many ranks share the dataset.
        drop_shard_remainder: read only the first ``N - N % num_shards`` records (shard mode), or
            end each epoch at a multiple of ``num_shards`` positions (global mode), so that every
            rank reads as many records as the others.
        shuffle_mode: the name of a mode in ``yogacache.read.shuffle.SHUFFLE_MODES``.
        resume_state: a resume state dict (``Stream.state_dict``), instead of ``start_offset``.
        parts_window: parts mixed at a time in ``"parts"`` mode (each rank then needs as
            many parts, and one more to read ahead).
        ranks_per_node: consecutive ranks that share a node (``"parts"`` mode gives each node
            one run of parts, which its ranks read together); None: unknown, a run per rank.
    """

    start_offset: int = 0
    shuffle: bool = False
    reshuffle_each_epoch: bool = False
    shuffle_seed: Optional[int] = None
    shard_rank: int = 0
    num_shards: int = 1
    drop_shard_remainder: bool = False
    shuffle_mode: str = DEFAULT_SHUFFLE_MODE
    resume_state: Optional[Mapping[str, Any]] = None
    parts_window: int = DEFAULT_PARTS_WINDOW
    ranks_per_node: Optional[int] = None

    def __post_init__(self) -> None:
        def normalize(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        for flag in ("shuffle", "reshuffle_each_epoch", "drop_shard_remainder"):
            normalize(flag, bool(getattr(self, flag)))
        num_shards = as_int(self.num_shards, "num_shards")
        if num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, got {num_shards}")
        shard_rank = as_int(self.shard_rank, "shard_rank")
        if not 0 <= shard_rank < num_shards:
            raise ValueError(f"shard_rank must be in [0, {num_shards}), got {shard_rank}")
        start_offset = as_int(self.start_offset, "start_offset")
        if start_offset < 0:
            raise ValueError(f"start_offset must not be negative, got {start_offset}")
        normalize("num_shards", num_shards)
        normalize("shard_rank", shard_rank)
        normalize("start_offset", start_offset)
        if self.shuffle_seed is not None:
            normalize("shuffle_seed", as_int(self.shuffle_seed, "shuffle_seed"))
        mode = shuffle_mode(self.shuffle_mode)
        normalize("parts_window", parts_window(self))
        if self.ranks_per_node is not None:
            normalize("ranks_per_node", ranks_per_node(self))
        if self.resume_state is not None:
            if start_offset:
                raise ValueError("pass either start_offset or resume_state, not both")
            # A checked copy: the caller's dict may change later, these options may not.
            normalize("resume_state", ResumeState.from_dict(self.resume_state).to_dict())
        mode.check(self)
        if self.shuffle and self.shuffle_seed is None and self.resume_state is None:
            # A seedless shuffle (allowed: one order for every epoch) gets one concrete seed
            # here, so every reader of these options (DataLoader workers included) computes the
            # same order, and the log says how to reproduce it.
            seed = secrets.randbelow(2**31)
            normalize("shuffle_seed", seed)
            log.warning(
                "shuffle=True without shuffle_seed: shuffling with shuffle_seed=%d (pass it to "
                "reproduce this order)",
                seed,
            )

    @classmethod
    def from_stream_args(
        cls,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
        *,
        shuffle_mode: str = DEFAULT_SHUFFLE_MODE,
        resume_state: Optional[Mapping[str, Any]] = None,
        parts_window: int = DEFAULT_PARTS_WINDOW,
        ranks_per_node: Optional[int] = None,
    ) -> ReadOptions:
        """The options YogaDL's ``DataRef.stream(...)`` arguments (and ours after ``*``) stand for."""
        return cls(
            start_offset=start_offset,
            shuffle=bool(shuffle),
            reshuffle_each_epoch=bool(shuffle) and not skip_shuffle_at_epoch_end,
            shuffle_seed=shuffle_seed,
            shard_rank=shard_rank,
            num_shards=num_shards,
            drop_shard_remainder=drop_shard_remainder,
            shuffle_mode=shuffle_mode,
            resume_state=resume_state,
            parts_window=parts_window,
            ranks_per_node=ranks_per_node,
        )
