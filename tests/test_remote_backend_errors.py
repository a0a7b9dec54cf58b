"""Backends under real load and real misconfiguration: pools sized to the transfers, credential
and missing-library errors that say what to set, once, without secrets.

Against moto's S3 server (directly or through tests/faultproxy.py); the GCS and missing-library
cases run in a subprocess whose environment has no credentials or lacks the library.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cloud_helpers import Cloud, HttpRequests, python_env
from tests.faultproxy import FaultProxy
from yogacache.backends.base import RemoteError
from yogacache.backends.s3 import S3ObjectStore
from yogacache.store.remote import RemoteCacheStore


def test_a_multipart_pull_and_push_never_discard_pooled_connections(
    s3_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """4 transfer threads x 8 ranged requests each at once: the pool holds them all."""
    bucket = Cloud("s3", s3_server).new_bucket()

    def store(root: str) -> RemoteCacheStore:
        objects = S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url, multipart_bytes=5 << 20)
        return RemoteCacheStore(objects, tmp_path / root, part_size_bytes=12 << 20, show_progress=False)

    records = [{"i": np.int64(i), "x": np.full(1 << 20, i, np.uint8)} for i in range(48)]
    with caplog.at_level(logging.WARNING, logger="urllib3"):
        manifest = store("builder").build("ds", "v1", records)
        assert len(manifest.parts) >= 4 and min(p.size_bytes for p in manifest.parts[:4]) > 8 * (1 << 20)
        # Downloads in 1 MiB ranges: every part is fetched by up to 8 requests at once.
        objects = S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url, multipart_bytes=1 << 20)
        http = HttpRequests().attach(objects)
        reader = RemoteCacheStore(objects, tmp_path / "node", show_progress=False).open("ds", "v1")
    assert reader.manifest.freshness == manifest.freshness
    assert len([r for r in http.sent if "-part-" in r]) > 4 * len(manifest.parts)  # ranged, in parallel
    discarded = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert discarded == []


def test_missing_credentials_name_the_endpoint_and_what_to_set_without_retrying(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    objects = S3ObjectStore(Cloud("s3", s3_server).new_bucket(), "caches", endpoint_url=s3_server.endpoint_url)
    with pytest.raises(RemoteError) as raised:
        objects.read("ds/v1/manifest.json")
    message = str(raised.value)
    assert f"S3 at {s3_server.endpoint_url}: no credentials" in message
    assert "AWS_ACCESS_KEY_ID" in message and "access_key/secret_key" in message
    assert "after 1 attempt(s)" in message


def test_refused_credentials_are_not_retried_and_stay_secret(s3_server: Any) -> None:
    bucket = Cloud("s3", s3_server).new_bucket()
    body = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code>'
        b"<Message>The AWS Access Key Id you provided does not exist.</Message></Error>"
    )
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add_rule(action="status", status=403, body=body)
        objects = S3ObjectStore(
            bucket,
            "caches",
            endpoint_url=proxy.url,
            access_key=s3_server.access_key,
            secret_key=s3_server.secret_key,
        )
        http = HttpRequests().attach(objects)
        with pytest.raises(RemoteError) as raised:
            objects.read("ds/v1/manifest.json")
    message = str(raised.value)
    assert f"S3 at {proxy.url} refused the credentials (InvalidAccessKeyId)" in message
    assert len(http.sent) == 1  # retrying with the same keys cannot help
    assert s3_server.secret_key not in message and s3_server.access_key not in message


GCS_NO_CREDENTIALS = textwrap.dedent(
    """
    from yogacache.backends.registry import open_backend
    from yogacache.errors import ConfigError
    try:
        open_backend("gs://some-bucket/caches")
    except ConfigError as error:
        print("ConfigError:", error)
    """
)

MISSING_LIBRARY = textwrap.dedent(
    """
    import sys
    sys.modules["boto3"] = None  # as if the s3 extra were not installed
    from yogacache.backends.registry import open_backend
    try:
        open_backend("s3://some-bucket/caches")
    except ImportError as error:
        print("ImportError:", error, "| cause:", error.__cause__, "| context suppressed:", error.__suppress_context__)
    """
)


def _run(code: str, env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_gcs_without_credentials_says_what_to_set(tmp_path: Path) -> None:
    env = python_env(NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        env.pop(name, None)
    out = _run(GCS_NO_CREDENTIALS, env)
    assert out.startswith("ConfigError: GCS at https://storage.googleapis.com: no credentials"), out
    assert "GOOGLE_APPLICATION_CREDENTIALS" in out and "STORAGE_EMULATOR_HOST" in out


def test_a_missing_extra_is_one_import_error_with_the_install_hint() -> None:
    out = _run(MISSING_LIBRARY, python_env())
    assert "pip install 'yogacache[s3]'" in out and "s3:// storage needs" in out, out
    assert "| cause: None | context suppressed: True" in out
    assert os.linesep not in out
