"""Mixtures of caches: train on several datasets at set proportions, read as one DataRef.

``Mixture([Component(web, weight=0.7), Component(code, weight=0.2), Component(books,
weight=0.1)])`` reads three caches as one: each epoch exactly its share of each (see
``yogacache.read.mixture_order`` for the counts, the passes and the interleaving), sharded over ranks,
resumable at any world size, streamed under the node's one byte budget where the components are.
A mixture is a ``DataRef``: ``stream(...)`` takes YogaDL's arguments, and the torch datasets,
``yogacache.tensorflow.make_tf_dataset`` and ``DataLayer.train_mixture`` read it as they read a
cache. ``Mixture.from_config`` reads a ``mixture:`` section of a YAML config. See docs/mixtures.md.
"""

from __future__ import annotations

import copy
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from yogacache import redaction
from yogacache.errors import ConfigError
from yogacache.read.mixture_order import STOPPING_RULES, Share, check_shares, check_weights, mixture_counts
from yogacache.read.mixture_reader import MixtureReader
from yogacache.read.options import ReadOptions, stream_signature
from yogacache.read.pipeline import Stream, read_stream
from yogacache.read.reader import CacheReader

__all__ = ["Component", "Mixture", "load_mixture"]

log = redaction.get_logger(__name__)

Source = Any  # a CacheDataRef, a CacheReader, a cache directory, or a callable returning one


@dataclass(frozen=True)
class Component:
    """One cache of a mixture and its share of every epoch.

    Args:
        source: the cache: a ``CacheDataRef`` (what ``DataLayer.cache_dataset`` functions and
            storages' ``fetch`` return), a ``CacheReader``, a cache directory, or a callable
            taking no arguments that returns one (a decorated builder: it builds on a miss).
        weight: a relative share of ``epoch_size``. Give every component one or none: with none
            (and no repeat or samples), each weighs its records, the natural proportions.
        repeat: passes over the cache per epoch (``2.0`` upsamples it twice, ``0.5`` reads half
            of it per epoch, the other half the next).
        samples: records of the cache per epoch.
    """

    source: Source
    weight: Optional[float] = None
    repeat: Optional[float] = None
    samples: Optional[int] = None

    @property
    def share(self) -> Share:
        return Share(weight=self.weight, repeat=self.repeat, samples=self.samples)

    def open(self) -> CacheReader:
        return open_component(self.source)


def open_component(source: Source) -> CacheReader:
    """The reader of a component's cache (see ``Component.source``)."""
    if isinstance(source, CacheReader):
        return source
    reader = getattr(source, "reader", None)
    if isinstance(reader, CacheReader):
        return reader
    if isinstance(reader, MixtureReader):
        raise TypeError("a mixture's component is one cache, not another mixture: list its components instead")
    if isinstance(source, (str, os.PathLike)):
        return CacheReader(Path(source))
    if callable(source):
        try:
            inspect.signature(source).bind()
        except TypeError:
            raise TypeError(
                f"mixture component {getattr(source, '__qualname__', source)!r} needs arguments: pass the "
                "decorated builder (what @layer.cache_dataset(...) returns, called with none), not the decorator"
            ) from None
        except ValueError:  # no signature to check (a builtin): call it
            pass
        made = source()
        if callable(made) and not hasattr(made, "reader"):
            raise TypeError(
                f"mixture component {getattr(source, '__qualname__', source)!r} returned a function: pass the "
                "decorated builder (what @layer.cache_dataset(...) returns), not the decorator"
            )
        return open_component(made)
    raise TypeError(
        "a mixture component is a CacheDataRef, a CacheReader, a cache directory or a function returning one, "
        f"got {type(source).__name__}"
    )


