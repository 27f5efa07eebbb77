"""``make_dataset``: the fast, resumable ``tf.data`` reader for image TFRecord shards.

The chain is built in a fixed order (the order of tensorflow/datasets' reader):

  shard files -> shard by input pipeline -> shuffle files (per epoch, seeded) -> repeat
  -> parallel interleave of per-file readers (large read buffer, integrity check, read-ahead)
  -> [cache] -> shuffle records -> zip per-example seeds -> batch -> parse_example (vectorised)
  -> decode + crop + flip (parallel) -> [tf.data service] -> prefetch

Every step is a native ``tf.data`` op, so ``tf.train.Checkpoint(iterator=it)`` saves the
position and a restored iterator continues exactly; augmentation draws only on per-example seeds
from ``tf.data.Dataset.random``, whose state is part of that checkpoint.
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
from tfrecord_io.cache import CacheConfig
from tfrecord_io.decode import (
    DecodeConfig,
    decode_batch,
    parse_batch,
    shard_damage_record,
)
from tfrecord_io.read_config import (
    DEFAULT_READ_BUFFER_BYTES,
    SHARDING_POLICIES,
    ReadConfig,
    ReaderConfig,
)
from tfrecord_io.service.client import ServiceConfig, distribute_dataset
from tfrecord_io.source import ResolvedSource, ShardFile, is_remote, resolve_source

__all__ = [
    "DEFAULT_READ_BUFFER_BYTES",
    "SHARDING_POLICIES",
    "CorruptionCounter",
    "ReadConfig",
    "ReaderConfig",
    "make_dataset",
]

_log = logging.getLogger(__name__)

# The record shuffle buffer is sized by bytes so RAW (150 KB/record) and JPEG (30 KB/record)
# datasets hold a similar amount of memory; an iterator checkpoint stores the whole buffer.
_SHUFFLE_BUFFER_BYTES = 128 * 1024 * 1024
_MAX_SHUFFLE_BUFFER = 10_000
_FOREIGN_SHUFFLE_BUFFER = 2_048
_DEFAULT_CYCLE_LENGTH = 16
# TFRecord framing: 8-byte length, 4-byte length CRC, payload, 4-byte payload CRC.
# Each open shard reads and checks this much ahead of the interleave, in its own thread. A
# deterministic interleave takes records from its files in a fixed turn, so a file whose next
# record is not ready stalls the rest; with a read-ahead the turn is rarely kept waiting. It
# raised RAW reads from 38% to about 50% of the bytes-only rate (benchmarks/bench_reader.py).
# Iterator checkpoints hold these buffers too.
_READAHEAD_BYTES = 4 * 1024 * 1024
# What a reader of a damaged shard can do, from Python or from the trainer's command line.
SKIP_HINT = (
    "python -m dataset_tools.verify DATASET shows the damage; to read past it, "
    "ReadConfig(skip_corrupt=True) or the trainer's --skip_corrupt"
)
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


def _derive_seeds(seed: int | None, *words: int) -> tuple[int | None, int | None, int | None]:
    """Independent (file, record, augmentation) seeds from one user seed and a salt."""
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


def _file_readahead(shards: tuple[ShardFile, ...]) -> int:
    """Records each open file reads ahead of the interleave: about ``_READAHEAD_BYTES``."""
    per_record = _record_bytes(shards)
    if per_record is None:
        return _MIN_READAHEAD
    return int(min(_MAX_READAHEAD, max(_MIN_READAHEAD, _READAHEAD_BYTES // per_record)))


def _shuffle_buffer(
    config: ReaderConfig, resolved: ResolvedSource, shards: tuple[ShardFile, ...], batch_size: int
) -> int:
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


def _read_shard(
    path: tf.Tensor,
    num_bytes: tf.Tensor,
    num_examples: tf.Tensor,
    damage_record: tf.Tensor,
    *,
    read_buffer_bytes: int,
    skip_corrupt: bool,
    counter: CorruptionCounter | None,
    guard_missing: bool,
    counts_known: bool,
    readahead: int,
    resolved: ResolvedSource | None = None,
    records_range: tuple[tf.Tensor, tf.Tensor] | None = None,
) -> tf.data.Dataset:
    """Reads one shard and checks it was read whole (or the records in ``records_range``).

    TensorFlow's ``DataLossError`` does not name the file it came from, and ``tf.data`` has no
    way to catch and re-raise. So each file is read with errors ignored (a damaged TFRecord file
    ends at its first bad record), followed by an end marker that only a short read reaches:

    * With known counts and no ``skip_corrupt`` (shards this project writes): the marker is
      ``damage_record`` and the file stops at its committed count (``take``). A whole file never
      reaches the marker; a short one passes it on, and ``decode_batch`` fails naming the shard.
      Nothing runs per record, so reading costs no more than the records themselves.
    * Otherwise the marker is an empty record and a scan counts the bytes and records read,
      checking them at the file's last record or at the marker: a damaged file fails with an
      error that names the shard and what was read, or with ``skip_corrupt`` is logged, counted
      and skipped.

    Bytes after the last committed record are not read (``_present_shards`` checks local shard
    sizes when the pipeline is built; streamed shards are checked whole, size and SHA-256, by
    the shard cache). A shard the manifest says is empty is not opened.

    ``records_range`` ``(start, stop)`` reads records ``start..stop-1`` only (exact epochs read
    parts of shards). With known counts and no ``skip_corrupt`` the first ``start`` records are
    skipped inside the file reader, which reads their headers but neither copies nor checksums
    their bytes; a shard that ends before ``stop`` still reaches the marker. An empty range
    does not open the file.
    """
    fast = counts_known and not skip_corrupt
    start = tf.constant(0, tf.int64) if records_range is None else records_range[0]
    file_skip = start if fast and records_range is not None else None
    if resolved is not None and resolved.streamed:
        # Object-store shards come through the shard cache, which downloads, checks SHA-256 and
        # names the URI on failure; with skip_corrupt a failed shard reads as 0 bytes.
        records = resolved.open_records(
            path, read_buffer_bytes, skip_failed=skip_corrupt, skip=file_skip
        ).ignore_errors()
    else:
        names = tf.data.Dataset.from_tensors(path)
        if guard_missing:
            # ignore_errors retries a file that cannot be opened forever, so a missing file must
            # never reach the reader: it then reads as 0 bytes and fails (or is skipped) like any
            # damage.
            names = names.filter(lambda name: tf.size(tf.io.matching_files(name)) > 0)
        records = tf.data.TFRecordDataset(names, buffer_size=read_buffer_bytes)
        if file_skip is not None:
            records = records.skip(file_skip)
        records = records.ignore_errors()
    if fast:
        marker = tf.data.Dataset.from_tensors(damage_record)
        count = num_examples if records_range is None else records_range[1] - start
        return records.concatenate(marker).take(count).prefetch(readahead)
    # A record of our shards is never empty (an example always has features), so an empty one
    # can mark the end. The scan runs per record: about half what counting in batched blocks
    # cost (the batch and unbatch touch every record again).
    marked = records.concatenate(tf.data.Dataset.from_tensors(tf.constant("", tf.string)))

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
        if skip_corrupt:

            def report() -> tf.Tensor:
                ops = [
                    tf.print(
                        "tfrecord_io: skipped damaged, missing or unreadable shard:",
                        *details,
                        output_stream=sys.stderr,
                    )
                ]
                if counter is not None:
                    ops.append(counter.damaged_shards.assign_add(1))
                    ops.append(counter.bytes_skipped.assign_add(num_bytes - read_bytes))
                    ops.append(
                        counter.records_skipped.assign_add(
                            tf.maximum(num_examples - read_records, 0)
                        )
                    )
                with tf.control_dependencies(ops):
                    return tf.constant(True)

            done = tf.cond(damaged, report, lambda: tf.constant(True))
            with tf.control_dependencies([done]):
                record = tf.identity(record)
        else:
            check = tf.debugging.Assert(
                tf.logical_not(damaged),
                [
                    "damaged, missing or unreadable TFRecord shard (DataLossError / CRC mismatch /"
                    f" truncated / size differs from dataset.json; {SKIP_HINT}):",
                    *details,
                ],
                summarize=16,
            )
            with tf.control_dependencies([check]):
                record = tf.identity(record)
        return (read_bytes, read_records), record

    zero = tf.constant(0, tf.int64)
    checked = marked.scan((zero, zero), step)
    if counts_known:
        checked = checked.take(num_examples)
    # The end marker reaches the output: always without counts, after damage when skipping.
    checked = checked.filter(lambda record: tf.strings.length(record) > 0)
    if records_range is not None:
        # The scan checks the whole shard's bytes, so the range is cut after it.
        checked = checked.skip(start).take(records_range[1] - start)
    return checked.prefetch(readahead)


def _pipeline_shards(
    shards: tuple[ShardFile, ...],
    resolved: ResolvedSource,
    input_context: tf.distribute.InputContext | None,
    policy: str,
) -> tuple[tuple[ShardFile, ...], bool]:
    """The shard files this input pipeline reads, and whether to shard by record instead."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return shards, False
    n = input_context.num_input_pipelines
    i = input_context.input_pipeline_id
    if len(shards) >= n and policy in ("files", "auto"):
        return shards[i::n], False
    if policy == "files":
        raise ValueError(
            f"split {resolved.split!r} of {resolved.source} has {len(shards)} shard file(s) but "
            f"there are {n} input pipelines; file sharding needs at least one file per "
            f"pipeline. Write more shards (e.g. images_to_tfrecord --num_shards {n * 8}), or "
            f"pass sharding='records' (every pipeline reads every file and keeps 1/{n} of the "
            f"records)."
        )
    if policy == "auto":
        _log.warning(
            "split %r of %s has %d shard file(s) for %d input pipelines: sharding by record, so "
            "every pipeline reads every file",
            resolved.split,
            resolved.source,
            len(shards),
            n,
        )
    return shards, True


