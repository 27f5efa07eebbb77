"""Near-duplicates across the dataset at build time: the report, and moving leakage to train.

Every example's perceptual hash (``CatalogMeta.phash``) is gathered, as a few fixed-size
numbers per example, into one step that runs ``catalog.near_duplicates.find_pairs`` over all of
them. What comes out:

* ``near_duplicates.jsonl``: one line per pair within ``--near_duplicate_threshold`` bits,
  train-validation leakage first, then pairs joining two classes, then the rest; each line names
  both examples (key, URI, class, split as written) and the distance;
* with ``--leakage move_to_train``, the validation examples joined to a train example through
  near-duplicate pairs are put in train instead (``leakage_moves``), before the shards are
  written, so the published validation split holds no near-duplicate of a training example.
  The default, ``report``, changes nothing and does not hold up the writer.

Byte-identical copies are one example here (the shard writer keeps one); a content filed under
two classes (a label conflict, already in ``duplicates.jsonl``) is left out.
"""

from __future__ import annotations

import array
import json
from collections.abc import Iterable
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_pipelines.publish import write_text
from beam_pipelines.shards import METRICS_NAMESPACE, TRAIN, VALIDATION
from catalog.near_duplicates import DEFAULT_THRESHOLD, classify, find_pairs, leakage_moves

__all__ = [
    "NEAR_DUPLICATES_NAME",
    "LEAKAGE_ACTIONS",
    "MAX_REPORTED_PAIRS",
    "NearDuplicateMember",
    "NearDuplicatePair",
    "key_number",
    "FindNearDuplicates",
    "MoveLeakageToTrain",
    "summary_lines",
]

NEAR_DUPLICATES_NAME = "near_duplicates.jsonl"
LEAKAGE_ACTIONS = ("report", "move_to_train")
# A set holding thousands of copies of one image has millions of pairs: the search stops here.
MAX_REPORTED_PAIRS = 1_000_000
_SPLIT_CODES = {TRAIN: 0, VALIDATION: 1}


def _signed(value: int) -> int:
    # Beam's integer coder holds signed 64-bit values: the same 64 bits, read as signed.
    return value - (1 << 64) if value >= 1 << 63 else value


def key_number(sha256: str) -> int:
    """The first 64 bits of an example's key, as a signed int: what the search step carries."""
    return _signed(int(sha256[:16], 16))


class NearDuplicateMember(NamedTuple):
    """One side of a pair, as written."""

    key: str
    uri: str
    label: int
    text: str
    split: str
    moved: bool = False  # moved from validation to train by --leakage move_to_train


class NearDuplicatePair(NamedTuple):
    """One line of ``near_duplicates.jsonl``; tuples sort in report order."""

    rank: int  # 0 leakage, 1 cross-class, 2 other
    distance: int
    a: NearDuplicateMember
    b: NearDuplicateMember
    flipped: bool
    leakage: bool
    cross_class: bool

    def to_json(self) -> str:
        return json.dumps(
            {
                "a": self.a._asdict(),
                "b": self.b._asdict(),
                "distance": self.distance,
                "flipped": self.flipped,
                "leakage": self.leakage,
                "cross_class": self.cross_class,
            },
            ensure_ascii=False,
            sort_keys=True,
        )


class _Columns(beam.CombineFn):
    """``(key number, phash, split code, label) -> columns``: 25 bytes an example."""

    def create_accumulator(self):
        return (array.array("q"), array.array("q"), array.array("B"), array.array("q"))

    def add_input(self, acc, element):
        for column, value in zip(acc, element, strict=True):
            column.append(value)
        return acc

    def merge_accumulators(self, accumulators):
        merged = self.create_accumulator()
        for acc in accumulators:
            for column, part in zip(merged, acc, strict=True):
                column.extend(part)
        return merged

    def extract_output(self, acc):
        return acc


def _entry(element) -> tuple[int, int, int, int] | None:
    split, record = element
    meta = record.meta
    if meta is None or meta.phash is None or split not in _SPLIT_CODES:
        return None
    return (key_number(record.sha256), _signed(meta.phash), _SPLIT_CODES[split], meta.label)


