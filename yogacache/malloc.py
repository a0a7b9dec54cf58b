"""glibc malloc settings for moving multi-megabyte batch buffers (reading and building)."""

from __future__ import annotations

import ctypes
import os
import sys

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
