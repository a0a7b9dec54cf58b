"""ReadOrder (store.readorder): where a streaming reader is in the order it announced."""

from __future__ import annotations

from yogacache.store.readorder import ReadOrder


def test_an_order_without_a_count_is_this_epoch_up_to_the_first_part_named_twice() -> None:
    reading = ReadOrder()
    reading.set([2, 0, 1, 2, 0], None)
    assert (reading.current, reading.first) == (3, {2: 0, 0: 1, 1: 2})
    assert reading.needed() == ([2, 0, 1, 2, 0], 4, 0)  # this epoch's 3 parts and the next's first


def test_a_part_read_again_is_not_a_step_into_the_next_epoch() -> None:
    reading = ReadOrder()
    reading.set([0, 1, 2, 3, 0, 1, 2, 3], 4)
    reading.advance(0)
    reading.advance(2)
    reading.advance(0)  # back two parts: the reader mixes three parts at a time
    assert (reading.current, reading.position, reading.lag) == (4, 2, 2)
    parts, keep, start = reading.needed()
    assert (parts, start) == ([0, 1, 2, 3, 0, 1, 2, 3], 0)
    assert keep == 4 + 3  # the rest of this epoch, and as many of the next as it mixes


def test_a_part_only_the_next_epoch_reads_starts_that_epoch() -> None:
    reading = ReadOrder()
    reading.set([0, 1, 2, 1], 2)
    reading.advance(1)
    reading.advance(2)  # not in this epoch: the reader went on without announcing it
    assert (reading.order, reading.current, reading.position) == ([2, 1], 2, 0)
    reading.advance(7)  # in no announced epoch (a random read): where it is stays
    assert (reading.order, reading.position) == ([2, 1], 0)
