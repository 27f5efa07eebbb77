"""``make_dataset``: the fast, resumable ``tf.data`` reader for image TFRecord shards.

The chain is built in a fixed order (the order of tensorflow/datasets' reader):

  shard files -> shard by input pipeline -> shuffle files (per epoch, seeded) -> repeat
  -> parallel interleave of per-file readers (large read buffer, integrity check, read-ahead)
  -> [cache] -> shuffle records -> zip per-example seeds -> batch -> parse_example (vectorised)
  -> decode + crop + flip (parallel) -> [tf.data service] -> prefetch

Every step is a native ``tf.data`` op, so ``tf.train.Checkpoint(iterator=it)`` saves the
position and a restored iterator continues exactly; augmentation draws only on per-example seeds
from ``tf.data.Dataset.random``, whose state is part of that checkpoint.

Reading one shard is ``tfrecord_io.shard_reading``, the batching and decoding tail is
``tfrecord_io.batching``; with ``ReadConfig(exclude=...)`` the records come from
``tfrecord_io.epochs`` instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import tensorflow as tf

from tfrecord_io.batching import (
    batch_and_decode,
    batch_decoder,
    make_decode_config,
    pipeline_options,
)
from tfrecord_io.cache import CacheConfig
from tfrecord_io.epochs import exact_epoch_dataset
from tfrecord_io.read_config import ReadConfig, ReaderConfig
from tfrecord_io.service.client import ServiceConfig
from tfrecord_io.shard_reading import (
    DEFAULT_CYCLE_LENGTH,
    CorruptionCounter,
    ShardReader,
    damage_records,
    derive_seeds,
    present_shards,
    record_shuffle_buffer,
)
from tfrecord_io.source import ResolvedSource, ShardFile, resolve_source

__all__ = ["make_dataset"]

_log = logging.getLogger(__name__)

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


# Built with AutoGraph off: none of the pipeline's functions branches or loops in Python on a
# tensor, and AutoGraph's rewrite of their source cost about 1.2 CPU-s at every start (a
# trainer's, each worker's and each restart's). Every map and filter traced while this runs
# is left as written, as Keras 3 leaves its train step.
@tf.autograph.experimental.do_not_convert
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
      tf.errors.InvalidArgumentError: while iterating, naming the shard, once the reader reaches
        the end of what it could read of a shard that is damaged (CRC mismatch, truncated, a
        size other than the committed one) or vanishes.
    """
    config = ReaderConfig(
        global_batch_size=global_batch_size,
        training=training,
        image_size=_FALLBACK_IMAGE_SIZE if image_size is None else image_size,
        seed=seed,
        read=ReadConfig() if read_config is None else read_config,
    )
    on_service = _service_config(service, config, corruption_counter)
    resolved = resolve_source(source, split, cache=shard_cache)
    config = _fit_image_size(config, image_size, resolved)
    batch_size = _per_replica(global_batch_size, input_context)
    pipeline = exact_epoch_dataset if config.exclude is not None else _shard_pipeline
    return pipeline(
        config,
        resolved,
        input_context=input_context,
        batch_size=batch_size,
        service=on_service,
        corruption_counter=corruption_counter,
    )


def _per_replica(global_batch_size: int, input_context: tf.distribute.InputContext | None) -> int:
    """The batch each replica gets (the global batch without an input context).

    Raises:
      ValueError: if the global batch does not divide among the replicas.
    """
    if input_context is None:
        return global_batch_size
    return input_context.get_per_replica_batch_size(global_batch_size)


def _service_config(
    service: str | ServiceConfig | None, config: ReaderConfig, counter: CorruptionCounter | None
) -> ServiceConfig | None:
    """``make_dataset``'s ``service`` as a ``ServiceConfig`` (None: no service).

    Raises:
      ValueError: if ``service`` is neither an address, a ``ServiceConfig`` nor None, or a
        corruption ``counter`` is given where it would count nothing (without ``skip_corrupt``,
        or on a service).
    """
    on_service = ServiceConfig(service) if isinstance(service, str) else service
    if on_service is not None and not isinstance(on_service, ServiceConfig):
        raise ValueError(
            f"service must be a dispatcher address, a tfrecord_io.ServiceConfig or None, got "
            f"{type(on_service).__name__}"
        )
    if counter is not None and not config.read.skip_corrupt:
        raise ValueError("corruption_counter is only used with skip_corrupt=True")
    if counter is not None and on_service is not None:
        raise ValueError(
            "corruption_counter cannot be used with a tf.data service: the pipeline runs in the "
            "service's workers; damage is logged there"
        )
    return on_service


