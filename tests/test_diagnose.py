"""``trainer.diagnose`` on event logs written here with known problems: each verdict fires when
it should, and only then."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from trainer.diagnose import main
from trainer.diagnosis import NA, OK, WARN, Thresholds, diagnose_run, read_scalars
from trainer.validation_trust import examples_for_margin, read_leakage, wilson_interval

POINTS = 40
CHECKS = (
    "step time",
    "input pipeline",
    "accelerator",
    "gradient norm",
    "loss curve",
    "validation",
    "validation size",
    "leakage",
    "validation noise",
)


def _healthy(seed: int = 0) -> dict[str, list[float]]:
    """A run with nothing wrong: steady steps, fed input, stable gradients, smooth loss."""
    rng = np.random.default_rng(seed)
    t = np.arange(POINTS)
    return {
        "step_time": list(0.1 * (1 + 0.03 * rng.standard_normal(POINTS))),
        "input_wait": list(0.04 + 0.01 * rng.random(POINTS)),
        "examples_per_sec": list(2560 * (1 + 0.03 * rng.standard_normal(POINTS))),
        "grad_norm": list(3 * np.exp(-t / 60) + 1 + 0.05 * rng.standard_normal(POINTS)),
        "loss": list(2 * np.exp(-t / 10) + 0.3 + 0.01 * rng.standard_normal(POINTS)),
        "accuracy": list(1 - np.exp(-t / 10) * 0.7),
        "learning_rate": [0.1] * POINTS,
    }


def _write(directory: Path, series: dict[str, list[float]], *, first_step: int = 10) -> None:
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(directory))
    with writer.as_default():
        for tag, values in series.items():
            for i, value in enumerate(values):
                tf.summary.scalar(tag, float(value), step=first_step + 10 * i)
    writer.close()


def _run(
    tmp_path: Path,
    train: dict[str, list[float]],
    validation: list[float] | None = (1.5, 1.0, 0.8, 0.7),
    workers: dict[str, dict[str, list[float]]] | None = None,
) -> Path:
    _write(tmp_path / "train", train)
    if validation is not None:
        _write(tmp_path / "validation", {"loss": list(validation)}, first_step=100)
    for name, series in (workers or {}).items():
        _write(tmp_path / "workers" / name / "train", series)
    return tmp_path


def _statuses(model_dir: Path) -> dict[str, str]:
    verdicts = diagnose_run(read_scalars(str(model_dir)))
    assert [v.check for v in verdicts] == list(CHECKS)
    return {v.check: v.status for v in verdicts}


def _warnings(model_dir: Path) -> set[str]:
    return {check for check, status in _statuses(model_dir).items() if status == WARN}


def _finding(model_dir: Path, check: str) -> tuple[str, str]:
    verdict = next(v for v in diagnose_run(read_scalars(str(model_dir))) if v.check == check)
    return verdict.finding, verdict.evidence


def test_healthy_run_gives_no_warning(tmp_path):
    statuses = _statuses(_run(tmp_path, _healthy()))
    assert statuses == {
        "step time": OK,
        "input pipeline": OK,
        "accelerator": NA,
        "gradient norm": OK,
        "loss curve": OK,
        "validation": OK,
        "validation size": NA,  # no example count logged
        "leakage": NA,  # no run.json naming a dataset
        "validation noise": OK,
    }


def test_step_time_jitter(tmp_path):
    series = _healthy()
    series["step_time"] = [
        v * (3.0 if i % 3 == 0 else 1.0) for i, v in enumerate(series["step_time"])
    ]
    model_dir = _run(tmp_path, series)
    assert _warnings(model_dir) == {"step time"}
    finding, evidence = _finding(model_dir, "step time")
    assert "contention" in finding and "spread (p90-p10)/median" in evidence


def test_input_bound_without_gpu(tmp_path):
    series = _healthy()
    series["input_wait"] = [0.55 + 0.02 * (i % 2) for i in range(POINTS)]
    model_dir = _run(tmp_path, series)
    assert _warnings(model_dir) == {"input pipeline"}
    finding, evidence = _finding(model_dir, "input pipeline")
    assert "I/O bottleneck" in finding and "56%" in evidence


def test_input_bound_with_idle_gpu(tmp_path):
    series = _healthy()
    series["input_wait"] = [0.5] * POINTS
    series["gpu_utilization"] = [40.0 + (i % 5) for i in range(POINTS)]
    model_dir = _run(tmp_path, series)
    assert _warnings(model_dir) == {"input pipeline", "accelerator"}
    finding, evidence = _finding(model_dir, "accelerator")
    assert "waiting for input" in finding and "median GPU utilisation 42%" in evidence


def test_idle_gpu_with_fed_input(tmp_path):
    series = _healthy()
    series["gpu_utilization"] = [55.0] * POINTS
    model_dir = _run(tmp_path, series)
    assert _warnings(model_dir) == {"accelerator"}
    assert "input keeps up" in _finding(model_dir, "accelerator")[0]


def test_busy_gpu_is_ok(tmp_path):
    series = _healthy()
    series["gpu_utilization"] = [92.0] * POINTS
    statuses = _statuses(_run(tmp_path, series))
    assert statuses["accelerator"] == OK
    assert WARN not in statuses.values()


def test_slow_worker_input_is_found(tmp_path):
    worker = _healthy(seed=1)
    worker["input_wait"] = [0.7] * POINTS
    model_dir = _run(tmp_path, _healthy(), workers={"worker-00001": worker})
    assert _warnings(model_dir) == {"input pipeline"}
    finding, evidence = _finding(model_dir, "input pipeline")
    assert "worker-00001" in finding and "70%" in evidence


@pytest.mark.parametrize(
    ("grad_norm", "finding"),
    [
        ([1.0 * math.exp(i / 6) for i in range(POINTS)], "exploding"),
        ([1.0] * 20 + [50.0] + [1.0] * 19, "exploding"),
        ([1.0] * 30 + [math.nan] + [1.0] * 9, "exploding (not finite)"),
        ([1.0] * 10 + [1e-9] * 30, "vanishing"),
        ([2.0 * 10 ** (-i / 8) for i in range(POINTS)], "vanishing"),
    ],
)
def test_gradient_norm_problems(tmp_path, grad_norm, finding):
    series = _healthy()
    series["grad_norm"] = grad_norm
    model_dir = _run(tmp_path, series)
    assert _warnings(model_dir) == {"gradient norm"}
    assert _finding(model_dir, "gradient norm")[0] == finding


@pytest.mark.parametrize(
    ("loss", "finding"),
    [
        ([1.1 + 0.01 * ((-1) ** i) for i in range(POINTS)], "not decreasing"),
        ([0.5 + i * 0.05 for i in range(POINTS)], "not decreasing"),
        ([2 * math.exp(-i / 10) + 0.3 + 0.35 * ((-1) ** i) for i in range(POINTS)], "not smooth"),
        (
            [2 * math.exp(-i / 10) + 0.3 + (1.5 if i % 7 == 3 else 0) for i in range(POINTS)],
            "not smooth",
        ),
        ([1.0] * 25 + [math.inf] * 15, "diverged"),
    ],
)
def test_loss_curve_problems(tmp_path, loss, finding):
    series = _healthy()
    series["loss"] = loss
    model_dir = _run(tmp_path, series)
    # A rising training loss also stops the validation check from calling it overfitting.
    assert _warnings(model_dir) == {"loss curve"}
    assert _finding(model_dir, "loss curve")[0].startswith(finding)


def test_overfitting(tmp_path):
    model_dir = _run(tmp_path, _healthy(), validation=[1.0, 0.8, 0.85, 1.0, 1.2])
    assert _warnings(model_dir) == {"validation"}
    assert "overfitting" in _finding(model_dir, "validation")[0]


def test_a_wobble_of_a_loss_near_zero_is_not_overfitting(tmp_path):
    # The quickstart's run at 100 % validation accuracy: 0.0026 -> 0.035 is 13x its best and
    # more than 5 % of the first loss, but 0.03 nats is no loss of generalisation.
    model_dir = _run(tmp_path, _healthy(), validation=[0.6, 0.1, 0.00257, 0.03521])
    assert _warnings(model_dir) == set()
    assert _finding(model_dir, "validation")[0] == "validation loss tracks training"


def test_a_large_steady_gap_is_a_note_not_a_warning(tmp_path):
    # Training loss ends near 0.3, validation loss stays near 1.1: no rising trend.
    model_dir = _run(tmp_path, _healthy(), validation=[1.5, 1.2, 1.15, 1.117])
    assert _warnings(model_dir) == set()
    finding, evidence = _finding(model_dir, "validation")
    assert finding == "steady, with a generalisation gap"
    assert "above the last-quarter training loss 0.3" in evidence, evidence


def test_too_few_points_are_not_judged(tmp_path):
    short = {tag: values[:3] for tag, values in _healthy().items()}
    statuses = _statuses(_run(tmp_path, short, validation=[1.0, 0.9]))
    assert set(statuses.values()) == {NA}


def test_thresholds_can_be_tightened(tmp_path):
    model_dir = _run(tmp_path, _healthy())
    verdicts = diagnose_run(read_scalars(str(model_dir)), Thresholds(input_wait=0.01))
    assert {v.check for v in verdicts if v.status == WARN} == {"input pipeline"}


def test_resumed_run_keeps_the_latest_values(tmp_path):
    # A first process logged steps 10..400, crashed, and a restart from step 200 re-logged
    # 210..600: TensorBoard's loader drops the orphaned 210..400 of the first process.
    _write(tmp_path / "train", {"loss": [5.0] * POINTS})
    _write(tmp_path / "train", {"loss": [1.0] * 40}, first_step=210)
    steps = [s for s, _ in read_scalars(str(tmp_path))["train"]["loss"]]
    assert steps == sorted(set(steps))
    assert steps[0] == 10 and steps[-1] == 600 and len(steps) == 20 + 40


def test_cli_prints_the_table_and_exits_zero_with_warnings(tmp_path, capsys):
    series = _healthy()
    series["input_wait"] = [0.6] * POINTS
    model_dir = _run(tmp_path, series)
    assert main([str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^input pipeline +WARN", out, re.M) and "1 warning(s)" in out, out
    assert main([str(model_dir), "--json"]) == 0
    verdicts = json.loads(capsys.readouterr().out)
    assert {v["check"]: v["status"] for v in verdicts}["input pipeline"] == WARN


@pytest.mark.parametrize("layout", ["missing", "empty", "garbage"])
def test_cli_exits_non_zero_when_logs_cannot_be_read(tmp_path, capsys, layout):
    model_dir = tmp_path / "run"
    if layout != "missing":
        (model_dir / "train").mkdir(parents=True)
    if layout == "garbage":
        (model_dir / "train" / "events.out.tfevents.1.host").write_bytes(b"\x00not an event" * 9)
    assert main([str(model_dir)]) == 2
    assert "diagnose:" in capsys.readouterr().err


def test_cli_rejects_an_unknown_threshold(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main([str(tmp_path), "--threshold", "speed=3"])
    assert info.value.code == 2
    assert "expected NAME=VALUE" in capsys.readouterr().err


def _leaky_dataset(tmp_path: Path, *, moved: bool) -> Path:
    """A dataset directory whose near-duplicate report lists one train-validation pair (or,
    ``moved``, the same pair after ``--leakage move_to_train`` put both in train)."""
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    member = {"label": 0, "moved": False, "text": "cat"}
    pair = {
        "a": {**member, "key": "k1", "split": "train", "uri": "cats/1.jpg"},
        "b": {**member, "key": "k2", "split": "train" if moved else "validation", "moved": moved},
        "leakage": not moved,
        "cross_class": False,
        "distance": 4,
    }
    other = {**pair, "leakage": False, "b": {**member, "key": "k3", "split": "train"}}
    lines = [json.dumps(pair), json.dumps(other)]
    (dataset / "near_duplicates.jsonl").write_text("\n".join(lines) + "\n")
    return dataset


def test_a_tiny_leaky_noisy_validation_split_gets_three_warnings(tmp_path, capsys):
    # What a newcomer's 300-step run on 96 photos showed: 10 validation examples, 6 leaked
    # pairs, and a validation loss going 1.0 -> 1.7 -> 0.08. The loss row alone said OK.
    model_dir = _run(tmp_path / "run", _healthy(), validation=None)
    _write(
        model_dir / "validation",
        {"loss": [1.0, 1.7, 0.08], "accuracy": [0.5, 0.4, 0.9], "examples": [10, 10, 10]},
        first_step=100,
    )
    dataset = _leaky_dataset(tmp_path, moved=False)
    (model_dir / "run.json").write_text(json.dumps({"source": str(dataset)}))
    assert main([str(model_dir)]) == 0
    out = capsys.readouterr().out
    assert "validation size   WARN    too small to trust" in out, out
    assert "10 examples: accuracy 0.9 lies anywhere in 0.60-0.98" in out, out
    assert "about 97 examples give ±0.10" in out, out
    assert "leakage           WARN" in out and "1 validation example with a near-duplicate" in out
    assert "rebuild with --leakage move_to_train" in out
    assert "validation noise  WARN    noisier than its fall" in out, out


def test_a_large_clean_smooth_validation_split_is_trusted(tmp_path):
    model_dir = _run(tmp_path / "run", _healthy(), validation=None)
    _write(
        model_dir / "validation",
        {"loss": [1.5, 1.0, 0.8, 0.7], "accuracy": [0.5, 0.7, 0.8, 0.85], "examples": [500] * 4},
        first_step=100,
    )
    dataset = _leaky_dataset(tmp_path, moved=True)
    (model_dir / "run.json").write_text(json.dumps({"source": str(dataset)}))
    verdicts = diagnose_run(read_scalars(str(model_dir)), leakage=read_leakage(str(model_dir)))
    rows = {v.check: (v.status, v.evidence) for v in verdicts}
    assert rows["validation size"][0] == OK, rows
    assert "500 examples: accuracy 0.85 lies anywhere in 0.82-0.88" in rows["validation size"][1]
    assert rows["leakage"][0] == OK, rows
    assert rows["validation noise"][0] == OK, rows


@pytest.mark.parametrize(("successes", "n"), [(0, 1), (7, 10), (50, 100), (999, 1000)])
def test_wilson_interval_holds_the_proportion_and_narrows_with_n(successes, n):
    low, high = wilson_interval(successes, n)
    assert 0 <= low <= successes / n <= high <= 1
    wider = wilson_interval(successes / 4, max(1, n // 4)) if n >= 4 else (0.0, 1.0)
    assert high - low <= wider[1] - wider[0] + 1e-12
    # The interval's half-width at p = 0.5 reaches 0.1 at the count examples_for_margin gives.
    needed = examples_for_margin(0.1)
    half = (lambda lo, hi: (hi - lo) / 2)(*wilson_interval(needed / 2, needed))
    assert half <= 0.1 < (lambda lo, hi: (hi - lo) / 2)(*wilson_interval(45, 90))
