"""PyTorch: cache a map-style torch dataset, read it globally shuffled, stop, resume on more ranks.

Run: ``python examples/torch_elastic_resume.py [CACHE_DIR]``. The ranks are simulated in one
process (rank and num_shards passed explicitly; under torchrun they come from the launcher).
"""

from __future__ import annotations

import sys
import tempfile

import torch
from torch.utils.data import Dataset

import yogacache
from yogacache.torch import CacheDataLoader

RECORDS = 1000


class Squares(Dataset):  # type: ignore[type-arg]
    """Any map-style dataset: dicts (or tuples) of tensors, numbers, strings and bytes."""

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"id": i, "square": torch.tensor([i * i], dtype=torch.int64), "name": f"item-{i}"}


def loader_for(root: str, rank: int, num_shards: int, resume_state: object = None) -> CacheDataLoader:
    layer = yogacache.DataLayer(
        {"type": "shared_fs", "host_storage_path": root},
        rank=rank, num_shards=num_shards, seed=7, resume_state=resume_state, show_progress=False,
    )
    make = layer.cache_train_dataset("squares", "v1", shuffle=True, shuffle_mode="global", returns="torch")(Squares)
    return CacheDataLoader(make(), batch_size=50, num_workers=2)


def main(root: str) -> None:
    seen: list[int] = []
    # Two ranks train 4 steps of 50 records each, then the job stops.
    for rank in range(2):
        loader = loader_for(root, rank, 2)
        for step, batch in enumerate(loader):
            assert torch.equal(batch["square"][:, 0], batch["id"] ** 2)
            seen.extend(batch["id"].tolist())
            if step == 3:
                state = loader.state_dict()  # the same on both ranks
                break
    print(f"stopped with 2 ranks after {len(seen)} records; resume state: {state}")

    # The job comes back on 3 ranks: the rest of the epoch, each record once.
    for rank in range(3):
        for batch in loader_for(root, rank, 3, resume_state=state):
            seen.extend(batch["id"].tolist())
    duplicates = len(seen) - len(set(seen))
    print(f"resumed with 3 ranks: {len(seen)} records read in epoch 0, {duplicates} twice, "
          f"{RECORDS - len(set(seen))} never")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="yogacache-torch-"))
