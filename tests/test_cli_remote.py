"""The ``yogacache`` command on remote storages: ls (where each cache lives, whether the local copy
is current), pull, push, rm (--remote / local / both) and transfer progress.

Commands run as real processes (``python -m yogacache``) against moto's S3 server, and for the
``gs://`` form against fake-gcs-server; credentials and endpoints come from the environment the
server fixtures set, plus ``--endpoint-url`` for S3.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, python_env, reader_keys
from yogacache.format.manifest import MANIFEST_NAME, Manifest
from yogacache.store.remote import LEASE_NAME, LOCAL_CACHE_DIR, RemoteCacheStore

PREFIX = "caches"


def run_cli(
    *args: str, stdin: Optional[str] = None, env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=python_env(**(env or {})),
        timeout=120,
    )


class Remote:
    """A bucket with caches, a publishing node (node-a) and the node the CLI runs on (node-b)."""

    def __init__(self, cloud: Cloud, tmp_path: Path) -> None:
        self.cloud = cloud
        self.bucket = cloud.new_bucket()
        self.tmp_path = tmp_path
        self.local_b = tmp_path / "node-b"
        self.url = cloud.url(self.bucket, PREFIX)

    def node(self, name: str) -> RemoteCacheStore:
        return RemoteCacheStore(
            self.cloud.store(self.bucket, PREFIX), self.tmp_path / name, poll_seconds=0.1, show_progress=False
        )

    def args(self) -> list[str]:
        return ["--storage", self.url, "--local-cache", str(self.local_b), *self.cloud.cli_args()]

    def cli(self, command: str, *args: str, stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
        return run_cli(command, *self.args(), *args, stdin=stdin)

    def keys(self, under: str = "") -> list[str]:
        return [k for k in self.cloud.raw_keys(self.bucket) if k.startswith(f"{PREFIX}/{under}")]

    def local_dir(self, dataset_id: str, version: str) -> Path:
        return self.local_b / LOCAL_CACHE_DIR / dataset_id / version


@pytest.fixture
def s3_remote(s3_server: Any, tmp_path: Path) -> Remote:
    return Remote(Cloud("s3", s3_server), tmp_path)


@pytest.fixture(params=["s3", "gcs", "azure"])
def any_remote(request: pytest.FixtureRequest, tmp_path: Path) -> Remote:
    kind = request.param
    return Remote(Cloud(kind, request.getfixturevalue(f"{kind}_server")), tmp_path)


def ls_json(remote: Remote) -> dict[tuple[str, str], dict[str, Any]]:
    result = remote.cli("ls", "--json")
    assert result.returncode == 0, result.stderr
    return {(row["dataset_id"], row["dataset_version"]): row for row in json.loads(result.stdout)}


# -- ls ------------------------------------------------------------------------------------------
def test_ls_shows_where_each_cache_lives_and_whether_the_copy_is_current(any_remote: Remote) -> None:
    remote = any_remote
    node_a, node_b = remote.node("node-a"), remote.node("node-b")
    node_a.build("mnist", "v1", dataset(300))
    node_a.build("cifar", "v1", dataset(50))
    node_a.build("stale", "v1", dataset(20))
    node_b.open("mnist", "v1")  # current local copy
    node_b.open("stale", "v1")  # becomes stale below
    node_a.remove("stale", "v1", remote=True, local=False)
    node_a.build("stale", "v1", dataset(20, 1))
    node_b.local.build("localonly", "v1", dataset(7))  # never published

    rows = ls_json(remote)
    assert set(rows) == {("mnist", "v1"), ("cifar", "v1"), ("stale", "v1"), ("localonly", "v1")}

    mnist = rows[("mnist", "v1")]
    assert mnist["where"] == "remote+local" and mnist["local_current"] is True
    assert mnist["records"] == 300
    assert mnist["remote_url"].rstrip("/") == f"{remote.url}/mnist/v1"
    assert mnist["local_path"] == str(remote.local_dir("mnist", "v1"))

    cifar = rows[("cifar", "v1")]
    assert cifar["where"] == "remote" and cifar["local_current"] is False
    assert cifar["local_path"] is None and cifar["records"] == 50

    stale = rows[("stale", "v1")]
    assert stale["where"] == "remote+local" and stale["local_current"] is False

    local_only = rows[("localonly", "v1")]
    assert local_only["where"] == "local" and local_only["remote_url"] is None
    assert local_only["local_current"] is False and local_only["records"] == 7

    table = remote.cli("ls")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    header = lines[0].split()
    assert header[:4] == ["DATASET", "VERSION", "RECORDS", "DISK"]
    assert "WHERE" in header and "LOCAL" in header

    def row(dataset_id: str) -> list[str]:
        (line,) = [ln for ln in lines[1:] if ln.split()[0] == dataset_id]
        return line.split()

    assert row("mnist")[-2:] == ["remote+local", "current"]
    assert row("cifar")[-2:] == ["remote", "none"]
    assert row("stale")[-2:] == ["remote+local", "stale"]
    assert row("localonly")[-3:] == ["local", "only", "local"]
    assert row("mnist")[2] == "300"


def test_ls_of_empty_remote_says_so(s3_remote: Remote) -> None:
    result = s3_remote.cli("ls")
    assert result.returncode == 0, result.stderr
    assert "no caches" in result.stdout and s3_remote.url in result.stdout
    assert json.loads(s3_remote.cli("ls", "--json").stdout) == []


def test_ls_through_a_config_file_and_the_environment(s3_remote: Remote, tmp_path: Path) -> None:
    remote = s3_remote
    remote.node("node-a").build("mnist", "v1", dataset(30))
    server = remote.cloud.server
    config = tmp_path / "data_layer.json"
    config.write_text(
        json.dumps(
            {
                "data_layer": {
                    "type": "s3",
                    "bucket": remote.bucket,
                    "bucket_directory_path": PREFIX,
                    "endpoint_url": server.endpoint_url,
                    "local_cache_host_path": str(tmp_path / "host"),
                    "local_cache_container_path": str(tmp_path / "container"),
                }
            }
        )
    )
    result = run_cli("ls", "--json", "--storage", str(config))
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert (row["dataset_id"], row["where"]) == ("mnist", "remote")

    result = run_cli(
        "ls", "--json", "--endpoint-url", server.endpoint_url, env={"YOGACACHE_STORAGE": remote.url}
    )
    assert result.returncode == 0, result.stderr
    assert [r["dataset_id"] for r in json.loads(result.stdout)] == ["mnist"]


# -- pull ----------------------------------------------------------------------------------------
def test_pull_prefetches_the_local_copy(any_remote: Remote) -> None:
    remote = any_remote
    published = remote.node("node-a").build("mnist", "v1", dataset(300))
    result = remote.cli("pull", "mnist", "v1")
    assert result.returncode == 0, result.stderr
    local = remote.local_dir("mnist", "v1")
    assert str(local) in result.stdout
    assert Manifest.load(local).freshness == published.freshness
    assert reader_keys(remote.node("node-b").local.open("mnist", "v1")) == expected_keys(300)
    assert ls_json(remote)[("mnist", "v1")]["local_current"] is True

    # Pulling a current copy again changes nothing on disk.
    inode = (local / published.parts[0].name).stat().st_ino
    again = remote.cli("pull", "mnist", "v1")
    assert again.returncode == 0, again.stderr
    assert (local / published.parts[0].name).stat().st_ino == inode


def test_pull_of_a_missing_cache_fails_cleanly(s3_remote: Remote) -> None:
    result = s3_remote.cli("pull", "nothing", "v1")
    assert result.returncode == 1
    assert "yogacache: error:" in result.stderr and "nothing" in result.stderr
    assert "Traceback" not in result.stderr
    assert not s3_remote.local_dir("nothing", "v1").exists()


# -- push ----------------------------------------------------------------------------------------
def test_push_publishes_a_local_cache(s3_remote: Remote) -> None:
    remote = s3_remote
    node_b = remote.node("node-b")
    built = node_b.local.build("mnist", "v1", dataset(300))
    result = remote.cli("push", "mnist", "v1")
    assert result.returncode == 0, result.stderr
    assert "published" in result.stdout and f"{remote.url}/mnist/v1" in result.stdout
    assert remote.keys("mnist/v1/") == sorted(
        [f"{PREFIX}/mnist/v1/{MANIFEST_NAME}", f"{PREFIX}/mnist/v1/{LEASE_NAME}"]  # the lease, released
        + [f"{PREFIX}/mnist/v1/{built.build_id}-{p.name}" for p in built.parts]
    )
    published = remote.node("node-c").remote_manifest("mnist", "v1")
    assert published is not None and published.freshness == built.freshness
    # Another node reads exactly what was pushed.
    assert reader_keys(remote.node("node-c").open("mnist", "v1")) == expected_keys(300)
    assert ls_json(remote)[("mnist", "v1")]["local_current"] is True

    # Pushing the same build again is a no-op; pushing another build over it is refused.
    assert remote.cli("push", "mnist", "v1").returncode == 0
    node_b.local.build("mnist", "v1", dataset(300, 1))
    refused = remote.cli("push", "mnist", "v1")
    assert refused.returncode == 1
    assert "yogacache rm mnist v1 --remote" in refused.stderr and "cannot push mnist v1" in refused.stderr
    still = remote.node("node-c").remote_manifest("mnist", "v1")
    assert still is not None and still.freshness == built.freshness


def test_push_of_a_missing_local_cache_fails_cleanly(s3_remote: Remote) -> None:
    result = s3_remote.cli("push", "nothing", "v1")
    assert result.returncode == 1
    assert "yogacache: error:" in result.stderr and "Traceback" not in result.stderr
    assert s3_remote.keys() == []


# -- rm ------------------------------------------------------------------------------------------
@pytest.fixture
def populated(s3_remote: Remote) -> Remote:
    """mnist v1 and mnist v10 (a version whose name extends v1) published and pulled to node b."""
    node_a, node_b = s3_remote.node("node-a"), s3_remote.node("node-b")
    for version in ("v1", "v10"):
        node_a.build("mnist", version, dataset(40))
        node_b.open("mnist", version)
    return s3_remote


def test_rm_remote_removes_only_the_published_cache(populated: Remote) -> None:
    remote = populated
    v10_keys = remote.keys("mnist/v10/")
    result = remote.cli("rm", "mnist", "v1", "--remote", "-y")
    assert result.returncode == 0, result.stderr
    assert remote.keys("mnist/v1/") == []
    assert remote.keys("mnist/v10/") == v10_keys  # the neighbour is untouched
    assert (remote.local_dir("mnist", "v1") / MANIFEST_NAME).is_file()  # local copy kept
    rows = ls_json(remote)
    assert rows[("mnist", "v1")]["where"] == "local"
    assert rows[("mnist", "v10")]["where"] == "remote+local"


def test_rm_remote_of_an_azure_cache_removes_only_that_cache(azure_server: Any, tmp_path: Path) -> None:
    remote = Remote(Cloud("azure", azure_server), tmp_path)
    for version in ("v1", "v10"):
        remote.node("node-a").build("mnist", version, dataset(40))
    v10_keys = remote.keys("mnist/v10/")
    result = remote.cli("rm", "mnist", "v1", "--remote", "-y")
    assert result.returncode == 0, result.stderr
    assert remote.keys("mnist/v1/") == [] and remote.keys("mnist/v10/") == v10_keys


def test_rm_default_removes_only_the_local_copy(populated: Remote) -> None:
    remote = populated
    keys = remote.keys()
    result = remote.cli("rm", "mnist", "v1", "-y")
    assert result.returncode == 0, result.stderr
    assert not remote.local_dir("mnist", "v1").exists()
    assert (remote.local_dir("mnist", "v10") / MANIFEST_NAME).is_file()
    assert remote.keys() == keys
    assert ls_json(remote)[("mnist", "v1")]["where"] == "remote"

    explicit = remote.cli("rm", "mnist", "v10", "--local", "-y")
    assert explicit.returncode == 0, explicit.stderr
    assert not remote.local_dir("mnist", "v10").exists()
    assert remote.keys() == keys


def test_rm_remote_and_local_removes_both(populated: Remote) -> None:
    remote = populated
    result = remote.cli("rm", "mnist", "v1", "--remote", "--local", "-y")
    assert result.returncode == 0, result.stderr
    assert remote.keys("mnist/v1/") == []
    assert not remote.local_dir("mnist", "v1").exists()
    assert set(ls_json(remote)) == {("mnist", "v10")}


def test_rm_asks_first(populated: Remote) -> None:
    remote = populated
    keys = remote.keys()
    declined = remote.cli("rm", "mnist", "v1", "--remote", stdin="n\n")
    assert declined.returncode == 1
    assert "[y/N]" in declined.stdout and "mnist" in declined.stdout
    assert remote.keys() == keys and remote.local_dir("mnist", "v1").exists()
    accepted = remote.cli("rm", "mnist", "v1", "--remote", stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert remote.keys("mnist/v1/") == []


def test_rm_of_a_missing_cache_fails_and_removes_nothing(populated: Remote) -> None:
    remote = populated
    keys = remote.keys()
    for args in (["--remote"], [], ["--remote", "--local"]):
        result = remote.cli("rm", "mnist", "v2", *args, "-y")
        assert result.returncode == 1, args
        assert "yogacache: error:" in result.stderr and "Traceback" not in result.stderr
    assert remote.keys() == keys


def test_rm_refuses_unsafe_names(populated: Remote) -> None:
    remote = populated
    keys = remote.keys()
    for bad in ("..", "mnist/v1", "../x"):
        result = remote.cli("rm", "mnist", bad, "--remote", "--local", "-y")
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
    assert remote.keys() == keys
    assert remote.local_dir("mnist", "v1").exists()


# -- progress ------------------------------------------------------------------------------------
PROGRESS = re.compile(
    r"(?P<what>uploading|downloading) mnist:v1: (?P<done>[\d.]+ \w+) of (?P<total>[\d.]+ \w+) "
    r"(\([\d.]+ \w+/s, ETA [^)]+\)|transferred, finishing \([^)]+\)|in [^(]+ \([\d.]+ \w+/s, done\))"
)


@pytest.mark.parametrize("verbose", [False, True], ids=["plain", "verbose"])
def test_transfers_log_progress_lines_when_not_a_tty(s3_remote: Remote, verbose: bool) -> None:
    """stderr is a pipe here (not a terminal): progress arrives as log lines with bytes, rate, ETA."""
    remote = s3_remote
    flags = ["-v"] if verbose else []
    remote.node("node-b").local.build("mnist", "v1", dataset(1500))
    pushed = remote.cli("push", "mnist", "v1", *flags)
    assert pushed.returncode == 0, pushed.stderr
    remote.node("node-b").remove("mnist", "v1", remote=False, local=True)
    pulled = remote.cli("pull", "mnist", "v1", *flags)
    assert pulled.returncode == 0, pulled.stderr

    for result, what in ((pushed, "uploading"), (pulled, "downloading")):
        matches = [m for m in PROGRESS.finditer(result.stderr) if m.group("what") == what]
        assert matches, f"no {what} progress line in stderr:\n{result.stderr}"
        assert matches[-1].group("done") == matches[-1].group("total")  # the last line: all of it
        assert "\r" not in result.stderr  # log lines, not a rewritten terminal line
