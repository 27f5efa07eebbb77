"""The compiled train and eval steps: ``strategy.run`` over a per-worker batch.

A step slices the per-worker batch among the local replicas
(``experimental_distribute_values_from_function``); each replica computes the loss, scaled by
the *global* batch, its gradients and the update, and Keras' optimiser all-reduces the
gradients. One batched all-reduce brings back the global loss, correct count and stop flag,
so every worker agrees on metrics and on stopping after SIGTERM.

With exact epochs every batch also carries its examples' positions; the step gathers them over
all replicas, so every worker adds the same global batch to the delivered set.

Keras 3 keeps one copy of BatchNormalization's moving statistics per replica and updates each
from its own slice of the batch; with more than one replica the step averages them (one
all-reduce), so every replica, and the checkpoint, holds the same statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.strategy import Distribution
from trainer.user_model import Objective

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["TrainSteps"]


class TrainSteps:
    """The compiled train and eval steps of one model on one strategy.

    Attributes:
      train_plain: ``(images, labels, stop, positions=None) -> (totals, norm, positions)``:
        one training step; ``totals`` is the global ``[loss, correct, stop votes]``, ``norm``
        is 0 and ``positions`` the whole global batch's (empty without positions).
      train_with_norm: the same step, also computing the global gradient norm (the steps
        that log scalars use it: the norm costs one more all-reduce).
      eval: ``(images, labels) -> [loss sum, correct, examples]`` over the global batch; a
        partial or empty per-worker batch is padded and masked.

    Raises:
      ValueError: (on construction) if the global batch does not split over the replicas.
    """

    def __init__(
        self,
        *,
        dist: Distribution,
        model: Any,
        optimizer: Any,
        global_batch_size: int,
        image_size: int,
        loss_scaling: bool,
        image_dtype: tf.DType,
        label_dtype: tf.DType,
        objective: Objective | None = None,
        jit_compile: bool = False,
    ) -> None:
        import tensorflow as tf

        self._tf = tf
        self._dist = dist
        self._strategy = dist.strategy
        self._model = model
        self._optimizer = optimizer
        self._global_batch = global_batch_size
        self._worker_batch = dist.worker_batch_size(global_batch_size)
        self._replica_batch = self._worker_batch // dist.local_replicas
        self._image_size = image_size
        self._loss_scaling = loss_scaling
        self._replicas = dist.num_replicas
        self.objective = Objective() if objective is None else objective
        # AutoGraph off, as in Keras 3's own train step: the steps branch in Python on
        # Python values only, and its rewrite of the steps and the model cost about 1 CPU-s
        # at every start. A model's ``call`` runs as under ``fit``: tensor-dependent branches
        # go through ``tf.cond`` or ``tf.where``.
        self._forward_backward = tf.function(
            self._gradients, jit_compile=jit_compile, autograph=False
        )
        self.train_plain = tf.function(
            lambda x, y, s, p=None: self._train(x, y, s, p, with_norm=False), autograph=False
        )
        self.train_with_norm = tf.function(
            lambda x, y, s, p=None: self._train(x, y, s, p, with_norm=True), autograph=False
        )
        spec = (
            tf.TensorSpec([None, image_size, image_size, 3], image_dtype),
            tf.TensorSpec([None], label_dtype),
        )
        self.eval = tf.function(self._eval, input_signature=spec, autograph=False)

    def _gradients(self, x: tf.Tensor, y: tf.Tensor) -> tuple[Any, Any, Any]:
        """One replica's loss (scaled by the global batch), gradients and ``[correct, metric
        sums...]``: the part XLA may compile (``jit_compile``), without collectives."""
        tf = self._tf
        model, optimizer = self._model, self._optimizer
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = self.objective.per_example_loss(y, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self._global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
            scaled = optimizer.scale_loss(loss) if self._loss_scaling else loss
        grads = tape.gradient(scaled, model.trainable_variables)
        predicted = tf.argmax(logits, axis=-1, output_type=y.dtype)
        correct = tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.float32))
        sums = [tf.reduce_sum(v) for v in self.objective.metric_values(y, logits)]
        return loss, grads, tf.stack([correct, *sums])

    def _split(self, value: tf.Tensor) -> Any:
        """Slices a per-worker batch into this worker's per-replica batches."""
        local, size = self._dist.local_replicas, self._replica_batch

        def piece(ctx: tf.distribute.experimental.ValueContext) -> tf.Tensor:
            i = ctx.replica_id_in_sync_group % local
            return value[i * size : (i + 1) * size]

        return self._strategy.experimental_distribute_values_from_function(piece)

    def _train(
        self,
        images: tf.Tensor,
        labels: tf.Tensor,
        stop: tf.Tensor,
        positions: tf.Tensor | None,
        *,
        with_norm: bool,
    ):
        """One step; returns the global (loss, correct, stop votes), the gradient norm and
        the positions of the whole global batch (empty without positions)."""
        tf = self._tf
        model, optimizer, replicas = self._model, self._optimizer, self._replicas

        def replica_step(x: Any, y: Any, p: Any) -> Any:  # tf.Tensor: tf is imported lazily
            ctx = tf.distribute.get_replica_context()
            loss, grads, measures = self._forward_backward(x, y)
            norm = tf.constant(0.0)
            if with_norm:
                # The norm of the global gradient needs the all-reduced gradient; Keras would
                # all-reduce again, so hand it the replica's share of the sum.
                if replicas > 1:
                    grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
                norm = tf.linalg.global_norm(grads)
                if self._loss_scaling:
                    norm = norm / tf.cast(optimizer.dynamic_scale, tf.float32)
                if replicas > 1:
                    grads = [g / replicas for g in grads]
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            if replicas > 1 and model.non_trainable_variables:
                stats = model.non_trainable_variables
                means = ctx.all_reduce(
                    tf.distribute.ReduceOp.MEAN, [tf.identity(v.value) for v in stats]
                )
                for var, mean in zip(stats, means, strict=True):
                    var.assign(mean)
            # [loss, correct, stop votes, metric sums...]
            totals = tf.concat(
                [tf.stack([tf.cast(loss, tf.float32), measures[0], stop]), measures[1:]], 0
            )
            if replicas > 1:
                totals = ctx.all_reduce(tf.distribute.ReduceOp.SUM, totals)
            if p is None:
                gathered = tf.zeros([0], tf.int64)
            elif replicas == 1:
                gathered = p
            else:
                # A gather as a sum over replica slots: all_gather fails under the multi-worker
                # strategy ("destinations can not be empty"). float64 holds positions exactly
                # below 2**53.
                slots = tf.scatter_nd(
                    [[ctx.replica_id_in_sync_group]],
                    [tf.cast(p, tf.float64)],
                    [replicas, self._replica_batch],
                )
                summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.reshape(slots, [-1]))
                gathered = tf.cast(summed, tf.int64)
            return totals, norm, gathered

        split_positions = None if positions is None else self._split(positions)
        totals, norm, gathered = self._strategy.run(
            replica_step, args=(self._split(images), self._split(labels), split_positions)
        )
        first = self._strategy.experimental_local_results
        return first(totals)[0], first(norm)[0], first(gathered)[0]

    def _eval(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        tf = self._tf
        size, count = self._worker_batch, tf.shape(labels)[0]
        # Pad to the full per-worker batch (static shapes, one trace) and mask the padding:
        # a partial or empty batch then splits evenly among replicas.
        images = tf.pad(images, [[0, size - count], [0, 0], [0, 0], [0, 0]])
        labels = tf.pad(labels, [[0, size - count]])
        images = tf.ensure_shape(images, [size, self._image_size, self._image_size, 3])
        labels = tf.ensure_shape(labels, [size])
        mask = tf.cast(tf.range(size) < count, tf.float32)
        model, replicas, objective = self._model, self._replicas, self.objective

        def replica_step(x: Any, y: Any, m: Any) -> Any:  # tf.Tensor: tf is imported lazily
            logits = model(x, training=False)
            per_example = objective.per_example_loss(y, logits)
            predicted = tf.argmax(logits, axis=-1, output_type=y.dtype)
            correct = tf.cast(tf.equal(predicted, y), tf.float32)
            # [loss sum, correct, examples, metric sums...]
            totals = tf.stack(
                [
                    tf.reduce_sum(per_example * m),
                    tf.reduce_sum(correct * m),
                    tf.reduce_sum(m),
                    *(tf.reduce_sum(v * m) for v in objective.metric_values(y, logits)),
                ]
            )
            if replicas > 1:
                totals = tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, totals
                )
            return totals

        totals = self._strategy.run(
            replica_step, args=(self._split(images), self._split(labels), self._split(mask))
        )
        return self._strategy.experimental_local_results(totals)[0]
