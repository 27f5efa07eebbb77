"""The near-duplicate search on the engine: chunk buckets of multi-index hashing as shuffle keys.

``SearchNearDuplicates`` finds the pairs ``catalog.near_duplicates.find_pairs`` finds, without
gathering every hash in one place. With a threshold of ``t`` bits the 64-bit hash is cut into
``t + 1`` chunks (``bucket_layout``); two hashes within ``t`` bits agree exactly on at least one
(pigeonhole), so each ``(chunk index, chunk value)`` is a shuffle key and every near pair meets
in a bucket. Steps, each labelled:

1. ``BucketSizes`` / ``CountBuckets``: each bundle counts its entries per bucket (a few
   thousand counts, not one element per entry), and a lifted sum adds them up.
2. ``BucketEntries``: each entry goes to its ``t + 1`` buckets, and to ``t + 1`` more for its
   mirrored hash (``catalog.phash.FLIP_MASK``), so mirrored copies meet too. A bundle holds up
   to ``PACK_CONTENTS`` examples and emits them *packed*: per bucket (block pair), one bytes
   value of 26-byte ``ENTRY`` rows. The shuffle carries a few packs a bucket and bundle (about
   one element per example with Dask's 4,096-image tasks) instead of ``2 (t + 1)`` elements.
3. ``SearchBuckets``: a ``GroupByKey``; each bucket first keeps one entry per example
   (``_one_per_content``: copies of one content are one example, in the first of their splits;
   a content filed under two classes is left out, as the gathered search does: every copy is
   in each of its buckets, so no shuffle by example is needed), then
   ``catalog.near_duplicates.search_bucket`` searches it, verifies candidates by the full
   64-bit distance and keeps only the pairs the bucket *owns*: a pair is owned by the lowest
   chunk on which it meets (plainly if it can, else in the bucket of the smaller chunk value),
   so each pair is emitted exactly once and no second shuffle is needed. Each example is also
   counted once, in its plain chunk-0 bucket.
4. ``FirstPairs``: the first ``MAX_REPORTED_PAIRS`` pairs in key order (``Top``, bounded), then
   the leakage moves and the classes of each pair, in one element shaped like the gathered
   search's result.

Giant buckets. Identical hashes (blank images) and skewed hash values make some buckets far
larger than ``N / 2**width``. A bucket over ``max_bucket_entries`` entries is split into
``K = ceil(2 c / max_bucket_entries)`` blocks by key number, and every pair of blocks
``(p <= q)`` is a key of its own (an entry is sent to the ``K`` pairs holding its block,
packed at most ``_PACK_ROWS`` rows at a time): a worker holds about ``max_bucket_entries``
entries (26 B each, packed) whatever the data. Within a bucket, identical hashes are collapsed
before the search, and each bucket emits at most ``MAX_REPORTED_PAIRS`` of its pairs (the
first in key order, the only ones the report can keep), so no worker holds more pairs than
the report does.

The result equals the gathered search's whenever the pairs are fewer than
``MAX_REPORTED_PAIRS``. Past that cap the gathered search keeps whichever pairs its probe order
reached first; this one keeps the first in key order: also the same on every runner.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.output.shards import METRICS_NAMESPACE, TRAIN, VALIDATION
from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    Pairs,
    bucket_blocks,
    bucket_layout,
    bucket_values,
    classify,
    leakage_moves,
    search_bucket,
)

__all__ = [
    "MAX_REPORTED_PAIRS",
    "DEFAULT_MAX_BUCKET_ENTRIES",
    "ENTRY",
    "PACK_CONTENTS",
    "SPLIT_CODES",
    "signed64",
    "key_number",
    "hash_entry",
    "pairs_result",
    "SearchBucketFn",
    "SearchNearDuplicates",
]

# A set holding thousands of copies of one image has millions of pairs: the search stops here.
MAX_REPORTED_PAIRS = 1_000_000
# Entries one bucket search holds before the bucket is split into blocks. A search of 2**20
# entries took about 375 MB above the worker's level (2**16: about 130 MB). A bucket of a 7-bit
# chunk holds N / 64 entries, so buckets split from 64 M examples on (from 4 M with 2**16),
# and every entry of a split bucket is sent once per block: at a billion examples about 30
# times (about 480 with 2**16).
DEFAULT_MAX_BUCKET_ENTRIES = 1 << 20
# Examples a bucketing step holds before it packs them by bucket: with t = 8, 16,384 examples
# are 295 k entries (7.7 MB packed) in about 4,600 buckets, about 64 entries a pack.
PACK_CONTENTS = 1 << 14
# SearchBuckets' output of example counts, tagged.
EXAMPLES = "examples"
# Entries one packing step holds at once when split buckets send each example many times.
_PACK_ROWS = 1 << 20
# One entry of a bucket, as packed for the shuffle: 26 bytes.
ENTRY = np.dtype(
    [("key", "<i8"), ("phash", "<i8"), ("split", "u1"), ("label", "<i4"), ("mirrored", "?"),
     ("block", "<i4")]
)  # fmt: skip
SPLIT_CODES = {TRAIN: 0, VALIDATION: 1}
_SPLIT_NAMES = np.array([TRAIN, VALIDATION], dtype=object)


def signed64(value: int) -> int:
    """An unsigned 64-bit value as the signed int with the same bits (Beam's int coder holds
    signed 64-bit values)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def key_number(sha256: str) -> int:
    """The first 64 bits of an example's key, as a signed int: what the search carries."""
    return signed64(int(sha256[:16], 16))


