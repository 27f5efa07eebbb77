"""Exact epochs: the record stream of ``make_dataset(..., exclude=DeliveredSet)``.

Every example of a split has a global index (earlier shards' record counts from
``dataset.json`` plus its position in its shard), so an epoch is a set of indices, and the rest
of an interrupted epoch is that set minus the delivered bitmap. This module turns that into
``tf.data`` graphs, with no ``py_function``, so iterators stay checkpointable and the graph
can run on tf.data service workers:

* **Order of an epoch.** Epoch ``e`` lists the shards in a permutation drawn from
  ``(seed, e)`` (the same on every pipeline) and numbers the examples it still needs along
  that list. Pipeline ``p`` of ``W`` takes a contiguous run of those ranks, of
  ``floor(T / W)`` or ``ceil(T / W)`` examples; which pipelines take the extra one rotates
  from epoch to epoch, so over any number of epochs no pipeline is more than one example
  ahead of another, and batches of consecutive epochs overlap by at most about one global
  batch. A pipeline reads its shards (the first and last of its run only in part) through
  the reader's per-shard reader, interleaved, and shuffles its records within the epoch.
* **The interrupted epoch** (and a following one already begun) skips what was delivered.
  A shard the epoch has not taken from is read plainly. In a shard it has, every delivered
  record lies before some position (the last one delivered). The records before that position
  go through a lookup in the bitmap, compiled into the graph as a constant of N/8 bytes, on
  blocks of records. The file reader skips what comes before them, and reads the rest of the
  shard plainly. After an interruption only the few hundred records that shuffle buffers held
  in each shard then open go through the lookup. Later epochs are full and need no filter.
* **Positions.** Each record is paired with ``epoch * N + index``, which training loops
  give to ``DeliveryTracker.add``.

In-process, each epoch is a dataset of its own inside ``flat_map``, so a shuffle buffer never
mixes two epochs. On the tf.data service the stream starts from ``Dataset.range`` over
(epoch, shard) units, which the dispatcher hands out to its workers one at a time (dynamic
sharding); there the workers' shuffle buffers can mix neighbouring epochs, which the
tracker's ``later`` positions absorb.

With ``ReadConfig(epoch_order="permutation")`` the records come instead from
``tfrecord_io.permuted_epochs``: the split held in memory, each epoch a keyed permutation, no
shuffle buffer, so an iterator checkpoint holds positions only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tfrecord_io.batching import (
    batch_and_decode,
    batch_decoder,
    make_decode_config,
    pipeline_options,
)
from tfrecord_io.delivery import DeliveredSet, manifest_split_digest
from tfrecord_io.permuted_epochs import (
    load_split_records,
    permuted_epoch_positions,
    records_lookup,
    share_bounds,
)
from tfrecord_io.shard_reading import (
    DEFAULT_CYCLE_LENGTH,
    CorruptionCounter,
    ShardReader,
    derive_seeds,
    present_shards,
    record_shuffle_buffer,
)
from tfrecord_io.source import ResolvedSource, ShardFile
from tfrecord_io.split_columns import DamageMarker, SplitColumns

if TYPE_CHECKING:
    from tfrecord_io.read_config import ReaderConfig
    from tfrecord_io.service.client import ServiceConfig

__all__ = [
    "EpochShare",
    "EpochStreamOptions",
    "exact_epoch_dataset",
    "exact_epoch_records",
    "plan_partial_epochs",
    "service_message_cap",
    "shard_order",
    "share_ranges",
]

_ENDLESS = int(np.iinfo(np.int64).max)
# Salts that separate the seeds of the shard order and of the record shuffles.
_ORDER_SALT = 0x19E0
_SHUFFLE_SALT = 0x19E1

# On the tf.data service a worker's record shuffle holds at most 1/64 of an epoch, and its
# interleave at most 1/8 of the shards at once (see ``_EpochReader``).
_SERVICE_SHARE = 64
_SERVICE_SHARE_OF_SHARDS = 8
# Records per bitmap lookup in a begun epoch.
_FILTER_BLOCK = 256

ReadShard = Callable[
    [tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor], tf.data.Dataset
]


def _seed_word(seed: int, salt: int) -> int:
    return int(np.random.SeedSequence([seed, salt]).generate_state(1, dtype=np.uint32)[0])


def shard_order(seed: int, epoch: int | tf.Tensor, num_shards: int) -> tf.Tensor:
    """The shard permutation of ``epoch``: ``[num_shards]`` int32, the same on every pipeline.

    Usable eagerly (the planner) and in graphs (the pipeline), with the same result.
    """
    key = tf.stack([tf.constant(_seed_word(seed, _ORDER_SALT), tf.int64), tf.cast(epoch, tf.int64)])
    values = tf.random.stateless_uniform(
        [num_shards], seed=key, minval=None, maxval=None, dtype=tf.int64
    )
    return tf.argsort(values, stable=True)


@dataclasses.dataclass(frozen=True)
class EpochShare:
    """What one input pipeline reads of one partly delivered epoch.

    Attributes:
      epoch: the epoch.
      shards: indices (manifest order) of the shards to read, in reading order.
      skip, take: per shard, the examples still needed to skip and to take.
      mask: ``[N]`` bool, the examples of the epoch already delivered.
      total: examples the epoch still needs over all pipelines.
    """

    epoch: int
    shards: np.ndarray
    skip: np.ndarray
    take: np.ndarray
    mask: np.ndarray
    total: int

    @property
    def examples(self) -> int:
        """Examples this pipeline reads of the epoch."""
        return int(self.take.sum())


def plan_partial_epochs(
    delivered: DeliveredSet,
    counts: Sequence[int] | np.ndarray,
    *,
    seed: int,
    num_pipelines: int,
    pipeline_id: int,
    present: Sequence[bool] | np.ndarray | None = None,
) -> tuple[list[EpochShare], int]:
    """Splits what is left of the begun epochs among the pipelines.

    Args:
      delivered: the delivered set.
      counts: records per shard, manifest order.
      seed: orders the shards of each epoch.
      num_pipelines, pipeline_id: this pipeline's place.
      present: per shard, whether it can be read (default all); others are not planned.

    Returns:
      This pipeline's share of each begun epoch, and the rotation offset the first full
      epoch after them starts from.
    """
    counts_arr = np.asarray(counts, dtype=np.int64)
    readable = np.ones(len(counts_arr), bool) if present is None else np.asarray(present, bool)
    ends = np.cumsum(counts_arr)
    starts = ends - counts_arr
    shares, offset = [], 0
    for epoch, mask in delivered.partial_epochs():
        prefix = np.concatenate([[0], np.cumsum(mask.astype(np.int64))])
        left = np.where(readable, counts_arr - (prefix[ends] - prefix[starts]), 0)
        order = shard_order(seed, epoch, len(counts_arr)).numpy()
        left_in_order = left[order]
        rank_end = np.cumsum(left_in_order)
        rank_start = rank_end - left_in_order
        total = int(rank_end[-1]) if len(rank_end) else 0
        bounds = share_bounds(total, num_pipelines, offset)
        lo, hi = bounds[pipeline_id], bounds[pipeline_id + 1]
        skip = np.clip(lo - rank_start, 0, left_in_order)
        take = np.clip(np.minimum(hi, rank_end) - np.maximum(lo, rank_start), 0, None)
        keep = take > 0
        shares.append(
            EpochShare(epoch, order[keep].astype(np.int32), skip[keep], take[keep], mask, total)
        )
        offset = (offset + total % num_pipelines) % num_pipelines
    return shares, offset


def service_message_cap(num_examples: int, batch_size: int) -> int:
    """Examples in one tf.data service message of an exact-epoch stream: at most 1/64 of an
    epoch (a worker's shuffle holds as much), never below one batch."""
    return max(batch_size, num_examples // _SERVICE_SHARE)


def _pack_bits(mask: np.ndarray) -> np.ndarray:
    return np.packbits(mask.astype(bool), bitorder="little")


def share_ranges(
    share: EpochShare, bases: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per shard of ``share``, the records to read: ``start <= cut <= stop`` (shard positions).

    The share takes the needed (undelivered) examples of ranks ``skip..skip+take-1`` of each
    shard; they lie in records ``start..stop-1``. Delivered examples among those all come
    before ``cut``, so only ``start..cut-1`` needs the bitmap lookup; ``cut..stop-1`` is read
    whole. After an interruption that range is the few hundred records a shuffle buffer held
    in each shard then open, not the shard.

    Args:
      share: one pipeline's share of a begun epoch (``plan_partial_epochs``).
      bases: per shard (manifest order), the global index of its first example.
      counts: per shard, its records.
    """
    start = np.empty(len(share.shards), np.int64)
    cut, stop = np.empty_like(start), np.empty_like(start)
    for i, shard in enumerate(share.shards):
        delivered = share.mask[bases[shard] : bases[shard] + counts[shard]]
        needed = np.flatnonzero(~delivered)
        lo = int(needed[share.skip[i]])
        hi = int(needed[share.skip[i] + share.take[i] - 1]) + 1
        inside = np.flatnonzero(delivered[lo:hi])
        start[i], stop[i] = lo, hi
        cut[i] = lo + int(inside[-1]) + 1 if inside.size else lo
    return start, cut, stop


@dataclasses.dataclass(frozen=True)
class EpochStreamOptions:
    """How one input pipeline reads its exact-epoch stream (``exact_epoch_records``).

    Attributes:
      seed: orders shards and shuffles records.
      pipeline_id, num_pipelines: this pipeline's place (0 of 1 on the tf.data service).
      num_epochs: the stream ends after epoch ``num_epochs - 1``; None: endless.
      on_service: build the unit stream the tf.data service shards dynamically.
      shuffle_buffer: records in a shuffle buffer.
      cycle_length: shards read at once.
      deterministic: keep the interleave's order.

    Raises:
      ValueError: if ``pipeline_id`` is not one of ``num_pipelines`` pipelines.
    """

    seed: int
    pipeline_id: int
    num_pipelines: int
    num_epochs: int | None
    on_service: bool
    shuffle_buffer: int
    cycle_length: int
    deterministic: bool

    def __post_init__(self) -> None:
        if not 0 <= self.pipeline_id < self.num_pipelines:
            raise ValueError(
                f"pipeline_id must be in [0, num_pipelines={self.num_pipelines}), got "
                f"{self.pipeline_id!r}"
            )


class _EpochReader:
    """Builds the streams of one pipeline's epochs from units ``(shard, start, cut, stop,
    epoch)``: the records ``start..stop-1`` of one shard in one epoch, each paired with its
    position ``epoch * N + index``. Records ``start..cut-1`` are looked up in the epoch's
    delivered bitmap (when one is given) and only the undelivered ones kept."""

    def __init__(
        self,
        resolved: ResolvedSource,
        columns: SplitColumns,
        counts: np.ndarray,
        options: EpochStreamOptions,
        *,
        num_examples: int,
        read_shard: ReadShard,
    ) -> None:
        true_counts = columns.counts
        self.resolved = resolved
        # Not the columns themselves: the datasets keep this reader, and need no name bytes
        # beyond the tensor's.
        self.prefix = columns.prefix
        self.options = options
        self.read_shard = read_shard
        self.num_examples = num_examples
        self.num_shards = len(true_counts)
        # Examples of a full epoch over all pipelines: the shards that can be read.
        self.total = int(counts.sum())
        self.shuffle_word = _seed_word(options.seed, _SHUFFLE_SALT)
        cycle = max(1, min(options.cycle_length, self.num_shards))
        if options.on_service:
            cycle = max(1, min(cycle, self.num_shards // _SERVICE_SHARE_OF_SHARDS))
        self.cycle = cycle
        # Per shard, columns only (a shard's path and end marker are made in the graph when it
        # is opened): at 400 k shards, 3.2 MB an int64 column and the names.
        self.names = columns.names_tensor()
        self.sizes = tf.constant(columns.sizes, tf.int64)
        self.records_in = tf.constant(true_counts, tf.int64)
        self.bases = tf.constant(np.cumsum(true_counts) - true_counts, tf.int64)
        # Records of each shard in a full epoch: 0 for a shard that cannot be read (the same
        # tensor when every shard can: 3.2 MB less at 400 k shards).
        every = bool(np.array_equal(counts, true_counts))
        self.counts = self.records_in if every else tf.constant(counts, tf.int64)
        self.marker = DamageMarker(columns)

    def path(self, shard: tf.Tensor) -> tf.Tensor:
        """The path of ``shard`` (``ShardFile.path``: the root joined with its manifest name)."""
        return tf.strings.join([self.prefix, self.names[shard]])

    def begun_epoch(
        self, share: EpochShare, bases: np.ndarray, counts: np.ndarray
    ) -> tf.data.Dataset:
        """This pipeline's ``(position, record)`` pairs of a begun epoch, shuffled within it
        in-process (``bases`` and ``counts`` as for ``share_ranges``)."""
        start, cut, stop = share_ranges(share, bases, counts)
        units = tf.data.Dataset.from_tensor_slices(
            (
                tf.constant(share.shards, tf.int32),
                tf.constant(start, tf.int64),
                tf.constant(cut, tf.int64),
                tf.constant(stop, tf.int64),
                tf.fill([len(share.shards)], tf.constant(share.epoch, tf.int64)),
            )
        )
        # Nothing delivered yet (a fresh start): no filter, so fresh epochs cost nothing extra.
        bits = tf.constant(_pack_bits(share.mask), tf.uint8) if share.mask.any() else None
        pairs = self._read_units(units, bits)
        if self.options.on_service:
            return pairs
        size = min(self.options.shuffle_buffer, share.examples)
        # Shuffled in a traced function, as the full epochs are, so that its order too is the
        # reader's seed's alone (see _shuffled).
        epoch = tf.data.Dataset.from_tensors(tf.constant(share.epoch, tf.int64))
        return epoch.flat_map(lambda e: self._shuffled(pairs, size, e))

    def full_epochs(self, first: int, end: int, offset: int) -> tf.data.Dataset:
        """The pairs of the full epochs ``first..end-1`` (``end`` may be ``_ENDLESS``);
        ``offset`` is the rotation of the first (``plan_partial_epochs``)."""
        if self.options.on_service:
            return self._service_epochs(first, end)
        share_size = min(self.options.shuffle_buffer, -(-self.total // self.options.num_pipelines))

        def epoch_records(epoch: tf.Tensor) -> tf.data.Dataset:
            pairs = self._read_units(self._full_epoch_units(epoch, first, offset), None)
            return self._shuffled(pairs, share_size, epoch)

        return tf.data.Dataset.range(first, end).flat_map(epoch_records)

    def joined(self, streams: list[tf.data.Dataset]) -> tf.data.Dataset:
        """The epochs' streams one after the other (shuffled across epochs on the service),
        with the options their iterators need to be saved."""
        records = streams[0]
        for stream in streams[1:]:
            records = records.concatenate(stream)
        if self.options.on_service:
            # Neighbouring epochs overlap by what the service's workers hold in flight; kept
            # well under an epoch so one is complete before the one after next begins.
            buffer = max(1, min(self.options.shuffle_buffer, self.num_examples // _SERVICE_SHARE))
            records = records.shuffle(buffer, seed=self.shuffle_word % (2**31 - 1))
        options = tf.data.Options()
        # Seeded shuffles built inside flat_map carry a (stateless) dummy seed generator, which
        # iterator checkpoints would otherwise refuse as external state; their seeds are fixed
        # and their buffers and counters are saved, so a restore continues exactly.
        options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
        return records.with_options(options)

    def _shuffled(self, pairs: tf.data.Dataset, size: int, epoch: tf.Tensor) -> tf.data.Dataset:
        salt = (
            tf.cast(epoch, tf.int64) * 1_000_003
            + self.options.pipeline_id * 7_919
            + self.shuffle_word
        )
        # Called while flat_map traces its function: that graph's seed is the user's global
        # one (keras.utils.set_random_seed sets it), which would change the order and, when 0,
        # fails to combine with a seed tensor. Without it, the order is the reader's seed's
        # and the epoch's alone, as without a global seed.
        tf.compat.v1.get_default_graph().seed = None
        return pairs.shuffle(max(1, size), seed=tf.math.floormod(salt, 2**31 - 1))

    def _service_epochs(self, first: int, end: int) -> tf.data.Dataset:
        """On the tf.data service: one unit per (epoch, shard slot), so the dispatcher hands
        shards out one by one."""
        seed, num_shards = self.options.seed, self.num_shards

        def unit(u: tf.Tensor) -> tuple[tf.Tensor, ...]:
            epoch = u // num_shards
            order = shard_order(seed, epoch, num_shards)
            shard = order[u % num_shards]
            zero = tf.constant(0, tf.int64)
            return shard, zero, zero, self.counts[shard], epoch

        last = _ENDLESS if end == _ENDLESS else end * num_shards
        units = tf.data.Dataset.range(first * num_shards, last).map(unit)
        units = units.filter(lambda shard, start, cut, stop, epoch: stop > 0)
        return self._read_units(units, None)

    def _full_epoch_units(self, epoch: tf.Tensor, first: int, offset: int) -> tf.data.Dataset:
        """This pipeline's units of full epoch ``epoch``: its run of the epoch's ranks."""
        num_pipelines, pipeline_id = self.options.num_pipelines, self.options.pipeline_id
        order = shard_order(self.options.seed, epoch, self.num_shards)
        in_order = tf.gather(self.counts, order)
        if num_pipelines == 1:
            skip, take = tf.zeros_like(in_order), in_order
        else:
            q, r = divmod(self.total, num_pipelines)
            rank_end = tf.cumsum(in_order)
            rank_start = rank_end - in_order
            rotation = tf.math.floormod(offset + (epoch - first) * r, num_pipelines)
            ids = tf.range(num_pipelines, dtype=tf.int64)
            extra = tf.cast(tf.math.floormod(ids - rotation, num_pipelines) < r, tf.int64)
            bounds = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(q + extra)], axis=0)
            lo, hi = bounds[pipeline_id], bounds[pipeline_id + 1]
            skip = tf.clip_by_value(lo - rank_start, 0, in_order)
            take = tf.maximum(tf.minimum(hi, rank_end) - tf.maximum(lo, rank_start), 0)
        return tf.data.Dataset.from_tensor_slices(
            (order, skip, skip, skip + take, tf.fill(tf.shape(order), epoch))
        ).filter(lambda shard, start, cut, stop, epoch: stop > start)

    def _read_units(self, units: tf.data.Dataset, bits: tf.Tensor | None) -> tf.data.Dataset:
        """The ``(position, record)`` pairs of ``units``, interleaved; ``bits`` is the
        delivered bitmap of the units' epoch, or None when nothing of it was delivered."""
        # (shard, start, cut, stop, epoch) -> (path, ...): the shard cache's download-ahead
        # needs the path in the element.
        units = units.map(
            lambda shard, start, cut, stop, epoch: (
                self.path(shard),
                shard,
                start,
                cut,
                stop,
                epoch,
            )
        )
        units = self.resolved.prepare_files(units, path_index=0)
        return units.interleave(
            lambda path, shard, start, cut, stop, epoch: self._read_unit(
                shard, start, cut, stop, epoch, bits
            ),
            cycle_length=self.cycle,
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=self.options.deterministic,
        )

    def _read_unit(
        self,
        shard: tf.Tensor,
        start: tf.Tensor,
        cut: tf.Tensor,
        stop: tf.Tensor,
        epoch: tf.Tensor,
        bits: tf.Tensor | None,
    ) -> tf.data.Dataset:
        marker = self.marker.record(self.path(shard), self.records_in[shard])
        first = epoch * self.num_examples + self.bases[shard]
        # Records cut..stop-1 are all still needed: read plainly, the ones before skipped in
        # the file reader.
        plain = self._region(shard, marker, first, cut, stop)
        if bits is None:
            return plain
        epoch_start = epoch * self.num_examples

        def select(positions: tf.Tensor, records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            index = positions - epoch_start
            byte = tf.cast(tf.gather(bits, index // 8), tf.int64)
            delivered = tf.equal(
                tf.bitwise.bitwise_and(tf.bitwise.right_shift(byte, index % 8), 1), 1
            )
            # The damage marker always passes: a shard that reads short must still fail.
            keep = tf.logical_or(tf.logical_not(delivered), tf.equal(records, marker))
            return tf.boolean_mask(positions, keep), tf.boolean_mask(records, keep)

        # Records start..cut-1 mix delivered and needed ones: a bitmap lookup on blocks of
        # records (a tf.data function call per record cost about as much CPU as reading it).
        # An empty range (a shard the epoch has not taken from) opens nothing.
        masked = self._region(shard, marker, first, start, cut)
        masked = masked.batch(_FILTER_BLOCK).map(select).unbatch()
        return masked.concatenate(plain)

    def _region(
        self, shard: tf.Tensor, marker: tf.Tensor, first: tf.Tensor, lo: tf.Tensor, hi: tf.Tensor
    ) -> tf.data.Dataset:
        """Records ``lo..hi-1`` of ``shard`` with their positions (``first`` is record 0's)."""
        records = self.read_shard(
            self.path(shard), self.sizes[shard], self.records_in[shard], marker, lo, hi
        )
        return tf.data.Dataset.zip((tf.data.Dataset.range(first + lo, first + hi), records))


def exact_epoch_records(
    resolved: ResolvedSource,
    exclude: DeliveredSet,
    *,
    columns: SplitColumns,
    present: np.ndarray,
    read_shard: ReadShard,
    options: EpochStreamOptions,
    check_shards: Callable[[np.ndarray], object] | None = None,
) -> tf.data.Dataset:
    """The shuffled ``(position, serialized example)`` stream of one input pipeline.

    Args:
      resolved: the split (its shards in manifest order give the example indices).
      exclude: what was already delivered; the stream starts with the rest of its epoch.
      columns: the split's shards as columns (``SplitColumns.of(resolved)``).
      present: per shard, whether it can be read (False for a missing shard skipped under
        ``skip_corrupt``: its examples never come).
      read_shard: the reader's checked reader of records ``start..stop-1`` of one shard
        ``(path, num_bytes, num_examples, damage_record, start, stop) -> records``.
      options: the pipeline's place, epochs, shuffle and interleave.
      check_shards: called with the shards (manifest positions) this pipeline reads first,
        those of the begun epochs, to check them before the pipeline is built.

    Returns:
      A dataset of ``(int64 position, string record)``.

    Raises:
      ValueError: if nothing is left to read (``num_epochs`` already reached).
    """
    true_counts = columns.counts
    counts = true_counts * np.asarray(present, dtype=np.int64)
    partial, offset = plan_partial_epochs(
        exclude,
        true_counts,
        seed=options.seed,
        num_pipelines=options.num_pipelines,
        pipeline_id=options.pipeline_id,
        present=present,
    )
    first_full = partial[-1].epoch + 1
    end = _ENDLESS if options.num_epochs is None else options.num_epochs
    partial = [share for share in partial if share.epoch < end]
    if not partial and first_full >= end:
        raise ValueError(
            f"num_epochs={options.num_epochs} is already reached: the delivered set is at epoch "
            f"{exclude.epoch}"
        )
    if check_shards is not None:
        check_shards(
            np.unique(np.concatenate([np.empty(0, np.int32), *(s.shards for s in partial)]))
        )
    reader = _EpochReader(
        resolved,
        columns,
        counts,
        options,
        num_examples=exclude.num_examples,
        read_shard=read_shard,
    )
    bases = np.cumsum(true_counts) - true_counts
    streams = [reader.begun_epoch(share, bases, true_counts) for share in partial]
    if first_full < end:
        streams.append(reader.full_epochs(first_full, end, offset))
    return reader.joined(streams)


def exact_epoch_dataset(
    config: ReaderConfig,
    resolved: ResolvedSource,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    service: ServiceConfig | None,
    corruption_counter: CorruptionCounter | None,
) -> tf.data.Dataset:
    """``make_dataset``'s pipeline when ``config.exclude`` is set (see ``make_dataset``).

    Raises:
      ValueError: if the source has no manifest, ``exclude`` was taken on another split, or
        ``symbolic_checkpoint`` is asked of streamed shards, or ``epoch_order="permutation"``
        of the tf.data service.
    """
    exclude = config.exclude
    assert exclude is not None
    _check_exclude(exclude, resolved)
    if config.symbolic_checkpoint and resolved.streamed:
        raise ValueError(
            f"symbolic_checkpoint=True reads local shards only; {resolved.source} is streamed "
            "through the shard cache (pass symbolic_checkpoint=False)"
        )
    if config.epoch_order == "permutation" and service is not None:
        raise ValueError(
            "epoch_order='permutation' holds the split in the input graph, which the tf.data "
            "service would ship to every worker; got a service (pass epoch_order='buffer')"
        )
    if service is not None or input_context is None:
        pipeline_id, num_pipelines = 0, 1
    else:
        pipeline_id = input_context.input_pipeline_id
        num_pipelines = input_context.num_input_pipelines
    seed = config.seed if config.seed is not None else exclude.seed
    _, _, aug_seed = derive_seeds(seed, pipeline_id)
    # In-process the order is a function of seed and history; the service never keeps order.
    deterministic = True if service is None else config.is_deterministic
    decode_records = batch_decoder(make_decode_config(config, resolved))
    place = (seed, pipeline_id, num_pipelines, service is not None, deterministic)
    if config.epoch_order == "permutation":
        stream, decode = _permuted_stream(config, resolved, place, decode_records)
    else:
        stream = _buffered_records(config, resolved, place, batch_size, corruption_counter)

        def decode(pair: tuple[tf.Tensor, tf.Tensor], seeds: tf.Tensor) -> tuple[tf.Tensor, ...]:
            positions, serialized = pair
            return (*decode_records(serialized, seeds), positions)

    records = tf.data.Dataset.zip((stream, tf.data.Dataset.random(seed=aug_seed)))
    return batch_and_decode(
        records,
        decode,
        batch_size=batch_size,
        training=True,
        deterministic=deterministic,
        options=pipeline_options(config, deterministic, True, service),
        service=service,
        # A message is what a service worker holds and sends at once: bounded like its shuffle
        # (1/64 of an epoch), so neighbouring epochs overlap by little. Whole messages of 128
        # examples over a small split would hand the trainer a next epoch's examples first.
        max_examples_per_message=service_message_cap(exclude.num_examples, batch_size),
    )


def _permuted_stream(
    config: ReaderConfig,
    resolved: ResolvedSource,
    place: tuple[int, int, int, bool, bool],
    decode_records: Callable[..., tuple[Any, ...]],
) -> tuple[tf.data.Dataset, Callable[..., tuple[Any, ...]]]:
    """``epoch_order="permutation"``: the stream of positions and the decode of a batch of
    them, which gathers their records from the split held in the graph (``place`` as for
    ``_buffered_records``). Only positions go through the per-element stages.

    Raises:
      FileNotFoundError, ValueError: naming the shard, if one is missing or damaged.
    """
    exclude = config.exclude
    assert exclude is not None
    seed, pipeline_id, num_pipelines, _, _ = place
    lookup = records_lookup(load_split_records(resolved.shards))
    stream = permuted_epoch_positions(
        exclude,
        seed=seed,
        num_pipelines=num_pipelines,
        pipeline_id=pipeline_id,
        num_epochs=config.num_epochs,
    )

    def decode(positions: tf.Tensor, seeds: tf.Tensor) -> tuple[Any, ...]:
        return (*decode_records(lookup(positions), seeds), positions)

    return stream, decode


def _buffered_records(
    config: ReaderConfig,
    resolved: ResolvedSource,
    place: tuple[int, int, int, bool, bool],
    batch_size: int,
    corruption_counter: CorruptionCounter | None,
) -> tf.data.Dataset:
    """The ``(position, record)`` stream read from the shards and mixed in shuffle buffers
    (``epoch_order="buffer"``); ``place`` is ``(seed, pipeline_id, num_pipelines, on_service,
    deterministic)``.

    Raises:
      FileNotFoundError, ValueError: naming the shard, if one this pipeline reads first is
        missing or resized (every shard under ``skip_corrupt``).
    """
    exclude = config.exclude
    assert exclude is not None
    seed, pipeline_id, num_pipelines, on_service, deterministic = place
    columns = SplitColumns.of(resolved)
    check_shards = None
    if config.skip_corrupt:
        # Every pipeline must leave out the same shards, so each checks them all.
        kept, guard_missing = present_shards(resolved.shards, True, corruption_counter)
        kept_paths = {s.path for s in kept}
        present = np.array([s.path in kept_paths for s in resolved.shards], dtype=bool)
    else:
        # Nothing is left out: a missing or resized shard fails. Only the shards this pipeline
        # reads first are checked now (a stat per shard of the split cost seconds at 400 k);
        # the others are guarded as they are opened (one missing fails naming it).
        present = np.ones(len(columns.counts), dtype=bool)
        guard_missing = not columns.has_glob  # as present_shards decides it

        def check_shards(rows: np.ndarray) -> None:
            present_shards(columns.rows(rows), False, corruption_counter)

    # The kept shards' totals as one ShardFile: the reader's read-ahead and shuffle buffer are
    # functions of the totals alone (the same sizes as from every ShardFile).
    totals = (ShardFile("", int(columns.sizes[present].sum()), int(columns.counts[present].sum())),)
    reader = ShardReader.for_shards(
        config, resolved, totals, guard_missing=guard_missing, counter=corruption_counter
    )
    options = EpochStreamOptions(
        seed=seed,
        pipeline_id=pipeline_id,
        num_pipelines=num_pipelines,
        num_epochs=config.num_epochs,
        on_service=on_service,
        shuffle_buffer=record_shuffle_buffer(config, resolved, totals, batch_size),
        cycle_length=config.cycle_length or DEFAULT_CYCLE_LENGTH,
        deterministic=deterministic,
    )
    return exact_epoch_records(
        resolved,
        exclude,
        columns=columns,
        present=present,
        read_shard=reader.read_range,
        options=options,
        check_shards=check_shards,
    )


def _check_exclude(exclude: DeliveredSet, resolved: ResolvedSource) -> None:
    """Checks ``exclude`` was taken on this very split.

    Raises:
      ValueError: if the source has no manifest, or ``exclude`` was taken on another split or
        another layout of it.
    """
    if resolved.manifest is None:
        raise ValueError(
            f"exclude= needs a dataset with dataset.json (example indices come from its record "
            f"counts); {resolved.source} has none"
        )
    total = resolved.num_examples
    if exclude.num_examples != total:
        raise ValueError(
            f"exclude covers {exclude.num_examples} examples, but split {resolved.split!r} of "
            f"{resolved.source} has {total}: it was taken on another split or dataset"
        )
    # From the shard table's columns (the same value as over every entry's name and count).
    digest = manifest_split_digest(resolved.manifest.split(resolved.split).shards)
    if exclude.split is not None and exclude.split != digest:
        raise ValueError(
            f"exclude was taken on another layout of split {resolved.split!r} of "
            f"{resolved.source} (split digest {exclude.split}, this one {digest}): its indices "
            "would name other examples"
        )
