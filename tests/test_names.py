"""Dataset ids and versions are validated before any file is created, on every entry point.

Every invalid name must raise InvalidNameError (a ValueError) whose message names the argument
(``dataset_id`` or ``dataset_version``), and the storage root must still be empty afterwards:
no id directory, no lock file, no temporary directory. Valid names round-trip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yogacache
from yogacache import InvalidNameError, cli
from yogacache.storage import LFSConfigurations, LFSStorage
from yogacache.store.local import CacheStore

INVALID_NAMES: list[Any] = [
    "",
    ".",
    "..",
    "../x",
    "../../etc",
    "/etc",
    "/tmp/x",
    "a/b",
    "a\\b",
    "a\0b",
    "x" * 129,
    "x" * 1000,
    "-x",
    "--help",
    ".hidden",
    ".x.tmp-1",
    "a b",
    " a",
    "a ",
    "a\nb",
    "a\tb",
    "~",
    "~user",
    "a:b",
    "a*",
]
NON_STRINGS: list[Any] = [None, 5, 1.5, b"abc", ["a"], Path("a")]
ALL_INVALID = INVALID_NAMES + NON_STRINGS

VALID_NAMES = ["a", "0", "Z", "mnist", "ImageNet_2012", "v1.2-rc_3", "a..b", "x" * 128, "A-._"]


def _ident(value: Any) -> str:
    return repr(value)[:24]


def _data(n: int = 5) -> list[dict[str, Any]]:
    return [{"i": np.int64(i), "x": np.full(3, i, np.float32)} for i in range(n)]


def _assert_empty(root: Path) -> None:
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert found == [], f"files were created for an invalid name: {found}"


def _assert_names_argument(error: BaseException, argument: str) -> None:
    assert isinstance(error, InvalidNameError)
    assert isinstance(error, ValueError)
    assert argument in str(error), f"message does not name {argument}: {error}"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "storage"
    path.mkdir()
    return path


# -- CacheStore ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ALL_INVALID, ids=_ident)
def test_cache_store_rejects_invalid_dataset_id(root: Path, bad: Any) -> None:
    store = CacheStore(root)
    calls: list[int] = []

    def make() -> Any:
        calls.append(1)
        return _data()

    operations = [
        lambda: store.build(bad, "v1", _data()),
        lambda: store.get_or_build(bad, "v1", make),
        lambda: store.open(bad, "v1"),
        lambda: store.exists(bad, "v1"),
        lambda: store.manifest(bad, "v1"),
        lambda: store.verify_cache(bad, "v1"),
        lambda: store.remove(bad, "v1"),
        lambda: store.cache_dir(bad, "v1"),
    ]
    for operation in operations:
        with pytest.raises(InvalidNameError) as info:
            operation()
        _assert_names_argument(info.value, "dataset_id")
    assert calls == [], "the dataset function ran for an invalid name"
    _assert_empty(root)


# CacheStore is also handed internal versions ("<version>_train"), so its version limit leaves
# room for a suffix; the user-facing entry points below hold versions to MAX_NAME_LENGTH.
STORE_INVALID_VERSIONS = [name for name in ALL_INVALID if name != "x" * 129]


@pytest.mark.parametrize("bad", STORE_INVALID_VERSIONS, ids=_ident)
def test_cache_store_rejects_invalid_version(root: Path, bad: Any) -> None:
    store = CacheStore(root)
    calls: list[int] = []

    def make() -> Any:
        calls.append(1)
        return _data()

    operations = [
        lambda: store.build("ds", bad, _data()),
        lambda: store.get_or_build("ds", bad, make),
        lambda: store.open("ds", bad),
        lambda: store.exists("ds", bad),
        lambda: store.manifest("ds", bad),
        lambda: store.verify_cache("ds", bad),
        lambda: store.remove("ds", bad),
    ]
    for operation in operations:
        with pytest.raises(InvalidNameError) as info:
            operation()
        _assert_names_argument(info.value, "dataset_version")
    assert calls == []
    _assert_empty(root)


# -- LFSStorage (the YogaDL-compatible facade) --------------------------------------------


@pytest.mark.parametrize("bad", ALL_INVALID, ids=_ident)
def test_lfs_storage_rejects_invalid_names(root: Path, bad: Any) -> None:
    storage = LFSStorage(LFSConfigurations(str(root)))
    for args, argument in (((bad, "v1"), "dataset_id"), (("ds", bad), "dataset_version")):
        with pytest.raises(InvalidNameError) as info:
            storage.submit(_data(), *args)
        _assert_names_argument(info.value, argument)

        with pytest.raises(InvalidNameError) as info:
            storage.fetch(*args)
        _assert_names_argument(info.value, argument)

        # cacheable validates when it is applied, before the function could ever run.
        with pytest.raises(InvalidNameError) as info:
            storage.cacheable(*args)
        _assert_names_argument(info.value, argument)
    _assert_empty(root)


# -- DataLayer decorators (validated at decoration time) -----------------------------------


@pytest.mark.parametrize("bad", ALL_INVALID, ids=_ident)
def test_datalayer_decorators_reject_invalid_names_at_decoration(root: Path, bad: Any) -> None:
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(root)})
    for decorate in (layer.cache_train_dataset, layer.cache_validation_dataset):
        for args, argument in (((bad, "v1"), "dataset_id"), (("ds", bad), "dataset_version")):
            with pytest.raises(InvalidNameError) as info:
                decorate(*args)
            _assert_names_argument(info.value, argument)
    _assert_empty(root)


def test_datalayer_rejects_version_that_is_valid_only_with_the_suffix(root: Path) -> None:
    """A 129-character user version must not slip through because '_train' is appended later."""
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(root)})
    with pytest.raises(InvalidNameError, match="dataset_version"):
        layer.cache_train_dataset("ds", "v" * 129)
    _assert_empty(root)


# -- CLI ----------------------------------------------------------------------------------

CLI_INVALID = [
    "..",
    ".",
    "../x",
    "/etc",
    "a/b",
    "x" * 129,
    ".hidden",
    "a b",
    "-x",
]


def _cli(*args: str, env_root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, YOGACACHE_STORAGE=str(env_root))
    return subprocess.run(
        [sys.executable, "-m", "yogacache", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _cli_in_process(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, root: Path, *args: str
) -> tuple[int, str, str]:
    monkeypatch.setenv("YOGACACHE_STORAGE", str(root))
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("bad", CLI_INVALID, ids=_ident)
def test_cli_rejects_invalid_names(
    root: Path, bad: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A good cache next door must survive every attempt.
    CacheStore(root).build("good", "v1", _data())
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    for command in ("info", "verify", "rm"):
        extra = ["-y"] if command == "rm" else []
        for args, argument in (((bad, "v1"), "dataset_id"), (("good", bad), "dataset_version")):
            # "--" so that a name starting with "-" reaches yogacache rather than argparse's options.
            code, out, err = _cli_in_process(capsys, monkeypatch, root, command, *extra, "--", *args)
            assert code != 0, (command, args, out)
            assert argument in err, (command, args, err)
    after = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert after == before
    assert CacheStore(root).verify_cache("good", "v1").num_records == 5


def test_cli_process_exits_nonzero_on_invalid_names(root: Path) -> None:
    for args, argument in ((("rm", "-y", "..", "v1"), "dataset_id"), (("info", "ds", "a/b"), "dataset_version")):
        result = _cli(*args, env_root=root)
        assert result.returncode != 0
        assert argument in result.stderr
        assert "Traceback" not in result.stderr
        assert result.stdout == ""
    _assert_empty(root)


# -- valid names --------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALID_NAMES, ids=_ident)
def test_valid_names_work_everywhere(
    root: Path, name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = LFSStorage(LFSConfigurations(str(root)))
    storage.submit(_data(4), name, name)
    assert (root / name / name / "manifest.json").is_file()
    got = [int(e["i"]) for e in storage.fetch(name, name).stream()]
    assert got == [0, 1, 2, 3]

    calls: list[int] = []

    @storage.cacheable(name, name + "c" if len(name) < 128 else "c")
    def make() -> Any:
        calls.append(1)
        return _data(3)

    assert len(make()) == 3
    assert len(make()) == 3
    assert calls == [1]

    store = CacheStore(root)
    assert store.exists(name, name)
    assert store.verify_cache(name, name).dataset_id == name
    code, out, err = _cli_in_process(capsys, monkeypatch, root, "info", "--", name, name)
    assert code == 0, err
    assert name in out


def test_valid_names_work_through_datalayer(root: Path) -> None:
    layer = yogacache.DataLayer({"type": "shared_fs", "host_storage_path": str(root)})
    long_version = "v" * 128  # the longest valid version, plus the internal "_train" suffix
    for dataset_id, version in (("My-Data_1.0", "2024.01-rc_1"), ("d", long_version)):
        decorated = layer.cache_train_dataset(dataset_id, version)(lambda: _data(6))
        got = sorted(int(e["i"]) for e in decorated().as_numpy_iterator())
        assert got == list(range(6))
        assert (root / dataset_id / f"{version}_train" / "manifest.json").is_file()
