"""Exact data resume for Keras ``model.fit``: ``ExactEpochs``, a callback that owns the data.

Keras' ``BackupAndRestore`` and ``ModelCheckpoint`` save the model, not the data position: a
resumed ``fit`` restarts the interrupted epoch from its first batch, so the examples already
trained on in that epoch come again and others are never reached in time. ``ExactEpochs``
keeps the *delivered set* (``tfrecord_io.DeliveryTracker``: which examples of the current
epoch were trained on) beside those checkpoints and builds the training dataset from it, so a
resumed ``fit`` reads only the rest of the epoch::

    exact = ExactEpochs("runs/a/delivered", checkpoint="runs/a/backup/latest.weights.h5",
                        source="out/dataset", global_batch_size=64, seed=0, save_freq=100)
    model.fit(exact.dataset(), epochs=10, steps_per_epoch=exact.steps_per_epoch,
              callbacks=[exact, keras.callbacks.BackupAndRestore("runs/a/backup", save_freq=100)])

How it knows what was trained on: the reader (``make_dataset(..., exclude=delivered)``) gives
every batch its examples' positions; ``dataset()`` numbers the batches and records each one's
positions as it is produced, then hands Keras ``(images, labels)``. Keras consumes batches in
order, so after ``k`` trained batches the first ``k`` are the trained ones, whatever Keras'
prefetching produced beyond them. The reader's order is fixed by the seed, so a batch number
names the same examples in every iterator Keras makes of the dataset.

How the delivered set pairs with the model checkpoint: put ``ExactEpochs`` *before* the
checkpoint callback, with the same ``save_freq``. It writes ``delivered-<batches>.bin`` just
before the checkpoint is written; a restore takes the newest one not newer than
``checkpoint`` (a crash between the two leaves a newer delivered set, which is skipped).

Keras counts epochs in steps: after a mid-epoch resume its first epoch finishes the data epoch
and runs on into the next. The delivered set, not Keras' epoch number, says where the data is.
On several workers (``MultiWorkerMirroredStrategy``) give ``strategy=`` and call
``attach(model)`` after ``compile``: Keras 3.15's ``fit`` fails there without it
(keras-team/keras#20585, docs/training.md), and the train step it installs gathers every
worker's positions, so each worker records the global batch. Each worker keeps its own
directory (``BackupAndRestore`` writes one per worker). The trainer's own loop
(``trainer.fit``) needs none of this and resumes on another number of workers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import keras
import numpy as np

if TYPE_CHECKING:
    import tensorflow as tf

    from tfrecord_io.read_config import ReadConfig

__all__ = ["POSITIONS", "ExactEpochs", "gathering_train_step"]

_log = logging.getLogger(__name__)
_FILE = re.compile(r"^delivered-(\d+)\.bin$")
POSITIONS = "exact_epochs_positions"  # the train step's log of the global batch's positions


def _multi_worker(strategy: Any) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def gathering_train_step(
    train_step: Callable[[Any], dict[str, Any]], *, replicas: int, replica_batch: int
) -> Callable[[Any], dict[str, Any]]:
    """Wraps a Keras ``train_step`` for ``(images, labels, positions)`` batches.

    The wrapped step trains on ``(images, labels)`` and adds to its logs ``POSITIONS``: the
    positions of every replica's batch, gathered, so that each worker sees the global batch.
    Its metrics come out of a ``[1]`` shape and the positions out of ``[1, n]``: Keras 3.15
    reduces train-step outputs across workers with ``strategy.reduce("MEAN", value, axis=0)``,
    which fails on a scalar; the mean over that axis gives the scalar back, and the same
    gathered positions, identical on every replica.

    Args:
      train_step: the model's own ``train_step``.
      replicas: replicas in sync over all workers.
      replica_batch: examples in each replica's batch.
    """
    import tensorflow as tf

    def step(data: Any) -> dict[str, Any]:
        images, labels, positions = data
        logs = train_step((images, labels))
        context = tf.distribute.get_replica_context()
        # A gather as a sum over replica slots, as trainer/steps.py does: all_gather fails
        # under the multi-worker strategy. float64 holds positions exactly below 2**53.
        slots = tf.scatter_nd(
            [[context.replica_id_in_sync_group]],
            [tf.cast(positions, tf.float64)],
            [replicas, replica_batch],
        )
        gathered = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.reshape(slots, [-1]))
        out = {name: tf.reshape(value, [1]) for name, value in logs.items()}
        out[POSITIONS] = gathered[tf.newaxis]
        return out

    return step


class ExactEpochs(keras.callbacks.Callback):
    """Records the delivered set with each checkpoint and resumes the reader from it.

    Args:
      directory: where the delivered sets go (one small file per save, ``keep`` kept).
      source, split: the dataset (``dataset.json`` is needed: exact epochs count examples).
      global_batch_size, seed, image_size: as ``tfrecord_io.make_dataset``; the seed fixes
        the order, so keep it across resumes.
      checkpoint: the model checkpoint file a resumed ``fit`` restores
        (``BACKUP_DIR/latest.weights.h5`` for ``BackupAndRestore``); None restores the newest
        delivered set.
      save_freq: ``"epoch"`` or every N batches: the checkpoint callback's own.
      read_config: other reading options (``exclude`` is set here).
      audit: a file to which each trained batch's positions are appended, one line per batch.
      keep: delivered sets kept.
      strategy: a ``tf.distribute.MultiWorkerMirroredStrategy`` to train on several workers
        (then call ``attach(model)`` before ``fit``); None on one worker.

    Raises:
      ValueError: if the dataset has no ``dataset.json``, the delivered set on disk is of
        another split, ``checkpoint`` exists but no delivered set kept is as old as it, or an
        argument is out of range.
    """

    def __init__(
        self,
        directory: str,
        *,
        source: str,
        global_batch_size: int,
        split: str = "train",
        seed: int = 0,
        image_size: int | None = None,
        checkpoint: str | None = None,
        save_freq: int | str = "epoch",
        read_config: ReadConfig | None = None,
        audit: str | None = None,
        keep: int = 3,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        super().__init__()
        from tfrecord_io.delivery import DeliveredSet, DeliveryTracker, manifest_split_digest
        from tfrecord_io.source import load_manifest

        if save_freq != "epoch" and (not isinstance(save_freq, int) or save_freq < 1):
            raise ValueError(f"save_freq must be 'epoch' or an int >= 1, got {save_freq!r}")
        manifest = load_manifest(source)
        if manifest is None:
            raise ValueError(f"{source!r} has no dataset.json: exact epochs need its counts")
        info = manifest.split(split)
        self._empty = DeliveredSet.empty(
            info.num_examples, seed=seed, split=manifest_split_digest(info.shards)
        )
        self.directory, self.source, self.split = directory, source, split
        self.global_batch_size, self.seed, self.image_size = global_batch_size, seed, image_size
        self.save_freq, self._keep, self._audit = save_freq, keep, audit
        self._read_config = read_config
        self._strategy = strategy if _multi_worker(strategy) else None
        self.steps_per_epoch = max(1, self._empty.num_examples // global_batch_size)
        origin, self.restored_from, self.batches = self._restore(checkpoint)
        self.origin = origin
        self.tracker = DeliveryTracker(origin)
        self._produced: dict[int, Any] = {}
        self._trained = 0  # batches of this fit

    def _restore(self, checkpoint: str | None) -> tuple[Any, str | None, int]:
        """The delivered set to start from, the file it came from, and its batch count."""
        from tfrecord_io.delivery import DeliveredSet

        saved = self._saved()
        if checkpoint is not None:
            if not os.path.exists(checkpoint):
                return self._empty, None, 0
            limit = os.stat(checkpoint).st_mtime_ns
            saved = [(n, path) for n, path in saved if os.stat(path).st_mtime_ns <= limit]
            if not saved:
                # Starting the epoch over would train some examples twice: refuse instead.
                raise ValueError(
                    f"no delivered set in {self.directory!r} is as old as the checkpoint "
                    f"{checkpoint!r}: keep more of them (keep=, now {self._keep}) or restore "
                    "a newer checkpoint"
                )
        if not saved:
            return self._empty, None, 0
        batches, path = saved[-1]
        with open(path, "rb") as f:
            value, _ = DeliveredSet.from_bytes(f.read())
        if value.split != self._empty.split or value.num_examples != self._empty.num_examples:
            raise ValueError(
                f"{path} is a delivered set of another split ({value.num_examples} examples, "
                f"digest {value.split}); give ExactEpochs a directory of its own per dataset"
            )
        _log.info(
            "exact epochs: resuming from %s: epoch %d, %d of %d examples remain",
            path,
            value.epoch,
            value.remaining,
            value.num_examples,
        )
        return value, path, batches

    def _saved(self) -> list[tuple[int, str]]:
        if not os.path.isdir(self.directory):
            return []
        found = [(_FILE.match(name), name) for name in os.listdir(self.directory)]
        return sorted(
            (int(m.group(1)), os.path.join(self.directory, name)) for m, name in found if m
        )

    def dataset(self) -> tf.data.Dataset | tf.distribute.DistributedDataset:
        """Endless ``(images, labels)`` batches from the restored position: the rest of its
        epoch, then whole epochs, each example once per epoch.

        On several workers, a distributed dataset of ``(images, labels, positions)``: each
        worker reads its own part of every global batch, and the train step ``attach`` gives
        the model takes the positions out.
        """
        import tensorflow as tf

        from tfrecord_io.read_config import ReadConfig

        read = dataclasses.replace(self._read_config or ReadConfig(), exclude=self.origin)
        if self._strategy is not None:
            return self._distributed_dataset(read)
        batches = self._batches(read)

        def record(number: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
            self._produced[int(number)] = positions.numpy()
            return number

        def tap(number: tf.Tensor, element: tuple[tf.Tensor, ...]) -> tuple[tf.Tensor, ...]:
            images, labels, positions = element[0], element[1], element[-1]
            done = tf.py_function(record, [number, positions], Tout=tf.int64)
            with tf.control_dependencies([done]):
                return tf.identity(images), tf.identity(labels)

        return batches.enumerate().map(tf.autograph.experimental.do_not_convert(tap))

    def _batches(
        self, read: ReadConfig, context: tf.distribute.InputContext | None = None
    ) -> tf.data.Dataset:
        """The reader's batches of the split (one worker's share under ``context``)."""
        from tfrecord_io.reader import make_dataset

        return make_dataset(
            self.source,
            self.split,
            global_batch_size=self.global_batch_size,
            image_size=self.image_size,
            seed=self.seed,
            input_context=context,
            read_config=read,
        )

    def _distributed_dataset(self, read: ReadConfig) -> tf.distribute.DistributedDataset:
        import tensorflow as tf

        assert self._strategy is not None

        def per_worker(context: tf.distribute.InputContext) -> tf.data.Dataset:
            batches = self._batches(read, context)
            return batches.map(
                tf.autograph.experimental.do_not_convert(lambda *e: (e[0], e[1], e[-1]))
            )

        return self._strategy.distribute_datasets_from_function(per_worker)

    def attach(self, model: keras.Model) -> None:
        """Readies a compiled model for ``fit`` on several workers; a no-op on one.

        Call it under the strategy's scope, after ``compile``, before ``fit``, and call
        ``fit`` under the scope too. It works around Keras 3.15's ``fit`` under
        ``MultiWorkerMirroredStrategy``, which fails before the first step (keras-team/keras
        #20585: ``strategy.reduce`` is given a tuple of ``PerReplica`` batches, then scalar
        metrics with ``axis=0``), and gives the model a train step that gathers every
        worker's positions, so each worker records the whole global batch.

        Raises:
          ValueError: if the model is not built or not compiled.
        """
        if self._strategy is None:
            return
        if model.optimizer is None or not model.built:
            raise ValueError(
                f"ExactEpochs.attach needs a built, compiled model; {model.name} is "
                f"{'built' if model.built else 'not built'} and "
                f"{'compiled' if model.optimizer is not None else 'not compiled'}"
            )
        # Keras reduces the first batch before building (the first failure) only when the
        # model remembers a strategy; without one it uses the scope's, and builds when traced.
        model._distribute_strategy = None
        model.optimizer.build(model.trainable_variables)
        model.train_step = gathering_train_step(
            model.train_step,
            replicas=self._strategy.num_replicas_in_sync,
            replica_batch=self.global_batch_size // self._strategy.num_replicas_in_sync,
        )

    # keras.callbacks.Callback
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._trained = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._trained += 1
        self.batches += 1
        if self._strategy is not None:
            if logs is None or POSITIONS not in logs:
                raise ValueError(
                    "the train step gave no positions: call ExactEpochs.attach(model) before fit"
                )
            positions = np.rint(np.asarray(logs.pop(POSITIONS))).astype(np.int64).reshape(-1)
        else:
            positions = self._produced.pop(self._trained - 1)
            for stale in [n for n in self._produced if n < self._trained]:
                del self._produced[stale]
        result = self.tracker.add(positions)
        if result.duplicates or result.stale:
            _log.error(
                "exact epochs: batch %d repeats %d example(s) of its epoch: exactly once is broken",
                self.batches,
                result.duplicates + result.stale,
            )
        for epoch, missing in result.completed:
            _log.info(
                "exact epochs: epoch %d complete at batch %d%s",
                epoch,
                self.batches,
                ": every example exactly once" if not missing else f", {missing} never delivered",
            )
        if self._audit is not None:
            os.makedirs(os.path.dirname(os.path.abspath(self._audit)), exist_ok=True)
            with open(self._audit, "a") as f:
                f.write(" ".join(str(int(p)) for p in positions) + "\n")
        if isinstance(self.save_freq, int) and self._trained % self.save_freq == 0:
            self.save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.pop(POSITIONS, None)  # the last step's, when Keras passes those on
        if self.save_freq == "epoch":
            self.save()

    def save(self) -> str:
        """Writes the delivered set now (atomically); returns its path."""
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, f"delivered-{self.batches:012d}.bin")
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(self.tracker.delivered.to_bytes({"batches": self.batches}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for _, old in self._saved()[: -self._keep]:
            os.remove(old)
        return path
