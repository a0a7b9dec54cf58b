"""A Determined trial reading a mixture of caches (``train_mixture``): every pass of a PyTorch
trial's loader reads the next epoch of the mixture, exactly; a trial restarted at any step
finishes its epoch and goes on as the uninterrupted one; ranks share the mixed order; other
trials (Core API, TFKeras-style) resume at ``steps x per-slot batch size`` records.

Contexts are Determined's own (``det.pytorch.init()`` off-cluster, and the on-cluster contexts
of tests/test_determined.py). Orders are checked twice: against ``Mixture.stream`` read epoch
by epoch (the core's order, itself property-tested), and against what a mixture promises
whatever its order: each epoch exactly its share of each cache, each cache drawn in whole
passes (every record once per pass), the two ranks' records together one epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from determined import core

import yogacache.determined as ydet
from tests.test_determined import cluster_info, pytorch_context, shared_fs, trial_context, two_rank_contexts
from yogacache.mixture import Mixture
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent

SIZES = {"web": 90, "code": 30, "books": 12}
BASES = {"web": 0, "code": 1000, "books": 2000}  # record i of cache c holds BASES[c] + i
WEIGHTS = [0.6, 0.3, 0.1]
# epoch size: the caches' records together, 132; by largest remainders 79.2, 39.6, 13.2 ->
COUNTS = (79, 40, 13)  # web rotates (0.88 passes), code 1.33 passes, books 1.08 passes
EPOCH = sum(COUNTS)
BATCH = 16  # 132 records: 9 batches an epoch, the last of 4
SEED = 5


def build_caches(root: Path) -> None:
    store = CacheStore(root, show_progress=False)
    for name, size in SIZES.items():
        store.build(name, "v1", [{"i": np.int64(BASES[name] + i), "x": np.full(2, i, np.float32)} for i in range(size)])


def cache_of(record: int) -> str:
    return next(name for name, base in sorted(BASES.items(), key=lambda kv: -kv[1]) if record >= base)


def reference_epochs(mixture: Mixture, epochs: int, rank: int = 0, num_shards: int = 1) -> list[list[int]]:
    """The mixture's epochs read through ``Mixture.stream`` (each iteration is the next epoch)."""
    stream = mixture.stream(
        shuffle=True, shuffle_seed=SEED, shard_rank=rank, num_shards=num_shards, drop_shard_remainder=True
    )
    return [[int(element["i"]) for element in stream] for _ in range(epochs)]


def batched(epochs: list[list[int]], size: int) -> list[list[int]]:
    """Each epoch batched on its own, as a PyTorch trial's DataLoader batches it."""
    return [epoch[start : start + size] for epoch in epochs for start in range(0, len(epoch), size)]


def check_mixture_promises(epochs: list[list[int]]) -> None:
    """Exactly its share of each cache every epoch; each cache's records, in the order read,
    come in whole passes: every record once per pass."""
    for epoch in epochs:
        counts = Counter(cache_of(record) for record in epoch)
        assert tuple(counts[name] for name in SIZES) == COUNTS
    for name, size in SIZES.items():
        drawn = [record - BASES[name] for epoch in epochs for record in epoch if cache_of(record) == name]
        for start in range(0, len(drawn) - size + 1, size):
            assert sorted(drawn[start : start + size]) == list(range(size)), f"{name} pass {start // size}"
        tail = drawn[len(drawn) - len(drawn) % size :]
        assert len(set(tail)) == len(tail), f"{name}: a record twice within a pass"


