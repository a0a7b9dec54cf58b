"""ReadSchedule: which records one rank reads, epoch after epoch, from a resume point.

The order itself is the shuffle mode's (``yogacache.read.shuffle``: ``"shard"``, YogaDL's, or
``"global"``); the schedule adds what every mode shares: the start point (``start_offset`` or a
resume state), moving a point on by a number of records, and resume states, small dicts that go
into checkpoints. Pure numpy, no I/O.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Mapping, Optional

from yogacache import redaction
from yogacache.arguments import as_int
from yogacache.read.layout import PartLayout, PartUse
from yogacache.read.options import ReadOptions
from yogacache.read.shuffle import (
    STATE_VERSION,
    ArrayPlan,
    EpochPlan,
    GlobalPlan,
    ResumeState,
    ShuffleMode,
    is_mixture_state,
    shuffle_mode,
)

__all__ = ["ArrayPlan", "EpochPlan", "GlobalPlan", "ReadSchedule", "ResumeState", "STATE_VERSION"]

log = redaction.get_logger(__name__)
# What fitting orders to budgets changed, said once per process each.
_FITTED: set[str] = set()


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside yogacache."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("yogacache."):
        level, frame = level + 1, frame.f_back  # type: ignore[assignment]
    return level


class ReadSchedule:
    """The read order of one rank over ``num_records`` records, as ``options`` define it.

    ``options.start_offset`` counts records of this rank (YogaDL's meaning, in every mode);
    ``options.resume_state`` (a ``ResumeState`` dict) is the exact alternative, valid at any
    world size in global mode. ``start`` is the resulting ``(epoch, position)``, where the mode
    defines what ``position`` counts (see ``yogacache.read.shuffle``).
    """

    def __init__(
        self,
        num_records: int,
        options: ReadOptions,
        layout: Optional[PartLayout] = None,
        *,
        budget_bytes: Optional[int] = None,
    ) -> None:
        """``budget_bytes``: the node-local byte budget a streamed cache is read under (the
        reader's ``streaming_budget``); the order is fitted to it (``fit_budget``)."""
        self.num_records = as_int(num_records, "num_records")
        if self.num_records < 0:
            raise ValueError(f"num_records must not be negative, got {self.num_records}")
        self.options = options
        # ``layout``: the cache's parts (``PartLayout.from_manifest``), which the parts mode
        # orders and every mode's ``parts_needed`` reports on.
        self.order: ShuffleMode = shuffle_mode(options.shuffle_mode).with_layout(self.num_records, options, layout)
        self.fit_budget(budget_bytes)
        if self.num_records and len(self.order) == 0:
            remainder = " and drop_shard_remainder=True drops them all" if options.drop_shard_remainder else ""
            warnings.warn(
                f"rank {options.shard_rank} of {options.num_shards} reads no records: the dataset "
                f"has {self.num_records} record(s), fewer than num_shards{remainder}. Use fewer "
                "shards or a larger dataset",
                UserWarning,
                stacklevel=_caller_level(),
            )
        self.start: tuple[int, int]
        if options.resume_state is not None:
            self.start = self.resume_point(options.resume_state)
        else:
            self.start = self.order.start(options.start_offset)

    def fit_budget(self, budget_bytes: Optional[int]) -> None:
        """Fits the order to a streamed cache's node-local byte budget (``ShuffleMode.fit_budget``:
        the ``"parts"`` mode narrows its window to what the budget holds), saying once per
        process what changed. Call it before reading; later calls change nothing more."""
        change = self.order.fit_budget(budget_bytes)
        if change is not None and change not in _FITTED:
            _FITTED.add(change)
            log.warning("%s", change)

    @property
    def mode(self) -> str:
        return self.order.name

    @property
    def seed(self) -> Optional[int]:
        return self.options.shuffle_seed

    @property
    def shard_rank(self) -> int:
        return self.options.shard_rank

    @property
    def num_shards(self) -> int:
        return self.options.num_shards

    # -- lengths --------------------------------------------------------------------------
    def __len__(self) -> int:
        """Records this rank reads in a whole epoch."""
        return len(self.order)

    def remaining(self, position: int) -> int:
        """Records this rank reads in an epoch that starts at ``position``."""
        return self.order.remaining(position)

    # -- plans ----------------------------------------------------------------------------
    def plan(self, epoch: int, position: int = 0) -> EpochPlan:
        """What this rank reads of ``epoch`` from ``position`` (see ``start``) on."""
        return self.order.plan(epoch, position)

    def parts_needed(self, epoch: int, position: int = 0) -> list[PartUse]:
        """The parts this rank reads of ``epoch`` from ``position`` on, in order of first use
        (``ShuffleMode.parts_needed``): what a streaming reader fetches ahead and evicts last."""
        return self.order.parts_needed(epoch, position)

    # -- resume points --------------------------------------------------------------------
    def advance(self, point: tuple[int, int], records: int) -> tuple[int, int]:
        """The ``(epoch, position)`` after this rank read ``records`` more records from ``point``."""
        return self.order.advance(point, records)

    def state(self, point: tuple[int, int], records: int = 0) -> dict[str, Any]:
        """The resume state (a small dict) after reading ``records`` more records from ``point``."""
        epoch, position = self.advance(point, records)
        per_shard = self.order.resumes_per_shard
        state = ResumeState(
            mode=self.mode,
            epoch=epoch,
            consumed=position,
            seed=self.seed,
            num_records=self.num_records,
            shard_rank=self.shard_rank if per_shard else None,
            num_shards=self.num_shards if per_shard else None,
            settings=self.order.state_settings(),
        )
        return state.updated(self.order.state_fields(epoch, position)).to_dict()

    def order_settings(self) -> dict[str, Any]:
        """Everything that decides this rank's order, values fitted to a budget included: what a
        resume state is checked against (``ShuffleMode.order_settings``), this rank's place, and
        what a resume honours (``ShuffleMode.reader_settings``: values fitted to the budget).
        Grain's checkpoint check sees it through ``yogacache.grain``'s reprs
        (``yogacache.read.state.fingerprint``)."""
        options = self.options
        return {
            **self.order.order_settings(),
            "shard_rank": options.shard_rank,
            "num_shards": options.num_shards,
            "drop_shard_remainder": options.drop_shard_remainder,
            **self.order.reader_settings(),
        }

    def resume_point(self, resume_state: Mapping[str, Any]) -> tuple[int, int]:
        """The ``(epoch, position)`` a resume state names, checked against this schedule."""
        if is_mixture_state(resume_state):
            names = ", ".join(str(each[0]) for each in resume_state.get("components", []) if each)
            raise ValueError(
                f"the resume state is a mixture's ({names}), not one cache's: resume the mixture it was taken of"
            )
        state = ResumeState.from_dict(resume_state)
        self.order.check_state(state)  # the one check: every setting that decides the order, every range
        return self.order.resume_point(state)
