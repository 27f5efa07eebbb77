"""Verification of what describes the shards: index files, catalogs, adopted and foreign shards.

``verify`` reads every record of every shard once; while it does, it notes each record's frame
(offset, length) and key. These functions then check, against those notes:

* each shard's index file (``<stem>.idx``): listed size and SHA-256, format, and one line per
  record with exactly the record's offset and length;
* each split's catalog: listed size and SHA-256, schema v1, one row per record in shard order,
  with the record's shard, position, offset, length and key, and ``index`` 0..n-1.

Every problem names the file. Also here: the per-record check for adopted shards (TensorFlow's
keys, not ours), ``verify_foreign`` for a glob without ``dataset.json``, and ``verify_keys``
(``verify --key``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from catalog.index_files import check_contiguous, parse_index
from catalog.table import read_table_bytes
from schemas import Manifest, ShardInfo
from tfrecord_io import source as _source

if TYPE_CHECKING:
    from dataset_tools.verify.verification import VerifyReport
    from tfrecord_io.random_access import DatasetFiles

__all__ = [
    "RecordNote",
    "adopted_label_offset",
    "check_adopted_record",
    "check_index_file",
    "check_catalog",
    "verify_foreign",
    "verify_keys",
]

_MAX_ROW_PROBLEMS = 5


class RecordNote(NamedTuple):
    """What verification saw of one record: its frame and its key (None if it did not parse)."""

    offset: int
    length: int
    key: str | None


def adopted_label_offset(manifest: Manifest) -> int | None:
    """The label offset of an adopted dataset, or None for one written by the pipeline."""
    adopted = manifest.options.get("adopted")
    return int(adopted.get("label_offset", 0)) if isinstance(adopted, dict) else None


def check_adopted_record(
    serialized: bytes, manifest: Manifest, label_offset: int, where: str
) -> tuple[str | None, list[str]]:
    """Checks one record of adopted shards: an Example with ``image/encoded`` and a label that
    names a class. Returns its key (None if it does not parse) and its problems."""
    from dataset_tools.adopt import parse_foreign

    try:
        record = parse_foreign(serialized, label_offset=label_offset, where=where)
    except ValueError as e:
        return None, [str(e)]
    problems = []
    if record.label is not None and record.label >= len(manifest.label_names):
        problems.append(
            f"{where}: label {record.label} >= number of classes {len(manifest.label_names)}"
        )
    return record.key, problems


def _listed_bytes(files: DatasetFiles, relative: str, num_bytes: int, sha256: str) -> bytes | str:
    """The file's bytes if present and as listed, else the problem (a string)."""
    path = files.path(relative)
    if not _source.exists(path):
        return f"{relative} is missing ({path} does not exist; dataset.json lists it)"
    data = _source.read_bytes(path)
    digest = hashlib.sha256(data).hexdigest()
    if (len(data), digest) != (num_bytes, sha256):
        return (
            f"{relative} is damaged: {len(data)} bytes with SHA-256 {digest[:16]}…, dataset.json "
            f"lists {num_bytes} bytes with {sha256[:16]}…"
        )
    return data


def check_index_file(
    files: DatasetFiles, shard: ShardInfo, notes: Sequence[RecordNote] | None
) -> list[str]:
    """Checks a shard's index file against the manifest and the records seen (if read whole).

    Returns:
      Problems, each naming the index file; empty if it holds.
    """
    if shard.index is None:
        return []
    data = _listed_bytes(files, shard.index.file, shard.index.num_bytes, shard.index.sha256)
    if isinstance(data, str):
        return [f"index file {data}"]
    name = f"index file {shard.index.file}"
    try:
        entries = parse_index(data, name=name)
        check_contiguous(entries, shard.num_bytes, name=name)
    except ValueError as e:
        return [str(e)]
    if len(entries) != shard.num_examples:
        return [f"{name}: {len(entries)} lines, the shard holds {shard.num_examples} records"]
    if notes is None:
        return []
    seen = np.array([(n.offset, n.length) for n in notes], dtype=np.int64).reshape(-1, 2)
    if len(seen) != len(entries):
        return []  # the shard itself is short: reported on the shard
    wrong = np.nonzero((seen != entries).any(axis=1))[0]
    return [
        f"{name}: line {i + 1} says offset {entries[i][0]} length {entries[i][1]}, the record is "
        f"at {seen[i][0]} with length {seen[i][1]}"
        for i in wrong[:_MAX_ROW_PROBLEMS]
    ]


