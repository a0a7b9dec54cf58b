"""Mixtures through DataLayer and config files: ``DataLayer.mixture`` (cache ids, decorated
builders, a ``mixture:`` section), ``train_mixture`` / ``validation_mixture`` for each ``returns``
with the layer's seed, rank, offset and resume state, and ``load_mixture`` of a YAML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yogacache import Component, DataLayer, Mixture
from yogacache.config import load_config_file
from yogacache.errors import CacheNotFoundError, ConfigError
from yogacache.mixture import load_mixture

SIZES = {"web": 60, "code": 24}
BASES = {"web": 0, "code": 1000}


def _records(name: str) -> list[dict[str, Any]]:
    return [{"x": np.int64(BASES[name] + i)} for i in range(SIZES[name])]


@pytest.fixture
def config(tmp_path: Path) -> dict[str, Any]:
    config = {"type": "shared_fs", "host_storage_path": str(tmp_path / "store")}
    layer = DataLayer(config, show_progress=False)
    for name in SIZES:
        layer.dataref(name, "v1", lambda name=name: _records(name))
    return config


def _labels(stream: Any) -> list[int]:
    return [int(element["x"]) for element in stream]


def test_cache_ids_builders_and_sections_make_the_same_mixture(config: dict[str, Any]) -> None:
    layer = DataLayer(config, show_progress=False)
    built = []

    @layer.cache_dataset("code", "v1")
    def code() -> Any:
        built.append(1)  # already cached: never called
        return _records("code")

    by_ids = layer.mixture([("web", "v1"), ("code", "v1")], weights=[3, 1])
    by_builder = layer.mixture([Component(("web", "v1"), weight=3), Component(code, weight=1)])
    by_section = layer.mixture(
        {
            "components": [
                {"dataset_id": "web", "dataset_version": "v1", "weight": 3},
                {"dataset_id": "code", "dataset_version": "v1", "weight": 1},
            ]
        }
    )
    assert not built
    assert by_ids.counts == by_builder.counts == by_section.counts == (63, 21)
    orders = [_labels(m.stream(shuffle=True, shuffle_seed=2)) for m in (by_ids, by_builder, by_section)]
    assert orders[0] == orders[1] == orders[2]
    assert sum(label >= 1000 for label in orders[0]) == 21


def test_a_cache_that_does_not_exist_is_named(config: dict[str, Any]) -> None:
    layer = DataLayer(config, show_progress=False)
    with pytest.raises(CacheNotFoundError, match="'books'.*'v1'"):
        layer.mixture([("web", "v1"), ("books", "v1")])


@pytest.mark.parametrize("returns", ["stream", "torch", "tf"])
def test_train_mixture_reads_this_ranks_share_from_the_layers_resume_state(
    config: dict[str, Any], returns: str
) -> None:
    whole = []
    for rank in range(2):
        layer = DataLayer(config, show_progress=False, seed=4, rank=rank, num_shards=2)
        whole.append(
            _labels(layer.train_mixture(layer.mixture([("web", "v1"), ("code", "v1")]), shuffle=True, returns="stream"))
        )
    assert sorted(whole[0] + whole[1]) == sorted(range(60)) + sorted(range(1000, 1024))

    # A state after 10 records of each of two ranks, resumed by one rank: the rest, once.
    layer = DataLayer(config, show_progress=False, seed=4, rank=0, num_shards=2)
    stream = layer.train_mixture(layer.mixture([("web", "v1"), ("code", "v1")]), shuffle=True, returns="stream")
    state = stream.state_dict(10)
    assert state["mode"] == "mixture" and state["consumed"] == 20
    resumed = DataLayer(config, show_progress=False, seed=4, rank=0, num_shards=1, resume_state=state)
    read = resumed.train_mixture(resumed.mixture([("web", "v1"), ("code", "v1")]), shuffle=True, returns=returns)
    if returns == "tf":
        labels = [int(x) for x in read.map(lambda element: element["x"]).as_numpy_iterator()]
    elif returns == "torch":
        labels = [int(element["x"]) for element in read]
    else:
        labels = _labels(read)
    assert sorted(labels) == sorted(whole[0][10:] + whole[1][10:])

    # offset= counts this rank's records, as for one cache.
    offset = DataLayer(config, show_progress=False, seed=4, rank=1, num_shards=2, offset=5)
    assert (
        _labels(offset.train_mixture(offset.mixture([("web", "v1"), ("code", "v1")]), shuffle=True, returns="stream"))
        == whole[1][5:]
    )


def test_validation_mixture_reads_the_same_records_every_time(config: dict[str, Any]) -> None:
    layer = DataLayer(config, show_progress=False)
    mixture = layer.mixture([("web", "v1"), ("code", "v1")], weights=[1, 1], epoch_size=30)  # both downsampled
    stream = layer.validation_mixture(mixture, returns="stream")
    first, second = _labels(stream), _labels(stream)
    assert first == second and len(first) == 30
    training = layer.train_mixture(mixture, returns="stream")
    assert _labels(training) != _labels(training)  # training rotates through the records


def test_load_mixture_reads_a_yaml_file_with_its_data_layer(config: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "experiment.yaml"
    path.write_text(
        f"""data_layer:
  type: shared_fs
  host_storage_path: {config["host_storage_path"]}
mixture:
  epoch_size: 40
  components:
    - {{dataset_id: web, dataset_version: v1, weight: 0.75}}
    - {{dataset_id: code, dataset_version: v1, weight: 0.25}}
"""
    )
    mixture = load_mixture(path)
    assert isinstance(mixture, Mixture) and mixture.counts == (30, 10) and len(mixture) == 40
    assert load_config_file(path).storage_path == Path(config["host_storage_path"])  # type: ignore[union-attr]

    bare = tmp_path / "bare.yaml"  # a bare data_layer beside the mixture section
    bare.write_text(f"type: shared_fs\nhost_storage_path: {config['host_storage_path']}\nmixture: {{}}\n")
    assert load_config_file(bare).storage_path == Path(config["host_storage_path"])  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "section, message",
    [
        ({"components": []}, "non-empty list"),
        ({"components": [{"dataset_id": "web"}]}, r"components\[0\] needs dataset_id and dataset_version"),
        ({"components": [{"dataset_id": "web", "dataset_version": "v1", "wieght": 1}]}, "unknown mixture.components"),
        (
            {"components": [{"dataset_id": "web", "dataset_version": "v1", "weight": -1}]},
            "weight must be a finite number",
        ),
        (
            {"components": [{"dataset_id": "web", "dataset_version": "v1"}], "stopping": "never"},
            "stopping must be one of",
        ),
        ({"components": [{"dataset_id": "web", "dataset_version": "v1"}], "epochs": 3}, "unknown mixture keys"),
    ],
)
def test_a_bad_section_is_one_line_naming_the_key(
    config: dict[str, Any], section: dict[str, Any], message: str
) -> None:
    layer = DataLayer(config, show_progress=False)
    with pytest.raises(ConfigError, match=message) as caught:
        layer.mixture(section)
    assert "\n" not in str(caught.value)
    assert len(layer.mixture([("web", "v1")])) == 60  # nothing lost
