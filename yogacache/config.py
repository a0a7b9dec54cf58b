"""Storage configuration: Determined's ``data_layer`` schema as frozen, validated dataclasses."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from yogacache import redaction
from yogacache.errors import ConfigError
from yogacache.sizes import format_size, parse_part_bytes, parse_size


def _explain_unknown(unknown: list[Any], allowed: set[str]) -> str:
    """``hots_storage_path (did you mean host_storage_path?)``, and the valid keys."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), sorted(allowed), n=1, cutoff=0.6)
        parts.append(f"{key} (did you mean {close[0]}?)" if close else str(key))
    return "; ".join(parts) + f"; valid keys: {', '.join(sorted(allowed))}"


def _optional_abs_path(raw: Mapping[str, Any], key: str) -> Optional[str]:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"data_layer.{key} must be a non-empty path string or null")
    if not Path(value).is_absolute():
        raise ConfigError(f"data_layer.{key} must be an absolute path, got {value!r}")
    return value


def _required_str(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"data_layer.{key} is required and must be a non-empty string")
    return value


def _optional_str(raw: Mapping[str, Any], key: str) -> Optional[str]:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"data_layer.{key} must be a string or null")
    return value


@dataclass(frozen=True)
class SharedFSConfig:
    """``{"type": "shared_fs", "host_storage_path": ..., "container_storage_path": ...}``."""

    host_storage_path: Optional[str] = None
    container_storage_path: Optional[str] = None
    # The size past which a build rolls to a new part (None: the store's default, 1 GiB).
    part_bytes: Optional[int] = None

    @property
    def storage_path(self) -> Optional[Path]:
        """What this process sees: the container path when set, else the host path."""
        chosen = self.container_storage_path or self.host_storage_path
        return Path(chosen) if chosen else None


@dataclass(frozen=True, repr=False)
class _CloudConfig:
    bucket: str
    bucket_directory_path: str
    local_cache_host_path: Optional[str] = None
    local_cache_container_path: Optional[str] = None
    # Copies of this storage's caches nearer the readers, nearest first (see store.mirrors).
    mirrors: tuple[Any, ...] = ()
    # Streaming reads (parts fetched on demand into a node-local part cache, docs/streaming.md)
    # and the byte budget of node-local data; both off by default.
    streaming: bool = False
    local_cache_limit: Optional[int] = None
    # The size past which a build rolls to a new part (None: the store's default, 64 MiB on object stores).
    part_bytes: Optional[int] = None

    @property
    def local_cache_path(self) -> Optional[Path]:
        chosen = self.local_cache_container_path or self.local_cache_host_path
        return Path(chosen) if chosen else None

    @property
    def url(self) -> str:
        """The storage URL of the bucket directory (``s3://`` or ``gs://``)."""
        return f"{self.scheme}://{self.bucket}/{self.bucket_directory_path.strip('/')}"

    scheme = ""

    def __post_init__(self) -> None:
        # The secrets given are scrubbed from every message redacted from now on, a cloud
        # library's included (see yogacache.redaction).
        redaction.remember_config({each.name: getattr(self, each.name) for each in fields(self)})

    def __repr__(self) -> str:
        return redaction.config_repr(self)

    def backend_options(self) -> dict[str, Any]:
        """Settings the backend takes besides the URL (credentials, endpoint)."""
        return {}


@dataclass(frozen=True, repr=False)
class S3Config(_CloudConfig):
    """``{"type": "s3", "bucket", "bucket_directory_path", ...}``; secrets never appear in repr."""

    access_key: Optional[str] = field(default=None, repr=False)
    secret_key: Optional[str] = field(default=None, repr=False)
    endpoint_url: Optional[str] = None

    scheme = "s3"

    def backend_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint_url, "access_key": self.access_key, "secret_key": self.secret_key}


@dataclass(frozen=True, repr=False)
class GCSConfig(_CloudConfig):
    """``{"type": "gcs", "bucket", "bucket_directory_path", ...}``."""

    scheme = "gs"


@dataclass(frozen=True, repr=False)
class AzureConfig(_CloudConfig):
    """``{"type": "azure", "bucket": container, "bucket_directory_path", ...}``: the account from
    ``connection_string`` or ``account_url`` (+ ``credential``: a key or SAS token), else from the
    ``AZURE_STORAGE_*`` variables; secrets never appear in repr."""

    connection_string: Optional[str] = field(default=None, repr=False)
    account_url: Optional[str] = None
    credential: Optional[str] = field(default=None, repr=False)

    scheme = "az"

    def backend_options(self) -> dict[str, Any]:
        return {
            "connection_string": self.connection_string,
            "account_url": self.account_url,
            "credential": self.credential,
        }


