"""A bucket (an Azure container) that does not exist: one message, naming the bucket and the
endpoint, whatever the command (``ls``, ``info``, ``pull``, ``copy --to``, ``import``) and on every
cloud, never retried and never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, python_env
from yogacache.store.local import CacheStore

MISSING = "no-such-bucket-4fe1"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args], capture_output=True, text=True, env=python_env(), cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize("kind", ["s3", "gcs", "azure"])
def test_every_command_says_the_bucket_does_not_exist(kind: str, request: pytest.FixtureRequest,
                                                     tmp_path: Path) -> None:
    cloud = Cloud(kind, request.getfixturevalue(f"{kind}_server"))
    url = cloud.url(MISSING, "caches")
    extra = cloud.cli_args()
    local = tmp_path / "local"
    CacheStore(local, show_progress=False).build("a", "v1", [{"x": 1}])
    noun = "container" if kind == "azure" else "bucket"
    commands = {
        "ls": ["ls", "--storage", url],
        "info": ["info", "a", "v1", "--storage", url],
        "pull": ["pull", "a", "v1", "--storage", url],
        "copy --to": ["copy", "a", "v1", "--from", str(local), "--to", url],
        "import": ["import", cloud.url(MISSING, "x.tar"), "--id", "x", "--storage", str(tmp_path / "c")],
    }
    for name, args in commands.items():
        done = run_cli(*args, *extra, cwd=tmp_path)
        said = done.stderr.strip()
        assert done.returncode == 1 and "Traceback" not in said, (name, said)
        if kind == "gcs" and name in ("info", "pull"):
            # fake-gcs-server answers a GET in a missing bucket as one of a missing object (see
            # the canary below); GCS itself says "The specified bucket does not exist".
            assert f"no cache a v1 at {url}/a/v1" in said, (name, said)
            continue
        assert f"{noun} '{MISSING}' does not exist at " in said, (name, said)
        assert "attempt(s)" not in said and "x.tar/" not in said, (name, said)
        assert len(said.splitlines()) == 1, (name, said)


def test_canary_fake_gcs_answers_a_get_in_a_missing_bucket_as_a_missing_object(gcs_server: Any) -> None:
    """Where GCS says "The specified bucket does not exist", fake-gcs-server's 404 of a media GET
    is the same as for a missing object: a read cannot tell the two apart there (a LIST can: it
    never 404s for a prefix)."""
    from google.api_core import exceptions as gexc

    client = gcs_server.client()
    bucket = gcs_server.new_bucket()
    answers = []
    for name in (MISSING, bucket):
        with pytest.raises(gexc.NotFound) as raised:
            client.bucket(name).blob("caches/a/v1/manifest.json").download_as_bytes()
        answers.append(str(raised.value).split("?")[1])
    assert answers[0] == answers[1] and "bucket" not in answers[0].lower(), answers
