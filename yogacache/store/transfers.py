"""Parallel part transfers (pull, push, copy) that all stop on the first failure or Ctrl-C.

One batch runs ``work(item, on_bytes)`` for every item on a few threads. The first failure, or
an interrupt of the thread waiting for the batch (Ctrl-C raises KeyboardInterrupt there), stops
the batch: queued items never start, a running transfer stops at its next chunk (its progress
callback raises TransferCancelled), and no retry of ``RetryPolicy`` starts after the stop (a
backoff under way wakes at once). A transfer waiting on the network for its next chunk cannot be
stopped from outside: the batch waits ``CANCEL_GRACE_SECONDS`` for the running ones, then raises
and leaves them; they are daemon threads, so that they never hold the process at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any, Callable, Optional, TypeVar

from yogacache.backends.base import ProgressCallback, TransferCancelled, stop_retries_when

T = TypeVar("T")
R = TypeVar("R")

CANCEL_GRACE_SECONDS = 0.5  # how long a stopped batch waits for its running transfers
_POLL_SECONDS = 0.1  # the waiting thread wakes this often, so that Ctrl-C reaches it promptly


class _Slot:
    """One item's outcome."""

    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = False
        self.result: Any = None
        self.error: Optional[BaseException] = None


def run_transfers(
    work: Callable[[T, ProgressCallback], R],
    items: Sequence[T],
    *,
    threads: int,
    add_bytes: ProgressCallback,
    name: str = "yogacache-transfer",
) -> list[R]:
    """``work(item, on_bytes)`` for every item on up to ``threads`` daemon threads; the results in
    the order of ``items``. Raises the first failure (a real one rather than a TransferCancelled it
    caused), or the interrupt, once the running transfers stopped or after a short grace."""
    if not items:
        return []
    cancel = threading.Event()
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        todo.put(index)
    slots = [_Slot() for _ in items]
    finished = threading.Condition()

    def on_bytes(count: int) -> None:
        if cancel.is_set():
            raise TransferCancelled("transfer cancelled")
        add_bytes(count)

    def worker() -> None:
        with stop_retries_when(cancel):
            while not cancel.is_set():
                try:
                    index = todo.get_nowait()
                except queue.Empty:
                    return
                slot = slots[index]
                try:
                    slot.result = work(items[index], on_bytes)
                except BaseException as error:  # handed to the waiting thread
                    slot.error = error
                    cancel.set()  # before this thread could take the next item
                finally:
                    with finished:
                        slot.done = True
                        finished.notify_all()

    workers = [
        threading.Thread(target=worker, name=f"{name}-{number}", daemon=True)
        for number in range(max(1, min(threads, len(items))))
    ]
    for thread in workers:
        thread.start()
    try:
        with finished:
            while not cancel.is_set() and not all(slot.done for slot in slots):
                finished.wait(_POLL_SECONDS)
    except BaseException:
        cancel.set()
        _join(workers, CANCEL_GRACE_SECONDS)
        raise
    if cancel.is_set():
        _join(workers, CANCEL_GRACE_SECONDS)
        errors = [slot.error for slot in slots if slot.error is not None]
        raise next((e for e in errors if not isinstance(e, TransferCancelled)), errors[0])
    return [slot.result for slot in slots]


def _join(threads: list[threading.Thread], seconds: float) -> None:
    """Waits up to ``seconds`` in all for ``threads`` to end."""
    import time

    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
