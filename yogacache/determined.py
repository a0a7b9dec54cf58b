"""Determined's removed data layer, back: ``cache_train_dataset`` / ``cache_validation_dataset``
for trial code, wired to Determined's cluster info, distributed context and checkpoints.

Determined 0.19.10 removed ``context.experimental.cache_train_dataset``; this module gives trial
code the same decorators with the semantics of the last release that shipped them (0.19.9,
``harness/determined/_data_layer``), on top of ``yogacache.DataLayer``::

    @yogacache.determined.data_layer(self.context).cache_train_dataset("mnist", "v1", shuffle=True)
    def make_dataset(): ...

A trial reads a mixture of caches (``yogacache.Mixture``, docs/mixtures.md) the same way, with
the same rank, seed, resume point and batching: ``train_mixture`` / ``validation_mixture``.

``context`` is a Core API context (``det.core.init()``), a ``PyTorchTrialContext`` or a
``TFKerasTrialContext`` (any ``det.TrialContext``). From it come:

- rank and shard count: the distributed context's ``rank`` and ``size`` (one shard per slot);
- the shuffle seed: the trial seed;
- the training offset: batches already trained (``steps_completed`` of the checkpoint the trial
  resumes from) x the per-slot batch size; a PyTorch trial's dataset instead skips that many
  whole batches, epoch by epoch, as ``det.pytorch.DataLoader`` does (each epoch's last batch
  may be short); validation always reads from offset 0;
- the storage: the experiment config's ``data_layer`` section, paths as the trial's container
  sees them: ``container_storage_path`` (shared_fs) or ``local_cache_container_path`` (s3, gcs),
  ``~/data/determined/`` when unset, as Determined did.

This is the only module of yogacache that imports ``determined``
(``pip install 'yogacache[determined]'``); ``import yogacache`` never loads it.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

try:
    import determined as det
    from determined import core as det_core
    from determined import errors as det_errors
    from determined import util as det_util
except ImportError as error:  # pragma: no cover - exercised only without determined
    raise ImportError("yogacache.determined needs Determined: pip install 'yogacache[determined]'") from error

from yogacache import redaction
from yogacache.arguments import as_int
from yogacache.config import SharedFSConfig, StorageConfig, parse_config
from yogacache.datalayer import RETURNS, TRAIN_SUFFIX, VALIDATION_SUFFIX, DataLayer
from yogacache.errors import ConfigError, YogaCacheError
from yogacache.mixture import Mixture
from yogacache.names import validate_name

__all__ = [
    "DEFAULT_STORAGE_PATH",
    "DecoratorReusedError",
    "DeterminedDataLayer",
    "RepeatEpochs",
    "TrialFacts",
    "data_layer",
    "repeat_epochs",
    "storage_from_data_layer",
    "trial_facts",
]

logger = redaction.get_logger("yogacache.determined")

DEFAULT_STORAGE_PATH = "~/data/determined/"
"""Where Determined's data layer kept caches when the config named no container path."""

Storage = Union[Mapping[str, Any], StorageConfig]


class DecoratorReusedError(YogaCacheError, RuntimeError):
    """``cache_train_dataset`` (or ``cache_validation_dataset``) was used a second time in one trial."""


@dataclasses.dataclass(frozen=True)
class TrialFacts:
    """What the data layer needs to know about the running trial, whichever context told it.

    Attributes:
        rank, num_shards: this process's shard: the distributed context's rank and size.
        seed: the trial seed (every shuffled epoch derives its order from it).
        steps_completed: batches this trial trained before the checkpoint it resumes from.
        per_slot_batch_size: records one slot trains on per batch (None when nothing says).
        data_layer: the experiment config's ``data_layer`` section (None when it has none).
        returns: what the decorated functions return by default: ``"torch"`` for a PyTorch
            trial, ``"tf"`` otherwise (Determined's data layer returned tf.data datasets).
    """

    rank: int
    num_shards: int
    seed: int
    steps_completed: int
    per_slot_batch_size: Optional[int]
    data_layer: Optional[Mapping[str, Any]] = dataclasses.field(repr=False)  # may hold a secret_key
    returns: str = "tf"

    @property
    def offset(self) -> int:
        """Records of this rank's training shard already trained on: batches x per-slot batch size."""
        if self.steps_completed == 0:
            return 0
        if self.per_slot_batch_size is None:
            raise ConfigError(
                f"the trial resumes after {self.steps_completed} batches, and nothing gives its "
                "per-slot batch size to compute where its training data resumes: set the "
                "global_batch_size hyperparameter or pass per_slot_batch_size= to "
                "yogacache.determined.data_layer()"
            )
        return self.steps_completed * self.per_slot_batch_size


