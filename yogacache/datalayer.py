"""DataLayer: Determined-style decorators that cache a dataset function and return this rank's stream."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import re
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from yogacache import launcher
from yogacache.arguments import as_int, skip_shuffle_flag
from yogacache.config import StorageConfig, parse_config
from yogacache.dataref import CacheDataRef, cached_dataref
from yogacache.errors import UnsupportedDatasetError
from yogacache.format.integrity import Verify
from yogacache.format.writer import BuildLimits
from yogacache.names import validate_name
from yogacache.read.options import STREAM_ARGUMENTS, ReadOptions, checked_resume_state, mode_keywords
from yogacache.store import open_store
from yogacache.store import yogadl as yogadl_caches

TRAIN_SUFFIX = "_train"
VALIDATION_SUFFIX = "_val"
# dataset_version="auto": the version is derived from the source the function returns.
AUTO_VERSION = "auto"
# A version derived from a source's pins (``ObjectSource.auto_version``, what ``yogacache import``
# names its caches): it names the data itself, so the decorators use it as it is, without the
# "_train" / "_val" suffix, and find the cache an import made.
DERIVED_VERSION = re.compile(r"src-[0-9a-f]{16}")


class DataLayer:
    """Caches dataset-building functions and serves this process's shard of them.

    Args:
        config: a ``data_layer`` dict (Determined's schema), a parsed config, or ``None`` for
            the local default under the user's cache directory.
        rank: this process's shard index; by default the launcher's (``yogacache.launcher``:
            torchrun/torch.distributed, Horovod, or the ``tf.distribute.InputContext`` the
            decorated function is called with), else 0.
        num_shards: how many processes share the data; by default the launcher's, else 1.
        seed: the trial seed; every shuffled epoch derives its order from it.
        offset: records of this shard already consumed (resume mid-epoch).
        resume_state: instead of ``offset``, a state from ``Stream.state_dict`` or the torch
            dataset's ``state_dict`` (in global shuffle mode valid with any number of ranks).
        max_records, max_bytes: limits for one build (unknown-cardinality datasets stop there).
        part_bytes: the size past which a build rolls to a new part (an int or a size such as
            ``"64Mi"``, at least 1 MiB); default: the config's ``part_bytes``, else 1 GiB on a
            shared filesystem and 64 MiB on S3, GCS and Azure.
    """

    def __init__(
        self,
        config: Union[Mapping[str, Any], StorageConfig, None] = None,
        *,
        rank: Optional[int] = None,
        num_shards: Optional[int] = None,
        seed: int = 0,
        offset: int = 0,
        resume_state: Optional[Mapping[str, Any]] = None,
        max_records: Optional[int] = None,
        max_bytes: Optional[int] = None,
        verify: Verify = "auto",
        show_progress: bool = True,
        part_bytes: Union[int, str, None] = None,
    ) -> None:
        self.config = parse_config(config)
        self._explicit_rank = rank
        self._explicit_num_shards = num_shards
        found = launcher.resolve(rank, num_shards)
        self.rank, self.num_shards, self.rank_source = found.rank, found.num_shards, found.source
        self.seed = as_int(seed, "seed")
        self.offset = as_int(offset, "offset")
        if self.offset < 0:
            raise ValueError(f"offset must not be negative, got {self.offset}")
        self.resume_state = None if resume_state is None else checked_resume_state(resume_state)
        if self.resume_state is not None and self.offset:
            raise ValueError("pass either offset or resume_state, not both")
        self.store = open_store(
            self.config,
            verify=verify,
            limits=BuildLimits(max_records=max_records, max_bytes=max_bytes),
            show_progress=show_progress,
            part_bytes=part_bytes,
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
        """The cache of (dataset_id, dataset_version), built from ``make_data()`` on a miss
        (``"auto"``: the version derived from the source ``make_data()`` returns)."""
        if dataset_version == AUTO_VERSION:
            data = make_data()
            dataset_version = derived_version(dataset_id, data, make_data)
            make_data = functools.partial(_same, data)
        return CacheDataRef(yogadl_caches.get_or_build(self.store, dataset_id, dataset_version, make_data))

    def rank_for(self, input_context: Any = None) -> launcher.RankInfo:
        """This process's rank and shard count; an InputContext fills in what was not explicit."""
        if input_context is None:
            return launcher.RankInfo(self.rank, self.num_shards, source=self.rank_source)
        return launcher.resolve(self._explicit_rank, self._explicit_num_shards, input_context)

    def _decorate(
        self,
        dataset_id: str,
        dataset_version: str,
        suffix: str,
        read_arguments: Mapping[str, Any],
        returns: str,
        workers: Optional[int] = None,
        build_shards: Optional[int] = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        if returns not in RETURNS:
            raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
        cache = self._cache_of(dataset_id, dataset_version, suffix, workers, build_shards)

        def decorator(make_dataset: Callable[..., Any]) -> Callable[..., Any]:
            cached_ref = cache(make_dataset)

            @functools.wraps(make_dataset)
            def cached(*args: Any, **kwargs: Any) -> Any:
                ref = cached_ref(*args, **kwargs)
                contexts = [a for a in (*args, *kwargs.values()) if launcher.is_input_context(a)]
                ranks = self.rank_for(contexts[0] if contexts else None)
                options = ReadOptions.from_stream_args(
                    **read_arguments, shuffle_seed=self.seed, shard_rank=ranks.rank, num_shards=ranks.num_shards
                )
                return _ADAPTERS[returns](ref, options)

            return cached

        return decorator

    def _cache_of(
        self,
        dataset_id: str,
        dataset_version: str,
        suffix: str,
        workers: Optional[int],
        build_shards: Optional[int],
    ) -> Callable[[Callable[..., Any]], Callable[..., CacheDataRef]]:
        """What every decorator does: a function returning the cache of ``make_dataset``'s
        result, under ``cache_version(dataset_version, suffix)``, or with ``"auto"`` under the
        version derived from the source it returns (so it is called on every call, hit or not)."""
        validate_name(dataset_id, "dataset_id")
        validate_name(dataset_version, "dataset_version")
        auto = dataset_version == AUTO_VERSION
        if auto and build_shards is not None:
            raise ValueError(
                f'{dataset_id}: dataset_version="auto" derives the version from the yogacache.sources.from_url '
                "source the function returns, and with build_shards= the function is a builder called once per "
                'build shard: pass a version of your own (e.g. "v1")'
            )

        def decorator(make_dataset: Callable[..., Any]) -> Callable[..., CacheDataRef]:
            parallel = _parallel(make_dataset, workers, build_shards)

            @functools.wraps(make_dataset)
            def cached(*args: Any, **kwargs: Any) -> CacheDataRef:
                _refuse_in_a_starting_worker(dataset_id, dataset_version, workers)
                make, version = parallel, cache_version(dataset_version, suffix)
                if auto:
                    data = make_dataset(*args, **kwargs)
                    version = derived_version(dataset_id, data, make_dataset)
                    make = _parallel(functools.wraps(make_dataset)(functools.partial(_same, data)), workers, None)
                return cached_dataref(self.store, dataset_id, version, make, args, kwargs)

            return cached

        return decorator

    def cache_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        *,
        returns: Optional[str] = None,
        workers: Optional[int] = None,
        build_shards: Optional[int] = None,
        **read_arguments: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function returning any dataset (tf.data, a map-style torch dataset, an
        iterable of nested dicts/tuples of arrays, numbers, strings and bytes); the result
        returns the cache (version ``<version>`` as given) as a ``CacheDataRef``, to read with
        ``stream(...)`` or ``yogacache.torch.CacheDataset``/``CacheIterableDataset``. ``workers``
        and ``build_shards``: a parallel build, as for ``cache_train_dataset``.
        ``dataset_version="auto"``: the version is derived from the ``yogacache.sources.from_url``
        source the function returns (as ``yogacache import`` derives it); refused for any other
        dataset.

        ``returns`` ("tf", "torch", "stream", "grain", "ray"): the result returns instead this
        rank's records (the layer's rank and shard count, shuffled with its ``seed``) as that
        framework's dataset, read as ``stream(...)`` reads with ``read_arguments``: by default
        in cache order from the start, else ``shuffle``, ``skip_shuffle_at_epoch_end``,
        ``shuffle_mode`` and its settings, ``drop_shard_remainder``, ``start_offset`` or
        ``resume_state`` (the layer's ``offset`` and ``resume_state`` are the training
        decorators')."""
        if returns is None:
            if read_arguments:
                raise TypeError(
                    f"cache_dataset got read arguments {sorted(read_arguments)} without returns=: its function "
                    "returns the CacheDataRef (read it with .stream(...)); pass returns= for this rank's records"
                )
            return self._cache_of(dataset_id, dataset_version, "", workers, build_shards)
        allowed = {name for name, _ in STREAM_ARGUMENTS} - {"shuffle_seed", "shard_rank", "num_shards"}
        allowed |= {"shuffle_mode", "resume_state", "skip_shuffle_end_of_epoch", *mode_keywords()}
        unknown = sorted(set(read_arguments) - allowed)
        if unknown:
            layer = sorted({"shuffle_seed", "shard_rank", "num_shards"} & set(unknown))
            raise TypeError(
                f"cache_dataset got unexpected keyword arguments {unknown}"
                + (f" ({', '.join(layer)}: the layer's seed, rank and num_shards)" if layer else "")
            )
        return self._decorate(dataset_id, dataset_version, "", read_arguments, returns, workers, build_shards)

    # -- Determined's decorators ----------------------------------------------------------
    def cache_train_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        *,
        returns: str = "tf",
        workers: Optional[int] = None,
        build_shards: Optional[int] = None,
        **read_arguments: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function returning a dataset (tf.data, map-style torch, or any iterable);
        the result returns this rank's cached training shard (version ``<version>_train``,
        remainder dropped, resumed at ``offset`` or ``resume_state``, shuffled with ``seed``).
        A version derived from a source (``"auto"``, or ``source.auto_version()``) is used as it
        is, without ``_train``: it names the data, and is the cache ``yogacache import`` makes.

        ``shuffle_mode="global"`` reshuffles the whole dataset across ranks every epoch (a
        rank's records change from epoch to epoch; resume works with any number of ranks);
        ``shuffle_mode="parts"`` (for streamed caches) mixes ``parts_window`` parts at a time and,
        given ``ranks_per_node`` (consecutive ranks sharing a node), gives each node its own parts
        (see docs/shuffle.md). ``returns`` picks what the decorated function returns: a
        ``tf.data.Dataset`` ("tf"), a ``yogacache.torch.CacheIterableDataset`` ("torch") or a
        ``Stream`` ("stream").
        ``skip_shuffle_end_of_epoch`` is Determined's spelling of ``skip_shuffle_at_epoch_end``;
        ``shuffle_mode``, ``skip_shuffle_end_of_epoch`` and the mode's settings (``parts_window``,
        ``ranks_per_node``, …) go to ``ReadOptions.from_stream_args``.
        ``workers=N`` builds a miss with N processes; ``build_shards=K`` makes the function a builder
        called as ``f(shard_index=i, num_shards=K)`` (see docs/parallel-build.md).
        """
        arguments = self._train_arguments("cache_train_dataset", shuffle, skip_shuffle_at_epoch_end, read_arguments)
        return self._decorate(dataset_id, dataset_version, TRAIN_SUFFIX, arguments, returns, workers, build_shards)

    def cache_validation_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        shuffle: bool = False,
        *,
        returns: str = "tf",
        workers: Optional[int] = None,
        build_shards: Optional[int] = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function returning a dataset; the result returns this rank's cached
        validation shard (version ``<version>_val``, or a derived version as it is, see
        ``cache_train_dataset``; from the start, same order every epoch), as ``returns`` says."""
        return self._decorate(
            dataset_id,
            dataset_version,
            VALIDATION_SUFFIX,
            {"shuffle": shuffle, "skip_shuffle_at_epoch_end": True},
            returns,
            workers,
            build_shards,
        )

    # -- mixtures ---------------------------------------------------------------------------
    def mixture(
        self,
        components: Union[Sequence[Any], Mapping[str, Any]],
        *,
        weights: Optional[Sequence[float]] = None,
        epoch_size: Optional[int] = None,
        stopping: Optional[str] = None,
    ) -> Any:
        """A ``yogacache.mixture.Mixture`` of caches in this layer's store (or anywhere).

        ``components``: a list of ``(dataset_id, dataset_version)`` pairs (caches that exist in
        this layer's store), ``Component``s, ``CacheDataRef``s, decorated builders (called with
        no arguments: they build on a miss) or cache directories; or a ``mixture:`` config
        section (``Mixture.from_config``), whose components default to this layer's store.
        """
        from yogacache.mixture import Component, Mixture

        if isinstance(components, Mapping):
            if weights is not None or epoch_size is not None or stopping is not None:
                raise TypeError("a mixture config section holds its own weights, epoch_size and stopping")
            return Mixture.from_config(components, storage=self.store, open_cache=self._open_component)

        def resolved(each: Any) -> Any:
            if isinstance(each, Component):
                return Component(resolved(each.source), weight=each.weight, repeat=each.repeat, samples=each.samples)
            if isinstance(each, tuple) and len(each) == 2 and all(isinstance(value, str) for value in each):
                return self._open_component(self.store, *each)
            return each

        listed = [resolved(each) for each in components]
        return Mixture(listed, weights=weights, epoch_size=epoch_size, stopping=stopping)

    def _open_component(self, storage: Any, dataset_id: str, dataset_version: str) -> Any:
        validate_name(dataset_id, "dataset_id")
        validate_name(dataset_version, "dataset_version")
        if storage is self.store or storage is None:
            return yogadl_caches.fetch(self.store, dataset_id, dataset_version)
        from yogacache.mixture import _fetch

        return _fetch(storage, dataset_id, dataset_version)

    def train_mixture(
        self,
        mixture: Any,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        *,
        returns: str = "tf",
        **read_arguments: Any,
    ) -> Any:
        """This rank's share of a mixture for training, as ``cache_train_dataset`` serves a
        cache: shuffled with ``seed``, resumed at ``offset`` or ``resume_state`` (a mixture's),
        the remainder dropped, returned as ``returns`` says. ``shuffle_mode`` picks each
        component's own order (``"parts"`` for streamed caches)."""
        arguments = self._train_arguments("train_mixture", shuffle, skip_shuffle_at_epoch_end, read_arguments)
        return self._read_mixture(mixture, arguments, returns)

    def _train_arguments(
        self, caller: str, shuffle: bool, skip_shuffle_at_epoch_end: bool, read_arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """The stream arguments of a training read: this layer's start point, the remainder
        dropped, and the caller's shuffle and read arguments (checked)."""
        unknown = sorted(set(read_arguments) - {"shuffle_mode", "skip_shuffle_end_of_epoch", *mode_keywords()})
        if unknown:
            raise TypeError(f"{caller} got unexpected keyword arguments {unknown}")
        return {
            "start_offset": self.offset,
            "resume_state": self.resume_state,
            "shuffle": shuffle,
            "skip_shuffle_at_epoch_end": skip_shuffle_flag(
                skip_shuffle_at_epoch_end, read_arguments.pop("skip_shuffle_end_of_epoch", None)
            ),
            "drop_shard_remainder": True,
            **read_arguments,
        }

    def validation_mixture(self, mixture: Any, shuffle: bool = False, *, returns: str = "tf") -> Any:
        """This rank's share of a mixture for validation: from the start, the same records in the
        same order every epoch (``Mixture.for_evaluation``), as ``returns`` says."""
        arguments = {"shuffle": shuffle, "skip_shuffle_at_epoch_end": True}
        return self._read_mixture(mixture.for_evaluation(), arguments, returns)

    def _read_mixture(self, mixture: Any, arguments: Mapping[str, Any], returns: str) -> Any:
        if returns not in RETURNS:
            raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
        options = ReadOptions.from_stream_args(
            **arguments, shuffle_seed=self.seed, shard_rank=self.rank, num_shards=self.num_shards
        )
        return _ADAPTERS[returns](mixture, options)


def cache_version(dataset_version: str, suffix: str) -> str:
    """The version a decorator caches under: ``dataset_version + suffix`` ("_train", "_val"), or
    a version derived from a source (``src-<16 hex>``) as it is."""
    return dataset_version if DERIVED_VERSION.fullmatch(dataset_version) else dataset_version + suffix


def derived_version(dataset_id: str, data: Any, make_dataset: Callable[..., Any]) -> str:
    """The version ``"auto"`` stands for: derived from the pins of the source ``data``
    (``yogacache.sources.from_url``), as ``yogacache import`` derives it. Any other dataset has
    no version to derive: UnsupportedDatasetError, never a cache named "auto"."""
    derive = getattr(data, "auto_version", None)
    if not callable(derive):
        name = getattr(make_dataset, "__qualname__", None) or "the dataset function"
        raise UnsupportedDatasetError(
            f'{dataset_id}: dataset_version="auto" derives the version from a yogacache.sources.from_url(...) '
            f"source (from its objects' pins), and {name}() returned a {type(data).__name__}, which has none: "
            'pass a version of your own (e.g. "v1"), and a new one whenever the data changes'
        )
    return validate_name(derive(), "dataset_version")


def _same(data: Any, *args: Any, **kwargs: Any) -> Any:
    """``data`` again: the dataset a call already made (to derive its version) is built as it is."""
    return data


def _parallel(
    make_dataset: Callable[..., Any], workers: Optional[int], build_shards: Optional[int]
) -> Callable[..., Any]:
    """``make_dataset``, or with ``workers`` / ``build_shards`` a function returning a parallel
    build of it (``yogacache.parallel``: build shards written by ``workers`` processes)."""
    if workers is None and build_shards is None:
        return make_dataset
    from yogacache.parallel import parallel_maker

    return parallel_maker(make_dataset, workers or 1, build_shards)


def _refuse_in_a_starting_worker(dataset_id: str, version: str, workers: Optional[int]) -> None:
    """A parallel build called while this process, a worker, imports the main script fails at
    once (it would wait for its parent's lock forever): ``refuse_bootstrapping_build``."""
    if workers is not None and workers > 1:
        from yogacache.parallel.pool import refuse_bootstrapping_build

        refuse_bootstrapping_build(f"{dataset_id}:{version}", workers)


@dataclasses.dataclass(frozen=True)
class Adapter:
    """What ``returns=`` names: ``from_options(ref, options)`` of ``module`` (imported on first
    use, so that ``import yogacache`` imports no framework), made from a DataRef and
    ``ReadOptions``; the framework it needs and its extra, for the install hint. No module: the
    DataRef's own ``Stream``."""

    module: Optional[str]
    what: str
    framework: str = ""
    package: str = ""
    extra: str = ""

    def __call__(self, ref: Any, options: ReadOptions) -> Any:
        if self.module is None:
            return ref.open_stream(options)
        try:
            module = importlib.import_module(self.module)
        except ImportError as error:
            if importlib.util.find_spec(self.package) is not None:
                raise
            choices = [
                f"returns={key!r} for {adapter.what}"
                for key, adapter in _ADAPTERS.items()
                if key != "tf" and (adapter.module is None or importlib.util.find_spec(adapter.package) is not None)
            ]
            others = " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)
            raise ImportError(
                f"the decorated function returns {self.what}{' by default' if self.extra == 'tf' else ''} "
                f"(returns={_name_of(self)!r}), and {self.framework} is not installed: pass {others} "
                f"(or install {self.framework}: pip install 'yogacache[{self.extra}]')"
            ) from error
        return module.from_options(ref, options)


def _name_of(adapter: Adapter) -> str:
    return next(key for key, value in _ADAPTERS.items() if value is adapter)


# ``returns=`` -> its adapter. Each reads the DataRef through the one EpochReader (docs/architecture.md).
_ADAPTERS: dict[str, Adapter] = {
    "tf": Adapter("yogacache.tensorflow", "a tf.data.Dataset", "TensorFlow", "tensorflow", "tf"),
    "torch": Adapter("yogacache.torch", "a PyTorch dataset", "PyTorch", "torch", "torch"),
    "stream": Adapter(None, "a Stream"),
    "grain": Adapter("yogacache.grain", "a Grain MapDataset", "Grain", "grain", "grain"),
    "ray": Adapter("yogacache.ray", "a Ray Data Dataset", "Ray Data", "ray", "ray"),
}
RETURNS = tuple(_ADAPTERS)