def _search(columns, threshold: int, move: bool) -> dict[str, Any]:
    """Runs the search over all examples; returns the pairs (by key number) and the moves."""
    keys = np.frombuffer(columns[0], dtype=np.int64)
    hashes = np.frombuffer(columns[1], dtype=np.int64).view(np.uint64)
    splits = np.frombuffer(columns[2], dtype=np.uint8)
    labels = np.frombuffer(columns[3], dtype=np.int64)
    # One example per content; contents under two classes (label conflicts) are left out.
    order = np.lexsort((labels, keys))
    keys, hashes, splits, labels = keys[order], hashes[order], splits[order], labels[order]
    first = np.ones(keys.shape[0], bool)
    first[1:] = keys[1:] != keys[:-1]
    group = np.cumsum(first) - 1
    conflicted = np.zeros(int(first.sum()), bool)
    np.logical_or.at(conflicted, group[1:], (labels[1:] != labels[:-1]) & ~first[1:])
    keep = first.copy()
    keep[first] = ~conflicted
    keys, hashes, splits, labels = keys[keep], hashes[keep], splits[keep], labels[keep]
    pairs = find_pairs(hashes, threshold, max_pairs=MAX_REPORTED_PAIRS)
    names = np.array([TRAIN, VALIDATION], dtype=object)[splits]
    moved = leakage_moves(pairs, names) if move else np.zeros(0, np.int64)
    written = names.copy()
    written[moved] = TRAIN
    leakage, cross = classify(pairs, written, labels)
    return {
        "a": keys[pairs.first].tolist(),
        "b": keys[pairs.second].tolist(),
        "distance": pairs.distance.tolist(),
        "flipped": pairs.flipped.tolist(),
        "leakage": leakage.tolist(),
        "cross_class": cross.tolist(),
        "moved": sorted(keys[moved].tolist()),
        "examples": int(keys.shape[0]),
        "complete": pairs.complete,
    }


def _member_of(element, involved: set[int]):
    # (split, record) -> (key number, member) for examples named in a pair
    split, record = element
    number = key_number(record.sha256)
    if number in involved and record.meta is not None:
        yield number, (record.uri, record.sha256, record.meta.label, record.meta.text, split)


class _WriteReportFn(beam.DoFn):
    def __init__(self, output_dir: str, threshold: int, action: str) -> None:
        self._output_dir = output_dir
        self._threshold = threshold
        self._action = action

    def process(self, _, found, members):
        moved = set(found["moved"])
        # The first URI of each content, as the shard writer keeps it.
        first: dict[int, tuple] = {}
        for number, member in members:
            if number not in first or member[0] < first[number][0]:
                first[number] = member

        def member(number: int) -> NearDuplicateMember:
            uri, sha256, label, text, split = first[number]
            is_moved = number in moved
            return NearDuplicateMember(
                sha256, uri, label, text, TRAIN if is_moved else split, is_moved
            )

        lines = []
        for a, b, distance, flipped, leak, cross in zip(
            found["a"],
            found["b"],
            found["distance"],
            found["flipped"],
            found["leakage"],
            found["cross_class"],
            strict=True,
        ):
            one, two = sorted((member(a), member(b)))
            rank = 0 if leak else 1 if cross else 2
            lines.append(NearDuplicatePair(rank, distance, one, two, flipped, leak, cross))
        lines.sort()
        write_text(
            FileSystems.join(self._output_dir, NEAR_DUPLICATES_NAME),
            "".join(line.to_json() + "\n" for line in lines),
        )
        Metrics.counter(METRICS_NAMESPACE, "near_duplicate_pairs").inc(len(lines))
        Metrics.counter(METRICS_NAMESPACE, "leakage_pairs").inc(sum(p.leakage for p in lines))
        Metrics.counter(METRICS_NAMESPACE, "moved_to_train").inc(len(moved))
        yield {
            "file": NEAR_DUPLICATES_NAME,
            "threshold": self._threshold,
            "action": self._action,
            "examples": found["examples"],
            "pairs": len(lines),
            "leakage": sum(p.leakage for p in lines),
            "cross_class": sum(p.cross_class for p in lines),
            "moved_to_train": len(moved),
            "complete": found["complete"],
        }


