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
import posixpath
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from dataset_tools.foreign import adopted_label_offset, parse_foreign
from dataset_tools.keys import KeyCollector
from dataset_tools.verify.checks import (
    check_adopted_record,
    check_catalog,
    check_index_file,
    check_shard,
)
from dataset_tools.verify.report import RecordNote, ShardReport, VerifyReport
from schemas import Manifest, record_from_example
from schemas.framing import FrameError, iter_frames, parse_frame
from tfrecord_io.random_access import dataset_files, locate, read_range
from tfrecord_io.source import (
    exists,
    is_remote,
    join,
    load_manifest,
    local_copy,
    manifest_path,
    open_binary,
    resolve_source,
)

__all__ = ["shard_reports", "verify_dataset", "verify_foreign", "verify_keys", "verify_shard"]

# What each shard's records were (frame and key), by shard file; None for a shard not read whole.
_Notes: TypeAlias = dict[str, list[RecordNote] | None]


def verify_dataset(
    source: str | os.PathLike[str], *, deep: bool = False, progress: bool = False
) -> VerifyReport:
    """Verifies every shard of a dataset against its ``dataset.json``.

    Index files and catalogs listed in ``dataset.json`` are checked too: present, as listed
    (size and SHA-256), and saying of every record what the shard holds (offset, length, key,
    position). A problem with an index file is reported on its shard, one with a catalog on the
    dataset; both name the file.

    Args:
      source: a dataset root or its ``dataset.json``; or a glob of foreign shards, which are
        only checked for CRCs, parsing and record counts (``report.manifest_found`` False).
      deep: also decode every image.
      progress: show a tqdm progress bar (over records) on stderr.

    Returns:
      The report; ``report.ok`` is True only if every check held.

    Raises:
      FileNotFoundError: if the source is a directory without ``dataset.json``, or nothing
        matches it.
      ValueError: if ``dataset.json`` is not a valid manifest.
    """
    text = os.fspath(source)
    manifest = load_manifest(text)
    if manifest is None:
        # A glob (or file) of foreign shards: what can be checked without a manifest.
        return verify_foreign(text, progress=progress)
    reports = shard_reports(text, manifest)
    # Every key's 128-bit fingerprint and place, 24 bytes an example (dataset_tools.keys).
    keys = KeyCollector()
    notes = _read_shards(reports, manifest, deep=deep, keys=keys, progress=progress)
    problems = keys.duplicates()
    problems += _check_descriptions(text, manifest, reports, notes)
    return VerifyReport(text, deep, reports, problems)


def shard_reports(source: str, manifest: Manifest) -> list[ShardReport]:
    """An empty report for every shard ``dataset.json`` lists, splits in name order: the
    shards ``verify`` checks, in the order it reports them."""
    reports: list[ShardReport] = []
    path = manifest_path(source)
    here = (posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)) if path else ""
    # Adopted shards may stay where they are, apart from dataset.json (``shard_root``).
    root = manifest.shard_root or here or "."
    for split in sorted(manifest.splits):
        for info in manifest.split(split).shards:
            reports.append(
                ShardReport(
                    split=split,
                    file=info.file,
                    path=join(root, info.file),
                    expected_examples=info.num_examples,
                    expected_bytes=info.num_bytes,
                    expected_sha256=info.sha256,
                )
            )
    return reports


def _read_shards(
    reports: Sequence[ShardReport],
    manifest: Manifest,
    *,
    deep: bool,
    keys: KeyCollector,
    progress: bool,
) -> _Notes:
    """Reads and checks every shard once (``check_shard``), filling in its report.

    Returns:
      What each shard's records were, for its index file and catalog rows.
    """
    from tqdm import tqdm

    notes: _Notes = {r.file: None for r in reports}
    total = sum(r.expected_examples for r in reports)
    with tqdm(total=total, unit="rec", disable=not progress, desc="verify") as bar:
        for report in reports:
            bar.set_postfix_str(report.file, refresh=False)
            before = bar.n
            notes[report.file] = verify_shard(
                report, manifest, deep=deep, keys=keys, advance=bar.update
            )
            # Keep the bar's total meaningful when a shard is short.
            bar.update(max(0, report.expected_examples - (bar.n - before)))
    return notes


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


def _check_descriptions(
    source: str, manifest: Manifest, reports: Sequence[ShardReport], notes: _Notes
) -> list[str]:
    """Checks the index files (problems go on their shard's report) and the catalogs.

    Returns:
      The catalogs' problems, which are the dataset's.
    """
    files = dataset_files(source)
    problems: list[str] = []
    for split in sorted(manifest.splits):
        shards = manifest.split(split).shards
        by_file = {r.file: r for r in reports if r.split == split}
        for info in shards:
            for problem in check_index_file(files, info, notes[info.file]):
                by_file[info.file].add(problem)
        problems += check_catalog(files, split, [(s, notes[s.file]) for s in shards])
    return problems


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
