"""An interrupted ``yogacache copy`` (SIGKILL, Ctrl-C) publishes nothing, and running it again
keeps the parts already at the destination (their CRC32C, as the destination reports it,
matches) and copies only the rest. Real processes, real servers; the fault proxy slows the
destination's part uploads so that the kill lands half-way.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cloud_helpers import Cloud, dataset, expected_keys, python_env, reader_keys, unique
from tests.faultproxy import FaultProxy
from yogacache.backends.s3 import S3ObjectStore
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.store.copy import copy_cache
from yogacache.store.remote import RemoteCacheStore

PART_SIZE = 100_000
N = 1500


def part_objects(cloud: Cloud, bucket: str) -> list[str]:
    return [key for key in cloud.raw_keys(bucket) if "-part-" in key]


def start_copy(source_config: Path, target_config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "yogacache",
            "copy",
            "ds",
            "v1",
            "--from",
            str(source_config),
            "--to",
            str(target_config),
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )


def wait_for_parts(cloud: Cloud, bucket: str, count: int, process: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        present = len(part_objects(cloud, bucket))
        if present >= count:
            return present
        if process.poll() is not None:
            raise AssertionError(f"the copy ended early: {process.communicate()[1][-2000:]}")
        time.sleep(0.05)
    raise AssertionError("the copy made no progress")


@pytest.fixture
def setup(s3_server: Any, s3_server_b: Any, tmp_path: Path) -> Any:
    source, target = Cloud("s3", s3_server), Cloud("s3", s3_server_b)
    source_bucket, target_bucket = source.new_bucket(), target.new_bucket()
    builder = RemoteCacheStore(
        S3ObjectStore(source_bucket, "caches", endpoint_url=s3_server.endpoint_url),
        tmp_path / "builder",
        part_size_bytes=PART_SIZE,
        show_progress=False,
    )
    manifest = builder.get_or_build("ds", "v1", lambda: dataset(N)).manifest
    proxy = FaultProxy(s3_server_b.endpoint_url)
    proxy.add_rule(action="delay", method="PUT", path_contains="-part-", seconds=0.3)
    source_config = tmp_path / f"{unique('src')}.json"
    source_config.write_text(json.dumps(source.config(source_bucket, "caches")))
    target_config = tmp_path / f"{unique('dst')}.json"
    proxied = dict(target.config(target_bucket, "caches"), endpoint_url=proxy.url)
    target_config.write_text(json.dumps(proxied))
    yield source, target, source_bucket, target_bucket, manifest, source_config, target_config
    proxy.stop()


@pytest.mark.slow
def test_a_copy_killed_half_way_resumes_with_the_parts_it_had_copied(setup: Any, tmp_path: Path) -> None:
    source, target, source_bucket, target_bucket, manifest, source_config, target_config = setup
    total = len(manifest.parts)
    process = start_copy(source_config, target_config)
    present = wait_for_parts(target, target_bucket, total // 2, process)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    present = len(part_objects(target, target_bucket))
    assert 0 < present < total
    assert f"caches/ds/v1/{MANIFEST_NAME}" not in target.raw_keys(target_bucket)  # nothing published

    destination = S3ObjectStore(target_bucket, "caches", endpoint_url=target.server.endpoint_url)
    report = copy_cache(source_config, destination, "ds", "v1", show_progress=False)
    assert report.published
    # Every part that had landed is kept, verified (one the proxy was still forwarding at the
    # kill may land after the count); only the rest is copied.
    assert len(report.kept) >= present
    assert sorted(report.kept + report.copied) == [part.name for part in manifest.parts]
    kept_bytes = sum(part.size_bytes for part in manifest.parts if part.name in report.kept)
    assert report.bytes_through_client == manifest.total_size_bytes - kept_bytes
    reader = RemoteCacheStore(destination, tmp_path / "reader", show_progress=False).open("ds", "v1")
    assert reader.manifest.freshness == manifest.freshness
    assert reader_keys(reader) == expected_keys(N)


@pytest.mark.slow
def test_ctrl_c_stops_a_copy_publishing_nothing_and_says_how_to_resume(setup: Any) -> None:
    source, target, source_bucket, target_bucket, manifest, source_config, target_config = setup
    process = start_copy(source_config, target_config)
    wait_for_parts(target, target_bucket, 2, process)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "run the same command again to resume" in err
    assert f"caches/ds/v1/{MANIFEST_NAME}" not in target.raw_keys(target_bucket)
    present = len(part_objects(target, target_bucket))
    assert 0 < present < len(manifest.parts)


@pytest.mark.slow
def test_a_copy_to_gcs_killed_half_way_resumes(s3_server: Any, gcs_server: Any, tmp_path: Path) -> None:
    """The same against GCS: its uploads (resumable or multipart) appear whole or not at all."""
    from yogacache.backends.gcs import GCSObjectStore

    source, target = Cloud("s3", s3_server), Cloud("gcs", gcs_server)
    source_bucket, target_bucket = source.new_bucket(), target.new_bucket()
    objects = S3ObjectStore(source_bucket, "caches", endpoint_url=s3_server.endpoint_url)
    builder = RemoteCacheStore(objects, tmp_path / "builder", part_size_bytes=PART_SIZE, show_progress=False)
    manifest = builder.get_or_build("ds", "v1", lambda: dataset(N)).manifest
    source_config = tmp_path / "src.json"
    source_config.write_text(json.dumps(source.config(source_bucket, "caches")))
    with FaultProxy(gcs_server.url) as proxy:
        # The object name of a GCS upload travels in its body: every upload is slowed down.
        proxy.add_rule(action="delay", method="POST", path_contains="/upload/", seconds=0.3)
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "yogacache",
                "copy",
                "ds",
                "v1",
                "--from",
                str(source_config),
                "--to",
                f"gs://{target_bucket}/caches",
                "--threads",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=python_env(STORAGE_EMULATOR_HOST=proxy.url),
        )
        present = wait_for_parts(target, target_bucket, len(manifest.parts) // 2, process)
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    present = len(part_objects(target, target_bucket))
    assert 0 < present < len(manifest.parts)
    assert f"caches/ds/v1/{MANIFEST_NAME}" not in target.raw_keys(target_bucket)
    destination = GCSObjectStore(target_bucket, "caches")
    report = copy_cache(source_config, destination, "ds", "v1", show_progress=False)
    assert report.published and len(report.kept) >= present
    assert sorted(report.kept + report.copied) == [part.name for part in manifest.parts]
    reader = RemoteCacheStore(destination, tmp_path / "reader", show_progress=False).open("ds", "v1")
    assert reader_keys(reader) == expected_keys(N)
