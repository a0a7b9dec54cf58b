"""``yogacache ls`` on a remote storage it cannot list (no such bucket, no credentials, no server)
fails with the reason and a non-zero exit, as ``info`` does: it never prints a table of local
copies that may belong to another storage as if the listing had worked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import dataset, python_env
from tests.servers import free_port
from yogacache.store.local import CacheStore
from yogacache.store.remote import LOCAL_CACHE_DIR


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture
def local_cache(tmp_path: Path) -> Path:
    """A node-local root holding a copy of an unrelated cache (one an older listing showed)."""
    root = tmp_path / "node"
    CacheStore(root / LOCAL_CACHE_DIR, show_progress=False).build("unrelated", "v1", dataset(5))
    return root


def no_credentials_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in python_env().items() if not k.startswith("AWS_")}
    env.update(
        AWS_CONFIG_FILE=str(tmp_path / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


@pytest.mark.parametrize("failure", ["no bucket", "no credentials", "no server"])
def test_ls_of_a_storage_it_cannot_list_fails_with_the_reason(
    failure: str, s3_server: Any, local_cache: Path, tmp_path: Path
) -> None:
    endpoint = s3_server.endpoint_url
    bucket = s3_server.new_bucket()
    env = python_env()
    if failure == "no bucket":
        bucket, reason = "no-such-bucket-here", "NoSuchBucket|does not exist"
    elif failure == "no credentials":
        env, reason = no_credentials_env(tmp_path), "no credentials"
    else:
        endpoint, reason = f"http://127.0.0.1:{free_port()}", "cannot connect"
    storage = ["--storage", f"s3://{bucket}/caches", "--endpoint-url", endpoint, "--local-cache", str(local_cache)]

    info = run_cli("info", "unrelated", "v1", *storage, env=env)
    listed = run_cli("ls", *storage, env=env)
    as_json = run_cli("ls", "--json", *storage, env=env)

    assert info.returncode == 1 and re.search(reason, info.stderr), info.stderr
    for result in (listed, as_json):
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert re.search(reason, result.stderr) and "error" in result.stderr, result.stderr
        assert "unrelated" not in result.stdout, result.stdout  # no table of unrelated local copies
        assert "Traceback" not in result.stderr
    # Nothing was lost: the local copy is still there.
    assert CacheStore(local_cache / LOCAL_CACHE_DIR).exists("unrelated", "v1")


def test_ls_of_a_gcs_bucket_that_does_not_exist_fails_with_the_reason(gcs_server: Any, local_cache: Path) -> None:
    storage = ["--storage", "gs://no-such-bucket-here/caches", "--local-cache", str(local_cache)]
    for command in (["ls"], ["ls", "--json"]):
        result = run_cli(*command, *storage, env=python_env())
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert re.search("does not exist|NotFound|404", result.stderr), result.stderr
        assert "unrelated" not in result.stdout
