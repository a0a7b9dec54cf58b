"""Train a tiny JAX model (flax + optax, on CPU) from a yogacache cache read through Grain.

    pip install 'yogacache[grain]' flax optax
    python examples/jax_grain_train.py [--storage DIR] [--steps 150]

The first run builds the cache (2,048 records: 8x8 float features and a label from a fixed linear
rule); every later run reads it back. Grain reads the cache through ``yogacache.grain``: the data
source gives numpy records, ``CacheSampler`` shuffles in yogacache's global order (one shard per
JAX process), and ``grain.DataLoader`` batches them in 2 worker processes. Halfway, the loader's
checkpoint (``get_state``) is saved and a new loader resumes from it exactly.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import numpy as np

RECORDS = 2048
FEATURES = 64
CLASSES = 4
BATCH = 64


def make_records() -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
    features = rng.normal(size=(RECORDS, 8, 8)).astype(np.float32)
    labels = (features.reshape(RECORDS, FEATURES) @ weights).argmax(axis=1)
    return [{"features": features[i], "label": np.int64(labels[i])} for i in range(RECORDS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", help="cache directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()

    import grain
    import jax
    import jax.numpy as jnp
    import optax
    from absl import flags
    from flax import nnx

    import yogacache
    from yogacache.grain import CacheSampler, open_data_source

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read its flags; absl.app.run would parse them
    storage = args.storage or tempfile.mkdtemp(prefix="yogacache-jax-")
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": storage}, show_progress=False)
    built = []

    @layer.cache_dataset("jax-example", "v1")
    def make() -> list[dict[str, np.ndarray]]:
        built.append(True)
        return make_records()

    make()  # builds the cache on the first run, a hit afterwards
    print(f"cache: {'built' if built else 'hit'} ({RECORDS} records in {storage})")
    source = open_data_source("jax-example", "v1", layer)

    def loader() -> grain.DataLoader:
        sampler = CacheSampler(
            source,
            shuffle=True,
            shuffle_seed=0,
            shuffle_mode="global",
            num_epochs=None,
            shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
        )
        return grain.DataLoader(
            data_source=source,
            sampler=sampler,
            operations=[grain.transforms.Batch(BATCH, drop_remainder=True)],
            worker_count=2,
        )

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.hidden = nnx.Linear(FEATURES, 32, rngs=rngs)
            self.out = nnx.Linear(32, CLASSES, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.out(nnx.relu(self.hidden(x.reshape(x.shape[0], -1))))

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model: MLP, optimizer: nnx.Optimizer, features: jax.Array, labels: jax.Array) -> jax.Array:
        def loss_fn(model: MLP) -> jax.Array:
            logits = model(features)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    iterator = iter(loader())
    losses = []
    for step in range(args.steps):
        if step == args.steps // 2:  # a checkpoint of the input pipeline, resumed by a new loader
            state = iterator.get_state()
            iterator = iter(loader())
            iterator.set_state(state)
        batch = next(iterator)
        losses.append(float(train_step(model, optimizer, jnp.asarray(batch["features"]), jnp.asarray(batch["label"]))))
        if step % 50 == 0:
            print(f"step {step:4d}  loss {losses[-1]:.3f}")
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    print(f"trained a flax MLP for {args.steps} steps on {jax.default_backend()}: loss {first:.3f} -> {last:.3f}")


if __name__ == "__main__":
    main()
