"""Pillow's pool of freed pixel blocks, kept by every process that prepares images in process.

Pillow allocates an image's pixels as blocks of up to ``PILLOW_BLOCK_SIZE`` (16 MiB) and, by
default, hands each freed block straight back to the C allocator, which returns a block that
large to the kernel: the next image of the same size faults all its pages in again. An image
step allocates and frees several such images per input (the decoded source, the resized
output, the near-duplicate sample), so this costs it about an eighth of its CPU
(``prepare_image`` 5.39 -> 4.70 CPU-ms a photo with 8 blocks kept, the two taking turns on the
same 150 ImageNet-like JPEGs in one process).

Pillow's documented switch for it is the ``PILLOW_BLOCKS_MAX`` environment variable
(https://pillow.readthedocs.io/en/stable/reference/block_allocator.html), which Pillow reads
once, when it is first imported: in a Beam worker that happens before any code of ours runs.
So it is applied here through the function Pillow itself calls for that variable,
``Image.core.set_blocks_max``: the project's one use of Pillow's C core, fenced in this module
and checked by ``tests/test_pillow_blocks.py``. A user's own ``PILLOW_BLOCKS_MAX`` wins.

At most ``KEPT_BLOCKS`` blocks are kept: 128 MiB if every one were a full block (a 12-megapixel
PNG's), a few MiB for photos prepared at 256 px. The decode worker (``bounds``), whose address
space is capped at ``--decode_memory_mb``, keeps none: kept blocks would count against its
budget.
"""

from __future__ import annotations

import os

from PIL import Image

__all__ = ["KEPT_BLOCKS", "PILLOW_VARIABLE", "keep_freed_blocks"]

KEPT_BLOCKS = 8
PILLOW_VARIABLE = "PILLOW_BLOCKS_MAX"


def keep_freed_blocks(blocks: int = KEPT_BLOCKS) -> None:
    """Has Pillow keep up to ``blocks`` freed pixel blocks in this process for the next
    images, unless the environment sets ``PILLOW_BLOCKS_MAX`` (Pillow applied that itself)."""
    if PILLOW_VARIABLE in os.environ:
        return
    Image.core.set_blocks_max(blocks)
