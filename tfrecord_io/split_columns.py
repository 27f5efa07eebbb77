"""A split's shards as columns, for exact epochs (``tfrecord_io.epochs``) at any shard count.

Exact epochs let any input pipeline read any shard over the epochs, so their graph holds every
shard's path, size and count. At 400 k shards those are a few columns of the split's shard
table (3.2 MB an int64 column), never a ``ShardFile`` or a serialised end marker per shard:

* ``SplitColumns``: names, counts and sizes in manifest order, as numpy arrays.
* ``DamageMarker``: a shard's end marker, made in the graph from its path and count when the
  shard is opened.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from tfrecord_io.decode import shard_damage_record
from tfrecord_io.shard_reading import damage_records
from tfrecord_io.source import ResolvedSource, ShardFile, ShardFiles, join

__all__ = ["DamageMarker", "SplitColumns"]


@dataclasses.dataclass(frozen=True)
class SplitColumns:
    """A split's shards as columns, in manifest order: what exact epochs need of every shard.

    Attributes:
      prefix: joined before each name to give the shard's path (``join(root, "")``).
      names: the shards' manifest names (str; whole paths when ``prefix`` is empty).
      counts: records per shard (int64).
      sizes: bytes per shard (int64).
    """

    prefix: str
    names: np.ndarray
    counts: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, resolved: ResolvedSource) -> SplitColumns:
        """The columns of ``resolved``'s split: from a shard table, three columns and no
        ``ShardFile`` per shard.

        Raises:
          FileNotFoundError, ValueError: if the split's shard table is missing or damaged.
        """
        files = resolved.shard_files
        if isinstance(files, ShardFiles):
            return cls(
                join(files.root, ""),
                files.column("file"),
                files.column("num_examples"),
                files.column("num_bytes"),
            )
        shards = resolved.shards
        return cls(
            "",
            np.array([s.path for s in shards], dtype=object),
            np.array([s.num_examples for s in shards], dtype=np.int64),
            np.array([s.num_bytes for s in shards], dtype=np.int64),
        )

    def rows(self, resolved: ResolvedSource, rows: np.ndarray) -> tuple[ShardFile, ...]:
        """The ``ShardFile``s of ``rows`` alone (manifest positions)."""
        files = resolved.shard_files
        if isinstance(files, ShardFiles):
            return files.rows(rows)
        return tuple(files[int(i)] for i in rows)


class DamageMarker:
    """Each shard's end marker (``shard_reading.damage_records``: a record whose decoding fails
    naming the shard), made in the graph from the shard's path and count when it is opened. A
    constant per shard cost a serialised example per shard at start-up (400 k at 400 k shards).
    The message is padded with spaces to one width, so the example's bytes around it are the
    same for every shard."""

    _PATH, _COUNT = "\x01", 8_070_450_532_247_928_832  # stand-ins found in the probe's text

    def __init__(self, columns: SplitColumns, names: tf.Tensor) -> None:
        probe = damage_records((ShardFile(self._PATH, 0, self._COUNT),))[0]
        features = tf.train.Example.FromString(probe).features.feature.values()
        message = next(
            v for f in features for v in f.bytes_list.value if self._PATH.encode() in v
        ).decode()
        self.head, rest = message.split(self._PATH)
        self.middle, self.tail = rest.split(str(self._COUNT))
        longest = int(tf.reduce_max(tf.strings.length(names))) if columns.names.size else 0
        fixed = (self.head + columns.prefix + self.middle + self.tail).encode()
        self.width = len(fixed) + longest + 20  # 20: the digits of any int64
        # Starts with a byte unlike the rest, so that its first occurrence is the message's.
        filler = "\x03" + "\x02" * (self.width - 1)
        record = shard_damage_record(filler)
        at = record.index(filler.encode())
        self.before, self.after = record[:at], record[at + self.width :]
        self.spaces = " " * self.width

    def record(self, path: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
        """The end marker of the shard at ``path`` with ``count`` committed records."""
        message = tf.strings.join(
            [self.head, path, self.middle, tf.strings.as_string(count), self.tail]
        )
        pad = tf.strings.substr(self.spaces, 0, self.width - tf.strings.length(message))
        return tf.strings.join([self.before, message, pad, self.after])
