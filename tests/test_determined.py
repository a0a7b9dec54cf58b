"""yogacache.determined: Determined's decorators from the contexts the real ``determined`` gives.

Contexts are built as Determined builds them: off-cluster with ``det.core.init()`` /
``det.pytorch.init()`` / ``det.TrialContext.from_config``, and "on-cluster" from a ``ClusterInfo``
read from the ``DET_*`` environment a trial container gets (``TrialInfo._from_env``), turned into
an ``EnvContext`` the way ``determined.exec.harness`` does and into a ``PyTorchTrialContext`` the
way ``det.pytorch.init()`` does. Orders are checked against YogaDL's definition (strided shard,
``RandomState(seed + epoch).permutation``), not against the library's own sampler.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import determined as det
import numpy as np
import pytest
from determined import core

import yogacache.determined as ydet
from yogacache import ConfigError
from yogacache.config import GCSConfig, S3Config, SharedFSConfig
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent
N = 50  # records


def records(n: int = N) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(3, i, np.float32)} for i in range(n)]


class Maker:
    """A dataset function that counts its calls."""

    def __init__(self, n: int = N) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        return records(self.n)


def ids(stream: Any) -> list[int]:
    return [int(element["i"]) for element in stream]


def shard_order(rank: int, size: int, n: int, *, drop: bool, seed: int | None, epoch: int = 0) -> list[int]:
    end = n - n % size if drop else n
    shard = np.arange(rank, end, size)
    if seed is None:
        return shard.tolist()
    return shard[np.random.RandomState(seed + epoch).permutation(len(shard))].tolist()


def shared_fs(path: Path) -> dict[str, Any]:
    return {"type": "shared_fs", "host_storage_path": None, "container_storage_path": str(path)}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private home directory: Determined's default storage is ``~/data/determined/``."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


# -- contexts as Determined builds them --------------------------------------------------------


def cluster_info(
    monkeypatch: pytest.MonkeyPatch,
    config: dict[str, Any],
    *,
    steps_completed: int = 0,
    trial_seed: int = 1234,
    hparams: dict[str, Any] | None = None,
    task_type: str = "TRIAL",
) -> det.ClusterInfo:
    """The ClusterInfo of a trial container: the master's DET_* environment, read by Determined."""
    hparams = {"global_batch_size": 4} if hparams is None else hparams
    env = {
        "DET_MASTER": "http://127.0.0.1:8080",
        "DET_CLUSTER_ID": "cluster",
        "DET_AGENT_ID": "agent",
        "DET_SLOT_IDS": "[0]",
        "DET_TASK_ID": "task",
        "DET_ALLOCATION_ID": "task.alloc",
        "DET_SESSION_TOKEN": "token",
        "DET_TASK_TYPE": task_type,
        "DET_LATEST_CHECKPOINT": "ckpt-uuid" if steps_completed else None,
        "DET_TRIAL_ID": "7",
        "DET_EXPERIMENT_ID": "3",
        "DET_TRIAL_SEED": str(trial_seed),
        "DET_HPARAMS": json.dumps(hparams),
        "DET_EXPERIMENT_CONFIG": json.dumps(config),
        "DET_STEPS_COMPLETED": str(steps_completed),
        "DET_TRIAL_RUN_ID": "2" if steps_completed else "1",
    }
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    info = det.ClusterInfo._from_env()
    info._trial_info = det.TrialInfo._from_env()  # what the container writes to trial.json and reads back
    info._rendezvous_info = det.RendezvousInfo(["127.0.0.1"], 0, [1])
    info._resources_info = det.ResourcesInfo(gpu_uuids=[])
    return info


def core_context(info: det.ClusterInfo | None, distributed: core.DistributedContext | None = None) -> core.Context:
    """A Core API context holding ``info``, as ``det.core.init()`` builds one on-cluster."""
    dummy = core._dummy_init(distributed=distributed)
    return core.Context(checkpoint=dummy.checkpoint, distributed=dummy.distributed, info=info)