def _experiment_seed(config: Optional[Mapping[str, Any]]) -> int:
    """Determined's seed off-cluster: ``reproducibility.experiment_seed``, else 0."""
    reproducibility = (config or {}).get("reproducibility") or {}
    return as_int(reproducibility.get("experiment_seed", 0), "reproducibility.experiment_seed")


def _batch_size_from_hparams(hparams: Optional[Mapping[str, Any]], slots: int, trial_name: str) -> Optional[int]:
    """Determined's per-slot batch size: ``global_batch_size // slots`` (None without the hparam)."""
    if not hparams or hparams.get("global_batch_size") is None:
        return None
    per_slot, _ = det_util.calculate_batch_sizes(dict(hparams), slots, trial_name)
    return int(per_slot)


def _is_pytorch_context(context: Any) -> bool:
    # A PyTorchTrialContext can only exist once determined.pytorch is imported; asking
    # sys.modules keeps this module from importing torch for other contexts.
    module = sys.modules.get("determined.pytorch")
    return module is not None and isinstance(context, module.PyTorchTrialContext)


def _pytorch_facts(context: Any) -> TrialFacts:
    try:
        config: Optional[Mapping[str, Any]] = context.get_experiment_config()
    except ValueError:  # off-cluster, and det.pytorch.init() was given no exp_conf
        config = None
    try:
        seed = int(context.get_trial_seed())
    except det_errors.InternalException:  # off-cluster: no trial seed
        seed = _experiment_seed(config)
    try:
        per_slot: Optional[int] = int(context.get_per_slot_batch_size())
    except ValueError:  # no global_batch_size hyperparameter
        per_slot = None
    return TrialFacts(
        rank=context.distributed.rank,
        num_shards=context.distributed.size,
        seed=seed,
        steps_completed=int(context.get_initial_batch()),
        per_slot_batch_size=per_slot,
        data_layer=_section(config),
        returns="torch",
    )


def _trial_context_facts(context: Any) -> TrialFacts:
    """A ``det.TrialContext`` (``TFKerasTrialContext`` and the other EnvContext-based ones)."""
    env = context.env
    config = env.experiment_config
    if hasattr(context, "get_per_slot_batch_size"):
        per_slot: Optional[int] = int(context.get_per_slot_batch_size())
    else:  # what TFKerasTrialContext computes, for a bare TrialContext
        slots = (config.get("resources") or {}).get("slots_per_trial") or context.distributed.size
        per_slot = _batch_size_from_hparams(env.hparams, int(slots), type(context).__name__)
    return TrialFacts(
        rank=context.distributed.rank,
        num_shards=context.distributed.size,
        seed=int(env.trial_seed),
        steps_completed=int(env.steps_completed),
        per_slot_batch_size=per_slot,
        data_layer=_section(config),
    )


def _core_facts(context: Any, info: Optional[det.ClusterInfo]) -> TrialFacts:
    """A Core API context: trial facts come from the cluster info of a trial task, if any."""
    info = info if info is not None else (context.info if context.info is not None else det.get_cluster_info())
    distributed = context.distributed
    if info is None or info.task_type != "TRIAL":  # off-cluster, or not a trial
        return TrialFacts(distributed.rank, distributed.size, 0, 0, None, None)
    trial = info.trial
    try:
        per_slot = _batch_size_from_hparams(trial.hparams, distributed.size, "Core API trial")
    except det_errors.InvalidExperimentException:  # a Core API trial's hparams are its own business
        per_slot = None  # needed only to resume, where its absence is a clear error
    return TrialFacts(
        rank=distributed.rank,
        num_shards=distributed.size,
        seed=int(trial.trial_seed),
        steps_completed=int(trial._steps_completed),
        per_slot_batch_size=per_slot,
        data_layer=_section(trial._config),
    )


