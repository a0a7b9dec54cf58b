"""Helpers shared by the remote-storage tests: small datasets, a counting ObjectStore proxy,
request counters hooked into the real clients, and object stores on the test servers.

Everything here talks to real servers (the ``s3_server`` / ``gcs_server`` subprocesses from
tests/servers.py) or a real directory; nothing patches a client in-process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import numpy as np

from yogacache.backends.base import ObjectInfo, ObjectStore, ProgressCallback, RetryPolicy

REPO = Path(__file__).resolve().parent.parent

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)


# -- data ---------------------------------------------------------------------------------
def dataset(n: int = 300, fill: int = 0) -> list[tuple[np.ndarray, int]]:
    """A small dataset: element i is (int32[100] filled with i + fill, i + fill)."""
    return [(np.full(100, i + fill, np.int32), i + fill) for i in range(n)]


def element_key(element: Any) -> tuple[bytes, int]:
    array, label = element
    return np.asarray(array).astype(np.int32).tobytes(), int(label)


def expected_keys(n: int = 300, fill: int = 0) -> list[tuple[bytes, int]]:
    return [element_key(e) for e in dataset(n, fill)]


def reader_keys(reader: Any) -> list[tuple[bytes, int]]:
    """Every record of a CacheReader, in index order, as comparable keys."""
    return [element_key(e) for e in reader.read_elements(range(len(reader)))]


def digest_of_keys(keys: list[tuple[bytes, int]]) -> str:
    digest = hashlib.sha256()
    for data, label in keys:
        digest.update(data)
        digest.update(str(label).encode())
    return digest.hexdigest()


class Builds:
    """A ``make_data`` that counts how often it ran (and so proves whether a build happened)."""

    def __init__(self, data: Any) -> None:
        self.data = data
        self.calls = 0

    def __call__(self) -> Any:
        self.calls += 1
        return self.data


def must_not_build() -> Any:
    raise AssertionError("make_data was called although a published cache exists")


# -- a counting proxy ---------------------------------------------------------------------
class CountingStore:
    """A real ObjectStore wrapper that records every call (method, key) before delegating."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def _note(self, method: str, key: str) -> None:
        with self._lock:
            self.calls.append((method, key))

    def counts(self) -> Counter[str]:
        return Counter(method for method, _ in self.calls)

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()

    def url(self, key: str = "") -> str:
        return self.inner.url(key)

    def read(self, key: str, max_bytes: Optional[int] = None) -> Optional[tuple[bytes, str]]:
        self._note("read", key)
        return self.inner.read(key, max_bytes)

    def write(
        self, key: str, data: bytes, *, if_absent: bool = False, if_token: Optional[str] = None
    ) -> Optional[str]:
        self._note("write", key)
        return self.inner.write(key, data, if_absent=if_absent, if_token=if_token)

    def delete(self, key: str, if_token: Optional[str] = None) -> bool:
        self._note("delete", key)
        return self.inner.delete(key, if_token=if_token)

    def upload_file(self, path: Path, key: str, progress: Optional[ProgressCallback] = None) -> None:
        self._note("upload_file", key)
        self.inner.upload_file(path, key, progress)

    def download_file(
        self, key: str, path: Path, progress: Optional[ProgressCallback] = None, *, size: Optional[int] = None
    ) -> None:
        self._note("download_file", key)
        self.inner.download_file(key, path, progress, size=size)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self._note("list", prefix)
        return self.inner.list(prefix)