def trial_context(info: det.ClusterInfo, distributed: core.DistributedContext | None = None) -> det.TrialContext:
    """A TrialContext (TFKerasTrialContext's base) with the EnvContext of determined.exec.harness."""
    env = det.EnvContext(
        master_url=info.master_url,
        master_cert_file=info.master_cert_file,
        master_cert_name=info.master_cert_name,
        experiment_config=info.trial._config,
        hparams=info.trial.hparams,
        latest_checkpoint=info.latest_checkpoint,
        steps_completed=info.trial._steps_completed,
        use_gpu=False,
        container_gpus=[],
        slot_ids=info.slot_ids,
        debug=info.trial._debug,
        det_trial_id=str(info.trial.trial_id),
        det_experiment_id=str(info.trial.experiment_id),
        det_agent_id=info.agent_id,
        det_cluster_id=info.cluster_id,
        trial_seed=info.trial.trial_seed,
        trial_run_id=info.trial._trial_run_id,
        allocation_id=info.allocation_id,
        managed_training=True,
        test_mode=False,
        on_cluster=True,
    )
    return det.TrialContext(core_context(info, distributed), env)


def pytorch_context(info: det.ClusterInfo, distributed: core.DistributedContext | None = None) -> Any:
    """A PyTorchTrialContext with the values ``det.pytorch.init()`` takes from the cluster info."""
    from determined import pytorch

    context = core_context(info, distributed)
    return pytorch.PyTorchTrialContext(
        core_context=context,
        trial_seed=info.trial.trial_seed,
        hparams=info.trial.hparams,
        slots_per_trial=context.distributed.get_size(),
        num_gpus=0,
        exp_conf=info.trial._config,
        aggregation_frequency=1,
        steps_completed=info.trial._steps_completed,
        managed_training=True,
        debug_enabled=False,
    )


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def two_rank_contexts() -> list[core.DistributedContext]:
    """Two real DistributedContexts of one node (rank 0 is the chief); they connect over ZMQ."""
    pub, pull = free_ports(2)
    made: dict[int, core.DistributedContext] = {}
    errors: list[BaseException] = []

    def make(rank: int) -> None:
        try:
            made[rank] = core.DistributedContext(
                rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1,
                pub_port=pub, pull_port=pull,
            )
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors and len(made) == 2, errors
    return [made[0], made[1]]


@pytest.fixture
def two_ranks() -> Iterator[list[core.DistributedContext]]:
    contexts = two_rank_contexts()
    yield contexts
    for context in reversed(contexts):
        context.close()


# -- Core API -----------------------------------------------------------------------------------


def test_core_off_cluster_without_data_layer_or_storage_is_a_clear_error() -> None:
    with core.init() as context:
        with pytest.raises(ConfigError) as raised:
            ydet.data_layer(context)
    message = str(raised.value)
    assert "no data_layer section" in message
    assert "storage=" in message


def test_core_off_cluster_with_storage_reads_train_and_validation(tmp_path: Path) -> None:
    make = Maker()
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(tmp_path / "caches"), returns="stream")
        train = layer.cache_train_dataset("digits", "v1", shuffle=True)(make)()
        validation = layer.cache_validation_dataset("digits", "v1")(make)()
    assert ids(train) == shard_order(0, 1, N, drop=True, seed=0)  # off-cluster: seed 0, offset 0
    assert ids(validation) == list(range(N))
    store = CacheStore(tmp_path / "caches")
    assert store.exists("digits", "v1_train") and store.exists("digits", "v1_val")
    assert make.calls == 2


def test_core_on_cluster_resumes_after_the_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = {"data_layer": shared_fs(tmp_path / "caches")}
    info = cluster_info(monkeypatch, config, steps_completed=3, trial_seed=77, hparams={"global_batch_size": 4})
    context = core_context(info)
    layer = ydet.data_layer(context, returns="stream")
    assert (layer.facts.seed, layer.facts.steps_completed, layer.facts.per_slot_batch_size) == (77, 3, 4)
    assert layer.offset == 12  # 3 batches x 4 records per slot
    stream = layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()
    epoch0 = shard_order(0, 1, N, drop=True, seed=77, epoch=0)
    assert ids(stream) == epoch0[12:]  # the rest of epoch 0
    assert ids(stream) == shard_order(0, 1, N, drop=True, seed=77, epoch=1)  # then epoch 1, reshuffled
    validation = layer.cache_validation_dataset("digits", "v1", shuffle=True)(Maker())()
    assert ids(validation) == shard_order(0, 1, N, drop=False, seed=77)  # from 0, same order every epoch
    assert ids(validation) == shard_order(0, 1, N, drop=False, seed=77)