def _section(config: Optional[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    section = (config or {}).get("data_layer")
    if section is not None and not isinstance(section, Mapping):
        raise ConfigError(f"the experiment config's data_layer section must be a mapping, got {type(section).__name__}")
    return section


def trial_facts(context: Any, info: Optional[det.ClusterInfo] = None) -> TrialFacts:
    """Rank, shard count, seed, resume point, batch size and ``data_layer`` section of a trial.

    Args:
        context: a Core API context (``det.core.Context``), a ``PyTorchTrialContext``, or a
            ``det.TrialContext`` such as ``TFKerasTrialContext``.
        info: the cluster info of a Core API context (default: the context's own, else
            ``det.get_cluster_info()``; off-cluster there is none).
    """
    if _is_pytorch_context(context):
        return _pytorch_facts(context)
    if isinstance(context, det.TrialContext):
        return _trial_context_facts(context)
    if isinstance(context, det_core.Context):
        return _core_facts(context, info)
    raise TypeError(
        "yogacache.determined.data_layer() takes a Determined context: the core.Context of "
        "det.core.init(), or the PyTorchTrialContext / TFKerasTrialContext a trial receives; "
        f"got {type(context).__name__}"
    )


def _container_path(configured: Optional[str]) -> str:
    return str(Path(configured or DEFAULT_STORAGE_PATH).expanduser())


def storage_from_data_layer(section: Mapping[str, Any]) -> StorageConfig:
    """The storage an experiment config's ``data_layer`` section describes, as the trial sees it.

    Determined mounted ``host_storage_path`` (``local_cache_host_path``) at
    ``container_storage_path`` (``local_cache_container_path``) and its data layer used the
    container path, ``~/data/determined/`` when unset; so does this.
    """
    parsed = parse_config(section)
    if isinstance(parsed, SharedFSConfig):
        return SharedFSConfig(
            host_storage_path=parsed.host_storage_path,
            container_storage_path=_container_path(parsed.container_storage_path),
        )
    if parsed is None:
        raise ConfigError("the experiment config's data_layer section is empty")
    local = _container_path(parsed.local_cache_container_path)
    return dataclasses.replace(
        parsed, local_cache_host_path=parsed.local_cache_host_path or local, local_cache_container_path=local
    )


# What each trial has read: context -> {"train" | "validation": ((what, shuffle), method, what)}.
_USED: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, ...]]] = weakref.WeakKeyDictionary()


