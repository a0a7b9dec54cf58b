"""Where a streaming reader is in the read order it announced, and which parts it still needs.

Readers announce their order (``StreamingParts.expect``): this epoch's parts in order of first
use, then the next epoch's. ``ReadOrder`` follows where the reader is *in the current epoch* (a
part read again is not a step into the next epoch) and how far back it comes to parts it read
before (the window of parts it mixes), so that ``store.streaming`` fetches ahead of it and
evicts nothing it still reads. Pure bookkeeping, no I/O; its caller holds the lock. A step of
the reader costs O(1) and an answer of ``needed`` what it returns (at most its ``limit``), not
the length of the order: a cache of 100,000 parts pays per epoch, not per step.
"""

from __future__ import annotations

from typing import Optional


class ReadOrder:
    """One reader's announced order and its place in it."""

    def __init__(self) -> None:
        self.order: list[int] = []  # this epoch's parts in order of first use, then the next's
        self.current = 0  # how many of ``order`` are this epoch's
        self.first: dict[int, int] = {}  # part -> its place in this epoch's part of ``order``
        self.position = 0  # where in ``order`` the reader is: its latest new part this epoch
        # How far behind ``position`` the reader comes back to parts (the window of parts it
        # mixes, less one): learned from its reads, kept across epochs.
        self.lag = 0
        # The parts of the epochs after this one (``order[current:]``), made when first asked.
        self._later: Optional[frozenset[int]] = None

    def set(self, order: list[int], current: Optional[int]) -> None:
        """A new order: ``current`` of it this epoch's (None: up to the first part named twice)."""
        if current is None:
            seen: set[int] = set()
            current = len(order)
            for place, index in enumerate(order):
                if index in seen:
                    current = place
                    break
                seen.add(index)
        self.order, self.current, self.position = order, max(0, min(current, len(order))), 0
        self.first = {}
        self._later = None
        for place, index in enumerate(order[: self.current]):
            self.first.setdefault(index, place)

    def advance(self, index: int) -> None:
        """Notes that the reader reads part ``index``: a part new to this epoch
        moves its position there; a part it read before this epoch shows how far back it reads
        (``lag``). Only a part this epoch does not read at all moves it into the next epoch."""
        place = self.first.get(index)
        if place is None:
            if self._later is None:
                self._later = frozenset(self.order[self.current :])
            if index not in self._later:
                return  # not in the announced order (a random read): where it is stays
            self.set(self.order[self.current :], None)  # the reader went on into the next epoch unannounced
            place = self.first.get(index)
            if place is None:
                return
        if place >= self.position:
            self.position = place
        else:
            self.lag = max(self.lag, self.position - place)

    def needed(self, limit: Optional[int] = None) -> tuple[list[int], int, int]:
        """(parts, keep, start): what the reader needs from here on, in order -- the parts of
        this epoch it may still come back to, then ``order`` from its position --, the first
        ``limit`` of them (None: all); how many of those a fetch ahead must leave on the node:
        the rest of this epoch and the parts the next one starts with (as many as the reader
        reads at a time); and where in ``order`` the list starts."""
        start = self.start
        keep = max(0, self.current - start) + min(self.lag + 1, len(self.order) - self.current)
        return self.order[start : None if limit is None else start + limit], keep, start

    @property
    def start(self) -> int:
        """Where in ``order`` what the reader needs from here on starts (see ``needed``)."""
        return self.position if self.position >= self.current else max(0, self.position - self.lag)
