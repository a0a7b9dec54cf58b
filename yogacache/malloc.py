"""Memory settings for builds and reads: glibc malloc for multi-megabyte batch buffers, and the
cyclic garbage collector during a build."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
from typing import Iterator

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory() -> None:
    """Lets glibc reuse freed batch buffers instead of returning them to the kernel.

    With glibc's defaults, multi-megabyte batch buffers are mapped per allocation and
    unmapped when freed, so each one is page-faulted in again; on virtual machines those
    faults cost more than decoding or encoding the batch. Raising the mmap and trim
    thresholds keeps the buffers in the heap (freed memory is kept up to 256 MiB). Called
    when an epoch starts (TensorFlow adapter) and when a build starts. Set
    ``YOGACACHE_MALLOC_TUNING=0`` to leave malloc alone.
    """
    if os.environ.get("YOGACACHE_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):  # not glibc
        pass


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keeps the cyclic garbage collector off the objects that exist when a build starts.

    A build allocates a record's worth of tracked objects (the buffer views LMDB stores, their
    key pairs) per record; every ~90,000 of them that live through a transaction trigger a
    full collection, which walks the whole heap: with TensorFlow imported, about 360,000
    objects and 0.2 s per collection, as much as writing 30 MB. ``gc.freeze()`` moves the
    existing objects to the permanent generation, so collections during the build walk only
    what the build made; leaving unfreezes them. A program that froze objects itself, or
    turned the collector off, is left as it is.
    """
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
