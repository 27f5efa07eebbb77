"""``python -m trainer.train`` as real processes over shards written by the test fixtures:

* MirroredStrategy over 2 logical CPU devices, stopped by SIGTERM, resumed by rerunning: the
  same examples in the same order, and the same weights, as an uninterrupted run;
* MultiWorkerMirroredStrategy with two worker processes on loopback (TF_CONFIG), stopped and
  resumed: each worker trains on exactly its reader shard, in order, across the restart.
"""

from __future__ import annotations

import logging
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.processes import (
    LoggedProcess,
    finish_all,
    latest_checkpoint_step,
    process_env,
    start_trainer,
    start_trainer_workers,
)
from trainer.train import main

COMMON = [
    "--image_size=32",
    "--global_batch_size=8",
    "--warmup_steps=5",
    "--base_lr=3.2",
    "--eval_every=1000",
    "--checkpoint_every=1000",
    "--seed=3",
]


NOISE = re.compile(
    r"absl::InitializeLog|oneDNN|cpu_feature_guard|XLA|^[IWE]\d{4} |Warning|WARNING|"
    r"Traceback|unrestored",
    re.M,
)


def _train(args: list[str], name: str = "trainer") -> LoggedProcess:
    return start_trainer([*COMMON, *args], name=name)


def _user_env() -> dict[str, str]:
    """A user's shell after `source .venv/bin/activate`: no TF_CPP_MIN_LOG_LEVEL of ours."""
    env = process_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]
    return env


def _train_as_user(args: list[str], name: str) -> LoggedProcess:
    command = [sys.executable, "-m", "trainer.train", *COMMON, *args]
    return LoggedProcess(command, env=_user_env(), name=name)


def _assert_same_weights(a: Path, b: Path) -> None:
    import tensorflow as tf

    ckpt_a = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(a / "checkpoints")))
    ckpt_b = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(b / "checkpoints")))
    names = sorted(ckpt_b.get_variable_to_shape_map())
    assert names == sorted(ckpt_a.get_variable_to_shape_map())
    compared = 0
    for name in names:
        if name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH") or "save_counter" in name:
            continue
        if name.startswith("delivered/"):  # the delivered set: the same examples in both
            assert ckpt_a.get_tensor(name) == ckpt_b.get_tensor(name), name
            continue
        np.testing.assert_allclose(
            ckpt_a.get_tensor(name), ckpt_b.get_tensor(name), rtol=1e-5, atol=1e-6, err_msg=name
        )
        compared += 1
    assert compared > 20  # model weights, BN statistics, optimizer slots and step


