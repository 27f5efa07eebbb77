"""Shard files into checked records: the part of the reader both its pipelines share.

``make_dataset`` (``tfrecord_io.reader``) and its exact-epoch pipeline (``tfrecord_io.epochs``)
read shards the same way: the shards still present (``present_shards``), each read by a
``ShardReader`` that checks the file was read whole, with a read-ahead sized by
``file_readahead``, under seeds from ``derive_seeds`` and a record shuffle buffer from
``record_shuffle_buffer``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any

import numpy as np
import tensorflow as tf

from objstore import has_glob
from schemas.framing import FRAME_OVERHEAD
from tfrecord_io.decode import shard_damage_record
from tfrecord_io.read_config import ReaderConfig
from tfrecord_io.source import ResolvedSource, ShardFile, is_remote

__all__ = [
    "DEFAULT_CYCLE_LENGTH",
    "SKIP_HINT",
    "CorruptionCounter",
    "ShardReader",
    "damage_records",
    "derive_seeds",
    "file_readahead",
    "present_shards",
    "record_shuffle_buffer",
]

_log = logging.getLogger(__name__)

# Shards read at once when ``ReadConfig.cycle_length`` is not set.
DEFAULT_CYCLE_LENGTH = 16
# What a reader of a damaged shard can do, from Python or from the trainer's command line.
SKIP_HINT = (
    "python -m dataset_tools.verify DATASET shows the damage; to read past it, "
    "ReadConfig(skip_corrupt=True) or the trainer's --skip_corrupt"
)
# The record shuffle buffer is sized by bytes so RAW (150 KB/record) and JPEG (30 KB/record)
# datasets hold a similar amount of memory; an iterator checkpoint stores the whole buffer.
_SHUFFLE_BUFFER_BYTES = 128 * 1024 * 1024
_MAX_SHUFFLE_BUFFER = 10_000
_FOREIGN_SHUFFLE_BUFFER = 2_048
# Each open shard reads and checks this much ahead of the interleave, in its own thread. A
# deterministic interleave takes records from its files in a fixed turn, so a file whose next
# record is not ready stalls the rest; with a read-ahead the turn is rarely kept waiting. It
# raised RAW reads from 38% to about 50% of the bytes-only rate (benchmarks/bench_reader.py).
# Iterator checkpoints hold these buffers too.
_READAHEAD_BYTES = 4 * 1024 * 1024
_MIN_READAHEAD = 2
_MAX_READAHEAD = 64


class CorruptionCounter:
    """Counts damage skipped by a ``skip_corrupt=True`` reader; pass it as ``corruption_counter``.

    The counts are TensorFlow variables updated inside the input pipeline, so they are exact
    even with parallel readers. Read them with ``as_dict()``.
    """

    def __init__(self) -> None:
        self.damaged_shards = tf.Variable(0, dtype=tf.int64, trainable=False, name="damaged_shards")
        self.bytes_skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="bytes_skipped")
        self.records_skipped = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="records_skipped"
        )

    def as_dict(self) -> dict[str, int]:
        """``{damaged_shards, bytes_skipped, records_skipped}``; records only where the manifest
        gives a shard's record count."""
        return {
            "damaged_shards": int(self.damaged_shards.numpy()),
            "bytes_skipped": int(self.bytes_skipped.numpy()),
            "records_skipped": int(self.records_skipped.numpy()),
        }


def derive_seeds(seed: int | None, *words: int) -> tuple[int | None, int | None, int | None]:
    """Independent (file order, record order, augmentation) seeds from one user seed.

    Args:
      seed: the user's seed, or None for unseeded reading (then all three are None).
      words: a salt, such as the input pipeline's id, so pipelines draw different seeds.
    """
    if seed is None:
        return None, None, None
    state = np.random.SeedSequence([seed, *words]).generate_state(3, dtype=np.uint32)
    return int(state[0]), int(state[1]), int(state[2])


