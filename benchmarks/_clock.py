"""CPU time of a measured stretch, this process's threads and the child processes it reaped in it
(a build's spawned workers, a pool's processes). Standard library only: the peers' virtualenv
imports it too."""

from __future__ import annotations

import resource
import time


def cpu_seconds() -> float:
    """User + system seconds of this process (every thread) and of its reaped children so far."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
