"""The custom training loop: ``strategy.run`` over per-worker batches, exact resume.

``run_training`` prepares the run (``trainer.setup``: data, model, restore), then steps. Per
step, on every worker:

1. ``next()`` on the worker's own plain ``tf.data`` iterator gives the per-worker batch (timed:
   that is the ``input_wait``).
2. The compiled step (``trainer.steps``) slices it among the local replicas and trains; one
   batched all-reduce brings back the global loss, correct count and stop flag, so every
   worker agrees on metrics and on stopping after SIGTERM.
3. Scalars are logged every ``log_every`` steps, checkpoints written every
   ``checkpoint_every``, and the model evaluated (``trainer.evaluation``) every
   ``eval_every`` steps (by default a fifth of the run).

Why not ``model.fit``: Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy``
("Attempt to convert a value (PerReplica…)"). Why not ``distribute_datasets_from_function``:
its iterators cannot be saved in a checkpoint, so the data position would be lost on resume.

With exact epochs (``trainer.resume``) every batch also carries its examples' positions; the
step all-gathers them, so every worker adds the same global batch to the delivered set that
is saved with the model.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.config import TrainConfig
from trainer.evaluation import evaluate
from trainer.inputs import Inputs
from trainer.metrics import GpuUtilization, StepWindow, SummaryWriters
from trainer.optim import learning_rate_at
from trainer.preemption import StopSignal
from trainer.setup import PreparedRun, prepare_run
from trainer.strategy import Distribution
from trainer.user_model import Objective

if TYPE_CHECKING:
    from tfrecord_io.delivery import DeliveryTracker

__all__ = ["TrainResult", "run_training"]

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


def run_training(
    config: TrainConfig,
    dist: Distribution,
    inputs: Inputs,
    *,
    model_fn: Callable[..., Any] | None = None,
    objective: Objective | None = None,
) -> TrainResult:
    """Trains to ``config.steps`` (or epochs), resuming from ``config.model_dir`` if it holds
    a checkpoint.

    Args:
      config: the run.
      dist: the strategy and this worker's place in the cluster (``create_distribution``).
      inputs: the data (``ReaderInputs`` over the project's reader).
      model_fn: builds the model (``trainer.user_model``); None builds ``config.model``.
      objective: the loss and extra metrics; None is cross-entropy and accuracy.

    Returns:
      How the run ended; ``exit_code`` is non-zero when a signal stopped it.

    Raises:
      ValueError: if the model cannot be built or does not fit the data, the global batch does
        not split over the replicas, or a checkpoint does not fit the model.
      FloatingPointError: if the loss becomes NaN or infinite (the last checkpoint is kept).
      RuntimeError: if the training data runs out (the reader repeats forever, so this means a
        custom ``Inputs`` is finite).
    """
    notes = _OncePerRun()
    reader_log = logging.getLogger("tfrecord_io.reader")
    reader_log.addFilter(notes)
    try:
        # The run's objects are freed as _train returns: among them the training iterator,
        # whose threads tf.data joins (see _Stopping).
        result, stopping = _train(config, dist, inputs, model_fn=model_fn, objective=objective)
    finally:
        reader_log.removeFilter(notes)
    stopping.done()
    return result


class _Stopping:
    """Says so when the end of a run (closing the event files, freeing the training input
    pipeline) takes more than ``after`` seconds.

    Freeing a ``tf.data`` iterator joins its background threads. Its autotuning thread sleeps
    between optimisations for a period that doubles up to a minute as a run goes on, and the
    join could wait out that sleep: up to a minute at the end of a run, silently. A timer logs
    one line if the wait is long, and how long it took.
    """

    def __init__(self, after: float = 2.0) -> None:
        import threading

        self._started = time.perf_counter()
        self._fired = False
        self._timer = threading.Timer(after, self._say)
        self._timer.daemon = True
        self._timer.start()

    def _say(self) -> None:
        self._fired = True
        _log.info(
            "finishing the run: closing the event files and stopping the input pipeline "
            "(tf.data's background threads)"
        )

    def done(self) -> None:
        self._timer.cancel()
        if self._fired:
            _log.info("run finished in %.1fs", time.perf_counter() - self._started)


class _OncePerRun(logging.Filter):
    """Lets each distinct message through once. The reader notes what it does with the data
    (``image_size 24 differs ...: every image is resized``) each time a dataset is built: for
    the training data, then for the eval data; once is what the run needs."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


def _train(
    config: TrainConfig,
    dist: Distribution,
    inputs: Inputs,
    *,
    model_fn: Callable[..., Any] | None,
    objective: Objective | None,
) -> tuple[TrainResult, _Stopping]:
    """``run_training``'s work, while the reader's repeated notes are held back; the result,
    and the timer that watches the freeing of the run's objects as this returns."""
    run = prepare_run(config, dist, inputs, model_fn=model_fn, objective=objective)
    writers = SummaryWriters(
        config.model_dir, is_chief=dist.is_chief, worker_index=dist.worker_index
    )
    gpu = GpuUtilization(enabled=dist.device_kind == "GPU")
    loop = _StepLoop(config, dist, inputs, run, writers, gpu)
    try:
        exit_code = loop.run()
        stopping = _Stopping()  # from here to the return of run_training
    finally:
        gpu.close()
        writers.close()
        if run.audit is not None:
            run.audit.close()
    result = TrainResult(
        start_step=run.restored.step,
        step=loop.step,
        exit_code=exit_code,
        input_restored=run.restored.input_restored,
        train_metrics=loop.last_train,
        eval_metrics=loop.last_eval,
        checkpoint=loop.last_checkpoint,
        resume_kind=run.restored.kind,
    )
    return result, stopping


class _StepLoop:
    """The steps of one run, with what it last logged, saved and evaluated.

    Attributes:
      step: the last completed step.
      last_train: the last logged training scalars.
      last_eval: the last evaluation's results, or None.
      last_checkpoint: the last checkpoint the chief wrote (or restored), or None.
    """

    def __init__(
        self,
        config: TrainConfig,
        dist: Distribution,
        inputs: Inputs,
        run: PreparedRun,
        writers: SummaryWriters,
        gpu: GpuUtilization,
    ) -> None:
        self._config = config
        self._dist = dist
        self._inputs = inputs
        self._run = run
        self._writers = writers
        self._gpu = gpu
        self._eval_every = run.eval_every
        self._window = StepWindow(config.global_batch_size)
        # The first call of each compiled variant traces it: its time is not a step's.
        self._traced: set[str] = set()
        self.step = run.restored.step
        self.last_train: dict[str, float] = {}
        self.last_eval: dict[str, float] | None = None
        self.last_checkpoint = run.restored.checkpoint
        self._last_saved = self.step if run.restored.checkpoint else -1
        self._last_evaluated = self.step
        # Built once: every evaluation is a fresh pass over the same dataset.
        self._eval_data: Any = None
        # Epochs completed exactly once since the last line saying so: (epoch, step).
        self._epochs_done: list[tuple[int, int]] = []

    def run(self) -> int:
        """Steps to the target; returns the exit code (128 + the signal's number if stopped).

        Raises:
          FloatingPointError: if the loss becomes NaN or infinite without loss scaling.
          RuntimeError: if the training data runs out.
        """
        config, run, has_eval = self._config, self._run, self._inputs.has_eval
        with StopSignal() as stop:
            while self.step < run.total_steps:
                stop_votes = self._train_step(stop)
                if stop_votes > 0:
                    # Quietly: the caller says in one line what was kept (trainer.train).
                    self._save(quiet=True)
                    self._log_epochs()
                    return stop.exit_code if stop.requested else 128 + signal.SIGTERM
                if self.step % config.checkpoint_every == 0 or self.step == run.total_steps:
                    self._save()
                if has_eval and self.step % self._eval_every == 0:
                    self._evaluate()
            if has_eval and self._last_evaluated != self.step:
                self._evaluate()
            if self._last_saved != self.step:
                self._save()
            self._log_epochs()
        return 0

    def _train_step(self, stop: StopSignal) -> float:
        """Trains one step and records it; returns the global count of stop votes."""
        import tensorflow as tf

        run = self._run
        started = time.perf_counter()
        try:
            element = next(run.iterator)
        except StopIteration:
            raise RuntimeError(
                f"the training data ended after step {self.step}; the training dataset must repeat"
            ) from None
        fetched = time.perf_counter()
        log_now = (self.step + 1) % self._config.log_every == 0 or self.step + 1 == run.total_steps
        variant = "with_norm" if log_now else "plain"
        fn = run.steps.train_with_norm if log_now else run.steps.train_plain
        flag = tf.constant(1.0 if stop.requested else 0.0)
        positions = element[-1] if run.tracker is not None else None
        totals, norm, gathered = fn(element[0], element[1], flag, positions)
        values = [float(v) for v in totals.numpy()]
        loss, correct, stop_votes = values[:3]
        finished = time.perf_counter()
        self.step += 1
        if not math.isfinite(loss) and not run.loss_scaling:
            raise FloatingPointError(
                f"loss is {loss} at step {self.step}: training diverged. Lower --base_lr or "
                "lengthen --warmup_steps; "
                + (
                    f"the last checkpoint is {self.last_checkpoint}"
                    if self.last_checkpoint
                    else "no checkpoint was written yet"
                )
            )
        if run.audit is not None:
            run.audit.write(element[2].numpy().tolist())
        if run.tracker is not None:
            done = _record_delivery(run.tracker, gathered.numpy(), self.step)
            self._epochs_done += [(epoch, self.step) for epoch in done]
        self._window.add(
            loss=loss,
            correct=correct,
            wait_seconds=fetched - started,
            step_seconds=finished - started,
            timed=variant in self._traced,
            metrics=dict(zip(run.steps.objective.metric_names, values[3:], strict=True)),
        )
        self._traced.add(variant)
        if log_now:
            self._log_scalars(float(norm.numpy()))
        return stop_votes

    def _log_scalars(self, grad_norm: float) -> None:
        """Writes the window's training scalars to TensorBoard and the log."""
        optim, total = self._config.optim, self._run.total_steps
        scalars = self._window.scalars()
        scalars["learning_rate"] = learning_rate_at(
            self.step - 1,
            peak_lr=optim.peak_lr(self._config.global_batch_size),
            warmup_steps=optim.warmup_steps,
            schedule=optim.schedule,
            total_steps=total,
        )
        scalars["grad_norm"] = grad_norm
        utilisation = self._gpu.take_mean()
        if utilisation is not None:
            scalars["gpu_utilization"] = utilisation
        self._writers.write_train(self.step, scalars)
        self.last_train = scalars
        _log.info("step %d/%d %s", self.step, total, _format(scalars))

    def _save(self, *, quiet: bool = False) -> None:
        """Saves a checkpoint at the current step (the audit file first); logs it unless
        ``quiet``."""
        if self._run.audit is not None:
            self._run.audit.flush()
        path = self._run.checkpointer.save(self.step)
        self._last_saved = self.step
        if path:
            self.last_checkpoint = path
            if not quiet:
                _log.info("saved %s", path)
                self._log_epochs()

    def _log_epochs(self) -> None:
        """Says which epochs completed exactly once since it last did: one line at each
        checkpoint, evaluation and the end, so that short epochs (a small dataset completes one
        every step or two) do not outnumber the step lines."""
        done, self._epochs_done = self._epochs_done, []
        if len(done) == 1:
            _log.info("epoch %d complete at step %d: every example exactly once", *done[0])
        elif done:
            (first, first_step), (last, last_step) = done[0], done[-1]
            _log.info(
                "epochs %d-%d complete at steps %d-%d: every example exactly once in each",
                first,
                last,
                first_step,
                last_step,
            )

    def _evaluate(self) -> None:
        """Evaluates on the whole eval split and writes the results."""
        started = time.perf_counter()
        if self._eval_data is None:
            self._eval_data = self._inputs.eval_dataset(self._dist.input_context())
        result = evaluate(self._run.steps, self._eval_data)
        self._last_evaluated = self.step
        self.last_eval = result
        # The example count goes to TensorBoard too: diagnose judges the split's size by it.
        self._writers.write_eval(self.step, dict(result))
        scalars = {name: value for name, value in result.items() if name != "examples"}
        _log.info(
            "step %d validation: %s over %d examples (%.1fs)",
            self.step,
            " ".join(f"{name} {value:.4g}" for name, value in scalars.items()),
            int(result["examples"]),
            time.perf_counter() - started,
        )
        self._log_epochs()


def _format(scalars: dict[str, float]) -> str:
    """The log line's text for training scalars."""
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


def _record_delivery(tracker: DeliveryTracker, positions: Any, step: int) -> list[int]:
    """Adds a global batch's positions to the delivered set; reports what should not happen.

    Returns:
      The epochs this batch completed with every example exactly once (``_log_epochs`` says
      so later; an epoch closed with examples missing is reported by the tracker at once).
    """
    result = tracker.add(positions)
    if result.duplicates or result.stale:
        _log.error(
            "step %d trained on %d example(s) already trained on in their epoch and %d of a "
            "closed epoch: the exactly-once guarantee is broken",
            step,
            result.duplicates,
            result.stale,
        )
    return [epoch for epoch, missing in result.completed if not missing]
