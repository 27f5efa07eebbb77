"""How far a run's validation numbers can be trusted: the split's size, leakage, and noise.

A validation curve can look healthy and mean nothing. Three rows of ``tfrecord-diagnose``
judge the split itself rather than the model:

| check | warns when (defaults, see ``trainer.diagnosis.Thresholds``) | reading |
|---|---|---|
| validation size | the 95 % Wilson interval of the last validation accuracy is wider than ±0.10 | too few examples to tell models apart |
| leakage | the dataset lists validation examples with a near-duplicate in train | scores inflated: the model has seen them |
| validation noise | the median step between evaluations of the validation loss exceeds its fall from first to last | the trend is noise |

The size comes from the ``examples`` scalar the trainer writes with each evaluation, the
leakage from the dataset the run read (``MODEL_DIR/run.json`` names it; its
``near_duplicates.jsonl`` flags each train-validation pair), so both need nothing but the
run directory and the dataset.
"""

from __future__ import annotations

import json
import math
import os
import statistics

from trainer.metrics import ACCURACY, EXAMPLES, LOSS, VALIDATION_RUN
from trainer.verdicts import NA, OK, WARN, Series, Verdict

__all__ = [
    "NEAR_DUPLICATES_FILE",
    "examples_for_margin",
    "leakage_verdict",
    "read_leakage",
    "size_verdict",
    "noise_verdict",
    "wilson_interval",
]

#: The pipeline's near-duplicate report, in the dataset directory.
NEAR_DUPLICATES_FILE = "near_duplicates.jsonl"
_Z95 = 1.959964


def wilson_interval(successes: float, n: int, z: float = _Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95 % by default).

    Raises:
      ValueError: if ``n`` < 1 or ``successes`` is not in [0, n].
    """
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def examples_for_margin(margin: float, p: float = 0.5, z: float = _Z95) -> int:
    """How many examples put a proportion near ``p`` within ±``margin`` (95 %)."""
    return math.ceil(z * z * max(p * (1 - p), 0.01) / (margin * margin))


def _last(runs: dict[str, dict[str, Series]], tag: str) -> float | None:
    series = runs.get(VALIDATION_RUN, {}).get(tag)
    return series[-1][1] if series else None


def size_verdict(runs: dict[str, dict[str, Series]], *, margin: float) -> Verdict:
    """Whether the last evaluation saw enough examples for its accuracy to be known within
    ±``margin`` (95 %)."""
    check = "validation size"
    count = _last(runs, EXAMPLES)
    if count is None:
        return Verdict(check, NA, "not logged", f"no validation '{EXAMPLES}' scalar")
    n = int(count)
    if n < 1:
        return Verdict(check, WARN, "validation is empty", "0 examples evaluated")
    accuracy = _last(runs, ACCURACY)
    p = 0.5 if accuracy is None else min(max(accuracy, 0.0), 1.0)
    low, high = wilson_interval(p * n, n)
    half = (high - low) / 2
    needed = examples_for_margin(margin)
    evidence = (
        f"{n} examples: accuracy {p:.3g} lies anywhere in {low:.2f}-{high:.2f} (95 % Wilson "
        f"interval, ±{half:.2f}); about {needed} examples give ±{margin:.2f} "
        "at accuracy 0.5"
    )
    if half > margin:
        return Verdict(check, WARN, "too small to trust", evidence)
    return Verdict(check, OK, "large enough", evidence)


def noise_verdict(runs: dict[str, dict[str, Series]], *, ratio: float) -> Verdict:
    """Whether the validation loss fell by more than ``ratio`` times its median jump between
    evaluations."""
    check = "validation noise"
    series = runs.get(VALIDATION_RUN, {}).get(LOSS)
    values = [v for _, v in series] if series else []
    if len(values) < 3:
        return Verdict(check, NA, "too few points", f"{len(values)} validation points < 3")
    if not all(math.isfinite(v) for v in values):
        return Verdict(check, WARN, "validation loss not finite", "a non-finite validation loss")
    fall = values[0] - values[-1]
    jumps = [abs(b - a) for a, b in zip(values, values[1:], strict=False)]
    noise = statistics.median(jumps)
    evidence = (
        f"validation loss {' -> '.join(f'{v:.3g}' for v in values[:8])}"
        f"{' ...' if len(values) > 8 else ''}; fell {fall:.3g}, median step between "
        f"evaluations {noise:.3g}"
    )
    if fall <= 0:
        return Verdict(check, NA, "no fall to judge", evidence)
    if noise > ratio * fall:
        return Verdict(check, WARN, "noisier than its fall", evidence)
    return Verdict(check, OK, "the fall exceeds the noise", evidence)


def read_leakage(model_dir: str) -> tuple[int, str] | None:
    """``(validation examples with a near-duplicate in train, the report read)`` for the
    dataset a run read, or None when the run or the dataset does not say.

    The run's ``run.json`` names the dataset; pairs the build moved to train
    (``--leakage move_to_train``) are no longer leakage and are not counted.
    """
    try:
        with open(os.path.join(model_dir, "run.json"), encoding="utf-8") as f:
            source = json.load(f).get("source") or ""
    except (OSError, ValueError):
        return None
    if not source:
        return None
    report = f"{source.rstrip('/')}/{NEAR_DUPLICATES_FILE}"
    from objstore import ObjectStoreError, storage_for

    try:
        text = storage_for(report).read_bytes(report).decode("utf-8")
    except (OSError, ValueError, ObjectStoreError):  # no report, no credentials: n/a
        return None
    leaked: set[str] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        pair = json.loads(line)
        if pair.get("leakage"):
            members = [m for m in (pair.get("a"), pair.get("b")) if isinstance(m, dict)]
            leaked.update(
                str(m.get("key") or m.get("uri")) for m in members if m.get("split") != "train"
            )
            if not members:
                leaked.add(line)
    return len(leaked), report


def leakage_verdict(leakage: tuple[int, str] | None) -> Verdict:
    """The leakage row from ``read_leakage``'s answer."""
    check = "leakage"
    if leakage is None:
        return Verdict(
            check, NA, "not recorded", f"no run.json naming a dataset with {NEAR_DUPLICATES_FILE}"
        )
    count, report = leakage
    if count == 0:
        return Verdict(check, OK, "no train-validation near-duplicates", report)
    return Verdict(
        check,
        WARN,
        "validation leaks train: scores inflated",
        f"{count} validation example{'s' if count != 1 else ''} with a near-duplicate in train "
        f"({report}); rebuild with --leakage move_to_train",
    )
