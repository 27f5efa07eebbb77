"""Every pair of examples the window rule joins: a crop of an image meets its original.

Each example has the hashes of its centred windows (``catalog.window_hashes``: whole frame
first). Two examples pair when the whole frame of one is within the threshold of *any* window
of the other, plainly or mirrored (``window_hashes.window_distance``); each pair is reported
once, with its smallest distance and the window it was found at (0: whole frame to whole frame,
else the index in ``WINDOW_SCALES`` of the window of the larger image that the other shows).

The search is ``near_duplicates.find_pairs``' multi-index hashing over every window hash of
every example (``N * W`` entries), keeping only entry pairs with a whole frame on one side and
two different examples; candidates are checked in the same bounded batches, and the pairs kept
are reduced to one per example pair whenever they pass ``2 * max_pairs``, so memory is bounded
as ``find_pairs``' is. Below ``_BRUTE_FORCE_BELOW`` entries every whole frame is compared with
every window instead (the same result).
"""

from __future__ import annotations

import numpy as np

from catalog.near_duplicates import (  # the multi-index search's own steps, shared
    _BRUTE_FORCE_BELOW,
    DEFAULT_THRESHOLD,
    Pairs,
    _check,
    _chunk_layout,
    _Collector,
    _Enough,
    _search_chunk,
)
from catalog.phash import FLIP_MASK

__all__ = ["find_window_pairs", "brute_force_window_pairs"]


def _check_windows(windows: np.ndarray, threshold: int) -> np.ndarray:
    array = np.asarray(windows)
    if array.ndim != 2 or array.shape[1] < 1:
        raise ValueError(f"window hashes must be (N, W) with W >= 1, got shape {array.shape}")
    flat = _check(array.reshape(-1), threshold)  # dtype and threshold checks
    return flat.reshape(array.shape)


def _reduce(parts, n: int, max_pairs: int | None):
    """One row per example pair: the smallest distance, then the smallest window, then plain
    before mirrored; sorted by ``(first, second)``, at most ``max_pairs``."""
    first, second, distance, flipped, window = (np.concatenate(c) for c in zip(*parts, strict=True))
    key = first * np.int64(max(n, 1)) + second
    order = np.lexsort((flipped, window, distance, key))
    key = key[order]
    keep = np.ones(key.shape[0], bool)
    keep[1:] = key[1:] != key[:-1]
    chosen = order[keep]
    complete = max_pairs is None or chosen.shape[0] < max_pairs
    chosen = chosen if complete else chosen[:max_pairs]
    picked = (first[chosen], second[chosen], distance[chosen], flipped[chosen], window[chosen])
    return picked, complete


def _result(parts, n: int, max_pairs: int | None) -> tuple[Pairs, np.ndarray]:
    if not parts:
        return Pairs.empty(), np.zeros(0, np.int8)
    (first, second, distance, flipped, window), complete = _reduce(parts, n, max_pairs)
    return Pairs(first, second, distance.astype(np.uint8), flipped, complete), window


