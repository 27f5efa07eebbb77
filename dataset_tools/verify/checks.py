"""The checks ``verify`` makes: every record of a shard, and what describes the shards.

``verify`` reads every record of every shard once (``check_shard``): the shard's size and
SHA-256, every frame's CRCs, and every record's parse and fields (for adopted shards, through
``dataset_tools.foreign``). While it does, it notes each record's frame (offset, length) and key.
These functions then check, against those notes:

* each shard's index file (``<stem>.idx``): listed size and SHA-256, format, and one line per
  record with exactly the record's offset and length;
* each of a split's catalog files, its one file or each partition (``check_catalog_part``),
  once the shards it describes are read: listed size and SHA-256, schema v1, one row per
  record in shard order, with the record's shard, position, offset, length and key, and
  ``index`` 0..n-1 across the split.

Every problem names the file. The entry points that run these checks are in
``dataset_tools.verify.verification``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO, cast

import numpy as np

from catalog.index_files import check_contiguous, parse_index
from catalog.partitions import partition_of, partition_shards
from catalog.table import read_table_bytes
from dataset_tools.foreign import adopted_label_offset, parse_foreign
from dataset_tools.keys import KeyCollector
from dataset_tools.verify.report import RecordNote, ShardReport
from schemas import ImageRecord, Manifest, ShardInfo, record_from_example
from schemas.framing import FrameError, frame_length, iter_frames
from tfrecord_io.source import exists, open_binary, read_bytes

if TYPE_CHECKING:
    from tfrecord_io.random_access import DatasetFiles

__all__ = [
    "catalog_part_of",
    "catalog_part_shards",
    "check_adopted_record",
    "check_catalog_part",
    "check_index_file",
    "check_shard",
]

_HASH_CHUNK = 8 * 1024 * 1024
_MAX_ROW_PROBLEMS = 5
_FORMAT_FOR_ENCODING = {"jpeg": "JPEG", "png": "PNG", "raw": "RAW"}


# --- one shard, read once -----------------------------------------------------------------------


class _HashingReader:
    """A binary stream that hashes and counts every byte read through it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._digest.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        """Reads (and hashes) the rest of the stream."""
        while self.read(_HASH_CHUNK):
            pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class _Promises:
    """What ``dataset.json`` promises of every record a pipeline wrote, looked up once a shard."""

    label_names: tuple[str, ...]
    encoding: str
    format: str  # the records' ``image/format``
    side: int | None  # height and width of every image, for center-cropped datasets

    @classmethod
    def of(cls, manifest: Manifest) -> _Promises:
        image = manifest.image
        return cls(
            label_names=tuple(manifest.label_names),
            encoding=image.encoding,
            format=_FORMAT_FOR_ENCODING[image.encoding],
            side=image.image_size if image.crop == "center" else None,
        )


def check_shard(
    report: ShardReport,
    manifest: Manifest,
    *,
    deep: bool,
    keys: KeyCollector,
    advance: Callable[[int], Any],
    local_path: str | None = None,
    notes: list[RecordNote] | None = None,
) -> None:
    """Reads a shard once, in plain Python: its size and SHA-256, and every record's framing
    (CRCs checked in C by ``google_crc32c``), parse and fields. No tf.data pipeline is built
    per shard: that cost about 12 ms a shard, against well under 1 ms here.

    Args:
      report: the shard's report; its size, hash, record count and problems are filled in.
      manifest: the dataset's manifest, for what every record must be.
      deep: also decode every image (with TensorFlow).
      keys: collects every record's key, for the dataset's duplicate check.
      advance: called with 1 after each record (a progress bar's ``update``).
      local_path: a local copy of the shard to read instead of ``report.path``.
      notes: if given, one ``RecordNote`` per record is appended, for the index and catalog
        checks.

    Raises:
      OSError: if the shard cannot be opened or read (damage inside it is a problem instead).
    """
    with open_binary(local_path or report.path) as raw:
        stream = _HashingReader(raw)
        try:
            _check_frames(report, manifest, stream, deep=deep, keys=keys, advance=advance,
                          notes=notes)  # fmt: skip
        finally:
            stream.drain()
    report.num_bytes, report.sha256 = stream.size, stream.hexdigest()


def _check_frames(
    report: ShardReport,
    manifest: Manifest,
    stream: _HashingReader,
    *,
    deep: bool,
    keys: KeyCollector,
    advance: Callable[[int], Any],
    notes: list[RecordNote] | None,
) -> None:
    promises = _Promises.of(manifest)
    shard_number = keys.add_shard(report.file)
    label_offset = adopted_label_offset(manifest)
    count = 0
    offset = 0
    frames = iter_frames(cast(BinaryIO, stream), name=report.file)
    while True:
        try:
            serialized = next(frames).payload
        except StopIteration:
            break
        except FrameError as e:
            detail = str(e).removeprefix(f"{report.file}: ")
            report.add(
                f"record {count} is damaged ({detail}: a CRC mismatch or a truncated file); "
                f"the {count} records before it are intact"
            )
            break
        where = f"record {count}"
        count += 1
        advance(1)
        if label_offset is not None:  # adopted shards: TensorFlow's keys, not ours
            key, issues = check_adopted_record(serialized, manifest, label_offset, where)
            for issue in issues:
                report.add(issue)
        else:
            key = _check_record(report, serialized, promises, where, deep=deep)
            if key is not None:
                keys.add(shard_number, count - 1, key)
        if notes is not None:
            notes.append(RecordNote(offset, frame_length(len(serialized)), key))
        offset += frame_length(len(serialized))  # records are contiguous: the index's offsets
    report.num_records = count
    if count != report.expected_examples:
        report.add(f"holds {count} readable records, dataset.json says {report.expected_examples}")


