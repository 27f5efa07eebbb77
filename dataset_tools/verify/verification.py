"""The entry points of ``verify`` (the command is ``python -m dataset_tools.verify``).

* ``verify_dataset``: every shard listed in ``dataset.json`` is present, its size and SHA-256
  match, it holds the committed number of records, and every record passes its TFRecord CRC
  checks and parses against the schema, with a label that names one of the dataset's classes
  (``deep`` also decodes every image and checks its dimensions); then the index files and
  catalogs against the records seen, and no key held twice.
* ``verify_foreign``: what can be checked of shards without ``dataset.json``.
* ``verify_keys``: single examples, found through the catalogs and read by byte range.

The checks themselves are in ``dataset_tools.verify.checks``, the reports they fill in
``dataset_tools.verify.report``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Any

from dataset_tools.foreign import adopted_label_offset, parse_foreign
from dataset_tools.keys import KeyCollector
from dataset_tools.verify.checks import (
    catalog_part_shards,
    check_adopted_record,
    check_catalog_part,
    check_index_file,
    check_shard,
)
from dataset_tools.verify.listing import ListedShards
from dataset_tools.verify.report import RecordNote, ShardReport, ShardReports, VerifyReport
from schemas import Manifest, ShardInfo, record_from_example
from schemas.framing import FrameError, iter_frames, parse_frame
from tfrecord_io.random_access import dataset_files, locate, read_range
from tfrecord_io.source import exists, load_manifest, local_copy, open_binary, resolve_source

__all__ = [
    "check_split",
    "shard_reports",
    "verify_dataset",
    "verify_foreign",
    "verify_keys",
    "verify_shard",
]


def verify_dataset(
    source: str | os.PathLike[str], *, deep: bool = False, progress: bool = False
) -> VerifyReport:
    """Verifies every shard of a dataset against its ``dataset.json``.

    Index files and catalogs listed in ``dataset.json`` are checked too: present, as listed
    (size and SHA-256), and saying of every record what the shard holds (offset, length, key,
    position). A problem with an index file is reported on its shard, one with a catalog on the
    dataset; both name the file.

    Shards are listed, read and checked one at a time, each with its index file; each catalog
    file is checked once the shards it describes have been read (a split's one file, or each
    partition in turn), so only that file's record notes are held. The report keeps the failed
    shards' reports and rebuilds the sound ones' from ``dataset.json`` (``ShardReports``).

    Args:
      source: a dataset root or its ``dataset.json``; or a glob of foreign shards, which are
        only checked for CRCs, parsing and record counts (``report.manifest_found`` False).
      deep: also decode every image.
      progress: show a tqdm progress bar (over records) on stderr.

    Returns:
      The report; ``report.ok`` is True only if every check held.

    Raises:
      FileNotFoundError: if the source is a directory without ``dataset.json``, or nothing
        matches it, or a shard table it names is missing.
      ValueError: if ``dataset.json`` or a shard table is not valid.
    """
    from tqdm import tqdm

    text = os.fspath(source)
    manifest = load_manifest(text)
    if manifest is None:
        # A glob (or file) of foreign shards: what can be checked without a manifest.
        return verify_foreign(text, progress=progress)
    listed = shard_reports(text, manifest)
    # Every key's 128-bit fingerprint and place, 24 bytes an example (dataset_tools.keys).
    keys = KeyCollector()
    catalog_problems: list[str] = []
    failed: dict[int, ShardReport] = {}
    num_records = 0
    total = sum(manifest.split(split).num_examples for split in listed.splits)
    with tqdm(total=total, unit="rec", disable=not progress, desc="verify") as bar:
        before = 0
        shards = (
            report
            for split in listed.splits
            for report in check_split(
                listed, split, deep=deep, keys=keys, advance=bar.update, problems=catalog_problems
            )
        )
        for position, report in enumerate(shards):
            num_records += report.num_records or 0
            if not report.ok:
                failed[position] = report
            # Keep the bar's total meaningful when a shard is short.
            before += report.expected_examples
            bar.update(max(0, before - bar.n))
    problems = keys.duplicates() + catalog_problems
    return VerifyReport(text, deep, ShardReports(listed, failed, num_records), problems)


def shard_reports(source: str, manifest: Manifest) -> ListedShards:
    """An empty report for every shard ``dataset.json`` lists, splits in name order: the
    shards ``verify`` checks, in the order it reports them, each built when asked for.

    Raises:
      FileNotFoundError, ValueError: if a split's shard table is missing or damaged.
    """
    return ListedShards(source, manifest)


def check_split(
    listed: ListedShards,
    split: str,
    *,
    deep: bool,
    keys: KeyCollector,
    advance: Callable[[int], Any] = lambda n: None,
    problems: list[str],
) -> Iterator[ShardReport]:
    """Checks a split's shards in order, yielding each one's report once it is read and its
    index file checked (``verify_shard``, ``check_index_file``); each catalog file is checked
    after the last shard it describes (``check_catalog_part``), its problems appended to
    ``problems``. Only the record notes of the shards of one catalog file are held.

    Args:
      listed: the dataset's listed shards.
      split: the split.
      deep: also decode every image.
      keys: collects every record's key, for the duplicate check.
      advance: called with 1 after each record.
      problems: the catalogs' problems (the dataset's) are appended here.

    Raises:
      OSError: if a shard exists but cannot be read.
    """
    files = listed.files
    info = files.manifest.split(split)
    parts = len(info.catalog_files)
    entries = listed.entries(split)
    first_index = 0
    # A split without catalogs is read as one part; catalog partitions are consecutive shards.
    for part in range(max(parts, 1)):
        count = len(catalog_part_shards(max(parts, 1), part, info.num_shards))
        seen: list[tuple[ShardInfo, list[RecordNote] | None]] = []
        for shard, report in islice(entries, count):
            notes = verify_shard(report, files.manifest, deep=deep, keys=keys, advance=advance)
            for problem in check_index_file(files, shard, notes):
                report.add(problem)
            if parts:
                seen.append((shard, notes))
            yield report
        if parts:
            problems += check_catalog_part(files, split, part, seen, first_index=first_index)
            first_index += sum(s.num_examples for s, _ in seen)


def verify_shard(
    report: ShardReport,
    manifest: Manifest,
    *,
    deep: bool,
    keys: KeyCollector,
    advance: Callable[[int], Any] = lambda n: None,
) -> list[RecordNote] | None:
    """Checks one listed shard: present, every record (``check_shard``), size and SHA-256 as
    ``dataset.json`` lists them; each failed check goes on ``report``. The unit of work of both
    the local loop and the Beam job (``dataset_tools.verify.job``).

    Args:
      report: the shard's report (``ShardReport`` with the listed values), filled in.
      manifest: the dataset's manifest.
      deep: also decode every image.
      keys: collects every record's key, for the duplicate check.
      advance: called with 1 after each record (a progress bar's ``update``).

    Returns:
      What each record was (frame and key), for the index file and catalog checks; None if
      the shard is missing.

    Raises:
      OSError: if the shard exists but cannot be read (damage inside it is a problem instead).
    """
    if not exists(report.path):
        report.add(f"missing: {report.path} does not exist")
        return None
    report.present = True
    # Object-store shards are downloaded once, to a temporary file, and read once.
    shard_notes: list[RecordNote] = []
    with local_copy(report.path) as local:
        check_shard(
            report,
            manifest,
            deep=deep,
            keys=keys,
            advance=advance,
            local_path=local,
            notes=shard_notes,
        )
    if report.num_bytes != report.expected_bytes:
        report.add(f"size {report.num_bytes} bytes, dataset.json says {report.expected_bytes}")
    if report.sha256 != report.expected_sha256:
        report.add(f"SHA-256 {report.sha256} differs from dataset.json {report.expected_sha256}")
    return shard_notes


def verify_foreign(pattern: str, *, progress: bool = False) -> VerifyReport:
    """Checks shards that have no ``dataset.json``: every frame's CRCs, every record parses as
    an Example with ``image/encoded``, and the record count of each file.

    The report's ``problems`` starts with no problem; ``report.manifest_found`` is False.

    Raises:
      FileNotFoundError: if nothing matches ``pattern``.
    """
    from tqdm import tqdm

    resolved = resolve_source(pattern, "foreign")
    reports = []
    with tqdm(unit="rec", disable=not progress, desc="verify") as bar:
        for shard in resolved.shards:
            name = shard.path.rstrip("/").rsplit("/", 1)[-1]
            report = ShardReport(
                split="-", file=name, path=shard.path, expected_examples=-1,
                expected_bytes=shard.num_bytes, expected_sha256="",
            )  # fmt: skip
            report.present = True
            _check_foreign_shard(report, advance=bar.update)
            reports.append(report)
    return VerifyReport(pattern, False, reports, [], manifest_found=False)


def _check_foreign_shard(report: ShardReport, *, advance: Callable[[int], Any]) -> None:
    """Reads one foreign shard: its frames, each record's parse, its count, size and hash."""
    count = 0
    digest: list[tuple[int, str]] = []
    try:
        with open_binary(report.path) as stream:
            for frame in iter_frames(stream, name=report.file, digest=digest):
                try:
                    parse_foreign(frame.payload, where=f"record {count}")
                except ValueError as e:
                    report.add(str(e))
                count += 1
                advance(1)
    except FrameError as e:
        report.add(f"{e}; the {count} records before it are intact")
    report.num_records = count
    if digest:
        report.num_bytes, report.sha256 = digest[0]


def verify_keys(dataset: str, keys: Sequence[str]) -> list[str]:
    """Reads the examples for ``keys`` by byte range and checks each one (``verify --key``).

    Returns:
      Problems, each naming the key; empty if every key was found, intact and itself.

    Raises:
      FileNotFoundError: if ``dataset`` has no ``dataset.json`` or a catalog it lists.
      ValueError: if ``dataset.json`` or a catalog is not valid.
    """
    files = dataset_files(dataset)
    locations = locate(files, keys)
    offset = adopted_label_offset(files.manifest)
    problems = []
    for key in keys:
        where = locations.get(key)
        if where is None:
            problems.append(f"key {key}: in no catalog of {files.root}")
            continue
        label = f"key {key} ({where.shard} record {where.record})"
        try:
            path = files.shard_path(where.shard)
            payload = parse_frame(
                read_range(path, where.offset, where.offset + where.length),
                name=path,
                offset=where.offset,
            )
        except (OSError, ValueError) as e:
            problems.append(f"{label}: {e}")
            continue
        if offset is not None:
            found, record_problems = check_adopted_record(payload, files.manifest, offset, label)
            problems.extend(record_problems)
        else:
            try:
                found = record_from_example(payload).sha256
            except ValueError as e:
                problems.append(f"{label}: does not parse against the schema: {e}")
                continue
        if found is not None and found != key:
            problems.append(f"{label}: the record there has key {found}")
    return problems
