"""The perceptual hash of a prepared image, computed where the pixels already are.

The hash itself (``catalog.phash``) is numpy on a 32x32 luma grid; this module makes that grid
from a Pillow image at a cost the pipeline can afford (about 2% of preparing an image): an
integer box ``reduce`` in C to about one block per grid cell, Pillow's luma, then the area
weights of ``catalog.phash`` over the block means, folded into the DCT. That is ``catalog.phash.luma_grid`` (the
exact area average) up to rounding and the blocks cut by cell edges, so hashes made either way
differ by a bit or two at most on photos. (Pillow's ``BOX`` resize is not used for the last
step: near 1:1 it takes whole pixels by their centres, not areas.)
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from catalog.phash import GRID, luma_grid_of_blocks, phash_of_blocks

# Reduce to about one block per grid cell (the cheapest reduce); a block cut by a cell edge is
# shared between the two cells by the share each covers.
_BLOCKS = GRID

__all__ = ["luma_grid_of", "perceptual_hash"]


def _blocks(image: Image.Image) -> tuple[np.ndarray, tuple[int, int]]:
    factor = (max(1, image.width // _BLOCKS), max(1, image.height // _BLOCKS))
    small = image.reduce(factor) if factor != (1, 1) else image
    if small.mode != "L":
        small = small.convert("L")
    return np.asarray(small), factor


def luma_grid_of(image: Image.Image) -> np.ndarray:
    """The ``(32, 32)`` float64 luma grid of an RGB (or L) image, by area averaging."""
    blocks, factor = _blocks(image)
    return luma_grid_of_blocks(blocks, image.size, factor)


def perceptual_hash(image: Image.Image) -> int:
    """The 64-bit DCT hash (``catalog.phash``) of a Pillow image, as an unsigned int."""
    blocks, factor = _blocks(image)
    return phash_of_blocks(blocks, image.size, factor)
