"""Exact epochs as stateless permutations of a split held in memory
(``ReadConfig(epoch_order="permutation")``).

The buffered exact-epoch stream (``tfrecord_io.epochs``) reads shards in order and mixes
records in a shuffle buffer, which every iterator checkpoint holds: for a small split, a copy
of the split. Here the split's encoded records are read once, checked, and held as a constant
of the input graph, which is not iterator state. Each epoch is a permutation of example
indices (``tf.random.experimental.index_shuffle``, keyed by the seed and the epoch) computed
for blocks of ranks; only positions pass the per-element stages, and each batch gathers its
records in its decode (``records_lookup``). Nothing is buffered but a block of positions,
which a symbolic checkpoint does not hold either, so an iterator checkpoint holds positions
only: kilobytes, whatever the split's size.

* **Order of an epoch.** Full epoch ``e`` is the permutation ``f_e`` of ``0..N-1``; pipeline
  ``p`` of ``W`` takes ranks ``lo..hi-1`` of it (``share_bounds``: ``floor(N / W)`` or
  ``ceil(N / W)`` examples, the extra ones rotating as in ``tfrecord_io.epochs``), so every
  example comes once per epoch over all pipelines, and each pipeline's examples come in a
  uniformly random order: at least the mixing a shuffle buffer of its share gives.
* **A begun epoch** (after a resume): the examples not yet delivered, ordered by a keyed
  permutation of their indices, split among the pipelines the same way; each pipeline holds
  its share's indices (8 bytes an example, in the graph) and permutes them again.
* **Positions.** Each record is paired with ``epoch * N + index``, as in
  ``tfrecord_io.epochs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from schemas.framing import FrameError, iter_frames
from tfrecord_io.delivery import DeliveredSet
from tfrecord_io.source import ShardFile, open_binary

__all__ = ["load_split_records", "permuted_epoch_positions", "records_lookup", "share_bounds"]

_ENDLESS = int(np.iinfo(np.int64).max)
# Salts that separate the keys of the epoch permutations from the reader's other seeds.
_EPOCH_SALT = 0x19E2
_SHARE_SALT = 0x19E3
# Ranks permuted at once: 8 KB of positions.
_BLOCK = 1024


def share_bounds(total: int, num_pipelines: int, offset: int) -> np.ndarray:
    """``[W + 1]`` rank bounds: pipeline p takes ranks ``[b[p], b[p + 1])``.

    Each takes ``total // W``; the ``total % W`` extra go to the pipelines ``offset``,
    ``offset + 1``, ... (mod W).
    """
    q, r = divmod(total, num_pipelines)
    extra = ((np.arange(num_pipelines) - offset) % num_pipelines) < r
    return np.concatenate([[0], np.cumsum(q + extra.astype(np.int64))])


def _key(seed: int, salt: int) -> int:
    words = np.random.SeedSequence([seed, salt]).generate_state(1, dtype=np.uint32)
    return int(words[0])


def load_split_records(shards: Sequence[ShardFile]) -> np.ndarray:
    """Reads every record of ``shards`` (manifest order), each frame's CRCs checked.

    Returns:
      ``[N]`` object array of the serialized examples: index ``i`` is global example ``i``.

    Raises:
      FileNotFoundError: if a shard is missing.
      ValueError: naming the shard, if a frame is damaged (``FrameError``, in the words of the
        reader's own check) or a shard's size, record count or SHA-256 is not what
        ``dataset.json`` commits.
    """
    records: list[bytes] = []
    for shard in shards:
        digest: list[tuple[int, str]] = []
        with open_binary(shard.path) as stream:
            try:
                payloads = [
                    frame.payload for frame in iter_frames(stream, name=shard.path, digest=digest)
                ]
            except FrameError as e:  # the same words as the reader's own check
                raise FrameError(f"damaged, missing or unreadable TFRecord shard: {e}") from e
        num_bytes, sha256 = digest[0]
        found = (num_bytes, len(payloads))
        if found != (shard.num_bytes, shard.num_examples) or shard.sha256 not in (None, sha256):
            raise ValueError(
                f"shard {shard.path} is not what dataset.json commits: {num_bytes} bytes, "
                f"{len(payloads)} records, SHA-256 {sha256}; expected {shard.num_bytes} bytes, "
                f"{shard.num_examples} records, SHA-256 {shard.sha256} (python -m "
                "dataset_tools.verify DATASET shows the damage)"
            )
        records.extend(payloads)
    array = np.empty(len(records), dtype=object)
    array[:] = records
    return array


def _in_blocks(
    ranks: tf.data.Dataset, to_positions: Callable[[tf.Tensor], tf.Tensor]
) -> tf.data.Dataset:
    """``to_positions`` applied to blocks of ``ranks``, then one position per element.

    One ``index_shuffle`` per element cost about 25 CPU-us (a tf.data function call each);
    per block of ``_BLOCK`` ranks it costs well under 1. A symbolic checkpoint of the unbatch
    holds its place in the block, not the block.
    """
    return ranks.batch(_BLOCK).map(to_positions).unbatch()


def _permuted(indices: tf.Tensor, key: tf.Tensor) -> tf.data.Dataset:
    """``indices`` (``[n]`` int64, n > 0) one by one in the keyed permutation of their ranks."""
    last = tf.cast(tf.size(indices), tf.int64) - 1
    return _in_blocks(
        tf.data.Dataset.range(last + 1),
        lambda k: tf.gather(indices, _index_shuffle(k, key, last)),
    )


def _index_shuffle(ranks: tf.Tensor, key: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
    """Where ``ranks`` (``[b]`` int64) go in the keyed permutation of ``0..last``."""
    return tf.random.experimental.index_shuffle(ranks, key, tf.fill(tf.shape(ranks), last))


class _Epochs:
    """Positions ``epoch * N + index`` of one pipeline's epochs, in permuted order."""

    def __init__(self, num_examples: int, seed: int, num_pipelines: int, pipeline_id: int):
        self.n = num_examples
        self.num_pipelines = num_pipelines
        self.pipeline_id = pipeline_id
        self.epoch_word = _key(seed, _EPOCH_SALT)
        self.share_word = _key(seed, _SHARE_SALT) + pipeline_id

    def epoch_key(self, epoch: int | tf.Tensor) -> tf.Tensor:
        return tf.stack([tf.constant(self.epoch_word, tf.int64), tf.cast(epoch, tf.int64)])

    def begun(self, epoch: int, mask: np.ndarray, offset: int) -> tuple[tf.data.Dataset, int]:
        """This pipeline's positions of the undelivered examples of ``epoch``, and the
        rotation offset after it."""
        needed = np.flatnonzero(~mask).astype(np.int64)
        order = tf.random.experimental.index_shuffle(
            tf.constant(needed), self.epoch_key(epoch), tf.constant(self.n - 1, tf.int64)
        ).numpy()
        ordered = needed[np.argsort(order, kind="stable")]
        bounds = share_bounds(len(needed), self.num_pipelines, offset)
        mine = ordered[bounds[self.pipeline_id] : bounds[self.pipeline_id + 1]] + epoch * self.n
        after = (offset + len(needed) % self.num_pipelines) % self.num_pipelines
        if not len(mine):
            return tf.data.Dataset.range(0), after
        key = tf.constant([self.share_word, epoch], tf.int64)
        return _permuted(tf.constant(mine, tf.int64), key), after

    def full(self, first: int, end: int, offset: int) -> tf.data.Dataset:
        """This pipeline's positions of the full epochs ``first..end-1``; ``offset`` is the
        rotation of the first."""
        n, num_pipelines, pipeline_id = self.n, self.num_pipelines, self.pipeline_id
        q, r = divmod(n, num_pipelines)

        def epoch_positions(epoch: tf.Tensor) -> tf.data.Dataset:
            rotation = tf.math.floormod(offset + (epoch - first) * r, num_pipelines)
            ids = tf.range(num_pipelines, dtype=tf.int64)
            extra = tf.cast(tf.math.floormod(ids - rotation, num_pipelines) < r, tf.int64)
            bounds = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(q + extra)], axis=0)
            lo, hi = bounds[pipeline_id], bounds[pipeline_id + 1]
            key, last = self.epoch_key(epoch), tf.constant(n - 1, tf.int64)
            return _in_blocks(
                tf.data.Dataset.range(lo, hi),
                lambda ranks: epoch * n + _index_shuffle(ranks, key, last),
            )

        return tf.data.Dataset.range(first, end).flat_map(epoch_positions)