def _present_shards(
    shards: tuple[ShardFile, ...], skip_corrupt: bool, counter: CorruptionCounter | None
) -> tuple[tuple[ShardFile, ...], bool]:
    """Checks local shards exist and have their committed size; returns the shards to read and
    whether to guard in-graph.

    Local files are checked here so a missing or resized shard fails at once, naming it. Remote
    shards are
    not (one request per shard would slow start-up); the pipeline guards them as it opens them,
    which needs paths free of glob characters.
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


def _cache_path(cache: str, input_context: tf.distribute.InputContext | None) -> str:
    if cache == "memory":
        return ""
    if input_context is not None and input_context.num_input_pipelines > 1:
        return (
            f"{cache}.pipeline-{input_context.input_pipeline_id:05d}-of-"
            f"{input_context.num_input_pipelines:05d}"
        )
    return cache


def _decode_config(config: ReaderConfig, resolved: ResolvedSource) -> DecodeConfig:
    manifest = resolved.manifest
    # Adopted shards (``dataset_tools.adopt``) have a manifest but other tools' keys and images:
    # they parse leniently, decode whatever they hold, and their labels shift by the offset
    # recorded at adoption.
    adopted = manifest.options.get("adopted") if manifest is not None else None
    ours = manifest if manifest is not None and not isinstance(adopted, dict) else None
    offset = int(adopted.get("label_offset", 0)) if isinstance(adopted, dict) else 0
    return DecodeConfig(
        image_size=config.image_size,
        training=config.training,
        encoding=ours.image.encoding if ours else "auto",
        stored_size=ours.image.image_size if ours else None,
        output=config.output,
        with_keys=config.with_keys,
        strict=ours is not None,
        label_offset=config.label_offset or offset,
        num_classes=len(resolved.label_names) if resolved.label_names else None,
        jpeg_dct_method=config.jpeg_dct_method,
    )


def _options(
    config: ReaderConfig, deterministic: bool, sharded_here: bool, service: ServiceConfig | None
) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    if config.ram_budget_bytes is not None:
        options.autotune.ram_budget = config.ram_budget_bytes
    if config.threads is not None:
        options.threading.private_threadpool_size = config.threads
    # One thread per op: parallelism comes from tf.data's parallel map/interleave instead.
    options.threading.max_intra_op_parallelism = 1
    options.experimental_optimization.map_parallelization = True
    options.experimental_optimization.parallel_batch = True
    if sharded_here or service is not None:
        # This reader (or the tf.data service) already decided who reads what.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


# The output side for shards without a manifest to say what they store.
_FALLBACK_IMAGE_SIZE = 224


def _fit_image_size(
    config: ReaderConfig, requested: int | None, resolved: ResolvedSource
) -> ReaderConfig:
    """The config with the stored image size when none was asked for; logs a difference.

    Adopted shards (``dataset_tools.adopt``) keep their images as they were, of any size: like
    foreign shards they get the fallback.
    """
    if resolved.manifest is None or isinstance(resolved.manifest.options.get("adopted"), dict):
        return config
    stored = resolved.manifest.image.image_size
    if requested is None:
        return dataclasses.replace(config, image_size=stored)
    if requested != stored:
        log = _log.warning if requested > stored else _log.info
        log(
            "image_size %d differs from the %d px %s stores: every image is %s",
            requested,
            stored,
            resolved.source,
            "scaled up" if requested > stored else "resized",
        )
    return config


def make_dataset(
    source: str | os.PathLike[str],
    split: str = "train",
    *,
    global_batch_size: int,
    training: bool = True,
    image_size: int | None = None,
    seed: int | None = None,
    input_context: tf.distribute.InputContext | None = None,
    read_config: ReadConfig | None = None,
    service: str | ServiceConfig | None = None,
    shard_cache: CacheConfig | None = None,
    corruption_counter: CorruptionCounter | None = None,
) -> tf.data.Dataset:
    """Builds the input pipeline for one split of a dataset.

    The arguments almost every caller sets are keywords; everything else is a field of
    ``read_config`` (``tfrecord_io.ReadConfig``, documented there), as with tensorflow_datasets'
    ``as_dataset(read_config=...)``.

    Args:
      source: a dataset root or its ``dataset.json`` (written by the pipeline), or a glob of
        TFRecord files in TensorFlow's ImageNet key convention (``image/encoded``,
        ``image/class/label``; other keys optional).
      split: the split to read from a manifest (ignored for a glob).
      global_batch_size: the batch over all replicas; each yielded batch has the per-replica
        size ``input_context.get_per_replica_batch_size(global_batch_size)`` (the global size
        without an input context).
      training: random crops, flips and shuffling, repeating ``num_epochs`` times (forever by
        default) with full batches only. Otherwise one ordered pass, center crops, every example
        exactly once and the last partial batch kept.
      image_size: output side length; by default the side the dataset stores (``dataset.json``'s
        ``image.image_size``: RAW and centre-cropped squares, or the shorter side of JPEG/PNG),
        224 for foreign or adopted shards. A size above the stored one is logged as a warning
        (images are scaled up), any other difference at INFO.
      seed: makes file order, record order and augmentation reproducible.
      input_context: from ``tf.distribute``; shard files by ``input_pipeline_id``.
      read_config: every other reading option (``ReadConfig()``, its defaults, when None).
      service: a tf.data service dispatcher address, or a ``ServiceConfig`` (address, job name,
        compression); the pipeline up to decoded batches runs on the service's workers, which
        shard the data (``input_context`` does not shard files).
      shard_cache: the local shard cache for ``s3://`` (and emulated ``gs://``) sources; by
        default ``$TFRECORD_IO_CACHE_DIR`` (or ``~/.cache/tfrecord_io``) / a hash of the source,
        holding ``$TFRECORD_IO_CACHE_BYTES`` (default 10 GiB).
      corruption_counter: receives the counts when ``read_config.skip_corrupt`` is set.

    Returns:
      A ``tf.data.Dataset`` of ``(images, labels)`` or ``(images, labels, keys)``: images
      ``[B, image_size, image_size, 3]`` uint8 or float32, labels int32, keys string.

    Raises:
      ValueError: on a bad option (naming it), a split with fewer files than input pipelines
        under ``sharding="files"``, or a global batch not divisible by the replicas.
      FileNotFoundError: if the source matches nothing, or (without ``skip_corrupt``) a local
        shard listed in ``dataset.json`` is missing or unreadable.

    While iterating, a shard that is damaged (CRC mismatch, truncated, a size other than the
    committed one) or vanishes raises ``tf.errors.InvalidArgumentError`` naming its path, once
    the reader reaches the end of what it could read of that shard.
    """
    config = ReaderConfig(
        global_batch_size=global_batch_size,
        training=training,
        image_size=_FALLBACK_IMAGE_SIZE if image_size is None else image_size,
        seed=seed,
        read=ReadConfig() if read_config is None else read_config,
    )
    on_service = ServiceConfig(service) if isinstance(service, str) else service
    if on_service is not None and not isinstance(on_service, ServiceConfig):
        raise ValueError(
            f"service must be a dispatcher address, a tfrecord_io.ServiceConfig or None, got "
            f"{type(on_service).__name__}"
        )
    if corruption_counter is not None and not config.read.skip_corrupt:
        raise ValueError("corruption_counter is only used with skip_corrupt=True")
    if corruption_counter is not None and on_service is not None:
        raise ValueError(
            "corruption_counter cannot be used with a tf.data service: the pipeline runs in the "
            "service's workers; damage is logged there"
        )
    resolved = resolve_source(source, split, cache=shard_cache)
    config = _fit_image_size(config, image_size, resolved)
    batch_size = (
        input_context.get_per_replica_batch_size(global_batch_size)
        if input_context is not None
        else global_batch_size
    )
    if config.exclude is not None:
        from tfrecord_io.epochs import exact_epoch_dataset

        return exact_epoch_dataset(
            config,
            resolved,
            input_context=input_context,
            batch_size=batch_size,
            service=on_service,
            corruption_counter=corruption_counter,
        )
    deterministic_order = config.is_deterministic

    if on_service is not None:
        shards, by_record = resolved.shards, False
        pipeline_id, num_pipelines = 0, 1
    else:
        shards, by_record = _pipeline_shards(
            resolved.shards, resolved, input_context, config.sharding
        )
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        num_pipelines = input_context.num_input_pipelines if input_context else 1
    # With record sharding every pipeline must see the same record sequence, so the file order
    # seed is shared and interleaving is deterministic.
    file_seed, _, _ = _derive_seeds(config.seed, 0 if by_record else pipeline_id)
    _, record_seed, aug_seed = _derive_seeds(config.seed, pipeline_id)
    if by_record:
        deterministic_order = True

    shards, guard_missing = _present_shards(shards, config.skip_corrupt, corruption_counter)
    counts_known = all(s.num_examples >= 0 for s in shards)
    readahead = _file_readahead(shards)
    files = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([s.path for s in shards], tf.string),
            tf.constant([s.num_bytes for s in shards], tf.int64),
            tf.constant([s.num_examples for s in shards], tf.int64),
            tf.constant([shard_damage_record(_damage_message(s)) for s in shards], tf.string),
        )
    )
    epochs = config.num_epochs if training else (config.num_epochs or 1)
    if training:
        files = files.shuffle(
            len(shards), seed=file_seed, reshuffle_each_iteration=config.cache is None
        )
    if config.cache is None:
        files = files.repeat(epochs)
    files = resolved.prepare_files(files, path_index=0)  # download-ahead for streamed shards

    def read(
        path: tf.Tensor, num_bytes: tf.Tensor, num_examples: tf.Tensor, damage: tf.Tensor
    ) -> tf.data.Dataset:
        return _read_shard(
            path,
            num_bytes,
            num_examples,
            damage,
            read_buffer_bytes=config.read_buffer_bytes,
            skip_corrupt=config.skip_corrupt,
            counter=corruption_counter,
            guard_missing=guard_missing,
            counts_known=counts_known,
            readahead=readahead,
            resolved=resolved,
        )

    records = files.interleave(
        read,
        cycle_length=min(config.cycle_length or _DEFAULT_CYCLE_LENGTH, len(shards)),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic_order,
    )
    if by_record:
        records = records.shard(num_pipelines, pipeline_id)
    if config.cache is not None:
        records = records.cache(_cache_path(config.cache, input_context)).repeat(epochs)
    if training:
        records = records.shuffle(
            _shuffle_buffer(config, resolved, shards, batch_size),
            seed=record_seed,
            reshuffle_each_iteration=True,
        )
        records = tf.data.Dataset.zip((records, tf.data.Dataset.random(seed=aug_seed)))

    decode_config = _decode_config(config, resolved)

    def decode(serialized: tf.Tensor, seeds: tf.Tensor | None = None) -> tuple[Any, ...]:
        return decode_batch(parse_batch(serialized, decode_config), seeds, decode_config)

    return _batch_and_decode(
        records,
        decode,
        batch_size=batch_size,
        training=training,
        deterministic=deterministic_order,
        options=_options(config, deterministic_order, input_context is not None, on_service),
        service=on_service,
    )


def _batch_and_decode(
    records: tf.data.Dataset,
    decode: Any,
    *,
    batch_size: int,
    training: bool,
    deterministic: bool,
    options: tf.data.Options,
    service: ServiceConfig | None,
    max_examples_per_message: int | None = None,
) -> tf.data.Dataset:
    """The chain's tail: batch (full batches in training), decode each batch, the pipeline's
    options, [tf.data service], prefetch.

    On the tf.data service in training, the workers batch and decode ``k`` per-replica batches
    at once (``ServiceConfig.batches_per_message``) and the trainer splits each message into
    its ``k`` batches: slices of the received tensors, not copies. The examples, their order
    and their augmentation are the same (each example's seed comes with it); only the trainer's
    cost per message is shared by more examples. ``max_examples_per_message`` caps ``k``
    (never below one batch): exact epochs keep what a worker holds in flight well under an
    epoch.
    """
    per_message = 1 if service is None else service.batches_per_message(batch_size, training)
    if max_examples_per_message is not None:
        per_message = max(1, min(per_message, max_examples_per_message // batch_size))
    # A worker's last message may be short; the trainer keeps its whole batches, so a worker's
    # stream ends, as before, with fewer than batch_size examples dropped.
    batches = records.batch(batch_size * per_message, drop_remainder=training and per_message == 1)
    batches = batches.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    batches = batches.with_options(options)
    if service is not None:
        batches = distribute_dataset(
            batches,
            service=service.service,
            training=training,
            job_name=service.job_name,
            compression=service.compression,
            max_outstanding_requests=service.max_outstanding_requests,
        )
    if per_message > 1:
        batches = batches.flat_map(lambda *parts: _split_message(parts, batch_size))
    return batches.prefetch(tf.data.AUTOTUNE)


def _split_message(parts: tuple[tf.Tensor, ...], batch_size: int) -> tf.data.Dataset:
    """The whole batches of ``batch_size`` in one message; the examples of a short last
    message beyond its whole batches are dropped.

    Nothing is copied: a full message's slice is the identity, the reshape a view, and
    ``from_tensor_slices`` hands out aligned slices of its tensors as they are (TensorFlow
    copies a slice only when it is not aligned: a few label bytes at most).
    """
    whole = tf.shape(parts[0])[0] // batch_size * batch_size
    return tf.data.Dataset.from_tensor_slices(
        tuple(tf.reshape(part[:whole], [-1, batch_size, *part.shape[1:]]) for part in parts)
    )
