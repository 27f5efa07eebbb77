"""Near-duplicates across the dataset at build time: the report, and moving leakage to train.

Every example's window hashes (``CatalogMeta.phash``, the whole frame, and
``CatalogMeta.window_phash``), as a few fixed-size numbers per example, are searched by the
window rule (``catalog.window_search``: whole frame to whole frame, and a whole frame to the
centred windows of the other, which pairs a crop with its original), gathered in one worker
or on the engine bucket by bucket (``near_duplicate_search``: chunks of multi-index hashing as
shuffle keys), with the same pairs. What comes out:

* ``near_duplicates.jsonl``: one line per pair the rule joins (``--near_duplicate_threshold``
  bits between whole frames, ``--near_duplicate_window_threshold`` to a window),
  train-validation leakage first, then pairs joining two classes, then the rest; each line names
  both examples (key, URI, class, split as written) and the distance;
* with ``--leakage move_to_train``, the validation examples joined to a train example through
  near-duplicate pairs are put in train instead (``leakage_moves``), before the shards are
  written, so the published validation split holds no near-duplicate of a training example.
  The default, ``report``, changes nothing and does not hold up the writer.

Byte-identical copies are one example here (the shard writer keeps one); a content filed under
two classes (a label conflict, already in ``duplicates.jsonl``) is left out.

Memory: no step holds every hash; a bucket search holds at most about
``DEFAULT_MAX_BUCKET_ENTRIES`` entries, and the last step at most ``MAX_REPORTED_PAIRS`` pairs
(the gathered search holds 49 bytes per example in one worker: key, split, label and the
four window hashes).
Nothing else of a record is held back for the report. The report is written once the split
catalogs are merged, and names the examples of each pair from them (the copy kept, in the split
written): a second pass over every record, waiting for the search, would make the runner keep
every record in memory until the search is done. Each catalog (each partition of a partitioned
split) is read by its own worker, one batch of rows at a time, with the pairs' key numbers as a
side input, and emits only the rows of examples in a pair; one last step writes the report from
the pairs and those rows (at most ``2 * MAX_REPORTED_PAIRS`` of them).
"""

from __future__ import annotations

import array
import json
from collections.abc import Iterable
from typing import Any, NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from beam_pipelines.graph.near_duplicate_search import (
    DEFAULT_MAX_BUCKET_ENTRIES,
    MAX_REPORTED_PAIRS,
    SearchNearDuplicates,
    hash_entry,
    key_number,
)
from beam_pipelines.output.catalog_io import CatalogResult, read_catalog_batches
from beam_pipelines.output.publish import write_text
from beam_pipelines.output.shards import METRICS_NAMESPACE, TRAIN, VALIDATION
from catalog.near_duplicates import classify, leakage_moves, leakage_remedy
from catalog.window_hashes import WINDOW_SCALES
from catalog.window_search import DEFAULT_RULE, WindowRule, find_window_pairs
from cliflags import plural

__all__ = [
    "NEAR_DUPLICATES_NAME",
    "LEAKAGE_ACTIONS",
    "SEARCH_METHODS",
    "AUTO_BUCKETED_FROM",
    "MAX_REPORTED_PAIRS",
    "NearDuplicateMember",
    "NearDuplicatePair",
    "key_number",
    "NOTHING_FOUND",
    "search_columns",
    "catalog_members",
    "members_from_catalogs",
    "guess_transformation",
    "FindNearDuplicates",
    "found_side_input",
    "ReportNearDuplicates",
    "MoveLeakageToTrain",
    "summary_lines",
]