def pytorch_trial_batches(tmp_path: Path, steps_completed: int, take: int) -> tuple[int, list[list[int]], Mixture]:
    """``take`` batches of the loader a PyTorch trial builds over the mixture after
    ``steps_completed`` batches, through ``repeat_epochs``; the loader's ``len()``."""
    from determined import pytorch
    from torch.utils.data import DataLoader

    exp_conf = {"data_layer": shared_fs(tmp_path / "caches"), "reproducibility": {"experiment_seed": SEED}}
    with pytorch.init(hparams={"global_batch_size": BATCH}, exp_conf=exp_conf) as context:
        layer = ydet.data_layer(context, steps_completed=steps_completed)
        mixture = layer.mixture([("web", "v1"), ("code", "v1"), ("books", "v1")], weights=WEIGHTS)
        dataset = layer.train_mixture(mixture, shuffle=True)
        loader = ydet.repeat_epochs(DataLoader(dataset, batch_size=context.get_per_slot_batch_size()))
        out = []
        for batch in loader:
            out.append([int(i) for i in batch["i"]])
            if len(out) == take:
                break
        return len(loader), out, mixture


@pytest.fixture
def caches(tmp_path: Path) -> Path:
    build_caches(tmp_path / "caches")
    return tmp_path / "caches"


def test_a_pytorch_trial_reads_each_epoch_of_the_mixture_exactly(tmp_path: Path, caches: Path) -> None:
    length, batches, mixture = pytorch_trial_batches(tmp_path, 0, 27)
    assert mixture.counts == COUNTS and len(mixture) == EPOCH
    assert length == 9  # one whole epoch of the mixture: 132 records in batches of 16
    epochs = [sum(batches[e * 9 : (e + 1) * 9], []) for e in range(3)]
    assert batches == batched(reference_epochs(mixture, 3), BATCH)
    check_mixture_promises(epochs)
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled with the trial seed every epoch
    # Every batch mixes the caches: none reads one cache after another.
    assert all(len({cache_of(record) for record in batch}) >= 2 for batch in batches if len(batch) == BATCH)


@pytest.mark.parametrize("steps", [3, 9, 13, 22])
def test_a_pytorch_trial_restarted_mid_epoch_continues_exactly(tmp_path: Path, caches: Path, steps: int) -> None:
    # At 13 batches: epoch 1, batch 4 -- records 64.. of epoch 1 (epoch 0's last batch held 4).
    _, uninterrupted, _ = pytorch_trial_batches(tmp_path, 0, 27)
    length, resumed, _ = pytorch_trial_batches(tmp_path, steps, 27 - steps)
    assert length == 9  # one whole epoch, wherever the trial resumed
    assert resumed == uninterrupted[steps:]


def test_two_ranks_share_the_mixed_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caches: Path) -> None:
    epochs = two_rank_epochs(monkeypatch, tmp_path, steps_completed=0, take=18)
    per_slot = BATCH // 2
    for rank in (0, 1):
        assert epochs[rank] == batched(reference_epochs(epochs["mixture"], 2, rank, 2), per_slot)
    for epoch in range(2):  # the two ranks' records together: the epoch, each record where it was
        ranks = [sum(epochs[rank][epoch * 9 : (epoch + 1) * 9], []) for rank in (0, 1)]
        whole = reference_epochs(epochs["mixture"], epoch + 1)[epoch]
        assert ranks[0] == whole[0::2] and ranks[1] == whole[1::2]


def test_two_ranks_restarted_mid_epoch_continue_exactly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caches: Path
) -> None:
    # 11 batches of 8 per rank: epoch 1 (9 batches an epoch, the last of 2 records), batch 2.
    uninterrupted = two_rank_epochs(monkeypatch, tmp_path, steps_completed=0, take=27)
    resumed = two_rank_epochs(monkeypatch, tmp_path, steps_completed=11, take=27 - 11)
    for rank in (0, 1):
        assert resumed[rank] == uninterrupted[rank][11:]