def records_lookup(records: np.ndarray) -> Callable[[tf.Tensor], tf.Tensor]:
    """The function from positions (``epoch * N + index``, any shape) to their serialized
    examples, gathered from ``records`` (``load_split_records``) held as a graph constant,
    which is not iterator state."""
    held = tf.constant(records, tf.string)
    n = len(records)
    return lambda positions: tf.gather(held, tf.math.floormod(positions, n))


def permuted_epoch_positions(
    exclude: DeliveredSet,
    *,
    seed: int,
    num_pipelines: int,
    pipeline_id: int,
    num_epochs: int | None,
) -> tf.data.Dataset:
    """The positions (``epoch * N + index``, int64) one input pipeline reads, in order;
    ``records_lookup`` turns a batch of them into its records.

    Args:
      exclude: what was already delivered; the stream starts with the rest of its epoch.
      seed: keys the permutations.
      num_pipelines, pipeline_id: this pipeline's place.
      num_epochs: the stream ends after epoch ``num_epochs - 1``; None: endless.

    Raises:
      ValueError: if nothing is left to read (``num_epochs`` already reached).
    """
    n = exclude.num_examples
    end = _ENDLESS if num_epochs is None else num_epochs
    epochs = _Epochs(n, seed, num_pipelines, pipeline_id)
    partial = exclude.partial_epochs()
    last_epoch = partial[-1][0]
    begun = [(epoch, mask) for epoch, mask in partial if epoch < end]
    first_full, streams, offset = last_epoch + 1, [], 0
    for i, (epoch, mask) in enumerate(begun):
        if i == len(begun) - 1 and epoch == last_epoch and not mask.any():
            # An untouched epoch (a fresh start) is a full one: no indices held in the graph.
            first_full = epoch
            break
        stream, offset = epochs.begun(epoch, mask, offset)
        streams.append(stream)
    if not streams and first_full >= end:
        raise ValueError(
            f"num_epochs={num_epochs} is already reached: the delivered set is at epoch "
            f"{exclude.epoch}"
        )
    if first_full < end:
        streams.append(epochs.full(first_full, end, offset))
    positions = streams[0]
    for stream in streams[1:]:
        positions = positions.concatenate(stream)
    return positions