# -- HTTP request counters hooked into the real clients -------------------------------------
class HttpRequests:
    """Counts the HTTP requests a backend's client sends (botocore event / requests hook)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def attach(self, store: Any) -> HttpRequests:
        from yogacache.backends.gcs import GCSObjectStore
        from yogacache.backends.s3 import S3ObjectStore

        if isinstance(store, S3ObjectStore):

            def before_send(request: Any, **_: Any) -> None:
                self.sent.append(f"{request.method} {request.url}")

            store._client.meta.events.register("before-send.s3", before_send)
        elif isinstance(store, GCSObjectStore):

            def on_response(response: Any, *args: Any, **kwargs: Any) -> None:
                url = response.request.url
                # google-cloud-storage 3.x fetches the bucket's metadata once per client in a
                # background thread (its bucket-metadata cache); that is the library's own
                # request, not one yogacache makes. Object requests are counted.
                if "/o/" in url or "/o?" in url:
                    self.sent.append(f"{response.request.method} {url}")

            store._client._http.hooks["response"].append(on_response)
        elif type(store).__name__ == "AzureObjectStore":

            def on_azure_response(response: Any, *args: Any, **kwargs: Any) -> None:
                self.sent.append(f"{response.request.method} {response.request.url}")

            store._service._config.transport.session.hooks["response"].append(on_azure_response)
        else:  # pragma: no cover - only cloud stores are counted
            raise TypeError(store)
        return self


# -- object stores on the test servers ------------------------------------------------------
class Cloud:
    """One kind of cloud (s3, gcs or azure) on its test server: fresh buckets (Azure: containers)
    and stores on them."""

    def __init__(self, kind: str, server: Any) -> None:
        self.kind = kind
        self.server = server

    def __repr__(self) -> str:
        return f"Cloud({self.kind})"

    @classmethod
    def from_environment(cls, kind: str) -> Cloud:
        """The test server of ``kind``, in a child process (``node_env`` says where it is)."""
        from tests.servers import AzureServer, GCSServer, S3Server

        if kind == "s3":
            return cls(kind, S3Server(os.environ["TEST_S3_ENDPOINT"]))
        if kind == "azure":
            return cls(kind, AzureServer.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]))
        return cls(kind, GCSServer(os.environ["STORAGE_EMULATOR_HOST"]))

    def node_env(self, **extra: str) -> dict[str, str]:
        """A child process's environment in which ``from_environment`` finds this cloud."""
        return python_env(TEST_S3_ENDPOINT=getattr(self.server, "endpoint_url", ""), **extra)

    def new_bucket(self) -> str:
        return self.server.new_bucket()

    @property
    def server_url(self) -> str:
        """The test server's root URL, where a FaultProxy in front of it forwards to."""
        return str(self.server.endpoint_url if self.kind == "s3" else self.server.url)

    def url(self, bucket: str, prefix: str) -> str:
        """The storage URL of ``prefix`` in ``bucket`` (``s3://``, ``gs://``, ``az://``)."""
        return f"{ {'s3': 's3', 'gcs': 'gs', 'azure': 'az'}[self.kind]}://{bucket}/{prefix}"

    def cli_args(self) -> list[str]:
        """What the CLI is told besides a URL of this cloud (GCS and Azure: the environment says it)."""
        return ["--endpoint-url", self.server.endpoint_url] if self.kind == "s3" else []

    def through(self, config: dict[str, Any], proxy_url: str) -> dict[str, Any]:
        """``config`` reaching the server through the proxy at ``proxy_url`` (GCS: set
        ``STORAGE_EMULATOR_HOST`` to it instead)."""
        if self.kind == "s3":
            return {**config, "endpoint_url": proxy_url}
        if self.kind == "azure":
            return {**config, "connection_string": self.server.connection_string_at(proxy_url)}
        return config

    def store(self, bucket: str, prefix: str = "", retry: RetryPolicy = RetryPolicy()) -> Any:
        if self.kind == "s3":
            from yogacache.backends.s3 import S3ObjectStore

            return S3ObjectStore(bucket, prefix, endpoint_url=self.server.endpoint_url, retry=retry)
        if self.kind == "azure":
            from yogacache.backends.azure import AzureObjectStore

            return AzureObjectStore(bucket, prefix, connection_string=self.server.connection_string, retry=retry)
        from yogacache.backends.gcs import GCSObjectStore

        return GCSObjectStore(bucket, prefix, retry=retry)  # STORAGE_EMULATOR_HOST is set

    def raw_keys(self, bucket: str) -> list[str]:
        """Every key in the bucket, listed with the server's own client (not yogacache)."""
        if self.kind == "s3":
            client = self.server.client()
            keys = []
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys += [item["Key"] for item in page.get("Contents", [])]
            return sorted(keys)
        if self.kind == "azure":
            return sorted(blob.name for blob in self.server.client().get_container_client(bucket).list_blobs())
        return sorted(blob.name for blob in self.server.client().list_blobs(bucket))

    def raw_get(self, bucket: str, key: str) -> bytes:
        if self.kind == "s3":
            return self.server.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        if self.kind == "azure":
            return bytes(self.server.client().get_blob_client(bucket, key).download_blob().readall())
        return self.server.client().bucket(bucket).blob(key).download_as_bytes()

    def raw_put(self, bucket: str, key: str, data: bytes) -> None:
        """Overwrites an object unconditionally with the server's own client."""
        if self.kind == "s3":
            self.server.client().put_object(Bucket=bucket, Key=key, Body=data)
        elif self.kind == "azure":
            self.server.client().get_blob_client(bucket, key).upload_blob(data, overwrite=True)
        else:
            self.server.client().bucket(bucket).blob(key).upload_from_string(data)

    def raw_delete(self, bucket: str, key: str) -> None:
        if self.kind == "s3":
            self.server.client().delete_object(Bucket=bucket, Key=key)
        elif self.kind == "azure":
            self.server.client().get_blob_client(bucket, key).delete_blob()
        else:
            self.server.client().bucket(bucket).blob(key).delete()

    def config(self, bucket: str, prefix: str, **extra: Any) -> dict[str, Any]:
        """A ``data_layer`` config dict for this cloud."""
        if self.kind == "s3":
            return {
                "type": "s3",
                "bucket": bucket,
                "bucket_directory_path": prefix,
                "endpoint_url": self.server.endpoint_url,
                "access_key": self.server.access_key,
                "secret_key": self.server.secret_key,
                **extra,
            }
        if self.kind == "azure":
            return {
                "type": "azure",
                "bucket": bucket,
                "bucket_directory_path": prefix,
                "connection_string": self.server.connection_string,
                **extra,
            }
        return {"type": "gcs", "bucket": bucket, "bucket_directory_path": prefix, **extra}


