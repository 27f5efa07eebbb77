"""Near-duplicate pairs by multi-index hashing: exactly the brute-force pairs, and their meaning."""

from __future__ import annotations

import numpy as np
import pytest

from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    brute_force_pairs,
    bucket_layout,
    classify,
    find_pairs,
    leakage_moves,
    without_chunk,
)
from catalog.phash import FLIP_MASK


def _planted(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    for i in range(0, n // 5, 2):  # pairs at every distance 0-16
        bits = rng.choice(64, int(rng.integers(0, 17)), replace=False)
        hashes[i + 1] = hashes[i] ^ np.uint64(sum(1 << int(b) for b in bits))
    for i in range(n // 5, n // 5 + 40, 2):  # mirrored pairs
        bits = rng.choice(64, int(rng.integers(0, 9)), replace=False)
        flipped = hashes[i] ^ np.uint64(FLIP_MASK)
        hashes[i + 1] = flipped ^ np.uint64(sum(1 << int(b) for b in bits))
    hashes[n // 2 : n // 2 + 30] = hashes[n // 2]  # a crowded bucket: 30 equal hashes
    # Skewed hashes: many share their low 24 bits, as photos with a common layout do.
    hashes[-300:] = (hashes[-300:] & np.uint64(~0xFFFFFF & (2**64 - 1))) | np.uint64(0x5A5A5A)
    return hashes


def _as_tuples(pairs):
    return list(
        zip(
            pairs.first.tolist(),
            pairs.second.tolist(),
            pairs.distance.tolist(),
            pairs.flipped.tolist(),
            strict=True,
        )
    )


@pytest.fixture(scope="module")
def planted():
    return _planted(5000)


@pytest.mark.parametrize("threshold", [0, 1, 5, 8, 10, 16])
def test_index_finds_exactly_the_brute_force_pairs(planted, threshold):
    expected = _as_tuples(brute_force_pairs(planted, threshold))
    assert len(expected) >= 30 * 29 // 2  # the crowded bucket alone
    for chunks in (None, 3, 7) if threshold <= 12 else (None, 7):
        found = find_pairs(planted, threshold, chunks=chunks, method="index")
        assert _as_tuples(found) == expected, chunks
        # Positions are searched as 32-bit indexes and returned as int64, as documented.
        assert found.first.dtype == found.second.dtype == np.int64


@pytest.mark.parametrize("flips", [True, False])
def test_mirrored_pairs_are_found_only_with_flips(planted, flips):
    hashes = planted
    found = find_pairs(hashes, DEFAULT_THRESHOLD, flips=flips, method="index")
    assert _as_tuples(found) == _as_tuples(
        brute_force_pairs(hashes, DEFAULT_THRESHOLD, flips=flips)
    )
    assert bool(found.flipped.any()) == flips
    mirrored = np.flatnonzero(found.flipped)
    for k in mirrored:
        a, b = hashes[found.first[k]], hashes[found.second[k]]
        assert int(found.distance[k]) == (int(a) ^ int(b) ^ FLIP_MASK).bit_count()


def test_pairs_are_ordered_and_closest_distance_kept():
    hashes = np.array([0, 0b1, 0, FLIP_MASK], dtype=np.uint64)
    pairs = find_pairs(hashes, 2)
    assert _as_tuples(pairs) == [
        (0, 1, 1, False),
        (0, 2, 0, False),
        (0, 3, 0, True),
        (1, 2, 1, False),
        (1, 3, 1, True),
        (2, 3, 0, True),
    ]


def test_signed_and_python_int_hashes_are_read_as_their_64_bits():
    big = (1 << 64) - 1
    unsigned = find_pairs(np.array([big, big - 1], dtype=np.uint64), 1)
    from_ints = find_pairs([big, big - 1], 1)
    signed = find_pairs(np.array([big, big - 1], dtype=np.uint64).view(np.int64), 1)
    assert _as_tuples(unsigned) == _as_tuples(from_ints) == _as_tuples(signed) == [(0, 1, 1, False)]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="threshold must be in"):
        find_pairs(np.zeros(3, np.uint64), 17)
    with pytest.raises(TypeError, match="threshold must be an int"):
        find_pairs(np.zeros(3, np.uint64), 2.5)
    with pytest.raises(TypeError, match="uint64"):
        find_pairs(np.zeros(3, np.float64), 2)
    with pytest.raises(ValueError, match="1-D"):
        find_pairs(np.zeros((2, 2), np.uint64), 2)
    with pytest.raises(ValueError, match="method"):
        find_pairs(np.zeros(3, np.uint64), 2, method="fast")


def test_empty_and_single_inputs_have_no_pairs():
    assert len(find_pairs(np.zeros(0, np.uint64), 4)) == 0
    assert len(find_pairs(np.zeros(1, np.uint64), 4, method="index")) == 0


def test_classify_names_leakage_and_cross_class_pairs():
    hashes = np.array([7, 7, 7, 1 << 40], dtype=np.uint64)
    splits = ["train", "validation", "train", "validation"]
    labels = [0, 0, 1, 1]
    pairs = find_pairs(hashes, 0)
    assert _as_tuples(pairs) == [(0, 1, 0, False), (0, 2, 0, False), (1, 2, 0, False)]
    leakage, cross = classify(pairs, splits, labels)
    assert leakage.tolist() == [True, False, True]
    assert cross.tolist() == [False, True, True]


def test_leakage_moves_whole_components_to_train():
    # 0(train) ~ 1(val) ~ 2(val): both validation members move; 3(val) ~ 4(val) stay.
    far, other = 0x0F0F_0F0F_0F0F_0F0F, 0xF0F0_F0F0_F0F0_F0F0
    hashes = np.array([0, 1, 3, far, far | 0x100, other], dtype=np.uint64)
    splits = np.array(["train", "validation", "validation", "validation", "validation", "train"])
    pairs = find_pairs(hashes, 1)
    assert leakage_moves(pairs, splits).tolist() == [1, 2]
    assert leakage_moves(find_pairs(hashes[3:5], 1), splits[3:5]).tolist() == []


@pytest.mark.parametrize("method", ["index", "brute"])
def test_max_pairs_stops_a_crowd_and_says_so(method):
    hashes = np.zeros(5000, np.uint64)  # 12.5 million pairs at distance 0
    pairs = find_pairs(hashes, 0, method=method, max_pairs=1000)
    assert len(pairs) == 1000 and not pairs.complete
    assert find_pairs(hashes[:10], 0, max_pairs=1000).complete
    with pytest.raises(ValueError, match="max_pairs"):
        find_pairs(hashes, 0, max_pairs=0)


@pytest.mark.parametrize(
    ("flipped", "a", "b", "expected"),
    [
        (True, (500, 375), (500, 375), "mirror"),
        (False, (500, 375), (250, 188), "scale"),
        (False, (500, 375), (450, 375), "crop"),
        (True, (500, 375), (450, 300), "mirror+crop"),
        (False, (500, 375), (500, 375), "re-encode or edit"),
        (False, None, (500, 375), "unknown"),
    ],
)
def test_the_report_guesses_the_transformation(flipped, a, b, expected):
    from beam_pipelines.graph.leakage import guess_transformation

    assert guess_transformation(flipped, a, b) == expected


def test_a_buckets_shared_chunk_is_cut_out_and_its_pairs_stay_the_same():
    # Every entry of a bucket holds its chunk's bits alike; left in, they fill part of one of
    # the index's chunks with bits that never differ (15x the time at 120,000 entries).
    rng = np.random.default_rng(5)
    hashes = rng.integers(0, 2**64 - 1, 3000, dtype=np.uint64, endpoint=True)
    low, width = bucket_layout(8)[3]
    shared = (hashes & ~np.uint64(((1 << width) - 1) << low)) | np.uint64(0b1011001 << low)
    near = shared[:40] ^ (np.uint64(1) << rng.integers(0, 64, 40).astype(np.uint64))
    near &= ~np.uint64(((1 << width) - 1) << low)  # planted pairs keep the chunk too
    near |= np.uint64(0b1011001 << low)
    both = np.concatenate([shared, near])
    cut = without_chunk(both, low, width)
    assert cut is not None and int(cut.max()) < 2 ** (64 - width)
    rows = rng.integers(0, both.shape[0], (500, 2))
    distances = np.bitwise_count(both[rows[:, 0]] ^ both[rows[:, 1]])
    assert (np.bitwise_count(cut[rows[:, 0]] ^ cut[rows[:, 1]]) == distances).all()
    expected = find_pairs(both, 8, flips=False)
    assert len(expected.first) >= 40
    found = find_pairs(cut, 8, flips=False, bits=64 - width)
    assert found.first.tolist() == expected.first.tolist()
    assert found.second.tolist() == expected.second.tolist()
    # The top chunk too (a shift by the whole word), and the bottom one.
    for low, width in (bucket_layout(8)[-1], bucket_layout(8)[0]):
        alike = hashes & ~np.uint64(((1 << width) - 1) << low)
        kept = without_chunk(alike, low, width)
        assert kept is not None and int(kept.max()) < 2 ** (64 - width)
        assert (
            np.bitwise_count(kept[1:] ^ kept[:-1]) == np.bitwise_count(alike[1:] ^ alike[:-1])
        ).all()
    # Bits that differ are never cut, and fewer bits make no sense with mirrored pairs.
    assert without_chunk(hashes, low, width) is None
    with pytest.raises(ValueError, match="bits must be"):
        find_pairs(cut, 8, flips=True, bits=57)
