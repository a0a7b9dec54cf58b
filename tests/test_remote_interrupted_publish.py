"""Ctrl-C during the upload phase of ``yogacache import --storage s3://...``: the command stops
at once (130, one line), the parts it had uploaded can be removed with ``rm --remote`` (there is
no manifest), the next import publishes (an unpublished local copy is not "already cached") and
removes what the interrupted one stranded.

Real processes and signals against the moto server; the fault proxy holds two of the four part
uploads so that the interrupt lands mid-upload. The waits are hang guards, not timings.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.faultproxy import FaultProxy
from tests.servers import S3Server
from tests.test_cli_signals import start_cli, wait_until
from tests.test_parallel_objects import write_tars
from yogacache.backends.s3 import S3ObjectStore
from yogacache.format.durability import leftovers_of
from yogacache.store.remote import LOCAL_CACHE_DIR, RemoteCacheStore

STOP_GUARD = 20.0
DS, VER = "wds", "v1"
EXPECTED_KEYS = [f"s{shard:02d}-{index:03d}" for shard in range(4) for index in range(7)]


def _objects(s3_server: S3Server, bucket: str) -> list[str]:
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=f"caches/{DS}/{VER}/")
    return sorted(item["Key"] for item in listed.get("Contents", []))


def _interrupted_import(s3_server: S3Server, bucket: str, shards: Path, local: Path) -> tuple[float, str]:
    """Starts the import through a proxy that holds parts 2 and 3, interrupts it once parts 0
    and 1 are in the bucket; returns the seconds from SIGINT to exit and stderr."""
    with FaultProxy(s3_server.endpoint_url) as proxy:
        held = [
            proxy.add_rule(action="delay", method="PUT", path_contains=f"part-0000{n}", seconds=300.0) for n in (2, 3)
        ]
        process = start_cli(
            "import", f"{shards}/", "--id", DS, "--version", VER, "--workers", "2",
            "--storage", f"s3://{bucket}/caches", "--endpoint-url", proxy.url, "--local-cache", str(local),
        )
        wait_until(lambda: sum(rule.hits for rule in held) >= 2, process)
        wait_until(lambda: sum("-part-" in key for key in _objects(s3_server, bucket)) >= 2, process)
        process.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        try:
            _, err = process.communicate(timeout=STOP_GUARD)
        except Exception:
            process.kill()
            pytest.fail(f"the import did not stop within {STOP_GUARD} s of Ctrl-C: {process.communicate()}")
        stopped = time.monotonic() - signalled
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("yogacache: interrupted"), err  # after the build's progress
    return stopped, err


def _cli(*args: str) -> tuple[int, str, str]:
    process = start_cli(*args)
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def test_ctrl_c_in_the_upload_of_an_import_strands_nothing_that_cannot_be_removed(
    s3_server: S3Server, tmp_path: Path
) -> None:
    bucket = s3_server.new_bucket()
    shards = write_tars(tmp_path / "src", shards=4)
    local = tmp_path / "node"
    storage = ["--storage", f"s3://{bucket}/caches", "--endpoint-url", s3_server.endpoint_url]

    stopped, err = _interrupted_import(s3_server, bucket, shards, local)
    print(f"import stopped {stopped:.2f} s after SIGINT")
    assert "import stopped, nothing was cached" in err
    stranded = _objects(s3_server, bucket)
    assert any("-part-" in key for key in stranded) and not any(key.endswith("manifest.json") for key in stranded)
    # Nothing was cached: no local copy either (ls shows nothing).
    assert not (local / LOCAL_CACHE_DIR / DS / VER).exists()
    assert leftovers_of(local / LOCAL_CACHE_DIR / DS / VER) == []  # no temporary either
    code, out, err = _cli("ls", *storage, "--local-cache", str(local))
    assert code == 0 and DS not in out, out + err

    # rm --remote removes the stranded parts although no manifest names them.
    code, out, err = _cli("rm", DS, VER, "--remote", "-y", *storage, "--local-cache", str(local))
    assert code == 0, out + err
    assert "removed" in out
    assert _objects(s3_server, bucket) == []

    # Interrupted again; the next import publishes and removes what this one stranded.
    _interrupted_import(s3_server, bucket, shards, local)
    stranded = [key for key in _objects(s3_server, bucket) if "-part-" in key]
    assert stranded
    code, out, err = _cli(
        "import", f"{shards}/", "--id", DS, "--version", VER, "--workers", "2", *storage, "--local-cache", str(local)
    )
    assert code == 0, out + err
    assert out.startswith(f"imported {DS} {VER}: 28 records"), out
    node = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "reader", show_progress=False
    )
    published = node.remote_manifest(DS, VER)
    assert published is not None
    names = {f"caches/{DS}/{VER}/{published.build_id}-{part.name}" for part in published.parts}
    left = {key for key in _objects(s3_server, bucket) if "-part-" in key}
    assert left == names, left - names  # the interrupted build's parts are gone
    reader = node.open(DS, VER)
    keys = [bytes(element["__key__"]).decode() for element in reader.read_elements(range(len(reader)))]
    reader.close()
    assert keys == EXPECTED_KEYS


def test_a_local_copy_never_published_is_not_already_cached(s3_server: S3Server, tmp_path: Path) -> None:
    """A build whose publish was cut short (here: the bucket refused every part upload) leaves a
    local copy that was never published: the next import publishes, it does not say "already
    cached"."""
    bucket = s3_server.new_bucket()
    shards = write_tars(tmp_path / "src", shards=4)
    local = tmp_path / "node"
    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add_rule(action="status", method="PUT", path_contains="-part-", status=403)
        code, out, err = _cli(
            "import", f"{shards}/", "--id", DS, "--version", VER, "--storage", f"s3://{bucket}/caches",
            "--endpoint-url", proxy.url, "--local-cache", str(local),
        )
    assert code == 1, out + err
    code, out, err = _cli(
        "import", f"{shards}/", "--id", DS, "--version", VER, "--storage", f"s3://{bucket}/caches",
        "--endpoint-url", s3_server.endpoint_url, "--local-cache", str(local),
    )
    assert code == 0, out + err
    assert "already cached" not in out, out
    node = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "reader", show_progress=False
    )
    reader: Any = node.open(DS, VER)
    keys = [bytes(element["__key__"]).decode() for element in reader.read_elements(range(len(reader)))]
    reader.close()
    assert keys == EXPECTED_KEYS


