"""Giving the memory a long bundle has freed back to the system, where glibc keeps it.

An engine's batch runner can hand a step one bundle for its whole partition (Flink's does), so
an SDK worker runs the bucketed near-duplicate search's steps for minutes without a pause.
glibc's allocator keeps what those steps free: once a large block it mapped is freed, it raises
its mmap threshold to that size and carves later blocks of megabytes out of its arenas, whose
free pages stay in the process's RSS. On Flink with 6 slots, at the 3 M-image peak of the
largest SDK worker, 371 MB of its 802 MB was free but kept (docs/benchmarks.md, "Flink and
Spark"). ``release_freed_memory`` returns those pages with glibc's ``malloc_trim``, at most once
a ``TRIM_EVERY_S``; elsewhere (another C library, no ``malloc_trim``) it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import time

__all__ = ["TRIM_EVERY_S", "release_freed_memory"]

# At most one trim a second: it walks the arenas' free blocks (a few ms for hundreds of MB),
# and each page it returns is faulted in again when it is next used.
TRIM_EVERY_S = 1.0
_last_trim = [0.0]


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory(*, now: float | None = None) -> bool:
    """Returns the free pages of glibc's heap to the system, unless it did so less than
    ``TRIM_EVERY_S`` ago. Returns whether it trimmed."""
    trim = _malloc_trim()
    now = time.monotonic() if now is None else now
    if trim is None or now - _last_trim[0] < TRIM_EVERY_S:
        return False
    _last_trim[0] = now
    trim(0)
    return True