@pytest.mark.slow
def test_mirrored_sigterm_then_rerun_matches_an_uninterrupted_run(jpeg_dataset, tmp_path):
    data = f"--data={jpeg_dataset.root}"
    a, b = tmp_path / "a", tmp_path / "b"
    mirrored = ["--cpu_replicas=2", "--log_every=1"]

    # Run A until it has logged step 3, then preempt it.
    # Every run here is started as from a user's shell, and none may print TensorFlow's
    # start-up lines, a warning or a traceback: not the interrupted run, its resume, the clean
    # run or diagnose.
    proc = _train_as_user(
        [data, *mirrored, f"--model_dir={a}", "--steps=100000", f"--audit_keys={a}/keys"], "A"
    )
    proc.wait_for(r" step 3/100000 ", timeout=240)
    proc.send_signal(signal.SIGTERM)
    assert proc.finish(timeout=120) == 128 + signal.SIGTERM
    log_a = proc.log
    assert "global batch 8 = 8 per worker = 4 per replica" in log_a, log_a
    stopped = latest_checkpoint_step(a)
    assert stopped >= 3
    # One line says what was kept and how to go on; nothing after it.
    assert log_a.rstrip().endswith(
        f"interrupted by SIGTERM; saved step {stopped} in {a}; rerun the same command to "
        f"resume from step {stopped}"
    ), log_a
    assert len((a / "keys").read_text().split()) == 8 * stopped
    assert not NOISE.findall(log_a), log_a

    # Rerun A (resumes) and run B uninterrupted to the same target, side by side.
    target = f"--steps={stopped + 5}"
    runs = [
        _train_as_user(
            [data, *mirrored, f"--model_dir={a}", target, f"--audit_keys={a}/keys"], "rerun A"
        ),
        _train_as_user(
            [data, *mirrored, f"--model_dir={b}", target, f"--audit_keys={b}/keys"], "run B"
        ),
    ]
    codes = finish_all(runs)
    resumed, straight = (run.log for run in runs)
    assert codes == [0, 0], resumed + "\n-----\n" + straight
    assert f"input position {a}/checkpoints/input/worker-00000/ckpt-{stopped}" in resumed, resumed
    assert "done at step" in straight, straight
    assert "resume: fresh start" in straight and f"resume: exact at step {stopped}" in resumed
    assert not NOISE.findall(resumed + straight), resumed + "\n-----\n" + straight
    keys_a, keys_b = (a / "keys").read_text().split(), (b / "keys").read_text().split()
    assert len(keys_a) == 8 * (stopped + 5)
    assert keys_a == keys_b
    assert set(keys_a) <= set(jpeg_dataset.keys("train"))
    _assert_same_weights(a, b)

    # The learning rate written to TensorBoard follows base_lr x 8 / 256 with a 5-step warm-up.
    from trainer.diagnosis import read_scalars

    lrs = dict(read_scalars(str(b))["train"]["learning_rate"])
    assert lrs[1] == pytest.approx(0.1 / 5) and lrs[5] == pytest.approx(0.1)
    diagnosis = subprocess.run(
        [sys.executable, "-m", "trainer.diagnose", str(b)],
        capture_output=True,
        text=True,
        env=_user_env(),
        timeout=120,
    )
    assert diagnosis.returncode == 0, diagnosis.stderr
    assert "gradient norm" in diagnosis.stdout and "input pipeline" in diagnosis.stdout
    assert not diagnosis.stderr and not NOISE.findall(diagnosis.stdout), diagnosis.stdout


def _two_workers(args: list[str]) -> list[str]:
    """Runs two trainers as the workers of one cluster to the end; returns their logs."""
    workers = start_trainer_workers([*COMMON, *args])
    finish_all(workers)
    return [worker.log for worker in workers]


@pytest.mark.slow
def test_two_workers_resume_each_at_its_own_data_position(jpeg_dataset, tmp_path):
    import tensorflow as tf

    import tfrecord_io

    run = tmp_path / "run"
    args = [f"--data={jpeg_dataset.root}", f"--model_dir={run}", f"--audit_keys={run}/keys"]
    first = _two_workers([*args, "--steps=4", "--log_every=2"])
    second = _two_workers([*args, "--steps=8", "--log_every=2"])
    for log in first + second:
        assert "done at step" in log, log
    for i, log in enumerate(second):
        assert f"this is worker {i} of 2" in log, log
        assert f"input position {run}/checkpoints/input/worker-{i:05d}/ckpt-4" in log, log
    assert "global batch 8 = 4 per worker = 4 per replica" in second[0]
    # Evaluation ran in lockstep over both workers' uneven shards: all 10 examples, once.
    assert "over 10 examples" in second[0], second[0]

    # Each worker trained on its own share of each epoch, in the reader's order (exact epochs
    # from an empty delivered set), across the restart.
    tf.random.set_seed(None)  # the reference order is the reader's own, with no global seed
    train = jpeg_dataset.manifest.split("train")
    fresh = tfrecord_io.DeliveredSet.empty(
        train.num_examples,
        seed=3,
        split=tfrecord_io.split_digest((s.file, s.num_examples) for s in train.shards),
    )
    for i in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=i, num_replicas_in_sync=2
        )
        reference = tfrecord_io.make_dataset(
            jpeg_dataset.root,
            global_batch_size=8,
            input_context=context,
            image_size=32,
            seed=3,
            # The trainer reads a split this small as permutations (trainer.inputs).
            read_config=tfrecord_io.ReadConfig(
                with_keys=True, exclude=fresh, epoch_order="permutation"
            ),
        )
        expected = [k.decode() for _, _, keys, _ in reference.take(8) for k in keys.numpy()]
        trained = (run / f"keys.worker-{i:05d}").read_text().split()
        assert trained == expected, f"worker {i}"

    # The chief keeps the model; every worker keeps its own input position; no temp dirs.
    checkpoints = run / "checkpoints"
    assert (checkpoints / "ckpt-8.index").exists()
    for i in range(2):
        assert (checkpoints / "input" / f"worker-{i:05d}" / "ckpt-8.index").exists()
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".tmp-worker")]
    assert list((run / "train").glob("events.out.tfevents.*"))
    assert list((run / "workers" / "worker-00001" / "train").glob("events.out.tfevents.*"))


