"""Every pair of examples the window rule joins, exactly: a crop of an image meets its original.

Each example has the hashes of its centred windows (``catalog.window_hashes``), whole frame
first, as ``(N, W)`` uint64. ``WindowRule`` says when two examples are near-duplicates:

* whole frame to whole frame within ``threshold`` bits, plainly or mirrored (as
  ``near_duplicates.find_pairs``);
* or the whole frame of one within ``window_threshold`` bits of a window of the other,
  plainly or mirrored (the whole frame's mirror against the window): a copy cropped by about
  ``1 - scale`` shows what the window at ``scale`` shows. Two windows are never compared.

A pair's *combinations* are the ways the rule can join it (``combination_distances``); the
pair's reported distance, window and flip are those of its best combination (the nearest,
then the whole frame before a window, the larger window first, plain before mirrored), so the
exact search here and the bucketed one (``catalog.window_buckets``) report the same.

``find_window_pairs`` finds every pair without comparing all pairs: ``find_pairs`` for whole
frames, and a multi-index search of the whole frames (plain and mirrored) against an index of
every window (``(W - 1) N`` entries): chunks of about log2 of that many bits, each probed at
the pigeonhole radius of ``window_threshold``, candidates checked on all 64 bits. Windows are
never probed against windows (most of the pairs of an index of every window hash).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    MAX_THRESHOLD,
    Pairs,
    check_hashes,
    chunk_layout,
    expanded_runs,
    find_pairs,
    probe_masks,
)
from catalog.phash import FLIP_MASK
from catalog.window_hashes import WINDOW_SCALES

__all__ = [
    "SEARCH_SCALES",
    "DEFAULT_WINDOW_THRESHOLD",
    "WindowRule",
    "DEFAULT_RULE",
    "WindowPairs",
    "combination_distances",
    "best_combinations",
    "column_window",
    "column_flipped",
    "check_windows",
    "find_window_pairs",
    "brute_force_window_pairs",
    "JUDGED_PER_PASS",
]

# Judging every pair costs N**2 / 2 window distances: the index is cheaper from about 150
# examples (256: 19 against 3 CPU-ms; 2,047: 915 against 73).
BRUTE_FORCE_BELOW = 256
# The centred windows the build stores and searches, whole frame first: a crop of up to 15 %
# is within 2.5 % of one of them (docs/pipeline.md, "Crops").
SEARCH_SCALES = WINDOW_SCALES
# Whole frame to window: one bit tighter than whole to whole, as there are 4 (W - 1) such
# comparisons a pair; the first false pair among the benchmark's photos came at 9
# (docs/benchmarks.md, the recall table).
DEFAULT_WINDOW_THRESHOLD = 7
_FLIP = np.uint64(FLIP_MASK)


@dataclasses.dataclass(frozen=True)
class WindowRule:
    """When two examples' window hashes make a near-duplicate pair.

    Attributes:
      threshold: whole frame to whole frame, in bits (``--near_duplicate_threshold``).
      window_threshold: whole frame to a window of the other (``--near_duplicate_window_
        threshold``).
      scales: the windows' relative sides, 1.0 (the whole frame) first; ``(1.0,)`` compares
        whole frames only.

    Raises:
      ValueError: for a threshold outside ``[0, MAX_THRESHOLD]`` or scales that do not start
        at 1.0 and fall, naming the flag or value.
    """

    threshold: int = DEFAULT_THRESHOLD
    window_threshold: int = DEFAULT_WINDOW_THRESHOLD
    scales: tuple[float, ...] = SEARCH_SCALES

    def __post_init__(self) -> None:
        for flag, value in (
            ("--near_duplicate_threshold", self.threshold),
            ("--near_duplicate_window_threshold", self.window_threshold),
        ):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{flag} must be an int, got {value!r}")
            if not 0 <= value <= MAX_THRESHOLD:
                raise ValueError(f"{flag} must be in [0, {MAX_THRESHOLD}] bits, got {value}")
        scales = tuple(self.scales)
        falling = all(a > b for a, b in zip(scales, scales[1:], strict=False))
        if not scales or scales[0] != 1.0 or not falling or scales[-1] <= 0:
            raise ValueError(f"window scales must start at 1.0 and fall above 0, got {scales}")

    @property
    def windows(self) -> int:
        """``W``: hashes per example, the whole frame included."""
        return len(self.scales)

    @property
    def bucket_threshold(self) -> int:
        """The largest distance any combination may have: what a search's pigeonhole uses."""
        return max(self.threshold, self.window_threshold if self.windows > 1 else 0)

    def combination_thresholds(self) -> np.ndarray:
        """The threshold of each column of ``combination_distances``."""
        return np.array(
            [self.threshold] * 2 + [self.window_threshold] * (4 * (self.windows - 1)), np.int64
        )

    def to_json(self) -> dict:
        """What ``dataset.json`` records of the rule."""
        return {
            "threshold": self.threshold,
            "window_threshold": self.window_threshold,
            "scales": list(self.scales),
        }