class Mixture:
    """Several caches read as one at set proportions: a ``DataRef`` (``stream``, ``len``).

    Args:
        components: ``Component``s, or their sources (natural proportions, or the ``weights``).
        weights: relative weights, one per component (instead of ``Component(weight=)``).
        epoch_size: records per epoch, all ranks together, shared out by the weights; default:
            the components' records together. Not with ``repeat``/``samples`` (they set counts).
        stopping: instead of an epoch size, Hugging Face's rules: ``"first_exhausted"`` (the
            largest epoch whose quotas take no component past one pass: the first to run out
            is read through, or all but one record of it) or ``"all_exhausted"`` (the smallest
            whose quotas take every component through once; the others repeat, each a whole
            pass at a time). See ``yogacache.read.mixture_order`` for the formulas.

    ``len()`` is the epoch size (at most ``MAX_EPOCH_SIZE``, 2**32); ``counts`` each component's
    records per epoch (largest remainders of the exact quotas ``weight / Σ weight ·
    epoch_size``, ties to the earlier component); ``describe()`` says both.
    """

    def __init__(
        self,
        components: Sequence[Union[Component, Source]],
        *,
        weights: Optional[Sequence[float]] = None,
        epoch_size: Optional[int] = None,
        stopping: Optional[str] = None,
    ) -> None:
        if isinstance(components, (str, bytes, Mapping)) or not isinstance(components, Sequence):
            raise TypeError(f"components must be a list of caches, got {type(components).__name__}")
        listed = [each if isinstance(each, Component) else Component(each) for each in components]
        if not listed:
            raise ValueError("a mixture needs at least one component")
        if weights is not None:
            given = [i for i, each in enumerate(listed) if each.share != Share()]
            if given:
                raise ValueError(
                    f"pass weights= or a share on each Component, not both (component {given[0]} has its own)"
                )
            listed = [Component(each.source, weight=w) for each, w in zip(listed, check_weights(weights, len(listed)))]
        shares = [each.share for each in listed]
        check_shares(shares, epoch_size, stopping)  # before any cache is opened (a builder builds)
        readers = [each.open() for each in listed]
        counts = mixture_counts([len(reader) for reader in readers], shares, epoch_size, stopping)
        self.components = tuple(listed)
        self.stopping = stopping
        self.reader = MixtureReader(readers, counts)
        log.info("%s", self.describe())

    # -- what it reads -------------------------------------------------------------------------
    @property
    def counts(self) -> tuple[int, ...]:
        """Records of each component per epoch."""
        return self.reader.counts

    @property
    def names(self) -> tuple[str, ...]:
        """``<dataset_id>:<dataset_version>`` of each component."""
        return self.reader.names

    @property
    def epoch_size(self) -> int:
        return self.reader.epoch_size

    def __len__(self) -> int:
        """Records per epoch, all ranks together (a rank reads its share: ``len(stream)``)."""
        return self.reader.epoch_size

    def describe(self) -> str:
        """One line per component: records per epoch, their share, and passes per epoch."""
        total = self.epoch_size
        lines = [f"mixture of {len(self.counts)} caches, {total} records per epoch:"]
        for name, count, size in zip(self.names, self.counts, self.reader.sizes.tolist()):
            lines.append(f"  {name}: {count} records ({count / total:.2%}), {count / size:.3g} passes of {size}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        parts = ", ".join(f"{name}={count}" for name, count in zip(self.names, self.counts))
        return f"Mixture({parts}; epoch_size={self.epoch_size})"

    # -- reading --------------------------------------------------------------------------------
    def stream(self, *args: Any, **kwargs: Any) -> Stream:
        """This rank's share of the mixed order, as ``CacheDataRef.stream`` takes its arguments
        (YogaDL's, ``shuffle_mode`` for each component's own order, ``resume_state`` of a
        mixture). Ranks share the mixed order as global mode does: resume states hold at any
        world size."""
        return self.open_stream(ReadOptions.from_stream_args(*args, **kwargs))

    stream.__signature__ = stream_signature()  # type: ignore[attr-defined]

    def open_stream(self, options: ReadOptions) -> Stream:
        from yogacache.dataref import _tf_structure

        return read_stream(self.reader, options, spec_converter=_tf_structure)  # type: ignore[arg-type]

    def for_evaluation(self) -> Mixture:
        """This mixture reading the same records every epoch (a downsampled component does not
        rotate through its records): what validation reads, so that two evaluations score the
        same data. Shares the caches with this one."""
        same = copy.copy(self)
        same.reader = MixtureReader(self.reader.readers, self.reader.counts, rotate=False)
        return same

    def close(self) -> None:
        self.reader.close()

    # -- configuration ------------------------------------------------------------------------
    @classmethod
    def from_config(
        cls,
        section: Mapping[str, Any],
        *,
        storage: Any = None,
        open_cache: Optional[Callable[[Any, str, str], CacheReader]] = None,
    ) -> Mixture:
        """The mixture a ``mixture:`` config section describes::

            mixture:
              epoch_size: 100000          # or stopping: first_exhausted | all_exhausted
              components:
                - {dataset_id: web, dataset_version: v3, weight: 0.7}
                - {dataset_id: code, dataset_version: v1, weight: 0.2}
                - {dataset_id: books, dataset_version: v2, weight: 0.1, storage: {type: gcs, bucket: b}}

        A component's ``storage`` (a ``data_layer`` dict) defaults to ``storage``; each cache
        must exist there (``CacheNotFoundError`` otherwise). ``open_cache(storage, id,
        version)``: how to open one (default: ``yogacache.storage``'s fetch).
        """
        if not isinstance(section, Mapping):
            raise ConfigError(f"mixture must be a mapping, got {type(section).__name__}")
        allowed = {"components", "epoch_size", "stopping"}
        unknown = sorted(set(section) - allowed, key=str)
        if unknown:
            raise ConfigError(f"unknown mixture keys {unknown}; valid keys: {', '.join(sorted(allowed))}")
        raw = section.get("components")
        if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not raw:
            raise ConfigError(
                "mixture.components must be a non-empty list of {dataset_id, dataset_version, weight} entries"
            )
        stopping = section.get("stopping")
        if stopping is not None and stopping not in STOPPING_RULES:
            raise ConfigError(f"mixture.stopping must be one of {STOPPING_RULES}, got {stopping!r}")
        opener = open_cache or _fetch
        components = []
        keys = {"dataset_id", "dataset_version", "weight", "repeat", "samples", "storage"}
        for i, entry in enumerate(raw):
            where = f"mixture.components[{i}]"
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where} must be a mapping, got {type(entry).__name__}")
            extra = sorted(set(entry) - keys, key=str)
            if extra:
                raise ConfigError(f"unknown {where} keys {extra}; valid keys: {', '.join(sorted(keys))}")
            ids = [entry.get(key) for key in ("dataset_id", "dataset_version")]
            if not all(isinstance(value, str) and value for value in ids):
                raise ConfigError(f"{where} needs dataset_id and dataset_version strings")
            target = entry.get("storage", storage)
            try:
                share = Share(weight=entry.get("weight"), repeat=entry.get("repeat"), samples=entry.get("samples"))
            except (TypeError, ValueError) as error:
                raise ConfigError(f"{where}: {error}") from None
            reader = opener(target, str(ids[0]), str(ids[1]))
            components.append(Component(reader, weight=share.weight, repeat=share.repeat, samples=share.samples))
        try:
            return cls(components, epoch_size=section.get("epoch_size"), stopping=stopping)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"mixture: {error}") from None


def _fetch(storage: Any, dataset_id: str, dataset_version: str) -> CacheReader:
    from yogacache.config import parse_config
    from yogacache.store import open_store
    from yogacache.store import yogadl as yogadl_caches

    store = open_store(parse_config(storage) if isinstance(storage, Mapping) else storage)
    return yogadl_caches.fetch(store, dataset_id, dataset_version)


def load_mixture(path: Union[str, "os.PathLike[str]"]) -> Mixture:
    """The mixture a YAML (or JSON) file describes: its ``mixture:`` section, components stored
    where its ``data_layer:`` section says unless they name their own ``storage``."""
    from yogacache.config import read_config_mapping

    raw = read_config_mapping(Path(path))
    if "mixture" not in raw:
        raise ConfigError(f"config file {path} has no mixture section")
    return Mixture.from_config(raw["mixture"], storage=raw.get("data_layer"))
