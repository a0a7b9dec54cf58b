"""MixtureReader: the caches of a mixture read as one, by index, as a ``CacheReader`` reads one cache.

The mixture's index space is its components' records one after the other (component ``i``'s
records from ``offsets[i]`` on); a read splits its indices by component, reads each
component's through its own ``CacheReader`` (local, synced or streamed under the node's one
byte budget), and puts them back in the order asked. ``read_schedule`` gives the mixture's
order (``yogacache.read.mixture_order``), which is all ``EpochReader`` and the adapters on it (the
read pipeline, tf.data, the torch datasets) need to read a mixture as they read a cache.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from yogacache.format.spec import describe_spec, key_path, leaf_paths, spec_leaves
from yogacache.read.layout import PartLayout
from yogacache.read.mixture_order import MixtureSchedule
from yogacache.read.reader import CacheReader

__all__ = ["MixtureReader", "component_name"]

# The pace of a component that takes no records per epoch: its parts are needed last.
UPCOMING_SCALE_LIMIT = 1 << 20


def component_name(reader: CacheReader) -> str:
    """``<dataset_id>:<dataset_version>`` of a component's cache: how states and errors name it."""
    manifest = reader.manifest
    return f"{manifest.dataset_id}:{manifest.dataset_version}"


def _difference(one: Any, other: Any, one_name: str, other_name: str) -> str:
    """What differs between two element specs: the first leaf whose dtype or shape differs, or
    the structures where they differ."""
    paths = leaf_paths(one)
    if paths == leaf_paths(other):
        for path, a, b in zip(paths, spec_leaves(one), spec_leaves(other)):
            if a != b:
                where = key_path(path) or "the element"
                return f"{where}: {a.dtype} {a.shape} in {one_name}, {b.dtype} {b.shape} in {other_name}"
    return f"{describe_spec(one)} in {one_name}, {describe_spec(other)} in {other_name}"