DEFAULT_RULE = WindowRule()


@dataclasses.dataclass(frozen=True)
class WindowPairs:
    """Pairs of examples and the window each matched at (0: whole frame to whole frame, else
    the index in ``WindowRule.scales`` of the window of the larger image the other shows)."""

    pairs: Pairs
    window: np.ndarray  # int8, one per pair

    def __len__(self) -> int:
        return len(self.pairs)


def combination_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(K, 2 + 4 (W - 1))`` Hamming distances of every way the rule can join ``a[k]`` and
    ``b[k]`` (``(K, W)`` each): whole to whole plain, then mirrored (``a``'s whole frame
    mirrored); then for each window ``j``: ``a``'s whole to ``b``'s window, ``b``'s whole to
    ``a``'s window, and the two again with the whole frame mirrored."""
    whole_a, whole_b = a[:, :1], b[:, :1]
    out = [np.bitwise_count(whole_a ^ whole_b), np.bitwise_count(whole_a ^ _FLIP ^ whole_b)]
    if a.shape[1] > 1:
        plain_ab, plain_ba = whole_a ^ b[:, 1:], whole_b ^ a[:, 1:]
        # (K, W - 1, 4): per window, the four ways; raveled window after window.
        ways = np.stack(
            [plain_ab, plain_ba, plain_ab ^ _FLIP, plain_ba ^ _FLIP], axis=2
        )  # fmt: skip
        out.append(np.bitwise_count(ways).reshape(a.shape[0], 4 * (a.shape[1] - 1)))
    return np.concatenate(out, axis=1).astype(np.int64)


