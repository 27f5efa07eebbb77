"""Giving the memory a long bundle has freed back to the system, where glibc or Arrow keeps it.

An engine's batch runner can hand a step one bundle for its whole partition (Flink's does), so
an SDK worker runs the bucketed near-duplicate search's steps for minutes without a pause.
glibc's allocator keeps what those steps free: once a large block it mapped is freed, it raises
its mmap threshold to that size and carves later blocks of megabytes out of its arenas, whose
free pages stay in the process's RSS. On Flink with 6 slots, at the 3 M-image peak of the
largest SDK worker, 371 MB of its 802 MB was free but kept (docs/benchmarks.md, "Flink and
Spark"). ``release_freed_memory`` returns those pages with glibc's ``malloc_trim``, at most once
a ``TRIM_EVERY_S``; elsewhere (another C library, no ``malloc_trim``) it does nothing.

Arrow keeps what it frees too, in its own allocator (mimalloc in the pyarrow wheels), which
glibc's trim does not reach: on Spark at 3 M images the catalog steps, which stream Parquet
row groups through Arrow, were an SDK worker's peak, 596–640 MB, against 438–480 MB with
Arrow on the system allocator. So the same call also asks Arrow's default pool to return its
unused memory (``MemoryPool.release_unused``), when pyarrow is loaded.
"""

from __future__ import annotations

import ctypes
import functools
import sys
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


def release_freed_memory(*, now: float | None = None, force: bool = False) -> bool:
    """Returns the free pages of glibc's heap, and Arrow's unused memory, to the system, unless
    it did so less than ``TRIM_EVERY_S`` ago (``force``: even then; for the end of a bundle,
    after which nothing of its step calls again). Returns whether it did."""
    now = time.monotonic() if now is None else now
    if not force and now - _last_trim[0] < TRIM_EVERY_S:
        return False
    _last_trim[0] = now
    arrow = sys.modules.get("pyarrow")  # not imported here: only where it is in use already
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return True