def _record_bytes(shards: tuple[ShardFile, ...]) -> int | None:
    """The mean record size of shards with known counts, else None."""
    if any(s.num_examples < 0 for s in shards):
        return None
    total_records = max(1, sum(s.num_examples for s in shards))
    return max(1, sum(s.num_bytes for s in shards) // total_records)


def file_readahead(shards: tuple[ShardFile, ...]) -> int:
    """Records each open file reads ahead of the interleave: about ``_READAHEAD_BYTES``."""
    per_record = _record_bytes(shards)
    if per_record is None:
        return _MIN_READAHEAD
    return int(min(_MAX_READAHEAD, max(_MIN_READAHEAD, _READAHEAD_BYTES // per_record)))


def record_shuffle_buffer(
    config: ReaderConfig, resolved: ResolvedSource, shards: tuple[ShardFile, ...], batch_size: int
) -> int:
    """Records in the record shuffle buffer: ``config.shuffle_buffer``, else about 128 MiB of
    records, never more than the pipeline's share of the split."""
    if config.shuffle_buffer is not None:
        return config.shuffle_buffer
    if resolved.manifest is None:
        return _FOREIGN_SHUFFLE_BUFFER
    total_records = max(1, sum(max(s.num_examples, 0) for s in shards))
    per_record = _record_bytes(shards) or 1
    by_bytes = max(batch_size, _SHUFFLE_BUFFER_BYTES // per_record)
    # A buffer larger than the pipeline's share of the split would only mix epochs (and bloat
    # iterator checkpoints, which hold the buffer).
    return int(min(_MAX_SHUFFLE_BUFFER, by_bytes, total_records))


def _damage_message(shard: ShardFile) -> str:
    return (
        "damaged, missing or unreadable TFRecord shard (DataLossError / CRC mismatch / "
        f"truncated; {SKIP_HINT}): {shard.path} ended before the "
        f"{shard.num_examples} records dataset.json commits"
    )


def damage_records(shards: tuple[ShardFile, ...]) -> list[bytes]:
    """Per shard, the end marker a ``ShardReader`` passes on when the shard reads short: a
    record whose parse fails naming the shard (``decode.shard_damage_record``)."""
    return [shard_damage_record(_damage_message(s)) for s in shards]


def present_shards(
    shards: tuple[ShardFile, ...], skip_corrupt: bool, counter: CorruptionCounter | None
) -> tuple[tuple[ShardFile, ...], bool]:
    """Checks local shards exist and have their committed size; returns the shards to read and
    whether to guard in-graph against missing files.

    Local files are checked here so a missing or resized shard fails at once, naming it. Remote
    shards are not (one request per shard would slow start-up); the pipeline guards them as it
    opens them, which needs paths free of glob characters.

    Raises:
      FileNotFoundError: if a local shard is missing or unreadable (without ``skip_corrupt``),
        or every shard is.
      ValueError: if a local shard's size is not its committed size (without ``skip_corrupt``).
    """
    kept = []
    for shard in shards:
        if is_remote(shard.path):
            kept.append(shard)
            continue
        if not (os.path.isfile(shard.path) and os.access(shard.path, os.R_OK)):
            if not skip_corrupt:
                raise FileNotFoundError(
                    f"shard {shard.path} is missing or unreadable ({SKIP_HINT})"
                )
            _log.warning("skipping missing or unreadable shard %s", shard.path)
        elif (size := os.path.getsize(shard.path)) != shard.num_bytes:
            # Reading stops at a shard's committed record count, so bytes appended to a whole
            # shard would go unread and unreported: its size is checked here instead.
            if not skip_corrupt:
                raise ValueError(
                    f"shard {shard.path} is {size} bytes, but its manifest entry says "
                    f"{shard.num_bytes}: damaged or replaced ({SKIP_HINT})"
                )
            _log.warning(
                "skipping shard %s: %d bytes, manifest says %d", shard.path, size, shard.num_bytes
            )
        else:
            kept.append(shard)
            continue
        if counter is not None:
            counter.damaged_shards.assign_add(1)
            counter.bytes_skipped.assign_add(shard.num_bytes)
            counter.records_skipped.assign_add(max(shard.num_examples, 0))
    if not kept:
        raise FileNotFoundError("every shard of the split is missing, unreadable or resized")
    guard = not any(has_glob(s.path) for s in kept)
    return tuple(kept), guard


@dataclasses.dataclass(frozen=True)
class ShardReader:
    """Reads one shard and checks it was read whole (or the records of a range of it).

    TensorFlow's ``DataLossError`` does not name the file it came from, and ``tf.data`` has no
    way to catch and re-raise. So each file is read with errors ignored (a damaged TFRecord file
    ends at its first bad record), followed by an end marker that only a short read reaches:

    * With known counts and no ``skip_corrupt`` (shards this project writes): the marker is
      the shard's damage record and the file stops at its committed count (``take``). A whole
      file never reaches the marker; a short one passes it on, and ``decode_batch`` fails naming
      the shard. Nothing runs per record, so reading costs no more than the records themselves.
    * Otherwise the marker is an empty record and a scan counts the bytes and records read,
      checking them at the file's last record or at the marker: a damaged file fails with an
      error that names the shard and what was read, or with ``skip_corrupt`` is logged, counted
      and skipped.

    Bytes after the last committed record are not read (``present_shards`` checks local shard
    sizes when the pipeline is built; streamed shards are checked whole, size and SHA-256, by
    the shard cache). A shard the manifest says is empty is not opened.

    Attributes:
      resolved: the split; streamed shards are opened through its shard cache.
      read_buffer_bytes: the file reader's buffer.
      skip_corrupt: log, count and skip damage instead of failing.
      counter: receives the counts of skipped damage, or None.
      guard_missing: filter out files that do not exist before opening them (see
        ``present_shards``).
      counts_known: every shard's record count is known (a manifest gives it).
      readahead: records each open file reads ahead (``file_readahead``).
      end_on_error: read errors end a local file early, so that its end marker names it
        (``ignore_errors``). False under symbolic checkpointing, which ``ignore_errors`` does
        not support: a CRC failure then raises TensorFlow's ``DataLossError``.
    """

    resolved: ResolvedSource
    read_buffer_bytes: int
    skip_corrupt: bool
    counter: CorruptionCounter | None
    guard_missing: bool
    counts_known: bool
    readahead: int
    end_on_error: bool = True

    @classmethod
    def for_shards(
        cls,
        config: ReaderConfig,
        resolved: ResolvedSource,
        shards: tuple[ShardFile, ...],
        *,
        guard_missing: bool,
        counter: CorruptionCounter | None,
    ) -> ShardReader:
        """The reader of ``shards`` (those ``present_shards`` kept) with ``config``'s options."""
        return cls(
            resolved=resolved,
            read_buffer_bytes=config.read_buffer_bytes,
            skip_corrupt=config.skip_corrupt,
            counter=counter,
            guard_missing=guard_missing,
            counts_known=all(s.num_examples >= 0 for s in shards),
            readahead=file_readahead(shards),
            end_on_error=not config.symbolic_checkpoint,
        )

    def read(
        self, path: tf.Tensor, num_bytes: tf.Tensor, num_examples: tf.Tensor, damage: tf.Tensor
    ) -> tf.data.Dataset:
        """The checked records of the whole shard at ``path``.

        Args:
          path, num_bytes, num_examples: the shard's ``ShardFile`` fields.
          damage: the shard's end marker (``damage_records``).
        """
        return self._records(path, num_bytes, num_examples, damage, None)

    def read_range(
        self,
        path: tf.Tensor,
        num_bytes: tf.Tensor,
        num_examples: tf.Tensor,
        damage: tf.Tensor,
        start: tf.Tensor,
        stop: tf.Tensor,
    ) -> tf.data.Dataset:
        """The checked records ``start..stop-1`` of the shard at ``path`` (exact epochs read
        parts of shards).

        With known counts and no ``skip_corrupt`` the first ``start`` records are skipped inside
        the file reader, which reads their headers but neither copies nor checksums their bytes;
        a shard that ends before ``stop`` still reaches the marker. An empty range does not open
        the file.
        """
        return self._records(path, num_bytes, num_examples, damage, (start, stop))

    @property
    def _fast(self) -> bool:
        """Whether damage is found by the end marker alone, with nothing run per record."""
        return self.counts_known and not self.skip_corrupt

    def _records(
        self,
        path: tf.Tensor,
        num_bytes: tf.Tensor,
        num_examples: tf.Tensor,
        damage: tf.Tensor,
        records_range: tuple[tf.Tensor, tf.Tensor] | None,
    ) -> tf.data.Dataset:
        start = tf.constant(0, tf.int64) if records_range is None else records_range[0]
        file_skip = start if self._fast and records_range is not None else None
        records = self._open(path, file_skip)
        if self._fast:
            marker = tf.data.Dataset.from_tensors(damage)
            count = num_examples if records_range is None else records_range[1] - start
            return records.concatenate(marker).take(count).prefetch(self.readahead)
        # A record of our shards is never empty (an example always has features), so an empty one
        # can mark the end. The scan runs per record: about half what counting in batched blocks
        # cost (the batch and unbatch touch every record again).
        marked = records.concatenate(tf.data.Dataset.from_tensors(tf.constant("", tf.string)))
        zero = tf.constant(0, tf.int64)
        checked = marked.scan((zero, zero), self._scan_step(path, num_bytes, num_examples))
        if self.counts_known:
            checked = checked.take(num_examples)
        # The end marker reaches the output: always without counts, after damage when skipping.
        checked = checked.filter(lambda record: tf.strings.length(record) > 0)
        if records_range is not None:
            # The scan checks the whole shard's bytes, so the range is cut after it.
            checked = checked.skip(start).take(records_range[1] - start)
        return checked.prefetch(self.readahead)

    def _open(self, path: tf.Tensor, file_skip: tf.Tensor | None) -> tf.data.Dataset:
        """The shard's records with read errors ignored: a damaged file just ends early."""
        if self.resolved.streamed:
            # Object-store shards come through the shard cache, which downloads, checks SHA-256
            # and names the URI on failure; with skip_corrupt a failed shard reads as 0 bytes.
            return self.resolved.open_records(
                path, self.read_buffer_bytes, skip_failed=self.skip_corrupt, skip=file_skip
            ).ignore_errors()
        names = tf.data.Dataset.from_tensors(path)
        if self.guard_missing:
            # ignore_errors retries a file that cannot be opened forever, so a missing file must
            # never reach the reader: it then reads as 0 bytes and fails (or is skipped) like any
            # damage.
            names = names.filter(lambda name: tf.size(tf.io.matching_files(name)) > 0)
        records = tf.data.TFRecordDataset(names, buffer_size=self.read_buffer_bytes)
        if file_skip is not None:
            records = records.skip(file_skip)
        # A missing file still reads as 0 bytes (the guard above) and a resized one fails when
        # the pipeline is built (present_shards), so without ignore_errors only a CRC failure
        # goes unnamed.
        return records.ignore_errors() if self.end_on_error else records

    def _scan_step(self, path: tf.Tensor, num_bytes: tf.Tensor, num_examples: tf.Tensor) -> Any:
        """The scan function that counts what was read of one shard and checks it at the
        shard's last record or at the end marker: ``(bytes, records), record -> ...``."""

        def step(state: tuple[tf.Tensor, tf.Tensor], record: tf.Tensor) -> Any:
            read_bytes, read_records = state
            length = tf.cast(tf.strings.length(record), tf.int64)
            is_end = tf.equal(length, 0)
            real = 1 - tf.cast(is_end, tf.int64)
            read_bytes += (length + FRAME_OVERHEAD) * real
            read_records += real
            checkpoint = tf.logical_or(is_end, tf.equal(read_records, num_examples))
            whole = tf.logical_and(
                tf.equal(read_bytes, num_bytes),
                tf.logical_or(tf.less(num_examples, 0), tf.equal(read_records, num_examples)),
            )
            damaged = tf.logical_and(checkpoint, tf.logical_not(whole))
            details = [
                path,
                "read",
                read_bytes,
                "of",
                num_bytes,
                "bytes,",
                read_records,
                "records (expected",
                num_examples,
                "; -1 = unknown)",
            ]
            if self.skip_corrupt:
                done = self._report_skipped(
                    damaged, details, (num_bytes, read_bytes), (num_examples, read_records)
                )
            else:
                done = tf.debugging.Assert(
                    tf.logical_not(damaged),
                    [
                        "damaged, missing or unreadable TFRecord shard (DataLossError / CRC "
                        f"mismatch / truncated / size differs from dataset.json; {SKIP_HINT}):",
                        *details,
                    ],
                    summarize=16,
                )
            with tf.control_dependencies([done]):
                record = tf.identity(record)
            return (read_bytes, read_records), record

        return step

    def _report_skipped(
        self,
        damaged: tf.Tensor,
        details: list[Any],
        bytes_read: tuple[tf.Tensor, tf.Tensor],
        records_read: tuple[tf.Tensor, tf.Tensor],
    ) -> tf.Tensor:
        """Logs a damaged shard and counts it in ``counter`` (when damaged): an op to wait on.

        ``bytes_read`` and ``records_read`` are ``(expected, read)`` pairs; what is left of them
        is computed only for a damaged shard.
        """

        def report() -> tf.Tensor:
            ops = [
                tf.print(
                    "tfrecord_io: skipped damaged, missing or unreadable shard:",
                    *details,
                    output_stream=sys.stderr,
                )
            ]
            if self.counter is not None:
                ops.append(self.counter.damaged_shards.assign_add(1))
                ops.append(self.counter.bytes_skipped.assign_add(bytes_read[0] - bytes_read[1]))
                ops.append(
                    self.counter.records_skipped.assign_add(
                        tf.maximum(records_read[0] - records_read[1], 0)
                    )
                )
            with tf.control_dependencies(ops):
                return tf.constant(True)

        return tf.cond(damaged, report, lambda: tf.constant(True))
