"""Evaluation: one lockstep pass of every worker over its shard of the eval split."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.steps import TrainSteps

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["EVALUATIONS_PER_RUN", "eval_interval", "evaluate"]

# How many evaluations a run makes by default: enough to see validation follow training, few
# enough that a small dataset's run is not mostly evaluation (one per epoch of 191 examples
# was 80 evaluations in a 400-step run).
EVALUATIONS_PER_RUN = 5


def eval_interval(eval_every: int | None, total_steps: int) -> int:
    """Steps between evaluations: ``eval_every`` when given, else a fifth of the run, rounded
    up (``EVALUATIONS_PER_RUN`` evaluations; the last one at the final step).

    It depends on the step target alone, so a resumed run evaluates at the steps an
    uninterrupted one would.
    """
    if eval_every is not None:
        return eval_every
    return max(1, -(-total_steps // EVALUATIONS_PER_RUN))


def evaluate(steps: TrainSteps, dataset: tf.data.Dataset) -> dict[str, float]:
    """One pass over this worker's eval shard, in lockstep with the other workers.

    Workers may hold different numbers of eval batches. A worker whose shard is done keeps
    stepping with empty batches, and the pass ends when a step counts no example anywhere, so
    every worker runs the same number of collective steps.

    Args:
      steps: the compiled steps of the model being trained.
      dataset: this worker's ``(images, labels[, ...])`` eval batches, each example once.

    Returns:
      ``{"loss", "accuracy", "examples"}`` and the user's metrics (``steps.objective``) over
      the whole eval split; all but ``examples`` are NaN when the split is empty.
    """
    import numpy as np
    import tensorflow as tf

    spec = dataset.element_spec
    empty_images = tf.zeros([0, *spec[0].shape[1:]], spec[0].dtype)
    empty_labels = tf.zeros([0], spec[1].dtype)
    iterator = iter(dataset)
    names = steps.objective.metric_names
    totals = np.zeros(3 + len(names))
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
        return {"loss": float("nan"), "accuracy": float("nan"), "examples": 0.0} | {
            name: float("nan") for name in names
        }
    return {
        "loss": float(totals[0] / examples),
        "accuracy": float(totals[1] / examples),
        "examples": examples,
    } | {name: float(total / examples) for name, total in zip(names, totals[3:], strict=True)}
