"""TensorBoard scalars for the training-health checks of ``trainer.diagnosis``.

Written under ``MODEL_DIR/train`` (every ``log_every`` steps) and ``MODEL_DIR/validation``:

| tag | meaning |
|---|---|
| ``loss``, ``accuracy`` | mean over the steps since the last write (validation: whole split) |
| ``learning_rate`` | the rate applied at the current step |
| ``grad_norm`` | global L2 norm of the all-reduced gradient, at the write step |
| ``step_time`` | mean seconds per step (waiting for input included) |
| ``examples_per_sec`` | global examples per second |
| ``input_wait`` | fraction of step time spent blocked on the next batch |
| ``gpu_utilization`` | mean NVML utilisation (%) of this host's GPUs, only when there are GPUs |
| ``examples`` | validation only: how many examples the evaluation saw (how far to trust it) |

Timings leave out steps that traced a ``tf.function``, which are compile time, not step time.
Non-chief workers write the same scalars under ``MODEL_DIR/workers/worker-<k>/train``, so a
worker whose input is slower than the chief's shows up too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

__all__ = [
    "ACCURACY",
    "EVENT_FILE_PATTERN",
    "EXAMPLES",
    "EXAMPLES_PER_SEC",
    "GPU_UTILIZATION",
    "GRAD_NORM",
    "INPUT_WAIT",
    "LEARNING_RATE",
    "LOSS",
    "STEP_TIME",
    "TAGS",
    "TRAIN_RUN",
    "VALIDATION_RUN",
    "WORKERS_DIR",
    "GpuUtilization",
    "StepWindow",
    "SummaryWriters",
    "worker_dir",
]

_log = logging.getLogger(__name__)

# The scalar tags (see the table above); trainer.diagnosis reads them by these names.
LOSS = "loss"
ACCURACY = "accuracy"
LEARNING_RATE = "learning_rate"
GRAD_NORM = "grad_norm"
STEP_TIME = "step_time"
EXAMPLES_PER_SEC = "examples_per_sec"
INPUT_WAIT = "input_wait"
GPU_UTILIZATION = "gpu_utilization"
EXAMPLES = "examples"
TAGS = (
    LOSS,
    ACCURACY,
    LEARNING_RATE,
    GRAD_NORM,
    STEP_TIME,
    EXAMPLES_PER_SEC,
    INPUT_WAIT,
    GPU_UTILIZATION,
)

# The run-directory layout: MODEL_DIR/{train,validation}/ for the chief,
# MODEL_DIR/workers/worker-<k>/train/ for the others.
TRAIN_RUN = "train"
VALIDATION_RUN = "validation"
WORKERS_DIR = "workers"
EVENT_FILE_PATTERN = "events.out.tfevents.*"


def worker_dir(model_dir: str, worker_index: int) -> str:
    """Where a non-chief worker writes its runs."""
    return os.path.join(model_dir, WORKERS_DIR, f"worker-{worker_index:05d}")


@dataclasses.dataclass
class StepWindow:
    """Accumulates per-step figures between two scalar writes.

    Attributes:
      global_batch_size: examples per step over all workers.
    """

    global_batch_size: int
    steps: int = 0
    loss_sum: float = 0.0
    correct: float = 0.0
    timed_steps: int = 0
    wait_seconds: float = 0.0
    step_seconds: float = 0.0
    # A user's metric -> its sum over the window's examples (trainer.user_model.Objective).
    metric_sums: dict[str, float] = dataclasses.field(default_factory=dict)

    def add(
        self,
        *,
        loss: float,
        correct: float,
        wait_seconds: float,
        step_seconds: float,
        timed: bool,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Adds one step; ``timed`` is False for a step that compiled a function; ``metrics``
        are the step's sums of the user's per-example metrics."""
        self.steps += 1
        self.loss_sum += loss
        self.correct += correct
        for name, value in (metrics or {}).items():
            self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value
        if timed:
            self.timed_steps += 1
            self.wait_seconds += wait_seconds
            self.step_seconds += step_seconds

    def scalars(self) -> dict[str, float]:
        """The window's scalars (timings only when some step was timed); then resets."""
        out: dict[str, float] = {}
        if self.steps:
            out["loss"] = self.loss_sum / self.steps
            out["accuracy"] = self.correct / (self.steps * self.global_batch_size)
            for name, total in self.metric_sums.items():
                out[name] = total / (self.steps * self.global_batch_size)
        if self.timed_steps and self.step_seconds > 0:
            out["step_time"] = self.step_seconds / self.timed_steps
            out["examples_per_sec"] = self.timed_steps * self.global_batch_size / self.step_seconds
            out["input_wait"] = self.wait_seconds / self.step_seconds
        self.steps = self.timed_steps = 0
        self.loss_sum = self.correct = self.wait_seconds = self.step_seconds = 0.0
        self.metric_sums = {}
        return out


