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
import os
from typing import TYPE_CHECKING, Any, Protocol

from trainer.config import DataConfig

if TYPE_CHECKING:
    import tensorflow as tf

    from tfrecord_io.delivery import DeliveredSet

__all__ = [
    "HELD_SPLIT_BYTES",
    "INPUT_CHECKPOINT_KINDS",
    "Inputs",
    "ReaderInputs",
    "keep_recorded_kind",
]


def _largest_batch_below(examples: int) -> int:
    # A power of two: the batch sizes people pick, and they divide evenly among replicas.
    return 1 << max(examples.bit_length() - 1, 0)


_log = logging.getLogger(__name__)

# Decoded batches an explicit iterator checkpoint holds at least (the parallel decode's and the
# prefetch's buffers): measured 4-5 of 32 at 64 px, and about 8 of 64 at 112 px.
_DECODED_BATCHES_IN_FLIGHT = 4
# The largest train split the input pipeline holds in memory to read exact epochs as
# permutations (``ReadConfig(epoch_order="permutation")``): each worker's pipeline holds it
# once, as a constant of the input graph, which tf.data copies when it optimises the graph.
HELD_SPLIT_BYTES = 256 * 1024 * 1024
# The kinds of input checkpoint, as the input layout records them: positions over a split held
# in memory (KBs), symbolic over buffered reading (positions and the record shuffle buffer),
# and explicit (every buffer, decoded batches included).
INPUT_CHECKPOINT_KINDS = ("permutation", "positions", "buffers")


