"""Every pair of examples whose perceptual hashes are within a Hamming distance, and what it means.

``find_pairs`` returns *all* pairs within the threshold, exactly, without comparing all pairs:
multi-index hashing (Norouzi, Punjani & Fleet, "Fast Search in Hamming Space with Multi-Index
Hashing", CVPR 2012). The 64 bits are cut into ``m`` chunks of about ``log2(N)`` bits, each
indexed as a bucket table. Two hashes within distance ``r = m * s + a`` (``0 <= a < m``) are
within ``s`` on one of the first ``a + 1`` chunks, or within ``s - 1`` on one of the others
(pigeonhole), so probing each hash's chunk buckets at those radii finds every candidate; a
full 64-bit popcount keeps the true pairs. Everything is vectorised numpy, in bounded batches.

With ``flips=True`` the search also probes with each hash's mirrored hash
(``catalog.phash.FLIP_MASK``), so horizontally flipped copies are found too.

``classify`` then names what each pair means for a dataset: a train-validation pair is
*leakage* (the validation score is inflated by it), a pair with two labels is *cross-class*
(one of the labels may be wrong). ``leakage_moves`` picks the validation examples to move to
train so that no leakage remains; ``leakage_remedy`` tells a person how to have them moved.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from catalog.phash import FLIP_MASK, HASH_BITS

__all__ = [
    "DEFAULT_THRESHOLD",
    "MAX_THRESHOLD",
    "Pairs",
    "find_pairs",
    "brute_force_pairs",
    "classify",
    "leakage_moves",
    "leakage_remedy",
    "bucket_layout",
    "bucket_values",
    "BucketPairs",
    "bucket_blocks",
    "bucket_candidates",
    "without_chunk",
    "OwnedPairs",
    "check_hashes",
    "chunk_layout",
    "probe_masks",
    "expanded_runs",
]

# Chosen from the measured recall/precision (README, "Near-duplicates"): 10 keeps every
# re-encoded, resized, brightened and mirrored copy and most 5% crops, and no distinct photo
# pair of the benchmark's 2,000 came within it.
DEFAULT_THRESHOLD = 8
MAX_THRESHOLD = 16  # beyond this the probes grow fast and unrelated photos start to match
# Judging every pair is cheaper only for a few hundred hashes (512: 3.6 against 2.8 CPU-ms;
# 4,095: 140 against 13).
_BRUTE_FORCE_BELOW = 512
_EXPAND_LIMIT = 8_000_000  # candidate pairs materialised at once
_PROBE_LIMIT = 4_000_000  # bucket probes (queries x masks) per batch


@dataclasses.dataclass(frozen=True)
class Pairs:
    """Pairs of positions ``first < second`` into the hash array, sorted by ``(first, second)``.

    Attributes:
      first, second: int64 positions.
      distance: uint8 Hamming distance (the smaller of plain and mirrored when ``flipped``).
      flipped: True where the pair matched as mirror images (closer mirrored than as is).
      complete: False when the search stopped at ``max_pairs``: these are some of the pairs.
    """

    first: np.ndarray
    second: np.ndarray
    distance: np.ndarray
    flipped: np.ndarray
    complete: bool = True

    def __len__(self) -> int:
        return int(self.first.shape[0])

    @staticmethod
    def empty() -> Pairs:
        return Pairs(
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros(0, bool)
        )


def check_hashes(hashes: np.ndarray, threshold: int) -> np.ndarray:
    """``hashes`` as a 1-D uint64 array (signed int64 read as its bits), after checking them
    and ``threshold``.

    Raises:
      TypeError, ValueError: naming the bad threshold, shape or dtype.
    """
    if not isinstance(threshold, int) or isinstance(threshold, bool):
        raise TypeError(f"threshold must be an int, got {threshold!r}")
    if not 0 <= threshold <= MAX_THRESHOLD:
        raise ValueError(
            f"near-duplicate threshold must be in [0, {MAX_THRESHOLD}] bits, got {threshold}"
        )
    array = np.asarray(hashes)
    if array.dtype == object:  # Python ints above 2**63 - 1
        array = np.array(hashes, dtype=np.uint64)
    if array.ndim != 1:
        raise ValueError(f"hashes must be a 1-D array, got shape {array.shape}")
    if array.dtype == np.int64:
        return array.view(np.uint64)  # the same 64 bits, as a signed store would hold them
    if array.dtype.kind != "u" and array.size:
        raise TypeError(f"hashes must be uint64 (the catalog's 'phash'), got dtype {array.dtype}")
    return array.astype(np.uint64, copy=False)  # no second copy of a large bucket's hashes


class _Enough(Exception):  # control flow: max_pairs reached
    pass


def _finish(firsts, seconds, distances, flips, n: int, max_pairs: int | None = None) -> Pairs:
    if not firsts:
        return Pairs.empty()
    first = np.concatenate(firsts)
    second = np.concatenate(seconds)
    distance = np.concatenate(distances)
    flipped = np.concatenate(flips)
    key = first * np.int64(max(n, 1)) + second
    # The same pair may be found through several chunks, plainly and mirrored: keep the closest.
    order = np.lexsort((flipped, distance, key))
    key = key[order]
    keep = np.ones(key.shape[0], bool)
    keep[1:] = key[1:] != key[:-1]
    chosen = order[keep]
    complete = max_pairs is None or chosen.shape[0] < max_pairs
    if not complete:
        chosen = chosen[:max_pairs]  # in (first, second) order: deterministic
    return Pairs(
        first[chosen], second[chosen], distance[chosen].astype(np.uint8), flipped[chosen], complete
    )


def brute_force_pairs(
    hashes: np.ndarray, threshold: int, *, flips: bool = True, max_pairs: int | None = None
) -> Pairs:
    """The same result as ``find_pairs`` by comparing all pairs: for small inputs and tests."""
    h = check_hashes(hashes, threshold)
    n = h.shape[0]
    firsts, seconds, distances, flipped = [], [], [], []
    block = max(1, 4_000_000 // max(n, 1))
    for start in range(0, n, block):
        rows = np.arange(start, min(n, start + block))
        for mirrored in (False, True) if flips else (False,):
            query = h[rows] ^ np.uint64(FLIP_MASK) if mirrored else h[rows]
            dist = np.bitwise_count(query[:, None] ^ h[None, :])
            r, c = np.nonzero(dist <= threshold)
            r_abs = rows[r]
            keep = r_abs < c
            firsts.append(r_abs[keep].astype(np.int64))
            seconds.append(c[keep].astype(np.int64))
            distances.append(dist[r[keep], c[keep]].astype(np.uint8))
            flipped.append(np.full(int(keep.sum()), mirrored))
        if max_pairs is not None and sum(len(f) for f in firsts) >= 2 * max_pairs:
            break
    return _finish(firsts, seconds, distances, flipped, n, max_pairs)


def chunk_layout(n: int, chunks: int | None, bits: int = HASH_BITS) -> list[tuple[int, int]]:
    """``(low bit, width)`` of the multi-index chunks for ``n`` hashes that differ only in their
    low ``bits`` bits (``chunks`` of them, or about ``bits / log2(n)`` when None; 3 to 16)."""
    if chunks is None:
        # About log2(N) bits per chunk: buckets then hold ~1 hash each (Norouzi et al.).
        chunks = round(bits / max(math.log2(max(n, 2)), 1.0))
    chunks = max(3, min(int(chunks), 16))  # >= 3: chunk tables of at most 2**22 buckets
    return _even_chunks(chunks, bits)


def _even_chunks(chunks: int, bits: int = HASH_BITS) -> list[tuple[int, int]]:
    """``(low bit, width)`` of ``chunks`` chunks of the low ``bits`` bits, widths differing by
    at most one."""
    width, extra = divmod(bits, chunks)
    layout, low = [], 0
    for i in range(chunks):
        w = width + (1 if i < extra else 0)
        layout.append((low, w))
        low += w
    return layout


def probe_masks(width: int, radius: int) -> list[int]:
    """Every mask of at most ``radius`` set bits on a ``width``-bit chunk, 0 first."""
    masks = [0]
    for k in range(1, radius + 1):
        for bits in itertools.combinations(range(width), k):
            masks.append(sum(1 << b for b in bits))
    return masks


class _Collector:
    """Checks candidate pairs with the full 64-bit distance and keeps the near ones.

    Candidates arrive as positions in one chunk's sorted order, whose hashes (``sorted_hashes``)
    are read in runs; only the near pairs are mapped back to input positions.
    """

    def __init__(self, threshold: int, flips: bool, max_pairs: int | None = None) -> None:
        self._threshold = threshold
        self._flips = flips
        # Raw finds include repeats (a pair found through several chunks): stop at twice.
        self._limit = None if max_pairs is None else 2 * max_pairs
        self._found = 0
        self.firsts: list[np.ndarray] = []
        self.seconds: list[np.ndarray] = []
        self.distances: list[np.ndarray] = []
        self.flipped: list[np.ndarray] = []

    def add(
        self,
        query_hashes: np.ndarray,
        query_positions: np.ndarray,
        candidates: np.ndarray,
        sorted_hashes: np.ndarray,
        order: np.ndarray,
    ) -> None:
        x = query_hashes ^ sorted_hashes[candidates]
        distance = np.bitwise_count(x)
        near = distance <= self._threshold
        if self._flips:
            mirrored = np.bitwise_count(x ^ np.uint64(FLIP_MASK))
            near |= mirrored <= self._threshold
        if not near.any():
            return
        distance = distance[near]
        flipped = np.zeros(distance.shape, bool)
        if self._flips:
            mirrored = mirrored[near]
            flipped = mirrored < distance
            distance = np.minimum(distance, mirrored)
        a = order[query_positions[near]].astype(np.int64)
        b = order[candidates[near]].astype(np.int64)
        self.firsts.append(np.minimum(a, b))
        self.seconds.append(np.maximum(a, b))
        self.distances.append(distance.astype(np.uint8))
        self.flipped.append(flipped)
        self._found += a.shape[0]
        if self._limit is not None and self._found >= self._limit:
            raise _Enough


def _expand(
    queries: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    sorted_hashes: np.ndarray,
    order: np.ndarray,
    out: _Collector,
) -> None:
    """Pairs each query (a sorted position) with the ``counts[i]`` sorted positions from
    ``starts[i]``, in bounded pieces."""
    for query_positions, candidates in expanded_runs(queries, starts, counts):
        out.add(sorted_hashes[query_positions], query_positions, candidates, sorted_hashes, order)


def expanded_runs(queries, starts, counts, limit: int = _EXPAND_LIMIT):
    """Yields ``(queries repeated, positions)``: each ``queries[i]`` beside the ``counts[i]``
    positions from ``starts[i]``, at most about ``limit`` pairs at a time."""
    nonzero = np.flatnonzero(counts)
    queries, starts, counts = queries[nonzero], starts[nonzero], counts[nonzero]
    del nonzero
    totals = np.cumsum(counts, dtype=np.int64)
    begin = 0
    while begin < counts.shape[0]:
        base = totals[begin - 1] if begin else 0
        stop = max(begin + 1, int(np.searchsorted(totals, base + limit, side="right")))
        c = counts[begin:stop]
        ends = totals[begin:stop] - base
        positions = np.arange(ends[-1], dtype=np.int64)
        positions += np.repeat(starts[begin:stop] - (ends - c), c)
        yield np.repeat(queries[begin:stop], c), positions
        begin = stop


def find_pairs(
    hashes: np.ndarray,
    threshold: int = DEFAULT_THRESHOLD,
    *,
    flips: bool = True,
    chunks: int | None = None,
    method: str = "auto",
    max_pairs: int | None = None,
    bits: int = HASH_BITS,
) -> Pairs:
    """Finds every pair of hashes within ``threshold`` bits of each other.

    Args:
      hashes: 1-D ``uint64`` array (positions identify the examples).
      threshold: the largest Hamming distance that counts, 0-16.
      flips: also find pairs that match when one is mirrored left-right.
      chunks: multi-index chunk count; default about ``64 / log2(N)``.
      method: ``"auto"`` (brute force below 512 hashes), ``"index"`` or ``"brute"``.
      max_pairs: stop after about this many pairs (a set of thousands of copies of one image
        has millions); the result then says ``complete=False``. None: no limit.
      bits: the hashes differ only in their low ``bits`` bits (no flips then): the index's
        chunks cover those alone, so none is wasted on bits that every hash shares.

    Returns:
      ``Pairs`` with ``first < second``, sorted.

    Raises:
      ValueError: for a threshold outside 0-16, a non 1-D input, an unknown method, or
        ``bits`` outside 16-64 or below 64 with ``flips``.
      TypeError: for a non-integer threshold or hashes that are not unsigned ints.
    """
    if method not in ("auto", "index", "brute"):
        raise ValueError(f"method must be 'auto', 'index' or 'brute', got {method!r}")
    h = check_hashes(hashes, threshold)
    n = h.shape[0]
    if max_pairs is not None and max_pairs < 1:
        raise ValueError(f"max_pairs must be >= 1 or None, got {max_pairs!r}")
    if not 16 <= bits <= HASH_BITS or (flips and bits < HASH_BITS):
        raise ValueError(f"bits must be in 16-64, and 64 with flips; got {bits!r}")
    if method == "brute" or (method == "auto" and n < _BRUTE_FORCE_BELOW):
        return brute_force_pairs(h, threshold, flips=flips, max_pairs=max_pairs)
    layout = chunk_layout(n, chunks, bits)
    per_chunk, extra = divmod(threshold, len(layout))
    out = _Collector(threshold, flips, max_pairs)
    try:
        for index, (low, width) in enumerate(layout):
            radius = per_chunk if index <= extra else per_chunk - 1
            if radius >= 0:
                _search_chunk(h, low, width, radius, flips, out)
    except _Enough:
        pass
    return _finish(out.firsts, out.seconds, out.distances, out.flipped, n, max_pairs)


def _position_type(n: int) -> type[np.signedinteger]:
    """The narrowest index type for positions and bucket offsets below ``n``: every array of
    ``n`` of them is held at once while a chunk is searched."""
    return np.int32 if n < 2**31 else np.int64


def _search_chunk(
    h: np.ndarray, low: int, width: int, radius: int, flips: bool, out: _Collector
) -> None:
    """Every pair whose keys on this chunk differ by a mask of at most ``radius`` bits (or by
    such a mask XOR the chunk's mirror bits), each pair produced once."""
    index = _position_type(h.shape[0])
    keys = h >> np.uint64(low)
    keys &= np.uint64((1 << width) - 1)
    keys = keys.astype(np.int32)  # a chunk is at most 22 bits wide (chunk_layout)
    order = np.argsort(keys, kind="stable").astype(index)
    sorted_keys = keys[order]
    del keys
    sorted_hashes = h[order]
    offsets = np.zeros((1 << width) + 1, index)
    np.cumsum(np.bincount(sorted_keys, minlength=1 << width), out=offsets[1:])
    masks = set(probe_masks(width, radius))
    if flips:
        mirror = (FLIP_MASK >> low) & ((1 << width) - 1)
        masks |= {mirror ^ m for m in masks}
    # Mask 0, within a bucket: each item with the ones after it in sorted order.
    if 0 in masks:
        positions = np.arange(sorted_keys.shape[0], dtype=index)
        after = offsets[sorted_keys + 1]
        after -= positions
        after -= 1
        _expand(positions, positions + 1, after, sorted_hashes, order, out)
        del positions, after
        masks.discard(0)
    # Mask e: keys k and k ^ e pair up; probing only from the side whose key has e's highest bit
    # clear produces each pair once. Masks sharing that bit share the probing keys.
    by_bit: dict[int, list[int]] = {}
    for m in masks:
        by_bit.setdefault(m.bit_length() - 1, []).append(m)
    for bit, group in sorted(by_bit.items()):
        side = np.flatnonzero(((sorted_keys >> bit) & 1) == 0).astype(index)
        side_keys = sorted_keys[side]
        for m in sorted(group):
            probe = side_keys ^ m
            starts = offsets[probe]
            _expand(side, starts, offsets[probe + 1] - starts, sorted_hashes, order, out)


def classify(
    pairs: Pairs, splits: Sequence[str] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which pairs are train-validation leakage and which join two classes.

    Args:
      pairs: from ``find_pairs``.
      splits: the split name of every position (``"train"``, ``"validation"``…).
      labels: the label of every position.

    Returns:
      ``(leakage, cross_class)`` boolean arrays over the pairs. Leakage is any pair whose two
      members are in different splits one of which is ``train``.
    """
    split = np.asarray(splits, dtype=object)
    label = np.asarray(labels)
    a, b = split[pairs.first], split[pairs.second]
    leakage = (a != b) & ((a == "train") | (b == "train"))
    cross = label[pairs.first] != label[pairs.second]
    return np.asarray(leakage, bool), np.asarray(cross, bool)


def leakage_moves(pairs: Pairs, splits: Sequence[str] | np.ndarray) -> np.ndarray:
    """The positions of the non-train examples to move to train so that no leakage remains.

    A validation example moves when it is joined to a train example through a chain of
    near-duplicate pairs (its connected component holds a train example): moving only direct
    partners would leave a validation near-duplicate of the moved one behind. The result
    depends only on the pairs and splits, never on order.

    Returns:
      Sorted int64 positions.
    """
    split = np.asarray(splits, dtype=object)
    n = split.shape[0]
    parent = np.arange(n, dtype=np.int64)

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = int(parent[x])
        return x

    for a, b in zip(pairs.first.tolist(), pairs.second.tolist(), strict=True):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    involved = np.unique(np.concatenate([pairs.first, pairs.second]))
    roots = np.array([root(int(i)) for i in involved], dtype=np.int64)
    has_train = set(roots[split[involved] == "train"].tolist())
    moving = [
        int(i)
        for i, r in zip(involved.tolist(), roots.tolist(), strict=True)
        if r in has_train and split[i] != "train"
    ]
    return np.asarray(sorted(moving), dtype=np.int64)


def leakage_remedy(dataset: str) -> str:
    """What to do about a dataset's train-validation leakage, in one sentence for people: the
    build's summary, the report's banner and ``inspect --fail_on_leakage`` all say it.

    Args:
      dataset: the dataset directory or URI, named as the ``--base`` of the rebuild.
    """
    return (
        "rebuild with --leakage move_to_train: it moves the validation member of each leaking "
        "pair into train, before the shards are written; with --base "
        f"{dataset} and a new --output the rebuild reuses this dataset's examples instead of "
        "decoding the images again"
    )


def bucket_layout(threshold: int) -> list[tuple[int, int]]:
    """``(low bit, width)`` of the ``threshold + 1`` chunks a bucketed search keys on.

    Two hashes within ``threshold`` bits differ in at most ``threshold`` chunks, so they agree
    exactly on at least one of ``threshold + 1`` (pigeonhole): each chunk's value is a bucket,
    and every near pair meets in one. Widths differ by at most one bit.

    Raises:
      ValueError, TypeError: for a threshold ``find_pairs`` refuses.
    """
    check_hashes(np.zeros(0, np.uint64), threshold)
    return _even_chunks(threshold + 1)


def bucket_values(
    hashes: np.ndarray, layout: Sequence[tuple[int, int]], chunk: int, *, mirrored: bool = False
) -> np.ndarray:
    """Each uint64 hash's value on chunk ``chunk`` of ``layout`` (``bucket_layout``): its
    bucket in that chunk, or with ``mirrored`` the bucket of its mirrored hash."""
    low, width = layout[chunk]
    h = hashes ^ np.uint64(FLIP_MASK) if mirrored else hashes
    return (h >> np.uint64(low)) & _mask(width)


def _mask(width: int) -> np.uint64:
    return np.uint64((1 << width) - 1)


@dataclasses.dataclass(frozen=True)
class BucketPairs:
    """Pairs one bucket emits, as rows of its entries, sorted by ``(key[row_a], key[row_b])``.

    Attributes:
      row_a, row_b: int64 rows into the bucket's entries, ``key[row_a] < key[row_b]``.
      distance: uint8, the smaller of plain and mirrored distance when searched with flips.
      flipped: True where the pair is closer mirrored than as is.
    """

    row_a: np.ndarray
    row_b: np.ndarray
    distance: np.ndarray
    flipped: np.ndarray

    def __len__(self) -> int:
        return int(self.row_a.shape[0])


def bucket_candidates(virtual: np.ndarray, threshold: int, shared: tuple[int, int]):
    """Yields ``(rows a, rows b)``: every pair of a bucket's entries whose hashes (``virtual``,
    uint64) are within ``threshold`` bits, each once, at most about ``_EXPAND_LIMIT`` at a time
    (int32 rows below 2**31 entries).

    Identical hashes are collapsed first: ``find_pairs`` finds the distinct values within the
    threshold, and member pairs are expanded from them, so a bucket of many identical hashes
    (blank images) costs one distinct value plus its pairs. ``shared``, the bucket's chunk
    ``(low bit, width)``, whose bits every entry holds alike, is cut out of the hashes first
    (``without_chunk``): left in, it fills part of one of the index's chunks with bits that never
    differ, and at 120,000 entries that search took 15x as long.
    """
    # Positions of the bucket's entries held whole while it is searched: 4 bytes each, not 8.
    index = _position_type(virtual.shape[0] + 1)
    unique, inverse = np.unique(virtual, return_inverse=True)
    inverse = inverse.ravel().astype(index)
    bits = HASH_BITS
    if unique.shape[0] > 1:
        cut = without_chunk(unique, *shared)
        if cut is not None:
            unique, bits = cut, HASH_BITS - shared[1]
    near = find_pairs(unique, threshold, flips=False, bits=bits)
    order = np.argsort(inverse, kind="stable").astype(index)  # entries grouped by value
    offsets = np.zeros(unique.shape[0] + 1, index)
    np.cumsum(np.bincount(inverse, minlength=unique.shape[0]), out=offsets[1:])
    sizes = np.diff(offsets).astype(np.int64)
    # Queries in grouped order: each entry with the rest of its group, and each member of a
    # distinct pair's first group with all of its second group.
    group_of = inverse[order]
    del inverse
    positions = np.arange(order.shape[0], dtype=index)
    q_same, s_same = positions, positions + 1
    c_same = offsets[group_of + 1] - positions - 1
    g1, g2 = near.first, near.second
    q_near = np.repeat(offsets[g1], sizes[g1]) + _ranks(sizes[g1])
    s_near = np.repeat(offsets[g2], sizes[g1])
    c_near = np.repeat(sizes[g2], sizes[g1])
    for queries, starts, counts in ((q_same, s_same, c_same), (q_near, s_near, c_near)):
        for grouped, partners in expanded_runs(queries, starts, counts):
            yield order[grouped], order[partners]


def without_chunk(hashes: np.ndarray, low: int, width: int) -> np.ndarray | None:
    """``hashes`` with bits ``[low, low + width)`` cut out (the bits above move down), when every
    hash holds those bits alike, else None. Distances are unchanged: the bits cut never differ.
    """
    mask = np.uint64((1 << width) - 1)
    chunk = (hashes >> np.uint64(low)) & mask
    if not (chunk == chunk[0]).all():
        return None
    below = hashes & np.uint64((1 << low) - 1)
    return below | ((hashes >> np.uint64(low + width)) << np.uint64(low))


def _ranks(sizes: np.ndarray) -> np.ndarray:
    """``0..s-1`` for each ``s`` in ``sizes``, concatenated."""
    total = int(sizes.sum())
    starts = np.repeat(np.cumsum(sizes) - sizes, sizes)
    return np.arange(total, dtype=np.int64) - starts


class OwnedPairs:
    """Collects the pairs one bucket owns, keeping at most ``max_pairs`` (the first in key
    order) so that memory stays bounded however many pairs the bucket holds.

    Args:
      keys: int64 example id of each entry; pairs are ordered by them.
      blocks: each entry's block when the bucket is one block pair of a split bucket (only
        pairs across two blocks are owned), else None.
      max_pairs: the most pairs kept (None: all).
      owns: ``(rows a, rows b) -> (keep, *values)``: which candidate pairs the bucket owns,
        and per candidate the values the result carries (distance, flip...).
      empty: the values of no pair (empty arrays of their dtypes).
    """

    def __init__(self, keys: np.ndarray, blocks, max_pairs: int | None, owns, empty) -> None:
        self._keys, self._blocks, self._max, self._owns = keys, blocks, max_pairs, owns
        rows = np.zeros(0, np.int64)
        self._parts: list[tuple[np.ndarray, ...]] = [(rows, rows, *empty)]
        self._held = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Judges candidate pairs of rows ``a[i], b[i]``."""
        if self._blocks is not None:
            cross = self._blocks[a] != self._blocks[b]
            a, b = a[cross], b[cross]
        keep, *values = self._owns(a, b)
        a, b = a[keep], b[keep]
        swap = self._keys[a] > self._keys[b]
        a, b = np.where(swap, b, a), np.where(swap, a, b)
        self._parts.append((a, b, *(v[keep] for v in values)))
        self._held += a.shape[0]
        if self._max is not None and self._held > 2 * self._max:
            self._parts = [self.result()]
            self._held = self._parts[0][0].shape[0]

    def result(self) -> tuple[np.ndarray, ...]:
        """``(rows a, rows b, *values)``, sorted by ``(key a, key b)``, at most ``max_pairs``."""
        columns = [np.concatenate(c) for c in zip(*self._parts, strict=True)]
        a, b = columns[0], columns[1]
        order = np.lexsort((self._keys[b], self._keys[a]))[: self._max]
        return tuple(c[order] for c in columns)


def bucket_blocks(entries: int, max_bucket_entries: int) -> int:
    """How many blocks a bucket of ``entries`` is searched in: 1 up to ``max_bucket_entries``,
    else ``ceil(2 * entries / max_bucket_entries)``, so that a pair of blocks (what one worker
    holds) has about ``max_bucket_entries`` entries."""
    if max_bucket_entries < 2:
        raise ValueError(f"max_bucket_entries must be >= 2, got {max_bucket_entries}")
    if entries <= max_bucket_entries:
        return 1
    return -(-2 * entries // max_bucket_entries)
