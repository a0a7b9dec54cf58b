"""``yogacache import``: cache objects into a store, with progress, and check a cache's sources.

The command line's ``import``, ``info`` (pins) and ``verify --source`` call these; they hold
what the command does, the CLI only parses arguments.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from yogacache.errors import CacheNotFoundError
from yogacache.format.manifest import Manifest
from yogacache.names import validate_name, validate_version
from yogacache.progress import Progress, format_bytes, format_duration
from yogacache.sources.errors import SourceChangedError, SourceError
from yogacache.sources.freshness import SourceCheck, check_pins, describe_changes, pins_of
from yogacache.sources.source import ObjectSource, check_policy
from yogacache.store.base import Store


class ImportProgress:
    """Objects, source bytes, records, rate and ETA of an import (ETA from the listed bytes)."""

    def __init__(self, label: str, objects: int, total_bytes: int, *, enabled: bool = True) -> None:
        self.objects = objects
        self.total_bytes = total_bytes
        self.done = (0, 0, 0)
        self._progress = Progress(label, enabled=enabled)
        self.start = time.monotonic()

    def _line(self, short: bool = False) -> str:
        objects, size, records = self.done
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = size / elapsed
        eta = (self.total_bytes - size) / rate if rate > 0 and size < self.total_bytes else None
        eta_text = f", ETA {format_duration(eta)}" if eta is not None else ""
        text = (
            f"{objects:,}/{self.objects:,} objects, {format_bytes(size)} of {format_bytes(self.total_bytes)}, "
            f"{records:,} records ({format_bytes(rate)}/s, {records / elapsed:,.0f} records/s{eta_text})"
        )
        return text

    def __call__(self, objects: int, size: int, records: int) -> None:
        self.done = (objects, size, records)
        self._progress.emit(self._line, log_prefix="importing ", completed=size, total=self.total_bytes)

    def finish(self) -> None:
        self._progress.emit(self._line, final=True, log_prefix="imported ", completed=self.done[1],
                            total=self.total_bytes)

    def close(self) -> None:
        self._progress.close()


@dataclass(frozen=True)
class ImportResult:
    manifest: Manifest
    outcome: str  # "built", "cached" (a current cache was there), "rebuilt", "stale" (kept, warned)
    check: Optional[SourceCheck] = None


def import_source(
    store: Store,
    dataset_id: str,
    source: ObjectSource,
    version: str = "auto",
    *,
    on_source_change: Optional[str] = None,
    show_progress: bool = True,
    parallel: Optional[Callable[[ObjectSource], Any]] = None,
) -> ImportResult:
    """Caches ``source`` as ``dataset_id``/``version`` (``"auto"``: derived from the pins).

    An existing cache of that version is checked against its pins first (no object is read):
    unchanged, it is kept; changed, ``on_source_change`` (default: the source's) decides.
    ``parallel``: what the store builds instead of ``source`` (``yogacache.parallel.sharded``
    with workers: one build shard per archive); its workers report their own progress.
    """
    validate_name(dataset_id, "dataset_id")
    version = source.auto_version() if version == "auto" else validate_version(version)
    policy = check_policy(on_source_change or source.on_source_change)
    try:
        existing: Optional[Manifest] = store.manifest(dataset_id, version)
    except CacheNotFoundError:
        existing = None
    if existing is not None:
        pins = pins_of(existing)
        check = check_pins(pins) if pins is not None and policy != "ignore" else None
        if check is None or not check.changed:
            return ImportResult(existing, "cached", check)
        message = describe_changes(dataset_id, version, check)
        if policy == "error":
            raise SourceChangedError(message)
        if policy == "warn":
            return ImportResult(existing, "stale", check)
    refs = source.objects()
    shown = ImportProgress(f"{dataset_id}:{version}", len(refs), sum(ref.size for ref in refs),
                           enabled=show_progress and parallel is None)
    source.progress = shown
    try:
        manifest = store.build(dataset_id, version, source if parallel is None else parallel(source))
        shown.finish()
    finally:
        shown.close()
        source.progress = None
    return ImportResult(manifest, "rebuilt" if existing is not None else "built")


def pin_lines(manifest: Manifest, limit: int = 20) -> list[str]:
    """``yogacache info``'s lines about the source pins (none for a cache not built from objects)."""
    pins = pins_of(manifest)
    if pins is None:
        return []
    objects: list[dict[str, Any]] = pins["objects"]
    total = sum(int(pin.get("size", 0)) for pin in objects)
    lines = [
        f"sources:     {len(objects):,} object(s), {format_bytes(total)}, format {pins.get('format')}, "
        f"on change: {pins.get('on_source_change', 'error')}",
    ]
    if pins.get("class_to_idx"):
        lines.append(f"classes:     {len(pins['class_to_idx'])} ({', '.join(list(pins['class_to_idx'])[:8])}...)")
    for pin in objects[:limit]:
        tokens = [f"{name}={pin[name]}" for name in ("etag", "version_id", "generation", "mtime_ns") if name in pin]
        lines.append(f"  {pin['url']}  {format_bytes(int(pin.get('size', 0)))}  {' '.join(tokens)}")
    if len(objects) > limit:
        lines.append(f"  ... and {len(objects) - limit:,} more (yogacache info --json lists them all)")
    return lines


def verify_sources(manifest: Manifest) -> SourceCheck:
    """Re-checks a cache's source pins (``yogacache verify --source``); SourceChangedError on a change."""
    pins = pins_of(manifest)
    if pins is None:
        raise SourceError(
            f"cache {manifest.dataset_id}:{manifest.dataset_version} was not built from pinned objects "
            "(yogacache.sources): it has no sources to check"
        )
    check = check_pins(pins)
    if check.changed:
        raise SourceChangedError(describe_changes(manifest.dataset_id, manifest.dataset_version, check))
    return check