def test_resume_past_an_epoch_starts_in_a_later_epoch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = {"data_layer": shared_fs(tmp_path / "caches")}
    info = cluster_info(monkeypatch, config, steps_completed=30, trial_seed=2, hparams={"global_batch_size": 4})
    layer = ydet.data_layer(core_context(info), returns="stream")
    assert layer.offset == 120  # 2 whole epochs of 50 records, then 20 more
    stream = layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()
    assert ids(stream) == shard_order(0, 1, N, drop=True, seed=2, epoch=2)[20:]
    assert ids(stream) == shard_order(0, 1, N, drop=True, seed=2, epoch=3)


def test_core_info_argument_and_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path / "c")}, steps_completed=2)
    with core.init() as context:  # off-cluster context, cluster info passed in
        assert ydet.data_layer(context, info=info).offset == 8  # 2 x global_batch_size 4
        overridden = ydet.data_layer(context, info=info, steps_completed=5, per_slot_batch_size=3, seed=9)
        assert (overridden.offset, overridden.facts.seed) == (15, 9)
        explicit = ydet.data_layer(context, steps_completed=4, per_slot_batch_size=2, storage=shared_fs(tmp_path))
        assert explicit.offset == 8


def test_core_context_of_a_task_that_is_not_a_trial(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path)}, steps_completed=3, task_type="COMMAND")
    with pytest.raises(ConfigError, match="no data_layer section"):  # a command has no experiment config
        ydet.data_layer(core_context(info))
    layer = ydet.data_layer(core_context(info), storage=shared_fs(tmp_path))
    assert (layer.facts.seed, layer.offset) == (0, 0)


def test_resume_without_a_batch_size_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path)}, steps_completed=5, hparams={"lr": 0.1})
    with pytest.raises(ConfigError) as raised:
        ydet.data_layer(core_context(info))
    assert "per_slot_batch_size" in str(raised.value) and "global_batch_size" in str(raised.value)
    assert ydet.data_layer(core_context(info), per_slot_batch_size=2).offset == 10
    fresh = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path)}, steps_completed=0, hparams={"lr": 0.1})
    assert ydet.data_layer(core_context(fresh)).offset == 0  # nothing to skip: no batch size needed
    odd = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path)}, hparams={"global_batch_size": "big"})
    assert ydet.data_layer(core_context(odd)).offset == 0  # a Core API trial's own hparams, not needed


# -- trial contexts -----------------------------------------------------------------------------


def test_trial_context_returns_tf_datasets_resumed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import tensorflow as tf

    config = {"data_layer": shared_fs(tmp_path / "caches"), "resources": {"slots_per_trial": 1}}
    info = cluster_info(monkeypatch, config, steps_completed=2, trial_seed=5, hparams={"global_batch_size": 8})
    context = trial_context(info)
    layer = ydet.data_layer(context)
    assert layer.offset == 16
    dataset = layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()
    assert isinstance(dataset, tf.data.Dataset)
    got = [int(e["i"]) for e in dataset.as_numpy_iterator()]
    assert got == shard_order(0, 1, N, drop=True, seed=5)[16:]
    again = [int(e["i"]) for e in dataset.as_numpy_iterator()]
    assert again == shard_order(0, 1, N, drop=True, seed=5, epoch=1)  # the next pass: the next epoch


class KerasLikeContext(det.TrialContext):
    """A TrialContext with TFKerasTrialContext's get_per_slot_batch_size (determined.keras needs Keras 2)."""

    def get_per_slot_batch_size(self) -> int:
        return 5


def test_a_trial_contexts_own_per_slot_batch_size_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = {"data_layer": shared_fs(tmp_path), "resources": {"slots_per_trial": 1}}
    info = cluster_info(monkeypatch, config, steps_completed=3, hparams={"global_batch_size": 8})
    plain = trial_context(info)
    assert ydet.data_layer(plain).offset == 24  # global_batch_size 8 // 1 slot
    keras_like = KerasLikeContext(plain._core, plain.env)
    assert ydet.data_layer(keras_like).offset == 15  # 3 x get_per_slot_batch_size()


