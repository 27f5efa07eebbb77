"""The near-duplicate search on the engine: chunk buckets of multi-index hashing as shuffle keys.

``SearchNearDuplicates`` finds the pairs ``catalog.window_search.find_window_pairs`` finds (the
window rule: whole frames, and crops against the centred windows of their originals), without
gathering every hash in one place. With ``T = rule.bucket_threshold`` (the larger of the two
thresholds) the 64-bit hash is cut into ``T + 1`` chunks (``bucket_layout``); two hashes within
``T`` bits agree exactly on at least one (pigeonhole), so each ``(chunk index, chunk value)`` is
a shuffle key and every near pair meets in a bucket (``catalog.window_buckets``). Steps, each
labelled:

1. ``BucketSizes`` / ``CountBuckets``: each bundle counts its entries per bucket (a few
   thousand counts, not one element per entry), and a lifted sum adds them up.
2. ``BucketEntries``: each example sends its whole frame and its mirrored whole frame
   (``catalog.phash.FLIP_MASK``) to their ``T + 1`` buckets, and each of its windows to the
   buckets of the first ``tw + 1`` chunks (``tw``: the window threshold). Every entry carries
   all of its example's hashes (``entry_dtype``: 18 bytes and 8 a hash, 50 with four). A
   bundle holds up to ``PACK_CONTENTS`` examples and emits them *packed*: per bucket (block
   pair), one bytes value of entry rows. The shuffle carries a few packs a bucket and bundle
   (about one element per example with Dask's 4,096-image tasks) instead of one per entry.
3. ``SearchBuckets``: a ``GroupByKey``; each bucket first keeps one entry per example and kind
   (``_one_per_content``: copies of one content are one example, in the first of their splits;
   a content filed under two classes is left out, as the gathered search does: every copy is
   in each of its buckets, so no shuffle by example is needed), then
   ``catalog.window_buckets.search_window_bucket`` searches it, judges candidates by the rule
   on every hash of both examples and keeps only the pairs the bucket *owns*: those whose best
   combination is made by two of its entries, on its chunk, the first on which they agree; so
   each pair is emitted exactly once and no second shuffle is needed. Each example is also
   counted once, by its whole frame's chunk-0 entry.
4. ``FirstPairs``: the first ``MAX_REPORTED_PAIRS`` pairs in key order (``Top``, bounded), then
   the leakage moves and the classes of each pair, in one element shaped like the gathered
   search's result.

Giant buckets. Identical hashes (blank images) and skewed hash values make some buckets far
larger than ``N / 2**width``. A bucket over ``max_bucket_entries`` entries is split into
``K = ceil(2 c / max_bucket_entries)`` blocks by key number, and every pair of blocks
``(p <= q)`` is a key of its own (an entry is sent to the ``K`` pairs holding its block,
packed at most ``_PACK_ROWS`` rows at a time): a worker holds about ``max_bucket_entries``
entries (50 B each with four windows, packed) whatever the data. Within a bucket, identical
hashes are collapsed before the search, and each bucket emits at most ``MAX_REPORTED_PAIRS``
of its pairs (the first in key order, the only ones the report can keep), so no worker holds
more pairs than the report does.

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

from beam_pipelines.graph.heap import release_freed_memory
from beam_pipelines.output.shards import METRICS_NAMESPACE, TRAIN, VALIDATION
from catalog.near_duplicates import (
    Pairs,
    bucket_blocks,
    bucket_layout,
    bucket_values,
    classify,
    leakage_moves,
)
from catalog.window_buckets import WHOLE, chunk_kinds, entry_hashes, search_window_bucket
from catalog.window_hashes import WINDOW_SCALES
from catalog.window_search import DEFAULT_RULE, WindowRule

__all__ = [
    "MAX_REPORTED_PAIRS",
    "DEFAULT_MAX_BUCKET_ENTRIES",
    "entry_dtype",
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
# Entries one bucket search holds before the bucket is split into blocks. A search of 392,439
# window-rule entries took 130 MB above the worker's level (docs/benchmarks.md). A bucket of
# a 7-bit chunk 0-7 holds 5 N / 128 entries (whole frame, mirror, three windows), so buckets
# split from about 27 M examples on (from 1.7 M with 2**16), and every entry of a split bucket
# is sent once per block: at a billion examples about 75 times (about 1,200 with 2**16).
DEFAULT_MAX_BUCKET_ENTRIES = 1 << 20
# Examples a bucketing step holds before it packs them by bucket: under the default rule
# (t = 8, tw = 7), 16,384 examples are 688 k entries of 50 bytes (34 MB packed) in at most
# 1,280 buckets (one 8-bit chunk, eight 7-bit ones).
PACK_CONTENTS = 1 << 14
# SearchBuckets' output of example counts, tagged.
EXAMPLES = "examples"
# Entries one packing step holds at once when split buckets send each example many times.
_PACK_ROWS = 1 << 20


def entry_dtype(windows: int) -> np.dtype:
    """One entry of a bucket, as packed for the shuffle: 18 bytes and every hash of its
    example (signed), 50 bytes with four windows."""
    return np.dtype(
        [("key", "<i8"), ("split", "u1"), ("label", "<i4"), ("kind", "u1"), ("block", "<i4"),
         ("hashes", "<i8", (windows,))]
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


def hash_entry(element) -> tuple[int, ...] | None:
    """``(split, record) -> (key number, phash, split code, label, window 1, ..., window k)``,
    hashes signed, or None for a record without a hash or outside train and validation. A
    record without window hashes (an adopted dataset's) repeats its whole frame in their
    place: it is then paired by its whole frame alone."""
    split, record = element
    meta = record.meta
    if meta is None or meta.phash is None or split not in SPLIT_CODES:
        return None
    phash = signed64(meta.phash)
    windows = meta.window_phash
    windows = [phash] * (len(WINDOW_SCALES) - 1) if windows is None else map(signed64, windows)
    return (key_number(record.sha256), phash, SPLIT_CODES[split], meta.label, *windows)


def _held_hashes(held: np.ndarray) -> np.ndarray:
    """``(N, W)`` uint64 hashes of held ``hash_entry`` rows (whole frame, then windows)."""
    return np.ascontiguousarray(np.concatenate([held[:, 1:2], held[:, 4:]], 1)).view(np.uint64)


def _bucket_values(hashes: np.ndarray, rule: WindowRule):
    """``(chunk, rows, kinds, values)`` for every chunk: each entry of that chunk (a row of
    ``hashes`` and its kind) and its bucket value (int64)."""
    layout, n = bucket_layout(rule.bucket_threshold), hashes.shape[0]
    for chunk in range(len(layout)):
        kinds = chunk_kinds(rule, chunk)
        rows = np.tile(np.arange(n, dtype=np.int64), kinds.shape[0])
        kind = np.repeat(kinds, n)
        values = bucket_values(entry_hashes(hashes[rows], kind), layout, chunk)
        yield chunk, rows, kind, values.view(np.int64)


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
    one element per entry."""

    def __init__(self, rule: WindowRule) -> None:
        self._rule = rule

    def start_bundle(self) -> None:
        self._held: list[tuple[int, ...]] = []
        self._side: Any = None

    def _hold(self, element, side: tuple):
        self._held.append(element)  # (key number, phash, split code, label, windows...)
        self._side = side  # side inputs are not passed to finish_bundle
        if len(self._held) >= PACK_CONTENTS:
            yield from self._flush()

    def finish_bundle(self):
        for kv in self._flush():
            yield GlobalWindows.windowed_value(kv)
        release_freed_memory(force=True)  # the last pack's, which the period may have skipped

    def _flush(self):
        if not self._held:
            return
        held = np.array(self._held, np.int64)
        self._held = []
        yield from self._pack(held, *self._side)
        release_freed_memory()  # a bundle can be a whole partition: minutes of packs

    def _pack(self, held: np.ndarray, *side):
        raise NotImplementedError


class _CountBucketsFn(_PackingFn):
    """``(key, phash, split, label, windows...) -> ((chunk, value), entries)``: each bucket's
    entries among a bundle's held examples, one count per bucket."""

    def process(self, element):
        yield from self._hold(element, ())

    def _pack(self, held):
        for chunk, _rows, _kinds, values in _bucket_values(_held_hashes(held), self._rule):
            found, counts = np.unique(values, return_counts=True)
            for value, count in zip(found.tolist(), counts.tolist(), strict=True):
                yield (chunk, value), count


class _ToBlocksFn(_PackingFn):
    """``(key, phash, split, label, windows...) -> ((chunk, value, p, q), pack)``: the entries
    of every block pair of every bucket among a bundle's held examples, as ``entry_dtype``
    rows in bytes."""

    def __init__(self, rule: WindowRule, max_entries: int) -> None:
        super().__init__(rule)
        self._max = max_entries

    def process(self, element, big):
        yield from self._hold(element, (big,))

    def _pack(self, held, big):
        hashes = _held_hashes(held)
        for chunk, rows, kinds, values in _bucket_values(hashes, self._rule):
            blocks = self._blocks(chunk, values, big)
            # Each entry goes to every block pair of its bucket that holds its block: a split
            # bucket's entries are sent that many times, so they are packed a slice at a time.
            for start, end in _slices(blocks, _PACK_ROWS):
                part = slice(start, end)
                yield from self._pack_part(
                    held, hashes, rows[part], kinds[part], chunk, values[part], blocks[part]
                )

    @staticmethod
    def _pack_part(held, hashes, rows, kinds, chunk, values, blocks):
        block = held[rows, 0] % blocks  # floor modulo, as Python's: 0 <= block < blocks
        at = np.repeat(np.arange(rows.shape[0]), blocks)
        other = np.arange(at.shape[0]) - np.repeat(np.cumsum(blocks) - blocks, blocks)
        p = np.minimum(block[at], other)
        q = np.maximum(block[at], other)
        order = np.lexsort((q, p, values[at]))
        at, v, p, q = at[order], values[at][order], p[order], q[order]
        packed = np.empty(at.shape[0], entry_dtype(hashes.shape[1]))
        example = rows[at]
        packed["key"], packed["split"], packed["label"] = (held[example, c] for c in (0, 2, 3))
        packed["kind"], packed["block"] = kinds[at], block[at]
        packed["hashes"] = hashes[example].view(np.int64)
        new = np.concatenate(([True], (v[1:] != v[:-1]) | (p[1:] != p[:-1]) | (q[1:] != q[:-1])))
        starts = np.flatnonzero(new).tolist()
        for start, end in zip(starts, [*starts[1:], at.shape[0]], strict=True):
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
    # The sorted columns alone (13 bytes an entry), not the sorted rows (50): one copy of the
    # rows is made, of those kept, at the largest bucket about 20 MB.
    order = np.lexsort((rows["split"], rows["kind"], rows["key"]))
    key, kind, label = rows["key"][order], rows["kind"][order], rows["label"][order]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    sizes = np.diff(np.append(starts, key.shape[0]))
    mixed = np.minimum.reduceat(label, starts) != np.maximum.reduceat(label, starts)
    first = np.concatenate(([True], (key[1:] != key[:-1]) | (kind[1:] != kind[:-1])))
    return rows[order[first & ~np.repeat(mixed, sizes)]]


class SearchBucketFn(beam.DoFn):
    """``((chunk, value, p, q), packs) -> pair``: the pairs one block pair owns, as
    ``(key a, key b, distance, flipped, window, split a, label a, split b, label b)``,
    ``a < b``."""

    def __init__(self, rule: WindowRule) -> None:
        self._rule = rule

    def process(self, element):
        (chunk, _value, p, q), packs = element
        entry = entry_dtype(self._rule.windows)
        rows = _one_per_content(np.frombuffer(b"".join(packs), entry))
        Metrics.distribution(METRICS_NAMESPACE, "near_duplicate_bucket_entries").update(len(rows))
        if chunk == 0 and p == q:
            # Every example's whole frame is in one chunk-0 bucket (and in block pair (p, p)
            # of it when the bucket is split): counted there, once.
            examples = int(np.count_nonzero(rows["kind"] == WHOLE))
            if examples:
                yield beam.pvalue.TaggedOutput(EXAMPLES, examples)
        found = search_window_bucket(
            chunk,
            rows["hashes"].view(np.uint64),
            rows["key"],
            rows["kind"],
            self._rule,
            # Blocks p < q: only pairs across the two (each block's own pairs are in (p, p)).
            blocks=rows["block"].astype(np.int64) if p != q else None,
            max_pairs=MAX_REPORTED_PAIRS,
        )
        a, b = rows[found.row_a], rows[found.row_b]
        yield from zip(
            a["key"].tolist(),
            b["key"].tolist(),
            found.distance.tolist(),
            found.flipped.tolist(),
            found.window.tolist(),
            a["split"].tolist(),
            a["label"].tolist(),
            b["split"].tolist(),
            b["label"].tolist(),
            strict=True,
        )
        release_freed_memory()  # a bundle can be a whole partition: hundreds of buckets

    def finish_bundle(self):
        # What the last buckets freed, which the period may have skipped: at 10 M images an SDK
        # worker on Spark kept 230 MB free in glibc's heap after this step into the next.
        release_freed_memory(force=True)


def pairs_result(examples: int, pairs: list[tuple], move: bool) -> dict[str, Any]:
    """The search's result from its pairs, shaped like ``leakage.NOTHING_FOUND``.

    Args:
      examples: how many examples were searched (one per content).
      pairs: ``(key a, key b, distance, flipped, window, split a, label a, split b, label
        b)``, at most ``MAX_REPORTED_PAIRS``, in any order.
      move: also choose the validation examples to move to train (``move_to_train``).
    """
    pairs = sorted(pairs)
    keys = np.array(sorted({p[0] for p in pairs} | {p[1] for p in pairs}), np.int64)
    split_of: dict[int, int] = {}
    label_of: dict[int, int] = {}
    for a, b, _d, _f, _w, split_a, label_a, split_b, label_b in pairs:
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
        "window": [p[4] for p in pairs],
        "leakage": leakage.tolist(),
        "cross_class": cross.tolist(),
        "moved": sorted(keys[moved].tolist()),
        "examples": int(examples),
        "complete": found.complete,
    }


