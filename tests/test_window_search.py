"""The window rule's searches: crops meet their originals, exactly, gathered and by bucket.

Random window hashes with planted crops (a whole frame near a window of another example),
mirrored crops, whole-frame copies (re-encodes, mirrors), a crowd of identical hashes (blank
images) and distinct examples; the index search, the bucketed search (whole buckets and
buckets split into blocks) and brute force must find the same pairs with the same distance,
flip and window.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from catalog.near_duplicates import find_pairs
from catalog.phash import FLIP_MASK
from catalog.window_buckets import find_window_pairs_by_buckets, search_window_bucket
from catalog.window_search import (
    WindowRule,
    best_combinations,
    brute_force_window_pairs,
    combination_distances,
    find_window_pairs,
)

_FLIP = np.uint64(FLIP_MASK)


def _noise(rng, n: int) -> np.ndarray:
    """``n`` random bit masks of 0-3 bits."""
    out = np.zeros(n, np.uint64)
    for _ in range(3):
        bit = rng.integers(0, 64, n).astype(np.uint64)
        out ^= np.where(rng.random(n) < 0.7, np.uint64(1) << bit, np.uint64(0))
    return out


def planted_windows(n: int, seed: int = 0, windows: int = 4) -> np.ndarray:
    """``(n, windows)`` uint64 window hashes: a sixth each are crops of an earlier example (the
    whole frame a window of it, a few bits off), mirrored crops, whole-frame copies and
    mirrored copies, and a crowd of one hash (blank images); the rest distinct."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**64, (n, windows), dtype=np.uint64)
    sixth = n // 6
    source = np.arange(sixth)
    if windows > 1:
        j = rng.integers(1, windows, sixth)
        h[sixth : 2 * sixth, 0] = h[source, j] ^ _noise(rng, sixth)
        j = rng.integers(1, windows, sixth)
        h[2 * sixth : 3 * sixth, 0] = h[source, j] ^ _FLIP ^ _noise(rng, sixth)
    h[3 * sixth : 4 * sixth] = h[source] ^ _noise(rng, sixth)[:, None]
    h[4 * sixth : 5 * sixth, 0] = h[source, 0] ^ _FLIP ^ _noise(rng, sixth)
    h[5 * sixth : 5 * sixth + sixth // 3] = h[-1]  # a crowd of identical examples
    return h


def _assert_same(got, expected) -> None:
    for field in ("first", "second", "distance", "flipped"):
        np.testing.assert_array_equal(
            getattr(got.pairs, field), getattr(expected.pairs, field), field
        )
    np.testing.assert_array_equal(got.window, expected.window)


@pytest.mark.parametrize(
    ("threshold", "window_threshold", "scales"),
    [(8, 6, (1.0, 0.95, 0.9, 0.85)), (6, 8, (1.0, 0.9)), (3, 2, (1.0, 0.95, 0.9)), (8, 6, (1.0,))],
)
def test_the_index_search_finds_exactly_the_brute_force_pairs(threshold, window_threshold, scales):
    rule = WindowRule(threshold, window_threshold, scales)
    h = planted_windows(2000, seed=threshold, windows=len(scales))
    expected = brute_force_window_pairs(h, rule)
    got = find_window_pairs(h, rule, method="index")
    _assert_same(got, expected)
    assert len(expected) > 500 and expected.pairs.flipped.any()
    if len(scales) > 1:
        assert set(expected.window.tolist()) == set(range(len(scales)))  # crops found
    else:
        whole = find_pairs(h[:, 0], threshold)
        np.testing.assert_array_equal(got.pairs.first, whole.first)


@pytest.mark.parametrize(
    ("threshold", "window_threshold", "max_entries"),
    [(8, 6, 1 << 16), (8, 6, 40), (4, 7, 1 << 16), (0, 0, 30), (16, 16, 1 << 16)],
)
def test_every_bucket_together_finds_exactly_the_gathered_pairs(
    threshold, window_threshold, max_entries
):
    rule = WindowRule(threshold, window_threshold)
    h = planted_windows(900, seed=threshold + window_threshold)
    expected = find_window_pairs(h, rule)
    got, largest = find_window_pairs_by_buckets(h, rule, max_bucket_entries=max_entries)
    _assert_same(got, expected)
    assert len(expected) > 100 and (expected.window > 0).any()
    if max_entries < 100:
        assert largest <= 2 * max_entries  # the crowd was split into blocks


def test_a_pair_is_reported_by_its_best_combination():
    rule = WindowRule(8, 6, (1.0, 0.95, 0.9, 0.85))
    # Windows 32 bits from 0, ~0 and their mirrors (FLIP_MASK is 0xAAAA...).
    windows = [0x5A5A_5A5A_5A5A_5A5A, 0x3C3C_3C3C_3C3C_3C3C, 0x6969_6969_6969_6969]
    a = np.array([[0, *windows]], np.uint64)
    far = 0x0F0F_0F0F_0F0F_0F0F  # 32 bits from everything of a's
    crop = np.array([[windows[1] ^ 0b111, far, far, far]], np.uint64)  # a's 90 % window
    found = brute_force_window_pairs(np.concatenate([a, crop]), rule)
    assert found.pairs.distance.tolist() == [3] and found.window.tolist() == [2]
    mirrored = crop.copy()
    mirrored[0, 0] ^= np.uint64(FLIP_MASK)
    found = brute_force_window_pairs(np.concatenate([mirrored, a]), rule)
    assert found.pairs.flipped.tolist() == [True] and found.window.tolist() == [2]
    # Two windows alike are not a pair: windows are only compared with whole frames.
    b = np.array([[~np.uint64(0), *windows]], np.uint64)
    assert len(brute_force_window_pairs(np.concatenate([a, b]), rule)) == 0
    assert combination_distances(a, b).shape == (1, 2 + 4 * 3)


def test_the_window_threshold_is_its_own():
    rule = WindowRule(8, 2, (1.0, 0.9))
    a = np.array([0x0F0F_0F0F_0F0F_0F0F, 1 << 40], np.uint64)  # 32 bits from the others
    near = np.array([(1 << 40) ^ 0b11, 0x5A5A_5A5A_5A5A_5A5A], np.uint64)  # 2 bits off
    far = np.array([(1 << 40) ^ 0b111, 0x5A5A_5A5A_5A5A_5A5A], np.uint64)  # 3 bits off
    assert len(brute_force_window_pairs(np.stack([a, near]), rule)) == 1
    assert len(brute_force_window_pairs(np.stack([a, far]), rule)) == 0


def test_max_pairs_bounds_the_result():
    h = np.zeros((400, 4), np.uint64)  # blank images: every window equal
    found = find_window_pairs(h, max_pairs=100, method="index")
    assert len(found) == 100 and not found.pairs.complete
    assert not found.window.any()  # whole frame to whole frame first, on a tie
    pairs = list(zip(found.pairs.first.tolist(), found.pairs.second.tolist(), strict=True))
    assert pairs == list(itertools.combinations(range(400), 2))[:100]


def test_a_bucket_keeps_its_first_pairs_in_key_order():
    h = np.full((60, 4), 12345, np.uint64)
    keys = np.arange(60, dtype=np.int64)[::-1].copy()
    found = search_window_bucket(0, h, keys, np.zeros(60, np.uint8), max_pairs=100)
    pairs = list(zip(keys[found.row_a].tolist(), keys[found.row_b].tolist(), strict=True))
    assert pairs == [(a, b) for a in range(60) for b in range(a + 1, 60)][:100]


def test_a_bucket_judges_pairs_of_two_examples_a_bounded_number_at_a_time(monkeypatch):
    # 30 examples, each in the bucket as its whole frame and three windows equal to it (as a
    # photo's windows are near its whole frame): its own entries are one another's candidates.
    rng = np.random.default_rng(5)
    whole = rng.integers(0, 2**63, 30, dtype=np.uint64)
    whole[10:20] = whole[:10] ^ np.uint64(1 << 63)  # ten copies one bit off, outside chunk 0
    h = np.repeat(np.repeat(whole[:, None], 4, axis=1), 4, axis=0)
    keys = np.repeat(np.arange(30, dtype=np.int64), 4)
    kinds = np.tile(np.array([0, 2, 3, 4], np.uint8), 30)
    judged: list[int] = []

    def recording(a, b, rule):
        assert not (a == b).all(axis=1).any(), "an example's own entries were judged"
        judged.append(a.shape[0])
        return best_combinations(a, b, rule)

    monkeypatch.setattr("catalog.window_buckets.best_combinations", recording)
    monkeypatch.setattr("catalog.window_buckets.JUDGED_PER_PASS", 7)
    found = search_window_bucket(0, h, keys, kinds)
    pairs = sorted(zip(keys[found.row_a].tolist(), keys[found.row_b].tolist(), strict=True))
    assert pairs == [(i, i + 10) for i in range(10)]
    assert found.distance.tolist() == [1] * 10 and not found.window.any()
    assert len(judged) > 1 and max(judged) <= 7


def test_bad_rules_and_inputs_are_named():
    with pytest.raises(ValueError, match="--near_duplicate_window_threshold"):
        WindowRule(window_threshold=17)
    with pytest.raises(ValueError, match="--near_duplicate_threshold"):
        WindowRule(threshold=-1)
    with pytest.raises(ValueError, match="start at 1.0"):
        WindowRule(scales=(0.9, 1.0))
    with pytest.raises(ValueError, match=r"\(N, 4\)"):
        find_window_pairs(np.zeros(4, np.uint64))
    with pytest.raises(ValueError, match="method"):
        find_window_pairs(np.zeros((4, 4), np.uint64), method="fast")
    with pytest.raises(ValueError, match="chunk must be in"):
        search_window_bucket(9, np.zeros((2, 4), np.uint64), np.arange(2), np.zeros(2))
