"""``beam_pipelines.graph.heap``: freed heap pages go back to the system, at most once a second."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import textwrap

import pytest

from beam_pipelines.graph import heap


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


pytestmark = pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")

# In a process of its own: 1 MB blocks from the heap (glibc's mmap threshold held above them,
# as it is once a large block has been freed), every other one freed, so the free pages sit
# between blocks in use, where only a trim gives them back.
_FRAGMENTED_HEAP = textwrap.dedent(
    """
    import ctypes, json, sys
    from beam_pipelines.graph.heap import release_freed_memory
    libc = ctypes.CDLL(None)
    libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 >> 20
    blocks = [libc.malloc(1 << 20) for _ in range(400)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in blocks[::2]:
        libc.free(b)
    before = rss()
    trimmed = release_freed_memory()
    print(json.dumps([before, rss(), trimmed]))
    """
)


def test_freed_pages_between_blocks_in_use_go_back_to_the_system():
    out = subprocess.run(
        [sys.executable, "-c", _FRAGMENTED_HEAP], check=True, capture_output=True, text=True
    )
    before, after, trimmed = json.loads(out.stdout)
    assert trimmed
    assert before - after > 150, (before, after)  # 200 MB were free between used blocks


def test_it_trims_at_most_once_a_period(monkeypatch):
    monkeypatch.setattr(heap, "_last_trim", [0.0])
    start = 1000.0
    assert heap.release_freed_memory(now=start)
    assert not heap.release_freed_memory(now=start + heap.TRIM_EVERY_S / 2)
    assert heap.release_freed_memory(now=start + heap.TRIM_EVERY_S)
    # A bundle's end trims whatever the period.
    assert heap.release_freed_memory(now=start + heap.TRIM_EVERY_S * 1.5, force=True)
    assert not heap.release_freed_memory(now=start + heap.TRIM_EVERY_S * 1.75)


# In a process of its own: 300 arrays of 1 MB in Arrow's default pool (mimalloc in the wheels),
# every other one freed, which Arrow's allocator keeps and glibc's trim does not reach.
_ARROW_FREED = textwrap.dedent(
    """
    import json, time
    import numpy as np, pyarrow as pa, pyarrow.compute as pc
    from beam_pipelines.graph.heap import release_freed_memory
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 >> 20
    source = pa.array(np.arange(1 << 17, dtype=np.int64))
    arrays = [pc.multiply(source, i) for i in range(300)]
    del arrays[::2]
    time.sleep(0.5)
    before = rss()
    release_freed_memory()
    print(json.dumps([before, rss(), pa.total_allocated_bytes() >> 20]))
    """
)


def test_what_arrow_freed_goes_back_to_the_system_too():
    out = subprocess.run(
        [sys.executable, "-c", _ARROW_FREED], check=True, capture_output=True, text=True
    )
    before, after, in_use = json.loads(out.stdout)
    assert in_use == 150  # the arrays still held
    assert before - after > 100, (before, after)  # 150 MB were freed into Arrow's pool
