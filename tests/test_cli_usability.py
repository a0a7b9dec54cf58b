"""The ``yogacache`` command as a new user meets it: tables that fit an 80-column terminal, sizes
that say what they measure, global options anywhere, help with examples, suggestions for a
misspelt version, a missing storage directory, unreadable caches in ``ls``, a missing extra,
config typos, and the README's config table against the validator.

Commands run as real processes (``python -m yogacache``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest

from yogacache.config import CONFIG_TYPES, parse_config
from yogacache.errors import ConfigError
from yogacache.format.manifest import MANIFEST_NAME
from yogacache.store.local import CacheStore

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str, stdin: str = "", env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.pop("COLUMNS", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def _records(n: int) -> list[dict[str, Any]]:
    return [
        {"label": np.int64(i), "image": np.zeros((28, 28), np.uint8), "pair": (np.float32(i), b"x")} for i in range(n)
    ]


@pytest.fixture
def deep_root(tmp_path: Path) -> Path:
    """Caches under a long path (as on a real cluster), with n20000_train and n20000_val."""
    root = tmp_path / "a-rather-long-directory-name" / "with-several" / "levels-of-nesting" / "caches"
    store = CacheStore(root, show_progress=False)
    store.build("quickstart-images", "n20000_train", _records(1234))
    store.build("quickstart-images", "n20000_val", _records(7))
    store.build("a_dataset_with_a_really_long_identifier", "v1", _records(3))
    return root


# -- tables -------------------------------------------------------------------------------------
def test_ls_fits_an_80_column_terminal(deep_root: Path) -> None:
    result = run_cli("ls", "--storage", str(deep_root), env={"COLUMNS": "80"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(f"{len(line):3} {line}" for line in lines)
    header = lines[0]
    assert header.split()[:5] == ["DATASET", "VERSION", "RECORDS", "DISK", "CREATED"]
    # Numbers are right-aligned: the record counts end where the RECORDS header ends.
    end = header.index("RECORDS") + len("RECORDS")
    rows = [line for line in lines[1:] if len(line) > end and line[end - 1] != " "]
    assert sorted(line[:end].split()[-1] for line in rows) == ["1,234", "3", "7"], lines
    # Paths keep their end (what tells caches apart).
    assert any(line.rstrip().endswith("n20000_train") for line in lines), lines
    assert any(line.rstrip().endswith("n20000_val") for line in lines), lines
    # Piped without $COLUMNS nothing is cut: full paths, one line per cache.
    wide = run_cli("ls", "--storage", str(deep_root))
    assert str(deep_root / "quickstart-images" / "n20000_train") in wide.stdout
    assert len(wide.stdout.splitlines()) == 4


def test_info_says_what_each_size_measures_and_prints_the_element_spec(deep_root: Path) -> None:
    result = run_cli("info", "quickstart-images", "n20000_train", "--storage", str(deep_root))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"record data: +[\d.]+ (B|KiB|MiB)", out), out
    assert re.search(r"on disk: +[\d.]+ (KiB|MiB) in 1 LMDB part", out), out
    element = out[out.index("element:") :].splitlines()[1:]
    rows = [line.split() for line in element]
    assert ["image", "uint8", "(28,", "28)"] in rows, element
    assert ["label", "int64", "scalar"] in rows, element
    assert ["pair[0]", "float32", "scalar"] in rows and ["pair[1]", "string", "scalar"] in rows, element
    assert "{" not in "".join(element)  # not a JSON dump


# -- options and help ---------------------------------------------------------------------------
def test_global_options_work_before_and_after_the_command(deep_root: Path) -> None:
    def ids(result: subprocess.CompletedProcess[str]) -> list[str]:
        assert result.returncode == 0, result.stderr
        return sorted(row["dataset_version"] for row in json.loads(result.stdout))

    expected = ["n20000_train", "n20000_val", "v1"]
    assert ids(run_cli("--storage", str(deep_root), "ls", "--json")) == expected
    # A plain local store's caches are their only copies: current, not "out of date".
    rows = json.loads(run_cli("--storage", str(deep_root), "ls", "--json").stdout)
    assert [row["local_current"] for row in rows] == [True] * len(rows), rows
    assert ids(run_cli("ls", "--json", "--storage", str(deep_root))) == expected
    assert ids(run_cli("-v", "--storage", str(deep_root), "ls", "--json")) == expected
    info = run_cli("--storage", str(deep_root), "info", "quickstart-images", "n20000_val")
    assert info.returncode == 0 and "n20000_val" in info.stdout, info.stderr
    # After the command wins over before it.
    assert ids(run_cli("--storage", "/nonexistent-xyz", "ls", "--json", "--storage", str(deep_root))) == expected


def test_help_shows_examples_and_the_url_forms_of_storage() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "examples:" in result.stdout
    assert "s3://" in result.stdout and "gs://" in result.stdout
    assert "yogacache --storage s3://" in result.stdout
    sub = run_cli("ls", "--help")
    assert sub.returncode == 0 and "s3://" in sub.stdout and "gs://" in sub.stdout


# -- mistakes -----------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["info", "rm", "verify"])
def test_a_version_without_its_suffix_suggests_the_train_and_val_caches(deep_root: Path, command: str) -> None:
    before = {(e.dataset_id, e.dataset_version) for e in CacheStore(deep_root).list()}
    result = run_cli(
        command, "quickstart-images", "n20000", "--storage", str(deep_root), "-y" if command == "rm" else "-v"
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "did you mean" in result.stderr, result.stderr
    assert "quickstart-images n20000_train" in result.stderr and "quickstart-images n20000_val" in result.stderr
    assert {(e.dataset_id, e.dataset_version) for e in CacheStore(deep_root).list()} == before


def test_ls_of_a_storage_directory_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "does" / "not" / "exist"
    for args in (["ls", "--storage", str(missing)], ["--storage", str(missing), "ls", "--json"]):
        result = run_cli(*args)
        assert result.returncode == 1, result.stdout
        assert str(missing) in result.stderr and "does not exist" in result.stderr
        assert "no caches" not in result.stdout and "Traceback" not in result.stderr
    # An existing empty directory is simply empty.
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("ls", "--storage", str(empty))
    assert result.returncode == 0 and "no caches" in result.stdout


def test_a_config_typo_names_the_valid_key(tmp_path: Path) -> None:
    config = tmp_path / "data_layer.json"
    config.write_text(json.dumps({"type": "shared_fs", "hots_storage_path": str(tmp_path)}))
    result = run_cli("ls", "--storage", str(config))
    assert result.returncode == 1
    assert "hots_storage_path (did you mean host_storage_path?)" in result.stderr, result.stderr
    with pytest.raises(ConfigError, match="bucket_directry_path \\(did you mean bucket_directory_path\\?\\)"):
        parse_config({"type": "s3", "bucket": "b", "bucket_directry_path": "p", "secret_key": "S3CR3T"})
    with pytest.raises(ConfigError) as raised:
        parse_config({"type": "s3", "bucket": "b", "secret_kye": "S3CR3T"})
    assert "did you mean secret_key?" in str(raised.value) and "S3CR3T" not in str(raised.value)
    with pytest.raises(ConfigError, match="did you mean 'shared_fs'"):
        parse_config({"type": "shared-fs"})


# -- unreadable caches --------------------------------------------------------------------------
def test_ls_lists_every_cache_and_marks_the_unreadable_ones(deep_root: Path) -> None:
    (deep_root / "quickstart-images" / "n20000_val" / MANIFEST_NAME).write_text("{ not json")
    future = deep_root / "a_dataset_with_a_really_long_identifier" / "v1" / MANIFEST_NAME
    raw = json.loads(future.read_text())
    raw["format_version"] = 99
    future.write_text(json.dumps(raw))

    result = run_cli("ls", "--storage", str(deep_root))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("quickstart-images") and "n20000_train" in line and "1,234" in line for line in lines)
    marked = [line for line in lines[1:] if "unreadable" in line]
    assert len(marked) == 2, lines
    notes = [line for line in lines if re.match(r"^\[\d\] ", line)]
    assert len(notes) == 2, lines
    assert any("quickstart-images n20000_val" in n for n in notes) and any("v1" in n for n in notes)

    rows = {r["dataset_version"]: r for r in json.loads(run_cli("ls", "--json", "--storage", str(deep_root)).stdout)}
    assert set(rows) == {"n20000_train", "n20000_val", "v1"}
    assert "error" in rows["n20000_val"] and rows["n20000_val"]["records"] is None
    assert "error" not in rows["n20000_train"] and rows["n20000_train"]["records"] == 1234


# -- a missing extra ----------------------------------------------------------------------------
def _without(tmp_path: Path, library: str) -> dict[str, str]:
    """An environment where importing ``library`` fails as if it were not installed."""
    shadow = tmp_path / f"no-{library.replace('.', '-')}"
    module = shadow.joinpath(*library.split("."))
    module.parent.mkdir(parents=True, exist_ok=True)
    (module.parent / f"{module.name}.py").write_text(f"raise ImportError({f'No module named {library!r}'!r})\n")
    return {"PYTHONPATH": os.pathsep.join([str(REPO), str(shadow), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.parametrize(
    "library, url, extra",
    [("google.cloud.storage", "gs://bucket/caches", "gcs"), ("boto3", "s3://bucket/caches", "s3")],
)
@pytest.mark.parametrize(
    "command",
    [
        ["ls"],
        ["info", "ds", "v1"],
        ["verify", "ds", "v1"],
        ["rm", "-y", "ds", "v1"],
        ["pull", "ds", "v1"],
        ["push", "ds", "v1"],
        ["build", "ds", "v1", "nowhere:make"],
    ],
    ids=lambda c: c[0],
)
def test_a_missing_extra_is_one_line_with_the_install_hint(
    tmp_path: Path, library: str, url: str, extra: str, command: list[str]
) -> None:
    env = _without(tmp_path, library)
    result = run_cli(*command, "--storage", url, "--local-cache", str(tmp_path / "local"), env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("yogacache: error:") and f"yogacache[{extra}]" in lines[0], lines[0]


# -- the config table (docs/storage.md) ---------------------------------------------------------
def _readme_config_table() -> dict[str, tuple[set[str], set[str]]]:
    text = (REPO / "docs" / "storage.md").read_text()
    section = text[text.index("| type | required | optional |") :]
    table: dict[str, tuple[set[str], set[str]]] = {}
    for line in section.splitlines():
        match = re.match(r"^\| `(\w+)` \|(.*)\|(.*)\|$", line)
        if match:
            kind, required, optional = match.groups()
            table[kind] = (set(re.findall(r"`(\w+)`", required)), set(re.findall(r"`(\w+)`", optional)))
        elif table and not line.startswith("|"):
            break
    return table


def test_the_readme_config_table_matches_the_validator(tmp_path: Path) -> None:
    table = _readme_config_table()
    classes = CONFIG_TYPES  # every type the validator knows, so a new one must be in the table
    assert set(table) == set(classes)
    for kind, (required, optional) in table.items():
        assert required | optional == {f for f in classes[kind].__dataclass_fields__}, kind
        minimal: dict[str, Any] = {"type": kind, **{key: "b" for key in required}}
        parse_config(minimal)  # the required keys alone are enough
        for key in required:
            with pytest.raises(ConfigError, match=key):
                parse_config({k: v for k, v in minimal.items() if k != key})
    # The pair rule the README states.
    with pytest.raises(ConfigError, match="together"):
        parse_config({"type": "s3", "bucket": "b", "local_cache_host_path": str(tmp_path)})
    parse_config({"type": "gcs", "bucket": "b", "local_cache_host_path": "/h", "local_cache_container_path": "/c"})


# -- the command with nothing after it, and the storages it names -----------------------------------
def test_no_command_lists_the_commands() -> None:
    result = run_cli()
    assert result.returncode == 2
    for name in ("ls", "info", "verify", "rm", "build", "pull", "push", "copy", "migrate", "gc", "export", "import"):
        assert re.search(rf"^\s+{name}\s", result.stderr, re.M), f"{name} missing from:\n{result.stderr}"


def test_help_names_every_storage_scheme() -> None:
    text = run_cli("--help").stdout
    description = text.split("positional arguments:")[0]
    assert "az://" in description, description
    storage_help = text.split("options:", 1)[1].split("--storage DIR|URL|FILE", 1)[1].split("--endpoint-url")[0]
    assert "az://container/prefix" in " ".join(storage_help.split()), storage_help


def test_a_cli_error_names_the_commands_options_not_python_keywords(tmp_path: Path) -> None:
    """The library's advice names keyword arguments (``on_source_change='rebuild'``); from the
    command line the same advice names the command's options."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.txt").write_text("one")
    storage = tmp_path / "caches"
    first = run_cli("import", str(source), "--id", "docs", "--version", "v1", "--storage", str(storage))
    assert first.returncode == 0, first.stderr
    (source / "a.txt").write_text("two, longer")
    again = run_cli("import", str(source), "--id", "docs", "--version", "v1", "--storage", str(storage))
    assert again.returncode == 1, again.stderr
    assert "changed since it was built" in again.stderr, again.stderr
    assert "--on-source-change rebuild" in again.stderr and "--on-source-change ignore" in again.stderr
    assert "--version auto" in again.stderr
    assert "on_source_change=" not in again.stderr and "version='auto'" not in again.stderr


def test_a_wrong_endpoint_url_flag_is_named_as_the_flag(tmp_path: Path) -> None:
    """The endpoint that cannot be reached is the one passed: the advice names --endpoint-url, not
    the config or AWS_ENDPOINT_URL (which the advice names when no flag was given)."""
    from tests.servers import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_MAX_ATTEMPTS": "1"}
    flagged = run_cli("ls", "--storage", "s3://some-bucket/caches", "--endpoint-url", dead, env=env)
    error = flagged.stderr.strip().splitlines()[-1]  # the error (retries before it log as they go)
    assert flagged.returncode == 1 and f"cannot connect to the S3 endpoint {dead}" in error, flagged.stderr
    assert error.endswith("check --endpoint-url") and "AWS_ENDPOINT_URL" not in error, error
    from_env = run_cli("ls", "--storage", "s3://some-bucket/caches", env={**env, "AWS_ENDPOINT_URL": dead})
    assert from_env.returncode == 1 and "AWS_ENDPOINT_URL" in from_env.stderr.strip().splitlines()[-1], from_env.stderr
