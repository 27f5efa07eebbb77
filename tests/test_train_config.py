"""Trainer configuration, learning-rate scaling, step planning, key audit, metric windows, CLI
flag errors. No training here."""

from __future__ import annotations

import dataclasses
import math
import os
import signal

import pytest

from trainer.audit import KeyAudit, audit_path
from trainer.config import DataConfig, OptimConfig, RuntimeConfig, TrainConfig
from trainer.evaluation import eval_interval
from trainer.metrics import StepWindow
from trainer.optim import learning_rate_at
from trainer.preemption import StopSignal
from trainer.setup import plan_steps
from trainer.train import parse_config


def _config(**overrides) -> TrainConfig:
    values = {"model_dir": "/tmp/run", "data": DataConfig(source="/data"), "steps": 10}
    values.update(overrides)
    return TrainConfig(**values)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"model": "vgg"}, "model must be one of .* got 'vgg'"),
        ({"global_batch_size": 0}, "global_batch_size must be an int >= 1, got 0"),
        ({"steps": None}, "give exactly one of steps or epochs"),
        ({"steps": 5, "epochs": 2}, "give exactly one of steps or epochs"),
        ({"steps": -3}, "steps must be an int >= 1, got -3"),
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
        ({"log_every": 0}, "log_every must be an int >= 1, got 0"),
        ({"eval_every": 0}, "eval_every must be an int >= 1, got 0"),
        ({"audit_keys": ""}, "audit_keys must be a file path or None"),
        ({"model_dir": ""}, "model_dir must be a non-empty path"),
        (
            {"global_batch_size": 9, "runtime": RuntimeConfig(cpu_replicas=2)},
            "global_batch_size 9 must be divisible by cpu_replicas 2",
        ),
    ],
)
def test_train_config_rejects(overrides, match):
    with pytest.raises(ValueError, match=match):
        _config(**overrides)


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (DataConfig, {"source": ""}, "data source must be a non-empty path"),
        (DataConfig, {"source": "/d", "image_size": 4}, "image_size must be >= 8 pixels, got 4"),
        (DataConfig, {"source": "/d", "num_classes": 1}, "num_classes must be >= 2, got 1"),
        (DataConfig, {"source": "/d", "data_service": "localhost"}, "grpc://host:5050"),
        (OptimConfig, {"base_lr": 0.0}, "base_lr must be a finite number > 0, got 0.0"),
        (OptimConfig, {"base_lr": math.nan}, "base_lr must be a finite number > 0"),
        (OptimConfig, {"warmup_steps": -1}, "warmup_steps must be an int >= 0, got -1"),
        (OptimConfig, {"schedule": "step"}, "lr_schedule must be one of .* got 'step'"),
        (OptimConfig, {"name": "lamb"}, "optimizer must be one of .* got 'lamb'"),
        (RuntimeConfig, {"strategy": "ps"}, "strategy must be one of .* got 'ps'"),
        (RuntimeConfig, {"cpu_replicas": 0}, "cpu_replicas must be an int >= 1, got 0"),
    ],
)
def test_sub_configs_reject(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_linear_scaling_rule():
    optim = OptimConfig(base_lr=0.1)
    assert optim.peak_lr(256) == pytest.approx(0.1)
    assert optim.peak_lr(1024) == pytest.approx(0.4)
    assert optim.peak_lr(64) == pytest.approx(0.025)


def test_warmup_then_constant_does_not_depend_on_total_steps():
    kwargs = {"peak_lr": 0.4, "warmup_steps": 4, "schedule": "constant"}
    ramp = [learning_rate_at(s, total_steps=100, **kwargs) for s in range(6)]
    assert ramp == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4, 0.4])
    for step in range(50):
        assert learning_rate_at(step, total_steps=20, **kwargs) == learning_rate_at(
            step, total_steps=5000, **kwargs
        )