def hash_entry(element) -> tuple[int, int, int, int] | None:
    """``(split, record) -> (key number, phash signed, split code, label)``, or None for a
    record without a hash or outside train and validation."""
    split, record = element
    meta = record.meta
    if meta is None or meta.phash is None or split not in SPLIT_CODES:
        return None
    return (key_number(record.sha256), signed64(meta.phash), SPLIT_CODES[split], meta.label)


def _bucket_values(phash: np.ndarray, threshold: int, flips: bool):
    """``(chunk, mirrored, values)`` for every chunk and kind: each hash's bucket value (int64,
    the chunk's bits of the hash or of its mirror), one array per chunk and kind."""
    unsigned, layout = phash.view(np.uint64), bucket_layout(threshold)
    for mirrored in (False, True) if flips else (False,):
        for chunk in range(len(layout)):
            values = bucket_values(unsigned, layout, chunk, mirrored=mirrored)
            yield chunk, mirrored, values.view(np.int64)


def _slices(weights: np.ndarray, limit: int):
    """``(start, end)`` of consecutive runs of ``weights`` summing to at most ``limit`` (or one
    item, if heavier)."""
    ends = np.cumsum(weights)
    start = 0
    while start < weights.shape[0]:
        base = int(ends[start - 1]) if start else 0
        end = max(start + 1, int(np.searchsorted(ends, base + limit, side="right")))
        yield start, end
        start = end


class _PackingFn(beam.DoFn):
    """Holds up to ``PACK_CONTENTS`` entries of a bundle, then emits them per bucket in packs
    (``_pack``), so the shuffle after it carries a few packs per bucket and bundle instead of
    ``2 (t + 1)`` elements per example."""

    def __init__(self, threshold: int, flips: bool) -> None:
        self._threshold, self._flips = threshold, flips

    def start_bundle(self) -> None:
        self._held: list[tuple[int, int, int, int]] = []
        self._side: Any = None

    def _hold(self, element, side: tuple):
        self._held.append(element)  # (key number, phash, split code, label)
        self._side = side  # side inputs are not passed to finish_bundle
        if len(self._held) >= PACK_CONTENTS:
            yield from self._flush()

    def finish_bundle(self):
        for kv in self._flush():
            yield GlobalWindows.windowed_value(kv)

    def _flush(self):
        if not self._held:
            return
        held = np.array(self._held, np.int64)
        self._held = []
        yield from self._pack(held, *self._side)

    def _pack(self, held: np.ndarray, *side):
        raise NotImplementedError


class _CountBucketsFn(_PackingFn):
    """``(key, phash, split, label) -> ((chunk, value), entries)``: each bucket's entries
    among a bundle's held examples, one count per bucket."""

    def process(self, element):
        yield from self._hold(element, ())

    def _pack(self, held):
        for chunk, _mirrored, values in _bucket_values(held[:, 1], self._threshold, self._flips):
            found, counts = np.unique(values, return_counts=True)
            for value, count in zip(found.tolist(), counts.tolist(), strict=True):
                yield (chunk, value), count


