"""Ctrl-C and SIGTERM in ``python -m trainer.train`` as users expect, under a pseudo-terminal:
during training it finishes the step, saves, and ends within seconds with one line (the step
saved, "rerun the same command to resume from step N"), status 130 or 143 and no traceback, and
the rerun resumes there without a warning; before the first step it ends at once, saying what a
rerun does."""

from __future__ import annotations

import re
import signal

import pytest

from cliflags import command_name
from tests.fixtures.processes import (
    catches_signal,
    latest_checkpoint_step,
    process_env,
    run_in_terminal,
    run_trainer,
)
from trainer import train

FEW_SECONDS = 15.0  # from the signal to the exit, on a shared, loaded CI machine
# Quiet at WARNING: the only line a clean run prints is the one the signal makes.
FLAGS = [
    "--image_size=32", "--global_batch_size=8", "--warmup_steps=1", "--checkpoint_every=2",
    "--log_every=100000", "--eval_every=100000", "--log_level=WARNING",
]  # fmt: skip


def _user_env() -> dict[str, str]:
    """A user's shell: no TF_CPP_MIN_LOG_LEVEL of ours, so start-up noise would show."""
    env = process_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]
    return env


def _one_line(text: str) -> str:
    assert "Traceback" not in text and "Error" not in text, text
    lines = [line for line in text.replace("^C", "").splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.slow
def test_an_interrupted_run_saves_says_so_in_one_line_and_resumes(jpeg_dataset, tmp_path):
    # SIGTERM during training: tests/test_train_cli.py (MirroredStrategy, then an exact resume).
    run = tmp_path / "run"
    args = [f"--data={jpeg_dataset.root}", f"--model_dir={run}", *FLAGS]
    code, text, elapsed = run_in_terminal(
        ["-m", "trainer.train", *args, "--steps=100000"],
        wait_for=str(run / "checkpoints" / "ckpt-2.index"),
        how="ctrl-c",
        env=_user_env(),
    )
    assert code == 130, text
    assert elapsed < FEW_SECONDS, text
    match = re.fullmatch(
        rf"interrupted by Ctrl-C \(SIGINT\); saved step (\d+) in {re.escape(str(run))}; "
        r"rerun the same command to resume from step (\d+)",
        _one_line(text),
    )
    assert match and match[1] == match[2], text
    saved = int(match[1])
    assert saved >= 2 and latest_checkpoint_step(run) == saved
    # The same command resumes at the saved step and data position, and warns of nothing
    # (TensorFlow warned of a checkpoint value the restore left behind: the delivered set).
    rerun = run_trainer([*args, f"--steps={saved + 2}", "--log_level=INFO"])
    assert f"restored {run}/checkpoints/ckpt-{saved} and input position" in rerun.log
    assert f"done at step {saved + 2}" in rerun.log
    assert " WARNING " not in rerun.log, rerun.log


@pytest.mark.slow
def test_a_signal_before_the_first_step_ends_at_once_saying_what_a_rerun_does(
    jpeg_dataset, tmp_path
):
    run = tmp_path / "run"
    code, text, elapsed = run_in_terminal(
        [
            "-m",
            "trainer.train",
            f"--data={jpeg_dataset.root}",
            f"--model_dir={run}",
            *FLAGS,
            "--steps=5",
        ],  # fmt: skip
        # The command's own handler is in place (Python's default has none for SIGTERM):
        # the trainer is reading its flags or importing TensorFlow.
        wait_for=lambda pid: catches_signal(pid, signal.SIGTERM),
        how="sigterm",
        env=_user_env(),
    )
    assert code == 143, text
    assert elapsed < FEW_SECONDS, text
    assert _one_line(text) == (
        "interrupted by SIGTERM before the first checkpoint; rerun the same command to start again"
    )
    assert not (run / "checkpoints").exists()


def test_the_line_names_the_checkpoint_a_rerun_resumes_from(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    for step in (4, 12, 8):
        (tmp_path / "checkpoints" / f"ckpt-{step}.index").write_bytes(b"")
    assert train._interrupted(signal.SIGINT, str(tmp_path)) == (
        f"interrupted by Ctrl-C (SIGINT); the last checkpoint, step 12, is in {tmp_path}; "
        "rerun the same command to resume from step 12"
    )
    # Before the flags are read (a signal while importing): the same line as before the first
    # checkpoint, so the line does not depend on how far the start-up got.
    assert train._interrupted(signal.SIGTERM, None) == (
        "interrupted by SIGTERM before the first checkpoint; rerun the same command to start again"
    )
    assert train._interrupted(signal.SIGTERM, "gs://b/run").endswith(
        "resume from the last checkpoint in gs://b/run"
    )


def test_flag_errors_print_a_short_usage_and_point_to_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", str(tmp_path), "--model_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    prog = command_name("trainer.train")
    assert err.splitlines() == [
        f"usage: {prog} --data DATA --model_dir DIR (--steps N | --epochs N) [flags]",
        f"{prog}: error: one of the arguments --steps --epochs is required",
        f"see {prog} --help",
    ], err
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    assert exit_info.value.code == 0
    assert "--checkpoint_every" in capsys.readouterr().out  # the full help


@pytest.mark.parametrize("flag", ["--resume", "--resume_from_checkpoint=runs/a", "--restore"])
def test_a_resume_flag_says_that_rerunning_resumes(tmp_path, capsys, flag):
    # The pipeline takes --resume; the trainer resumes from --model_dir's checkpoint by itself.
    argv = ["--data", str(tmp_path), "--model_dir", str(tmp_path / "run"), "--steps", "5", flag]
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    assert exit_info.value.code == 2
    prog = command_name("trainer.train")
    assert capsys.readouterr().err.splitlines() == [
        f"usage: {prog} --data DATA --model_dir DIR (--steps N | --epochs N) [flags]",
        f"{prog}: error: unrecognized flag {flag.split('=')[0]}",
        "training needs no resume flag: rerun the same command (the same --model_dir) to resume "
        "from the last checkpoint there",
    ]
    assert not (tmp_path / "run").exists()
    # A misspelling still gets its suggestion, and no "see --help" after it.
    with pytest.raises(SystemExit):
        train.main(["--data", str(tmp_path), "--model_dir", str(tmp_path), "--stpes", "5"])
    assert capsys.readouterr().err.splitlines()[1:] == [
        f"{prog}: error: unrecognized flag --stpes",
        "did you mean --steps?",
    ]