def test_gc_removes_the_parts_an_interrupted_import_stranded(s3_server: S3Server, tmp_path: Path) -> None:
    """``yogacache gc`` removes part objects no manifest names (under each cache's build lease),
    and nothing a published manifest names."""
    bucket = s3_server.new_bucket()
    shards = write_tars(tmp_path / "src", shards=4)
    local = tmp_path / "node"
    storage = [
        "--storage", f"s3://{bucket}/caches", "--endpoint-url", s3_server.endpoint_url, "--local-cache", str(local)
    ]
    keeper = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "keeper", show_progress=False
    )
    kept = keeper.build("kept", "v1", [{"i": i} for i in range(50)])

    _interrupted_import(s3_server, bucket, shards, local)
    stranded = [key for key in _objects(s3_server, bucket) if "-part-" in key]
    assert stranded

    code, out, err = _cli("gc", "--dry-run", "--limit", "1Gi", *storage)
    assert code == 0, out + err
    assert [key for key in _objects(s3_server, bucket) if "-part-" in key] == stranded  # a dry run
    assert all(f"s3://{bucket}/{key}" in out for key in stranded), out
    code, out, err = _cli("gc", "--limit", "1Gi", *storage)
    assert code == 0, out + err
    assert "stranded" in out and all(f"s3://{bucket}/{key}" in out for key in stranded), out
    assert [key for key in _objects(s3_server, bucket) if "-part-" in key] == []
    # The published cache beside it keeps every part its manifest names.
    reader: Any = keeper.open("kept", "v1")
    assert len(reader) == 50 and reader.manifest.freshness == kept.freshness
    reader.close()


def test_get_or_build_publishes_a_local_build_whose_publish_failed_instead_of_building_again(
    s3_server: S3Server, tmp_path: Path
) -> None:
    """The first publish fails (the bucket refuses the part uploads): the local build stays, marked
    unpublished, and is not the remote's cache; the next get_or_build publishes that build (it
    does not build again), and another node reads it."""
    bucket = s3_server.new_bucket()
    calls = []

    def make() -> Any:
        calls.append(1)
        return [{"i": i} for i in range(40)]

    with FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.add_rule(action="status", method="PUT", path_contains="-part-", status=403)
        failing = RemoteCacheStore(
            S3ObjectStore(bucket, "caches", endpoint_url=proxy.url), tmp_path / "node", show_progress=False
        )
        with pytest.raises(Exception, match="upload to"):
            failing.get_or_build(DS, VER, make)
    node = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "node", show_progress=False
    )
    with pytest.raises(Exception, match="never published"):
        node.manifest(DS, VER)  # the local build is not the remote's cache
    reader: Any = node.get_or_build(DS, VER, make)
    assert len(calls) == 1  # published, not built again
    built = reader.manifest
    reader.close()
    other = RemoteCacheStore(
        S3ObjectStore(bucket, "caches", endpoint_url=s3_server.endpoint_url), tmp_path / "other", show_progress=False
    )
    published = other.remote_manifest(DS, VER)
    assert published is not None and published.freshness == built.freshness
    reader = other.open(DS, VER)
    assert [int(element["i"]) for element in reader.read_elements(range(len(reader)))] == list(range(40))
    reader.close()
