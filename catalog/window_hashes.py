"""Crop-robust perceptual hashes: one DCT hash per centred window, and the rule that pairs them.

A copy cropped by ``c`` (``c / 2`` cut from each side, proportionally on both axes) shows what
the centred window of relative size ``1 - c`` of the original shows. So each image gets the
64-bit hash of ``catalog.phash`` over each centred window of ``WINDOW_SCALES`` (1.0 is the
whole frame: the plain hash), all taken from one square luma sample of the image:

* each window's ``32 x 32`` area grid is a fixed linear map of the sample (area weights over
  the window, fractional at its edges), composed with the DCT rows the hash needs, so a
  window's 81 coefficients are ``R_w @ sample @ R_w.T`` with a ``(9, side)`` matrix ``R_w``;
  the matrices are made once and many samples are hashed in one pass (float64, as the plain
  hash: the same bits on every machine up to a coefficient within rounding of zero);
* the windows are centred, so a mirrored copy's window hashes are ``hash ^ FLIP_MASK`` too.

The match rule (``window_distance``): two images are as close as the closest pair of hashes
in which one side is a whole frame: ``min(d(a[0], b[j]), d(a[i], b[0]))`` over every window,
each plainly and mirrored. A copy cropped by 5-15 % is its original's window at the nearest
scale; a copy that is not cropped matches whole frame to whole frame, as before. Requiring a
whole frame on one side keeps the comparisons per pair at ``2 (2 K - 1)`` rather than
``2 K**2``: chance pairs grow with them (``benchmarks/bench_near_dup_recall.py``).
"""

from __future__ import annotations

import functools

import numpy as np

from catalog.phash import DCT_LOW, FLIP_MASK, GRID, HASH_POSITIONS

__all__ = [
    "WINDOW_SCALES",
    "window_matrix",
    "window_hashes_of_samples",
    "window_distance",
    "crop_scale",
]

# Relative sides of the centred windows; 1.0 first (the whole frame, the plain hash). Steps
# of 5 % put every crop of up to 15 % within 2.5 % of a window's scale; an 80 % window found
# no more copies up to 15 % and paired more distinct images (docs/pipeline.md, "Crops").
WINDOW_SCALES = (1.0, 0.95, 0.9, 0.85)


def window_matrix(side: int, scale: float) -> np.ndarray:
    """``(9, side)``: the DCT rows the hash needs composed with the area weights that average
    the centred window of relative size ``scale`` of a line of ``side`` samples into 32 cells.

    Raises:
      ValueError: for ``scale`` outside (0, 1] or ``side`` below the grid.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"window scale must be in (0, 1], got {scale}")
    if side < GRID:
        raise ValueError(f"sample side must be at least {GRID}, got {side}")
    lo, hi = side * (1 - scale) / 2, side * (1 + scale) / 2
    cell = (hi - lo) / GRID
    pixels = np.arange(side)[None, :]
    edges = lo + np.arange(GRID + 1) * cell
    overlap = np.clip(
        np.minimum(edges[1:, None], pixels + 1) - np.maximum(edges[:-1, None], pixels), 0, None
    )
    return DCT_LOW @ (overlap / cell)


@functools.lru_cache(maxsize=16)
def _matrices(side: int, scales: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    rows = np.stack([window_matrix(side, s) for s in scales])  # (W, 9, side)
    return rows, np.ascontiguousarray(rows.transpose(0, 2, 1))  # and (W, side, 9)


def window_hashes_of_samples(
    samples: np.ndarray, scales: tuple[float, ...] = WINDOW_SCALES
) -> np.ndarray:
    """The hashes of every window of ``(K, side, side)`` luma samples: ``(K, W)`` uint64.

    Column 0 is the whole frame when ``scales[0] == 1`` (``catalog.phash``'s hash of the
    sample, averaged into its 32x32 grid by area).

    Raises:
      ValueError: for samples that are not ``(K, side, side)`` with ``side >= 32``.
    """
    array = np.asarray(samples)
    if array.ndim != 3 or array.shape[1] != array.shape[2] or array.shape[1] < GRID:
        raise ValueError(f"samples must be (K, side >= {GRID}, side), got {array.shape}")
    out = np.zeros((array.shape[0], len(scales)), np.uint64)
    if array.shape[0] == 0:
        return out
    rows, columns = _matrices(array.shape[1], tuple(scales))
    pixels = array.astype(np.float64)
    for w in range(len(scales)):
        coefficients = rows[w] @ pixels @ columns[w]  # (K, 9, 9)
        bits = coefficients.reshape(array.shape[0], -1)[:, HASH_POSITIONS] > 0
        packed = np.ascontiguousarray(np.packbits(bits, axis=1, bitorder="little"))
        out[:, w] = packed.view("<u8").ravel()
    return out


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(len(a), len(b))`` Hamming distances, each the smaller of plain and mirrored."""
    a, b = a.astype(np.uint64)[:, None], b.astype(np.uint64)[None, :]
    plain = np.bitwise_count(a ^ b)
    mirrored = np.bitwise_count(a ^ (b ^ np.uint64(FLIP_MASK)))
    return np.minimum(plain, mirrored).astype(np.int64)


def window_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The match rule's distance between two images' window hashes (``(W,)`` each, whole
    frame first): the closest pair with a whole frame on one side, plainly or mirrored."""
    d = _distances(np.asarray(a), np.asarray(b))
    return int(min(d[0].min(), d[:, 0].min()))


def crop_scale(a: np.ndarray, b: np.ndarray, scales: tuple[float, ...] = WINDOW_SCALES) -> float:
    """The window scale at which ``a`` and ``b`` match best: 1.0 for a whole-frame match, else
    the scale of the window of the larger image that the other shows (a crop of about
    ``1 - scale``), for the report's "which transformation"."""
    d = _distances(np.asarray(a), np.asarray(b))
    best_row, best_column = int(d[:, 0].argmin()), int(d[0].argmin())
    if d[0, 0] <= min(d[best_row, 0], d[0, best_column]):
        return 1.0
    window = best_row if d[best_row, 0] <= d[0, best_column] else best_column
    return float(scales[window])
