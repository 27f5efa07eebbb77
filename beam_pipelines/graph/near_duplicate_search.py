"""The near-duplicate search on the engine: chunk buckets of multi-index hashing as shuffle keys.

``SearchNearDuplicates`` finds the pairs ``catalog.near_duplicates.find_pairs`` finds, without
gathering every hash in one place. With a threshold of ``t`` bits the 64-bit hash is cut into
``t + 1`` chunks (``bucket_layout``); two hashes within ``t`` bits agree exactly on at least one
(pigeonhole), so each ``(chunk index, chunk value)`` is a shuffle key and every near pair meets
in a bucket. Steps, each labelled:

1. ``OnePerContent``: one entry per example id (key number); a content filed under two classes
   is left out, as the gathered search does.
2. ``BucketEntries``: each entry goes to its ``t + 1`` buckets, and to ``t + 1`` more for its
   mirrored hash (``catalog.phash.FLIP_MASK``), so mirrored copies meet too.
3. ``SearchBuckets``: a ``GroupByKey``; each bucket is searched on its own by
   ``catalog.near_duplicates.search_bucket``, which verifies candidates by the full 64-bit
   distance and keeps only the pairs the bucket *owns*: a pair is owned by the lowest chunk on
   which it meets (plainly if it can, else in the bucket of the smaller chunk value), so each
   pair is emitted exactly once and no second shuffle is needed.
4. ``FirstPairs``: the first ``MAX_REPORTED_PAIRS`` pairs in key order (``Top``, bounded), then
   the leakage moves and the classes of each pair, in one element shaped like the gathered
   search's result.

Giant buckets. Identical hashes (blank images) and skewed hash values make some buckets far
larger than ``N / 2**width``. ``CountBuckets`` counts each bucket's entries (a lifted combine);
a bucket over ``max_bucket_entries`` is split into ``K = ceil(2 c / max_bucket_entries)``
blocks by key number, and every pair of blocks ``(p <= q)`` is a key of its own (an entry is
sent to the ``K`` pairs holding its block): a worker holds about ``max_bucket_entries``
entries (56 B each in numpy, a few hundred as Python objects) whatever the data. Within a
bucket, identical hashes are collapsed before the search, and each bucket emits at most
``MAX_REPORTED_PAIRS`` of its pairs (the first in key order, the only ones the report can
keep), so no worker holds more pairs than the report does.

The result equals the gathered search's whenever the pairs are fewer than
``MAX_REPORTED_PAIRS``. Past that cap the gathered search keeps whichever pairs its probe order
reached first; this one keeps the first in key order: also the same on every runner.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

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
from catalog.phash import FLIP_MASK

__all__ = [
    "MAX_REPORTED_PAIRS",
    "DEFAULT_MAX_BUCKET_ENTRIES",
    "SPLIT_CODES",
    "signed64",
    "key_number",
    "hash_entry",
    "pairs_result",
    "SearchNearDuplicates",
]

# A set holding thousands of copies of one image has millions of pairs: the search stops here.
MAX_REPORTED_PAIRS = 1_000_000
# Entries one bucket search holds before the bucket is split into blocks: about 4 MB of numpy
# arrays and tens of MB as the grouped Python tuples the runner hands over.
DEFAULT_MAX_BUCKET_ENTRIES = 1 << 16
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


class _OneContent(beam.CombineFn):
    """``(phash, split, label)`` of one key -> one, or None when the labels disagree."""

    def create_accumulator(self):
        return None

    def add_input(self, acc, value):
        return self.merge_accumulators([acc, (value, False)])

    def merge_accumulators(self, accumulators):
        merged = None
        for acc in accumulators:
            if acc is None:
                continue
            if merged is None:
                merged = acc
                continue
            (value, conflict), (other, other_conflict) = merged, acc
            conflict = conflict or other_conflict or value[2] != other[2]
            merged = (min(value, other), conflict)  # the same content: only the split may vary
        return merged

    def extract_output(self, acc):
        return None if acc is None or acc[1] else acc[0]


def _bucket_keys(value: int, threshold: int, flips: bool) -> list[tuple[int, int, bool]]:
    """``(chunk, value, mirrored)`` of every bucket a hash (signed) goes to."""
    unsigned = value & ((1 << 64) - 1)
    layout = bucket_layout(threshold)
    keys = [(c, v, False) for c, v in enumerate(bucket_values(unsigned, layout))]
    if flips:
        mirrored = bucket_values(unsigned ^ FLIP_MASK, layout)
        keys += [(c, v, True) for c, v in enumerate(mirrored)]
    return keys


class _ToBlocksFn(beam.DoFn):
    """``(key, (phash, split, label)) -> ((chunk, value, p, q), entry)``: every block pair of
    every bucket the entry belongs to."""

    def __init__(self, threshold: int, flips: bool, max_entries: int) -> None:
        self._threshold, self._flips, self._max = threshold, flips, max_entries

    def process(self, element, big):
        key, (phash, split, label) = element
        for chunk, value, mirrored in _bucket_keys(phash, self._threshold, self._flips):
            k = bucket_blocks(big.get((chunk, value), 0), self._max)
            block = key % k
            entry = (key, phash, split, label, mirrored, block)
            for other in range(k):
                yield (chunk, value, min(block, other), max(block, other)), entry


class _SearchBucketFn(beam.DoFn):
    """``((chunk, value, p, q), entries) -> pair``: the pairs one block pair owns, as
    ``(key a, key b, distance, flipped, split a, label a, split b, label b)``, ``a < b``."""

    def __init__(self, threshold: int, flips: bool) -> None:
        self._threshold, self._flips = threshold, flips

    def process(self, element):
        (chunk, _value, p, q), entries = element
        rows = list(entries)
        Metrics.distribution(METRICS_NAMESPACE, "near_duplicate_bucket_entries").update(len(rows))
        keys = np.array([r[0] for r in rows], np.int64)
        hashes = np.array([r[1] for r in rows], np.int64).view(np.uint64)
        mirrored = np.array([r[4] for r in rows], bool)
        # Blocks p < q: only pairs across the two (each block's own pairs are in (p, p)).
        blocks = np.array([r[5] for r in rows], np.int64) if p != q else None
        found = search_bucket(
            chunk,
            hashes,
            keys,
            mirrored,
            self._threshold,
            blocks=blocks,
            flips=self._flips,
            max_pairs=MAX_REPORTED_PAIRS,
        )
        for a, b, distance, flipped in zip(
            found.row_a.tolist(),
            found.row_b.tolist(),
            found.distance.tolist(),
            found.flipped.tolist(),
            strict=True,
        ):
            ra, rb = rows[a], rows[b]
            yield (ra[0], rb[0], distance, flipped, ra[2], ra[3], rb[2], rb[3])


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
        contents = (
            entries
            | "ByKey" >> beam.Map(lambda e: (e[0], (e[1], e[2], e[3])))
            | "OnePerContent" >> beam.CombinePerKey(_OneContent())
            | "WithoutConflicts" >> beam.Filter(lambda kv: kv[1] is not None)
            # (key number, (phash, split code, label)), one per content
        )
        big = (
            contents
            | "BucketOf" >> beam.FlatMap(lambda kv: _bucket_keys(kv[1][0], threshold, flips))
            | "BucketKey" >> beam.Map(lambda b: ((b[0], b[1]), 1))
            | "CountBuckets" >> beam.CombinePerKey(sum)
            | "OnlyBig" >> beam.Filter(lambda kv, m: kv[1] > m, most)
            # ((chunk, value), entries): the buckets to split into blocks
        )
        pairs = (
            contents
            | "BucketEntries"
            >> beam.ParDo(_ToBlocksFn(threshold, flips, most), beam.pvalue.AsDict(big))
            # ((chunk, value, block p, block q), (key, phash, split, label, mirrored, block))
            | "GroupBuckets" >> beam.GroupByKey()
            | "SearchBuckets" >> beam.ParDo(_SearchBucketFn(threshold, flips))
            # (key a, key b, distance, flipped, split a, label a, split b, label b), a < b
        )
        first = pairs | "FirstPairs" >> beam.combiners.Top.Smallest(MAX_REPORTED_PAIRS)
        # [pair], one element, at most MAX_REPORTED_PAIRS
        move = self._move
        return (
            contents
            | "CountExamples"
            >> beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
            | "Result"
            >> beam.Map(
                lambda n, found: pairs_result(n, found, move), beam.pvalue.AsSingleton(first)
            )
            # {"a", "b", "distance", ..., "moved"}, one element (none without entries)
        )
