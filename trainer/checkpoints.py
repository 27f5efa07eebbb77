"""Checkpoints that resume at the exact data position, on one worker or many.

Layout under ``MODEL_DIR/checkpoints``::

    ckpt-<step>.index / .data-*          model, optimiser, step         (written by the chief)
    input/layout.json                    what fixes the example order   (written by the chief)
    input/worker-<k>/ckpt-<step>.*       worker k's input iterator      (written by worker k)

The model state is the same on every worker, so only the chief keeps it; the other workers still
take part in saving (synchronous strategies need every worker in the save), into a temporary
directory they delete right after, as in TensorFlow's multi-worker guide. The input position is
different on every worker, so each worker keeps its own iterator checkpoint, numbered by step.
A restore pairs the chief's latest model checkpoint at step N with each worker's
``input/worker-<k>/ckpt-N``; the iterator is saved before the model, so a model checkpoint never
exists without its input positions. ``MODEL_DIR`` must be on storage every worker can read, as
for any multi-worker checkpoint.

With exact epochs (the project's reader over a dataset with ``dataset.json``) the model
checkpoint also holds the delivered set (``tfrecord_io.DeliveryTracker``), and
``trainer.resume.plan_resume`` decides, before the pipelines are built, whether the iterators
are restored (same layout) or the pipelines start from the delivered set (any other layout,
the tf.data service). ``input/origin-<digest>.bin`` keeps the delivered set each run of
pipelines started from.

Otherwise (foreign shards, a record cache), when the input cannot be saved (tf.data service)
or the layout changed (other workers, batch, seed, data), the model, optimiser and step are
restored and the data position restarts, with a warning saying so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf

    from tfrecord_io.delivery import DeliveryTracker
    from trainer.resume import ResumePlan
    from trainer.strategy import Distribution

__all__ = ["Checkpointer", "RestoreResult"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RestoreResult:
    """What a restore found.

    Attributes:
      step: the step training continues from (0 for a fresh run).
      checkpoint: the model checkpoint restored, or None.
      input_restored: whether this worker's data position was restored (as an iterator
        position, or with exact epochs as the delivered set).
      reason: why the data position was not restored exactly, if it was not.
      kind: ``trainer.resume.KINDS`` with exact epochs, else ``"legacy"``.
    """

    step: int
    checkpoint: str | None
    input_restored: bool
    reason: str | None = None
    kind: str = "legacy"


class Checkpointer:
    """Saves and restores a run's model, optimiser, step and per-worker input position.

    Args:
      model_dir: the run directory.
      distribution: which worker this is and whether it is the chief.
      model, optimizer: the Keras objects (built, so their variables exist).
      step: an int64 ``tf.Variable`` holding the number of completed steps.
      iterator: this worker's plain ``tf.data`` iterator, or None when it cannot be saved.
      input_layout: what determines the example order; a resume with a different layout
        restarts the data position instead of restoring a meaningless one.
      keep: checkpoints to keep.
      delivery: with exact epochs, the delivered set, saved with the model.
    """

    def __init__(
        self,
        model_dir: str,
        distribution: Distribution,
        *,
        model: Any,
        optimizer: Any,
        step: tf.Variable,
        iterator: Any | None,
        input_layout: dict[str, Any],
        keep: int = 3,
        delivery: DeliveryTracker | None = None,
    ) -> None:
        import tensorflow as tf

        self._dist = distribution
        self._step = step
        self._iterator = iterator
        self.directory = os.path.join(model_dir, "checkpoints")
        self._input_root = os.path.join(self.directory, "input")
        self._layout_path = os.path.join(self._input_root, "layout.json")
        self._layout = {**input_layout, "num_workers": distribution.num_workers}
        # Restores read model, optimiser and step only: ``plan_resume`` has read the delivered
        # set already, and a checkpoint written before exact epochs has none.
        self._restore_ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
        self._trained = {"model": model, "optimizer": optimizer, "step": step}
        if delivery is None:
            self._model_ckpt = self._restore_ckpt
        else:
            self._model_ckpt = tf.train.Checkpoint(
                model=model, optimizer=optimizer, step=step, delivered=delivery
            )
        if distribution.is_chief:
            self._write_dir = self.directory
        else:
            self._write_dir = os.path.join(
                self.directory, f".tmp-worker-{distribution.worker_index:05d}"
            )
        self._model_manager = tf.train.CheckpointManager(
            self._model_ckpt, self._write_dir, max_to_keep=keep
        )
        self.input_directory = os.path.join(
            self._input_root, f"worker-{distribution.worker_index:05d}"
        )
        self._input_manager = None
        if iterator is not None:
            self._input_ckpt = tf.train.Checkpoint(iterator=iterator, step=step)
            # Keep more input checkpoints than model ones, so every kept model checkpoint
            # still has its input positions.
            self._input_manager = tf.train.CheckpointManager(
                self._input_ckpt, self.input_directory, max_to_keep=keep + 1
            )

    def _read_layout(self) -> dict[str, Any] | None:
        import tensorflow as tf

        if not tf.io.gfile.exists(self._layout_path):
            return None
        with tf.io.gfile.GFile(self._layout_path) as f:
            return json.load(f)

    def _write_layout(self) -> None:
        import tensorflow as tf

        if not self._dist.is_chief:
            return
        tf.io.gfile.makedirs(self._input_root)
        tmp = self._layout_path + ".tmp"
        with tf.io.gfile.GFile(tmp, "w") as f:
            json.dump(self._layout, f, indent=2, sort_keys=True)
        tf.io.gfile.rename(tmp, self._layout_path, overwrite=True)

    def _model_restore_checkpoint(self, latest: str) -> tf.train.Checkpoint:
        """What restores ``latest``: model, optimiser and step, and a delivered set if it
        holds one.

        ``plan_resume`` has read the delivered set already (the pipelines are built from it,
        before the model exists). It is read again here into a copy the run does not use, so
        that the restore accounts for every value the checkpoint holds: TensorFlow warns, as a
        restore is collected, of each saved value it left behind.
        """
        import tensorflow as tf

        if not any(name.startswith("delivered/") for name, _ in tf.train.list_variables(latest)):
            return self._restore_ckpt
        from tfrecord_io.delivery import DeliveredSet, DeliveryTracker

        copy = DeliveryTracker(DeliveredSet.empty(1))
        return tf.train.Checkpoint(**self._trained, delivered=copy)

    def _restore_model(self, latest: str) -> int:
        import tensorflow as tf

        try:
            checkpoint = self._model_restore_checkpoint(latest)
            checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise ValueError(
                f"checkpoint {latest} does not fit this model (was it written with another "
                f"--model, --image_size or number of classes?): {e}"
            ) from e
        return int(self._step.numpy())

    def _restore_iterator(self, step: int) -> str:
        import tensorflow as tf

        input_path = os.path.join(self.input_directory, f"ckpt-{step}")
        try:
            self._input_ckpt.restore(input_path).assert_consumed()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise RuntimeError(
                f"cannot restore the input position from {input_path}: {e}. Delete "
                f"{self.input_directory} to resume with a fresh data order."
            ) from e
        if int(self._step.numpy()) != step:
            raise RuntimeError(
                f"input checkpoint {input_path} holds step {int(self._step.numpy())}, "
                f"expected {step}"
            )
        return input_path

    def restore_or_create(self, plan: ResumePlan | None = None) -> RestoreResult:
        """Restores the latest checkpoint, or starts fresh when there is none.

        Args:
          plan: with exact epochs, ``trainer.resume.plan_resume``'s decision (it restored the
            delivered set already); None otherwise.

        Returns:
          The step to continue from and whether the data position was restored.

        Raises:
          ValueError: if the checkpoint does not fit the model (another ``--model``,
            ``--image_size`` or number of classes), naming the checkpoint.
          RuntimeError: if this worker's input checkpoint exists but cannot be restored.
        """
        import tensorflow as tf

        if plan is not None:
            if plan.checkpoint is None:
                return RestoreResult(0, None, True, kind=plan.kind)
            step = self._restore_model(plan.checkpoint)
            if step != plan.step:
                raise RuntimeError(f"{plan.checkpoint} holds step {step}, expected {plan.step}")
            if plan.kind == "exact" and self._iterator is not None:
                input_path = self._restore_iterator(step)
                _log.info(
                    "restored %s and input position %s at step %d",
                    plan.checkpoint,
                    input_path,
                    step,
                )
            return RestoreResult(
                step, plan.checkpoint, plan.kind != "restart", plan.reason, kind=plan.kind
            )
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            self._write_layout()
            return RestoreResult(0, None, self._iterator is not None)
        step = self._restore_model(latest)
        if self._iterator is None:
            reason = "the input pipeline runs on the tf.data service, whose position is not saved"
            _log.warning(
                "restored %s at step %d; %s, so the data position restarts",
                latest,
                step,
                reason,
            )
            return RestoreResult(step, latest, False, reason)
        saved_layout = self._read_layout()
        if saved_layout != self._layout:
            reason = f"the input layout changed from {saved_layout} to {self._layout}"
            _log.warning(
                "restored %s at step %d; %s, so the data position restarts", latest, step, reason
            )
            self._write_layout()
            return RestoreResult(step, latest, False, reason)
        input_path = os.path.join(self.input_directory, f"ckpt-{step}")
        if not tf.io.gfile.exists(input_path + ".index"):
            reason = f"no input checkpoint {input_path} for worker {self._dist.worker_index}"
            _log.warning(
                "restored %s at step %d; %s, so the data position restarts", latest, step, reason
            )
            return RestoreResult(step, latest, False, reason)
        self._restore_iterator(step)
        _log.info("restored %s and input position %s at step %d", latest, input_path, step)
        return RestoreResult(step, latest, True)

    def save(self, step: int) -> str | None:
        """Saves at ``step`` (every worker must call this at the same step).

        Returns:
          The model checkpoint path on the chief, None on other workers.
        """
        import tensorflow as tf

        self._step.assign(step)
        if self._input_manager is not None:
            self._input_manager.save(checkpoint_number=step)
        path = self._model_manager.save(checkpoint_number=step)
        if not self._dist.is_chief:
            tf.io.gfile.rmtree(self._write_dir)
            return None
        return path