def without_crc32c(manifest_bytes: bytes) -> bytes:
    """A manifest as releases before 0.2 wrote it: the same, without the parts' CRC32Cs."""
    raw = json.loads(manifest_bytes)
    for part in raw["parts"]:
        part.pop("crc32c", None)
    return (json.dumps(raw, indent=2, sort_keys=True) + "\n").encode("utf-8")


def publish_as_before_crc32c(objects: ObjectStore, dataset_id: str, version: str) -> None:
    """Rewrites a published manifest as a release before 0.2 published it (no part CRC32Cs)."""
    key = f"{dataset_id}/{version}/manifest.json"
    found = objects.read(key)
    assert found is not None, f"{key} is not published"
    objects.write(key, without_crc32c(found[0]))


def unique(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- separate node processes ------------------------------------------------------------------
def python_env(**extra: str) -> dict[str, str]:
    # A command's output is piped here: no terminal width the runner happens to export (pytest-xdist's
    # workers, a CI shell) fits its tables, unless a test asks for one in ``extra``.
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start_python(code: str, *args: str, env: Optional[dict[str, str]] = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or python_env(),
    )


def finish(process: subprocess.Popen[str], timeout: float = 90.0) -> dict[str, Any]:
    """Waits for a node process; returns the JSON it printed last on stdout."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"node process timed out; stderr:\n{err[-3000:]}") from None
    assert process.returncode == 0, f"node process failed ({process.returncode}):\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])

