"""Secrets pass one choke point (``yogacache.redaction``).

A canary secret (unique per test, so that no test is helped by what another configured) sits in
every secret-bearing field of every backend: S3 ``access_key`` / ``secret_key`` and a password in
``endpoint_url``; Azure ``connection_string`` (AccountKey), ``credential`` (a key or a SAS token)
and a SAS token in ``account_url``; a GCS service-account key in a config file (shared_fs holds
none). Every public entry point is given a bad argument, every CLI command runs at ``-v`` with a
bad argument and with a config file whose credential line is malformed: the canary never appears
in ``str`` or ``repr`` of the exception, its traceback, the captured logs, stdout or stderr.
Nothing here needs the network: endpoints are closed ports of 127.0.0.1.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import pkgutil
import re
import subprocess
import sys
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

import pytest

import yogacache
from tests.servers import free_port
from yogacache import ConfigError, DataLayer, Mixture, redaction
from yogacache.cli import main
from yogacache.config import load_config_file, parse_config
from yogacache.mixture import load_mixture
from yogacache.storage import S3Configurations, S3Storage
from yogacache.store import open_cache, open_store

REPO = Path(__file__).resolve().parent.parent
CLOSED = f"127.0.0.1:{free_port()}"  # nothing listens: nothing here may need an answer


@pytest.fixture
def canary() -> str:
    return f"canary{uuid.uuid4().hex[:16]}"


def configs(canary: str) -> dict[str, dict[str, Any]]:
    """A ``data_layer`` mapping per secret-bearing field, the canary in that field."""
    account = f"http://{CLOSED}/devstoreaccount1"
    s3 = {"type": "s3", "bucket": "b", "bucket_directory_path": "caches", "endpoint_url": f"http://{CLOSED}"}
    azure = {"type": "azure", "bucket": "c", "bucket_directory_path": "caches"}
    return {
        "s3 keys": {**s3, "access_key": f"AKIA{canary.upper()}", "secret_key": f"{canary}/Secret+Key="},
        "s3 endpoint password": {**s3, "endpoint_url": f"http://minio:{canary}@{CLOSED}"},
        "azure connection string": {
            **azure,
            "connection_string": (
                f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={canary}Key==;"
                f"BlobEndpoint={account};"
            ),
        },
        "azure account key": {**azure, "account_url": account, "credential": f"{canary}Key=="},
        "azure sas credential": {**azure, "account_url": account, "credential": f"sv=2022-11-02&ss=b&sig={canary}"},
        "azure sas in account_url": {
            **azure,
            "account_url": f"{account}?sv=2022-11-02&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&sig={canary}%3D",
        },
        "mirror with keys": {
            **s3,
            "mirrors": [{**azure, "account_url": f"{account}?sv=2022-11-02&sig={canary}"}],
        },
    }


CONFIG_NAMES = list(configs("x"))


def texts_of(error: BaseException) -> list[str]:
    """Everything an exception may show: its str and repr, its causes' and contexts', and the
    traceback Python prints for it."""
    shown = ["".join(traceback.format_exception(type(error), error, error.__traceback__))]
    seen: BaseException | None = error
    while seen is not None:
        shown += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return shown


def assert_hidden(canary: str, *texts: str) -> None:
    for text in texts:
        assert canary not in text, text
        assert canary.upper() not in text, text


def raised(call: Callable[[], Any], expected: type[BaseException] = Exception) -> BaseException:
    with pytest.raises(expected) as info:
        call()
    return info.value


# -- reprs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_reprs_show_the_settings_not_the_secrets(name: str, canary: str) -> None:
    config = parse_config(configs(canary)[name])
    assert_hidden(canary, repr(config), str(config))
    assert "bucket=" in repr(config)  # still a useful repr: it says where


def test_an_azure_sas_in_account_url_is_masked_and_the_account_kept(canary: str) -> None:
    config = parse_config(configs(canary)["azure sas in account_url"])
    assert f"http://{CLOSED}/devstoreaccount1?" in repr(config) and "sig=***" in repr(config)
    assert config.account_url is not None and canary in config.account_url  # kept, only hidden


def test_the_yogadl_facade_and_determined_hide_the_secrets(canary: str) -> None:
    keys = configs(canary)["s3 keys"]
    settings = S3Configurations(
        "b", "caches", access_key=keys["access_key"], secret_key=keys["secret_key"], endpoint_url=f"http://{CLOSED}"
    )
    assert_hidden(canary, repr(settings), repr(settings.to_config()))
    det = pytest.importorskip("determined")
    import yogacache.determined as ydet

    with det.core.init() as context:
        for name in ("azure sas in account_url", "s3 keys"):
            layer = ydet.data_layer(context, storage=configs(canary)[name])
            assert_hidden(canary, repr(layer), str(layer))
            bad = functools.partial(ydet.data_layer, context, storage=layer.storage, returns="x")
            assert_hidden(canary, *texts_of(raised(bad)))


# -- public entry points given a bad argument --------------------------------------------------
def _ray_read_cache(*args: Any, **kwargs: Any) -> Any:
    return pytest.importorskip("yogacache.ray").read_cache(*args, **kwargs)


def _grain_open(*args: Any, **kwargs: Any) -> Any:
    return pytest.importorskip("yogacache.grain").open_data_source(*args, **kwargs)


ENTRY_POINTS: dict[str, Callable[[dict[str, Any]], Any]] = {
    # The case: the version forgotten, the storage mapping in the TypeError.
    "ray.read_cache without a version": lambda storage: _ray_read_cache("ds", storage=storage),
    "ray.read_cache with a bad version": lambda storage: _ray_read_cache("ds", "../v", storage),
    "grain.open_data_source without a version": lambda storage: _grain_open("ds", storage=storage),
    "grain.open_data_source with a bad version": lambda storage: _grain_open("ds", "../v", storage),
    "open_cache without a version": lambda storage: open_cache("ds", storage=storage),  # type: ignore[call-arg]
    "open_cache with a bad id": lambda storage: open_cache("../ds", "v1", storage),
    "open_store with a bad part_bytes": lambda storage: open_store(storage, part_bytes="lots"),
    "open_store with a bad budget": lambda storage: open_store({**storage, "local_cache_limit": "lots"}),
    "DataLayer.from_config with a bad seed": lambda storage: DataLayer.from_config(storage, seed="x"),
    "DataLayer with an unknown key": lambda storage: DataLayer({**storage, "secret_kye": storage.get("secret_key")}),
    "DataLayer decorator with a bad id": lambda storage: DataLayer(storage).cache_train_dataset("../ds", "v1"),
    "Mixture.from_config with a bad weight": lambda storage: Mixture.from_config(
        {"components": [{"dataset_id": "ds", "dataset_version": "v1", "weight": "heavy", "storage": storage}]}
    ),
    "Mixture.from_config with a bad version": lambda storage: Mixture.from_config(
        {"components": [{"dataset_id": "ds", "dataset_version": "../v", "weight": 1}]}, storage=storage
    ),
    "Mixture.from_config with a bad component storage": lambda storage: Mixture.from_config(
        {"components": [{"dataset_id": "ds", "dataset_version": "v1", "storage": {**storage, "streaming": "yes"}}]}
    ),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_public_entry_points_given_a_bad_argument_keep_the_secrets(
    entry: str, name: str, canary: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    error = raised(lambda: ENTRY_POINTS[entry](configs(canary)[name]))
    out, err = capsys.readouterr()
    assert_hidden(canary, *texts_of(error), caplog.text, out, err)


def test_read_cache_without_a_version_still_says_what_it_got(canary: str) -> None:
    error = raised(lambda: _ray_read_cache("ds", storage=configs(canary)["s3 keys"]), TypeError)
    assert "dataset_version=None" in str(error) and "'secret_key': '***'" in str(error)
    assert "'bucket': 'b'" in str(error)


def test_the_yogadl_facade_given_a_bad_argument_keeps_the_secrets(canary: str, tmp_path: Path) -> None:
    keys = configs(canary)["s3 keys"]

    def settings(**changed: Any) -> S3Configurations:
        given: dict[str, Any] = dict(
            access_key=keys["access_key"],
            secret_key=keys["secret_key"],
            endpoint_url=f"http://{CLOSED}",
            local_cache_dir=str(tmp_path),
        )
        return S3Configurations("b", "caches", **{**given, **changed})

    other_format = settings()
    other_format.cache_format = "TFRecord"
    for call in (
        lambda: S3Storage(other_format),
        lambda: S3Storage(settings(endpoint_url=f"http://minio:{canary}@bad host")),
        lambda: S3Storage(settings()).fetch("../ds", "v1"),
        lambda: S3Storage(settings()).cacheable("ds", "../v"),
    ):
        assert_hidden(canary, *texts_of(raised(call)))


@pytest.mark.parametrize(
    "target",
    [
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={canary}==",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={canary}==;"
        "BlobEndpoint=https://acct.blob.core.windows.net/",
        "s3://AKIAEXAMPLE:{canary}@bucket/caches",
        "az://container/caches?sv=2022-11-02&sig={canary}",
        "https://acct.blob.core.windows.net/container?sv=2022-11-02&sig={canary}",
    ],
)
def test_a_storage_string_carrying_a_secret_is_refused_without_quoting_it(
    target: str, canary: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    error = raised(lambda: open_store(target.format(canary=canary)), ConfigError)
    assert_hidden(canary, *texts_of(error))
    assert "carries a secret" in str(error)
    # Not taken for a directory: nothing named after the key was created.
    assert not [path for path in tmp_path.rglob("*") if canary in str(path)]


def test_a_client_refusing_an_endpoint_does_not_quote_its_password(canary: str) -> None:
    storage = {**configs(canary)["s3 keys"], "endpoint_url": f"http://minio:{canary}@bad host:9000"}
    error = raised(lambda: open_store(storage), ConfigError)
    assert_hidden(canary, *texts_of(error))
    assert "Invalid endpoint" in str(error)


# -- config files with a syntax error on the credential line -----------------------------------
def broken_files(canary: str) -> dict[str, str]:
    """Config files whose credential line (holding the canary) is malformed, one per way."""
    key = f"-----BEGIN PRIVATE KEY-----\\nMIIEv{canary}QIBADANBgkqhkiG9w0BAQEFAASC\\n-----END PRIVATE KEY-----\\n"
    return {
        "s3-unclosed-quote.yaml": f'type: s3\nbucket: b\nsecret_key: "{canary}Secret\naccess_key: AKIAEXAMPLE\n',
        "s3-colon-in-key.yaml": f"type: s3\nbucket: b\nsecret_key: {canary}: tail\n",
        "s3-alias.yaml": f"type: s3\nbucket: b\nsecret_key: *{canary}\n",
        "s3-tag.yaml": f"type: s3\nbucket: b\nsecret_key: !{canary} x\n",
        "s3-tab.yaml": f"type: s3\nbucket: b\n\tsecret_key: {canary}\n",
        "s3-indent.yaml": f"type: s3\nbucket: b\n  access_key: AKIAEXAMPLE\n secret_key: {canary}\n",
        "azure-connection-string.yaml": (
            f'data_layer:\n  type: azure\n  bucket: c\n  connection_string: "AccountName=a;AccountKey={canary}==\n'
        ),
        "azure-sas.yaml": f"type: azure\nbucket: c\naccount_url: https://a.blob.core.windows.net/?sig={canary}: x\n",
        "gcs-service-account.yaml": (
            f'type: gcs\nbucket: b\ncredentials: {{"type": "service_account", "private_key": "{key}",\n'
        ),
        "s3.json": f'{{"type": "s3", "bucket": "b", "secret_key": "{canary}" "access_key": "x"}}',
        "azure.json": f'{{"type": "azure", "bucket": "c", "connection_string": "AccountKey={canary}\n"}}',
    }


FILE_NAMES = list(broken_files("x"))


@pytest.mark.parametrize("file_name", FILE_NAMES)
def test_a_config_file_with_a_broken_credential_line_is_an_error_without_the_key(
    file_name: str, canary: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / file_name
    path.write_text(broken_files(canary)[file_name])
    caplog.set_level(logging.DEBUG)
    for call in (lambda: load_config_file(path), lambda: open_store(path), lambda: load_mixture(path)):
        error = raised(call, ConfigError)
        assert str(path) in str(error) and "line " in str(error)  # it still says where
        assert_hidden(canary, *texts_of(error), caplog.text)


# -- the CLI -----------------------------------------------------------------------------------
def write_config(path: Path, storage: dict[str, Any]) -> Path:
    path.write_text(json.dumps(storage))
    return path


#: Every command, with a bad argument (a bad name: refused before any request).
COMMANDS: dict[str, list[str]] = {
    "ls": ["ls", "--json", "s3://AKIAEXAMPLE:{canary}@bucket/caches"],  # the URL after the command, by mistake
    "info": ["info", "ds", "../v"],
    "verify": ["verify", "ds", "../v"],
    "rm": ["rm", "ds", "../v", "-y"],
    "build": ["build", "ds", "../v", "no_such_module:make"],
    "pull": ["pull", "ds", "../v"],
    "push": ["push", "ds", "../v"],
    "copy": ["copy", "ds", "../v", "--from", "{config}", "--to", "{config}"],
    "migrate": ["migrate", "ds", "../v"],
    "gc": ["gc", "--limit", "lots"],
    "export": ["export", "ds", "../v", "--to", "{tmp}"],
    "import": ["import", "https://host/x.tar?X-Amz-Credential=AKIA/x&X-Amz-Signature={canary}", "--id", "ds"],
}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> tuple[int, str]:
    """Runs the CLI's main; its exit code and everything it said (stdout, stderr, log records)."""
    caplog.set_level(logging.DEBUG)
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's usage errors
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out + err + caplog.text


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("name", ["s3 keys", "azure connection string", "azure sas in account_url"])
def test_every_cli_command_at_verbose_with_a_bad_argument_keeps_the_secrets(
    command: str, name: str, canary: str, tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    config = write_config(tmp_path / "storage.json", configs(canary)[name])
    argv = [part.format(canary=canary, config=config, tmp=tmp_path) for part in COMMANDS[command]]
    code, said = run_cli(["-v", "--storage", str(config), *argv], capsys, caplog)
    assert code != 0, said
    assert_hidden(canary, said)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("broken", ["bad setting", "s3-unclosed-quote.yaml", "azure-connection-string.yaml", "s3.json"])
def test_every_cli_command_at_verbose_with_a_broken_config_file_keeps_the_secrets(
    command: str, broken: str, canary: str, tmp_path: Path, capsys: Any, caplog: Any
) -> None:
    if broken == "bad setting":
        config = write_config(tmp_path / "storage.json", {**configs(canary)["s3 keys"], "local_cache_limit": "lots"})
    else:
        config = tmp_path / broken
        config.write_text(broken_files(canary)[broken])
    argv = [part.format(canary=canary, config=config, tmp=tmp_path) for part in COMMANDS[command]]
    code, said = run_cli(["-v", "--storage", str(config), *argv], capsys, caplog)
    assert code != 0, said
    assert_hidden(canary, said)


def test_the_cli_process_at_verbose_prints_no_key(canary: str, tmp_path: Path) -> None:
    broken = tmp_path / "storage.yaml"
    broken.write_text(broken_files(canary)["s3-unclosed-quote.yaml"])
    endpoint = write_config(
        tmp_path / "endpoint.json", {**configs(canary)["s3 keys"], "endpoint_url": f"http://minio:{canary}@bad host"}
    )
    for config in (broken, endpoint):
        done = subprocess.run(
            [sys.executable, "-m", "yogacache", "-v", "--storage", str(config), "ls"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert done.returncode == 1 and "yogacache: error:" in done.stderr, done.stderr
        assert_hidden(canary, done.stdout, done.stderr)


def test_the_cli_prints_a_failure_it_does_not_name_with_a_scrubbed_traceback(canary: str, tmp_path: Path) -> None:
    """A library's error quoting a signed URL or a connection string, raised through ``build``:
    the traceback is printed (a failure no handler names), scrubbed."""
    (tmp_path / "failing_source.py").write_text(
        "def make():\n"
        f"    raise RuntimeError('GET https://acct.blob.core.windows.net/c/k?sv=2022-11-02&sig={canary} failed; '\n"
        f"                       'AccountName=acct;AccountKey={canary}==')\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "yogacache",
            "-v",
            "--storage",
            str(tmp_path / "caches"),
            "build",
            "ds",
            "v1",
            "failing_source:make",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr and "RuntimeError: GET https://acct.blob.core.windows.net/c/k?" in done.stderr
    assert_hidden(canary, done.stdout, done.stderr)


# -- log records -------------------------------------------------------------------------------
#: Modules that import a framework or a cluster library (slow to import); the source scan below
#: covers their loggers.
HEAVY = (
    "yogacache.tensorflow",
    "yogacache.torch",
    "yogacache.ray",
    "yogacache.grain",
    "yogacache.parallel.ray",
    "yogacache.determined",
)


def yogacache_loggers() -> dict[str, logging.Logger]:
    """The module-level loggers of yogacache's modules (but the heavy ones)."""
    found = {}
    for module_info in pkgutil.walk_packages(yogacache.__path__, "yogacache."):
        if module_info.name.endswith("__main__") or module_info.name.startswith(HEAVY):
            continue  # running __main__ is the command line
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:
            continue
        for value in vars(module).values():
            if isinstance(value, logging.Logger) and value.name.startswith("yogacache"):
                found[value.name] = value
    return found


def test_every_yogacache_logger_is_made_by_the_redaction_module() -> None:
    """A filter on the ``yogacache`` logger is not consulted for its children's records: each
    module's logger must carry it, so each is made by ``redaction.get_logger``."""
    made_plainly = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "yogacache").rglob("*.py"))
        if path.name != "redaction.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\w+\s*(:[^=]+)?=\s*logging\.getLogger\(", line)
    ]
    assert not made_plainly


