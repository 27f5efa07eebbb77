"""glibc allocator settings for a trainer fed by the tf.data service.

Through the service the trainer receives every batch as one large message: 19 MB for 128
images of 224x224 RGB. gRPC reads it into buffers allocated on its own threads, TensorFlow
frees them on others, and with glibc's defaults the freed memory goes back to the kernel (a
per-thread arena's heap is released once empty). The next batch then lands in fresh pages the
kernel must fault in and zero: a third of the trainer's own input CPU in a profile here
(``benchmarks/bench_service.py`` measures the whole). With one arena, no trimming and large
blocks kept off ``mmap``, the pages of one batch take the next.

The cost: the process does not hand freed memory back to the kernel (its resident size stays
at its peak), and all threads share one malloc lock. A service-fed trainer host allocates
little else on the CPU, so the trainer applies this only with ``--data_service``.

No TensorFlow here: the settings must be in place before TensorFlow and gRPC start threads.
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys

__all__ = ["AllocatorSettings", "keep_freed_memory"]

# mallopt parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# glibc ignores an mmap threshold above this (HEAP_MAX_SIZE / 2 on 64-bit).
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    """What ``keep_freed_memory`` sets.

    Attributes:
      arena_max: malloc arenas; 1 lets a buffer freed by one thread serve another's next one.
      mmap_threshold: allocations at least this large get their own ``mmap`` (and lose their
        pages when freed); at most 32 MiB, glibc's ceiling.
      trim_threshold: free memory at the top of the heap kept before returning any to the kernel.
      top_pad: extra memory obtained whenever the heap grows.

    Raises:
      ValueError: naming the bad field and value.
    """

    arena_max: int = 1
    mmap_threshold: int = _MAX_MMAP_THRESHOLD
    trim_threshold: int = 1024 * 1024 * 1024
    top_pad: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not isinstance(self.arena_max, int) or self.arena_max < 1:
            raise ValueError(f"arena_max must be an int >= 1, got {self.arena_max!r}")
        if not isinstance(self.mmap_threshold, int) or not (
            0 < self.mmap_threshold <= _MAX_MMAP_THRESHOLD
        ):
            raise ValueError(
                f"mmap_threshold must be an int in (0, {_MAX_MMAP_THRESHOLD}] (glibc ignores "
                f"larger values), got {self.mmap_threshold!r}"
            )
        for name in ("trim_threshold", "top_pad"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def keep_freed_memory(settings: AllocatorSettings | None = None) -> bool:
    """Makes glibc's malloc keep freed memory for reuse instead of returning it to the kernel.

    Call it before TensorFlow is imported: arenas that threads already hold keep their own
    (default) behaviour.

    Returns:
      True if every setting was applied; False, with nothing changed, where the C library is
      not glibc (macOS, musl).
    """
    settings = settings or AllocatorSettings()
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  (present only in glibc)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    wanted = (
        (_M_ARENA_MAX, settings.arena_max),
        (_M_MMAP_THRESHOLD, settings.mmap_threshold),
        (_M_TRIM_THRESHOLD, min(settings.trim_threshold, 2**31 - 1)),
        (_M_TOP_PAD, min(settings.top_pad, 2**31 - 1)),
    )
    return all(mallopt(option, value) == 1 for option, value in wanted)