def two_rank_epochs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, steps_completed: int, take: int
) -> dict[Any, Any]:
    """``take`` batches of each of two ranks' PyTorch trial loaders (on-cluster contexts, global
    batch 16: 8 per slot), resumed after ``steps_completed`` batches."""
    from torch.utils.data import DataLoader

    config = {"data_layer": shared_fs(tmp_path / "caches"), "resources": {"slots_per_trial": 2}}
    info = cluster_info(
        monkeypatch, config, steps_completed=steps_completed, trial_seed=SEED, hparams={"global_batch_size": BATCH}
    )
    out: dict[Any, Any] = {}
    for distributed in contexts_of_two_ranks():
        context = pytorch_context(info, distributed)
        layer = ydet.data_layer(context)
        assert (layer.facts.rank, layer.facts.num_shards, layer.facts.per_slot_batch_size) == (distributed.rank, 2, 8)
        mixture = layer.mixture([("web", "v1"), ("code", "v1"), ("books", "v1")], weights=WEIGHTS)
        dataset = layer.train_mixture(mixture, shuffle=True)
        loader = ydet.repeat_epochs(DataLoader(dataset, batch_size=context.get_per_slot_batch_size()))
        assert len(loader) == 9  # 66 records of the epoch per rank, in batches of 8
        batches: list[list[int]] = []
        for batch in loader:
            batches.append([int(i) for i in batch["i"]])
            if len(batches) == take:
                break
        out[distributed.rank] = batches
        out["mixture"] = mixture
    return out


def contexts_of_two_ranks() -> Iterator[core.DistributedContext]:
    contexts = two_rank_contexts()
    try:
        yield from contexts
    finally:
        for context in reversed(contexts):
            context.close()


def test_a_core_api_trial_resumes_at_steps_times_batch_records(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caches: Path
) -> None:
    """Streams and tf.data batch across epochs: the resume point is exactly steps x batch records."""
    config = {"data_layer": shared_fs(caches)}
    info = cluster_info(monkeypatch, config, steps_completed=10, trial_seed=SEED, hparams={"global_batch_size": 16})
    layer = ydet.data_layer(trial_context(info), returns="stream")
    assert layer.offset == 160  # past epoch 0 (132 records): 28 records into epoch 1
    mixture = layer.mixture([("web", "v1"), ("code", "v1"), ("books", "v1")], weights=WEIGHTS)
    stream = layer.train_mixture(mixture, shuffle=True)
    read = [[int(element["i"]) for element in stream] for _ in range(2)]
    reference = reference_epochs(mixture, 3)
    assert read == [reference[1][28:], reference[2]]


def test_a_mixture_config_section_in_the_trials_storage(tmp_path: Path, caches: Path) -> None:
    section = {
        "epoch_size": 40,
        "components": [
            {"dataset_id": "web", "dataset_version": "v1", "weight": 3},
            {"dataset_id": "books", "dataset_version": "v1", "weight": 1},
        ],
    }
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(caches), returns="stream")
        mixture = layer.mixture(section)
        assert mixture.counts == (30, 10) and mixture.names == ("web:v1", "books:v1")
        stream = layer.train_mixture(mixture, shuffle=True)
        epochs = [[int(element["i"]) for element in stream] for _ in range(3)]
    assert all(Counter(cache_of(record) for record in epoch) == {"web": 30, "books": 10} for epoch in epochs)
    web = [record for epoch in epochs for record in epoch if cache_of(record) == "web"]
    assert sorted(web) == list(range(90))  # 30 a time, web rotates through all 90 in three epochs


def test_validation_reads_the_same_records_in_the_same_order_every_time(tmp_path: Path, caches: Path) -> None:
    """``validation_mixture``: from the start, the same order every time, a downsampled cache too
    (validation scores stay comparable from one evaluation to the next)."""
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(caches), returns="stream")
        mixture = layer.mixture([("web", "v1"), ("books", "v1")], epoch_size=40, weights=[3, 1])
        validation = layer.validation_mixture(mixture)
        first = [int(element["i"]) for element in validation]
        assert Counter(cache_of(record) for record in first) == {"web": 30, "books": 10}
        assert [int(element["i"]) for element in validation] == first
        again = layer.validation_mixture(mixture)  # again with the same mixture: allowed
        assert [int(element["i"]) for element in again] == first


