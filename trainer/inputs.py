"""What the training loop reads: per-worker ``tf.data`` pipelines built by ``tfrecord_io``.

The loop only needs the small ``Inputs`` protocol, so a test can feed it any dataset of the
same element structure; ``ReaderInputs`` is the real one, over ``tfrecord_io.make_dataset``.

Each worker builds its own pipeline, sharded by worker and batched at the per-worker size; the
loop splits that batch among the worker's local replicas. A plain per-worker iterator is a
``Trackable`` that ``tf.train.Checkpoint`` saves exactly, which the distributed iterators of
``tf.distribute`` are not.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

from trainer.config import DataConfig

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["Inputs", "ReaderInputs"]

_log = logging.getLogger(__name__)


class Inputs(Protocol):
    """The data a training run needs.

    Attributes:
      num_classes: width of the classifier.
      train_examples: examples in the train split, or None when unknown (no manifest).
      has_eval: whether there is a split to evaluate on.
      checkpointable: whether the training iterator can be saved in a checkpoint (False when
        the pipeline runs on the tf.data service).
    """

    num_classes: int
    train_examples: int | None
    has_eval: bool
    checkpointable: bool

    def train_dataset(
        self, input_context: tf.distribute.InputContext, *, with_keys: bool
    ) -> tf.data.Dataset:
        """Endless ``(images uint8, labels[, keys])`` batches at the per-worker size."""
        ...

    def eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        """One pass over the eval split, every example once, last partial batch kept."""
        ...

    def layout(self) -> dict[str, Any]:
        """What determines the order of training examples (compared on resume)."""
        ...


@dataclasses.dataclass(frozen=True)
class ReaderInputs:
    """``Inputs`` over ``tfrecord_io.make_dataset``.

    Build it with ``from_config``, which reads the manifest once.

    Attributes:
      data: where and how to read.
      global_batch_size: the global batch.
      seed: file order, record order and augmentation seed.
      num_classes: from the manifest or ``data.num_classes``.
      train_examples: from the manifest, or None.
      has_eval: whether the manifest has ``data.eval_split``.
      sharding: ``tfrecord_io`` sharding policy; ``auto`` falls back to record sharding when a
        split has fewer files than workers.
    """

    data: DataConfig
    global_batch_size: int
    seed: int
    num_classes: int
    train_examples: int | None
    has_eval: bool
    sharding: str = "auto"

    @property
    def checkpointable(self) -> bool:
        return self.data.data_service is None

    @classmethod
    def from_config(cls, data: DataConfig, *, global_batch_size: int, seed: int) -> ReaderInputs:
        """Reads the manifest (if any) and checks the data fits the run.

        Raises:
          ValueError: if the number of classes is unknown or contradicts the manifest, or the
            train split holds fewer examples than one global batch.
          KeyError: if the manifest has no train split.
          FileNotFoundError: if the source does not exist.
        """
        import tfrecord_io

        manifest = tfrecord_io.load_manifest(data.source)
        if manifest is None:
            if data.num_classes is None:
                raise ValueError(
                    f"{data.source!r} has no dataset.json, so the number of classes is unknown; "
                    "pass --num_classes"
                )
            # Resolving now turns a glob that matches nothing into an error before training.
            tfrecord_io.resolve_source(data.source, data.train_split)
            return cls(data, global_batch_size, seed, data.num_classes, None, False)
        names = manifest.label_names
        if data.num_classes is not None and data.num_classes != len(names):
            raise ValueError(
                f"num_classes={data.num_classes} contradicts {data.source!r}, whose manifest "
                f"lists {len(names)} labels"
            )
        train_examples = manifest.split(data.train_split).num_examples
        if train_examples < global_batch_size:
            raise ValueError(
                f"split {data.train_split!r} of {data.source!r} has {train_examples} examples, "
                f"fewer than one global batch of {global_batch_size}"
            )
        has_eval = data.eval_split in manifest.splits and data.eval_split != data.train_split
        if not has_eval:
            _log.warning(
                "%s has no %r split: training without validation", data.source, data.eval_split
            )
        return cls(data, global_batch_size, seed, len(names), train_examples, has_eval)

    def train_dataset(
        self, input_context: tf.distribute.InputContext, *, with_keys: bool
    ) -> tf.data.Dataset:
        import tfrecord_io

        return tfrecord_io.make_dataset(
            self.data.source,
            self.data.train_split,
            global_batch_size=self.global_batch_size,
            input_context=input_context,
            training=True,
            image_size=self.data.image_size,
            seed=self.seed,
            service=None
            if self.data.data_service is None
            else tfrecord_io.ServiceConfig(
                self.data.data_service, compression=self.data.data_service_compression
            ),
            read_config=tfrecord_io.ReadConfig(
                with_keys=with_keys, cache=self.data.cache, output="uint8", sharding=self.sharding
            ),
        )

    def eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        import tfrecord_io

        # Evaluation reads directly even under the tf.data service: it is small, and each
        # worker must see its own shard exactly once for the totals to be exact.
        return tfrecord_io.make_dataset(
            self.data.source,
            self.data.eval_split,
            global_batch_size=self.global_batch_size,
            input_context=input_context,
            training=False,
            image_size=self.data.image_size,
            read_config=tfrecord_io.ReadConfig(output="uint8", sharding=self.sharding),
        )

    def layout(self) -> dict[str, Any]:
        return {
            "source": self.data.source,
            "split": self.data.train_split,
            "image_size": self.data.image_size,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "cache": self.data.cache,
            "sharding": self.sharding,
        }