def best_combinations(
    a: np.ndarray, b: np.ndarray, rule: WindowRule
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ok, column, distance)`` per pair ``a[k], b[k]``: whether a combination is within its
    threshold, and the best such (nearest; then the lower column of
    ``combination_distances``: the whole frame, then the larger windows, plain first)."""
    d = combination_distances(a, b)
    within = d <= rule.combination_thresholds()[None, :]
    width = d.shape[1]
    score = np.where(within, d * width + np.arange(width)[None, :], np.iinfo(np.int64).max)
    column = score.argmin(axis=1) if width else np.zeros(0, np.int64)
    ok: np.ndarray = np.asarray(within.any(axis=1))
    distance: np.ndarray = np.take_along_axis(d, column[:, None], 1)[:, 0]
    return ok, np.asarray(column), distance


def column_window(column: np.ndarray) -> np.ndarray:
    """The window index (0: whole frame) of columns of ``combination_distances``."""
    return np.where(column < 2, 0, (column - 2) // 4 + 1).astype(np.int8)


def column_flipped(column: np.ndarray) -> np.ndarray:
    """Whether columns of ``combination_distances`` compare a mirrored whole frame."""
    return (column == 1) | ((column >= 2) & ((column - 2) % 4 >= 2))


def check_windows(windows: np.ndarray, rule: WindowRule) -> np.ndarray:
    """``windows`` as ``(N, W)`` uint64 (signed int64 read as its bits).

    Raises:
      ValueError: for another shape, or a width other than the rule's.
      TypeError: for hashes that are not integers.
    """
    array = np.asarray(windows)
    if array.ndim != 2 or array.shape[1] != rule.windows:
        raise ValueError(
            f"window hashes must be (N, {rule.windows}) for scales {rule.scales}, "
            f"got shape {array.shape}"
        )
    flat = check_hashes(array.reshape(-1), rule.bucket_threshold)
    return flat.reshape(array.shape)


# Candidates checked per numpy pass of the window index: each costs about 50 bytes while it
# is checked (``find_pairs`` takes 8 M at a time; here every query probes three windows each).
_CANDIDATES = 1 << 21
# Pairs judged per numpy pass: ``combination_distances`` holds 8 (2 + 4 (W - 1)) bytes a pair,
# and ``best_combinations`` about 300 bytes a pair in all while it judges them.
JUDGED_PER_PASS = 1 << 18


def _judged(first: np.ndarray, second: np.ndarray, h: np.ndarray, rule: WindowRule):
    """``(first, second, column, distance)`` of the pairs the rule joins among candidates."""
    parts = []
    for start in range(0, first.shape[0], JUDGED_PER_PASS):
        a, b = first[start : start + JUDGED_PER_PASS], second[start : start + JUDGED_PER_PASS]
        ok, column, distance = best_combinations(h[a], h[b], rule)
        parts.append((a[ok], b[ok], column[ok], distance[ok]))
    if not parts:
        return tuple(np.zeros(0, np.int64) for _ in range(4))
    return tuple(np.concatenate(c) for c in zip(*parts, strict=True))


def _result(first, second, h, rule, max_pairs) -> WindowPairs:
    """The candidate example pairs ``first < second`` (sorted, distinct) judged by the rule:
    one per pair, at most ``max_pairs``."""
    first, second, column, distance = _judged(first, second, h, rule)
    complete = max_pairs is None or first.shape[0] < max_pairs
    if not complete:
        first, second, column, distance = (x[:max_pairs] for x in (first, second, column, distance))
    pairs = Pairs(
        first, second, distance.astype(np.uint8), column_flipped(column), complete=complete
    )
    return WindowPairs(pairs, column_window(column))


def brute_force_window_pairs(
    windows: np.ndarray, rule: WindowRule = DEFAULT_RULE, *, max_pairs: int | None = None
) -> WindowPairs:
    """``find_window_pairs`` by judging every pair: for small inputs and tests."""
    h = check_windows(windows, rule)
    first, second = np.triu_indices(h.shape[0], 1)  # sorted by (first, second)
    return _result(first.astype(np.int64), second.astype(np.int64), h, rule, max_pairs)


def _window_candidates(h: np.ndarray, rule: WindowRule, limit: int | None) -> np.ndarray:
    """Keys ``first * N + second`` of the example pairs whose whole frame (plain or mirrored)
    is within ``window_threshold`` of a window of the other: a multi-index search of the
    whole frames against an index of every window."""
    n, w = h.shape
    windows = np.ascontiguousarray(h[:, 1:]).reshape(-1)  # entry e: example e // (w - 1)
    queries = np.concatenate([h[:, 0], h[:, 0] ^ _FLIP])  # query q: example q % n
    layout = chunk_layout(windows.shape[0], None)
    per_chunk, extra = divmod(rule.window_threshold, len(layout))
    found: list[np.ndarray] = []
    held = 0
    for index, (low, width) in enumerate(layout):
        radius = per_chunk if index <= extra else per_chunk - 1
        if radius < 0:
            continue
        mask = np.uint64((1 << width) - 1)
        keys = ((windows >> np.uint64(low)) & mask).astype(np.int32)  # chunks <= 22 bits
        order = np.argsort(keys, kind="stable").astype(np.int32)
        offsets = np.zeros((1 << width) + 1, np.int64 if windows.shape[0] >= 2**31 else np.int32)
        np.cumsum(np.bincount(keys, minlength=1 << width), out=offsets[1:])
        del keys
        sorted_windows = windows[order]
        query_keys = ((queries >> np.uint64(low)) & mask).astype(np.int32)
        every = np.arange(queries.shape[0], dtype=np.int64)
        for m in probe_masks(width, radius):
            probe = query_keys ^ np.int32(m)
            starts = offsets[probe]
            counts = offsets[probe + 1] - starts
            for q, at in expanded_runs(every, starts, counts, _CANDIDATES):
                near = np.bitwise_count(queries[q] ^ sorted_windows[at]) <= rule.window_threshold
                a, b = q[near] % n, order[at[near]].astype(np.int64) // (w - 1)
                other = a != b
                a, b = a[other], b[other]
                found.append(np.minimum(a, b) * np.int64(n) + np.maximum(a, b))
                held += a.shape[0]
            if held > 4 * (limit or 1 << 22):
                found, held = [np.unique(np.concatenate(found))], 0
                if limit is not None and found[0].shape[0] >= 2 * limit:
                    return found[0]
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def find_window_pairs(
    windows: np.ndarray,
    rule: WindowRule = DEFAULT_RULE,
    *,
    method: str = "auto",
    max_pairs: int | None = None,
) -> WindowPairs:
    """Finds every pair of examples the window rule joins.

    Args:
      windows: ``(N, W)`` uint64 window hashes, whole frame first (``W == rule.windows``).
      rule: the thresholds and scales.
      method: ``"auto"`` (brute force below ``BRUTE_FORCE_BELOW`` examples), ``"index"`` or
        ``"brute"``.
      max_pairs: keep about this many pairs (the first in ``(first, second)`` order of those
        met); the result then says ``complete=False``. None: no limit.

    Returns:
      ``WindowPairs``: ``first < second``, sorted, one per example pair, with its best
      combination's distance, flip and window.

    Raises:
      ValueError: for input that is not ``(N, W)``, an unknown method or ``max_pairs < 1``.
      TypeError: for hashes that are not unsigned ints.
    """
    if method not in ("auto", "index", "brute"):
        raise ValueError(f"method must be 'auto', 'index' or 'brute', got {method!r}")
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs!r}")
    h = check_windows(windows, rule)
    n = h.shape[0]
    if method == "brute" or (method == "auto" and n < BRUTE_FORCE_BELOW):
        return brute_force_window_pairs(h, rule, max_pairs=max_pairs)
    whole = find_pairs(h[:, 0], rule.threshold, max_pairs=max_pairs)
    keys = [whole.first * np.int64(n) + whole.second]
    if rule.windows > 1:
        keys.append(_window_candidates(h, rule, max_pairs))
    key = np.unique(np.concatenate(keys))
    found = _result(key // n, key % n, h, rule, max_pairs)
    if whole.complete:
        return found
    return WindowPairs(dataclasses.replace(found.pairs, complete=False), found.window)