def test_cosine_decays_to_zero_at_the_last_step():
    kwargs = {"peak_lr": 1.0, "warmup_steps": 10, "schedule": "cosine", "total_steps": 110}
    assert learning_rate_at(9, **kwargs) == pytest.approx(1.0)
    assert learning_rate_at(10, **kwargs) == pytest.approx(1.0)
    assert learning_rate_at(60, **kwargs) == pytest.approx(0.5)
    assert learning_rate_at(110, **kwargs) == pytest.approx(0.0, abs=1e-12)


def test_keras_schedule_matches_the_python_one():
    from trainer.optim import WarmupSchedule

    for schedule in ("constant", "cosine"):
        keras_schedule = WarmupSchedule(
            peak_lr=0.3, warmup_steps=5, schedule=schedule, total_steps=40
        )
        for step in (0, 1, 4, 5, 6, 20, 39, 40):
            expected = learning_rate_at(
                step, peak_lr=0.3, warmup_steps=5, schedule=schedule, total_steps=40
            )
            assert float(keras_schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-6), (
                schedule,
                step,
            )


def test_plan_steps():
    assert plan_steps(_config(steps=7), 100) == (7, 100 / _config(steps=7).global_batch_size)
    # Batches span epochs (the reader repeats, then batches): an epoch is 12.5 steps of 8, and
    # 3 epochs end within step 38 (300 examples; 36 steps trained 288).
    assert plan_steps(_config(steps=None, epochs=3, global_batch_size=8), 100) == (38, 12.5)
    assert plan_steps(_config(steps=None, epochs=2, global_batch_size=10), 100) == (20, 10)
    assert plan_steps(_config(steps=7), None) == (7, None)
    with pytest.raises(ValueError, match="--epochs needs the number of training examples"):
        plan_steps(_config(steps=None, epochs=3), None)


def test_eval_interval_gives_a_handful_of_evaluations_unless_told():
    # A fifth of the run, rounded up: 5 evaluations (the last at the final step).
    assert [eval_interval(None, total) for total in (1, 4, 5, 30, 400, 401)] == [1, 1, 1, 6, 80, 81]
    assert eval_interval(7, 400) == 7  # --eval_every as given


def test_audit_path_per_worker():
    assert audit_path("/a/keys.txt", num_workers=1, worker_index=0) == "/a/keys.txt"
    assert audit_path("/a/keys.txt", num_workers=3, worker_index=2) == "/a/keys.txt.worker-00002"


def test_audit_is_cut_back_to_the_checkpoint(tmp_path):
    path = str(tmp_path / "sub" / "keys.txt")
    audit = KeyAudit(path, keep_lines=0)
    audit.write([b"a", b"b", b"c", b"d"])
    audit.close()
    # A restart from a checkpoint that had trained on 2 examples drops the 2 lost ones.
    audit = KeyAudit(path, keep_lines=2)
    audit.write([b"e"])
    audit.close()
    assert open(path).read().split() == ["a", "b", "e"]


def test_audit_refuses_a_file_shorter_than_the_checkpoint(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"lists 2 keys but the checkpoint has trained on 5"):
        KeyAudit(str(path), keep_lines=5)


def test_step_window_leaves_compile_steps_out_of_timings():
    window = StepWindow(global_batch_size=10)
    window.add(loss=2.0, correct=1, wait_seconds=5.0, step_seconds=9.0, timed=False)
    window.add(loss=1.0, correct=5, wait_seconds=0.1, step_seconds=0.5, timed=True)
    window.add(loss=0.0, correct=9, wait_seconds=0.3, step_seconds=0.5, timed=True)
    scalars = window.scalars()
    assert scalars["loss"] == pytest.approx(1.0)
    assert scalars["accuracy"] == pytest.approx(15 / 30)
    assert scalars["step_time"] == pytest.approx(0.5)
    assert scalars["examples_per_sec"] == pytest.approx(20.0)
    assert scalars["input_wait"] == pytest.approx(0.4)
    assert window.scalars() == {}