class SearchNearDuplicates(beam.PTransform):
    """``(key number, phash, split code, label, windows...) -> dict``: the pairs and moves, one
    element (none without entries), shaped like ``leakage.NOTHING_FOUND``; see the module's
    docstring.

    Args:
      rule: when two examples are near-duplicates (thresholds and windows).
      move: also choose the validation examples to move to train.
      max_bucket_entries: the most entries one bucket search holds before the bucket is split.

    Raises:
      ValueError: for ``max_bucket_entries`` below 2.
    """

    def __init__(
        self,
        *,
        rule: WindowRule = DEFAULT_RULE,
        move: bool = False,
        max_bucket_entries: int = DEFAULT_MAX_BUCKET_ENTRIES,
    ) -> None:
        super().__init__()
        bucket_blocks(0, max_bucket_entries)
        self._rule, self._move, self._max = rule, move, max_bucket_entries

    def expand(self, entries):
        rule, most = self._rule, self._max
        big = (
            entries
            | "BucketSizes" >> beam.ParDo(_CountBucketsFn(rule))
            | "CountBuckets" >> beam.CombinePerKey(sum)
            | "OnlyBig" >> beam.Filter(lambda kv, m: kv[1] > m, most)
            # ((chunk, value), entries): the buckets to split into blocks
        )
        searched = (
            entries
            | "BucketEntries" >> beam.ParDo(_ToBlocksFn(rule, most), beam.pvalue.AsDict(big))
            # ((chunk, value, block p, block q), entry rows in bytes), a few a bucket and bundle
            | "GroupBuckets" >> beam.GroupByKey()
            | "SearchBuckets"
            >> beam.ParDo(SearchBucketFn(rule)).with_outputs(EXAMPLES, main="pairs")
        )
        # (key a, key b, distance, flipped, window, split a, label a, split b, label b), a < b
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
