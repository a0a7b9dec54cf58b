"""The errors of an export."""

from __future__ import annotations

from yogacache.errors import YogaCacheError


class ExportError(YogaCacheError):
    """An export failed; no index was written at the destination."""


class DestinationNotEmptyError(ExportError):
    """The export destination holds files already (``overwrite=True`` replaces an export there)."""
