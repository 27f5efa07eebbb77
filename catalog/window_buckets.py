"""The window rule's search bucket by bucket: what an engine runs, and the same in one process.

``catalog.window_search`` finds the pairs with every hash in one place; this module finds the
same pairs when each worker holds one bucket. With ``T = rule.bucket_threshold`` the 64 bits
are cut into ``T + 1`` chunks (``near_duplicates.bucket_layout``): two hashes within ``T`` bits
agree exactly on one of them (pigeonhole), and two within the window threshold ``tw`` on one
of the first ``tw + 1``. Every example sends *entries* to buckets ``(chunk, chunk value)``:

* on every chunk, its whole frame (kind 0) and its mirrored whole frame (kind 1);
* on chunks ``0..tw``, each of its windows ``j`` (kind ``1 + j``), as is: the rule compares a
  whole frame (plain or mirrored) with a window, never two windows, and never mirrors a window
  (the mirrored whole frame against the window is the same comparison).

Every entry carries all of its example's hashes, so a bucket can judge a candidate pair of
examples by the rule in full (``window_search.best_combinations``): the pair's *best
combination* names the two entries that make it (say example A's mirrored whole frame and
B's window 2, A the smaller key) and the first chunk on which those two agree. The pair is
emitted only by that chunk's bucket, from those two entries: exactly once over all buckets,
with no second shuffle (multi-index hashing's usual deduplication, extended to the rule's
combinations). A bucket too large for one worker is searched as pairs of blocks, as the
whole-frame search does (``near_duplicates.bucket_blocks``).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from catalog.near_duplicates import (
    BucketPairs,
    OwnedPairs,
    Pairs,
    bucket_blocks,
    bucket_candidates,
    bucket_layout,
    bucket_values,
)
from catalog.phash import FLIP_MASK
from catalog.window_search import (
    DEFAULT_RULE,
    JUDGED_PER_PASS,
    WindowPairs,
    WindowRule,
    best_combinations,
    check_windows,
    column_flipped,
    column_window,
)

__all__ = [
    "WHOLE",
    "MIRRORED",
    "WindowBucketPairs",
    "chunk_kinds",
    "entry_hashes",
    "search_window_bucket",
    "find_window_pairs_by_buckets",
]

WHOLE, MIRRORED = 0, 1  # entry kinds; window j is kind 1 + j
_FLIP = np.uint64(FLIP_MASK)


@dataclasses.dataclass(frozen=True)
class WindowBucketPairs(BucketPairs):
    """``BucketPairs`` (sorted by ``(key[row_a], key[row_b])``) with the window of each: the
    distance and flip are those of the pair's best combination, ``window`` (int8) its window
    (0: whole frame to whole frame)."""

    window: np.ndarray


def chunk_kinds(rule: WindowRule, chunk: int) -> np.ndarray:
    """The entry kinds an example sends to its buckets on ``chunk``."""
    windows = rule.windows > 1 and chunk <= rule.window_threshold
    return np.arange(1 + rule.windows if windows else 2, dtype=np.uint8)


def entry_hashes(hashes: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Each entry's hash as its buckets see it: ``(E, W)`` example hashes and ``(E,)`` kinds
    -> ``(E,)`` uint64 (the whole frame, the mirrored whole frame, or a window)."""
    kinds = np.asarray(kinds, np.int64)
    column = np.maximum(kinds - 1, 0)
    out = np.take_along_axis(hashes, column[:, None], 1)[:, 0]
    return np.where(kinds == MIRRORED, out ^ _FLIP, out)


