"""The near-duplicate features of a prepared image, split so the pipeline can afford them.

The features (``catalog.window_hashes``) are DCT hashes of centred windows of one 64x64 luma
sample; window 0, the whole frame, is the catalog's ``phash`` (``catalog.phash``). The sample
is taken from pixels the image step already has: the resized output, in sRGB, just before it is
encoded (``output_sample``: Pillow's box filter after a whole-factor reduction, 4 KiB). Made
image by image right after the JPEG encoder has run, a few numpy calls each start cold and cost
several times what they cost in a loop, so the pipeline keeps only the sample per image and
hashes the samples of a whole staging file at once (``window_hashes``) when it hands their
locations on.

Because the sample is of the stored pixels (before JPEG coding), an example whose stored image
is at hand, such as one reused from ``--base``, gets its features by decoding that image, not
its source; the hash comes out within a bit or two.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from catalog.phash import luma_grid_of_sample
from catalog.window_hashes import WINDOW_SCALES, window_hashes_of_samples

__all__ = [
    "FEATURES",
    "SAMPLE",
    "WINDOW_SCALES",
    "luma_sample",
    "output_sample",
    "luma_grid_of",
    "perceptual_hash",
    "perceptual_hashes",
    "window_hashes",
]

#: How the features are taken, as ``dataset.json`` records it (``near_duplicate_features``): a
#: dataset whose catalog hashes were taken otherwise (a base built before) is not reused, so one
#: catalog never mixes two kinds of hash.
FEATURES = "output-luma64-dct"
SAMPLE = 64  # the sample's side: 2x2 samples per cell of the whole frame's 32x32 grid


def output_sample(image: Image.Image) -> bytes:
    """``SAMPLE x SAMPLE`` luma area averages of an image, row by row (4 KiB): the sample the
    near-duplicate features are taken from.

    The pipeline takes it from the resized output before encoding (256 px on the shorter side
    by default): an image the step has anyway, a few times smaller than the decoded source. The
    sample costs one reduction by the same whole factor on both axes, the largest that keeps
    the shorter side at least ``SAMPLE`` (``Image.reduce``: 341x256 -> 85x64; Pillow has fast
    paths for square factors, and its ``reducing_gap``, which picks a factor per axis, took
    1.8x as long), luma on those few thousand pixels, then a box filter to 64x64 on the one
    band (a fifth cheaper than boxing the three colour bands first: within one level of it).
    Resized, re-encoded and mirrored copies come out at the same stored size, so they sample
    alike.
    """
    factor = min(image.size) // SAMPLE
    small = image.reduce(factor) if factor > 1 else image
    if small.mode != "L":
        small = small.convert("L")
    return small.resize((SAMPLE, SAMPLE), Image.Resampling.BOX).tobytes()


luma_sample = output_sample  # the sample of any image: what ``perceptual_hash`` hashes


def _array(samples: Sequence[bytes]) -> np.ndarray:
    joined = np.frombuffer(b"".join(samples), dtype=np.uint8)
    return joined.reshape(len(samples), SAMPLE, SAMPLE)


# Samples hashed per numpy pass: the pass works in float64, 8 bytes per sampled pixel, so a
# staging file of small examples (thousands) would otherwise cost hundreds of MB at once.
_CHUNK = 256


def window_hashes(samples: Sequence[bytes]) -> np.ndarray:
    """The window hashes (``catalog.window_hashes``) of many ``output_sample`` results,
    ``_CHUNK`` per numpy pass: ``(K, len(WINDOW_SCALES))`` uint64, the whole frame first."""
    parts = [
        window_hashes_of_samples(_array(samples[start : start + _CHUNK]))
        for start in range(0, len(samples), _CHUNK)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, len(WINDOW_SCALES)), np.uint64)


def perceptual_hashes(samples: Sequence[bytes]) -> list[int]:
    """The whole-frame hashes (the catalog's ``phash``) of many ``output_sample`` results."""
    return window_hashes(samples)[:, 0].tolist()


def perceptual_hash(image: Image.Image) -> int:
    """The 64-bit DCT hash (``catalog.phash``) of one Pillow image, as an unsigned int."""
    return perceptual_hashes([luma_sample(image)])[0]


def luma_grid_of(image: Image.Image) -> np.ndarray:
    """The ``(32, 32)`` float64 luma grid the pipeline's hash of ``image`` is taken from."""
    return luma_grid_of_sample(_array([luma_sample(image)])[0])
