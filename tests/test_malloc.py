"""glibc malloc tuning: freed batch buffers stay in the heap, unless YOGACACHE_MALLOC_TUNING=0."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import numpy as np
from yogacache.malloc import keep_freed_memory

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

keep_freed_memory()
buffer = np.ones(32 << 20, dtype=np.uint8)
before = rss()
del buffer
print(before - rss())
"""


def released_kib(tuning: str) -> int:
    env = dict(os.environ, YOGACACHE_MALLOC_TUNING=tuning)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_freed_batch_buffers_stay_mapped_unless_tuning_is_off() -> None:
    assert released_kib("1") < 4 << 10  # kept in the heap for the next batch
    assert released_kib("0") > 24 << 10  # glibc's default: unmapped at once