def _canonical_kinds(column: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kinds of the two entries (smaller key first) that make each combination column of
    ``window_search.combination_distances``."""
    j = np.maximum((column - 2) // 4, 0) + 2  # kind of window (column - 2) // 4 + 1
    way = (column - 2) % 4  # A whole / B window, B whole / A window, then the two mirrored
    kind_a = np.select(
        [column == 0, column == 1, way == 0, way == 1, way == 2], [WHOLE, MIRRORED, WHOLE, j, 1], j
    )
    kind_b = np.select(
        [column == 0, column == 1, way == 0, way == 1, way == 2], [WHOLE, WHOLE, j, WHOLE, j], 1
    )
    return kind_a, kind_b


class _WindowOwner:
    """``(rows a, rows b) -> (keep, distance, flipped, window)``: which candidate entry pairs
    a bucket on ``chunk`` owns (see the module's docstring)."""

    def __init__(self, chunk, hashes, keys, kinds, effective, rule: WindowRule) -> None:
        self._chunk, self._hashes, self._keys, self._kinds = chunk, hashes, keys, kinds
        self._effective, self._rule = effective, rule
        self._layout = bucket_layout(rule.bucket_threshold)

    def __call__(self, a: np.ndarray, b: np.ndarray):
        keep = np.zeros(a.shape[0], bool)
        distance = np.zeros(a.shape[0], np.uint8)
        flipped = np.zeros(a.shape[0], bool)
        window = np.zeros(a.shape[0], np.int8)
        # An example's own entries (its whole frames and windows) are near one another, so
        # they are most of a bucket's candidates, and never a pair: left out before the rule is
        # applied, and the rest judged a bounded number at a time.
        other = np.flatnonzero(self._keys[a] != self._keys[b])
        for start in range(0, other.shape[0], JUDGED_PER_PASS):
            at = other[start : start + JUDGED_PER_PASS]
            keep[at], distance[at], flipped[at], window[at] = self._judge(a[at], b[at])
        return keep, distance, flipped, window

    def _judge(self, a: np.ndarray, b: np.ndarray):
        swap = self._keys[a] > self._keys[b]
        a, b = np.where(swap, b, a), np.where(swap, a, b)
        ok, column, distance = best_combinations(self._hashes[a], self._hashes[b], self._rule)
        kind_a, kind_b = _canonical_kinds(column)
        keep = ok & (self._kinds[a] == kind_a) & (self._kinds[b] == kind_b)
        x = self._effective[a] ^ self._effective[b]
        agree = np.stack([bucket_values(x, self._layout, c) == 0 for c in range(self._chunk + 1)])
        keep &= np.argmax(agree, axis=0) == self._chunk  # the first chunk they agree on
        return keep, distance.astype(np.uint8), column_flipped(column), column_window(column)


def search_window_bucket(
    chunk: int,
    hashes: np.ndarray,
    keys: np.ndarray,
    kinds: np.ndarray,
    rule: WindowRule = DEFAULT_RULE,
    *,
    blocks: np.ndarray | None = None,
    max_pairs: int | None = None,
) -> WindowBucketPairs:
    """The pairs one bucket owns, exactly: over every bucket of a set of examples, each pair
    ``window_search.find_window_pairs`` finds is emitted once.

    Args:
      chunk: the bucket's chunk in ``bucket_layout(rule.bucket_threshold)``.
      hashes: ``(E, W)`` uint64, every hash of each entry's example, whole frame first.
      keys: int64 example ids, one entry per example and kind; pairs are ordered by them.
      kinds: each entry's kind (``WHOLE``, ``MIRRORED``, ``1 + j`` for window ``j``).
      rule: the thresholds and scales.
      blocks: when the bucket is one block pair of a split bucket, each entry's block: only
        pairs across two blocks are owned.
      max_pairs: keep only the first this many pairs in key order (None: all).

    Raises:
      ValueError: for a chunk outside the layout or arrays of different lengths.
    """
    h = check_windows(hashes, rule)
    keys, kinds = np.asarray(keys, np.int64), np.asarray(kinds, np.uint8)
    if not 0 <= chunk <= rule.bucket_threshold:
        raise ValueError(f"chunk must be in [0, {rule.bucket_threshold}] for {rule}: {chunk}")
    if not h.shape[0] == keys.shape[0] == kinds.shape[0]:
        raise ValueError(f"hashes, keys, kinds differ: {h.shape}, {keys.shape}, {kinds.shape}")
    effective = entry_hashes(h, kinds)
    owner = _WindowOwner(chunk, h, keys, kinds, effective, rule)
    empty = (np.zeros(0, np.uint8), np.zeros(0, bool), np.zeros(0, np.int8))
    out = OwnedPairs(keys, blocks, max_pairs, owner, empty)
    shared = bucket_layout(rule.bucket_threshold)[chunk]  # every entry's bits alike there
    for a, b in bucket_candidates(effective, rule.bucket_threshold, shared):
        out.add(a, b)
    return WindowBucketPairs(*out.result())


def find_window_pairs_by_buckets(
    windows: np.ndarray, rule: WindowRule = DEFAULT_RULE, *, max_bucket_entries: int = 1 << 16
) -> tuple[WindowPairs, int]:
    """``find_window_pairs`` as the bucketed search runs it on an engine, in one process: for
    tests and benchmarks (``beam_pipelines.graph.near_duplicate_search`` runs the same
    functions, keyed by a shuffle).

    Returns:
      ``(pairs, largest)``: the pairs, equal to ``find_window_pairs``' (sorted, complete),
      and the most entries one search held.
    """
    h = check_windows(windows, rule)
    layout = bucket_layout(rule.bucket_threshold)
    n = h.shape[0]
    found: list[tuple[np.ndarray, ...]] = []
    largest = 0
    for chunk in range(len(layout)):
        kinds = chunk_kinds(rule, chunk)
        rows = np.tile(np.arange(n, dtype=np.int64), kinds.shape[0])
        kind = np.repeat(kinds, n)
        values = bucket_values(entry_hashes(h[rows], kind), layout, chunk)
        order = np.argsort(values, kind="stable")
        for members in np.split(order, np.flatnonzero(np.diff(values[order])) + 1):
            r, k = rows[members], kind[members]
            count = bucket_blocks(members.shape[0], max_bucket_entries)
            block = r % count
            for p, q in itertools.combinations_with_replacement(range(count), 2):
                sel = (block == p) | (block == q)
                largest = max(largest, int(sel.sum()))
                got = search_window_bucket(
                    chunk, h[r[sel]], r[sel], k[sel], rule, blocks=block[sel] if p != q else None
                )
                found.append(
                    (r[sel][got.row_a], r[sel][got.row_b], got.distance, got.flipped, got.window)
                )
    if not found:
        return WindowPairs(Pairs.empty(), np.zeros(0, np.int8)), largest
    first, second, distance, flipped, window = (np.concatenate(c) for c in zip(*found, strict=True))
    order = np.lexsort((second, first))
    pairs = Pairs(first[order], second[order], distance[order], flipped[order])
    return WindowPairs(pairs, window[order]), largest
