"""DataRef and Storage: YogaDL's reading interface, over a CacheReader and the read pipeline.

The facade: ``stream`` takes YogaDL's loose arguments and converts them once into
``ReadOptions``; the read pipeline (``yogacache.read.pipeline``) does the rest.
"""

from __future__ import annotations

import abc
import hashlib
import inspect
import json
import os
import warnings
from pathlib import Path, PurePath
from typing import Any, Callable, Mapping, Optional, Union

import numpy as np

from yogacache import launcher
from yogacache.errors import CacheNotFoundError
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.format.sources import AnnotatedSource, source_for
from yogacache.format.spec import Spec
from yogacache.format.yogadl_legacy import LEGACY_CACHE_NAME
from yogacache.read.options import ReadOptions, stream_signature
from yogacache.read.pipeline import Stream, read_stream
from yogacache.read.reader import CacheReader
from yogacache.sources.freshness import check_before_sync, ensure_fresh
from yogacache.store import yogadl as yogadl_caches
from yogacache.store.base import Store

__all__ = [
    "ARGUMENTS_EXTRA_KEY",
    "CacheDataRef",
    "DataRef",
    "LMDBDataRef",
    "Storage",
    "Stream",
    "arguments_fingerprint",
    "cached_dataref",
]

# The manifest ``extra`` entry recording the arguments a cache's dataset function was called with.
ARGUMENTS_EXTRA_KEY = "build_arguments"


class DataRef(metaclass=abc.ABCMeta):
    """A reference to a cached dataset; the only way to its records is a Stream."""

    @abc.abstractmethod
    def stream(self, *args: Any, **kwargs: Any) -> Stream:
        """A stream over one shard of the dataset, in the order the arguments define: YogaDL's
        ``start_offset=0, shuffle=False, skip_shuffle_at_epoch_end=False, shuffle_seed=None,
        shard_rank=0, num_shards=1, drop_shard_remainder=False``
        (``yogacache.read.options.STREAM_ARGUMENTS``)."""

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
        if isinstance(reader, CacheReader):
            self.reader = reader
            return
        directory = Path(reader)
        if directory.name == LEGACY_CACHE_NAME and directory.is_file():
            # YogaDL's LMDBDataRef took the cache.mdb: its converted cache lives beside it.
            if not (directory.parent / MANIFEST_NAME).is_file():
                raise CacheNotFoundError(
                    f"{directory} is a YogaDL cache: convert it first (yogacache migrate, or "
                    "fetch it through yogacache.storage), then open its directory"
                )
            directory = directory.parent
        self.reader = CacheReader(directory)

    @property
    def manifest(self) -> Any:
        return self.reader.manifest

    def __len__(self) -> int:
        return len(self.reader)

    def stream(self, *args: Any, **kwargs: Any) -> Stream:
        """YogaDL's ``stream``, plus ``shuffle_mode="global"`` (each epoch one permutation of the
        whole dataset dealt out to the ranks, resumable with any number of ranks) and
        ``resume_state`` (a ``Stream.state_dict`` result, instead of ``start_offset``).
        ``skip_shuffle_end_of_epoch`` is Determined's spelling of ``skip_shuffle_at_epoch_end``;
        ``parts_window`` and ``ranks_per_node`` tune ``shuffle_mode="parts"`` (any mode's setting
        keywords are taken: ``ReadOptions``). The arguments are ``ReadOptions.from_stream_args``'s."""
        return self.open_stream(ReadOptions.from_stream_args(*args, **kwargs))

    stream.__signature__ = stream_signature()  # type: ignore[attr-defined]

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


# -- the decorators' shared call ------------------------------------------------------------------
def _canonical(value: Any) -> Any:
    """``value`` as JSON that is equal exactly when the values are (objects of other types
    count by type only: their reprs hold addresses)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": repr(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, np.generic):
        return {"numpy": value.dtype.str, "value": _canonical(value.item())}
    if isinstance(value, np.ndarray) and not value.dtype.hasobject:
        digest = hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()
        return {"ndarray": value.dtype.str, "shape": list(value.shape), "sha256": digest}
    if isinstance(value, PurePath):
        return {"path": str(value)}
    if isinstance(value, (list, tuple)):
        return {type(value).__name__: [_canonical(item) for item in value]}
    if isinstance(value, Mapping):
        items = [[_canonical(k), _canonical(v)] for k, v in value.items()]
        return {"dict": sorted(items, key=lambda item: json.dumps(item, sort_keys=True))}
    kind = type(value)
    return {"object": f"{kind.__module__}.{kind.__qualname__}"}


def arguments_fingerprint(function: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """A hash of the arguments ``function`` is called with, by parameter name and with defaults
    filled in (``make(3)`` and ``make(size=3)`` agree); a ``tf.distribute.InputContext`` (one per
    rank) does not count. Only the hash is kept: arguments may hold secrets."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
        bound.apply_defaults()
        named: dict[str, Any] = dict(bound.arguments)
    except (TypeError, ValueError):
        named = {"*args": args, "**kwargs": dict(kwargs)}
    kept = {name: value for name, value in named.items() if not launcher.is_input_context(value)}
    text = json.dumps(_canonical(kept), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def cached_dataref(
    store: Store,
    dataset_id: str,
    dataset_version: str,
    make_dataset: Callable[..., Any],
    args: tuple[Any, ...] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
) -> CacheDataRef:
    """The cache of (dataset_id, dataset_version), built from ``make_dataset(*args, **kwargs)``
    when nobody has built it (a YogaDL cache.mdb counts as built).

    As in YogaDL, the arguments are not part of the cache key; the build records their
    fingerprint in the manifest, and a call with other arguments gets the cached dataset with a
    warning saying so.
    """
    kwargs = dict(kwargs or {})
    fingerprint = arguments_fingerprint(make_dataset, args, kwargs)
    extra = {ARGUMENTS_EXTRA_KEY: {"fingerprint": fingerprint}}

    def make_data() -> AnnotatedSource:
        return AnnotatedSource(source_for(make_dataset(*args, **kwargs)), extra)

    # A cache built from pinned objects (yogacache.sources) is checked against them on a hit:
    # the published one before a node downloads it, then the one opened if it is another.
    checked = check_before_sync(store, dataset_id, dataset_version, make_data)
    reader = yogadl_caches.get_or_build(store, dataset_id, dataset_version, make_data)
    if reader.manifest.build_id != checked:
        reader = ensure_fresh(store, dataset_id, dataset_version, reader, make_data)
    recorded = reader.manifest.extra.get(ARGUMENTS_EXTRA_KEY)
    recorded = recorded.get("fingerprint") if isinstance(recorded, dict) else None
    if recorded is not None and recorded != fingerprint:
        name = getattr(make_dataset, "__qualname__", "the dataset function")
        warnings.warn(
            f"{name}() was called with other arguments than those the cache "
            f"{dataset_id}:{dataset_version} was built with: function arguments are not part of "
            "the cache key (as in YogaDL), so this returns the cached dataset, not one made with "
            "these arguments. Use another dataset_version for a different dataset, or remove the "
            f"cache (yogacache rm {dataset_id} {dataset_version}) to rebuild it",
            UserWarning,
            stacklevel=3,
        )
    return CacheDataRef(reader)