def test_missing_data_is_reported_without_training(tmp_path, caplog):
    code = main(
        ["--data", str(tmp_path / "nothing"), "--model_dir", str(tmp_path / "m"), "--steps=2"]
    )
    assert code == 2
    assert str(tmp_path / "nothing") in caplog.text
    assert not (tmp_path / "m").exists()


def test_a_small_dataset_gets_five_evaluations_one_resize_note_and_whole_epochs(
    jpeg_dataset, tmp_path, caplog
):
    # 24 training examples in batches of 16: an epoch is 1.5 steps, and 10 epochs end within
    # step 15 (240 examples).
    argv = [f"--data={jpeg_dataset.root}", f"--model_dir={tmp_path}", "--image_size=32"]
    argv += ["--global_batch_size=16", "--epochs=10", "--warmup_steps=2", "--log_every=100"]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("15 steps (an epoch is 1.5 steps), evaluating every 3" in m for m in messages)
    # Epochs end every step or two: one line at each evaluation and checkpoint says which.
    assert "epochs 8-9 complete at steps 14-15: every example exactly once in each" in messages
    epoch_lines = [m for m in messages if re.match(r"epochs? \d+(-\d+)? complete", m)]
    assert len(epoch_lines) == 5, epoch_lines
    evaluations = [m.split(" validation")[0] for m in messages if re.match(r"step \d+ valid", m)]
    assert evaluations == [f"step {s}" for s in (3, 6, 9, 12, 15)]
    # After the last evaluation, nothing is silent for more than 2 s: freeing the input
    # pipeline, which may wait for tf.data's threads, says so when it takes longer.
    records = caplog.records
    last_eval = max(i for i, r in enumerate(records) if r.getMessage().startswith("step 15 val"))
    tail = records[last_eval:]
    assert tail[-1].getMessage().startswith("done at step 15"), [r.getMessage() for r in tail]
    for before, after in zip(tail, tail[1:], strict=False):
        # The timer says so at 2 s; a loaded machine may run its thread a little late.
        explained = before.getMessage().startswith("finishing the run")
        assert after.created - before.created < 3.0 or explained, (before.msg, after.msg)
    # The stored side is 40: the reader says once that every image is resized, though it built
    # a training and an eval dataset and evaluated five times.
    resized = [m for m in messages if "differs" in m]
    assert len(resized) == 1 and "every image is resized" in resized[0], resized


# What TensorFlow's libraries and Python print when nobody keeps them quiet.
@pytest.mark.slow
def test_verbose_shows_tensorflow_start_up_lines(tmp_path):
    # The other side of the quiet runs above: --verbose lets TensorFlow's start-up lines through
    # (a run that stops once TensorFlow is up: there is no such data).
    env = _user_env()
    loud = LoggedProcess(
        [sys.executable, "-m", "trainer.train", f"--data={tmp_path / 'none'}", "--verbose"]
        + [f"--model_dir={tmp_path / 'loud'}", "--steps=1"],
        env=env,
        name="--verbose",
    )
    assert loud.finish() == 2, loud.log
    assert re.search(r"absl::InitializeLog|oneDNN|cpu_feature_guard", loud.log), loud.log
