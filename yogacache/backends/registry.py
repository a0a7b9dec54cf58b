"""The backend registry: a URL scheme names an ``ObjectStore`` class, imported only when used.

As fsspec's ``registry.py``: each entry is an import string plus the hint to show when the
library behind it is missing. Adding a backend is one module implementing ``ObjectStore``
(with a ``from_url`` constructor), one line here, and one parameter of the backend contract
tests.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from yogacache import redaction
from yogacache.backends.base import ObjectStore
from yogacache.errors import ConfigError


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend class lives (``"module:Class"``) and how to install what it needs."""

    target: str
    install_hint: str = ""


BACKENDS: dict[str, BackendEntry] = {
    "file": BackendEntry("yogacache.backends.files:FileObjectStore"),
    "s3": BackendEntry("yogacache.backends.s3:S3ObjectStore", "pip install 'yogacache[s3]'"),
    "gs": BackendEntry("yogacache.backends.gcs:GCSObjectStore", "pip install 'yogacache[gcs]'"),
    "az": BackendEntry("yogacache.backends.azure:AzureObjectStore", "pip install 'yogacache[azure]'"),
}
ALIASES = {"gcs": "gs", "azure": "az", "abfs": "az", "abfss": "az"}


def backend_class(scheme: str) -> type:
    """The ``ObjectStore`` class registered for ``scheme`` (imported now)."""
    scheme = ALIASES.get(scheme, scheme)
    entry = BACKENDS.get(scheme)
    if entry is None:
        known = ", ".join(f"{name}://" for name in sorted(BACKENDS))
        raise ConfigError(f"unsupported storage scheme {scheme!r}: use one of {known} or a directory")
    module_name, _, class_name = entry.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        hint = f": {entry.install_hint}" if entry.install_hint else ""
        missing = f" ({error.name})" if error.name else ""
        raise ImportError(f"{scheme}:// storage needs a library that is not installed{missing}{hint}") from None
    return getattr(module, class_name)  # type: ignore[no-any-return]


def open_backend(url: str, **options: Any) -> ObjectStore:
    """The object store at ``url`` (``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``file:///path``); ``options`` are backend settings (``endpoint_url``, credentials,
    ``retry``), those left ``None`` dropped."""
    scheme = urlparse(url).scheme
    if not scheme:
        raise ConfigError(f"storage URL {redaction.describe(url)} has no scheme: use s3://, gs:// or file://")
    cls = backend_class(scheme)
    given = {key: value for key, value in options.items() if value is not None}
    try:
        return cls.from_url(url, **given)  # type: ignore[attr-defined,no-any-return]
    except TypeError as error:
        raise ConfigError(f"{scheme}:// storage does not take these settings: {sorted(given)}") from error
    except ConfigError:
        raise
    except ValueError as error:  # a client refusing a setting may quote it (botocore: the endpoint URL)
        refused = redaction.redact_text(str(error))
    # Raised outside the handler: the client's error, quoting the setting, is not its context.
    raise ConfigError(f"{scheme}:// storage: {refused}")


def backend_settings(scheme: str) -> frozenset[str]:
    """The settings the backend for ``scheme`` takes (its ``from_url``'s keyword arguments:
    ``endpoint_url``, ``retry``, ...), so that a caller with a setting meant for some backends
    (an object source's ``endpoint_url``) hands it only to those."""
    parameters = inspect.signature(backend_class(scheme).from_url).parameters  # type: ignore[attr-defined]
    return frozenset(name for name, parameter in parameters.items() if parameter.kind is parameter.KEYWORD_ONLY)
