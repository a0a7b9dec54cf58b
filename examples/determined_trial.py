"""A Determined PyTorchTrial whose data comes from yogacache's data layer.

Determined 0.19.10 removed ``context.experimental.cache_train_dataset``; trial code gets it back
from ``yogacache.determined.data_layer(context)``, with the same rank, seed and resume offset, and
the storage of the experiment config's ``data_layer`` section. On a cluster, the experiment config
(``const.yaml``) would read::

    name: synthetic-blobs
    entrypoint: python3 determined_trial.py
    hyperparameters:
      global_batch_size: 32
      lr: 0.5
    data_layer:
      type: shared_fs
      host_storage_path: /mnt/nfs/yogacache
      container_storage_path: /yogacache
    bind_mounts:                      # Determined >= 0.19.10 no longer mounts data_layer paths
      - host_path: /mnt/nfs/yogacache
        container_path: /yogacache
    searcher:
      name: single
      metric: validation_loss

Off-cluster (``python examples/determined_trial.py --storage /tmp/caches``) the same trial runs
under ``det.pytorch.init()`` with that config passed in: the first run builds the caches, every
later run reads them.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import numpy as np
import torch
from determined import pytorch
from torch.utils.data import DataLoader

import yogacache.determined

BUILDS = {"train": 0, "validation": 0}


def synthetic_blobs(records: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Two Gaussian blobs in 4 dimensions, labelled 0 and 1: small, and learnable."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, records)
    centers = np.where(labels[:, None] == 1, 1.5, -1.5).astype(np.float32)
    points = centers + rng.normal(size=(records, 4)).astype(np.float32)
    return [{"x": point, "y": np.int64(label)} for point, label in zip(points, labels)]


class BlobsTrial(pytorch.PyTorchTrial):
    def __init__(self, context: pytorch.PyTorchTrialContext) -> None:
        self.context = context
        # Was: context.experimental (removed in Determined 0.19.10).
        self.data = yogacache.determined.data_layer(context)
        # The cache shards, shuffles and resumes the data itself (Determined checks that a
        # non-Determined DataLoader was meant).
        context.experimental.disable_dataset_reproducibility_checks()
        self.model = context.wrap_model(torch.nn.Linear(4, 2))
        self.optimizer = context.wrap_optimizer(
            torch.optim.SGD(self.model.parameters(), lr=float(context.get_hparam("lr")))
        )

    def build_training_data_loader(self) -> Any:
        @self.data.cache_train_dataset("synthetic-blobs", "v1", shuffle=True)
        def make_dataset() -> list[dict[str, np.ndarray]]:
            BUILDS["train"] += 1
            return synthetic_blobs(2048, seed=0)

        loader = DataLoader(make_dataset(), batch_size=self.context.get_per_slot_batch_size())
        return yogacache.determined.repeat_epochs(loader)

    def build_validation_data_loader(self) -> Any:
        @self.data.cache_validation_dataset("synthetic-blobs", "v1")
        def make_dataset() -> list[dict[str, np.ndarray]]:
            BUILDS["validation"] += 1
            return synthetic_blobs(512, seed=1)

        return DataLoader(make_dataset(), batch_size=self.context.get_per_slot_batch_size())

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> dict[str, Any]:
        loss = torch.nn.functional.cross_entropy(self.model(batch["x"]), batch["y"])
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss}

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        logits = self.model(batch["x"])
        accuracy = (logits.argmax(dim=1) == batch["y"]).float().mean()
        return {"validation_loss": torch.nn.functional.cross_entropy(logits, batch["y"]), "accuracy": accuracy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", required=True, help="container_storage_path of a shared_fs data_layer")
    parser.add_argument("--batches", type=int, default=200, help="batches to train (64 make one epoch)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    hparams = {"global_batch_size": 32, "lr": 0.5}
    exp_conf = {
        "hyperparameters": hparams,
        "data_layer": {"type": "shared_fs", "host_storage_path": None, "container_storage_path": args.storage},
        "reproducibility": {"experiment_seed": 42},
    }
    with pytorch.init(hparams=hparams, exp_conf=exp_conf, enable_tensorboard_logging=False) as context:
        trial = BlobsTrial(context)
        print(f"data layer: {trial.data!r}")
        trainer = pytorch.Trainer(trial, context)
        trainer.fit(
            max_length=pytorch.Batch(args.batches),
            validation_period=pytorch.Batch(args.batches),
            checkpoint_policy="none",
        )
        model = trial.model.eval()
        with torch.no_grad():
            batches = list(trial.build_validation_data_loader())
            correct = sum(int((model(b["x"]).argmax(dim=1) == b["y"]).sum()) for b in batches)
            total = sum(len(b["y"]) for b in batches)
    print(f"caches built this run: train {BUILDS['train']}, validation {BUILDS['validation']}")
    print(f"trained {args.batches} batches; validation accuracy {correct / total:.3f} on {total} records")


if __name__ == "__main__":
    main()