def test_stop_signal_catches_sigterm_and_restores_the_handler():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
        assert stop.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "5"], "the following arguments are required: --data, --model_dir"),
        (["--data", "d", "--model_dir", "m"], "one of the arguments --steps --epochs is required"),
        (["--data", "d", "--model_dir", "m", "--steps", "5", "--epochs", "1"], "not allowed with"),
        (["--data", "d", "--model_dir", "m", "--steps", "5", "--strategy", "ps"], "invalid choice"),
        (
            ["--data", "d", "--model_dir", "m", "--steps", "5", "--global_batch_size", "0"],
            "global_batch_size must be an int >= 1, got 0",
        ),
        (
            ["--data", "d", "--model_dir", "m", "--steps", "5", "--base_lr", "-1"],
            "base_lr must be a finite number > 0, got -1.0",
        ),
    ],
)
def test_cli_flag_errors_name_the_value(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_config(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_builds_the_config():
    config, level = parse_config(
        [
            "--data=d",
            "--model_dir=m",
            "--steps=40",
            "--global_batch_size=64",
            "--cpu_replicas=2",
            "--base_lr=0.4",
            "--audit_keys=k.txt",
            "--data_service=grpc://localhost:5050",
        ]
    )
    assert level == "INFO"
    assert config.steps == 40 and config.global_batch_size == 64
    assert config.runtime.cpu_replicas == 2 and config.runtime.strategy == "auto"
    assert config.optim.peak_lr(config.global_batch_size) == pytest.approx(0.1)
    assert config.data.data_service == "grpc://localhost:5050"
    assert config.audit_keys == "k.txt"


def test_data_service_compression_and_cache_are_checked():
    assert (
        DataConfig(source="/data", data_service="grpc://h:5050").data_service_compression == "NONE"
    )
    with pytest.raises(ValueError, match="data_service_compression must be one of"):
        DataConfig(source="/data", data_service="grpc://h:5050", data_service_compression="zip")
    with pytest.raises(ValueError, match="use cache='memory' with data_service"):
        DataConfig(source="/data", data_service="grpc://h:5050", cache="/tmp/c")
    assert (
        DataConfig(source="/data", data_service="grpc://h:5050", cache="memory").cache == "memory"
    )


@pytest.mark.parametrize(("flag", "bad"), [("keep_freed_memory", "yes"), ("bulk_reads", 1)])
def test_host_setting_flags_default_to_following_the_data_service(flag: str, bad: object) -> None:
    base = ["--data", "d", "--model_dir", "m", "--steps", "1"]
    assert getattr(parse_config(base)[0].runtime, flag) is None
    assert getattr(parse_config([*base, f"--{flag}"])[0].runtime, flag) is True
    assert getattr(parse_config([*base, f"--no-{flag}"])[0].runtime, flag) is False
    with pytest.raises(ValueError, match=f"{flag} must be True, False or None, got {bad!r}"):
        RuntimeConfig(**{flag: bad})


def test_help_lists_every_flag_with_a_help_line_and_its_default_once(capsys):
    from trainer.train import build_parser

    with pytest.raises(SystemExit) as info:
        parse_config(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    actions = [a for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    for action in actions:
        assert f" {action.option_strings[0]}" in out, action.option_strings
        assert action.help and not action.help.startswith("("), action.option_strings
        shown = action.help.count("(default:")
        # Required flags (--data, --model_dir, one of --steps/--epochs) have no default.
        assert shown == (0 if action.required or action.dest in ("steps", "epochs") else 1), (
            action.option_strings,
            action.help,
        )
    # Each config field is one flag (OptimConfig.momentum has none), plus --log_level and
    # --verbose.
    fields = {
        f.name
        for cls in (DataConfig, TrainConfig, OptimConfig, RuntimeConfig)
        for f in dataclasses.fields(cls)
        if f.name not in ("data", "optim", "runtime", "momentum")
    }
    renamed = {"data": "source", "optimizer": "name", "lr_schedule": "schedule"}
    flags = {renamed.get(a.dest, a.dest) for a in actions} - {"log_level", "verbose"}
    assert flags == fields
    assert "(default: the side the dataset stores, from dataset.json's image; else 224)" in out
