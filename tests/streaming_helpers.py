"""Shared pieces of the streaming tests: a multi-part published cache, node configs behind a
byte-counting fault proxy, node subprocesses, and a sampler of a node's local bytes."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from tests.cloud_helpers import Cloud, python_env, start_python
from yogacache.format.manifest import Manifest
from yogacache.store.remote import RemoteCacheStore

DS, VER = "stream", "v1"
RECORDS = 480
PART_BYTES = 160 << 10  # about a dozen parts of ~40 records


def data(n: int = RECORDS, fill: int = 0) -> list[tuple[np.ndarray, int]]:
    """Record i: (int32[1024] filled with i + fill, i + fill): 4 KiB each."""
    return [(np.full(1024, i + fill, np.int32), i + fill) for i in range(n)]


def publish(cloud: Cloud, bucket: str, prefix: str, root: Path, fill: int = 0) -> Manifest:
    """Builds and publishes the multi-part test cache (values offset by ``fill``)."""
    builder = RemoteCacheStore(cloud.store(bucket, prefix), root, part_size_bytes=PART_BYTES, show_progress=False)
    return builder.get_or_build(DS, VER, lambda: data(fill=fill)).manifest


def node_config(cloud: Cloud, bucket: str, prefix: str, node: Path, proxy_url: str, **extra: Any) -> dict[str, Any]:
    """A data_layer config of one node (its own local cache directory) reaching the server
    through the proxy at ``proxy_url``."""
    config = cloud.config(
        bucket, prefix, local_cache_host_path=str(node), local_cache_container_path=str(node), **extra
    )
    return cloud.through(config, proxy_url)


def node_env(cloud: Cloud, proxy_url: str) -> dict[str, str]:
    return python_env(**({"STORAGE_EMULATOR_HOST": proxy_url} if cloud.kind == "gcs" else {}))


# A node process: opens the cache through its config and reads epochs of one rank; prints the
# labels of each epoch. argv: config, rank, num_shards, epochs, shuffle mode, resume state|"",
# records to read before stopping (0: whole epochs).
READER = r"""
import json, sys
import yogacache
from yogacache.store import open_store
from yogacache.read.options import ReadOptions
from yogacache.read.pipeline import read_stream

config, rank, shards, epochs, mode, resume, stop_after = sys.argv[1:8]
store = open_store(json.loads(config), show_progress=False)
reader = store.open("stream", "v1")
options = ReadOptions(
    shuffle=mode != "shard", shuffle_seed=5, reshuffle_each_epoch=mode != "shard", shard_rank=int(rank),
    num_shards=int(shards), shuffle_mode=mode, resume_state=json.loads(resume) if resume else None,
)
stream = read_stream(reader, options)
out, read = [], 0
for _ in range(int(epochs)):
    labels = []
    for element in stream:
        labels.append(int(element[1]))
        read += 1
        if int(stop_after) and read >= int(stop_after):
            break
    out.append(labels)
    if int(stop_after) and read >= int(stop_after):
        break
state = stream.state_dict(read) if int(stop_after) else None
print(json.dumps({"epochs": out, "state": state, "streamed": ".parts" in str(reader.directory)}))
"""


def start_reader(
    cloud: Cloud,
    config: dict[str, Any],
    proxy_url: str,
    *,
    rank: int = 0,
    shards: int = 1,
    epochs: int = 1,
    mode: str = "shard",
    resume: Optional[dict[str, Any]] = None,
    stop_after: int = 0,
) -> Any:
    args = [json.dumps(config), str(rank), str(shards), str(epochs), mode, json.dumps(resume) if resume else ""]
    return start_python(READER, *args, str(stop_after), env=node_env(cloud, proxy_url))


def parts_dir(node: Path) -> Path:
    return node / "yogadl_local_cache" / ".parts" / DS / VER


def bytes_on_disk(directory: Path) -> int:
    """The bytes of the files in ``directory`` (lock files aside), each file once.

    Each file counts once by its inode, not once per name: the names are listed first and
    stat'ed one by one, so a file renamed over another between two stats (boto3 downloads into
    ``<reservation>.<8 hex>`` and renames that onto the reservation) would otherwise be counted
    under both names, one part more than the node ever held."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    sizes: dict[tuple[int, int], int] = {}
    for entry in entries:
        if entry.name.endswith(".lock"):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        sizes[(st.st_dev, st.st_ino)] = st.st_size
    return sum(sizes.values())


class UsageSampler:
    """Samples the bytes of a node's streamed parts (temporary files included) while it runs:
    every cache's, or those of the directories given (``dirs``), together."""

    def __init__(self, node: Path, dirs: Optional[Sequence[Path]] = None, interval: float = 0.01) -> None:
        self.node = node
        self.dirs = [parts_dir(node)] if dirs is None else list(dirs)
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(bytes_on_disk(d) for d in self.dirs))
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> UsageSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