NEAR_DUPLICATES_NAME = "near_duplicates.jsonl"
LEAKAGE_ACTIONS = ("report", "move_to_train")
# --near_duplicate_search: every hash in one worker, or chunk buckets on the engine's workers;
# auto picks one before the job starts (config.resolve_search).
SEARCH_METHODS = ("auto", "gathered", "bucketed")
# auto searches by bucket from this many listed inputs on a distributed runner: the gathered
# search's worker holds about 400 bytes an example while it searches by the window rule (its
# 49-byte columns and 352 at the peak of the search: docs/benchmarks.md), and its time grows
# faster than the examples (whole frames alone took one core for 12 minutes at 10 M, on Dask;
# the window rule takes about 5 times as long).
AUTO_BUCKETED_FROM = 10_000_000
_MEMBER_COLUMNS = ("key", "uri", "label", "text", "source_width", "source_height")
_SAME_ASPECT = 0.01  # relative: sources whose aspect ratios differ more were cropped
# What the search finds among no examples.
NOTHING_FOUND: dict[str, Any] = {
    "a": [],
    "b": [],
    "distance": [],
    "flipped": [],
    "window": [],
    "leakage": [],
    "cross_class": [],
    "moved": [],
    "examples": 0,
    "complete": True,
}


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
    probably: str = "unknown"  # guess_transformation's answer

    def to_json(self) -> str:
        return json.dumps(
            {
                "a": self.a._asdict(),
                "b": self.b._asdict(),
                "distance": self.distance,
                "flipped": self.flipped,
                "probably": self.probably,
                "leakage": self.leakage,
                "cross_class": self.cross_class,
            },
            ensure_ascii=False,
            sort_keys=True,
        )


# The gathered search's columns: key number, phash, split code, label, then the hashes of
# the windows after the whole frame (``hash_entry``).
_COLUMN_TYPES = ("q", "q", "B", "q") + ("q",) * (len(WINDOW_SCALES) - 1)


class _Columns(beam.CombineFn):
    """``(key number, phash, split code, label, windows...) -> columns``: 49 bytes an example
    with four windows."""

    def create_accumulator(self):
        return tuple(array.array(code) for code in _COLUMN_TYPES)

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


def search_columns(columns, rule: WindowRule, move: bool) -> dict[str, Any]:
    """Runs the search over all examples; returns the pairs (by key number) and the moves.

    Args:
      columns: every example as packed arrays, one entry each: key numbers (int64),
        perceptual hashes (int64, carried signed), split codes (uint8: 0 train, 1 validation),
        labels (int64), then one array per window after the whole frame (int64, signed).
      rule: when two examples are near-duplicates (``catalog.window_search``).
      move: also choose the validation examples to move to train (``move_to_train``).

    Returns:
      The search's result, shaped like ``NOTHING_FOUND``.
    """
    keys = np.frombuffer(columns[0], dtype=np.int64)
    windows = np.stack(
        [np.frombuffer(c, dtype=np.int64) for c in (columns[1], *columns[4:])], axis=1
    ).view(np.uint64)  # (N, W), whole frame first
    splits = np.frombuffer(columns[2], dtype=np.uint8)
    labels = np.frombuffer(columns[3], dtype=np.int64)
    # One example per content; contents under two classes (label conflicts) are left out.
    order = np.lexsort((labels, keys))
    keys, windows, splits, labels = keys[order], windows[order], splits[order], labels[order]
    first = np.ones(keys.shape[0], bool)
    first[1:] = keys[1:] != keys[:-1]
    group = np.cumsum(first) - 1
    conflicted = np.zeros(int(first.sum()), bool)
    np.logical_or.at(conflicted, group[1:], (labels[1:] != labels[:-1]) & ~first[1:])
    keep = first.copy()
    keep[first] = ~conflicted
    keys, windows, splits, labels = keys[keep], windows[keep], splits[keep], labels[keep]
    found = find_window_pairs(windows, rule, max_pairs=MAX_REPORTED_PAIRS)
    pairs = found.pairs
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
        "window": found.window.tolist(),
        "leakage": leakage.tolist(),
        "cross_class": cross.tolist(),
        "moved": sorted(keys[moved].tolist()),
        "examples": int(keys.shape[0]),
        "complete": pairs.complete,
    }


def _key_prefix(number: int) -> str:
    # The first 16 hex digits of the keys whose key number this is (inverse of key_number).
    return format(number & ((1 << 64) - 1), "016x")