def check_catalog(
    files: DatasetFiles,
    split: str,
    shards: Sequence[tuple[ShardInfo, Sequence[RecordNote] | None]],
) -> list[str]:
    """Checks a split's catalog against the manifest and the records seen in its shards.

    Args:
      files: the dataset.
      split: the split.
      shards: the split's shards in order, each with the records verification saw in it (None
        if the shard could not be read whole; its rows are then only counted).

    Returns:
      Problems, each naming the catalog; empty if it holds.
    """
    info = files.manifest.split(split).catalog
    if info is None:
        return []
    data = _listed_bytes(files, info.file, info.num_bytes, info.sha256)
    if isinstance(data, str):
        return [f"catalog {data}"]
    name = f"catalog {info.file}"
    try:
        table = read_table_bytes(data, name=name)
    except ValueError as e:
        return [str(e)]
    expected_rows = sum(s.num_examples for s, _ in shards)
    if table.num_rows != expected_rows:
        return [f"{name}: {table.num_rows} rows, the split holds {expected_rows} examples"]
    problems: list[str] = []
    columns: dict[str, Any] = {
        c: table.column(c).to_pylist() for c in ("key", "split", "index", "shard", "record")
    }
    offsets = table.column("offset").to_numpy()
    lengths = table.column("length").to_numpy()
    labels = table.column("label").to_pylist()

    def problem(row: int, text: str) -> None:
        if len(problems) < _MAX_ROW_PROBLEMS:
            problems.append(
                f"{name}: row {row} ({columns['shard'][row]} record "
                f"{columns['record'][row]}): {text}"
            )

    row = 0
    for shard, notes in shards:
        for position in range(shard.num_examples):
            if columns["shard"][row] != shard.file or columns["record"][row] != position:
                problem(row, f"expected {shard.file} record {position} (rows are in shard order)")
            elif notes is not None and position < len(notes):
                note = notes[position]
                if (offsets[row], lengths[row]) != (note.offset, note.length):
                    problem(
                        row,
                        f"offset {offsets[row]} length {lengths[row]}, the record is at "
                        f"{note.offset} with length {note.length}",
                    )
                if note.key is not None and columns["key"][row] != note.key:
                    problem(row, f"key {columns['key'][row]}, the record's key is {note.key}")
            if columns["index"][row] != row:
                problem(row, f"index {columns['index'][row]}, expected {row}")
            if columns["split"][row] != split:
                problem(row, f"split {columns['split'][row]!r}, expected {split!r}")
            label = labels[row]
            if label is not None and not 0 <= label < len(files.manifest.label_names):
                problem(row, f"label {label} names no class")
            row += 1
    return problems


def verify_foreign(pattern: str, *, progress: bool = False) -> VerifyReport:
    """Checks shards that have no ``dataset.json``: every frame's CRCs, every record parses as
    an Example with ``image/encoded``, and the record count of each file.

    The report's ``problems`` starts with no problem; ``report.manifest_found`` is False.

    Raises:
      FileNotFoundError: if nothing matches ``pattern``.
    """
    from tqdm import tqdm

    from dataset_tools.adopt import parse_foreign
    from dataset_tools.verify.verification import ShardReport, VerifyReport
    from schemas.framing import FrameError, iter_frames

    resolved = _source.resolve_source(pattern, "foreign")
    reports = []
    with tqdm(unit="rec", disable=not progress, desc="verify") as bar:
        for shard in resolved.shards:
            name = shard.path.rstrip("/").rsplit("/", 1)[-1]
            report = ShardReport(
                split="-", file=name, path=shard.path, expected_examples=-1,
                expected_bytes=shard.num_bytes, expected_sha256="",
            )  # fmt: skip
            report.present = True
            count = 0
            digest: list[tuple[int, str]] = []
            try:
                with _source.open_binary(shard.path) as stream:
                    for frame in iter_frames(stream, name=name, digest=digest):
                        try:
                            parse_foreign(frame.payload, where=f"record {count}")
                        except ValueError as e:
                            report.add(str(e))
                        count += 1
                        bar.update(1)
            except FrameError as e:
                report.add(f"{e}; the {count} records before it are intact")
            report.num_records = count
            if digest:
                report.num_bytes, report.sha256 = digest[0]
            reports.append(report)
    return VerifyReport(pattern, False, reports, [], manifest_found=False)


def verify_keys(dataset: str, keys: Sequence[str]) -> list[str]:
    """Reads the examples for ``keys`` by byte range and checks each one (``verify --key``).

    Returns:
      Problems, each naming the key; empty if every key was found, intact and itself.
    """
    from schemas import record_from_example
    from schemas.framing import parse_frame
    from tfrecord_io.random_access import dataset_files, locate, read_range

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
