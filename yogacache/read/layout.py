"""PartLayout: how a cache's records lie in its parts, and which parts a plan reads when.

What streaming asks of any order (the parts a rank needs, in order of first use) and what the
``"parts"`` mode orders. Pure numpy, no I/O.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

import numpy as np

from yogacache.read.plans import EpochPlan

if TYPE_CHECKING:
    from yogacache.format.manifest import Manifest

__all__ = ["PartLayout", "PartUse", "most_at_once", "parts_read_in_order"]


@dataclass(frozen=True, eq=False)
class PartLayout:
    """How a cache's records lie in its parts: part ``i`` holds records ``starts[i]`` to
    ``starts[i] + records[i]``, in ``sizes[i]`` bytes (0 where unknown). ``build``: the build id
    of the cache it describes (None where unknown), which resume states record."""

    records: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray = field(init=False)
    build: Optional[str] = None

    def __post_init__(self) -> None:
        records = np.asarray(self.records, dtype=np.int64).reshape(-1)
        sizes = np.asarray(self.sizes, dtype=np.int64).reshape(-1)
        if len(sizes) != len(records):
            raise ValueError(f"a part layout needs one size per part: {len(records)} parts, {len(sizes)} sizes")
        if len(records) and (records.min() < 0 or sizes.min() < 0):
            raise ValueError("part record counts and sizes must not be negative")
        starts = np.zeros(len(records), dtype=np.int64)
        np.cumsum(records[:-1], out=starts[1:])
        for name, value in (("records", records), ("sizes", sizes), ("starts", starts)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @classmethod
    def from_counts(
        cls, records: Sequence[int] | np.ndarray, sizes: Optional[Sequence[int] | np.ndarray] = None
    ) -> PartLayout:
        """Parts of ``records`` records each (in record order), of ``sizes`` bytes if known."""
        records = np.asarray(records, dtype=np.int64)
        return cls(records, np.zeros_like(records) if sizes is None else np.asarray(sizes, dtype=np.int64))

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> PartLayout:
        """The layout a cache's manifest lists (its parts hold consecutive records)."""
        parts = manifest.parts
        layout = cls.from_counts([p.num_records for p in parts], [p.size_bytes for p in parts])
        if any(p.first_record != int(s) for p, s in zip(parts, layout.starts)):
            raise ValueError(
                f"the parts of cache {manifest.dataset_id}:{manifest.dataset_version} do not hold consecutive records"
            )
        return dataclasses.replace(layout, build=manifest.build_id)

    @property
    def num_parts(self) -> int:
        return len(self.records)

    @property
    def num_records(self) -> int:
        return int(self.records.sum())

    @property
    def num_bytes(self) -> int:
        return int(self.sizes.sum())

    def part_of(self, indices: np.ndarray) -> np.ndarray:
        """The part holding each record index."""
        return np.searchsorted(self.starts, np.asarray(indices, dtype=np.int64), side="right") - 1


class PartUse(NamedTuple):
    """A part a plan reads, and the plan positions of its first and last read.

    ``first`` and ``last`` count records of the plan (``plan.indices(first, first + 1)`` may read
    the part). For ``"parts"`` mode they are the bounds of the stages that read the part: the
    first read is at ``first`` or later, the last at ``last`` or earlier.
    """

    part: int
    first: int
    last: int


def parts_read_in_order(plan: EpochPlan, layout: PartLayout, chunk: int = 1 << 16) -> list[PartUse]:
    """Every part ``plan`` reads, in order of first use, found by reading the plan's indices
    (O(records) time, O(parts) memory): what modes that touch parts at random answer."""
    unused = np.iinfo(np.int64).max
    first = np.full(layout.num_parts, unused, dtype=np.int64)
    last = np.full(layout.num_parts, -1, dtype=np.int64)
    for begin in range(0, len(plan), chunk):
        parts = layout.part_of(plan.indices(begin, begin + chunk))
        positions = begin + np.arange(len(parts), dtype=np.int64)
        np.minimum.at(first, parts, positions)
        np.maximum.at(last, parts, positions)
    used = np.flatnonzero(first != unused)
    used = used[np.argsort(first[used], kind="stable")]
    return [PartUse(int(p), int(first[p]), int(last[p])) for p in used]


def most_at_once(uses: Sequence[PartUse], layout: PartLayout) -> tuple[int, int]:
    """(parts, bytes): the most parts, and the most bytes of parts, that ``uses`` (a
    ``parts_needed`` answer) needs at once, counting a part from its first read to its last.
    What a node must hold for one reader; less than that makes it fetch parts it still needs."""
    if not uses:
        return 0, 0
    parts = np.array([use.part for use in uses], dtype=np.int64)
    first = np.array([use.first for use in uses], dtype=np.int64)
    last = np.array([use.last for use in uses], dtype=np.int64)
    sizes = layout.sizes[parts]
    # Events at each position: parts start before parts end (a part is held through ``last``).
    times = np.concatenate([first * 2, last * 2 + 1])
    order = np.argsort(times, kind="stable")
    count = np.concatenate([np.ones(len(uses), dtype=np.int64), -np.ones(len(uses), dtype=np.int64)])[order]
    held = np.concatenate([sizes, -sizes])[order]
    return int(np.cumsum(count).max()), int(np.cumsum(held).max())
