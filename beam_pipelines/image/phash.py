"""The perceptual hash of a prepared image, split so the pipeline can afford it.

The hash (``catalog.phash``) is a DCT of a 32x32 luma grid. Made image by image right after
the JPEG encoder has run, its few numpy calls each start cold (their code and data evicted)
and cost several times what they cost in a loop. So the pipeline takes only a point sample of
each prepared image while the pixels are at hand: 96x96 luma values on a regular grid
(``luma_sample``: a nearest-pixel resize in C, 9 KiB), and hashes the samples of a whole
staging file at once (``catalog.phash.phashes_of_samples``) when it hands their locations on.
Each of the 32x32 cells averages 3x3 samples. On photos the hash comes out a few bits (2.5 on
average) from the exact area average's, with the same recall and precision on the near-duplicate
benchmark (README).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from catalog.phash import luma_grid_of_sample, phashes_of_samples

__all__ = [
    "SAMPLE",
    "WORKING",
    "luma_sample",
    "source_sample",
    "luma_grid_of",
    "perceptual_hash",
    "perceptual_hashes",
]

SAMPLE = 96  # the point sample's side: 3x3 samples per cell of the hash's 32x32 grid
WORKING = 128  # the side a source is resampled to before its sample is taken
REDUCING_GAP = 1.0  # area-average by whole factors down to >= WORKING before the bicubic


def luma_sample(image: Image.Image) -> bytes:
    """``SAMPLE x SAMPLE`` luma values of an image on a regular grid, row by row (9 KiB)."""
    small = image.resize((SAMPLE, SAMPLE), Image.Resampling.NEAREST)
    return (small if small.mode == "L" else small.convert("L")).tobytes()


def source_sample(image: Image.Image) -> bytes:
    """``SAMPLE x SAMPLE`` luma values of a decoded source at a fixed working size (9 KiB).

    The pipeline hashes this, not the stored image: the source is resampled (bicubic, with
    antialiasing when it shrinks) to ``WORKING x WORKING`` whatever its size and
    ``--image_size``, then area-averaged to the sample. A resized, re-encoded or mirrored copy
    of a photo then hashes close to it (``benchmarks/bench_near_dup_recall.py``); a box filter
    straight to 96 px would blow up a small copy's pixels into blocks.

    A source at least twice ``WORKING`` on a side is first area-averaged by the whole factor
    that keeps it at least ``WORKING`` (Pillow's ``reducing_gap``; 500x375 -> 166x187), and the
    bicubic filter runs on that: a third less time for the sample, and the hash of a photo
    comes out within a bit or two of the plain bicubic's (0.3 bits on average), with the same
    recall on the near-duplicate benchmark.
    """
    luma = image if image.mode == "L" else image.convert("L")  # one channel to resample
    working = luma.resize((WORKING, WORKING), Image.Resampling.BICUBIC, reducing_gap=REDUCING_GAP)
    return working.resize((SAMPLE, SAMPLE), Image.Resampling.BOX).tobytes()


def _array(samples: Sequence[bytes]) -> np.ndarray:
    joined = np.frombuffer(b"".join(samples), dtype=np.uint8)
    return joined.reshape(len(samples), SAMPLE, SAMPLE)


# Samples hashed per numpy pass: the pass works in float64, 8 bytes per sampled pixel, so a
# staging file of small examples (thousands) would otherwise cost hundreds of MB at once.
_CHUNK = 256


def perceptual_hashes(samples: Sequence[bytes]) -> list[int]:
    """The hashes of many ``luma_sample`` results, ``_CHUNK`` per numpy pass, as unsigned ints."""
    hashes: list[int] = []
    for start in range(0, len(samples), _CHUNK):
        hashes += phashes_of_samples(_array(samples[start : start + _CHUNK]))
    return hashes


def perceptual_hash(image: Image.Image) -> int:
    """The 64-bit DCT hash (``catalog.phash``) of one Pillow image, as an unsigned int."""
    return perceptual_hashes([luma_sample(image)])[0]


def luma_grid_of(image: Image.Image) -> np.ndarray:
    """The ``(32, 32)`` float64 luma grid the pipeline's hash of ``image`` is taken from."""
    return luma_grid_of_sample(_array([luma_sample(image)])[0])