StorageConfig = Union[SharedFSConfig, S3Config, GCSConfig, AzureConfig]
#: Every `data_layer` type by the name its "type" key gives (a new backend's config is one entry).
CONFIG_TYPES: dict[str, type] = {"shared_fs": SharedFSConfig, "s3": S3Config, "gcs": GCSConfig, "azure": AzureConfig}


def parse_config(raw: Union[Mapping[str, Any], StorageConfig, None]) -> Optional[StorageConfig]:
    """Validates a ``data_layer`` dict (``None`` means the local default)."""
    if raw is None:
        return None
    if isinstance(raw, (SharedFSConfig, S3Config, GCSConfig, AzureConfig)):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"data_layer config must be a mapping, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in CONFIG_TYPES:
        close = difflib.get_close_matches(str(kind), list(CONFIG_TYPES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"data_layer.type must be one of {sorted(CONFIG_TYPES)}, got {kind!r}{hint}")
    cls = CONFIG_TYPES[kind]
    allowed = {f.name for f in fields(cls)} | {"type"}
    unknown = sorted(set(raw) - allowed, key=str)
    if unknown:
        raise ConfigError(f"unknown data_layer keys for type {kind!r}: {_explain_unknown(unknown, allowed)}")
    if cls is SharedFSConfig:
        return SharedFSConfig(
            host_storage_path=_optional_abs_path(raw, "host_storage_path"),
            container_storage_path=_optional_abs_path(raw, "container_storage_path"),
            part_bytes=_part_bytes(raw),
        )
    host = _optional_abs_path(raw, "local_cache_host_path")
    container = _optional_abs_path(raw, "local_cache_container_path")
    if (host is None) != (container is None):
        raise ConfigError(
            "data_layer.local_cache_host_path and local_cache_container_path must be set together"
        )
    common: dict[str, Any] = dict(
        bucket=_required_str(raw, "bucket"),
        bucket_directory_path=_optional_str(raw, "bucket_directory_path") or "",
        local_cache_host_path=host,
        local_cache_container_path=container,
        mirrors=_mirrors(raw),
        **_streaming_options(raw),
    )
    check_part_budget(common["part_bytes"], common["local_cache_limit"], "data_layer.")
    if cls is S3Config:
        return S3Config(
            **common,
            access_key=_optional_str(raw, "access_key"),
            secret_key=_optional_str(raw, "secret_key"),
            endpoint_url=_optional_str(raw, "endpoint_url"),
        )
    if cls is AzureConfig:
        return AzureConfig(
            **common,
            connection_string=_optional_str(raw, "connection_string"),
            account_url=_optional_str(raw, "account_url"),
            credential=_optional_str(raw, "credential"),
        )
    return GCSConfig(**common)


def _mirrors(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    """``"mirrors": [{storage config}, ...]``: S3 or GCS storages, nearest first, without local
    cache paths (the local copies stay where the storage puts them) or mirrors of their own."""
    value = raw.get("mirrors")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ConfigError("data_layer.mirrors must be a list of storage configs (nearest first)")
    found = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ConfigError(f"data_layer.mirrors[{index}] must be a storage config mapping")
        refused = sorted({"mirrors", "local_cache_host_path", "local_cache_container_path"} & set(item))
        if refused:
            raise ConfigError(f"data_layer.mirrors[{index}] may not set {', '.join(refused)}")
        if "part_bytes" in item:
            raise ConfigError(
                f"data_layer.mirrors[{index}] may not set part_bytes: a mirror holds copies of the storage's "
                "caches, parts as they were built (set part_bytes on the storage that builds)"
            )
        try:
            mirror = parse_config(item)
        except ConfigError as error:
            raise ConfigError(f"data_layer.mirrors[{index}]: {error}") from None
        if not isinstance(mirror, _CloudConfig):
            *others, last = sorted(name for name, cls in CONFIG_TYPES.items() if issubclass(cls, _CloudConfig))
            raise ConfigError(f"data_layer.mirrors[{index}] must be an {', '.join(others)} or {last} storage")
        found.append(mirror)
    return tuple(found)


def _streaming_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``streaming`` (a bool) and ``local_cache_limit`` (a byte size such as ``"200Gi"``)."""
    streaming = raw.get("streaming", False)
    if not isinstance(streaming, bool):
        raise ConfigError(f"data_layer.streaming must be true or false, got {streaming!r}")
    limit = given = raw.get("local_cache_limit")
    if limit is not None:
        limit = parse_size(limit, "data_layer.local_cache_limit")
        if limit == 0:
            raise ConfigError("data_layer.local_cache_limit must be more than 0 bytes (or null: no limit)")
        if limit < PARTS_IN_FLIGHT * SMALLEST_PART_FILE:
            raise ConfigError(
                f"data_layer.local_cache_limit {given!r} ({limit} bytes) cannot hold the {PARTS_IN_FLIGHT} parts a "
                f"streamed read needs of any cache: a part file takes at least {format_size(SMALLEST_PART_FILE)}. "
                f'Give a size with its unit, such as "{limit}Gi" (K M G T or Ki Mi Gi Ti)'
            )
    return {"streaming": streaming, "local_cache_limit": limit, "part_bytes": _part_bytes(raw)}


def _part_bytes(raw: Mapping[str, Any]) -> Optional[int]:
    value = raw.get("part_bytes")
    return None if value is None else parse_part_bytes(value, "data_layer.part_bytes")


#: Parts a streamed read holds at once at the least: the one read and the next one fetched.
PARTS_IN_FLIGHT = 2

#: The least a part file takes, whatever its records: LMDB's two meta pages and a leaf page of
#: 4 KiB. A budget under two of them holds no cache at all (checked when a config is read; a
#: budget against a cache's own parts is checked when the cache is opened).
SMALLEST_PART_FILE = 3 * 4096


def check_part_budget(part_bytes: Optional[int], limit: Optional[int], prefix: str = "") -> None:
    """ConfigError when a budget of ``limit`` bytes cannot hold the parts in flight of caches
    built with ``part_bytes`` parts (the check before any manifest is known; a published cache's
    own parts are checked when it is opened, ``store.streaming.check_budget``)."""
    if part_bytes is None or limit is None:
        return
    need = PARTS_IN_FLIGHT * part_bytes
    if limit < need:
        raise ConfigError(
            f"{prefix}local_cache_limit {format_size(limit)} ({limit} bytes) cannot hold the parts a streamed "
            f"read needs at once with {prefix}part_bytes {format_size(part_bytes)} ({part_bytes} bytes): the part "
            f"being read and the next one need at least {format_size(need)} ({need} bytes); set part_bytes to at "
            f"most {format_size(limit // PARTS_IN_FLIGHT)} or raise local_cache_limit to at least {format_size(need)}"
        )


def load_config_file(path: Path) -> Optional[StorageConfig]:
    """Reads a JSON or YAML file holding a ``data_layer`` dict, bare or under a ``data_layer`` key."""
    raw = read_config_mapping(path)
    if "data_layer" in raw:
        raw = raw["data_layer"]
    elif "mixture" in raw:  # a bare data_layer beside a mixture section
        raw = {key: value for key, value in raw.items() if key != "mixture"}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file {path} does not hold a data_layer mapping")
    return parse_config(raw)


def read_config_mapping(path: Path) -> Mapping[str, Any]:
    """The mapping a JSON or YAML config file holds (``data_layer:``, ``mixture:``, …)."""
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error.strerror}") from error
    # A parser's error quotes the file (PyYAML a snippet of the line at fault, which may hold a
    # key; JSON's keeps the document): the ConfigError is raised outside the handler, so that it
    # carries no such error as its context either.
    problem: Optional[str] = None
    if Path(path).suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            problem = f"is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    else:
        try:
            import yaml
        except ImportError as error:
            raise ConfigError("reading YAML config files needs PyYAML: pip install pyyaml") from error
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as error:
            problem = f"is not valid YAML: {_yaml_problem(error)}"
    if problem is not None:
        raise ConfigError(f"config file {path} {problem}")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file {path} does not hold a data_layer mapping")
    return raw


def _yaml_problem(error: Any) -> str:
    """What PyYAML found wrong and where, without the snippet of the file it quotes (the line
    at fault may be the one holding a key) and with any token it quotes scrubbed."""
    said = []
    for text, mark in (
        (getattr(error, "context", None), getattr(error, "context_mark", None)),
        (getattr(error, "problem", None), getattr(error, "problem_mark", None)),
    ):
        if text:
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            said.append(redaction.redact_quoted(str(text)) + where)
    return ": ".join(said) or type(error).__name__
