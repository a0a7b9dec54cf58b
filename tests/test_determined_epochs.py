"""A Determined PyTorch trial over several epochs: every pass reads the next epoch, a resumed
trial finishes its epoch and goes on with whole ones, resumes skip whole batches (as
``det.pytorch.DataLoader`` does) and ``len()`` is one whole epoch's batches.

Orders are checked against YogaDL's definition (strided shard, ``RandomState(seed + epoch)``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache.determined as ydet

REPO = Path(__file__).resolve().parent.parent
N = 100  # records; with batch 16, 7 batches an epoch, the last of 4 records
BATCH = 16


def records(n: int = N) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(2, i, np.float32)} for i in range(n)]


def epoch_order(seed: int, epoch: int, n: int = N) -> list[int]:
    return np.arange(n)[np.random.RandomState(seed + epoch).permutation(n)].tolist()


def epoch_batches(seed: int, epochs: int) -> list[list[int]]:
    """The batches an uninterrupted trial trains on: each epoch batched on its own."""
    out = []
    for epoch in range(epochs):
        order = epoch_order(seed, epoch)
        out += [order[start : start + BATCH] for start in range(0, N, BATCH)]
    return out


def shared_fs(path: Path) -> dict[str, Any]:
    return {"type": "shared_fs", "host_storage_path": None, "container_storage_path": str(path)}


def trial_batches(tmp_path: Path, steps_completed: int, take: int, workers: int = 0) -> tuple[int, list[list[int]]]:
    """``take`` batches of the training loader a PyTorch trial builds after ``steps_completed``
    batches, through ``repeat_epochs``; and the loader's ``len()``."""
    from determined import pytorch
    from torch.utils.data import DataLoader

    hparams = {"global_batch_size": BATCH}
    exp_conf = {"data_layer": shared_fs(tmp_path / "caches"), "reproducibility": {"experiment_seed": 5}}
    with pytorch.init(hparams=hparams, exp_conf=exp_conf) as context:
        layer = ydet.data_layer(context, steps_completed=steps_completed)
        dataset = layer.cache_train_dataset("digits", "v1", shuffle=True)(records)()
        kwargs: dict[str, Any] = {"num_workers": workers}
        if workers:
            kwargs["multiprocessing_context"] = "spawn"
        loader = ydet.repeat_epochs(DataLoader(dataset, batch_size=context.get_per_slot_batch_size(), **kwargs))
        out = []
        for batch in loader:
            out.append([int(i) for i in batch["i"]])
            if len(out) == take:
                break
        return len(loader), out


def test_each_pass_reads_the_next_epoch(tmp_path: Path) -> None:
    length, batches = trial_batches(tmp_path, 0, 21)
    assert length == 7
    assert batches == epoch_batches(5, 3)
    epochs = [sum(batches[e * 7 : (e + 1) * 7], []) for e in range(3)]
    assert all(sorted(epoch) == list(range(N)) for epoch in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


@pytest.mark.parametrize("steps", [3, 7, 9, 13])
def test_a_resumed_trial_skips_whole_batches_and_goes_on_with_whole_epochs(tmp_path: Path, steps: int) -> None:
    # Resumed at 9 batches: epoch 1, batch 2 -- records 32.. of epoch 1, not 9 x 16 = 144 - 100 =
    # 44 (the last batch of epoch 0 held 4 records, not 16).
    length, batches = trial_batches(tmp_path, steps, 21 - steps)
    assert length == 7  # one whole epoch, wherever the trial resumed (Determined's epoch length)
    assert batches == epoch_batches(5, 3)[steps:]


@pytest.mark.slow
def test_workers_read_the_next_epoch_too(tmp_path: Path) -> None:
    length, batches = trial_batches(tmp_path, 9, 12, workers=2)
    assert length == 7
    assert batches == epoch_batches(5, 3)[9:]


def test_persistent_workers_are_refused_with_the_reason(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    from yogacache.store.local import CacheStore
    from yogacache.torch import CacheIterableDataset

    store = CacheStore(tmp_path / "c", show_progress=False)
    store.build("ds", "v1", records())
    dataset = CacheIterableDataset(store.location("ds", "v1"))
    loader = DataLoader(dataset, batch_size=4, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="persistent_workers"):
        ydet.repeat_epochs(loader)


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

        def build_training_data_loader(self):
            @self.data.cache_train_dataset("digits", "v1", shuffle=True)
            def make():
                return [{"i": np.int64(i), "x": np.full(2, i, np.float32)} for i in range(100)]
            loader = DataLoader(make(), batch_size=self.context.get_per_slot_batch_size())
            return yogacache.determined.repeat_epochs(loader)

        def build_validation_data_loader(self):
            @self.data.cache_validation_dataset("digits", "v1")
            def make():
                return [{"i": np.int64(i), "x": np.full(2, i, np.float32)} for i in range(20)]
            return DataLoader(make(), batch_size=self.context.get_per_slot_batch_size())

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
def test_determined_trainer_fits_two_different_epochs(tmp_path: Path) -> None:
    """Determined's own ``pytorch.Trainer.fit(Epoch(2))``: two epochs of 7 batches, each a
    permutation of the records, the second reshuffled."""
    script = tmp_path / "trial.py"
    script.write_text(TRIAL)
    work = tmp_path / "work"  # Determined copies the working directory into its checkpoints
    work.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "caches")],
        capture_output=True, text=True, timeout=600, cwd=work,
        env={**os.environ, "PYTHONPATH": str(REPO), "XDG_DATA_HOME": str(tmp_path / "checkpoints")},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = json.loads(result.stdout.split("SEEN ", 1)[1].splitlines()[0])
    assert seen == epoch_batches(5, 2), "Epoch(2) trains epoch 0, then epoch 1 reshuffled"
