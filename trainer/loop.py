"""The custom training loop: ``strategy.run`` over per-worker batches, exact resume.

Per step, on every worker:

1. ``next()`` on the worker's own plain ``tf.data`` iterator gives the per-worker batch (timed:
   that is the ``input_wait``).
2. ``strategy.experimental_distribute_values_from_function`` slices it among the local
   replicas; ``strategy.run`` computes the loss (scaled by the *global* batch), the gradients
   and the update. Keras' optimiser all-reduces the gradients.
3. One batched all-reduce brings back the global loss, correct count and stop flag, so every
   worker agrees on metrics and on stopping after SIGTERM.

Why not ``model.fit``: Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy``
("Attempt to convert a value (PerReplica…)"). Why not ``distribute_datasets_from_function``:
its iterators cannot be saved in a checkpoint, so the data position would be lost on resume.

With exact epochs (``trainer.resume``) every batch also carries its examples' positions; the
step all-gathers them, so every worker adds the same global batch to the delivered set that
is saved with the model.

Keras 3 keeps one copy of BatchNormalization's moving statistics per replica and updates each
from its own slice of the batch; with more than one replica the loop averages them after each
step (one all-reduce), so every replica, and the checkpoint, holds the same statistics.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from trainer.audit import KeyAudit, audit_path, close_previous_segments
from trainer.checkpoints import Checkpointer
from trainer.config import TrainConfig
from trainer.inputs import Inputs
from trainer.metrics import GpuUtilization, StepWindow, SummaryWriters
from trainer.models import build_model
from trainer.optim import build_optimizer, learning_rate_at
from trainer.preemption import StopSignal
from trainer.resume import ResumePlan, agree_on_nonce, plan_resume
from trainer.strategy import Distribution, precision_policy

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["TrainResult", "plan_steps", "run_training", "evaluate"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """How a run ended.

    Attributes:
      start_step: the step it resumed from (0 for a fresh run).
      step: the last completed step.
      exit_code: 0 when the target was reached, 128 + signal number when stopped by a signal.
      input_restored: whether the data position was restored on resume.
      resume_kind: ``trainer.resume.KINDS`` with exact epochs, else ``"legacy"``.
      train_metrics: the last logged training scalars.
      eval_metrics: the last validation ``loss``, ``accuracy`` and ``examples``, or None.
      checkpoint: the last checkpoint written by the chief, or None.
    """

    start_step: int
    step: int
    exit_code: int
    input_restored: bool
    train_metrics: dict[str, float]
    eval_metrics: dict[str, float] | None
    checkpoint: str | None
    resume_kind: str = "legacy"


def plan_steps(config: TrainConfig, train_examples: int | None) -> tuple[int, int | None]:
    """``(total_steps, steps_per_epoch)`` from ``--steps`` or ``--epochs``.

    An epoch is ``train_examples // global_batch_size`` steps (training batches are full).

    Raises:
      ValueError: if ``--epochs`` is given but the number of examples is unknown.
    """
    per_epoch = None
    if train_examples is not None:
        per_epoch = max(1, train_examples // config.global_batch_size)
    if config.steps is not None:
        return config.steps, per_epoch
    if per_epoch is None:
        raise ValueError(
            f"--epochs needs the number of training examples, but {config.data.source!r} has no "
            "dataset.json; pass --steps instead"
        )
    return config.epochs * per_epoch, per_epoch  # type: ignore[operator]


class _Steps:
    """The compiled train and eval steps of one model on one strategy."""

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
    ) -> None:
        import keras
        import tensorflow as tf

        self._tf = tf
        self._keras = keras
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
        self.train_plain = tf.function(
            lambda x, y, s, p=None: self._train(x, y, s, p, with_norm=False)
        )
        self.train_with_norm = tf.function(
            lambda x, y, s, p=None: self._train(x, y, s, p, with_norm=True)
        )
        spec = (
            tf.TensorSpec([None, image_size, image_size, 3], image_dtype),
            tf.TensorSpec([None], label_dtype),
        )
        self.eval = tf.function(self._eval, input_signature=spec)

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
        tf, keras = self._tf, self._keras
        model, optimizer, replicas = self._model, self._optimizer, self._replicas

        def replica_step(x: Any, y: Any, p: Any) -> Any:  # tf.Tensor: tf is imported lazily
            ctx = tf.distribute.get_replica_context()
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True
                )
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=self._global_batch)
                if model.losses:
                    loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
                scaled = optimizer.scale_loss(loss) if self._loss_scaling else loss
            grads = tape.gradient(scaled, model.trainable_variables)
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
            predicted = tf.argmax(logits, axis=-1, output_type=y.dtype)
            correct = tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.float32))
            totals = tf.stack([tf.cast(loss, tf.float32), correct, stop])
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
        tf, keras = self._tf, self._keras
        size, count = self._worker_batch, tf.shape(labels)[0]
        # Pad to the full per-worker batch (static shapes, one trace) and mask the padding:
        # a partial or empty batch then splits evenly among replicas.
        images = tf.pad(images, [[0, size - count], [0, 0], [0, 0], [0, 0]])
        labels = tf.pad(labels, [[0, size - count]])
        images = tf.ensure_shape(images, [size, self._image_size, self._image_size, 3])
        labels = tf.ensure_shape(labels, [size])
        mask = tf.cast(tf.range(size) < count, tf.float32)
        model, replicas = self._model, self._replicas

        def replica_step(x: Any, y: Any, m: Any) -> Any:  # tf.Tensor: tf is imported lazily
            logits = model(x, training=False)
            per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            predicted = tf.argmax(logits, axis=-1, output_type=y.dtype)
            correct = tf.cast(tf.equal(predicted, y), tf.float32)
            totals = tf.stack(
                [
                    tf.reduce_sum(tf.cast(per_example, tf.float32) * m),
                    tf.reduce_sum(correct * m),
                    tf.reduce_sum(m),
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


def evaluate(steps: _Steps, dataset: tf.data.Dataset) -> dict[str, float]:
    """One pass over this worker's eval shard, in lockstep with the other workers.

    Workers may hold different numbers of eval batches. A worker whose shard is done keeps
    stepping with empty batches, and the pass ends when a step counts no example anywhere, so
    every worker runs the same number of collective steps.

    Returns:
      ``{"loss", "accuracy", "examples"}`` over the whole eval split.
    """
    import numpy as np
    import tensorflow as tf

    spec = dataset.element_spec
    empty_images = tf.zeros([0, *spec[0].shape[1:]], spec[0].dtype)
    empty_labels = tf.zeros([0], spec[1].dtype)
    iterator = iter(dataset)
    totals = np.zeros(3)
    while True:
        optional = iterator.get_next_as_optional()
        if optional.has_value():
            element = optional.get_value()
            images, labels = element[0], element[1]
        else:
            images, labels = empty_images, empty_labels
        step_totals = steps.eval(images, labels).numpy()
        if step_totals[2] == 0:
            break
        totals += step_totals
    examples = float(totals[2])
    if examples == 0:
        return {"loss": float("nan"), "accuracy": float("nan"), "examples": 0.0}
    return {
        "loss": float(totals[0] / examples),
        "accuracy": float(totals[1] / examples),
        "examples": examples,
    }


def _format(scalars: dict[str, float]) -> str:
    parts = []
    for tag, value in scalars.items():
        if tag == "input_wait":
            parts.append(f"{tag} {value:.0%}")
        elif tag == "examples_per_sec":
            parts.append(f"{value:.0f} ex/s")
        elif tag == "step_time":
            parts.append(f"{tag} {value * 1000:.0f}ms")
        else:
            parts.append(f"{tag} {value:.4g}")
    return " ".join(parts)


def run_training(config: TrainConfig, dist: Distribution, inputs: Inputs) -> TrainResult:
    """Trains to ``config.steps`` (or epochs), resuming from ``config.model_dir`` if it holds
    a checkpoint.

    Args:
      config: the run.
      dist: the strategy and this worker's place in the cluster (``create_distribution``).
      inputs: the data (``ReaderInputs`` over the project's reader).

    Returns:
      How the run ended; ``exit_code`` is non-zero when a signal stopped it.

    Raises:
      ValueError: if the global batch does not split over the replicas, or a checkpoint does
        not fit the model.
      FloatingPointError: if the loss becomes NaN or infinite (the last checkpoint is kept).
      RuntimeError: if the training data runs out (the reader repeats forever, so this means a
        custom ``Inputs`` is finite).
    """
    import keras
    import tensorflow as tf

    total_steps, steps_per_epoch = plan_steps(config, inputs.train_examples)
    worker_batch = dist.worker_batch_size(config.global_batch_size)
    policy = precision_policy(dist.device_kind, config.runtime.mixed_precision)
    keras.mixed_precision.set_dtype_policy(policy)
    with_keys = config.audit_keys is not None
    # The dataset is built before the global seed is set: its ops carry their own seeds, and
    # a global seed would change them, so the order would no longer be the one
    # ``tfrecord_io.make_dataset(seed=...)`` gives on its own. With exact epochs what it is
    # built from comes from the checkpoint, so the resume is planned first.
    plan, tracker = None, None
    if getattr(inputs, "exact_epochs", False):
        plan, tracker = _plan(config, dist, inputs, worker_batch)
        job_name = None
        if not inputs.checkpointable:
            # A job of its own per run: one rejoined by name would go on from where the
            # service stood, not from the checkpoint.
            job_name = f"train-{plan.origin.digest()}-{agree_on_nonce(dist):08x}"
        dataset = inputs.train_dataset(  # type: ignore[call-arg]
            dist.input_context(),
            with_keys=with_keys,
            exclude=plan.origin,
            service_job_name=job_name,
        )
    else:
        dataset = inputs.train_dataset(dist.input_context(), with_keys=with_keys)
    keras.utils.set_random_seed(config.seed)
    image_spec, label_spec = dataset.element_spec[0], dataset.element_spec[1]
    image_dtype = image_spec.dtype.name
    expected_shape = [config.data.image_size, config.data.image_size, 3]
    if (
        image_spec.shape.rank != 4
        or image_spec.shape[1:].as_list() != expected_shape
        or image_dtype not in ("uint8", "float32")
    ):
        raise ValueError(
            f"the training data yields images {image_spec}, expected uint8 or float32 of shape "
            f"[batch, {config.data.image_size}, {config.data.image_size}, 3]"
        )
    loss_scaling = policy == "mixed_float16"
    eval_every = config.eval_every or steps_per_epoch
    _log.info(
        "strategy %s: %d worker(s) x %d local replica(s), global batch %d = %d per worker = %d "
        "per replica; peak learning rate %.5g (base %.5g x %d / 256), %d warm-up steps; "
        "dtype policy %s; %d steps%s",
        dist.name,
        dist.num_workers,
        dist.local_replicas,
        config.global_batch_size,
        worker_batch,
        worker_batch // dist.local_replicas,
        config.optim.peak_lr(config.global_batch_size),
        config.optim.base_lr,
        config.global_batch_size,
        config.optim.warmup_steps,
        policy,
        total_steps,
        f" ({steps_per_epoch} per epoch)" if steps_per_epoch else "",
    )

    with dist.strategy.scope():
        model = build_model(
            config.model,
            num_classes=inputs.num_classes,
            image_size=config.data.image_size,
            input_dtype=image_dtype,
        )
        optimizer = build_optimizer(
            config.optim,
            global_batch_size=config.global_batch_size,
            total_steps=total_steps,
            loss_scaling=loss_scaling,
        )
        optimizer.build(model.trainable_variables)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")

    iterator = iter(dataset)
    checkpointer = Checkpointer(
        config.model_dir,
        dist,
        model=model,
        optimizer=optimizer,
        step=step_var,
        iterator=iterator if inputs.checkpointable else None,
        input_layout=inputs.layout(),
        keep=config.keep_checkpoints,
        delivery=tracker,
    )
    if not inputs.checkpointable and plan is None:
        _log.warning(
            "the input pipeline runs on the tf.data service: its position cannot be saved, so "
            "checkpoints hold the model, optimiser and step, and a resumed run restarts the "
            "data order"
        )
    restored = checkpointer.restore_or_create(plan)
    start_step = step = restored.step
    if plan is not None and tracker is not None:
        _log_resume(plan, tracker, dist, service=not inputs.checkpointable)
    if step >= total_steps:
        _log.info("already at step %d of %d: nothing to train", step, total_steps)

    audit = None
    if with_keys:
        segment_start = int(plan.segment["start"]) if plan is not None else 0
        path = audit_path(
            config.audit_keys,  # type: ignore[arg-type]
            num_workers=dist.num_workers,
            worker_index=dist.worker_index,
            start_step=segment_start,
        )
        if plan is not None and dist.is_chief:
            current = {
                audit_path(
                    config.audit_keys,  # type: ignore[arg-type]
                    num_workers=dist.num_workers,
                    worker_index=k,
                    start_step=segment_start,
                )
                for k in range(dist.num_workers)
            }
            close_previous_segments(
                config.audit_keys,  # type: ignore[arg-type]
                plan.previous,
                step=step,
                current=current,
            )
        audit = KeyAudit(path, keep_lines=(step - segment_start) * worker_batch)

    writers = SummaryWriters(
        config.model_dir, is_chief=dist.is_chief, worker_index=dist.worker_index
    )
    gpu = GpuUtilization(enabled=dist.device_kind == "GPU")
    steps = _Steps(
        dist=dist,
        model=model,
        optimizer=optimizer,
        global_batch_size=config.global_batch_size,
        image_size=config.data.image_size,
        loss_scaling=loss_scaling,
        image_dtype=image_spec.dtype,
        label_dtype=label_spec.dtype,
    )
    window = StepWindow(config.global_batch_size)
    traced: set[str] = set()
    last_train: dict[str, float] = {}
    last_eval: dict[str, float] | None = None
    last_saved = step if restored.checkpoint else -1
    last_checkpoint = restored.checkpoint
    last_evaluated = step

    def save() -> None:
        nonlocal last_saved, last_checkpoint
        if audit is not None:
            audit.flush()
        path = checkpointer.save(step)
        last_saved = step
        if path:
            last_checkpoint = path
            _log.info("saved %s", path)

    def run_eval() -> None:
        nonlocal last_eval, last_evaluated
        started = time.perf_counter()
        result = evaluate(steps, inputs.eval_dataset(dist.input_context()))
        last_evaluated = step
        last_eval = result
        writers.write_eval(step, {"loss": result["loss"], "accuracy": result["accuracy"]})
        _log.info(
            "step %d validation: loss %.4g accuracy %.4g over %d examples (%.1fs)",
            step,
            result["loss"],
            result["accuracy"],
            int(result["examples"]),
            time.perf_counter() - started,
        )

    exit_code = 0
    try:
        with StopSignal() as stop:
            while step < total_steps:
                started = time.perf_counter()
                try:
                    element = next(iterator)
                except StopIteration:
                    raise RuntimeError(
                        f"the training data ended after step {step}; the training dataset must "
                        "repeat"
                    ) from None
                fetched = time.perf_counter()
                log_now = (step + 1) % config.log_every == 0 or step + 1 == total_steps
                variant = "with_norm" if log_now else "plain"
                fn = steps.train_with_norm if log_now else steps.train_plain
                flag = tf.constant(1.0 if stop.requested else 0.0)
                positions = element[-1] if tracker is not None else None
                totals, norm, gathered = fn(element[0], element[1], flag, positions)
                loss, correct, stop_votes = (float(v) for v in totals.numpy())
                finished = time.perf_counter()
                step += 1
                if not math.isfinite(loss) and not loss_scaling:
                    raise FloatingPointError(
                        f"loss is {loss} at step {step}: training diverged. Lower --base_lr or "
                        "lengthen --warmup_steps; "
                        + (
                            f"the last checkpoint is {last_checkpoint}"
                            if last_checkpoint
                            else "no checkpoint was written yet"
                        )
                    )
                if audit is not None:
                    audit.write(element[2].numpy().tolist())
                if tracker is not None:
                    _record_delivery(tracker, gathered.numpy(), step)
                window.add(
                    loss=loss,
                    correct=correct,
                    wait_seconds=fetched - started,
                    step_seconds=finished - started,
                    timed=variant in traced,
                )
                traced.add(variant)
                if log_now:
                    scalars = window.scalars()
                    scalars["learning_rate"] = learning_rate_at(
                        step - 1,
                        peak_lr=config.optim.peak_lr(config.global_batch_size),
                        warmup_steps=config.optim.warmup_steps,
                        schedule=config.optim.schedule,
                        total_steps=total_steps,
                    )
                    scalars["grad_norm"] = float(norm.numpy())
                    utilisation = gpu.take_mean()
                    if utilisation is not None:
                        scalars["gpu_utilization"] = utilisation
                    writers.write_train(step, scalars)
                    last_train = scalars
                    _log.info("step %d/%d %s", step, total_steps, _format(scalars))
                if stop_votes > 0:
                    save()
                    exit_code = stop.exit_code if stop.requested else 128 + 15
                    _log.warning("stopped at step %d on request; resume by rerunning", step)
                    break
                if step % config.checkpoint_every == 0 or step == total_steps:
                    save()
                if inputs.has_eval and eval_every and step % eval_every == 0:
                    run_eval()
            if exit_code == 0:
                if inputs.has_eval and last_evaluated != step:
                    run_eval()
                if last_saved != step:
                    save()
    finally:
        gpu.close()
        writers.close()
        if audit is not None:
            audit.close()
    return TrainResult(
        start_step=start_step,
        step=step,
        exit_code=exit_code,
        input_restored=restored.input_restored,
        train_metrics=last_train,
        eval_metrics=last_eval,
        checkpoint=last_checkpoint,
        resume_kind=restored.kind,
    )


def _plan(
    config: TrainConfig, dist: Distribution, inputs: Inputs, worker_batch: int
) -> tuple[ResumePlan, Any]:
    """Plans the resume of an exact-epochs run (``trainer.resume``)."""
    import os

    from tfrecord_io.delivery import DeliveredSet, DeliveryTracker

    empty = DeliveredSet.empty(
        inputs.train_examples,  # type: ignore[arg-type]
        seed=config.seed,
        split=inputs.split_digest,  # type: ignore[attr-defined]
    )
    tracker = DeliveryTracker(empty)
    layout = {
        **inputs.layout(),
        "num_workers": dist.num_workers,
        "service": not inputs.checkpointable,
    }
    plan = plan_resume(
        os.path.join(config.model_dir, "checkpoints"),
        dist,
        tracker,
        layout=layout,
        worker_batch=worker_batch,
        empty=empty,
    )
    return plan, tracker


def _log_resume(plan: ResumePlan, tracker: Any, dist: Distribution, *, service: bool) -> None:
    """Logs the kind of resume and what is left of the epoch."""
    total, epoch = tracker.num_examples, tracker.epoch
    left = total - tracker.count
    remaining = f"epoch {epoch}: {left} of {total} examples remain"
    if plan.kind == "fresh":
        _log.info("resume: fresh start; epoch 0: %d examples", total)
    elif plan.kind == "exact":
        _log.info(
            "resume: exact at step %d (same input layout; iterator positions restored); %s",
            plan.step,
            remaining,
        )
    else:
        if service:
            where = "split dynamically over the tf.data service's workers"
        else:
            q, r = divmod(plan.origin.remaining, dist.num_workers)
            mine = q + (1 if dist.worker_index < r else 0)
            where = f"{mine} of them in this worker's pipeline"
        log = _log.warning if plan.kind == "restart" else _log.info
        log(
            "resume: %s at step %d (%s); %s, %s",
            plan.kind,
            plan.step,
            plan.reason,
            remaining,
            where,
        )


def _record_delivery(tracker: Any, positions: Any, step: int) -> None:
    """Adds a global batch's positions to the delivered set; reports what should not happen."""
    result = tracker.add(positions)
    if result.duplicates or result.stale:
        _log.error(
            "step %d trained on %d example(s) already trained on in their epoch and %d of a "
            "closed epoch: the exactly-once guarantee is broken",
            step,
            result.duplicates,
            result.stale,
        )
    for epoch, missing in result.completed:
        if not missing:
            _log.info("epoch %d complete at step %d: every example exactly once", epoch, step)