def _check_record(
    report: ShardReport, serialized: bytes, promises: _Promises, where: str, *, deep: bool
) -> str | None:
    """Checks one record the pipeline wrote against the schema and ``dataset.json``.

    Returns:
      The record's key, or None if it does not parse.
    """
    try:
        record = record_from_example(serialized)
    except ValueError as e:
        report.add(f"{where}: does not parse against the schema: {e}")
        return None
    names = promises.label_names
    if record.label >= len(names):
        report.add(f"{where}: label {record.label} >= number of classes {len(names)}")
    elif record.text != names[record.label]:
        report.add(
            f"{where}: class text {record.text!r} != label_names[{record.label}] "
            f"{names[record.label]!r}"
        )
    if record.format != promises.format:
        report.add(
            f"{where}: format {record.format} but the dataset's encoding is {promises.encoding}"
        )
    side = promises.side
    if side is not None and (record.height, record.width) != (side, side):
        report.add(
            f"{where}: image is {record.height}x{record.width}, the dataset promises {side}x{side}"
        )
    if deep and (problem := _decode_check(record)) is not None:
        report.add(f"{where}: {problem}")
    return record.sha256


def _tf_error_text(message: str) -> str:
    """TensorFlow's error text without its op wrapping: ``corrupted record at 7647``."""
    text = message.splitlines()[0] if message else ""
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", text).strip() or "unreadable"


def _decode_check(record: ImageRecord) -> str | None:
    """Decodes one image fully; returns a problem or None."""
    import tensorflow as tf  # only ``--deep`` decodes images; every other check is plain Python

    if record.format == "RAW":
        return None  # its byte length against height*width*channels is checked by the schema
    try:
        image = tf.io.decode_image(record.encoded, channels=0, expand_animations=False)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
        return f"{record.format} image does not decode: {_tf_error_text(e.message)}"
    shape = tuple(int(d) for d in image.shape)
    if shape != (record.height, record.width, record.channels):
        return (
            f"decoded image is {shape[0]}x{shape[1]}x{shape[2]}, but the record says "
            f"{record.height}x{record.width}x{record.channels}"
        )
    return None


# --- what describes the shards -------------------------------------------------------------------


def check_adopted_record(
    serialized: bytes, manifest: Manifest, label_offset: int, where: str
) -> tuple[str | None, list[str]]:
    """Checks one record of adopted shards: an Example with ``image/encoded`` and a label that
    names a class. Returns its key (None if it does not parse) and its problems."""
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
    if not exists(path):
        return f"{relative} is missing ({path} does not exist; dataset.json lists it)"
    data = read_bytes(path)
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


def catalog_part_shards(parts: int, part: int, num_shards: int) -> range:
    """The positions of the shards catalog file ``part`` of ``parts`` describes (all of them
    for a single file; ``catalog.partitions.partition_shards`` for partitions). A split that
    lists more partitions than shards is damaged (``check_catalog_part`` reports it): its
    shards are all given to partition 0."""
    if parts == 1 or parts > num_shards:
        return range(num_shards) if part == 0 else range(0)
    return partition_shards(part, parts, num_shards)


def catalog_part_of(parts: int, position: int, num_shards: int) -> int:
    """Which of a split's ``parts`` catalog files describes the shard at ``position``."""
    if parts <= 1 or parts > num_shards:
        return 0
    return partition_of(position, parts, num_shards)


def check_catalog_part(
    files: DatasetFiles,
    split: str,
    partition: int,
    shards: Sequence[tuple[ShardInfo, Sequence[RecordNote] | None]],
    *,
    first_index: int,
) -> list[str]:
    """Checks one of a split's catalog files (the single file is partition 0 of 1) against
    the records seen in the shards it describes (``catalog_part_shards``).

    Args:
      files, split: the dataset and split.
      partition: which of the split's ``catalog_files``.
      shards: the shards it describes, in order, each with the records seen (or None).
      first_index: the split-wide index of its first row (the rows of earlier partitions).

    Returns:
      Problems, each naming the catalog file; empty if it holds.
    """
    split_info = files.manifest.split(split)
    listed = split_info.catalog_files
    if not listed:
        return []
    info = listed[partition]
    if len(listed) > 1 and len(listed) > split_info.num_shards:
        return (
            []
            if partition
            else [
                f"catalog of {split!r}: {len(listed)} partitions listed for "
                f"{split_info.num_shards} shards"
            ]
        )
    data = _listed_bytes(files, info.file, info.num_bytes, info.sha256)
    if isinstance(data, str):
        return [f"catalog {data}"]
    name = f"catalog {info.file}"
    try:
        table = read_table_bytes(data, name=name)
    except ValueError as e:
        return [str(e)]
    return _check_catalog_rows(files, split, name, table, shards, first_index)


def _check_catalog_rows(
    files: DatasetFiles,
    split: str,
    name: str,
    table: Any,
    shards: Sequence[tuple[ShardInfo, Sequence[RecordNote] | None]],
    first_index: int,
) -> list[str]:
    expected_rows = sum(s.num_examples for s, _ in shards)
    if table.num_rows != expected_rows:
        return [f"{name}: {table.num_rows} rows, its shards hold {expected_rows} examples"]
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
            if columns["index"][row] != first_index + row:
                problem(row, f"index {columns['index'][row]}, expected {first_index + row}")
            if columns["split"][row] != split:
                problem(row, f"split {columns['split'][row]!r}, expected {split!r}")
            label = labels[row]
            if label is not None and not 0 <= label < len(files.manifest.label_names):
                problem(row, f"label {label} names no class")
            row += 1
    return problems
