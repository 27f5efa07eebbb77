"""Training-health checks on a run's TensorBoard scalars: is it input-bound, unstable, or not
learning?

The signals that tell these apart on a distributed run are step-time jitter (resource
contention), time spent waiting for input (an I/O bottleneck), accelerator use, the gradient
norm (exploding or vanishing), the shape of the loss curve and the validation loss.

``read_scalars`` reads the scalars a run wrote and ``diagnose_run`` gives one verdict per row
of the table, with the numbers behind it (the command is ``trainer.diagnose``):

| check | warns when (defaults, see ``Thresholds``) | reading |
|---|---|---|
| step time | ``(p90 - p10) / median`` of ``step_time`` > 0.5 | jitter: resource contention |
| input pipeline | median ``input_wait`` > 20% of the step (chief or any worker) | input-bound: I/O bottleneck |
| accelerator | median ``gpu_utilization`` < 70%, where logged | accelerator idle |
| gradient norm | late median > 10x early median, a point > 10x the largest early norm, or not finite | exploding |
| | late median < 1e-3x early median, or < 1e-7 | vanishing |
| loss curve | last-quarter mean not >= 2% below first-quarter mean, or not finite | not decreasing |
| | robust point-to-point noise > 15% of the total decrease, or a spike above half of it | not smooth: tune hyper-parameters |
| validation | last validation loss > 1.1x its minimum, up by > 0.05 nats and > 5% of the first, while the training loss falls | overfitting |
| | (OK, a note) last validation loss > 0.5 nats and > 3x above the last-quarter training loss | generalisation gap |
| validation size, leakage, validation noise | see ``trainer.validation_trust``: the split too small, leaking train, or noisier than its trend | validation not to be trusted |

The first 10% of timing points are left out (warm-up). A check with too few points, or whose
scalar was not logged, says ``n/a``.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import statistics
from collections.abc import Sequence

from trainer.metrics import (
    EVENT_FILE_PATTERN,
    EXAMPLES_PER_SEC,
    GPU_UTILIZATION,
    GRAD_NORM,
    INPUT_WAIT,
    LOSS,
    STEP_TIME,
    TRAIN_RUN,
    VALIDATION_RUN,
    WORKERS_DIR,
)
from trainer.validation_trust import leakage_verdict, noise_verdict, size_verdict
from trainer.verdicts import NA, OK, WARN, Series, Verdict

__all__ = [
    "OK",
    "WARN",
    "NA",
    "Thresholds",
    "Verdict",
    "Series",
    "LogsUnreadable",
    "read_scalars",
    "diagnose_run",
    "format_table",
]


class LogsUnreadable(Exception):
    """The run's event files are missing or hold no scalars."""


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Where each verdict turns from OK to WARN (see the module docstring)."""

    jitter_spread: float = 0.5
    input_wait: float = 0.2
    gpu_utilization: float = 70.0
    grad_explode_ratio: float = 10.0
    grad_vanish_ratio: float = 1e-3
    grad_vanish_abs: float = 1e-7
    loss_min_decrease: float = 0.02
    loss_roughness: float = 0.15
    overfit_ratio: float = 1.1
    overfit_min_rise: float = 0.05
    generalisation_gap: float = 0.5
    generalisation_ratio: float = 3.0
    warmup_fraction: float = 0.1
    min_points: int = 5
    validation_margin: float = 0.1
    validation_noise: float = 1.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"threshold {field.name} must be a number >= 0, got {value!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if self.min_points < 3:
            raise ValueError(f"min_points must be >= 3, got {self.min_points}")


def _event_dirs(model_dir: str) -> dict[str, str]:
    """Run name -> directory holding event files."""
    runs: dict[str, str] = {}
    if glob.glob(os.path.join(model_dir, EVENT_FILE_PATTERN)):
        runs[TRAIN_RUN] = model_dir
    for name in (TRAIN_RUN, VALIDATION_RUN):
        path = os.path.join(model_dir, name)
        if glob.glob(os.path.join(path, EVENT_FILE_PATTERN)):
            runs[name] = path
    for path in sorted(glob.glob(os.path.join(model_dir, WORKERS_DIR, "*", TRAIN_RUN))):
        if glob.glob(os.path.join(path, EVENT_FILE_PATTERN)):
            runs[f"{os.path.basename(os.path.dirname(path))}/{TRAIN_RUN}"] = path
    return runs


def _drop_orphans(events: list[tuple[float, int, float]]) -> Series:
    """Keeps what a resumed run really trained: ``(wall_time, step, value)`` -> ``(step, value)``.

    A run that restarts from the checkpoint at step N logs steps after N again; the values
    logged before the restart for those steps belong to a timeline that was thrown away.
    TensorBoard only purges them for old-style logs, so they are dropped here: in write
    order, a step at or below the last kept one discards every kept point from that step on.
    """
    kept: Series = []
    for _, step, value in sorted(events, key=lambda e: e[0]):
        while kept and kept[-1][0] >= step:
            kept.pop()
        kept.append((step, value))
    return kept


def read_scalars(model_dir: str) -> dict[str, dict[str, Series]]:
    """Reads every scalar of a run: ``{run: {tag: [(step, value), ...]}}``.

    Runs are ``train``, ``validation`` and ``worker-<k>/train``. When a resumed run re-logged
    steps, only the values of the resumed timeline are kept.

    Raises:
      LogsUnreadable: if the directory does not exist, holds no event files, or they hold no
        scalars.
    """
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    if not os.path.isdir(model_dir):
        raise LogsUnreadable(f"{model_dir} is not a directory")
    runs = _event_dirs(model_dir)
    if not runs:
        raise LogsUnreadable(
            f"no TensorBoard event files in {model_dir} (expected {model_dir}/train/"
            "events.out.tfevents.*)"
        )
    out: dict[str, dict[str, Series]] = {}
    for run, path in runs.items():
        accumulator = event_accumulator.EventAccumulator(
            path,
            size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0},
        )
        try:
            accumulator.Reload()
        except Exception as e:  # the loader raises assorted errors on damaged files
            raise LogsUnreadable(f"cannot read the event files in {path}: {e}") from e
        tags = accumulator.Tags()
        series: dict[str, Series] = {}
        for tag in tags.get("scalars", []):
            series[tag] = _drop_orphans(
                [(e.wall_time, e.step, float(e.value)) for e in accumulator.Scalars(tag)]
            )
        for tag in tags.get("tensors", []):
            timed: list[tuple[float, int, float]] = []
            for event in accumulator.Tensors(tag):
                array = tensor_util.make_ndarray(event.tensor_proto)
                if array.size == 1 and array.dtype.kind in "fiu":
                    timed.append((event.wall_time, event.step, float(array.reshape(()))))
            if timed:
                series[tag] = _drop_orphans(timed)
        if series:
            out[run] = series
    if not out:
        raise LogsUnreadable(f"the event files in {model_dir} hold no scalars")
    return out


def _values(series: Series | None) -> list[float]:
    return [v for _, v in series] if series else []


def _after_warmup(values: list[float], t: Thresholds) -> list[float]:
    skip = max(1, math.ceil(len(values) * t.warmup_fraction)) if len(values) > 1 else 0
    return values[skip:]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _quarters(values: list[float]) -> tuple[list[float], list[float]]:
    n = max(1, len(values) // 4)
    return values[:n], values[-n:]


def _too_few(check: str, tag: str, count: int, t: Thresholds) -> Verdict:
    return Verdict(check, NA, "too few points", f"{count} '{tag}' points < {t.min_points}")


def _enough_points(
    check: str,
    series: dict[str, Series],
    tag: str,
    t: Thresholds,
    *,
    warmup: bool,
    absent: str = "",
) -> list[float] | Verdict:
    """The values of scalar ``tag`` (past the warm-up when ``warmup``), or ``check``'s n/a
    verdict when it was not logged (``absent`` says why it may not be) or has too few points."""
    if tag not in series:
        return Verdict(check, NA, "not logged", f"no '{tag}' scalar{absent}")
    values = _values(series[tag])
    if warmup:
        values = _after_warmup(values, t)
    if len(values) < t.min_points:
        return _too_few(check, tag, len(values), t)
    return values


def _step_time(train: dict[str, Series], t: Thresholds) -> Verdict:
    check = "step time"
    values = _enough_points(check, train, STEP_TIME, t, warmup=True)
    if isinstance(values, Verdict):
        return values
    median = statistics.median(values)
    p10, p90 = _quantile(values, 0.1), _quantile(values, 0.9)
    spread = (p90 - p10) / median if median > 0 else math.inf
    evidence = (
        f"median {median * 1000:.1f} ms, p10 {p10 * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, "
        f"max {max(values) * 1000:.1f} ms over {len(values)} points: spread (p90-p10)/median "
        f"{spread:.2f} {'>' if spread > t.jitter_spread else '<='} {t.jitter_spread}"
    )
    if spread > t.jitter_spread:
        return Verdict(check, WARN, "jitter: resource contention", evidence)
    return Verdict(check, OK, "steady", evidence)


def _input_wait(runs: dict[str, dict[str, Series]], t: Thresholds) -> Verdict:
    check = "input pipeline"
    medians: dict[str, float] = {}
    for run, series in runs.items():
        if run.endswith(TRAIN_RUN) and INPUT_WAIT in series:
            values = _after_warmup(_values(series[INPUT_WAIT]), t)
            if len(values) >= t.min_points:
                medians[run] = statistics.median(values)
    if not medians:
        logged = any(INPUT_WAIT in s for s in runs.values())
        if logged:
            count = max(len(_after_warmup(_values(s.get(INPUT_WAIT)), t)) for s in runs.values())
            return _too_few(check, INPUT_WAIT, count, t)
        return Verdict(check, NA, "not logged", "no 'input_wait' scalar")
    worst_run = max(medians, key=lambda r: medians[r])
    worst = medians[worst_run]
    parts = [f"median input_wait {medians[r]:.0%} of the step ({r})" for r in sorted(medians)]
    speed = _values(runs.get(TRAIN_RUN, {}).get(EXAMPLES_PER_SEC))
    if speed:
        parts.append(f"median {statistics.median(_after_warmup(speed, t)):.0f} examples/s")
    evidence = "; ".join(parts) + f"; threshold {t.input_wait:.0%}"
    if worst > t.input_wait:
        return Verdict(check, WARN, f"input-bound ({worst_run}): I/O bottleneck", evidence)
    return Verdict(check, OK, "the input keeps up", evidence)


def _accelerator(runs: dict[str, dict[str, Series]], t: Thresholds) -> Verdict:
    check = "accelerator"
    train = runs.get(TRAIN_RUN, {})
    values = _enough_points(check, train, GPU_UTILIZATION, t, warmup=True, absent=" (no GPU)")
    if isinstance(values, Verdict):
        return values
    median = statistics.median(values)
    low = sum(v < t.gpu_utilization for v in values) / len(values)
    evidence = (
        f"median GPU utilisation {median:.0f}%, below {t.gpu_utilization:.0f}% in {low:.0%} of "
        f"{len(values)} points"
    )
    if median >= t.gpu_utilization:
        return Verdict(check, OK, "busy", evidence)
    waits = _values(train.get(INPUT_WAIT))
    if waits and statistics.median(_after_warmup(waits, t)) > t.input_wait:
        return Verdict(check, WARN, "GPU idle while waiting for input: I/O bottleneck", evidence)
    return Verdict(
        check, WARN, "GPU under-used, input keeps up: batch or model too small for it", evidence
    )


def _grad_norm(train: dict[str, Series], t: Thresholds) -> Verdict:
    check = "gradient norm"
    values = _enough_points(check, train, GRAD_NORM, t, warmup=False)
    if isinstance(values, Verdict):
        return values
    bad = [v for v in values if not math.isfinite(v)]
    if bad:
        return Verdict(
            check, WARN, "exploding (not finite)", f"{len(bad)} of {len(values)} points NaN/inf"
        )
    first, last = _quarters(values)
    early, late = statistics.median(first), statistics.median(last)
    # A spike is measured against the largest norm of the first quarter seen before it:
    # gradients are largest early in a healthy run, and once the loss is near zero one hard
    # batch is a big jump from a tiny median without being an explosion.
    spike, spike_at = max(
        (
            (values[i] / max(values[: min(i, len(first))]), i)
            for i in range(1, len(values))
            if max(values[: min(i, len(first))]) > 0
        ),
        default=(0.0, 0),
    )
    evidence = (
        f"first-quarter median {early:.3g}, last-quarter median {late:.3g}, max {max(values):.3g}"
        f" ({spike:.3g}x the largest early norm)"
    )
    if late > t.grad_explode_ratio * early or spike > t.grad_explode_ratio:
        return Verdict(
            check, WARN, "exploding", evidence + f"; ratio limit {t.grad_explode_ratio:g}x"
        )
    if late < t.grad_vanish_ratio * early or late < t.grad_vanish_abs:
        return Verdict(
            check,
            WARN,
            "vanishing",
            evidence
            + f"; limit {t.grad_vanish_ratio:g}x the first quarter or {t.grad_vanish_abs:g}",
        )
    return Verdict(check, OK, "stable", evidence)


def _loss(train: dict[str, Series], t: Thresholds) -> Verdict:
    check = "loss curve"
    values = _enough_points(check, train, LOSS, t, warmup=False)
    if isinstance(values, Verdict):
        return values
    if not all(math.isfinite(v) for v in values):
        return Verdict(check, WARN, "diverged (NaN/inf loss)", f"{len(values)} points")
    first, last = _quarters(values)
    early, late = statistics.fmean(first), statistics.fmean(last)
    decrease = early - late
    relative = decrease / abs(early) if early else 0.0
    # Point-to-point noise, robustly: for white noise on a trend the differences have twice the
    # noise variance; the median absolute deviation ignores the few large drops of a fast start.
    diffs = [b - a for a, b in zip(values, values[1:], strict=False)]
    centre = statistics.median(diffs)
    noise = 1.4826 * statistics.median([abs(d - centre) for d in diffs]) / math.sqrt(2)
    # Spikes: a point above the median of the 5 before it by more than half the total decrease.
    spikes = [
        i
        for i in range(len(first), len(values))
        if values[i] - statistics.median(values[max(0, i - 5) : i]) > 0.5 * (early - late)
    ]
    evidence = (
        f"first-quarter mean {early:.4g} -> last-quarter mean {late:.4g} "
        f"({-relative:+.1%}); point-to-point noise {noise:.3g}"
    )
    if relative < t.loss_min_decrease:
        return Verdict(
            check,
            WARN,
            "not decreasing: tune the learning rate or check the labels",
            evidence + f"; needs a drop >= {t.loss_min_decrease:.0%}",
        )
    roughness = noise / decrease
    evidence += (
        f" = {roughness:.0%} of the decrease (limit {t.loss_roughness:.0%}); {len(spikes)} "
        "spike(s) above half the decrease"
    )
    if roughness > t.loss_roughness or spikes:
        return Verdict(check, WARN, "not smooth: tune the hyper-parameters", evidence)
    return Verdict(check, OK, "decreasing smoothly", evidence)


def _validation(runs: dict[str, dict[str, Series]], t: Thresholds) -> Verdict:
    check = "validation"
    val = _values(runs.get(VALIDATION_RUN, {}).get(LOSS))
    if not val:
        return Verdict(check, NA, "not logged", "no validation 'loss'")
    if len(val) < 3:
        return Verdict(check, NA, "too few points", f"{len(val)} validation points < 3")
    best, latest = min(val), val[-1]
    train_loss = _values(runs.get(TRAIN_RUN, {}).get(LOSS))
    first, last = _quarters(train_loss) if train_loss else ([0.0], [0.0])
    falling = statistics.fmean(last) < statistics.fmean(first)
    evidence = (
        f"validation loss best {best:.4g}, latest {latest:.4g} over {len(val)} evaluations; "
        f"training loss {'falling' if falling else 'not falling'}"
    )
    if not all(math.isfinite(v) for v in val):
        return Verdict(check, WARN, "validation loss not finite", evidence)
    # The rise must matter on the run's own scale (5% of the first validation loss) and in
    # absolute terms (overfit_min_rise nats): a loss near zero that wobbles from 0.003 to 0.035
    # is a model already right on every validation image, not one that is overfitting.
    rise = latest - best
    if (
        latest > t.overfit_ratio * best
        and rise > max(0.05 * abs(val[0]), t.overfit_min_rise)
        and falling
    ):
        return Verdict(check, WARN, "overfitting: validation loss rising", evidence)
    if train_loss:
        trained = statistics.fmean(last)
        gap = latest - trained
        if gap > t.generalisation_gap and latest > t.generalisation_ratio * trained:
            # Not a trend, so not a warning: a note that the model fits its training set much
            # better than data it has not seen (more data or augmentation narrows it).
            return Verdict(
                check,
                OK,
                "steady, with a generalisation gap",
                evidence + f"; latest validation loss {gap:.3g} above the last-quarter "
                f"training loss {trained:.3g}",
            )
    return Verdict(check, OK, "validation loss tracks training", evidence)


def diagnose_run(
    runs: dict[str, dict[str, Series]],
    thresholds: Thresholds | None = None,
    *,
    leakage: tuple[int, str] | None = None,
) -> list[Verdict]:
    """Applies the monitoring table to a run's scalars (as ``read_scalars`` returns them).

    Args:
      runs: the scalars.
      thresholds: where verdicts turn to WARN; None takes the defaults.
      leakage: ``trainer.validation_trust.read_leakage``'s answer for the run, or None
        (the leakage row says n/a).

    Returns:
      One verdict per check, in the table's order.
    """
    t = thresholds or Thresholds()
    train = runs.get(TRAIN_RUN, {})
    return [
        _step_time(train, t),
        _input_wait(runs, t),
        _accelerator(runs, t),
        _grad_norm(train, t),
        _loss(train, t),
        _validation(runs, t),
        size_verdict(runs, margin=t.validation_margin),
        leakage_verdict(leakage),
        noise_verdict(runs, ratio=t.validation_noise),
    ]


def format_table(verdicts: Sequence[Verdict]) -> str:
    """A plain-text table: check, status, finding, evidence."""
    rows = [("check", "status", "finding", "evidence")]
    rows += [(v.check, v.status, v.finding, v.evidence) for v in verdicts]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append(
            "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True))
            + "  "
            + row[3]
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 8)
    return "\n".join(lines)