class _ToBlocksFn(_PackingFn):
    """``(key, phash, split, label) -> ((chunk, value, p, q), pack)``: the entries of every
    block pair of every bucket among a bundle's held examples, as ``ENTRY`` rows in bytes."""

    def __init__(self, threshold: int, flips: bool, max_entries: int) -> None:
        super().__init__(threshold, flips)
        self._max = max_entries

    def process(self, element, big):
        yield from self._hold(element, (big,))

    def _pack(self, held, big):
        for chunk, mirrored, values in _bucket_values(held[:, 1], self._threshold, self._flips):
            blocks = self._blocks(chunk, values, big)
            # Each entry goes to every block pair of its bucket that holds its block: a split
            # bucket's entries are sent that many times, so they are packed a slice at a time.
            for start, end in _slices(blocks, _PACK_ROWS):
                yield from self._pack_part(
                    held[start:end], chunk, mirrored, values[start:end], blocks[start:end]
                )

    @staticmethod
    def _pack_part(held, chunk, mirrored, values, blocks):
        block = held[:, 0] % blocks  # floor modulo, as Python's: 0 <= block < blocks
        rows = np.repeat(np.arange(held.shape[0]), blocks)
        other = np.arange(rows.shape[0]) - np.repeat(np.cumsum(blocks) - blocks, blocks)
        p = np.minimum(block[rows], other)
        q = np.maximum(block[rows], other)
        order = np.lexsort((q, p, values[rows]))
        rows, v, p, q = rows[order], values[rows][order], p[order], q[order]
        packed = np.empty(rows.shape[0], ENTRY)
        packed["key"], packed["phash"] = held[rows, 0], held[rows, 1]
        packed["split"], packed["label"] = held[rows, 2], held[rows, 3]
        packed["mirrored"], packed["block"] = mirrored, block[rows]
        new = np.concatenate(([True], (v[1:] != v[:-1]) | (p[1:] != p[:-1]) | (q[1:] != q[:-1])))
        starts = np.flatnonzero(new).tolist()
        for start, end in zip(starts, [*starts[1:], rows.shape[0]], strict=True):
            key = (chunk, int(v[start]), int(p[start]), int(q[start]))
            yield key, packed[start:end].tobytes()

    def _blocks(self, chunk: int, values: np.ndarray, big: dict) -> np.ndarray:
        """Each entry's bucket's block count: 1 unless its bucket is in ``big``."""
        blocks = np.ones(values.shape[0], np.int64)
        split = sorted((v, bucket_blocks(c, self._max)) for (k, v), c in big.items() if k == chunk)
        if split:
            known = np.array([v for v, _ in split], np.int64)
            at = np.minimum(np.searchsorted(known, values), known.shape[0] - 1)
            hit = known[at] == values
            blocks[hit] = np.array([b for _, b in split], np.int64)[at[hit]]
        return blocks


def _one_per_content(rows: np.ndarray) -> np.ndarray:
    """A bucket's entries with one per example and kind: copies of one content (one key) are
    one example, in the first of their splits (train before validation); a content filed
    under two labels is left out. Every copy of a content is in each of its buckets, in the
    same block, so each bucket decides alike."""
    rows = rows[np.lexsort((rows["split"], rows["mirrored"], rows["key"]))]
    key, mirrored, label = rows["key"], rows["mirrored"], rows["label"]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    sizes = np.diff(np.append(starts, key.shape[0]))
    mixed = np.minimum.reduceat(label, starts) != np.maximum.reduceat(label, starts)
    first = np.concatenate(([True], (key[1:] != key[:-1]) | (mirrored[1:] != mirrored[:-1])))
    return rows[first & ~np.repeat(mixed, sizes)]


class SearchBucketFn(beam.DoFn):
    """``((chunk, value, p, q), packs) -> pair``: the pairs one block pair owns, as
    ``(key a, key b, distance, flipped, split a, label a, split b, label b)``, ``a < b``."""

    def __init__(self, threshold: int, flips: bool) -> None:
        self._threshold, self._flips = threshold, flips

    def process(self, element):
        (chunk, _value, p, q), packs = element
        rows = _one_per_content(np.frombuffer(b"".join(packs), ENTRY))
        Metrics.distribution(METRICS_NAMESPACE, "near_duplicate_bucket_entries").update(len(rows))
        if chunk == 0 and p == q:
            # Every example is in one chunk-0 bucket plainly (and in block pair (p, p) of it
            # when the bucket is split): counted there, once.
            examples = int(np.count_nonzero(~rows["mirrored"]))
            if examples:
                yield beam.pvalue.TaggedOutput(EXAMPLES, examples)
        found = search_bucket(
            chunk,
            rows["phash"].view(np.uint64),
            rows["key"],
            rows["mirrored"],
            self._threshold,
            # Blocks p < q: only pairs across the two (each block's own pairs are in (p, p)).
            blocks=rows["block"].astype(np.int64) if p != q else None,
            flips=self._flips,
            max_pairs=MAX_REPORTED_PAIRS,
        )
        a, b = rows[found.row_a], rows[found.row_b]
        yield from zip(
            a["key"].tolist(),
            b["key"].tolist(),
            found.distance.tolist(),
            found.flipped.tolist(),
            a["split"].tolist(),
            a["label"].tolist(),
            b["split"].tolist(),
            b["label"].tolist(),
            strict=True,
        )