class SummaryWriters:
    """TensorBoard writers for the train and validation scalars of one worker.

    Args:
      model_dir: the run directory.
      is_chief: the chief writes ``train/`` and ``validation/``; other workers write under
        ``workers/worker-<k>/``.
      worker_index: this worker.
    """

    def __init__(self, model_dir: str, *, is_chief: bool, worker_index: int) -> None:
        import tensorflow as tf

        base = model_dir if is_chief else worker_dir(model_dir, worker_index)
        self.train_dir = os.path.join(base, TRAIN_RUN)
        self.eval_dir = os.path.join(base, VALIDATION_RUN)
        self._train = tf.summary.create_file_writer(self.train_dir)
        self._eval = tf.summary.create_file_writer(self.eval_dir) if is_chief else None

    def write_train(self, step: int, scalars: dict[str, float]) -> None:
        self._write(self._train, step, scalars)

    def write_eval(self, step: int, scalars: dict[str, float]) -> None:
        if self._eval is not None:
            self._write(self._eval, step, scalars)

    @staticmethod
    def _write(writer: Any, step: int, scalars: dict[str, float]) -> None:
        import tensorflow as tf

        with writer.as_default(step=step):
            for tag, value in scalars.items():
                tf.summary.scalar(tag, value)
        writer.flush()

    def close(self) -> None:
        for writer in (self._train, self._eval):
            if writer is not None:
                writer.close()


class GpuUtilization:
    """Samples NVML GPU utilisation in a background thread; a no-op without GPUs.

    Args:
      enabled: whether TensorFlow sees a GPU; NVML is not touched otherwise.
      interval: seconds between samples.
    """

    def __init__(self, *, enabled: bool, interval: float = 0.5) -> None:
        self._handles: list[Any] = []
        self._samples: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._interval = interval
        if not enabled:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in self._visible_indices(pynvml)
            ]
        except Exception as e:  # NVML raises its own error types; none of them are fatal here.
            _log.warning("GPU utilisation is not logged: NVML is unavailable (%s)", e)
            self._handles = []
            return
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()

    @staticmethod
    def _visible_indices(pynvml: Any) -> list[int]:
        count = pynvml.nvmlDeviceGetCount()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return list(range(count))
        indices = [int(v) for v in visible.split(",") if v.strip().isdigit()]
        return [i for i in indices if i < count]

    @property
    def active(self) -> bool:
        return bool(self._handles)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                values = [
                    float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu) for h in self._handles
                ]
            except Exception as e:  # a GPU that fell off the bus must not kill training
                _log.warning("NVML sampling failed, GPU utilisation no longer logged: %s", e)
                return
            with self._lock:
                self._samples.append(sum(values) / len(values))

    def take_mean(self) -> float | None:
        """Mean utilisation (%) since the last call, or None when nothing was sampled."""
        with self._lock:
            samples, self._samples = self._samples, []
        return sum(samples) / len(samples) if samples else None

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self._interval + 1)
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:  # shutting down a dead NVML is not worth an error
                _log.debug("nvmlShutdown failed: %s", e)
