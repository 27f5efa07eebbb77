"""Deterministic splits and shards, and the writer that commits each shard as one unit.

Everything about placement is a function of the example's content hash (the SHA-256 of the
source bytes): its split, its shard, and its position inside the shard. Two runs over the same
input therefore write byte-identical shards on any runner, whatever order workers see the data.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from beam_pipelines.elements import Duplicate, PreparedRecord, ShardResult, StagedRecord
from beam_pipelines.engines.filesystems import create_empty_file, write_object
from beam_pipelines.output.catalog_io import write_index_and_fragment
from beam_pipelines.output.done_records import keys_digest, write_done_record
from beam_pipelines.output.staging import (
    DEFAULT_READ_AHEAD_BYTES,
    StagedRecordReader,
    is_local,
    pack_locations,
    unpack_locations,
)
from objstore import temporary_path
from schemas.constants import MAX_SHARDS, TRAIN, VALIDATION
from schemas.framing import write_frame
from schemas.manifest import shard_filename

__all__ = [
    "TRAIN",
    "VALIDATION",
    "METRICS_NAMESPACE",
    "DUPLICATES_TAG",
    "LABEL_CONFLICT_POLICIES",
    "assign_split",
    "assign_shard",
    "fixed_shard_counts",
    "label_counts",
    "upscaled_count",
    "dedupe_sorted",
    "write_shard_file",
    "write_frames",
    "WriteShardFn",
    "WriteShards",
]

METRICS_NAMESPACE = "images_to_tfrecord"
DUPLICATES_TAG = "duplicates"
# What happens to byte-identical inputs under different classes (--label_conflicts).
LABEL_CONFLICT_POLICIES = ("keep_first", "drop_both", "fail")
# Locations per packed element of the group-by-shard (a few tens of KB once packed).
PACK_SIZE = 1000
# Locations the shard assignment holds at once, over all shards, before it packs them all.
# A bundle of the in-process runner is every record of the build: held by the PACK_SIZE per
# shard, they would be about 1 KB each, up to PACK_SIZE times the shard count (5 GB at
# 10 M images), so past this many each shard's pack is smaller instead.
MAX_HELD_LOCATIONS = 50_000


def _fraction(hex_digits: str) -> float:
    return int(hex_digits, 16) / float(1 << (4 * len(hex_digits)))


def assign_split(sha256: str, validation_fraction: float) -> str:
    """Puts an example in ``train`` or ``validation`` from bits 64-127 of its content hash.

    These bits are independent of the ones ``assign_shard`` uses, so validation examples are
    spread over the whole hash range and every shard of a split is equally likely to hold any
    example.
    """
    if validation_fraction > 0 and _fraction(sha256[16:32]) < validation_fraction:
        return VALIDATION
    return TRAIN


def assign_shard(sha256: str, num_shards: int) -> int:
    """Range-partitions the hash space: shard ``i`` holds hashes in ``[i/n, (i+1)/n)``.

    With records sorted by hash inside each shard, the whole split is in hash order, which
    mixes classes evenly across and within shards.
    """
    return (int(sha256[:16], 16) * num_shards) >> 64


def fixed_shard_counts(num_shards: int, validation_fraction: float) -> dict[str, int]:
    """Each split's shard count from ``--num_shards``, known before any record exists.

    ``train`` gets ``num_shards``; ``validation`` (when ``validation_fraction`` > 0) gets
    ``ceil(num_shards * f / (1 - f))``, the count that gives its shards the size of train's.
    Knowing the counts up front lets records go from the image step straight to the group-by-
    shard: no step has to wait for all records to be prepared before any can be placed.
    """
    if not 1 <= num_shards <= MAX_SHARDS:
        raise ValueError(f"num_shards must be in [1, {MAX_SHARDS}], got {num_shards!r}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    counts = {TRAIN: num_shards}
    if validation_fraction > 0:
        wanted = math.ceil(num_shards * validation_fraction / (1.0 - validation_fraction))
        counts[VALIDATION] = min(wanted, MAX_SHARDS)
    return counts


def _class_name(record: PreparedRecord | StagedRecord) -> str | None:
    return record.meta.text if record.meta is not None else None


def label_counts(records: Iterable[PreparedRecord | StagedRecord]) -> tuple[tuple[int, int], ...]:
    """``(label, examples)`` pairs in label order; empty if any record carries no class."""
    counts: dict[int, int] = {}
    for record in records:
        if record.meta is None:
            return ()
        counts[record.meta.label] = counts.get(record.meta.label, 0) + 1
    return tuple(sorted(counts.items()))


def upscaled_count(records: Iterable[PreparedRecord | StagedRecord]) -> int:
    """How many records are stored larger than their source (shorter side against shorter
    side, as ``prepare_image`` counts it). Counted from the records a shard holds, so a resumed
    build and a ``--base`` build (reused examples carry their catalog row) count them too."""
    count = 0
    for record in records:
        meta = record.meta
        if meta is None or meta.source_height is None or meta.source_width is None:
            continue  # not known: a base made before the catalog held source sizes
        count += min(meta.height, meta.width) > min(meta.source_height, meta.source_width)
    return count


# Records the writer sorts and dedupes: prepared in memory (tests) or staged locations.
_R = TypeVar("_R", PreparedRecord, StagedRecord)


def dedupe_sorted(
    records: Iterable[_R], *, label_conflicts: str = "keep_first"
) -> tuple[list[_R], list[Duplicate]]:
    """Sorts records by ``(sha256, uri)`` and keeps the first of each run of equal hashes.

    Copies found under different classes are a label conflict, flagged in their ``Duplicate``.
    ``label_conflicts`` says what is written then: ``keep_first`` (and ``fail``, which the
    launcher turns into a refusal to publish) keeps the first copy, as for any duplicate;
    ``drop_both`` keeps none.

    Returns:
      ``(kept, duplicates)``: the records to write, in write order, and the dropped ones, each
      naming the URI that was kept instead (the first in URI order), or None under
      ``drop_both``.

    Raises:
      ValueError: for a ``label_conflicts`` not in ``LABEL_CONFLICT_POLICIES``.
    """
    if label_conflicts not in LABEL_CONFLICT_POLICIES:
        raise ValueError(
            f"label_conflicts must be one of {LABEL_CONFLICT_POLICIES}, got {label_conflicts!r}"
        )
    kept: list[_R] = []
    duplicates: list[Duplicate] = []
    ordered = sorted(records, key=lambda r: (r.sha256, r.uri))
    for sha256, run in itertools.groupby(ordered, key=lambda r: r.sha256):
        first, *copies = run
        label = _class_name(first)
        if label_conflicts == "drop_both" and any(_class_name(c) != label for c in copies):
            duplicates.extend(
                Duplicate(r.uri, None, sha256, _class_name(r), None, True) for r in (first, *copies)
            )
            continue
        kept.append(first)
        duplicates.extend(
            Duplicate(c.uri, first.uri, sha256, _class_name(c), label, _class_name(c) != label)
            for c in copies
        )
    return kept, duplicates


def write_shard_file(payloads: Iterable[bytes], local_path: str) -> list[tuple[int, int]]:
    """Writes records to a local TFRecord file, in order; returns each one's place in it.

    Uses Beam's own TFRecord framing (length, masked CRC-32C, data, masked CRC-32C): the bytes
    ``tf.io.TFRecordWriter`` writes, without importing TensorFlow in every worker.

    Returns:
      ``(offset, length)`` per record: where its frame starts and its whole frame's size, the
      rows of the shard's index file (``catalog.index_files``), counted while writing.
    """
    entries: list[tuple[int, int]] = []
    offset = 0
    with open(local_path, "wb") as shard:
        for payload in payloads:
            length = write_frame(shard, payload)
            entries.append((offset, length))
            offset += length
    return entries


def write_frames(
    frames: Iterable[bytes], destination: str
) -> tuple[list[tuple[int, int]], int, str]:
    """Writes already framed TFRecord records, in order, as the file ``destination``.

    The frames are written as they come (one at a time in memory), hashed on the way. A local
    destination is written in place under a temporary name, then renamed; any other goes to a
    local temporary file first, then up in one write (``object_store_io.write_object``).

    Returns:
      ``(entries, num_bytes, sha256 hex)``: each record's ``(offset, length)`` (the rows of the
      shard's index file), and the file's size and hash.
    """
    entries: list[tuple[int, int]] = []
    digest = hashlib.sha256()
    offset = 0
    directory, name = FileSystems.split(destination)
    local = is_local(destination)
    if local:
        os.makedirs(directory, exist_ok=True)
        path = temporary_path(os.path.join(directory, name))
    else:
        fd, path = tempfile.mkstemp(suffix=".tfrecord")
        os.close(fd)
    try:
        with open(path, "wb") as shard:
            for frame in frames:
                shard.write(frame)
                digest.update(frame)
                entries.append((offset, len(frame)))
                offset += len(frame)
        if local:
            os.replace(path, destination)
        elif offset == 0:
            create_empty_file(destination)  # an empty shard; Beam's S3 writer cannot make one
        else:
            write_object(destination, local_path=path)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return entries, offset, digest.hexdigest()


class WriteShardFn(beam.DoFn):
    """``((split, index, count), [bytes | StagedRecord]) -> ShardResult`` (+ duplicates).

    The values are packed locations (``staging.pack_locations``) or single ``StagedRecord``.

    Sorts the shard's locations by key and drops duplicates, then streams their frames from the
    staging area into the shard (memory: the locations and one read-ahead window). After the
    shard is committed come its index file and catalog fragment (``catalog_io``), then its done
    record (``resume``), in that order. An empty list writes an empty shard, so a planned shard
    that received no records still exists and its name is never missing from the set.

    Side input ``done`` (optional): ``(split, index)`` of the shards a resumed build found
    complete (``_shard_name``); their groups are skipped.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        label_conflicts: str = "keep_first",
        read_ahead_bytes: int = DEFAULT_READ_AHEAD_BYTES,
    ) -> None:
        self._output_dir = output_dir
        self._label_conflicts = label_conflicts
        self._read_ahead = read_ahead_bytes
        self._reader: StagedRecordReader | None = None
        self._done: tuple[Iterable[tuple[str, int]], set[tuple[str, int]]] | None = None
        self._shards = Metrics.counter(METRICS_NAMESPACE, "shards_written")
        self._written = Metrics.counter(METRICS_NAMESPACE, "images_written")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")
        self._duplicates = Metrics.counter(METRICS_NAMESPACE, "duplicates")

    def setup(self) -> None:
        self._reader = StagedRecordReader(self._output_dir, read_ahead_bytes=self._read_ahead)

    def teardown(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _is_done(self, split: str, index: int, done: Iterable[tuple[str, int]]) -> bool:
        if self._done is None or self._done[0] is not done:
            self._done = (done, {(name, number) for name, number in done})
        return (split, index) in self._done[1]

    def process(self, element, done: Iterable[tuple[str, int]] = ()):
        (split, index, count), values = element
        # A shard complete in an earlier attempt, and checked (resume.VerifyDoneShards), stays.
        if not self._is_done(split, index, done):
            yield from self._write(split, index, count, values)

    def _write(self, split: str, index: int, count: int, values: Iterable[StagedRecord]):
        if self._reader is None:
            self.setup()
        assert self._reader is not None
        records, duplicates = dedupe_sorted(
            _unpacked(values), label_conflicts=self._label_conflicts
        )
        name = shard_filename(split, index, count)
        entries, num_bytes, digest = write_frames(
            self._reader.frames(records), FileSystems.join(self._output_dir, name)
        )
        # After the shard is committed: its index file, then its catalog rows.
        index_bytes, index_sha256 = write_index_and_fragment(
            self._output_dir, split, name, records, entries
        )
        result = ShardResult(
            split,
            index,
            count,
            name,
            len(records),
            num_bytes,
            digest,
            index_bytes,
            index_sha256,
            label_counts(records),
            upscaled_count(records),
        )
        # Last: what --resume trusts once it has checked the shard against it.
        write_done_record(self._output_dir, result, duplicates, keys_digest(records))
        self._shards.inc()
        self._written.inc(len(records))
        self._bytes.inc(num_bytes)
        self._duplicates.inc(len(duplicates))
        for duplicate in duplicates:
            yield beam.pvalue.TaggedOutput(DUPLICATES_TAG, duplicate)
        yield result


class WriteShards(beam.PTransform):
    """``(split, StagedRecord) -> {"shards": ShardResult, "duplicates": Duplicate}``.

    Assigns every record to a shard by content hash, groups the small locations by shard and
    writes each shard from the staging area. ``shards`` has one element per shard of every
    split that received records, ``duplicates`` one per input dropped as a byte-identical copy
    (``label_conflicts`` as in ``dedupe_sorted``).

    Shard counts are known before any record is placed (``plan`` module): either
    ``shard_counts`` (``{split: count}``, e.g. from ``fixed_shard_counts``) or ``plan``, a
    one-element PCollection of such a dict (``plan.PlanShards``, which counts the listing).

    Args:
      output_dir: the dataset directory; its staging area holds the records.
      shard_counts: fixed counts, or None to take ``plan``.
      plan: the counts as a one-element PCollection, or None to take ``shard_counts``.
      done: for a resumed build, ``{"shards": ShardResult, "duplicates": Duplicate}``
        PCollections of the shards found complete (``resume.VerifyDoneShards``): not written
        again, and passed through with their duplicates.
      label_conflicts: as in ``dedupe_sorted``.

    Raises:
      ValueError: unless exactly one of ``shard_counts`` and ``plan`` is given, and (while
        running) for a record of a split the counts do not name.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        shard_counts: Mapping[str, int] | None = None,
        plan=None,
        done=None,
        label_conflicts: str = "keep_first",
    ) -> None:
        super().__init__()
        if (shard_counts is None) == (plan is None):
            raise ValueError(
                "WriteShards needs exactly one of shard_counts and plan, got "
                f"shard_counts={shard_counts!r}, plan={plan!r}"
            )
        if shard_counts is not None and not all(
            isinstance(n, int) and n >= 1 for n in shard_counts.values()
        ):
            raise ValueError(f"shard_counts must map splits to counts >= 1, got {shard_counts!r}")
        self._output_dir = output_dir
        self._counts = dict(shard_counts) if shard_counts is not None else None
        self._plan = plan
        self._done = done
        self._label_conflicts = label_conflicts

    def expand(self, records):
        pipeline = records.pipeline
        if self._counts is not None:
            plan = pipeline | "FixedShardCounts" >> beam.Create([self._counts])
        else:
            plan = self._plan
        # plan: {split: num_shards}, one element
        if self._done is not None:
            done, done_duplicates = self._done["shards"], self._done[DUPLICATES_TAG]
        else:
            done = pipeline | "NoneDone" >> beam.Create([])
            done_duplicates = pipeline | "NoDoneDuplicates" >> beam.Create([])
        # (split, index) of the shards done before: what the side inputs below need of them
        done_names = done | "DoneNames" >> _shard_names()
        packed = records | "AssignShard" >> beam.ParDo(
            _AssignAndPackFn(), beam.pvalue.AsSingleton(plan)
        )
        # ((split, index, count), bytes): up to PACK_SIZE locations of one shard, packed (fewer
        # when MAX_HELD_LOCATIONS are held)
        written = (
            packed
            | "GroupByShard" >> beam.GroupByKey()
            # ((split, index, count), [bytes]): locations only, never the examples' bytes
            | "WriteShard"
            >> beam.ParDo(
                WriteShardFn(self._output_dir, label_conflicts=self._label_conflicts),
                done=beam.pvalue.AsList(done_names),
            ).with_outputs(DUPLICATES_TAG, main="shards")
        )
        written_names = written.shards | "WrittenNames" >> _shard_names()
        finished = (written_names, done_names) | "Finished" >> beam.Flatten()
        # A shard whose hash range caught no record is written empty, after the others.
        empty = (
            plan
            | "EmptyShards" >> beam.FlatMap(_empty_shards, beam.pvalue.AsList(finished))
            # ((split, index, count), [])
            | "WriteEmptyShard" >> beam.ParDo(WriteShardFn(self._output_dir))
        )
        shards = (written.shards, empty, done) | "AllShards" >> beam.Flatten()
        duplicates = (written[DUPLICATES_TAG], done_duplicates) | "AllDuplicates" >> beam.Flatten()
        return {"shards": shards, DUPLICATES_TAG: duplicates}


class _AssignAndPackFn(beam.DoFn):
    """``(split, StagedRecord) -> ((split, index, count), bytes)``: each location goes to its
    shard (``assign_shard``, side input ``plan``), packed by the ``PACK_SIZE`` per shard
    (``staging.pack_locations``), so the shuffle holds few, compact elements. Whenever
    ``max_held`` locations wait over all shards, every shard's are packed as they are: what
    this step holds stays bounded however many shards a bundle reaches."""

    def __init__(self, max_held: int | None = None) -> None:
        self._max_held = MAX_HELD_LOCATIONS if max_held is None else max_held

    def start_bundle(self) -> None:
        self._buffers: dict[tuple[str, int, int], list[StagedRecord]] = {}
        self._held = 0

    def _pack_all(self) -> list[tuple[tuple[str, int, int], bytes]]:
        buffers, self._buffers, self._held = self._buffers, {}, 0
        return [(shard, pack_locations(buffer)) for shard, buffer in sorted(buffers.items())]

    def process(self, element, plan):
        shard, record = _keyed_by_shard(element, plan)
        buffer = self._buffers.setdefault(shard, [])
        buffer.append(record)
        self._held += 1
        if len(buffer) >= PACK_SIZE:
            del self._buffers[shard]
            self._held -= len(buffer)
            yield shard, pack_locations(buffer)
        elif self._held >= self._max_held:
            yield from self._pack_all()

    def finish_bundle(self):
        for packed in self._pack_all():
            yield GlobalWindows.windowed_value(packed)


def _unpacked(values: Iterable[bytes | StagedRecord]) -> Iterator[StagedRecord]:
    for value in values:
        if isinstance(value, bytes):
            yield from unpack_locations(value)
        else:
            yield value


def _shard_name(shard: ShardResult) -> tuple[str, int]:
    """What a side input of every shard needs of one: its split and index. A whole
    ``ShardResult`` carries its label counts (74 KB decoded, at 1,000 classes), so a list of
    them grew with the dataset in every worker that read it (0.4 GB at 10 M images)."""
    return shard.split, shard.index


def _shard_names() -> beam.PTransform:
    return beam.Map(_shard_name).with_output_types(tuple[str, int])


def _empty_shards(counts: Mapping[str, int], written: Iterable[tuple[str, int]]):
    done = {(split, index) for split, index in written}
    splits_with_records = {split for split, _ in done}
    for split, count in sorted(counts.items()):
        if split not in splits_with_records:
            continue  # a split that received no record gets no shards
        for index in range(count):
            if (split, index) not in done:
                yield (split, index, count), []


def _keyed_by_shard(element, plan):
    split, record = element
    try:
        count = plan[split]
    except KeyError:
        raise ValueError(
            f"no shard count for split {split!r} (of {record.uri}); "
            f"the shard counts name only {sorted(plan)}"
        ) from None
    return (split, assign_shard(record.sha256, count), count), record