def guess_transformation(
    flipped: bool,
    size_a: tuple[int, int] | None,
    size_b: tuple[int, int] | None,
    scale: float = 1.0,
) -> str:
    """Which transformation probably turned one source of a pair into the other, where the
    hash and the source sizes can tell: ``mirror``, ``crop N%`` (matched by a window: one shows
    about the centred ``N`` % of the other's sides), ``crop`` (aspect ratios differ), ``scale``
    (one aspect, another size), ``re-encode or edit`` (the same size), joined by ``+``;
    ``unknown`` when the sizes are not recorded (an adopted dataset)."""
    parts = ["mirror"] if flipped else []
    if scale < 1:
        parts.append(f"crop {round(scale * 100)}%")
    elif size_a and size_b and all(size_a) and all(size_b):
        aspect_a, aspect_b = size_a[0] / size_a[1], size_b[0] / size_b[1]
        if abs(aspect_a - aspect_b) > _SAME_ASPECT * aspect_a:
            parts.append("crop")
        elif size_a != size_b:
            parts.append("scale")
        elif not flipped:
            parts.append("re-encode or edit")
    return "+".join(parts) or "unknown"


def _wanted_prefixes(numbers: Iterable[int]) -> pa.Array:
    return pa.array(sorted({_key_prefix(n) for n in numbers}), pa.string())


def catalog_members(
    output_dir: str, catalog: CatalogResult, wanted: pa.Array
) -> dict[int, tuple[NearDuplicateMember, tuple[int, int] | None]]:
    """The rows of one catalog (a split's catalog or one of its partitions) whose key starts
    with a prefix in ``wanted`` (``_key_prefix`` of the key numbers sought): for each key
    number, the first row of least URI, as a member and its source ``(width, height)`` (None if
    unknown). Read one batch at a time, keeping only the rows named.
    """
    found: dict[int, tuple[NearDuplicateMember, tuple[int, int] | None]] = {}
    for batch in read_catalog_batches(output_dir, catalog.file, _MEMBER_COLUMNS):
        prefixes = pc.utf8_slice_codeunits(batch.column("key"), 0, 16)
        for row in batch.filter(pc.is_in(prefixes, value_set=wanted)).to_pylist():
            number = key_number(row["key"])
            member = NearDuplicateMember(
                row["key"], row["uri"], row["label"], row["text"], catalog.split
            )
            if number not in found or member.uri < found[number][0].uri:
                width, height = row.get("source_width"), row.get("source_height")
                found[number] = (member, (width, height) if width and height else None)
    return found


def _choose_members(
    per_catalog: Iterable[tuple[CatalogResult, Iterable[tuple[int, Any]]]],
    sizes: dict[int, tuple[int, int] | None] | None,
) -> dict[int, NearDuplicateMember]:
    # Catalog after catalog in their order, the first member of least URI wins: the choice
    # one pass over every catalog's rows would make.
    found: dict[int, NearDuplicateMember] = {}
    for _, members in sorted(per_catalog, key=lambda item: item[0]):
        for number, (member, size) in members:
            if number not in found or member.uri < found[number].uri:
                found[number] = member
                if sizes is not None:
                    sizes[number] = size
    return found


def members_from_catalogs(
    output_dir: str,
    catalogs: Iterable[CatalogResult],
    numbers: Iterable[int],
    sizes: dict[int, tuple[int, int] | None] | None = None,
) -> dict[int, NearDuplicateMember]:
    """The written example of each key number in ``numbers``, read from the split catalogs.

    A catalog holds the copy of each content the shard writer kept (the first in URI order),
    in the split it was written to, so the report names what the dataset holds. Catalogs are
    read one batch at a time, only the rows named kept: memory does not grow with the dataset.
    ``sizes``, when given, receives each member's source ``(width, height)`` (None if unknown).
    ``ReportNearDuplicates`` reads each catalog on its own worker instead (``catalog_members``)
    and chooses as this does.
    """
    wanted = _wanted_prefixes(numbers)
    if len(wanted) == 0:
        return {}
    per_catalog = [
        (catalog, catalog_members(output_dir, catalog, wanted).items())
        for catalog in sorted(catalogs)
    ]
    return _choose_members(per_catalog, sizes)


def _pair_numbers(found: dict[str, Any]) -> list[int]:
    return sorted(set(found["a"]) | set(found["b"]))


