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
import uuid
from collections.abc import Iterable, Mapping

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.tfrecordio import _TFRecordUtil
from apache_beam.metrics import Metrics

from beam_pipelines.catalog_io import write_index_and_fragment
from beam_pipelines.elements import Duplicate, PreparedRecord, ShardResult
from beam_pipelines.object_store_io import create_empty_file
from catalog.index_files import frame_length
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
    "plan_shard_counts",
    "label_counts",
    "dedupe_sorted",
    "copy_to_filesystem",
    "write_shard_file",
    "WriteShardFn",
    "WriteShards",
]

TRAIN = "train"
VALIDATION = "validation"
METRICS_NAMESPACE = "images_to_tfrecord"
DUPLICATES_TAG = "duplicates"
# What happens to byte-identical inputs under different classes (--label_conflicts).
LABEL_CONFLICT_POLICIES = ("keep_first", "drop_both", "fail")

_COPY_CHUNK = 8 * 1024 * 1024


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
    if not 1 <= num_shards <= 99999:
        raise ValueError(f"num_shards must be in [1, 99999], got {num_shards!r}")
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    counts = {TRAIN: num_shards}
    if validation_fraction > 0:
        wanted = math.ceil(num_shards * validation_fraction / (1.0 - validation_fraction))
        counts[VALIDATION] = min(wanted, 99999)
    return counts


def plan_shard_counts(
    stats: Mapping[str, tuple[int, int]], *, target_shard_bytes: int
) -> dict[str, int]:
    """Chooses each split's shard count from its ``(num_examples, num_bytes)``.

    Each split gets ``ceil(num_bytes / target_shard_bytes)``, never more than it has examples
    and at least 1; an empty split gets none.
    """
    counts: dict[str, int] = {}
    for split, (examples, size) in sorted(stats.items()):
        if examples == 0:
            counts[split] = 0
            continue
        wanted = math.ceil(size / target_shard_bytes)
        counts[split] = max(1, min(wanted, examples, 99999))
    return counts


def _class_name(record: PreparedRecord) -> str | None:
    return record.meta.text if record.meta is not None else None


def label_counts(records: Iterable[PreparedRecord]) -> tuple[tuple[int, int], ...]:
    """``(label, examples)`` pairs in label order; empty if any record carries no class."""
    counts: dict[int, int] = {}
    for record in records:
        if record.meta is None:
            return ()
        counts[record.meta.label] = counts.get(record.meta.label, 0) + 1
    return tuple(sorted(counts.items()))


def dedupe_sorted(
    records: Iterable[PreparedRecord], *, label_conflicts: str = "keep_first"
) -> tuple[list[PreparedRecord], list[Duplicate]]:
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
    kept: list[PreparedRecord] = []
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


