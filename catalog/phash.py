"""A 64-bit perceptual hash (DCT, pHash-style) in numpy, and Hamming distances between hashes.

How a hash is made:

1. luma ``Y = (299 R + 587 G + 114 B) / 1000`` (the weights Pillow's ``"L"`` mode uses);
2. box (area) average down to a 32x32 grid, whatever the aspect ratio;
3. the orthonormal 2-D DCT-II of the grid;
4. 64 low-frequency coefficients: rows ``u`` 0-7 by columns ``v`` 0-7 without the DC term,
   plus ``(u=8, v=0)`` in its place; bit ``8u + v`` (the extra one at bit 0) is 1 when the
   coefficient is positive.

Thresholding at zero rather than at the median (the classic pHash rule) makes the hash ignore
a uniform brightness shift and any contrast scaling, and, because a horizontal mirror only
negates the coefficients of odd ``v``, gives the mirrored image's hash without recomputing it:
``hash ^ FLIP_MASK``. ``near_duplicates`` uses that to find flipped copies.

The hash is an unsigned 64-bit int; Parquet and numpy hold it as ``uint64``.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DCT_LOW",
    "GRID",
    "HASH_POSITIONS",
    "HASH_BITS",
    "FLIP_MASK",
    "phash",
    "phash_of_grid",
    "luma_grid",
    "luma_grid_of_sample",
    "phashes_of_samples",
    "area_matrix",
    "flip_hash",
    "hamming",
    "hamming_many",
]

GRID = 32
HASH_BITS = 64
_LOW = 8
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float64)


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    matrix = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2.0 / n)
    matrix[0] /= np.sqrt(2.0)
    return matrix


# Only the first 9 DCT rows are ever needed: coefficients u, v <= 8.
# The DCT rows of the hash's low frequencies (9 x GRID), and where the hash's bits sit in the
# raveled 9 x 9 coefficients: shared with catalog.window_hashes, which hashes windows alike.
DCT_LOW = _dct_matrix(GRID)[: _LOW + 1].astype(np.float64)
_DCT_T = np.ascontiguousarray(DCT_LOW.T)


def _bit_positions() -> tuple[np.ndarray, np.ndarray]:
    rows, cols = [], []
    for bit in range(HASH_BITS):
        u, v = divmod(bit, _LOW)
        if bit == 0:
            u, v = _LOW, 0  # the DC term carries brightness only; a 9th row term replaces it
        rows.append(u)
        cols.append(v)
    return np.array(rows), np.array(cols)


_ROWS, _COLS = _bit_positions()
HASH_POSITIONS = _ROWS * (_LOW + 1) + _COLS  # positions in the raveled (9, 9) coefficients
_WEIGHTS = np.left_shift(np.uint64(1), np.arange(HASH_BITS, dtype=np.uint64))
FLIP_MASK = int(np.bitwise_or.reduce(_WEIGHTS[(_COLS % 2) == 1]))


def area_matrix(source: int, target: int = GRID, block: int = 1) -> np.ndarray:
    """``(target, ceil(source / block))`` weights averaging each target cell's share of a line.

    The line has ``source`` pixels, given as the means of blocks of ``block`` pixels (the last
    block may be shorter, as Pillow's ``Image.reduce`` makes them); each target cell averages
    the pixels it covers, counting a block it covers in part by the share it covers.
    """
    blocks = -(-source // block)
    lo = np.arange(blocks)[None, :] * block
    hi = np.minimum(lo + block, source)
    edges = np.arange(target + 1) * (source / target)
    overlap = np.clip(np.minimum(edges[1:, None], hi) - np.maximum(edges[:-1, None], lo), 0, None)
    return overlap / (source / target)


_AREA_CACHE: dict[tuple[int, int], np.ndarray] = {}


def _area(source: int, block: int = 1) -> np.ndarray:
    matrix = _AREA_CACHE.get((source, block))
    if matrix is None:
        matrix = area_matrix(source, GRID, block)
        if len(_AREA_CACHE) < 1024:
            _AREA_CACHE[(source, block)] = matrix
    return matrix


_PROJECTION_CACHE: dict[tuple[int, int, int, int], tuple[np.ndarray, np.ndarray]] = {}


def _projections(width: int, height: int, fx: int, fy: int) -> tuple[np.ndarray, np.ndarray]:
    """``(9, row blocks)`` and ``(column blocks, 9)``: the DCT rows the hash needs composed
    with the area weights, for the rows and (transposed) for the columns."""
    key = (width, height, fx, fy)
    pair = _PROJECTION_CACHE.get(key)
    if pair is None:
        pair = (DCT_LOW @ _area(height, fy), np.ascontiguousarray((DCT_LOW @ _area(width, fx)).T))
        if len(_PROJECTION_CACHE) < 1024:
            _PROJECTION_CACHE[key] = pair
    return pair


def luma_grid_of_sample(sample: np.ndarray) -> np.ndarray:
    """The ``(32, 32)`` grid of a point sample (``(n, m)`` luma values on a regular grid, the
    pipeline's 96x96): each cell averages the samples that fall in it, by area.
    """
    array = np.asarray(sample, dtype=np.float64)
    return _area(array.shape[0]) @ array @ _area(array.shape[1]).T


def phashes_of_samples(samples: np.ndarray) -> list[int]:
    """The hashes of ``(K, n, m)`` luma point samples, all at once (``n, m >= 32``).

    ``phash_of_grid(luma_grid_of_sample(s))`` for each sample, in one pass of numpy: what the
    pipeline runs over all the examples of a staging file.
    """
    array = np.asarray(samples)
    if array.ndim != 3 or min(array.shape[1:]) < GRID:
        raise ValueError(f"samples must be (K, n >= {GRID}, m >= {GRID}), got {array.shape}")
    if array.shape[0] == 0:
        return []
    rows, columns = _projections(array.shape[2], array.shape[1], 1, 1)
    coefficients = rows @ array.astype(np.float64) @ columns  # (K, 9, 9)
    bits = coefficients.reshape(array.shape[0], -1)[:, HASH_POSITIONS] > 0
    packed = np.packbits(bits, axis=1, bitorder="little")  # (K, 8): bit i of the hash is bit i
    return np.ascontiguousarray(packed).view("<u8").ravel().tolist()


def _to_int(coefficients: np.ndarray) -> int:
    bits = coefficients.ravel().take(HASH_POSITIONS) > 0
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


def luma_grid(pixels: np.ndarray) -> np.ndarray:
    """Averages an image down to the ``GRID x GRID`` luma grid the hash is taken from.

    Args:
      pixels: ``(H, W)`` luma or ``(H, W, 3)`` RGB, any numeric dtype on a 0-255 scale.

    Returns:
      A ``(32, 32)`` float64 array.

    Raises:
      ValueError: for another shape or an empty image.
    """
    array = np.asarray(pixels)
    if array.ndim == 3 and array.shape[2] == 3:
        # Area averaging and luma are both linear: averaging the channels first is the same
        # and touches 1024 pixels instead of H * W.
        height, width = array.shape[:2]
    elif array.ndim == 2:
        height, width = array.shape
    else:
        raise ValueError(f"pixels must be (H, W) or (H, W, 3), got shape {array.shape}")
    if height < 1 or width < 1:
        raise ValueError(f"pixels must not be empty, got shape {array.shape}")
    rows, cols = _area(height), _area(width)
    if array.ndim == 2:
        return rows @ array.astype(np.float64) @ cols.T
    flat = array.astype(np.float32).reshape(height, width * 3)
    reduced = (rows.astype(np.float32) @ flat).reshape(GRID, width, 3)
    grid = np.tensordot(cols.astype(np.float32), reduced, axes=([1], [1]))  # (w32, h32, 3)
    return grid.transpose(1, 0, 2).astype(np.float64) @ _LUMA


def phash_of_grid(grid: np.ndarray) -> int:
    """The hash of a ``(32, 32)`` luma grid (from ``luma_grid``, or Pillow's ``"L"`` + BOX).

    Raises:
      ValueError: if ``grid`` is not ``(32, 32)``.
    """
    grid = np.asarray(grid, dtype=np.float64)
    if grid.shape != (GRID, GRID):
        raise ValueError(f"grid must be ({GRID}, {GRID}), got shape {grid.shape}")
    return _to_int(DCT_LOW @ grid @ _DCT_T)  # (9, 9): u, v in 0..8


def phash(pixels: np.ndarray) -> int:
    """The 64-bit perceptual hash of an image given as ``(H, W)`` or ``(H, W, 3)`` pixels."""
    return phash_of_grid(luma_grid(pixels))


def flip_hash(value: int) -> int:
    """The hash of the horizontally mirrored image, from the hash alone."""
    return value ^ FLIP_MASK


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two hashes."""
    return (a ^ b).bit_count()


def hamming_many(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise Hamming distances between two ``uint64`` arrays (as ``uint8``)."""
    return np.bitwise_count(np.bitwise_xor(a.astype(np.uint64), b.astype(np.uint64)))