def test_trial_context_from_config_off_cluster(tmp_path: Path) -> None:
    config = {
        "data_layer": shared_fs(tmp_path / "caches"),
        "hyperparameters": {"global_batch_size": 4},
        "reproducibility": {"experiment_seed": 31},
    }
    context = det.TrialContext.from_config(config)
    layer = ydet.data_layer(context, returns="stream")
    assert (layer.facts.seed, layer.offset, layer.facts.per_slot_batch_size) == (31, 0, 4)
    assert ids(layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()) == shard_order(
        0, 1, N, drop=True, seed=31
    )


def test_pytorch_trial_context_returns_torch_datasets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader

    from yogacache.torch import CacheIterableDataset

    config = {"data_layer": shared_fs(tmp_path / "caches")}
    info = cluster_info(monkeypatch, config, steps_completed=3, trial_seed=11, hparams={"global_batch_size": 5})
    context = pytorch_context(info)
    layer = ydet.data_layer(context)
    assert layer.offset == 15
    dataset = layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()
    assert isinstance(dataset, CacheIterableDataset)
    batches = list(DataLoader(dataset, batch_size=context.get_per_slot_batch_size()))
    assert all(isinstance(batch["i"], torch.Tensor) for batch in batches)
    assert [int(i) for batch in batches for i in batch["i"]] == shard_order(0, 1, N, drop=True, seed=11)[15:]
    validation = layer.cache_validation_dataset("digits", "v1")(Maker())()
    assert isinstance(validation, CacheIterableDataset)
    assert [int(e["i"]) for e in validation] == list(range(N))


def test_pytorch_init_off_cluster(tmp_path: Path) -> None:
    from determined import pytorch

    exp_conf = {"data_layer": shared_fs(tmp_path / "caches"), "reproducibility": {"experiment_seed": 3}}
    with pytorch.init(hparams={"global_batch_size": 4}, exp_conf=exp_conf) as context:
        layer = ydet.data_layer(context)
        assert (layer.facts.returns, layer.facts.seed, layer.offset) == ("torch", 3, 0)
        dataset = layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()
        assert [int(e["i"]) for e in dataset] == shard_order(0, 1, N, drop=True, seed=3)
    with pytorch.init(exp_conf=exp_conf) as context:  # no hparams: no batch size, none needed at batch 0
        layer = ydet.data_layer(context, storage=shared_fs(tmp_path / "other"))
        assert (layer.facts.per_slot_batch_size, layer.offset) == (None, 0)
    with pytorch.init(hparams={"global_batch_size": 4}) as context:  # no exp_conf: no data_layer
        with pytest.raises(ConfigError, match="no data_layer section"):
            ydet.data_layer(context)


