"""Real multi-worker training on 127.0.0.1, two processes each, on a cache built by the workers.

- A Keras model under ``tf.distribute.MultiWorkerMirroredStrategy`` (TF_CONFIG on loopback
  ports), the dataset coming from ``strategy.distribute_datasets_from_function``: DataLayer takes
  each worker's shard from the ``InputContext``. The model trains in a custom loop
  (``strategy.run``): Keras 3.15's ``fit`` fails under this strategy before reading any data
  (``_maybe_symbolic_build`` reduces a nested per-replica batch), whatever the dataset.
- PyTorch DDP under ``torchrun`` (gloo), reading ``CacheIterableDataset`` in global shuffle mode
  through a DataLoader with two workers: DataLayer takes the rank from torch.distributed.

Each worker records the ids of the records it trained on; the test asserts that the two ranks
read disjoint records whose union is the whole dataset minus the dropped remainder.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from yogacache.read.permutation import KeyedPermutation

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 150


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def clean_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TF_CONFIG")}
    env["PYTHONPATH"] = str(REPO)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def finish(processes: list[subprocess.Popen[str]]) -> list[str]:
    outputs = []
    try:
        for process in processes:
            out, _ = process.communicate(timeout=TIMEOUT)
            outputs.append(out)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, out in zip(processes, outputs):
        assert process.returncode == 0, out[-4000:]
    return outputs


KERAS_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    import keras
    import yogacache

    root, out, n, global_batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": root}, seed=7, show_progress=False)

    @layer.cache_train_dataset("mwms", "v1", shuffle=True)
    def make(input_context):
        i = np.arange(n, dtype=np.int64)
        x = (i[:, None] % 10 * np.ones((1, 4)) / 10).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices({"i": i, "x": x, "y": (i % 2).astype(np.float32)})

    def dataset_fn(input_context):
        return make(input_context).batch(input_context.get_per_replica_batch_size(global_batch))

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def train_step(batch):
        def replica_step(batch):
            with tf.GradientTape() as tape:
                per_example = tf.square(model(batch["x"], training=True)[:, 0] - batch["y"])
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return batch["i"], loss

        ids, loss = strategy.run(replica_step, args=(batch,))
        return ids, strategy.reduce("SUM", loss, axis=None)

    seen, losses = [], []
    for batch in dataset:  # one epoch
        ids, loss = train_step(batch)
        for local in strategy.experimental_local_results(ids):
            seen.extend(local.numpy().tolist())
        losses.append(float(loss))
    weights = [w.numpy().tolist() for w in model.trainable_variables]
    with open(out, "w") as f:
        json.dump({"seen": seen, "losses": losses, "weights": weights, "rank": layer.rank}, f)
    """
)


def test_keras_multi_worker_mirrored_strategy_two_workers(tmp_path: Path) -> None:
    n, global_batch = 513, 32  # 513 % 2 == 1: one record dropped
    script = tmp_path / "keras_worker.py"
    script.write_text(KERAS_WORKER)
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    for index in range(2):
        env = clean_environment()
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        processes.append(
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / "cache"), str(tmp_path / f"keras-{index}.json")]
                + [str(n), str(global_batch)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    finish(processes)
    results = [json.loads((tmp_path / f"keras-{index}.json").read_text()) for index in range(2)]
    seen = [set(result["seen"]) for result in results]
    assert [len(result["seen"]) for result in results] == [256, 256]  # nothing read twice
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(512))  # YogaDL drops the last record
    # The shards came from the InputContext: DataLayer itself was built without a rank.
    assert [result["rank"] for result in results] == [0, 0]
    assert [len(result["losses"]) for result in results] == [16, 16]  # 256 records per worker, 16 per step
    assert results[0]["losses"] == results[1]["losses"]  # one global loss per step, all-reduced
    assert results[0]["weights"] == results[1]["weights"]  # the mirrored model stayed in sync
    # Shard mode: rank r reads the strided shard r, 2 + r, ...
    assert seen[0] == set(range(0, 512, 2)) and seen[1] == set(range(1, 512, 2))


TORCH_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import yogacache
    from yogacache.torch import CacheDataLoader

    def main():
        root, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
        dist.init_process_group("gloo")
        layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": root}, seed=11, show_progress=False)

        @layer.cache_train_dataset("ddp", "v1", shuffle=True, shuffle_mode="global", returns="torch")
        def make():
            return [
                {"i": np.int64(i), "x": np.full(4, i % 10, np.float32) / 10, "y": np.float32(i % 2)}
                for i in range(n)
            ]

        dataset = make()
        loader = CacheDataLoader(dataset, batch_size=16, num_workers=2)
        model = DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        seen = {}
        for epoch in range(2):
            dataset.set_epoch(epoch)
            ids = []
            for batch in loader:
                ids.extend(batch["i"].tolist())
                loss = ((model(batch["x"]).squeeze(1) - batch["y"]) ** 2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            seen[epoch] = ids
        result = {
            "rank": layer.rank, "world": layer.num_shards, "source": layer.rank_source, "seen": seen,
            "state": loader.state_dict(), "weight": model.module.weight.detach().tolist(),
        }
        with open(out % dist.get_rank(), "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def test_torch_distributed_gloo_two_ranks(tmp_path: Path) -> None:
    n = 203  # 203 % 2 == 1: one record dropped per epoch, a different one each epoch
    script = tmp_path / "torch_worker.py"
    script.write_text(TORCH_WORKER)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(script), str(tmp_path / "cache"), str(tmp_path / "torch-%d.json"), str(n),
    ]
    process = subprocess.Popen(
        command, env=clean_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    finish([process])
    results = [json.loads((tmp_path / f"torch-{rank}.json").read_text()) for rank in range(2)]
    assert [(r["rank"], r["world"], r["source"]) for r in results] == [
        (0, 2, "torch.distributed"),
        (1, 2, "torch.distributed"),
    ]
    for epoch in ("0", "1"):
        per_rank = [r["seen"][epoch] for r in results]
        assert [len(ids) for ids in per_rank] == [101, 101]
        assert not set(per_rank[0]) & set(per_rank[1])
        dropped = int(KeyedPermutation(n, 11, int(epoch)).map([n - 1])[0])  # the last position
        assert set(per_rank[0]) | set(per_rank[1]) == set(range(n)) - {dropped}
    assert set(results[0]["seen"]["0"]) != set(results[0]["seen"]["1"])  # a fresh split every epoch
    assert results[0]["weight"] == results[1]["weight"]  # DDP kept the replicas in step
    assert results[0]["state"] == results[1]["state"] == {
        "version": 1, "mode": "global", "epoch": 2, "consumed": 0, "seed": 11, "num_records": n,
        "build": results[0]["state"]["build"], "shuffle": True, "reshuffle_each_epoch": True,
    }


@pytest.fixture(autouse=True)
def _no_launcher_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
