"""Rank discovery: this process's shard index and shard count, from what launched it.

Explicit arguments always win, each on its own. What is not given comes from, in order:

1. a TensorFlow ``tf.distribute.InputContext`` (what ``strategy.distribute_datasets_from_function``
   passes to the dataset function): one shard per input pipeline;
2. an initialized ``torch.distributed`` process group;
3. the environment of torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``);
4. the environment of Horovod (``HOROVOD_RANK``, ``HOROVOD_SIZE``, ``HOROVOD_LOCAL_RANK``);
5. a single process: rank 0 of 1.

Neither TensorFlow nor torch is imported here: an InputContext is recognized by its attributes,
and torch.distributed is asked only when the program already imported it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from yogacache.arguments import as_int


@dataclass(frozen=True)
class RankInfo:
    """Where this process stands: ``rank`` of ``num_shards``, and what said so."""

    rank: int
    num_shards: int
    local_rank: int = 0
    source: str = "default"

    def __post_init__(self) -> None:
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, got {self.num_shards} (from {self.source})")
        if not 0 <= self.rank < self.num_shards:
            raise ValueError(
                f"rank must be in [0, {self.num_shards}), got {self.rank} (from {self.source})"
            )


def is_input_context(value: Any) -> bool:
    """Whether ``value`` is a ``tf.distribute.InputContext`` (without importing TensorFlow)."""
    return (
        type(value).__name__ == "InputContext"
        and type(value).__module__.startswith("tensorflow")
        and hasattr(value, "input_pipeline_id")
        and hasattr(value, "num_input_pipelines")
    )


def _from_input_context(context: Any) -> RankInfo:
    return RankInfo(
        as_int(context.input_pipeline_id, "input_pipeline_id"),
        as_int(context.num_input_pipelines, "num_input_pipelines"),
        source="tf.distribute.InputContext",
    )


def _from_torch_distributed() -> Optional[RankInfo]:
    distributed = sys.modules.get("torch.distributed")
    if distributed is None:
        return None
    try:
        if not (distributed.is_available() and distributed.is_initialized()):
            return None
        rank, size = distributed.get_rank(), distributed.get_world_size()
    except (RuntimeError, ValueError):
        return None
    local = _env_int(os.environ, "LOCAL_RANK")
    return RankInfo(rank, size, local if local is not None else 0, source="torch.distributed")


def _env_int(environ: Mapping[str, str], name: str) -> Optional[int]:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _from_environment(environ: Mapping[str, str]) -> Optional[RankInfo]:
    for rank_name, size_name, local_name, source in (
        ("RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun environment (RANK, WORLD_SIZE)"),
        ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "Horovod environment (HOROVOD_RANK, HOROVOD_SIZE)"),
    ):
        rank, size = _env_int(environ, rank_name), _env_int(environ, size_name)
        if rank is None and size is None:
            continue
        if rank is None or size is None:
            raise ValueError(
                f"{rank_name} and {size_name} must be set together; found only "
                f"{rank_name if rank is not None else size_name}"
            )
        local = _env_int(environ, local_name)
        return RankInfo(rank, size, local if local is not None else 0, source=source)
    return None


def discover(input_context: Any = None, environ: Optional[Mapping[str, str]] = None) -> RankInfo:
    """This process's rank and shard count according to its launcher (rank 0 of 1 if none)."""
    if input_context is not None:
        return _from_input_context(input_context)
    found = _from_torch_distributed() or _from_environment(os.environ if environ is None else environ)
    return found or RankInfo(0, 1)


def resolve(
    rank: Optional[int] = None,
    num_shards: Optional[int] = None,
    input_context: Any = None,
    environ: Optional[Mapping[str, str]] = None,
) -> RankInfo:
    """``(rank, num_shards)``: each explicit argument wins; the launcher supplies the rest."""
    if rank is not None and num_shards is not None:
        return RankInfo(as_int(rank, "rank"), as_int(num_shards, "num_shards"), source="arguments")
    found = discover(input_context, environ)
    if rank is None and num_shards is None:
        return found
    return RankInfo(
        found.rank if rank is None else as_int(rank, "rank"),
        found.num_shards if num_shards is None else as_int(num_shards, "num_shards"),
        found.local_rank,
        source=f"arguments and {found.source}",
    )
