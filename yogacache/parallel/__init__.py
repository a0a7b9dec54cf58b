"""Parallel builds: build shards fixed by the data, written by local worker processes or Ray tasks.

``sharded(data, workers=N)`` (``yogacache.parallel.pool``) is handed to any build in place of the
dataset; ``yogacache.parallel.ray`` (``pip install 'yogacache[ray]'``) builds from a list of build
shards as Ray tasks or from a Ray Dataset (``ds.write_datasink(CacheDatasink(...))``).
"""

from __future__ import annotations

from yogacache.parallel.pool import ShardedBuild, parallel_maker, sharded
from yogacache.parallel.shards import (
    BuilderCall,
    BuildShard,
    BuildShardError,
    CallShard,
    IndexRange,
    builder_shards,
    call_shards,
    plan_index_shards,
)

__all__ = [
    "BuildShard",
    "BuildShardError",
    "BuilderCall",
    "CallShard",
    "IndexRange",
    "ShardedBuild",
    "builder_shards",
    "call_shards",
    "parallel_maker",
    "plan_index_shards",
    "sharded",
]