class _PairMembersFn(beam.DoFn):
    """``CatalogResult -> (CatalogResult, [(key number, (member, size))])``: the rows of one
    catalog (partition) that name an example of a pair; nothing when it holds none."""

    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir
        self._numbers: Any = None
        self._wanted = pa.array([], pa.string())

    def process(self, catalog: CatalogResult, numbers: list[int]):
        if numbers is not self._numbers:
            self._numbers, self._wanted = numbers, _wanted_prefixes(numbers)
        # No pair: no catalog is read.
        members = (
            catalog_members(self._output_dir, catalog, self._wanted) if len(self._wanted) else {}
        )
        if members:
            yield catalog, sorted(members.items())


class _WriteReportFn(beam.DoFn):
    def __init__(self, output_dir: str, rule: WindowRule, action: str) -> None:
        self._output_dir = output_dir
        self._rule = rule
        self._action = action

    def process(self, _, found, per_catalog):
        # per_catalog: (CatalogResult, [(key number, (member, size))]) from _PairMembersFn
        moved = set(found["moved"])
        sizes: dict[int, tuple[int, int] | None] = {}
        written = _choose_members(per_catalog, sizes)

        def member(number: int) -> NearDuplicateMember:
            return written[number]._replace(moved=number in moved)

        lines = []
        for a, b, distance, flipped, window, leak, cross in zip(
            found["a"],
            found["b"],
            found["distance"],
            found["flipped"],
            found["window"],
            found["leakage"],
            found["cross_class"],
            strict=True,
        ):
            one, two = sorted((member(a), member(b)))
            rank = 0 if leak else 1 if cross else 2
            scale = self._rule.scales[window]
            probably = guess_transformation(flipped, sizes.get(a), sizes.get(b), scale)
            lines.append(
                NearDuplicatePair(rank, distance, one, two, flipped, leak, cross, probably)
            )
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
            "threshold": self._rule.threshold,
            "window_threshold": self._rule.window_threshold,
            "action": self._action,
            "examples": found["examples"],
            "pairs": len(lines),
            "leakage": sum(p.leakage for p in lines),
            "cross_class": sum(p.cross_class for p in lines),
            "moved_to_train": len(moved),
            "complete": found["complete"],
        }


class FindNearDuplicates(beam.PTransform):
    """``(split, record) -> dict``: the pairs and moves, one element (none without records).

    Records are ``PreparedRecord`` or ``StagedRecord`` (anything with ``sha256`` and ``meta``).
    The dict holds the pairs by key number and ``moved``, the key numbers
    ``MoveLeakageToTrain`` moves; read it with ``found_side_input``, which stands in for an
    empty search. Only 49 bytes per example (four window hashes) leave this step's first map;
    nothing else of a record is kept (``ReportNearDuplicates`` names the examples from the
    catalogs).

    The search runs on the engine, bucket by bucket (``SearchNearDuplicates``); with
    ``gathered=True`` every hash is gathered in one worker and searched there
    (``search_columns``). Both search by the window rule, and give the same result while the
    pairs stay under
    ``MAX_REPORTED_PAIRS``; past it the gathered search keeps the pairs its probe order met
    first, the bucketed one the first in key order. The pipeline gathers unless the input is
    a listing of ``AUTO_BUCKETED_FROM`` inputs or more on a distributed runner
    (``--near_duplicate_search auto``): bucketing sends 2(t+1) entries an example through a
    shuffle, which Beam's in-process runner holds in memory (about 2 KB an example with four
    windows, against 49 gathered), while the gathered search's one worker holds a few hundred
    bytes an example while it searches (docs/benchmarks.md).

    Args:
      rule: when two examples are near-duplicates (thresholds and windows).
      action: ``"report"`` or ``"move_to_train"`` (one of ``LEAKAGE_ACTIONS``).
      gathered: search every hash in one worker instead of bucket by bucket.
      max_bucket_entries: the most entries one bucket search holds (bucket by bucket only).

    Raises:
      ValueError: for an action out of range, naming the flag.
    """

    def __init__(
        self,
        *,
        rule: WindowRule = DEFAULT_RULE,
        action: str = "report",
        gathered: bool = False,
        max_bucket_entries: int = DEFAULT_MAX_BUCKET_ENTRIES,
    ) -> None:
        super().__init__()
        if action not in LEAKAGE_ACTIONS:
            raise ValueError(f"--leakage must be one of {LEAKAGE_ACTIONS}, got {action!r}")
        self._rule = rule
        self._action = action
        self._gathered = gathered
        self._max_bucket_entries = max_bucket_entries

    def expand(self, by_split):
        rule, move = self._rule, self._action == "move_to_train"
        entries = (
            by_split
            | "HashEntries" >> beam.Map(hash_entry)
            | "WithHash" >> beam.Filter(lambda entry: entry is not None)
            # (key number, phash, split code, label, window 1, ..., window W - 1)
        )
        if not self._gathered:
            return entries | "SearchByBucket" >> SearchNearDuplicates(
                rule=rule, move=move, max_bucket_entries=self._max_bucket_entries
            )
        return (
            entries
            # Without defaults: a default would be injected through a side input, which the
            # in-process runner keeps (all the columns) until the pipeline ends.
            | "Columns" >> beam.CombineGlobally(_Columns()).without_defaults()
            | "Search" >> beam.Map(search_columns, rule, move)
            # {"a", "b", "distance", ..., "moved"}, one element (none without records)
        )