def copy_to_filesystem(local_path: str, destination: str) -> tuple[int, str]:
    """Copies a local file to any Beam FileSystems path under a temporary name, then renames it.

    A reader listing the destination never sees a partial file under the final name.

    Returns:
      ``(num_bytes, sha256 hex)`` of the file.
    """
    directory, name = FileSystems.split(destination)
    temporary = FileSystems.join(directory, f".{name}.tmp-{uuid.uuid4().hex}")
    digest = hashlib.sha256()
    size = 0
    if os.path.getsize(local_path) == 0:
        create_empty_file(temporary)  # an empty shard; Beam's S3 writer cannot make one
    else:
        with (
            open(local_path, "rb") as source,
            FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as sink,
        ):
            while chunk := source.read(_COPY_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                sink.write(chunk)
    try:
        if FileSystems.exists(destination):
            FileSystems.delete([destination])
        FileSystems.rename([temporary], [destination])
    except Exception:
        FileSystems.delete([temporary])
        raise
    return size, digest.hexdigest()


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
            _TFRecordUtil.write_record(shard, payload)
            length = frame_length(len(payload))
            entries.append((offset, length))
            offset += length
    return entries


class WriteShardFn(beam.DoFn):
    """``((split, index, count), [PreparedRecord]) -> ShardResult`` (+ duplicates).

    Writes the shard, its index file and its catalog fragment (``catalog_io``). An empty list
    writes an empty shard, so a planned shard that received no records still
    exists and its name is never missing from the set.
    """

    def __init__(self, output_dir: str, *, label_conflicts: str = "keep_first") -> None:
        self._output_dir = output_dir
        self._label_conflicts = label_conflicts
        self._shards = Metrics.counter(METRICS_NAMESPACE, "shards_written")
        self._written = Metrics.counter(METRICS_NAMESPACE, "images_written")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")
        self._duplicates = Metrics.counter(METRICS_NAMESPACE, "duplicates")

    def process(self, element):
        (split, index, count), values = element
        records, duplicates = dedupe_sorted(values, label_conflicts=self._label_conflicts)
        name = shard_filename(split, index, count)
        fd, local_path = tempfile.mkstemp(suffix=".tfrecord")
        os.close(fd)
        try:
            entries = write_shard_file((r.serialized for r in records), local_path)
            num_bytes, digest = copy_to_filesystem(
                local_path, FileSystems.join(self._output_dir, name)
            )
        finally:
            os.remove(local_path)
        # After the shard is committed: its index file, then its catalog rows.
        index_bytes, index_sha256 = write_index_and_fragment(
            self._output_dir, split, name, records, entries
        )
        self._shards.inc()
        self._written.inc(len(records))
        self._bytes.inc(num_bytes)
        self._duplicates.inc(len(duplicates))
        for duplicate in duplicates:
            yield beam.pvalue.TaggedOutput(DUPLICATES_TAG, duplicate)
        yield ShardResult(
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
        )


def _split_stats(records):
    # (split, PreparedRecord) -> (split, (1, num_bytes))
    return (
        records
        | "SizeBySplit" >> beam.Map(lambda kv: (kv[0], (1, len(kv[1].serialized))))
        | "SumBySplit" >> beam.CombinePerKey(_sum_pairs)
    )


def _sum_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[int, int]:
    examples = size = 0
    for n, b in pairs:
        examples += n
        size += b
    return examples, size


class WriteShards(beam.PTransform):
    """``(split, PreparedRecord) -> {"shards": ShardResult, "duplicates": Duplicate}``.

    Assigns every record to a shard by content hash, groups by shard and writes each shard
    whole. ``shards`` has one element per shard of every split that received records,
    ``duplicates`` one per input dropped as a byte-identical copy (``label_conflicts`` as in
    ``dedupe_sorted``).

    Shard counts come one of two ways:
      * ``shard_counts`` (``{split: count}``, e.g. from ``fixed_shard_counts``): fixed before
        the pipeline runs. Records are placed as soon as they are prepared and cross between
        workers once, in the group-by-shard.
      * ``target_shard_bytes``: each split's count is planned from its total bytes, which are
        known only when every record is prepared. Records wait for that plan (a side input),
        which every runner pays for by holding all records once more before the group-by-shard.

    Raises:
      ValueError: unless exactly one of ``shard_counts`` and ``target_shard_bytes`` is given,
        and (while running) for a record of a split ``shard_counts`` does not name.
    """

    def __init__(
        self,
        output_dir: str,
        *,
        shard_counts: Mapping[str, int] | None = None,
        target_shard_bytes: int | None = None,
        label_conflicts: str = "keep_first",
    ) -> None:
        super().__init__()
        if (shard_counts is None) == (target_shard_bytes is None):
            raise ValueError(
                "WriteShards needs exactly one of shard_counts and target_shard_bytes, got "
                f"shard_counts={shard_counts!r}, target_shard_bytes={target_shard_bytes!r}"
            )
        if shard_counts is not None and not all(
            isinstance(n, int) and n >= 1 for n in shard_counts.values()
        ):
            raise ValueError(f"shard_counts must map splits to counts >= 1, got {shard_counts!r}")
        self._output_dir = output_dir
        self._counts = dict(shard_counts) if shard_counts is not None else None
        self._target = target_shard_bytes
        self._label_conflicts = label_conflicts

    def expand(self, records):
        if self._counts is not None:
            counts = self._counts
            plan = records.pipeline | "FixedShardCounts" >> beam.Create([counts])
            keyed = records | "AssignShard" >> beam.Map(_keyed_by_shard, counts)
        else:
            target = self._target
            plan = (
                _split_stats(records)
                # (split, (num_examples, num_bytes))
                | "StatsToDict" >> beam.combiners.ToDict()
                # {split: (num_examples, num_bytes)}
                | "PlanShards"
                >> beam.Map(lambda stats: plan_shard_counts(stats, target_shard_bytes=target))
            )
            keyed = records | "AssignShard" >> beam.Map(
                _keyed_by_shard, beam.pvalue.AsSingleton(plan)
            )
        # plan: {split: num_shards}; keyed: ((split, index, count), PreparedRecord)
        written = (
            keyed
            | "GroupByShard" >> beam.GroupByKey()
            # ((split, index, count), [PreparedRecord])
            | "WriteShard"
            >> beam.ParDo(
                WriteShardFn(self._output_dir, label_conflicts=self._label_conflicts)
            ).with_outputs(DUPLICATES_TAG, main="shards")
        )
        # A shard whose hash range caught no record is written empty, after the others: the
        # records themselves never pass through a Flatten (an extra copy on most runners).
        empty = (
            plan
            | "EmptyShards" >> beam.FlatMap(_empty_shards, beam.pvalue.AsList(written.shards))
            # ((split, index, count), [])
            | "WriteEmptyShard" >> beam.ParDo(WriteShardFn(self._output_dir))
        )
        shards = (written.shards, empty) | "AllShards" >> beam.Flatten()
        return {"shards": shards, DUPLICATES_TAG: written[DUPLICATES_TAG]}


def _empty_shards(counts: Mapping[str, int], written: Iterable[ShardResult]):
    done = {(s.split, s.index) for s in written}
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