@pytest.mark.parametrize("make_context", [trial_context, pytorch_context], ids=["TrialContext", "PyTorchTrialContext"])
def test_two_ranks_read_disjoint_shards(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, two_ranks: list[Any], make_context: Any
) -> None:
    config = {"data_layer": shared_fs(tmp_path / "caches"), "resources": {"slots_per_trial": 2}}
    info = cluster_info(monkeypatch, config, steps_completed=2, trial_seed=8, hparams={"global_batch_size": 6})
    make = Maker()
    train: list[list[int]] = []
    validation: list[list[int]] = []
    for distributed in two_ranks:
        layer = ydet.data_layer(make_context(info, distributed), returns="stream")
        assert (layer.facts.rank, layer.facts.num_shards) == (distributed.rank, 2)
        assert layer.offset == 6  # 2 batches x (6 // 2) records per slot
        stream = layer.cache_train_dataset("digits", "v1", shuffle=True)(make)()
        train.append(ids(stream) + ids(stream))  # the rest of epoch 0, then epoch 1
        validation.append(ids(layer.cache_validation_dataset("digits", "v1")(make)()))
    for rank in (0, 1):
        remaining = shard_order(rank, 2, N, drop=True, seed=8)[6:]
        assert train[rank][: len(remaining)] == remaining
        assert sorted(train[rank][len(remaining):]) == list(range(rank, N, 2))
    assert not set(train[0]) & set(train[1])
    assert set(train[0][-N // 2:]) | set(train[1][-N // 2:]) == set(range(N))
    assert not set(validation[0]) & set(validation[1])
    assert sorted(validation[0] + validation[1]) == list(range(N))
    assert make.calls == 2  # one build each of _train and _val, shared by both ranks


RANK_SCRIPT = """
import json, sys
from determined import core
import yogacache.determined as ydet

rank, pub, pull, root = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
distributed = core.DistributedContext(
    rank=rank, size=2, local_rank=rank, local_size=2, cross_rank=0, cross_size=1, pub_port=pub, pull_port=pull
)
with core.init(distributed=distributed) as context:
    layer = ydet.data_layer(context, storage={"type": "shared_fs", "host_storage_path": root}, returns="stream")

    @layer.cache_train_dataset("procs", "v1", shuffle=True)
    def make():
        print("built", file=sys.stderr)
        return [{"i": i} for i in range(41)]

    print(json.dumps([int(e["i"]) for e in make()]))
"""


def test_two_processes_read_disjoint_shards(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    pub, pull = free_ports(2)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(pub), str(pull), str(tmp_path / "caches")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for rank in (0, 1)
    ]
    outs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (_out, err) in zip(procs, outs):
        assert proc.returncode == 0, err
    got = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert got[0] == shard_order(0, 2, 41, drop=True, seed=0)
    assert got[1] == shard_order(1, 2, 41, drop=True, seed=0)
    assert sorted(got[0] + got[1]) == list(range(40))  # the remainder (record 40) is dropped
    assert sum(err.count("built") for _, err in outs) == 1  # one process built, the other waited


# -- once per trial -----------------------------------------------------------------------------


def test_each_decorator_once_per_trial(tmp_path: Path) -> None:
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(tmp_path), returns="stream")
        layer.cache_train_dataset("digits", "v1")
        with pytest.raises(ydet.DecoratorReusedError, match="cache_train_dataset was already used.*digits:v1_train"):
            layer.cache_train_dataset("digits", "v1")
        again = ydet.data_layer(context, storage=shared_fs(tmp_path), returns="stream")  # same trial
        with pytest.raises(ydet.DecoratorReusedError):
            again.cache_train_dataset("other", "v2")
        layer.cache_validation_dataset("digits", "v1")
        again.cache_validation_dataset("digits", "v1")  # rebuilding the same validation data: allowed
        with pytest.raises(ydet.DecoratorReusedError, match="cache_validation_dataset was already used"):
            again.cache_validation_dataset("digits", "v2")
    with core.init() as other_trial:
        ydet.data_layer(other_trial, storage=shared_fs(tmp_path)).cache_train_dataset("digits", "v1")


def test_a_failed_decorator_call_does_not_count(tmp_path: Path) -> None:
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(tmp_path), returns="stream")
        with pytest.raises(ValueError, match="dataset_id"):
            layer.cache_train_dataset("../escape", "v1")
        with pytest.raises(ValueError, match="returns must be one of"):
            layer.cache_train_dataset("digits", "v1", returns="jax")
        layer.cache_train_dataset("digits", "v1")  # the corrected call is the trial's one use
        with pytest.raises(ydet.DecoratorReusedError):
            layer.cache_train_dataset("digits", "v1")


def test_a_decorated_function_may_be_called_again(tmp_path: Path) -> None:
    make = Maker()
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(tmp_path), returns="stream")
        cached = layer.cache_train_dataset("digits", "v1")(make)
        assert ids(cached()) == ids(cached()) == list(range(N))
    assert make.calls == 1


# -- the data_layer section ---------------------------------------------------------------------


def test_shared_fs_section_uses_the_container_path(tmp_path: Path, home: Path) -> None:
    section = {"type": "shared_fs", "host_storage_path": "/host/data", "container_storage_path": str(tmp_path / "c")}
    assert ydet.storage_from_data_layer(section) == SharedFSConfig("/host/data", str(tmp_path / "c"))
    # Determined mounted host_storage_path only at a container_storage_path; without one its data
    # layer used ~/data/determined/ in the container.
    default = ydet.storage_from_data_layer({"type": "shared_fs", "host_storage_path": "/host/data"})
    assert default.storage_path == home / "data" / "determined"
    assert ydet.storage_from_data_layer({"type": "shared_fs"}).storage_path == home / "data" / "determined"


