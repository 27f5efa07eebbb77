"""The optimiser and the learning-rate schedule: linear scaling with warm-up.

``LR = base_lr * global_batch_size / 256`` (Goyal et al.): a larger global batch averages the
gradient over more examples, so the step can grow in proportion without making training
unstable. It is reached by a linear warm-up so the first large steps do not blow the weights up.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from trainer.config import OptimConfig

if TYPE_CHECKING:
    import keras

__all__ = ["WarmupSchedule", "build_optimizer", "learning_rate_at"]


def learning_rate_at(
    step: int, *, peak_lr: float, warmup_steps: int, schedule: str, total_steps: int
) -> float:
    """The learning rate applied at 0-based ``step``, in plain Python (for logs and tests).

    Warm-up is linear from ``peak_lr / warmup_steps`` at step 0 to ``peak_lr`` at step
    ``warmup_steps - 1``. After it, ``constant`` holds the peak; ``cosine`` decays it to 0 at
    ``total_steps``.
    """
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def _schedule_base() -> type:
    import keras

    return keras.optimizers.schedules.LearningRateSchedule


# The base class is computed, so that importing this module does not import Keras; mypy cannot
# follow a computed base, hence the ignore.
class WarmupSchedule(_schedule_base()):  # type: ignore[misc]
    """A Keras schedule computing ``learning_rate_at`` on the optimiser's step counter."""

    def __init__(self, *, peak_lr: float, warmup_steps: int, schedule: str, total_steps: int):
        super().__init__()
        self.peak_lr = float(peak_lr)
        self.warmup_steps = int(warmup_steps)
        self.schedule = schedule
        self.total_steps = int(total_steps)

    def __call__(self, step):  # Keras API
        import keras

        ops = keras.ops
        step = ops.cast(step, "float32")
        peak = ops.cast(self.peak_lr, "float32")
        if self.schedule == "constant":
            after = peak
        else:
            span = float(max(1, self.total_steps - self.warmup_steps))
            progress = ops.minimum(1.0, (step - self.warmup_steps) / span)
            after = peak * 0.5 * (1.0 + ops.cos(math.pi * progress))
        if not self.warmup_steps:
            return after
        warm = peak * (step + 1.0) / float(self.warmup_steps)
        return ops.where(step < self.warmup_steps, warm, after)

    def get_config(self) -> dict:
        return {
            "peak_lr": self.peak_lr,
            "warmup_steps": self.warmup_steps,
            "schedule": self.schedule,
            "total_steps": self.total_steps,
        }


def build_optimizer(
    config: OptimConfig, *, global_batch_size: int, total_steps: int, loss_scaling: bool = False
) -> keras.optimizers.Optimizer:
    """Builds the optimiser with the scaled, warmed-up schedule. Call inside the strategy scope.

    Args:
      config: optimiser settings.
      global_batch_size: the global batch, for the linear scaling rule.
      total_steps: the last step, for the cosine schedule.
      loss_scaling: wrap in a ``LossScaleOptimizer`` (float16 training).

    Returns:
      The Keras optimiser.
    """
    import keras

    schedule = WarmupSchedule(
        peak_lr=config.peak_lr(global_batch_size),
        warmup_steps=config.warmup_steps,
        schedule=config.schedule,
        total_steps=total_steps,
    )
    if config.name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=config.momentum)
    else:
        optimizer = keras.optimizers.Adam(learning_rate=schedule)
    if loss_scaling:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