def pairs_result(examples: int, pairs: list[tuple], move: bool) -> dict[str, Any]:
    """The search's result from its pairs, shaped like ``leakage.NOTHING_FOUND``.

    Args:
      examples: how many examples were searched (one per content).
      pairs: ``(key a, key b, distance, flipped, split a, label a, split b, label b)``, at most
        ``MAX_REPORTED_PAIRS``, in any order.
      move: also choose the validation examples to move to train (``move_to_train``).
    """
    pairs = sorted(pairs)
    keys = np.array(sorted({p[0] for p in pairs} | {p[1] for p in pairs}), np.int64)
    split_of: dict[int, int] = {}
    label_of: dict[int, int] = {}
    for a, b, _d, _f, split_a, label_a, split_b, label_b in pairs:
        split_of[a], label_of[a], split_of[b], label_of[b] = split_a, label_a, split_b, label_b
    first = np.searchsorted(keys, np.array([p[0] for p in pairs], np.int64))
    second = np.searchsorted(keys, np.array([p[1] for p in pairs], np.int64))
    found = Pairs(
        first,
        second,
        np.array([p[2] for p in pairs], np.uint8),
        np.array([p[3] for p in pairs], bool),
        complete=len(pairs) < MAX_REPORTED_PAIRS,
    )
    names = _SPLIT_NAMES[np.array([split_of[k] for k in keys.tolist()], np.int64)]
    labels = np.array([label_of[k] for k in keys.tolist()], np.int64)
    moved = leakage_moves(found, names) if move else np.zeros(0, np.int64)
    written = names.copy()
    written[moved] = TRAIN
    leakage, cross = classify(found, written, labels)
    return {
        "a": [p[0] for p in pairs],
        "b": [p[1] for p in pairs],
        "distance": found.distance.tolist(),
        "flipped": found.flipped.tolist(),
        "leakage": leakage.tolist(),
        "cross_class": cross.tolist(),
        "moved": sorted(keys[moved].tolist()),
        "examples": int(examples),
        "complete": found.complete,
    }


class SearchNearDuplicates(beam.PTransform):
    """``(key number, phash, split code, label) -> dict``: the pairs and moves, one element
    (none without entries), shaped like ``leakage.NOTHING_FOUND``; see the module's docstring.

    Args:
      threshold: the largest Hamming distance that makes a pair (0-16).
      move: also choose the validation examples to move to train.
      flips: also pair mirrored copies (the pipeline always does).
      max_bucket_entries: the most entries one bucket search holds before the bucket is split.

    Raises:
      ValueError: for a threshold out of range (naming ``--near_duplicate_threshold``) or
        ``max_bucket_entries`` below 2.
    """

    def __init__(
        self,
        *,
        threshold: int = DEFAULT_THRESHOLD,
        move: bool = False,
        flips: bool = True,
        max_bucket_entries: int = DEFAULT_MAX_BUCKET_ENTRIES,
    ) -> None:
        super().__init__()
        try:
            bucket_layout(threshold)
        except (TypeError, ValueError) as e:
            raise ValueError(f"--near_duplicate_threshold: {e}") from e
        bucket_blocks(0, max_bucket_entries)
        self._threshold, self._move, self._flips = threshold, move, flips
        self._max = max_bucket_entries

    def expand(self, entries):
        threshold, flips, most = self._threshold, self._flips, self._max
        big = (
            entries
            | "BucketSizes" >> beam.ParDo(_CountBucketsFn(threshold, flips))
            | "CountBuckets" >> beam.CombinePerKey(sum)
            | "OnlyBig" >> beam.Filter(lambda kv, m: kv[1] > m, most)
            # ((chunk, value), entries): the buckets to split into blocks
        )
        searched = (
            entries
            | "BucketEntries"
            >> beam.ParDo(_ToBlocksFn(threshold, flips, most), beam.pvalue.AsDict(big))
            # ((chunk, value, block p, block q), ENTRY rows in bytes), a few a bucket and bundle
            | "GroupBuckets" >> beam.GroupByKey()
            | "SearchBuckets"
            >> beam.ParDo(SearchBucketFn(threshold, flips)).with_outputs(EXAMPLES, main="pairs")
        )
        # (key a, key b, distance, flipped, split a, label a, split b, label b), a < b
        first = searched.pairs | "FirstPairs" >> beam.combiners.Top.Smallest(MAX_REPORTED_PAIRS)
        # [pair], one element, at most MAX_REPORTED_PAIRS
        move = self._move
        return (
            searched[EXAMPLES]
            | "CountExamples" >> beam.CombineGlobally(sum).without_defaults()
            | "Result"
            >> beam.Map(
                lambda n, found: pairs_result(n, found, move), beam.pvalue.AsSingleton(first)
            )
            # {"a", "b", "distance", ..., "moved"}, one element (none without entries)
        )
