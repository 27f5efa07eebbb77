"""Records into decoded per-replica batches: the tail both of the reader's pipelines share.

``make_dataset`` (``tfrecord_io.reader``) and its exact-epoch pipeline (``tfrecord_io.epochs``)
end the same way: batch, parse and decode each batch (``batch_decoder`` with
``make_decode_config``), set the pipeline's ``tf.data`` options (``pipeline_options``), run on the
tf.data service if asked, prefetch (``batch_and_decode``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tfrecord_io.decode import DecodeConfig, decode_batch, parse_batch
from tfrecord_io.read_config import ReaderConfig
from tfrecord_io.service.client import ServiceConfig, distribute_dataset, split_message
from tfrecord_io.source import ResolvedSource

__all__ = ["batch_and_decode", "batch_decoder", "make_decode_config", "pipeline_options"]


def make_decode_config(config: ReaderConfig, resolved: ResolvedSource) -> DecodeConfig:
    """How the batches of ``resolved`` are parsed and decoded under ``config``."""
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


def batch_decoder(decode_config: DecodeConfig) -> Callable[..., tuple[Any, ...]]:
    """The function that parses and decodes one batch of serialized examples:
    ``(serialized, seeds=None) -> (images, labels[, keys])``, seeds only in training."""

    def decode(serialized: tf.Tensor, seeds: tf.Tensor | None = None) -> tuple[Any, ...]:
        return decode_batch(parse_batch(serialized, decode_config), seeds, decode_config)

    return decode


def pipeline_options(
    config: ReaderConfig, deterministic: bool, sharded_here: bool, service: ServiceConfig | None
) -> tf.data.Options:
    """The ``tf.data.Options`` of a reader pipeline.

    Args:
      config: the reader's configuration (threads, RAM budget, symbolic checkpointing).
      deterministic: whether the pipeline keeps its order.
      sharded_here: whether the reader itself shards the data among input pipelines.
      service: the tf.data service the pipeline runs on, or None.
    """
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
    if config.read.checkpoints_positions:
        # Checkpoints hold positions; what the decode and prefetch buffered is recomputed.
        options.experimental_symbolic_checkpoint = True
    if sharded_here or service is not None:
        # This reader (or the tf.data service) already decided who reads what.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def batch_and_decode(
    records: tf.data.Dataset,
    decode: Callable[..., tuple[Any, ...]],
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
        batches = batches.flat_map(lambda *parts: split_message(parts, batch_size))
    return batches.prefetch(tf.data.AUTOTUNE)