def test_trial_without_container_path_caches_under_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    info = cluster_info(monkeypatch, {"data_layer": {"type": "shared_fs"}})
    layer = ydet.data_layer(core_context(info), returns="stream")
    assert ids(layer.cache_validation_dataset("digits", "v1")(Maker())()) == list(range(N))
    assert CacheStore(home / "data" / "determined").exists("digits", "v1_val")


def test_cloud_sections_default_their_local_cache(tmp_path: Path, home: Path) -> None:
    s3 = ydet.storage_from_data_layer(
        {"type": "s3", "bucket": "b", "bucket_directory_path": "caches", "access_key": "AK", "secret_key": "SK",
         "endpoint_url": None, "local_cache_host_path": None, "local_cache_container_path": None}
    )
    assert isinstance(s3, S3Config)
    assert (s3.bucket, s3.bucket_directory_path, s3.access_key, s3.secret_key) == ("b", "caches", "AK", "SK")
    assert s3.local_cache_path == home / "data" / "determined"
    gcs = ydet.storage_from_data_layer(
        {"type": "gcs", "bucket": "g", "bucket_directory_path": "p", "local_cache_host_path": "/host/cache",
         "local_cache_container_path": str(tmp_path / "cache")}
    )
    assert isinstance(gcs, GCSConfig)
    assert (gcs.url, gcs.local_cache_path) == ("gs://g/p", tmp_path / "cache")


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"type": "shared_fs", "hots_storage_path": "/x"}, ["hots_storage_path", "did you mean host_storage_path"]),
        ({"type": "nfs"}, ["data_layer.type", "shared_fs"]),
        ({"type": "s3", "bucket_directory_path": "p"}, ["data_layer.bucket"]),
        ({"type": "s3", "bucket": "b", "local_cache_host_path": "/h"}, ["set together"]),
        ({"type": "shared_fs", "container_storage_path": "relative"}, ["absolute"]),
        ("shared_fs", ["data_layer section must be a mapping"]),
    ],
)
def test_bad_sections_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, section: Any, words: list[str]
) -> None:
    info = cluster_info(monkeypatch, {"data_layer": section})
    with pytest.raises(ConfigError) as raised:
        ydet.data_layer(core_context(info))
    for word in words:
        assert word in str(raised.value)


def test_explicit_storage_wins_over_the_section(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    info = cluster_info(monkeypatch, {"data_layer": shared_fs(tmp_path / "section")})
    layer = ydet.data_layer(core_context(info), storage=shared_fs(tmp_path / "explicit"), returns="stream")
    layer.cache_train_dataset("digits", "v1")(Maker())()
    assert CacheStore(tmp_path / "explicit").exists("digits", "v1_train")
    assert not (tmp_path / "section").exists()


def test_s3_section_publishes_to_the_bucket(
    monkeypatch: pytest.MonkeyPatch, home: Path, s3_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3_server.new_bucket()
    section = {
        "type": "s3", "bucket": bucket, "bucket_directory_path": "team/caches", "endpoint_url": s3_server.endpoint_url,
        "access_key": s3_server.access_key, "secret_key": s3_server.secret_key,
    }
    info = cluster_info(monkeypatch, {"data_layer": section}, trial_seed=4)
    caplog.set_level("DEBUG")
    layer = ydet.data_layer(core_context(info), returns="stream")
    assert ids(layer.cache_train_dataset("digits", "v1", shuffle=True)(Maker())()) == shard_order(
        0, 1, N, drop=True, seed=4
    )
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "team/caches/digits/v1_train/manifest.json" in keys
    assert (home / "data" / "determined" / "yogadl_local_cache" / "digits" / "v1_train" / "manifest.json").exists()
    assert s3_server.secret_key not in repr(layer) + repr(layer.facts) + caplog.text


def test_gcs_section_publishes_to_the_bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gcs_server: Any) -> None:
    bucket = gcs_server.new_bucket()
    local = tmp_path / "local-cache"
    section = {
        "type": "gcs", "bucket": bucket, "bucket_directory_path": "caches",
        "local_cache_host_path": "/host/cache", "local_cache_container_path": str(local),
    }
    info = cluster_info(monkeypatch, {"data_layer": section})
    layer = ydet.data_layer(core_context(info), returns="stream")
    assert ids(layer.cache_validation_dataset("digits", "v1")(Maker())()) == list(range(N))
    names = [blob.name for blob in gcs_server.client().list_blobs(bucket)]
    assert "caches/digits/v1_val/manifest.json" in names
    assert (local / "yogadl_local_cache" / "digits" / "v1_val" / "manifest.json").exists()


# -- the example trial ---------------------------------------------------------------------------


def run_trial_example(tmp_path: Path, *args: str) -> str:
    work = tmp_path / "work"  # Determined copies the working directory into its checkpoints
    work.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "determined_trial.py"), "--storage", str(tmp_path / "caches"), *args],
        capture_output=True, text=True, timeout=600, cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(tmp_path / "checkpoints")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.slow
