"""DataRef and Storage: YogaDL's reading interface, over a CacheReader and the read pipeline.

The facade: ``stream`` takes YogaDL's loose arguments and converts them once into
``ReadOptions``; the read pipeline (``yogacache.read.pipeline``) does the rest.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from yogacache.arguments import skip_shuffle_flag
from yogacache.format.spec import Spec
from yogacache.read.options import DEFAULT_SHUFFLE_MODE, ReadOptions
from yogacache.read.pipeline import Stream, read_stream
from yogacache.read.reader import CacheReader

__all__ = ["CacheDataRef", "DataRef", "LMDBDataRef", "Storage", "Stream"]


class DataRef(metaclass=abc.ABCMeta):
    """A reference to a cached dataset; the only way to its records is a Stream."""

    @abc.abstractmethod
    def stream(
        self,
        start_offset: int = 0,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        shuffle_seed: Optional[int] = None,
        shard_rank: int = 0,
        num_shards: int = 1,
        drop_shard_remainder: bool = False,
    ) -> Stream:
        """A stream over one shard of the dataset, in the order the arguments define."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of records in the whole dataset."""


def _tf_structure(spec: Spec, what: str) -> Any:
    """``Stream.output_types``/``output_shapes`` of a spec: TensorFlow is imported on first use."""
    from yogacache.tensorflow import spec_to_tf

    return spec_to_tf(spec, what)


class CacheDataRef(DataRef):
    """A DataRef over a sealed local cache (given as its reader or its directory)."""

    def __init__(self, reader: Union[CacheReader, str, "os.PathLike[str]"]) -> None:
        self.reader = reader if isinstance(reader, CacheReader) else CacheReader(Path(reader))

    @property
    def manifest(self) -> Any:
        return self.reader.manifest

    def __len__(self) -> int:
        return len(self.reader)

    def stream(
        self,
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
        skip_shuffle_end_of_epoch: Optional[bool] = None,
    ) -> Stream:
        """YogaDL's ``stream``, plus ``shuffle_mode="global"`` (each epoch one permutation of the
        whole dataset dealt out to the ranks, resumable with any number of ranks) and
        ``resume_state`` (a ``Stream.state_dict`` result, instead of ``start_offset``).
        ``skip_shuffle_end_of_epoch`` is Determined's spelling of ``skip_shuffle_at_epoch_end``."""
        options = ReadOptions.from_stream_args(
            start_offset,
            shuffle,
            skip_shuffle_flag(skip_shuffle_at_epoch_end, skip_shuffle_end_of_epoch),
            shuffle_seed,
            shard_rank,
            num_shards,
            drop_shard_remainder,
            shuffle_mode=shuffle_mode,
            resume_state=resume_state,
        )
        return self.open_stream(options)

    def open_stream(self, options: ReadOptions) -> Stream:
        """The stream ``options`` define (``stream`` with its arguments already converted)."""
        return read_stream(self.reader, options, spec_converter=_tf_structure)


# YogaDL's name for the DataRef its storages return (``yogadl.dataref.LMDBDataRef``): programs
# annotate with it and check ``isinstance`` on what ``fetch`` and ``cacheable`` return.
LMDBDataRef = CacheDataRef


class Storage(metaclass=abc.ABCMeta):
    """A cache of datasets: ``submit`` stores, ``fetch`` returns a DataRef, ``cacheable`` does both."""

    @abc.abstractmethod
    def submit(self, data: Any, dataset_id: str, dataset_version: str) -> None:
        """Stores ``data`` as the cache of (dataset_id, dataset_version)."""

    @abc.abstractmethod
    def fetch(self, dataset_id: str, dataset_version: str) -> DataRef:
        """A DataRef to the cache of (dataset_id, dataset_version)."""

    @abc.abstractmethod
    def cacheable(self, dataset_id: str, dataset_version: str) -> Callable[..., Any]:
        """A decorator: the wrapped function builds the dataset only when it is not cached."""