def _shard_pipeline(
    config: ReaderConfig,
    resolved: ResolvedSource,
    *,
    input_context: tf.distribute.InputContext | None,
    batch_size: int,
    service: ServiceConfig | None,
    corruption_counter: CorruptionCounter | None,
) -> tf.data.Dataset:
    """``make_dataset``'s pipeline without ``exclude``: shard files, shuffled and repeated
    whole, interleaved into records, then batched and decoded."""
    training = config.training
    deterministic_order = config.is_deterministic
    if service is not None:
        shards, by_record = resolved.shards, False
        pipeline_id, num_pipelines = 0, 1
    else:
        shards, by_record = _pipeline_shards(resolved, input_context, config.sharding)
        pipeline_id = input_context.input_pipeline_id if input_context else 0
        num_pipelines = input_context.num_input_pipelines if input_context else 1
    # With record sharding every pipeline must see the same record sequence, so the file order
    # seed is shared and interleaving is deterministic.
    file_seed, _, _ = derive_seeds(config.seed, 0 if by_record else pipeline_id)
    _, record_seed, aug_seed = derive_seeds(config.seed, pipeline_id)
    if by_record:
        deterministic_order = True

    shards, guard_missing = present_shards(shards, config.skip_corrupt, corruption_counter)
    reader = ShardReader.for_shards(
        config, resolved, shards, guard_missing=guard_missing, counter=corruption_counter
    )
    epochs = config.num_epochs if training else (config.num_epochs or 1)
    records = _shard_files(config, resolved, shards, file_seed, epochs).interleave(
        reader.read,
        cycle_length=min(config.cycle_length or DEFAULT_CYCLE_LENGTH, len(shards)),
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
            record_shuffle_buffer(config, resolved, shards, batch_size),
            seed=record_seed,
            reshuffle_each_iteration=True,
        )
        records = tf.data.Dataset.zip((records, tf.data.Dataset.random(seed=aug_seed)))
    return batch_and_decode(
        records,
        batch_decoder(make_decode_config(config, resolved)),
        batch_size=batch_size,
        training=training,
        deterministic=deterministic_order,
        options=pipeline_options(config, deterministic_order, input_context is not None, service),
        service=service,
    )


def _shard_files(
    config: ReaderConfig,
    resolved: ResolvedSource,
    shards: tuple[ShardFile, ...],
    seed: int | None,
    epochs: int | None,
) -> tf.data.Dataset:
    """The ``(path, num_bytes, num_examples, damage record)`` of each shard to read, shuffled
    with ``seed`` in training, repeated ``epochs`` times (unless records are cached), with the
    shard cache's download-ahead for streamed shards."""
    files = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([s.path for s in shards], tf.string),
            tf.constant([s.num_bytes for s in shards], tf.int64),
            tf.constant([s.num_examples for s in shards], tf.int64),
            tf.constant(damage_records(shards), tf.string),
        )
    )
    if config.training:
        files = files.shuffle(len(shards), seed=seed, reshuffle_each_iteration=config.cache is None)
    if config.cache is None:
        files = files.repeat(epochs)
    return resolved.prepare_files(files, path_index=0)  # download-ahead for streamed shards


def _pipeline_shards(
    resolved: ResolvedSource,
    input_context: tf.distribute.InputContext | None,
    policy: str,
) -> tuple[tuple[ShardFile, ...], bool]:
    """The shard files this input pipeline reads, and whether to shard by record instead.

    With file sharding only this pipeline's share of the entries is built (``shard_files``), so
    a host of many reads a few columns of a large shard table and holds its own shards alone.
    """
    if input_context is None or input_context.num_input_pipelines == 1:
        return resolved.shards, False
    n = input_context.num_input_pipelines
    i = input_context.input_pipeline_id
    shards = resolved.shard_files
    if len(shards) >= n and policy in ("files", "auto"):
        return tuple(shards[i::n]), False
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
    return resolved.shards, True


def _cache_path(cache: str, input_context: tf.distribute.InputContext | None) -> str:
    """The ``Dataset.cache`` file of this input pipeline ("" keeps the records in memory)."""
    if cache == "memory":
        return ""
    if input_context is not None and input_context.num_input_pipelines > 1:
        return (
            f"{cache}.pipeline-{input_context.input_pipeline_id:05d}-of-"
            f"{input_context.num_input_pipelines:05d}"
        )
    return cache
