"""DataLayer: Determined-style decorators that cache a dataset function and return this rank's stream."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Union

from yogacache.config import SharedFSConfig, StorageConfig, parse_config
from yogacache.dataref import CacheDataRef, Stream
from yogacache.integrity import Verify
from yogacache.names import validate_name
from yogacache.sampler import _as_int
from yogacache.store import CacheStore, default_cache_root
from yogacache.writer import BuildLimits

TRAIN_SUFFIX = "_train"
VALIDATION_SUFFIX = "_val"


class DataLayer:
    """Caches dataset-building functions and serves this process's shard of them.

    Args:
        config: a ``data_layer`` dict (Determined's schema), a parsed config, or ``None`` for
            the local default under the user's cache directory.
        rank: this process's shard index.
        num_shards: how many processes share the data.
        seed: the trial seed; every shuffled epoch derives its order from it.
        offset: records of this shard already consumed (resume mid-epoch).
        max_records, max_bytes: limits for one build (unknown-cardinality datasets stop there).
    """

    def __init__(
        self,
        config: Union[Mapping[str, Any], StorageConfig, None] = None,
        *,
        rank: int = 0,
        num_shards: int = 1,
        seed: int = 0,
        offset: int = 0,
        max_records: Optional[int] = None,
        max_bytes: Optional[int] = None,
        verify: Verify = "auto",
        show_progress: bool = True,
    ) -> None:
        self.config = parse_config(config)
        self.num_shards = _as_int(num_shards, "num_shards")
        self.rank = _as_int(rank, "rank")
        if self.num_shards < 1:
            raise ValueError(f"num_shards must be at least 1, got {self.num_shards}")
        if not 0 <= self.rank < self.num_shards:
            raise ValueError(f"rank must be in [0, {self.num_shards}), got {self.rank}")
        self.seed = _as_int(seed, "seed")
        self.offset = _as_int(offset, "offset")
        if self.offset < 0:
            raise ValueError(f"offset must not be negative, got {self.offset}")
        self.store = make_store(
            self.config,
            verify=verify,
            limits=BuildLimits(max_records=max_records, max_bytes=max_bytes),
            show_progress=show_progress,
        )

    @classmethod
    def from_config(cls, config: Union[Mapping[str, Any], StorageConfig, None], **kwargs: Any) -> DataLayer:
        return cls(config, **kwargs)

    def __repr__(self) -> str:
        return (
            f"DataLayer(root={str(self.store.root)!r}, rank={self.rank}, "
            f"num_shards={self.num_shards}, seed={self.seed}, offset={self.offset})"
        )

    # -- building blocks ------------------------------------------------------------------
    def dataref(self, dataset_id: str, dataset_version: str, make_data: Callable[[], Any]) -> CacheDataRef:
        """The cache of (dataset_id, dataset_version), built from ``make_data()`` on a miss."""
        return CacheDataRef(self.store.get_or_build(dataset_id, dataset_version, make_data))

    def _decorate(
        self,
        dataset_id: str,
        dataset_version: str,
        suffix: str,
        stream_args: Callable[[], dict[str, Any]],
        adapter: Callable[[Stream], Any],
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        validate_name(dataset_id, "dataset_id")
        validate_name(dataset_version, "dataset_version")
        version = dataset_version + suffix

        def decorator(make_dataset: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(make_dataset)
            def cached(*args: Any, **kwargs: Any) -> Any:
                ref = self.dataref(dataset_id, version, lambda: make_dataset(*args, **kwargs))
                return adapter(ref.stream(**stream_args()))

            return cached

        return decorator

    # -- Determined's decorators ----------------------------------------------------------
    def cache_train_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function returning a tf.data.Dataset; the result returns this rank's
        cached training shard (version ``<version>_train``, remainder dropped, resumed at
        ``offset``, shuffled with ``seed``)."""
        return self._decorate(
            dataset_id,
            dataset_version,
            TRAIN_SUFFIX,
            lambda: dict(
                start_offset=self.offset,
                shuffle=shuffle,
                skip_shuffle_at_epoch_end=skip_shuffle_at_epoch_end,
                shuffle_seed=self.seed,
                shard_rank=self.rank,
                num_shards=self.num_shards,
                drop_shard_remainder=True,
            ),
            _tf_adapter,
        )

    def cache_validation_dataset(
        self, dataset_id: str, dataset_version: str, shuffle: bool = False
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function returning a tf.data.Dataset; the result returns this rank's
        cached validation shard (version ``<version>_val``, from the start, same order every epoch)."""
        return self._decorate(
            dataset_id,
            dataset_version,
            VALIDATION_SUFFIX,
            lambda: dict(
                start_offset=0,
                shuffle=shuffle,
                skip_shuffle_at_epoch_end=True,
                shuffle_seed=self.seed,
                shard_rank=self.rank,
                num_shards=self.num_shards,
                drop_shard_remainder=False,
            ),
            _tf_adapter,
        )


def make_store(
    config: Optional[StorageConfig],
    *,
    verify: Verify = "auto",
    limits: BuildLimits = BuildLimits(),
    show_progress: bool = True,
) -> Union[CacheStore, Any]:
    """The store a config names: a CacheStore for shared_fs and the local default, a
    RemoteCacheStore (with node-local copies) for s3 and gcs."""
    if config is None or isinstance(config, SharedFSConfig):
        root = (config.storage_path if config is not None else None) or default_cache_root()
        return CacheStore(root, verify=verify, limits=limits, show_progress=show_progress)
    from yogacache.remote import RemoteCacheStore, object_store_for

    return RemoteCacheStore(
        object_store_for(config),
        config.local_cache_path or default_cache_root(),
        verify=verify,
        limits=limits,
        show_progress=show_progress,
    )


def _tf_adapter(stream: Stream) -> Any:
    from yogacache.tensorflow import make_tf_dataset

    return make_tf_dataset(stream)
