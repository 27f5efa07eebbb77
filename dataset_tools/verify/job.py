"""``verify`` as a Beam job: every shard checked on its own worker, one report written.

The local command (``python -m dataset_tools.verify``) reads every shard on one machine; for a
dataset of many terabytes this job spreads the same checks over any Beam runner's workers
(``python -m dataset_tools.verify.job DATASET --report URI [Beam pipeline options]``). Each
shard is one element: its records, CRCs, count, size and SHA-256 (``verification.verify_shard``)
and its index file (``checks.check_index_file``) are checked where it is read. Two shuffles
then bring together what spans shards:

* keys, by bucket of their hash: each bucket finds its duplicates (``keys.KeyCollector``), so
  no worker holds every key;
* the records seen, by catalog file (a split's one file, or each of its partitions), for that
  file's check (``checks.check_catalog_part``): a check holds the record notes of the shards
  its file describes (about 100 bytes a record; at most a partition's 2 M rows, about 200 MB,
  for a partitioned catalog).

The shard reports, duplicate keys and catalog problems are gathered into one ``VerifyReport``,
written as the JSON ``verify --json`` prints, with the same problems in the same order.

Workers open the dataset by the URI given, so it must be one they can all read (an object
store or a shared file system). Datasets without ``dataset.json`` (foreign shards) are the
local command's.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from dataset_tools.keys import KeyCollector
from dataset_tools.verify.checks import (
    catalog_part_of,
    catalog_part_shards,
    check_catalog_part,
    check_index_file,
)
from dataset_tools.verify.listing import ListedShards
from dataset_tools.verify.report import RecordNote, VerifyReport
from dataset_tools.verify.verification import shard_reports, verify_shard
from schemas import Manifest
from tfrecord_io.random_access import dataset_files
from tfrecord_io.source import load_manifest

__all__ = ["KEYS_PER_BUCKET", "VerifyShards", "read_report", "run_verify_job"]

#: Keys a duplicate-search bucket holds at most, on average (24 bytes each in a KeyCollector).
KEYS_PER_BUCKET = 2_000_000
# The local command lists at most this many duplicated keys (KeyCollector.duplicates' limit).
_DUPLICATE_LINES = 100


def _open(source: str) -> tuple[Manifest, ListedShards]:
    manifest = load_manifest(source)
    if manifest is None:
        raise ValueError(
            f"{source} has no dataset.json: the verify job checks datasets; foreign shards are "
            "checked by python -m dataset_tools.verify"
        )
    return manifest, shard_reports(source, manifest)


class _CheckShardFn(beam.DoFn):
    """``ordinal -> ("shard", ordinal, ShardReport)``, plus ``("keys", bucket, entries)`` per
    bucket its keys fall in and ``("notes", (split, part), (ordinal, notes))`` for the check of
    catalog file ``part`` of the split.

    One shard per element: read once, checked, and its index file checked against it.
    """

    def __init__(self, source: str, *, deep: bool, buckets: int) -> None:
        self._source = source
        self._deep = deep
        self._buckets = buckets
        self._listed: ListedShards | None = None

    def setup(self) -> None:
        # Each worker reads dataset.json (and its shard tables) once; an element's shard entry
        # is looked up in them (``ListedShards``), no list of every shard is built.
        self._listed = _open(self._source)[1]

    def process(self, ordinal: int) -> Iterator[tuple[str, Any, Any]]:
        listed = self._listed
        assert listed is not None  # set in setup
        info, report = listed.entry(ordinal)
        # Keys are taken from the notes and searched per bucket below, not here.
        notes = verify_shard(report, listed.manifest, deep=self._deep, keys=KeyCollector())
        for problem in check_index_file(listed.files, info, notes):
            report.add(problem)
        yield "shard", ordinal, report
        split = listed.manifest.split(report.split)
        position = ordinal - listed.start(report.split)
        part = catalog_part_of(len(split.catalog_files), position, split.num_shards)
        yield "notes", (report.split, part), (ordinal, notes)
        by_bucket: dict[int, list[tuple[int, int, str]]] = {}
        for record, note in enumerate(notes or ()):
            if note.key is not None:
                bucket = zlib.crc32(note.key.encode("utf-8")) % self._buckets
                by_bucket.setdefault(bucket, []).append((ordinal, record, note.key))
        for bucket, entries in sorted(by_bucket.items()):
            yield "keys", bucket, entries


def _duplicates(
    bucket: tuple[int, Iterable[list[tuple[int, int, str]]]], files: Sequence[str]
) -> list[str]:
    """Every key held twice within one bucket, as ``KeyCollector.duplicates`` words it."""
    entries = sorted(entry for part in bucket[1] for entry in part)
    collector = KeyCollector()
    numbers: dict[int, int] = {}
    for ordinal, record, key in entries:
        if ordinal not in numbers:  # shards in manifest order, so places sort as locally
            numbers[ordinal] = collector.add_shard(files[ordinal])
        collector.add(numbers[ordinal], record, key)
    return collector.duplicates(limit=len(entries))


def _check_catalog_part(
    group: tuple[tuple[str, int], Iterable[tuple[int, list[RecordNote] | None]]], source: str
) -> list[str]:
    """A catalog file checked against every record its shards held, in shard order."""
    (split, part), parts = group
    files = dataset_files(source)
    notes = dict(parts)
    ordinals = sorted(notes)
    split_info = files.manifest.split(split)
    shards = split_info.shards
    positions = catalog_part_shards(len(split_info.catalog_files) or 1, part, len(shards))
    first_index = sum(shards[i].num_examples for i in range(positions.start))
    return check_catalog_part(
        files,
        split,
        part,
        list(zip((shards[i] for i in positions), (notes[o] for o in ordinals), strict=True)),
        first_index=first_index,
    )


class VerifyShards(beam.PTransform):
    """``PBegin -> VerifyReport`` (one element): the checks of ``verify_dataset``, per shard.

    Args:
      source: the dataset root or URI (``dataset.json`` inside), readable by every worker.
      deep: also decode every image.
    """

    def __init__(self, source: str, *, deep: bool = False) -> None:
        super().__init__()
        self._source = source
        self._deep = deep
        manifest, reports = _open(source)
        self._files = [r.file for r in reports]
        self._splits = sorted(manifest.splits)
        examples = sum(manifest.split(split).num_examples for split in manifest.splits)
        self._buckets = max(1, -(-examples // KEYS_PER_BUCKET))

    def expand(self, pbegin):
        source, files = self._source, self._files
        checked = (
            pbegin
            | "Shards" >> beam.Create(range(len(files)))
            # int: a shard's position in the report; spread so each worker reads its own shards
            | "Spread" >> beam.Reshuffle()
            | "CheckShard"
            >> beam.ParDo(_CheckShardFn(source, deep=self._deep, buckets=self._buckets))
        )
        # ("shard", ordinal, ShardReport) | ("notes", split, (ordinal, notes)) | ("keys", ...)
        reports = (
            checked
            | "Reports" >> beam.Filter(lambda e: e[0] == "shard")
            | "ReportByOrdinal" >> beam.Map(lambda e: ("shard", (e[1], e[2])))
        )
        duplicates = (
            checked
            | "Keys" >> beam.Filter(lambda e: e[0] == "keys")
            | "KeyByBucket" >> beam.Map(lambda e: (e[1], e[2]))
            | "GroupBuckets" >> beam.GroupByKey()
            | "Duplicates" >> beam.Map(_duplicates, files)
            | "DuplicateLines" >> beam.Map(lambda lines: ("duplicates", lines))
        )
        catalogs = (
            checked
            | "Notes" >> beam.Filter(lambda e: e[0] == "notes")
            | "NotesByCatalogFile" >> beam.Map(lambda e: (e[1], e[2]))
            # ((split, catalog file), (ordinal, notes))
            | "GroupCatalogFiles" >> beam.GroupByKey()
            | "CheckCatalog"
            >> beam.Map(lambda g: ("catalog", (g[0], _check_catalog_part(g, source))))
        )
        return (
            (reports, duplicates, catalogs)
            | "Together" >> beam.Flatten()
            | "Gather" >> beam.combiners.ToList()
            | "Report" >> beam.Map(_assemble, source, self._deep, self._splits)
        )


def _assemble(
    parts: list[tuple[str, Any]], source: str, deep: bool, splits: list[str]
) -> VerifyReport:
    """One report from every shard's, the duplicate keys and the catalogs' problems, in the
    order ``verify_dataset`` gives them."""
    shards = [
        report
        for kind, (_, report) in sorted(
            (p for p in parts if p[0] == "shard"), key=lambda p: p[1][0]
        )
    ]
    # KeyCollector.duplicates orders lines by key; each bucket's are merged in that order.
    lines = sorted(line for kind, found in parts if kind == "duplicates" for line in found)
    problems = lines[:_DUPLICATE_LINES]
    if len(lines) > _DUPLICATE_LINES:
        problems.append(f"... and {len(lines) - _DUPLICATE_LINES} more duplicated keys")
    by_file = sorted(found for kind, found in parts if kind == "catalog")
    for split in splits:
        problems += [p for (name, _), found in by_file if name == split for p in found]
    return VerifyReport(source, deep, shards, problems)


def _write_report(report: VerifyReport, path: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write((json.dumps(report.to_dict(), indent=2) + "\n").encode("utf-8"))


def read_report(path: str) -> VerifyReport:
    """Reads the report a verify job wrote (``VerifyReport.from_dict``).

    Raises:
      OSError: if it cannot be read.
      ValueError: if it is not a verify report.
    """
    with FileSystems.open(path) as handle:
        return VerifyReport.from_dict(json.loads(handle.read().decode("utf-8")))


def run_verify_job(
    source: str | os.PathLike[str],
    report_path: str,
    *,
    deep: bool = False,
    pipeline_args: Sequence[str] = (),
) -> VerifyReport:
    """Verifies a dataset with a Beam job and writes its report to ``report_path``.

    Args:
      source: the dataset root or URI holding ``dataset.json``, readable by every worker.
      report_path: where the report goes (any Beam file system), as ``verify --json`` prints it.
      deep: also decode every image.
      pipeline_args: Beam pipeline options (``--runner``, the runner's own); without
        ``--runner``, the job runs in this process (Beam's FnApiRunner).

    Returns:
      The report, as read back from ``report_path``.

    Raises:
      FileNotFoundError: if ``source`` holds no ``dataset.json``.
      ValueError: if ``dataset.json`` is not a valid manifest.
    """
    text = os.fspath(source)
    options = PipelineOptions(list(pipeline_args))
    runner = None
    if options.view_as(StandardOptions).runner is None:
        # Beam's DirectRunner would first try to download and start Prism.
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        runner = FnApiRunner()
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        _ = (
            pipeline
            | "Verify" >> VerifyShards(text, deep=deep)
            | "Write" >> beam.Map(_write_report, report_path)
        )
    return read_report(report_path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dataset_tools.verify.job DATASET --report URI [--deep] [Beam options]``.

    Exit status as ``verify``'s: 0 if everything holds, 1 if any check failed, 2 if the
    dataset cannot be read at all.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m dataset_tools.verify.job",
        description="Verify a dataset's shards as a Beam job (one shard per element) and write "
        "one JSON report. Other options go to Beam (--runner, the runner's own).",
    )
    parser.add_argument("dataset", help="dataset directory or URI holding dataset.json")
    parser.add_argument("--report", required=True, help="where the JSON report is written")
    parser.add_argument("--deep", action="store_true", help="also decode every image")
    args, pipeline_args = parser.parse_known_args(argv)
    try:
        report = run_verify_job(
            args.dataset, args.report, deep=args.deep, pipeline_args=pipeline_args
        )
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = len(report.failed_shards)
    for shard in report.failed_shards:
        print(f"FAIL {shard.file}: {shard.problems[0]}")
    for problem in report.problems:
        print(f"FAIL dataset: {problem}")
    print(
        f"{'OK' if report.ok else 'FAILED'}: {len(report.shards) - failed}/{len(report.shards)} "
        f"shards sound; report in {args.report}"
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
