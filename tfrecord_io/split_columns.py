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
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from objstore import GLOB_CHARS
from tfrecord_io.decode import shard_damage_record
from tfrecord_io.shard_reading import damage_records
from tfrecord_io.source import ResolvedSource, ShardFile, ShardFiles, join

__all__ = ["DamageMarker", "SplitColumns"]


@dataclasses.dataclass(frozen=True)
class SplitColumns:
    """A split's shards as columns, in manifest order: what exact epochs need of every shard.

    The names are kept as the bytes of all of them back to back (``blob``) and where each
    starts (``offsets``), as Arrow holds a string column: 400 k names cost their bytes and
    3.2 MB, not a Python str (about 80 bytes) each.

    Attributes:
      prefix: joined before each name to give the shard's path (``join(root, "")``).
      blob: the names' UTF-8 bytes, back to back (whole paths when ``prefix`` is empty).
      offsets: ``[num_shards + 1]`` int64, name ``i`` is ``blob[offsets[i]:offsets[i + 1]]``.
      counts: records per shard (int64).
      sizes: bytes per shard (int64).
    """

    prefix: str
    blob: bytes
    offsets: np.ndarray
    counts: np.ndarray
    sizes: np.ndarray

    @classmethod
    def of(cls, resolved: ResolvedSource) -> SplitColumns:
        """The columns of ``resolved``'s split: from a shard table, three columns and no
        Python object per shard.

        Raises:
          FileNotFoundError, ValueError: if the split's shard table is missing or damaged.
        """
        files = resolved.shard_files
        if isinstance(files, ShardFiles):
            blob, offsets = _packed(files.column("file"))
            counts, sizes = files.column("num_examples"), files.column("num_bytes")
            return cls(join(files.root, ""), blob, offsets, counts, sizes)
        shards = resolved.shards
        blob, offsets = _packed([s.path for s in shards])
        counts = np.array([s.num_examples for s in shards], dtype=np.int64)
        return cls("", blob, offsets, counts, np.array([s.num_bytes for s in shards], np.int64))

    def names_tensor(self) -> tf.Tensor:
        """``[num_shards]`` string tensor of the names, cut from ``blob`` in one op.

        A vector, which a ``tf.data`` function captures by reference; a scalar (such as
        ``blob`` itself) would be copied into each function's graph as a constant.
        """
        starts = self.offsets[:-1]
        return tf.strings.substr(self.blob, starts, self.offsets[1:] - starts)

    @property
    def has_glob(self) -> bool:
        """Whether a path holds a glob character (then a missing file cannot be guarded
        against in the graph: ``present_shards``)."""
        return any(char.encode() in self.blob or char in self.prefix for char in GLOB_CHARS)

    def rows(self, rows: np.ndarray) -> tuple[ShardFile, ...]:
        """The ``ShardFile``s (path, size, count) of ``rows`` alone (manifest positions)."""
        offsets = self.offsets
        return tuple(
            ShardFile(
                self.prefix + self.blob[offsets[i] : offsets[i + 1]].decode(),
                int(self.sizes[i]),
                int(self.counts[i]),
            )
            for i in rows
        )


def _packed(names: Any) -> tuple[bytes, np.ndarray]:
    """``(blob, offsets)`` of ``names``: an Arrow string column (its buffers, without a Python
    object per name) or a list of str."""
    if isinstance(names, list):
        encoded = [n.encode() for n in names]
        lengths = np.array([len(n) for n in encoded], dtype=np.int64)
        return b"".join(encoded), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # One array with 64-bit offsets, whatever the column's chunks and string type.
    array = names.combine_chunks().cast(pa.large_string())
    if len(array) == 0:
        return b"", np.zeros(1, np.int64)
    offsets = np.frombuffer(array.buffers()[1], np.int64, len(array) + 1, array.offset * 8)
    data = array.buffers()[2]
    blob = data[int(offsets[0]) : int(offsets[-1])].to_pybytes() if data is not None else b""
    return blob, offsets - offsets[0]


class DamageMarker:
    """Each shard's end marker (``shard_reading.damage_records``: a record whose decoding fails
    naming the shard), made in the graph from the shard's path and count when it is opened. A
    constant per shard cost a serialised example per shard at start-up (400 k at 400 k shards).
    The message is padded with spaces to one width, so the example's bytes around it are the
    same for every shard."""

    _PATH, _COUNT = "\x01", 8_070_450_532_247_928_832  # stand-ins found in the probe's text

    def __init__(self, columns: SplitColumns) -> None:
        probe = damage_records((ShardFile(self._PATH, 0, self._COUNT),))[0]
        features = tf.train.Example.FromString(probe).features.feature.values()
        message = next(
            v for f in features for v in f.bytes_list.value if self._PATH.encode() in v
        ).decode()
        self.head, rest = message.split(self._PATH)
        self.middle, self.tail = rest.split(str(self._COUNT))
        longest = int(np.diff(columns.offsets).max()) if columns.counts.size else 0
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