def found_side_input(found):
    """``found`` (``FindNearDuplicates``' output) as a singleton side input; an empty search
    when no record had a hash."""
    return beam.pvalue.AsSingleton(found, default_value=NOTHING_FOUND)


class ReportNearDuplicates(beam.PTransform):
    """``CatalogResult -> dict`` (one element): writes ``near_duplicates.jsonl`` once the split
    catalogs are merged; returns its counts (pairs, leakage, cross-class, moved) for the run's
    summary.

    Each catalog (partition) is read on its own worker for the rows of the pairs' examples
    (``catalog_members``); one step writes the report from the pairs and those rows, choosing
    each example's row as ``members_from_catalogs`` does, so the bytes do not depend on how
    the catalogs are partitioned or spread.

    Args:
      output_dir: the dataset directory: its catalogs name the examples of each pair, and the
        report goes there.
      found: the output of ``FindNearDuplicates``.
      rule, action: as given to ``FindNearDuplicates`` (recorded in the summary).
    """

    def __init__(
        self, output_dir: str, found, *, rule: WindowRule = DEFAULT_RULE, action: str = "report"
    ) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._found = found
        self._rule = rule
        self._action = action

    def expand(self, catalogs):
        numbers = self._found | "PairKeys" >> beam.Map(_pair_numbers)
        # [int]: the key numbers of the pairs' examples, one element (none without records)
        members = catalogs | "ReadMembers" >> beam.ParDo(
            _PairMembersFn(self._output_dir), beam.pvalue.AsSingleton(numbers, default_value=[])
        )
        # (CatalogResult, [(key number, (NearDuplicateMember, size))]): one catalog's rows named
        return (
            catalogs.pipeline
            | "Once" >> beam.Create([None])
            | "WriteReport"
            >> beam.ParDo(
                _WriteReportFn(self._output_dir, self._rule, self._action),
                found_side_input(self._found),
                beam.pvalue.AsList(members),
            )
        )


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
        return by_split | "Move" >> beam.ParDo(_MoveFn(), found_side_input(self._found))


def summary_lines(summary: dict[str, Any] | None, output_dir: str) -> Iterable[str]:
    """The run summary's near-duplicate line(s): the counts; with leakage left in the splits
    (``--leakage report``), what ``--leakage move_to_train`` would do about it; and the report,
    when it lists a pair."""
    if not summary:
        return
    text = (
        f"near-duplicates (<= {summary['threshold']} bits): {plural(summary['pairs'], 'pair')} "
        f"({summary['leakage']} train-validation leakage, {summary['cross_class']} cross-class)"
    )
    if summary.get("moved_to_train"):
        text += f"; {plural(summary['moved_to_train'], 'validation example')} moved to train"
    if not summary.get("complete", True):
        text += f" (stopped at {MAX_REPORTED_PAIRS:,} pairs)"
    yield text
    if summary["leakage"] and summary.get("action", "report") == "report":
        yield f"  leakage: {leakage_remedy(output_dir)}"
    if summary["pairs"]:
        yield f"near-duplicates report: {FileSystems.join(output_dir, summary['file'])}"