def test_train_mixture_counts_as_the_trials_one_training_dataset(tmp_path: Path, caches: Path) -> None:
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(caches), returns="stream")
        mixture = layer.mixture([("web", "v1"), ("code", "v1")])
        with pytest.raises(TypeError, match="train_mixture takes a yogacache.Mixture"):
            layer.train_mixture([("web", "v1"), ("code", "v1")])
        layer.train_mixture(mixture, shuffle=True)  # a refused call does not count
        used = r"train_mixture was already used in this trial \(for mixture\(web:v1, code:v1\)\)"
        with pytest.raises(ydet.DecoratorReusedError, match=used):
            layer.cache_train_dataset("web", "v1")
        with pytest.raises(ydet.DecoratorReusedError, match="train_mixture was already used"):
            layer.train_mixture(mixture, shuffle=True)
        layer.validation_mixture(mixture)
        with pytest.raises(ydet.DecoratorReusedError, match="validation_mixture was already used"):
            layer.cache_validation_dataset("web", "v1")


def test_a_missing_component_names_it(tmp_path: Path, caches: Path) -> None:
    with core.init() as context:
        layer = ydet.data_layer(context, storage=shared_fs(caches), returns="stream")
        with pytest.raises(Exception, match="missing.*v9|v9.*missing") as raised:
            layer.mixture([("web", "v1"), ("missing", "v9")])
    assert "CacheNotFound" in type(raised.value).__name__ or isinstance(raised.value, FileNotFoundError)


TRIAL = textwrap.dedent(
    """
    import json, sys
    import numpy as np, torch
    from determined import pytorch
    from torch.utils.data import DataLoader
    import yogacache.determined

    SEEN = []

    class Trial(pytorch.PyTorchTrial):
        def __init__(self, context):
            self.context = context
            self.data = yogacache.determined.data_layer(context)
            context.experimental.disable_dataset_reproducibility_checks()
            self.model = context.wrap_model(torch.nn.Linear(2, 2))
            self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.1))
            self.mixture = self.data.mixture([("web", "v1"), ("code", "v1"), ("books", "v1")], weights=[0.6, 0.3, 0.1])

        def build_training_data_loader(self):
            dataset = self.data.train_mixture(self.mixture, shuffle=True)
            loader = DataLoader(dataset, batch_size=self.context.get_per_slot_batch_size())
            return yogacache.determined.repeat_epochs(loader)

        def build_validation_data_loader(self):
            dataset = self.data.validation_mixture(self.mixture)
            return DataLoader(dataset, batch_size=self.context.get_per_slot_batch_size())

        def train_batch(self, batch, epoch_idx, batch_idx):
            SEEN.append([int(i) for i in batch["i"]])
            loss = self.model(batch["x"]).sum()
            self.context.backward(loss)
            self.context.step_optimizer(self.optimizer)
            return {"loss": loss}

        def evaluate_batch(self, batch):
            return {"validation_loss": self.model(batch["x"]).sum()}

    hparams = {"global_batch_size": 16}
    exp_conf = {
        "hyperparameters": hparams,
        "data_layer": {"type": "shared_fs", "host_storage_path": None, "container_storage_path": sys.argv[1]},
        "reproducibility": {"experiment_seed": 5},
    }
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, enable_tensorboard_logging=False) as context:
        trainer = pytorch.Trainer(Trial(context), context)
        trainer.fit(max_length=pytorch.Epoch(2), checkpoint_policy="none")
    print("SEEN " + json.dumps(SEEN))
    """
)


@pytest.mark.slow
def test_determined_trainer_fits_two_epochs_of_the_mixture(tmp_path: Path, caches: Path) -> None:
    """Determined's own ``pytorch.Trainer.fit(Epoch(2))``: two epochs of 9 batches, each exactly
    the mixture's epoch, the second reshuffled."""
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    work = tmp_path / "work"  # Determined copies the working directory into its checkpoints
    work.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(caches)],
        capture_output=True, text=True, timeout=600, cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(tmp_path / "checkpoints")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.split("SEEN ", 1)[1].splitlines()[0])
    mixture = Mixture([caches / name / "v1" for name in SIZES], weights=WEIGHTS)
    assert seen == batched(reference_epochs(mixture, 2), BATCH), "Epoch(2) trains epoch 0, then epoch 1"
    check_mixture_promises([sum(seen[:9], []), sum(seen[9:], [])])