class Inputs(Protocol):
    """The data a training run needs: every attribute and method the loop uses.

    Inputs that only read (a test's arrays, a benchmark's pipeline) say ``exact_epochs`` False
    and ``split_digest`` None, and are never passed ``exclude`` or ``service_job_name``.

    Attributes:
      num_classes: width of the classifier.
      train_examples: examples in the train split, or None when unknown (no manifest).
      has_eval: whether there is a split to evaluate on.
      checkpointable: whether the training iterator can be saved in a checkpoint (False when
        the pipeline runs on the tf.data service).
      exact_epochs: whether ``train_dataset`` reads exact epochs: given ``exclude``, it reads
        the rest of the epoch first and each element ends with the examples' positions, so a
        run resumes at its data position on any topology (``trainer.resume``). Needs
        ``train_examples`` and ``split_digest``.
      split_digest: ``tfrecord_io.split_digest`` of the train split, or None when unknown.
    """

    @property
    def num_classes(self) -> int: ...

    @property
    def train_examples(self) -> int | None: ...

    @property
    def has_eval(self) -> bool: ...

    @property
    def checkpointable(self) -> bool: ...

    @property
    def exact_epochs(self) -> bool: ...

    @property
    def split_digest(self) -> str | None: ...

    def train_dataset(
        self,
        input_context: tf.distribute.InputContext,
        *,
        with_keys: bool,
        exclude: DeliveredSet | None = None,
        service_job_name: str | None = None,
    ) -> tf.data.Dataset:
        """Endless ``(images uint8, labels[, keys][, positions])`` batches at the per-worker
        size; positions (and ``exclude``) only with exact epochs, ``service_job_name`` only
        when the batches come from the tf.data service."""
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
        split has fewer files than workers. Not used with exact epochs.
      split_digest: ``tfrecord_io.split_digest`` of the train split, or None (no manifest).
      train_bytes: the train split's shard bytes, from the manifest, or None.
      kept_checkpoint_kind: the input checkpoint kind of the run being resumed, when this
        reader still builds it and would now choose another (``keeping_checkpoint_kind``);
        None: the kind ``input_checkpoint`` chooses.
    """

    data: DataConfig
    global_batch_size: int
    seed: int
    num_classes: int
    train_examples: int | None
    has_eval: bool
    sharding: str = "auto"
    split_digest: str | None = None
    train_bytes: int | None = None
    kept_checkpoint_kind: str | None = None

    @property
    def checkpointable(self) -> bool:
        return self.data.data_service is None

    @property
    def exact_epochs(self) -> bool:
        """Whether training reads exact epochs (``ReadConfig(exclude=...)``), so that a run
        resumes at its data position on any topology: needs the manifest's record counts, and
        no record cache."""
        return self.split_digest is not None and self.data.cache is None

    @property
    def symbolic_checkpoint(self) -> bool:
        """Whether the training iterator's checkpoints hold positions rather than buffered
        batches (``input_checkpoint`` is ``"permutation"`` or ``"positions"``, in-process)."""
        return self.checkpointable and self.input_checkpoint != "buffers"

    @property
    def input_checkpoint(self) -> str:
        """What the training iterator's checkpoints hold (one of ``INPUT_CHECKPOINT_KINDS``),
        as the in-process pipeline would have it; the layout records it whatever the service,
        so that moving a run to the tf.data service changes the layout only in ``service``.

        * ``"permutation"``: a train split of at most ``HELD_SPLIT_BYTES``, read into memory
          and each epoch a keyed permutation (``ReadConfig(epoch_order="permutation")``):
          positions only, kilobytes, and no shuffle buffer to cost throughput.
        * ``"positions"``: buffered reading checkpointed symbolically (the record shuffle
          buffer and positions): a split too large to hold but smaller than the decoded
          batches an explicit checkpoint holds, or a run that began with it
          (``keeping_checkpoint_kind``). tf.data's symbolic shuffle costs read throughput in
          proportion to its buffer (0.56x examples/s with 2,048 112-px JPEGs buffered whole).
        * ``"buffers"``: an explicit checkpoint (the shuffle buffer, the shards' read-ahead and
          several decoded batches): a larger split, ``--skip_corrupt`` (damage is skipped with
          ``ignore_errors``, which cannot be checkpointed symbolically) or a remote source.
        """
        from tfrecord_io.source import is_remote

        if self.kept_checkpoint_kind is not None:
            return self.kept_checkpoint_kind
        if not self.exact_epochs or self.data.skip_corrupt or is_remote(self.data.source):
            return "buffers"
        if self.train_bytes is None:
            return "buffers"
        if self.train_bytes <= HELD_SPLIT_BYTES:
            return "permutation"
        # Too large to hold, but smaller than the decoded batches an explicit checkpoint holds.
        decoded_batch = self.global_batch_size * self.data.image_size**2 * 3
        if self.train_bytes <= _DECODED_BATCHES_IN_FLIGHT * decoded_batch:
            return "positions"
        return "buffers"

    def can_build(self, kind: str) -> bool:
        """Whether this reader can read with input checkpoints of ``kind`` (a run's recorded
        kind from an older version of this trainer)."""
        from tfrecord_io.source import is_remote

        if kind == "buffers":
            return True
        if kind not in INPUT_CHECKPOINT_KINDS:
            return False
        local = self.exact_epochs and not self.data.skip_corrupt and not is_remote(self.data.source)
        return local and (kind == "positions" or self.train_bytes is not None)

    def keeping_checkpoint_kind(self, kind: str | None) -> ReaderInputs:
        """These inputs reading with input checkpoints of ``kind`` (the resumed run's) when
        they can and would choose another, so its iterator checkpoints restore exactly;
        otherwise unchanged (the run resumes from its delivered set)."""
        if kind is None or kind == self.input_checkpoint or not self.can_build(kind):
            return self
        return dataclasses.replace(self, kept_checkpoint_kind=kind)

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
            # First whether the source exists at all (a glob that matches nothing, a mistyped
            # path), then what it lacks.
            tfrecord_io.resolve_source(data.source, data.train_split)
            if data.num_classes is None:
                raise ValueError(
                    f"{data.source!r} has no dataset.json, so the number of classes is unknown; "
                    "pass --num_classes"
                )
            return cls(data, global_batch_size, seed, data.num_classes, None, False)
        names = manifest.label_names
        if data.num_classes is not None and data.num_classes != len(names):
            raise ValueError(
                f"num_classes={data.num_classes} contradicts {data.source!r}, whose manifest "
                f"lists {len(names)} labels"
            )
        train_examples = manifest.split(data.train_split).num_examples
        if train_examples == 0:  # no batch size fits: the dataset is the problem
            raise ValueError(
                f"split {data.train_split!r} of {data.source!r} is empty (0 examples): build "
                "the dataset again from a folder of <class name>/<image file>, or pass the "
                "--train_split that holds the examples"
            )
        if train_examples < global_batch_size:
            raise ValueError(
                f"split {data.train_split!r} of {data.source!r} has {train_examples} examples, "
                f"fewer than one global batch of {global_batch_size}; pass --global_batch_size "
                f"{_largest_batch_below(train_examples)} or less"
            )
        has_eval = data.eval_split in manifest.splits and data.eval_split != data.train_split
        if not has_eval:
            _log.warning(
                "%s has no %r split: training without validation", data.source, data.eval_split
            )
        from tfrecord_io.delivery import manifest_split_digest

        train = manifest.split(data.train_split)
        # From the shard table's columns: no Python object per shard at 400 k shards.
        digest = manifest_split_digest(train.shards)
        return cls(
            data,
            global_batch_size,
            seed,
            len(names),
            train_examples,
            has_eval,
            split_digest=digest,
            train_bytes=train.num_bytes,
        )

    def train_dataset(
        self,
        input_context: tf.distribute.InputContext,
        *,
        with_keys: bool,
        exclude: DeliveredSet | None = None,
        service_job_name: str | None = None,
    ) -> tf.data.Dataset:
        """The training batches; with ``exclude`` (exact epochs) the rest of its epoch first,
        and each element ends with the examples' positions."""
        from tfrecord_io.read_config import ReadConfig
        from tfrecord_io.reader import make_dataset
        from tfrecord_io.service.client import ServiceConfig

        service, kind = None, self.input_checkpoint
        if self.data.data_service is not None:
            kind = "buffers"
            service = ServiceConfig(
                self.data.data_service,
                job_name=service_job_name,
                compression=self.data.data_service_compression,
            )
        return make_dataset(
            self.data.source,
            self.data.train_split,
            global_batch_size=self.global_batch_size,
            input_context=input_context,
            training=True,
            image_size=self.data.image_size,
            seed=self.seed,
            read_config=ReadConfig(
                with_keys=with_keys,
                cache=self.data.cache,
                output="uint8",
                sharding=self.sharding,
                exclude=exclude,
                skip_corrupt=self.data.skip_corrupt,
                symbolic_checkpoint=exclude is not None and kind == "positions",
                epoch_order="permutation"
                if exclude is not None and kind == "permutation"
                else "buffer",
            ),
            service=service,
        )

    def eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        from tfrecord_io.read_config import ReadConfig
        from tfrecord_io.reader import make_dataset

        # Evaluation reads directly even under the tf.data service: it is small, and each
        # worker must see its own shard exactly once for the totals to be exact.
        return make_dataset(
            self.data.source,
            self.data.eval_split,
            global_batch_size=self.global_batch_size,
            input_context=input_context,
            training=False,
            image_size=self.data.image_size,
            read_config=ReadConfig(output="uint8", sharding=self.sharding),
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
            # A checkpoint of one kind does not restore into a pipeline of the other: a run
            # whose kind changed resumes from its delivered set instead.
            "input_checkpoint": self.input_checkpoint,
        }


def keep_recorded_kind(inputs: Inputs, model_dir: str) -> Inputs:
    """``inputs`` reading with the input checkpoint kind the run in ``model_dir`` recorded in
    its input layout (``checkpoints/input/layout.json``), when they can build it: a run begun
    by an earlier trainer keeps its kind, so its iterator checkpoints still restore exactly
    (``ReaderInputs.keeping_checkpoint_kind``). A new run, or inputs other than
    ``ReaderInputs``, are returned unchanged.

    Raises:
      ValueError: if the layout file is not JSON.
    """
    import json

    import tensorflow as tf

    keep = getattr(inputs, "keeping_checkpoint_kind", None)
    path = os.path.join(model_dir, "checkpoints", "input", "layout.json")
    if keep is None or not tf.io.gfile.exists(path):
        return inputs
    with tf.io.gfile.GFile(path) as f:
        recorded = json.load(f).get("input_checkpoint")
    kept: Inputs = keep(recorded if isinstance(recorded, str) else None)
    if kept is not inputs:
        _log.info("input checkpoints: %s, as the run being resumed began", recorded)
    return kept