class DeterminedDataLayer:
    """``cache_train_dataset`` / ``cache_validation_dataset`` (or ``train_mixture`` /
    ``validation_mixture``) for one Determined trial.

    Build it with ``yogacache.determined.data_layer(context)``. The storage is opened when a
    decorator is first used, so a trial that never caches creates no directory.

    Args:
        context: the Core API context of ``det.core.init()``, or the ``PyTorchTrialContext`` /
            ``TFKerasTrialContext`` (any ``det.TrialContext``) the trial receives.
        storage: a ``data_layer`` dict (or parsed config) to use instead of the experiment
            config's section; required when the experiment config has none (off-cluster).
        info: for a Core API context, the cluster info (default: the context's own).
        per_slot_batch_size: records per slot per batch, when no ``global_batch_size``
            hyperparameter gives it (needed only to resume).
        steps_completed: batches already trained, when the context does not know (Core API
            off-cluster, resuming from your own checkpoint).
        seed: the shuffle seed, instead of the trial seed.
        returns: "tf", "torch", "stream", "grain" or "ray" (default: "torch" for a PyTorch trial, else "tf").
        layer_options: further ``DataLayer`` options (``max_records``, ``verify``, ...).
    """

    def __init__(
        self,
        context: Any,
        *,
        storage: Optional[Storage] = None,
        info: Optional[det.ClusterInfo] = None,
        per_slot_batch_size: Optional[int] = None,
        steps_completed: Optional[int] = None,
        seed: Optional[int] = None,
        returns: Optional[str] = None,
        **layer_options: Any,
    ) -> None:
        facts = trial_facts(context, info)
        overrides: dict[str, Any] = {}
        if per_slot_batch_size is not None:
            overrides["per_slot_batch_size"] = as_int(per_slot_batch_size, "per_slot_batch_size")
            if overrides["per_slot_batch_size"] < 1:
                raise ValueError(f"per_slot_batch_size must be positive, got {per_slot_batch_size}")
        if steps_completed is not None:
            overrides["steps_completed"] = as_int(steps_completed, "steps_completed")
            if overrides["steps_completed"] < 0:
                raise ValueError(f"steps_completed must not be negative, got {steps_completed}")
        if seed is not None:
            overrides["seed"] = as_int(seed, "seed")
        if returns is not None:
            if returns not in RETURNS:
                raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
            overrides["returns"] = returns
        self.facts = dataclasses.replace(facts, **overrides)
        self.offset = self.facts.offset
        if storage is not None:
            self.storage: StorageConfig = parse_config(storage)  # type: ignore[assignment]
        elif self.facts.data_layer is not None:
            self.storage = storage_from_data_layer(self.facts.data_layer)
        else:
            raise ConfigError(
                "no storage for the data layer: the experiment config has no data_layer section "
                "and no storage was given; add a data_layer section to the experiment config "
                "(type shared_fs, s3 or gcs, as Determined's data layer took), or pass "
                "storage={'type': 'shared_fs', 'host_storage_path': '/path'} to "
                "yogacache.determined.data_layer()"
            )
        self._context = context
        self._layer_options = layer_options
        self._layer: Optional[DataLayer] = None

    def __repr__(self) -> str:
        f = self.facts
        return (
            f"DeterminedDataLayer(rank={f.rank}, num_shards={f.num_shards}, seed={f.seed}, "
            f"steps_completed={f.steps_completed}, offset={self.offset}, storage={self.storage!r})"
        )

    @property
    def layer(self) -> DataLayer:
        """The ``DataLayer`` doing the work (its store opened on first use)."""
        if self._layer is None:
            f = self.facts
            self._layer = DataLayer(
                self.storage, rank=f.rank, num_shards=f.num_shards, seed=f.seed, offset=self.offset,
                **self._layer_options,
            )
            logger.info(
                "data layer: rank %d of %d, seed %d, training resumes at record %d of this shard "
                "(%d batches trained), caches in %s",
                f.rank, f.num_shards, f.seed, self.offset, f.steps_completed, self._layer.store.root,
            )
        return self._layer

    def _use(self, kind: str, key: tuple[Any, ...], method: str, what: str, allow_same: bool) -> None:
        """Counts one read of the trial's training (``kind`` "train") or validation data: once
        per trial, as Determined's data layer allowed (the training resume point is one
        dataset's); validation again with the same ``key`` is allowed."""
        used = _USED.setdefault(self._context, {})
        previous = used.get(kind)
        if previous is not None and not (allow_same and previous[0] == key):
            raise DecoratorReusedError(
                f"{previous[1]} was already used in this trial (for {previous[2]}); read one training "
                "and one validation dataset per trial (cache_train_dataset or train_mixture, "
                "cache_validation_dataset or validation_mixture), in build_training_data_loader "
                "and build_validation_data_loader"
            )
        used[kind] = (key, method, what)

    def cache_train_dataset(
        self,
        dataset_id: str,
        dataset_version: str,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        *,
        returns: Optional[str] = None,
        **options: Any,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function building the training dataset (tf.data, a map-style torch
        dataset, any iterable): the result returns this rank's shard of the cache of
        ``(dataset_id, dataset_version + "_train")``, remainder dropped, shuffled with the
        trial seed, starting after the records already trained on. Once per trial.

        ``returns`` (default: "torch" in a PyTorch trial, else "tf") and further options
        (``shuffle_mode``) are ``DataLayer.cache_train_dataset``'s.
        """
        validate_name(dataset_id, "dataset_id")
        validate_name(dataset_version, "dataset_version")
        returns = returns or self.facts.returns
        decorator = self.layer.cache_train_dataset(
            dataset_id, dataset_version, shuffle, skip_shuffle_at_epoch_end, returns=returns, **options,
        )
        # Counted once the arguments are known good: a call that failed may be corrected.
        what = f"{dataset_id}:{dataset_version}{TRAIN_SUFFIX}"
        self._use("train", (what, shuffle), "cache_train_dataset", what, allow_same=False)
        return decorator if returns != "torch" else self._batched_like_the_trial(decorator)

    def _batched_like_the_trial(
        self, decorator: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> Callable[..., Any]:
        """``decorator``, whose torch dataset is read as the trial reads (``_like_the_trial``)."""

        def batched(make_dataset: Callable[..., Any]) -> Callable[..., Any]:
            cached = decorator(make_dataset)

            @functools.wraps(cached)
            def dataset(*args: Any, **kwargs: Any) -> Any:
                return self._like_the_trial(cached(*args, **kwargs))

            return dataset

        return batched

    def _like_the_trial(self, dataset: Any) -> Any:
        """``dataset`` (a ``CacheIterableDataset`` of this trial's training data), dealing records
        to DataLoader workers in blocks of the per-slot batch size (so that every batch holds the
        records the trial's order puts in it, with or without workers) and resuming after
        ``steps_completed`` whole batches.

        A PyTorch trial's DataLoader batches each epoch separately (its last batch short), so
        the records already trained on are not ``steps_completed x batch size`` once an epoch
        has ended mid-batch: the dataset skips whole batches instead, epoch by epoch, as
        Determined's own DataLoader does. TF trials batch across epochs (``repeat`` before
        ``batch``), so there the record offset is exact.
        """
        steps, batch_size = self.facts.steps_completed, self.facts.per_slot_batch_size
        if batch_size is not None and dataset.batch_size is None:
            dataset.batch_size = batch_size
        if steps:
            dataset.skip_batches(steps, batch_size)
        return dataset

    def cache_validation_dataset(
        self, dataset_id: str, dataset_version: str, shuffle: bool = False, *, returns: Optional[str] = None
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorates a function building the validation dataset: the result returns this rank's
        shard of the cache of ``(dataset_id, dataset_version + "_val")``, from the start, in the
        same order every time. Once per trial (again with the same arguments is allowed, as
        Determined allowed a trial to rebuild its validation data)."""
        validate_name(dataset_id, "dataset_id")
        validate_name(dataset_version, "dataset_version")
        decorator = self.layer.cache_validation_dataset(
            dataset_id, dataset_version, shuffle, returns=returns or self.facts.returns
        )
        what = f"{dataset_id}:{dataset_version}{VALIDATION_SUFFIX}"
        self._use("validation", (what, shuffle), "cache_validation_dataset", what, allow_same=True)
        return decorator

    # -- mixtures ---------------------------------------------------------------------------
    def mixture(
        self,
        components: Union[Sequence[Any], Mapping[str, Any]],
        *,
        weights: Optional[Sequence[float]] = None,
        epoch_size: Optional[int] = None,
        stopping: Optional[str] = None,
    ) -> Mixture:
        """A ``yogacache.Mixture`` of caches in the trial's storage (``DataLayer.mixture``):
        ``(dataset_id, dataset_version)`` pairs of caches that exist there, ``Component``s,
        decorated builders (what ``cache_dataset`` of ``self.layer`` returns), or a ``mixture:``
        config section (e.g. from the experiment config's hyperparameters)."""
        return self.layer.mixture(components, weights=weights, epoch_size=epoch_size, stopping=stopping)

    def train_mixture(
        self,
        mixture: Mixture,
        shuffle: bool = False,
        skip_shuffle_at_epoch_end: bool = False,
        *,
        returns: Optional[str] = None,
        **options: Any,
    ) -> Any:
        """This rank's share of ``mixture`` for training, read as ``cache_train_dataset`` reads
        a cache: the trial's rank and shard count, shuffled with the trial seed, remainder
        dropped, resumed after the batches already trained (a PyTorch trial's dataset skips
        whole batches epoch by epoch and deals records to workers in per-slot batches; tf.data
        and streams resume at ``steps_completed x per-slot batch size`` records). Ranks share
        the mixed order (docs/mixtures.md). Once per trial, instead of ``cache_train_dataset``.

        ``returns`` (default: "torch" in a PyTorch trial, else "tf") and further options
        (``shuffle_mode``: each component's own order) are ``DataLayer.train_mixture``'s.
        """
        _check_mixture(mixture, "train_mixture")
        returns = returns or self.facts.returns
        result = self.layer.train_mixture(mixture, shuffle, skip_shuffle_at_epoch_end, returns=returns, **options)
        what = _mixture_label(mixture)
        self._use("train", (what, mixture.counts, shuffle), "train_mixture", what, allow_same=False)
        return result if returns != "torch" else self._like_the_trial(result)

    def validation_mixture(self, mixture: Mixture, shuffle: bool = False, *, returns: Optional[str] = None) -> Any:
        """This rank's share of ``mixture`` for validation: from the start, the same order every
        time (``DataLayer.validation_mixture``). Once per trial, instead of
        ``cache_validation_dataset`` (again with the same mixture is allowed)."""
        _check_mixture(mixture, "validation_mixture")
        result = self.layer.validation_mixture(mixture, shuffle, returns=returns or self.facts.returns)
        what = _mixture_label(mixture)
        self._use("validation", (what, mixture.counts, shuffle), "validation_mixture", what, allow_same=True)
        return result


def _check_mixture(mixture: Any, method: str) -> None:
    if not isinstance(mixture, Mixture):
        raise TypeError(
            f"{method} takes a yogacache.Mixture (data_layer(context).mixture([...])), got {type(mixture).__name__}"
        )


def _mixture_label(mixture: Mixture) -> str:
    return f"mixture({', '.join(mixture.names)})"


def data_layer(context: Any, **options: Any) -> DeterminedDataLayer:
    """The removed ``context.experimental``: ``cache_train_dataset`` and ``cache_validation_dataset``
    (and ``mixture``, ``train_mixture``, ``validation_mixture``) for the trial of ``context``;
    ``options`` are ``DeterminedDataLayer``'s (``storage``, ``per_slot_batch_size``,
    ``steps_completed``, ``seed``, ``returns``, ``DataLayer`` options)."""
    return DeterminedDataLayer(context, **options)


class RepeatEpochs:
    """A training loader that goes on epoch after epoch, as a ``PyTorchTrial`` needs.

    Determined's PyTorch trial controller iterates its training loader once and trains until
    ``max_length``; its own ``det.pytorch.DataLoader`` repeats for that reason. Each new pass
    over the wrapped loader (a ``torch.utils.data.DataLoader`` over a cached training dataset)
    reads the next epoch, reshuffled, from its start: after a pass the dataset moves to the next
    epoch (``CacheIterableDataset.next_epoch``), so a trial resumed mid-epoch finishes that
    epoch, then reads whole epochs. ``len()`` is the batches of one whole epoch, wherever the
    trial resumed (Determined takes it as the epoch length). An empty shard ends the iteration
    instead of looping forever.
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        dataset = getattr(loader, "dataset", None)
        # A yogacache dataset (anything with next_epoch): advanced after each pass.
        self._dataset = dataset if callable(getattr(dataset, "next_epoch", None)) else None
        if self._dataset is not None and getattr(loader, "persistent_workers", False):
            raise ValueError(
                "repeat_epochs: a DataLoader with persistent_workers=True keeps its workers' copy "
                "of the dataset, which never sees the next epoch (each pass would read the same "
                "records): leave persistent_workers off"
            )

    def __len__(self) -> int:
        dataset = self._dataset
        if dataset is None:
            return len(self.loader)
        records = int(dataset.epoch_length)
        batch_size = getattr(self.loader, "batch_size", None)
        if batch_size is None:  # the dataset yields batches itself: epoch_length counts them
            return records
        return records // batch_size if getattr(self.loader, "drop_last", False) else -(-records // batch_size)

    def __iter__(self) -> Iterator[Any]:
        while True:
            empty = True
            for batch in self.loader:
                empty = False
                yield batch
            if self._dataset is not None:
                self._dataset.next_epoch()
            if empty:
                return


def repeat_epochs(loader: Any) -> RepeatEpochs:
    """``loader``, repeated epoch after epoch: return it from ``build_training_data_loader``."""
    return RepeatEpochs(loader)