class _WindowCollector(_Collector):
    """``_Collector`` over window entries (entry ``e`` is window ``e % W`` of example
    ``e // W``): keeps the near entry pairs with a whole frame on one side and two examples,
    as example pairs, and reduces them to one per example pair when they pile up."""

    def __init__(self, threshold: int, flips: bool, n: int, w: int, max_pairs: int | None):
        super().__init__(threshold, flips, None)
        self._n, self._w, self._max = n, w, max_pairs
        self.parts: list[tuple[np.ndarray, ...]] = []
        self._held = 0

    def add(self, query_hashes, query_positions, candidates, sorted_hashes, order) -> None:
        x = query_hashes ^ sorted_hashes[candidates]
        a = order[query_positions].astype(np.int64)
        b = order[candidates].astype(np.int64)
        wa, wb = a % self._w, b % self._w
        valid = ((wa == 0) | (wb == 0)) & (a // self._w != b // self._w)
        distance = np.bitwise_count(x).astype(np.int64)
        mirrored = (
            np.bitwise_count(x ^ np.uint64(FLIP_MASK)).astype(np.int64)
            if self._flips
            else np.full(distance.shape, 65, np.int64)
        )
        near = valid & (np.minimum(distance, mirrored) <= self._threshold)
        if not near.any():
            return
        a, b, d, m = a[near] // self._w, b[near] // self._w, distance[near], mirrored[near]
        window = np.maximum(wa[near], wb[near]).astype(np.int8)
        self.parts.append((np.minimum(a, b), np.maximum(a, b), np.minimum(d, m), m < d, window))
        self._held += a.shape[0]
        if self._max is not None and self._held >= 2 * self._max:
            picked, complete = _reduce(self.parts, self._n, self._max)
            self.parts, self._held = [picked], picked[0].shape[0]
            if not complete:
                raise _Enough


def brute_force_window_pairs(
    windows: np.ndarray,
    threshold: int = DEFAULT_THRESHOLD,
    *,
    flips: bool = True,
    max_pairs: int | None = None,
) -> tuple[Pairs, np.ndarray]:
    """``find_window_pairs`` by comparing every whole frame with every window: for small
    inputs and tests."""
    h = _check_windows(windows, threshold)
    n, w = h.shape
    parts: list[tuple[np.ndarray, ...]] = []
    block = max(1, 2_000_000 // max(n * w, 1))
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        x = h[rows, 0][:, None, None] ^ h[None, :, :]  # (rows, N, W)
        distance = np.bitwise_count(x).astype(np.int64)
        mirrored = (
            np.bitwise_count(x ^ np.uint64(FLIP_MASK)).astype(np.int64)
            if flips
            else np.full(distance.shape, 65, np.int64)
        )
        r, c, k = np.nonzero(np.minimum(distance, mirrored) <= threshold)
        a = rows[r]
        keep = a != c
        r, c, k, a = r[keep], c[keep], k[keep], a[keep]
        d, m = distance[r, c, k], mirrored[r, c, k]
        parts.append(
            (np.minimum(a, c), np.maximum(a, c), np.minimum(d, m), m < d, k.astype(np.int8))
        )
    parts = [p for p in parts if p[0].shape[0]]
    return _result(parts, n, max_pairs)


def find_window_pairs(
    windows: np.ndarray,
    threshold: int = DEFAULT_THRESHOLD,
    *,
    flips: bool = True,
    method: str = "auto",
    max_pairs: int | None = None,
) -> tuple[Pairs, np.ndarray]:
    """Finds every pair of examples the window rule joins within ``threshold`` bits.

    Args:
      windows: ``(N, W)`` uint64 window hashes (``catalog.window_hashes``), whole frame first;
        ``W == 1`` is ``find_pairs`` on the whole frames.
      threshold: the largest Hamming distance that counts, 0-16.
      flips: also pair examples that match when one is mirrored left-right.
      method: ``"auto"`` (brute force below 4,096 entries), ``"index"`` or ``"brute"``.
      max_pairs: keep about this many pairs (the first in ``(first, second)`` order of those
        met); the result then says ``complete=False``. None: no limit.

    Returns:
      ``(pairs, window)``: ``Pairs`` with ``first < second``, sorted, one per example pair at
      its smallest distance; ``window`` (int8, one per pair) the window index it matched at.

    Raises:
      ValueError: for a threshold outside 0-16, input that is not ``(N, W)`` or an unknown
        method.
      TypeError: for a non-integer threshold or hashes that are not unsigned ints.
    """
    if method not in ("auto", "index", "brute"):
        raise ValueError(f"method must be 'auto', 'index' or 'brute', got {method!r}")
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs!r}")
    h = _check_windows(windows, threshold)
    n, w = h.shape
    if method == "brute" or (method == "auto" and n * w < _BRUTE_FORCE_BELOW):
        return brute_force_window_pairs(h, threshold, flips=flips, max_pairs=max_pairs)
    entries = np.ascontiguousarray(h).reshape(-1)  # entry e: window e % w of example e // w
    layout = _chunk_layout(entries.shape[0], None)
    per_chunk, extra = divmod(threshold, len(layout))
    out = _WindowCollector(threshold, flips, n, w, max_pairs)
    try:
        for index, (low, width) in enumerate(layout):
            radius = per_chunk if index <= extra else per_chunk - 1
            if radius >= 0:
                _search_chunk(entries, low, width, radius, flips, out)
    except _Enough:
        pass
    return _result(out.parts, n, max_pairs)