def test_every_yogacache_logger_scrubs_its_records(canary: str, caplog: pytest.LogCaptureFixture) -> None:
    loggers = yogacache_loggers()
    assert {"yogacache.store.remote", "yogacache.backends.base", "yogacache.progress"} <= set(loggers)
    storage = configs(canary)["azure connection string"]
    caplog.set_level(logging.DEBUG)
    for name, logger in loggers.items():
        try:
            raise RuntimeError(f"a library quoting the request: {storage['connection_string']}")
        except RuntimeError:
            logger.warning("opening %s", storage, exc_info=True)
        assert caplog.records[-1].name == name
    assert len(caplog.records) == len(loggers)
    assert_hidden(canary, caplog.text, *(record.getMessage() for record in caplog.records))


def test_a_configured_secret_is_scrubbed_wherever_a_library_quotes_it(canary: str) -> None:
    storage = configs(canary)["s3 keys"]
    text = f"botocore: signature for {storage['secret_key']} rejected ({storage['access_key']})"
    assert storage["secret_key"] in redaction.redact_text(text)  # not configured yet: a bare value
    parse_config(storage)
    assert_hidden(canary, redaction.redact_text(text))


# -- the rules of the one redaction ------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "{{'secret_key': '{c}', 'access_key': 'AKIA{c}'}}",
        '{{"connection_string": "DefaultEndpointsProtocol=https;AccountKey={c};EndpointSuffix=x"}}',
        "AccountKey={c}==;",
        "SharedAccessSignature=sv=2022&sig={c}",
        "https://a.blob.core.windows.net/c/k?sv=2022-11-02&se=2030&sig={c}%3D&sp=r",
        "sv=2022-11-02&ss=b&sig={c}",
        "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA{c}%2F&X-Amz-Signature={c}",
        "https://storage.googleapis.com/b/k?X-Goog-Credential=sa%40p&X-Goog-Signature={c}",
        "https://user:{c}@host:9000/path",
        "secret_key: {c}",
        '  secret_key: "{c}\n      ^',
        "AWS_SECRET_ACCESS_KEY={c} AZURE_STORAGE_KEY={c}",
        "credential={c}",
        '"private_key": "-----BEGIN PRIVATE KEY-----\\nMII{c}\\n-----END PRIVATE KEY-----\\n"',
        "-----BEGIN RSA PRIVATE KEY-----\nMII{c}",
    ],
)
def test_redact_text_masks_every_shape_of_secret(text: str, canary: str) -> None:
    given = text.format(c=canary)
    assert canary in given
    assert_hidden(canary, redaction.redact_text(given))
    assert redaction.MASK in redaction.redact_text(given)


@pytest.mark.parametrize(
    "text",
    [
        "abfs://container@account.dfs.core.windows.net/caches",
        "s3://bucket/caches/ds/v1/manifest.json",
        "Azure at http://127.0.0.1:10000/devstoreaccount1 refused the credentials (HTTP 403 AuthenticationFailed)",
        "set access_key/secret_key in the config, or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
        "secret_key=None",
    ],
)
def test_redact_text_keeps_what_is_no_secret(text: str) -> None:
    assert redaction.redact_text(text) == text
