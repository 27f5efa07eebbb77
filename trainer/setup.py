"""Everything a training run builds before its first step.

In this order, which matters: the step plan and batch split (cheap checks first); the dtype
policy; with exact epochs the resume plan, since the training pipeline is built from what the
checkpoint holds; the global seed, then the training dataset (every run of a process builds it
under the same seed, so a resumed run reads the order a fresh one would); the model and
optimiser in the
strategy's scope; the checkpoint restore; the key audit, cut back to the restored step; and the
compiled steps.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.audit import KeyAudit, audit_path, close_previous_segments
from trainer.checkpoints import Checkpointer, RestoreResult
from trainer.config import MODELS, TrainConfig
from trainer.evaluation import eval_interval
from trainer.inputs import Inputs, keep_recorded_kind
from trainer.models import build_model
from trainer.optim import build_optimizer
from trainer.resume import ResumePlan, agree_on_nonce, plan_resume
from trainer.run_record import record_run, write_run_record
from trainer.steps import TrainSteps
from trainer.strategy import Distribution, precision_policy
from trainer.user_model import (
    Objective,
    build_checked_model,
    check_signature,
    describe,
    load_model_fn,
)

if TYPE_CHECKING:
    import tensorflow as tf

    from tfrecord_io.delivery import DeliveryTracker

__all__ = ["PreparedRun", "plan_steps", "prepare_run"]

_log = logging.getLogger(__name__)


def plan_steps(config: TrainConfig, train_examples: int | None) -> tuple[int, float | None]:
    """``(total_steps, steps_per_epoch)`` from ``--steps`` or ``--epochs``.

    An epoch is ``train_examples / global_batch_size`` steps, a fraction when the batch does
    not divide the split: the reader repeats before it batches, so a batch may hold the end of
    one epoch and the start of the next. ``--epochs E`` trains the steps that complete E
    epochs: ``ceil(E * train_examples / global_batch_size)``.

    Raises:
      ValueError: if ``--epochs`` is given but the number of examples is unknown.
    """
    per_epoch = None
    if train_examples is not None:
        per_epoch = train_examples / config.global_batch_size
    if config.steps is not None:
        return config.steps, per_epoch
    if train_examples is None:
        raise ValueError(
            f"--epochs needs the number of training examples, but {config.data.source!r} has no "
            "dataset.json; pass --steps instead"
        )
    # TrainConfig holds exactly one of steps and epochs.
    assert config.epochs is not None
    return -(-config.epochs * train_examples // config.global_batch_size), per_epoch


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """A run ready for its first step.

    Attributes:
      total_steps: the step to reach.
      steps_per_epoch: steps in an epoch of the train split (a fraction when the batch does
        not divide it), or None when unknown.
      eval_every: steps between evaluations (``evaluation.eval_interval``).
      worker_batch: the batch this worker's pipeline yields.
      loss_scaling: whether the loss is scaled (``mixed_float16``), which lets a step's
        non-finite loss pass: the optimiser skips that update and lowers the scale.
      iterator: this worker's training iterator.
      checkpointer: saves model, optimiser, step, data position and delivered set.
      restored: what the restore found (the step the run starts at).
      steps: the compiled train and eval steps.
      tracker: the delivered set with exact epochs, else None.
      audit: the key audit file with ``--audit_keys``, else None.
    """

    total_steps: int
    steps_per_epoch: float | None
    eval_every: int
    worker_batch: int
    loss_scaling: bool
    iterator: Any
    checkpointer: Checkpointer
    restored: RestoreResult
    steps: TrainSteps
    tracker: DeliveryTracker | None
    audit: KeyAudit | None


def prepare_run(
    config: TrainConfig,
    dist: Distribution,
    inputs: Inputs,
    *,
    model_fn: Callable[..., Any] | None = None,
    objective: Objective | None = None,
) -> PreparedRun:
    """Builds the dataset, model and optimiser, and restores the latest checkpoint if any.

    Args:
      config: the run.
      dist: the strategy and this worker's place in the cluster.
      inputs: the data.
      model_fn: the function building the model (``trainer.user_model``); None builds
        ``config.model``, a built-in or an import path.
      objective: the loss and extra metrics; None is cross-entropy and accuracy.

    Returns:
      The run, at the step its checkpoint holds (0 when fresh).

    Raises:
      ValueError: naming the flag, if the model cannot be imported or built or does not fit
        the data, the global batch does not split over the replicas, ``--epochs`` has no
        example count, the images have the wrong shape or type, a checkpoint does not fit
        the model, or the audit file lacks keys the checkpoint accounts for.
    """
    import keras
    import tensorflow as tf

    model_fn = _checked_model_fn(config, model_fn)
    total_steps, steps_per_epoch = plan_steps(config, inputs.train_examples)
    worker_batch = dist.worker_batch_size(config.global_batch_size)
    policy = precision_policy(dist.device_kind, config.runtime.mixed_precision)
    keras.mixed_precision.set_dtype_policy(policy)
    keras.utils.set_random_seed(config.seed)
    inputs = keep_recorded_kind(inputs, config.model_dir)
    dataset, plan, tracker = _training_dataset(config, dist, inputs, worker_batch)
    image_spec, label_spec = _checked_element_spec(dataset, config.data.image_size)
    _log_layout(config, dist, worker_batch, policy, (total_steps, steps_per_epoch), inputs.has_eval)
    loss_scaling = policy == "mixed_float16"
    request = _ModelRequest(model_fn, inputs.num_classes, image_spec.dtype.name)
    model, optimizer = _build_model(config, dist, request, total_steps, loss_scaling)
    if dist.is_chief:  # what tfrecord-export needs besides a checkpoint (trainer.run_record)
        _record_run(config, request)
    iterator = iter(dataset)
    checkpointer = Checkpointer(
        config.model_dir,
        dist,
        model=model,
        optimizer=optimizer,
        step=tf.Variable(0, dtype=tf.int64, trainable=False, name="step"),
        iterator=iterator if inputs.checkpointable else None,
        input_layout=inputs.layout(),
        keep=config.keep_checkpoints,
        delivery=tracker,
    )
    restored = _restore(checkpointer, plan, tracker, dist, inputs, total_steps)
    audit = (
        None
        if config.audit_keys is None
        else _open_audit(config.audit_keys, dist, plan, restored.step, worker_batch)
    )
    specs = (image_spec, label_spec)
    steps = _compiled_steps(config, dist, model, optimizer, specs, objective, loss_scaling)
    return PreparedRun(
        total_steps=total_steps,
        steps_per_epoch=steps_per_epoch,
        eval_every=eval_interval(config.eval_every, total_steps),
        worker_batch=worker_batch,
        loss_scaling=loss_scaling,
        iterator=iterator,
        checkpointer=checkpointer,
        restored=restored,
        steps=steps,
        tracker=tracker,
        audit=audit,
    )


def _compiled_steps(
    config: TrainConfig,
    dist: Distribution,
    model: Any,
    optimizer: Any,
    specs: tuple[Any, Any],
    objective: Objective | None,
    loss_scaling: bool,
) -> TrainSteps:
    """The compiled train and eval steps for ``model``, fed elements of ``specs`` (image,
    label)."""
    image_spec, label_spec = specs
    return TrainSteps(
        dist=dist,
        model=model,
        optimizer=optimizer,
        global_batch_size=config.global_batch_size,
        image_size=config.data.image_size,
        loss_scaling=loss_scaling,
        image_dtype=image_spec.dtype,
        label_dtype=label_spec.dtype,
        objective=objective,
        jit_compile=config.runtime.jit_compile,
    )


def _checked_model_fn(
    config: TrainConfig, model_fn: Callable[..., Any] | None
) -> Callable[..., Any] | None:
    """The function building the model: ``model_fn``, or ``--model``'s import path imported
    (None for a built-in). A wrong import path or signature fails here, before anything is
    read or written."""
    if model_fn is None and config.model not in MODELS:
        model_fn = load_model_fn(config.model)
    if model_fn is not None:
        check_signature(model_fn, name=describe(model_fn), model_args=config.model_args)
    return model_fn


def _training_dataset(
    config: TrainConfig, dist: Distribution, inputs: Inputs, worker_batch: int
) -> tuple[tf.data.Dataset, ResumePlan | None, DeliveryTracker | None]:
    """The training dataset, with the resume plan and delivered set under exact epochs."""
    with_keys = config.audit_keys is not None
    if not inputs.exact_epochs:
        return inputs.train_dataset(dist.input_context(), with_keys=with_keys), None, None
    plan, tracker = _plan_exact_resume(config, dist, inputs, worker_batch)
    job_name = None
    if not inputs.checkpointable:
        # A job of its own per run: one rejoined by name would go on from where the service
        # stood, not from the checkpoint.
        job_name = f"train-{plan.origin.digest()}-{agree_on_nonce(dist):08x}"
    dataset = inputs.train_dataset(
        dist.input_context(),
        with_keys=with_keys,
        exclude=plan.origin,
        service_job_name=job_name,
    )
    return dataset, plan, tracker


@dataclasses.dataclass(frozen=True)
class _ModelRequest:
    """What the model is built from: the user's function (or None for a built-in), the
    number of classes and the input dtype."""

    model_fn: Callable[..., Any] | None
    num_classes: int
    input_dtype: str


def _build_model(
    config: TrainConfig,
    dist: Distribution,
    request: _ModelRequest,
    total_steps: int,
    loss_scaling: bool,
) -> tuple[Any, Any]:
    """The model and its optimiser, built in the strategy's scope (so their variables are
    mirrored), with the optimiser's slots created before any restore.

    Raises:
      ValueError: if the user's model does not fit (``trainer.user_model``).
    """
    with dist.strategy.scope():
        if request.model_fn is None:
            model = build_model(
                config.model,
                num_classes=request.num_classes,
                image_size=config.data.image_size,
                input_dtype=request.input_dtype,
            )
        else:
            model = build_checked_model(
                request.model_fn,
                name=describe(request.model_fn),
                image_size=config.data.image_size,
                num_classes=request.num_classes,
                input_dtype=request.input_dtype,
                model_args=config.model_args,
            )
        optimizer = build_optimizer(
            config.optim,
            global_batch_size=config.global_batch_size,
            total_steps=total_steps,
            loss_scaling=loss_scaling,
        )
        optimizer.build(model.trainable_variables)
    return model, optimizer


def _record_run(config: TrainConfig, request: _ModelRequest) -> None:
    """Writes ``MODEL_DIR/run.json``: the model, its input and classes, and the preprocessing
    an exported model repeats."""
    model = config.model if request.model_fn is None else describe(request.model_fn)
    record = record_run(
        config, model=model, num_classes=request.num_classes, input_dtype=request.input_dtype
    )
    write_run_record(config.model_dir, record)


def _plan_exact_resume(
    config: TrainConfig, dist: Distribution, inputs: Inputs, worker_batch: int
) -> tuple[ResumePlan, DeliveryTracker]:
    """Plans the resume of an exact-epochs run (``trainer.resume``).

    Raises:
      ValueError: if the inputs read exact epochs without a known example count or split
        digest (a custom ``Inputs`` that contradicts itself).
    """
    from tfrecord_io.delivery import DeliveredSet, DeliveryTracker

    if inputs.train_examples is None or inputs.split_digest is None:
        raise ValueError(
            "exact epochs need the number of training examples and the split's digest, got "
            f"train_examples={inputs.train_examples!r} split_digest={inputs.split_digest!r}"
        )
    empty = DeliveredSet.empty(inputs.train_examples, seed=config.seed, split=inputs.split_digest)
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


def _checked_element_spec(dataset: tf.data.Dataset, image_size: int) -> tuple[Any, Any]:
    """``(image_spec, label_spec)`` of the training batches.

    Raises:
      ValueError: if the images are not ``[batch, image_size, image_size, 3]`` of uint8 or
        float32.
    """
    image_spec, label_spec = dataset.element_spec[0], dataset.element_spec[1]
    expected_shape = [image_size, image_size, 3]
    if (
        image_spec.shape.rank != 4
        or image_spec.shape[1:].as_list() != expected_shape
        or image_spec.dtype.name not in ("uint8", "float32")
    ):
        raise ValueError(
            f"the training data yields images {image_spec}, expected uint8 or float32 of shape "
            f"[batch, {image_size}, {image_size}, 3]"
        )
    return image_spec, label_spec


def _log_layout(
    config: TrainConfig,
    dist: Distribution,
    worker_batch: int,
    policy: str,
    length: tuple[int, float | None],
    has_eval: bool,
) -> None:
    """Logs how the batch splits, the learning rate, the dtype policy, the run's length and
    how often it evaluates."""
    total_steps, steps_per_epoch = length
    evaluating = (
        f", evaluating every {eval_interval(config.eval_every, total_steps)}" if has_eval else ""
    )
    _log.info(
        "strategy %s: %d worker(s) x %d local replica(s), global batch %d = %d per worker = %d "
        "per replica; peak learning rate %.5g (base %.5g x %d / 256), %d warm-up steps; "
        "dtype policy %s; %d steps%s%s",
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
        f" (an epoch is {steps_per_epoch:.4g} steps)" if steps_per_epoch else "",
        evaluating,
    )


def _restore(
    checkpointer: Checkpointer,
    plan: ResumePlan | None,
    tracker: DeliveryTracker | None,
    dist: Distribution,
    inputs: Inputs,
    total_steps: int,
) -> RestoreResult:
    """Restores the latest checkpoint (or starts fresh) and logs what the resume keeps.

    Raises:
      ValueError: if a checkpoint does not fit the model.
    """
    if not inputs.checkpointable and plan is None:
        _log.warning(
            "the input pipeline runs on the tf.data service: its position cannot be saved, so "
            "checkpoints hold the model, optimiser and step, and a resumed run restarts the "
            "data order"
        )
    restored = checkpointer.restore_or_create(plan)
    if plan is not None and tracker is not None:
        _log_resume(plan, tracker, dist, service=not inputs.checkpointable)
    if restored.step >= total_steps:
        _log.info("already at step %d of %d: nothing to train", restored.step, total_steps)
    return restored


def _log_resume(
    plan: ResumePlan, tracker: DeliveryTracker, dist: Distribution, *, service: bool
) -> None:
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


def _open_audit(
    audit_keys: str,
    dist: Distribution,
    plan: ResumePlan | None,
    step: int,
    worker_batch: int,
) -> KeyAudit:
    """This worker's key audit file for the segment starting now, cut back to ``step``.

    With exact epochs a resume starts a new segment of audit files, and the chief cuts the
    previous segments' files back to the checkpoint the run resumed from (``trainer.audit``).

    Raises:
      ValueError: if the file holds fewer keys than the checkpoint has trained on.
    """
    segment_start = int(plan.segment["start"]) if plan is not None else 0
    path = audit_path(
        audit_keys,
        num_workers=dist.num_workers,
        worker_index=dist.worker_index,
        start_step=segment_start,
    )
    if plan is not None and dist.is_chief:
        current = {
            audit_path(
                audit_keys,
                num_workers=dist.num_workers,
                worker_index=k,
                start_step=segment_start,
            )
            for k in range(dist.num_workers)
        }
        close_previous_segments(audit_keys, plan.previous, step=step, current=current)
    return KeyAudit(path, keep_lines=(step - segment_start) * worker_batch)