class MixtureReader:
    """Reads the records of several caches with equal element specs as one index space.

    ``counts``: each component's records per epoch (``yogacache.read.mixture_order.mixture_counts``).
    """

    def __init__(self, readers: Sequence[CacheReader], counts: Sequence[int], *, rotate: bool = True) -> None:
        """``rotate=False``: every epoch reads the same records of a downsampled component
        (``MixedOrder.draw_epoch``), as evaluation wants."""
        self.rotate = rotate
        self.readers = list(readers)
        if not self.readers:
            raise ValueError("a mixture needs at least one component")
        self.names = tuple(component_name(reader) for reader in self.readers)
        first = self.readers[0]
        for name, reader in zip(self.names[1:], self.readers[1:]):
            if reader.spec != first.spec:
                raise ValueError(
                    f"mixture components {self.names[0]} and {name} have different element specs "
                    f"({_difference(first.spec, reader.spec, self.names[0], name)}): cache one "
                    "mapped to the other's spec (a decorated builder over it) and mix that"
                )
        self.counts = tuple(int(count) for count in counts)
        if len(self.counts) != len(self.readers):
            raise ValueError(f"a mixture of {len(self.readers)} components got {len(self.counts)} counts")
        self.sizes = np.array([len(reader) for reader in self.readers], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.layouts = [PartLayout.from_manifest(reader.manifest) for reader in self.readers]
        self.part_bases = np.concatenate([[0], np.cumsum([layout.num_parts for layout in self.layouts])[:-1]])
        self.directory = Path(f"mixture({', '.join(self.names)})")  # names it in messages
        self._pace_parts()

    def _pace_parts(self) -> None:
        """Tells each streamed component how long it reads a part against the others: a part
        of component ``i`` lasts about ``records per part / c_i`` of the epoch, so the node's
        eviction, which compares the components' announced orders, compares them by when each
        part is needed (the fastest-moving component's parts count 1 each); and how many
        streamed components share the budget's room for fetches ahead."""
        lasting = [
            (len(reader) / max(1, len(reader.manifest.parts))) / count if count else float("inf")
            for reader, count in zip(self.readers, self.counts)
        ]
        shortest = min(lasting)
        streamed = sum(1 for reader in self.readers if reader.streamed)
        for reader, last in zip(self.readers, lasting):
            pace = last / shortest if math.isfinite(last) else float(UPCOMING_SCALE_LIMIT)
            reader.set_part_pace(pace, sharing=streamed)

    # -- what CacheReader answers ------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def spec(self) -> Any:
        return self.readers[0].spec

    @property
    def codec(self) -> Any:
        return self.readers[0].codec

    @property
    def epoch_size(self) -> int:
        return sum(self.counts)

    @property
    def layout(self) -> PartLayout:
        """The components' parts one after the other (part numbers from ``part_bases``)."""
        return PartLayout.from_counts(
            np.concatenate([layout.records for layout in self.layouts]),
            np.concatenate([layout.sizes for layout in self.layouts]),
        )

    @property
    def average_record_bytes(self) -> int:
        return max(reader.average_record_bytes for reader in self.readers)

    def read_schedule(self, options: Any) -> MixtureSchedule:
        """The mixture's order for one rank as ``options`` say (``options.shuffle_mode``: each
        component's own order), fitted to the node's byte budget."""
        return MixtureSchedule(
            self.names,
            self.sizes.tolist(),
            self.counts,
            self.layouts,
            options,
            budget_bytes=self.streaming_budget,
            rotate=self.rotate,
        )

    def _split(self, indices: Any) -> list[tuple[int, np.ndarray, Optional[np.ndarray]]]:
        """``indices`` by component: (component, its local indices, their positions; None when
        one component holds them all)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"record index out of range [0, {len(self)})")
        owner = np.searchsorted(self.offsets, indices, side="right") - 1
        components = np.unique(owner).tolist()
        if len(components) <= 1:
            component = components[0] if components else 0
            return [(component, indices - self.offsets[component], None)]
        return [
            (i, indices[where] - self.offsets[i], where) for i in components for where in (np.flatnonzero(owner == i),)
        ]

    def _gathered(self, indices: Any, read: Callable[[CacheReader, np.ndarray], list[Any]], count: int) -> list[Any]:
        out: list[Any] = [None] * count
        for component, local, where in self._split(indices):
            values = read(self.readers[component], local)
            if where is None:
                return values
            for position, value in zip(where.tolist(), values):
                out[position] = value
        return out

    def read_values(self, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        return self._gathered(indices, CacheReader.read_values, len(indices))

    def read_elements(self, indices: Sequence[int] | np.ndarray) -> list[Any]:
        return self._gathered(indices, CacheReader.read_elements, len(indices))

    def __getitem__(self, index: int) -> Any:
        (element,) = self.read_elements([index])
        return element

    def read_columns(self, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """One stacked array per leaf, each component's records read by its fast gather."""
        pieces = self._split(indices)
        if len(pieces) == 1:
            component, local, _ = pieces[0]
            return self.readers[component].read_columns(local)
        count = len(indices)
        out: Optional[list[np.ndarray]] = None
        for component, local, where in pieces:
            columns = self.readers[component].read_columns(local)
            if out is None:
                out = [np.empty((count, *column.shape[1:]), dtype=column.dtype) for column in columns]
            for target, column in zip(out, columns):
                target[where] = column
        return out if out is not None else [np.empty(0) for _ in spec_leaves(self.spec)]

    # -- streaming ---------------------------------------------------------------------------
    @property
    def streamed(self) -> bool:
        return any(reader.streamed for reader in self.readers)

    @property
    def streaming_budget(self) -> Optional[int]:
        """The node's byte budget the streamed components share (their local root's limit)."""
        budgets = [reader.streaming_budget for reader in self.readers if reader.streaming_budget is not None]
        return min(budgets) if budgets else None

    def _component_part(self, part: int) -> tuple[int, int]:
        component = int(np.searchsorted(self.part_bases, part, side="right") - 1)
        return component, int(part - self.part_bases[component])

    def prefetch_part(self, index: int) -> None:
        component, part = self._component_part(index)
        self.readers[component].prefetch_part(part)

    def expect_parts(self, epochs: Callable[[], Sequence[Sequence[int]]]) -> None:
        """Tells each streamed component the parts it reads, in order of first use (the
        mixture's parts, numbered across components, split by component)."""
        if not self.streamed:
            return
        per_component: list[list[list[int]]] = [[] for _ in self.readers]
        for parts in epochs():
            lists: list[list[int]] = [[] for _ in self.readers]
            for part in parts:
                component, local = self._component_part(int(part))
                lists[component].append(local)
            for mine, listed in zip(per_component, lists):
                mine.append(listed)
        for reader, lists in zip(self.readers, per_component):
            reader.expect_parts(lambda lists=lists: lists)  # type: ignore[misc]

    # -- life ----------------------------------------------------------------------------------
    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    @property
    def closed(self) -> bool:
        return all(reader.closed for reader in self.readers)

    def __enter__(self) -> MixtureReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