def test_example_trial_runs_off_cluster(tmp_path: Path) -> None:
    first = run_trial_example(tmp_path, "--batches", "80")  # more than one epoch (64 batches)
    assert "seed=42" in first
    assert "caches built this run: train 1, validation 1" in first
    assert float(first.split("validation accuracy ")[1].split()[0]) >= 0.9
    assert CacheStore(tmp_path / "caches").manifest("synthetic-blobs", "v1_train").num_records == 2048
    assert CacheStore(tmp_path / "caches").manifest("synthetic-blobs", "v1_val").num_records == 512


class Batches:
    """A loader of one epoch: each pass yields the next epoch's batches."""

    def __init__(self, epochs: list[list[int]]) -> None:
        self.epochs = iter(epochs)

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[int]:
        return iter(next(self.epochs, []))


def test_repeat_epochs_goes_on_and_stops_on_an_empty_epoch() -> None:
    repeated = ydet.repeat_epochs(Batches([[1, 2], [3, 4], [5, 6]]))
    assert len(repeated) == 2
    assert list(repeated) == [1, 2, 3, 4, 5, 6]  # the fourth pass is empty: the end, not a hang


def test_the_readme_migration_line_runs(tmp_path: Path) -> None:
    import tensorflow as tf

    import yogacache

    text = (REPO / "README.md").read_text()
    section = text[text.index("### Determined"):]
    line = " ".join(section.split("\n\n")[1].split())  # "`@self.context.experimental...` becomes `@yogacache...`"
    removed, replacement = re.findall(r"`(@[^`]+)`", line)[:2]
    assert replacement == removed.replace("self.context.experimental", "yogacache.determined.data_layer(self.context)")

    class Trial:
        context = det.TrialContext.from_config(
            {"data_layer": shared_fs(tmp_path / "caches"), "hyperparameters": {"global_batch_size": 4},
             "reproducibility": {"experiment_seed": 6}}
        )

    namespace: dict[str, Any] = {"self": Trial(), "yogacache": yogacache, "records": records}
    decorator = replacement.replace("(...)", '("mnist", "v1", shuffle=True)')  # the README elides them
    exec(decorator + "\ndef make_dataset():\n    return records()\n", namespace)
    dataset = namespace["make_dataset"]()
    assert isinstance(dataset, tf.data.Dataset)
    assert [int(e["i"]) for e in dataset.as_numpy_iterator()] == shard_order(0, 1, N, drop=True, seed=6)
    assert CacheStore(tmp_path / "caches").exists("mnist", "v1_train")


# -- misuse and laziness ------------------------------------------------------------------------


def test_not_a_determined_context_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="takes a Determined context"):
        ydet.data_layer(object(), storage=shared_fs(tmp_path))
    with core.init() as context:
        with pytest.raises(ValueError, match="returns must be one of"):
            ydet.data_layer(context, storage=shared_fs(tmp_path), returns="jax")
        with pytest.raises(ValueError, match="per_slot_batch_size must be positive"):
            ydet.data_layer(context, storage=shared_fs(tmp_path), per_slot_batch_size=0)


def test_import_yogacache_never_imports_determined() -> None:
    code = (
        "import sys, yogacache; yogacache.DataLayer; assert 'determined' not in sys.modules, 'determined';"
        "import yogacache.determined;"
        "heavy = [m for m in ('tensorflow', 'torch') if m in sys.modules]; assert not heavy, heavy"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
