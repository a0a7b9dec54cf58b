"""Redaction: the one place that knows which settings hold secrets and scrubs them from text.

Every message built from user arguments or config text passes through here before anyone sees
it: config reprs (``config_repr``), exception messages naming a user's value (``describe``),
log records of yogacache's loggers (``get_logger``, whose ``RedactingFilter`` also scrubs the
traceback a record carries), the CLI's error output and tracebacks (``format_exception``), and
the messages of malformed config files. A secret is found three ways: by the setting it is the
value of (``SECRET_FIELDS``, in a mapping or as ``key: value`` / ``key=value`` text), by its
shape (connection-string keys, signed URL parameters, URL passwords, private-key blocks), and
by its value, once a parsed config has named it (``remember``): a library's own message quoting
a configured key is scrubbed too.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

#: What a secret is replaced with.
MASK = "***"

#: Every setting that holds a secret, per backend: the ``data_layer`` keys, the YogaDL
#: configuration attributes and backend arguments, and the standard environment variables.
SECRET_FIELDS: Mapping[str, frozenset[str]] = {
    "s3": frozenset(
        {
            "access_key",
            "secret_key",
            "session_token",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
            "aws_security_token",
        }
    ),
    "gcs": frozenset(
        {
            "credentials",
            "credentials_file",
            "service_account_json",
            "service_account_info",
            "private_key",
            "private_key_id",
            "client_secret",
            "refresh_token",
            "access_token",
            "google_application_credentials",
        }
    ),
    "azure": frozenset(
        {
            "connection_string",
            "credential",
            "account_key",
            "sas_token",
            "azure_storage_key",
            "azure_storage_connection_string",
            "azure_storage_sas_token",
            "azure_client_secret",
        }
    ),
    "any": frozenset({"password", "passwd", "secret", "token", "api_key", "apikey"}),
}
_SECRET_NAMES = frozenset().union(*SECRET_FIELDS.values())

#: Settings holding a URL that may carry a secret in its query (a SAS token in an Azure
#: ``account_url``, a presigned URL) or its userinfo (``https://user:password@host``): kept,
#: with the secret parts masked.
URL_FIELDS = frozenset({"endpoint_url", "account_url", "url", "source_endpoint_url"})

#: URL query parameters (and SAS token fields) that are, or sign with, a credential.
SIGNED_PARAMETERS = frozenset(
    {
        "sig",
        "signature",
        "x-amz-signature",
        "x-amz-credential",
        "x-amz-security-token",
        "awsaccesskeyid",
        "x-goog-signature",
        "x-goog-credential",
        "googleaccessid",
        "access_token",
        "token",
        "sas",
        "key",
        "client_secret",
        "password",
    }
)
#: Fields of an Azure connection string that are secrets.
CONNECTION_STRING_SECRETS = ("AccountKey", "SharedAccessSignature", "SharedAccessKey")


def _alternatives(names: Iterable[str]) -> str:
    """A regex alternation of ``names``, longest first (``sas_token`` before ``token``)."""
    return "|".join(sorted(map(re.escape, names), key=len, reverse=True))


_QUOTED = r"""'(?:[^'\\\n]|\\.)*(?:'|$)|"(?:[^"\\\n]|\\.)*(?:"|$)"""
_BARE = r"""[^\s,;&)}\]'"]+"""
# ``secret_key: x``, ``'secret_key': 'x'``, ``"secret_key": "x"``, ``secret_key=x``,
# ``AWS_SECRET_ACCESS_KEY=x``: the name (quoted or not), ``:`` or ``=``, then the value.
_FIELD_VALUE = re.compile(
    rf"""(?P<name>(?P<q>['"]?)\b(?:{_alternatives(_SECRET_NAMES)})\b(?P=q)\s*[:=][ \t]*)(?P<value>{_QUOTED}|{_BARE})""",
    re.IGNORECASE | re.MULTILINE,
)
_CONNECTION_STRING = re.compile(
    rf"(?P<name>\b(?:{_alternatives(CONNECTION_STRING_SECRETS)})\s*=)(?P<value>[^;'\"\s]*)", re.IGNORECASE
)
# ``?sig=...&``, ``&X-Amz-Signature=...``, a bare SAS token ``sv=...&sig=...``.
_SIGNED_PARAMETER = re.compile(
    rf"(?P<name>(?:^|(?<=[?&;\s'\"(,]))(?:{_alternatives(SIGNED_PARAMETERS)})=)(?P<value>[^&#\s'\";,)]*)",
    re.IGNORECASE,
)
# ``scheme://user:password@host``: the whole userinfo (a lone name before ``@``, as the
# container of ``abfs://container@account...``, is no secret and stays).
_USERINFO = re.compile(r"(?P<name>\b[a-z][a-z0-9+.-]*://)(?P<value>[^/\s@'\"?#:]*:[^/\s@'\"?#]*)@", re.IGNORECASE)
_PRIVATE_KEY = re.compile(
    r"-----BEGIN (?P<kind>[A-Z ]*)PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)

# Secret values parsed configs named: scrubbed wherever they appear, whatever says them.
# Shorter values are left to the field and shape rules (replacing "abc" everywhere would
# garble messages without protecting anything).
_MIN_REMEMBERED = 8
_remembered: set[str] = set()
_remembered_lock = threading.Lock()


def is_secret_field(name: object) -> bool:
    """Whether a setting of this name holds a secret (any backend, any case)."""
    return isinstance(name, str) and name.lower() in _SECRET_NAMES


def remember(value: object) -> None:
    """Marks ``value`` (a configured secret) for scrubbing from every text redacted from now
    on, along with the secret parts it holds (a connection string's key, a URL's signature)."""
    if not isinstance(value, str):
        return
    found = {value} | set(_secret_parts(value))
    with _remembered_lock:
        _remembered.update(part for part in found if len(part) >= _MIN_REMEMBERED)


def remember_config(settings: Mapping[str, Any]) -> None:
    """``remember`` for every secret field and every URL field's secret parts of ``settings``
    (a ``data_layer`` mapping, nested mirrors included)."""
    for key, value in settings.items():
        if is_secret_field(key):
            remember(value)
        elif isinstance(value, str):
            for part in _secret_parts(value):
                remember(part)
        elif isinstance(value, Mapping):
            remember_config(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, Mapping):
                    remember_config(item)


def _secret_parts(text: str) -> list[str]:
    parts: list[str] = []
    for pattern in (_CONNECTION_STRING, _SIGNED_PARAMETER, _USERINFO, _FIELD_VALUE):
        parts.extend(match.group("value").strip("'\"") for match in pattern.finditer(text))
    parts.extend(match.group(0) for match in _PRIVATE_KEY.finditer(text))
    return [part for part in parts if part]


def redact_text(text: str) -> str:
    """``text`` with every secret it holds masked (see the module)."""
    if not text:
        return text
    with _remembered_lock:
        known = sorted(_remembered, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, MASK)
    text = _PRIVATE_KEY.sub(lambda match: f"-----BEGIN {match.group('kind')}PRIVATE KEY-----{MASK}", text)
    text = _CONNECTION_STRING.sub(lambda match: match.group("name") + MASK, text)
    text = _USERINFO.sub(lambda match: match.group("name") + MASK + "@", text)
    text = _SIGNED_PARAMETER.sub(lambda match: match.group("name") + MASK, text)
    return _FIELD_VALUE.sub(_mask_field_value, text)


_QUOTED_TOKEN = re.compile(r"(['\"])([^'\"\n]*)\1")


def redact_quoted(text: str) -> str:
    """``redact_text``, and every token a parser's message quotes from the document masked
    (PyYAML's ``found undefined alias 'x'`` may quote a key): single characters (``'@'``,
    ``'\\t'``) and token names (``'<scalar>'``) stay."""

    def mask(match: re.Match[str]) -> str:
        quote, token = match.groups()
        if len(token) <= 1 or re.fullmatch(r"\\.|<[a-z ]+>", token):
            return match.group(0)
        return quote + MASK + quote

    return _QUOTED_TOKEN.sub(mask, redact_text(text))


def _mask_field_value(match: re.Match[str]) -> str:
    value = match.group("value")
    quote = value[0] if value[:1] in ("'", '"') else ""
    if value in ("None", "null", "''", '""'):  # not set: nothing to hide, and worth saying
        return match.group(0)
    return f"{match.group('name')}{quote}{MASK}{quote}"


def redact_value(value: Any) -> Any:
    """A copy of ``value`` (a mapping, a list, a string) safe to show: secret fields set are
    masked, strings scrubbed by ``redact_text``; other values are returned as they are."""
    if isinstance(value, Mapping):
        return {
            key: (MASK if item is not None else None) if is_secret_field(key) else redact_value(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(item) for item in value) if type(value) in (list, tuple) else value
    if isinstance(value, str):
        return redact_text(value)
    return value


def describe(value: Any) -> str:
    """``repr(value)`` safe to put in a message: a user's argument (a ``data_layer`` mapping, a
    URL, a config, anything) with its secrets masked."""
    try:
        shown = repr(redact_value(value))
    except Exception:  # a repr that fails says nothing, and leaks nothing
        shown = f"<{type(value).__name__}>"
    return redact_text(shown)


def config_repr(config: Any) -> str:
    """The repr of a config dataclass: every field, secrets masked where set (so the repr says
    whether a key was given without saying it), URLs scrubbed."""
    shown = []
    for each in dataclasses.fields(config):
        value = getattr(config, each.name)
        if is_secret_field(each.name):
            text = "None" if value is None else repr(MASK)
        else:
            text = describe(value) if not isinstance(value, tuple) else _tuple_repr(value)
        shown.append(f"{each.name}={text}")
    return f"{type(config).__name__}({', '.join(shown)})"


def _tuple_repr(values: tuple[Any, ...]) -> str:
    items = [repr(item) if dataclasses.is_dataclass(item) else describe(item) for item in values]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def format_exception(error: BaseException) -> str:
    """The traceback of ``error`` (its causes and contexts included), scrubbed."""
    return redact_text("".join(traceback.format_exception(type(error), error, error.__traceback__)))


class RedactingFilter(logging.Filter):
    """Scrubs a log record's message, and the traceback or stack it carries, in place: every
    handler after it sees only the redacted text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let logging report it as it does
            return True
        record.msg, record.args = redact_text(message), None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = format_exception(record.exc_info[1]).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


_FILTER = RedactingFilter()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with the redacting filter (a filter on a parent logger is
    not consulted for its children's records, so each of yogacache's loggers carries it)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


def add_to_handlers(handlers: Iterable[logging.Handler]) -> None:
    """Puts the redacting filter on ``handlers`` (the CLI's own: every record it prints, a
    cloud library's included, is scrubbed)."""
    for handler in handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