class FindNearDuplicates(beam.PTransform):
    """``(split, record) -> dict``: the pairs and moves (one element), the report written.

    Records are ``PreparedRecord`` or ``StagedRecord`` (anything with ``sha256``, ``uri`` and
    ``meta``). Returns ``{"found": ..., "summary": ...}``: ``found`` is one dict holding the
    pairs by key number and ``moved``, the key numbers ``MoveLeakageToTrain`` moves; ``summary``
    one dict of counts (pairs, leakage, cross-class, moved) for the run's summary.

    Args:
      output_dir: where ``near_duplicates.jsonl`` goes.
      threshold: the largest Hamming distance that makes a pair.
      action: ``"report"`` or ``"move_to_train"`` (one of ``LEAKAGE_ACTIONS``).

    Raises:
      ValueError: for an action or threshold out of range, naming the flag.
    """

    def __init__(
        self, output_dir: str, *, threshold: int = DEFAULT_THRESHOLD, action: str = "report"
    ) -> None:
        super().__init__()
        if action not in LEAKAGE_ACTIONS:
            raise ValueError(f"--leakage must be one of {LEAKAGE_ACTIONS}, got {action!r}")
        self._output_dir = output_dir
        self._threshold = threshold
        self._action = action

    def expand(self, by_split):
        threshold, move = self._threshold, self._action == "move_to_train"
        found = (
            by_split
            | "HashEntries" >> beam.Map(_entry)
            | "WithHash" >> beam.Filter(lambda entry: entry is not None)
            # (key number, phash, split code, label)
            | "Columns" >> beam.CombineGlobally(_Columns())
            | "Search" >> beam.Map(_search, threshold, move)
            # {"a", "b", "distance", ..., "moved"}, one element
        )
        members = by_split | "PairMembers" >> beam.FlatMap(
            lambda element, found: _member_of(element, set(found["a"]) | set(found["b"])),
            beam.pvalue.AsSingleton(found),
        )
        # (key number, (uri, sha256, label, text, split)) for examples in a pair
        summary = (
            by_split.pipeline
            | "Once" >> beam.Create([None])
            | "WriteReport"
            >> beam.ParDo(
                _WriteReportFn(self._output_dir, self._threshold, self._action),
                beam.pvalue.AsSingleton(found),
                beam.pvalue.AsList(members),
            )
        )
        return {"found": found, "summary": summary}


class _MoveFn(beam.DoFn):
    """``(split, record) -> (split, record)`` with the leakage moves applied."""

    def __init__(self) -> None:
        self._found: Any = None
        self._moved: set[int] = set()

    def process(self, element, found):
        if found is not self._found:
            self._found, self._moved = found, set(found["moved"])
        split, record = element
        if split == VALIDATION and key_number(record.sha256) in self._moved:
            yield TRAIN, record
        else:
            yield element


class MoveLeakageToTrain(beam.PTransform):
    """``(split, record) -> (split, record)``: validation examples in ``found["moved"]`` go to
    train. Every record waits for the search (a side input computed from all records).

    Args:
      found: the ``"found"`` output of ``FindNearDuplicates``.
    """

    def __init__(self, found) -> None:
        super().__init__()
        self._found = found

    def expand(self, by_split):
        return by_split | "Move" >> beam.ParDo(_MoveFn(), beam.pvalue.AsSingleton(self._found))


def summary_lines(summary: dict[str, Any] | None, output_dir: str) -> Iterable[str]:
    """The run summary's near-duplicate line(s)."""
    if not summary:
        return
    text = (
        f"near-duplicates (<= {summary['threshold']} bits): {summary['pairs']} pairs, "
        f"{summary['leakage']} train-validation leakage, {summary['cross_class']} cross-class"
    )
    if summary.get("moved_to_train"):
        moved = summary["moved_to_train"]
        text += f"; {moved} validation example{'' if moved == 1 else 's'} moved to train"
    if not summary.get("complete", True):
        text += f" (stopped at {MAX_REPORTED_PAIRS:,} pairs)"
    yield text
    yield f"near-duplicates report: {FileSystems.join(output_dir, summary['file'])}"
