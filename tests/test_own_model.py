"""A model of the user's own: ``--model package.module:function`` and ``trainer.fit``.

* the model modules of ``tests/models`` (a Keras ``Sequential``, a subclassed ``keras.Model``)
  trained by ``python -m trainer.train`` as real processes, killed (SIGKILL between
  checkpoints; SIGTERM on two replicas) and resumed at their exact data position, checked
  with ``--audit_keys`` as the built-in models are;
* ``trainer.fit`` in-process with a custom loss and an extra metric, then
  ``python -m trainer.diagnose`` on its run;
* every error a wrong ``--model`` or ``--model_arg`` gets, before training starts.

The data is the session's ``pipeline_dataset``: 14 training examples in 3 classes, 2 for
validation, 32 px JPEG.
"""

from __future__ import annotations

import collections
import functools
import inspect
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.processes import latest_checkpoint_step, run_trainer, start_trainer
from tests.models import subclassed
from trainer.config import DataConfig, TrainConfig
from trainer.train import main, parse_config
from trainer.user_model import Objective, build_checked_model, load_model_fn, parse_model_args

TRAIN, BATCH = 14, 2
PER_EPOCH = TRAIN // BATCH  # steps an epoch
COMMON = [
    f"--global_batch_size={BATCH}",
    "--warmup_steps=1",
    "--base_lr=0.5",
    "--log_every=1",
    "--eval_every=1000",
    "--seed=4",
]


def _keys(path: Path) -> list[str]:
    return path.read_text().split()


def _assert_epoch_once(keys: list[str], dataset: Path) -> None:
    import tfrecord_io

    counts = collections.Counter(keys)
    assert not {k for k, n in counts.items() if n > 1}, counts
    expected = tfrecord_io.make_dataset(
        dataset,
        "train",
        global_batch_size=TRAIN,
        training=False,
        read_config=tfrecord_io.ReadConfig(with_keys=True),
    )
    assert sorted(counts) == sorted(k.decode() for _, _, ks in expected for k in ks.numpy())


def _end_of_epoch(step: int) -> int:
    """The step that ends the epoch a resume at ``step`` is in."""
    return (step // PER_EPOCH + 1) * PER_EPOCH


def _assert_resumed_to(target: int, log: str, keys: list[str], dataset: Path) -> None:
    """The rerun logged the end of the epoch at ``target``, and every epoch it trained holds each
    example exactly once."""
    complete = (
        f"epoch {target // PER_EPOCH - 1} complete at step {target}: every example exactly once"
    )
    assert complete in log, log
    assert len(keys) == target * BATCH, log
    for epoch in range(target // PER_EPOCH):
        _assert_epoch_once(keys[epoch * TRAIN : (epoch + 1) * TRAIN], dataset)


@pytest.mark.slow
def test_sequential_model_killed_between_checkpoints_resumes_exactly(pipeline_dataset, tmp_path):
    run = tmp_path / "run"
    args = [
        *COMMON,
        f"--data={pipeline_dataset}",
        f"--model_dir={run}",
        f"--audit_keys={run}/keys",
        "--model=tests.models.my_model:build",
        "--model_arg=width=8",
    ]
    killed = start_trainer([*args, "--steps=100000", "--checkpoint_every=2"])
    # The log, not the directory: with 3 checkpoints kept, ckpt-2 is gone again at step 8,
    # which a loaded machine can reach between two looks at the directory.
    killed.wait_for(r"(?m)saved \S+/ckpt-2$")
    killed.wait_for(r" step 3/100000 ")
    killed.send_signal(signal.SIGKILL)
    assert killed.finish() == -signal.SIGKILL, killed.log
    # Killed after step 3; on a loaded machine the trainer may have saved again before the
    # signal landed, so the resume starts at the latest checkpoint, whichever it is.
    saved = latest_checkpoint_step(run)
    assert saved >= 2 and saved % 2 == 0, killed.log
    before = _keys(run / "keys")
    target = _end_of_epoch(saved)
    # What the killed run trained after its checkpoint, up to where the rerun stops: a late
    # kill may have let it train past that.
    uncommitted = before[saved * BATCH : target * BATCH]

    # Iterators restored: the examples trained after the checkpoint come again, in order.
    again = run_trainer([*args, f"--steps={target}", "--checkpoint_every=100"])
    assert f"resume: exact at step {saved} (same input layout" in again.log, again.log
    after = _keys(run / "keys")
    assert after[: saved * BATCH] == before[: saved * BATCH]
    assert after[saved * BATCH : saved * BATCH + len(uncommitted)] == uncommitted
    _assert_resumed_to(target, again.log, after, pipeline_dataset)


@pytest.mark.slow
def test_subclassed_model_on_two_replicas_stopped_and_resumed(pipeline_dataset, tmp_path):
    run = tmp_path / "run"
    args = [
        *COMMON,
        f"--data={pipeline_dataset}",
        f"--model_dir={run}",
        f"--audit_keys={run}/keys",
        "--model=tests.models.subclassed:build",
        "--model_arg=width=4",
        "--cpu_replicas=2",
        "--checkpoint_every=100",
    ]
    stopped = start_trainer([*args, "--steps=100000"])
    stopped.wait_for(r" step 3/100000 ")
    stopped.send_signal(signal.SIGTERM)
    assert stopped.finish() == 128 + signal.SIGTERM, stopped.log
    assert "1 worker(s) x 2 local replica(s)" in stopped.log, stopped.log
    # SIGTERM saves at the step it lands on: step 3 or, on a loaded machine, a later one,
    # perhaps past the end of the first epoch. The resume finishes the epoch it is in.
    step = latest_checkpoint_step(run)
    assert step >= 3, stopped.log
    before = _keys(run / "keys")
    assert len(before) == step * BATCH, stopped.log  # every trained step was saved
    target = _end_of_epoch(step)

    again = run_trainer([*args, f"--steps={target}"])
    assert f"resume: exact at step {step} (same input layout" in again.log, again.log
    assert "validation: loss" in again.log, again.log
    after = _keys(run / "keys")
    assert after[: len(before)] == before
    _assert_resumed_to(target, again.log, after, pipeline_dataset)


def _top2(labels, logits):
    import keras

    return keras.metrics.sparse_top_k_categorical_accuracy(
        labels, logits, k=2, from_sorted_ids=False
    )


def _squared_error(labels, logits):
    # A custom loss: one value per example, from logits.
    import tensorflow as tf

    probabilities = tf.nn.softmax(logits)
    target = tf.one_hot(labels, tf.shape(logits)[-1])
    return tf.reduce_sum(tf.square(probabilities - target), axis=-1)


@pytest.mark.slow
def test_python_api_with_a_custom_loss_and_metric_then_diagnose(pipeline_dataset, tmp_path, capsys):
    from tests.models.my_model import build
    from trainer import fit
    from trainer.diagnose import main as diagnose
    from trainer.diagnosis import read_scalars
    from trainer.strategy import create_distribution

    config = TrainConfig(
        model_dir=str(tmp_path / "api"),
        data=DataConfig(source=str(pipeline_dataset), image_size=32),
        global_batch_size=BATCH,
        steps=8,
        log_every=2,
        checkpoint_every=4,
        model_args={"width": 4},
    )
    result = fit(
        build,
        config,
        loss=_squared_error,
        metrics={"top2": _top2},
        distribution=create_distribution("one_device", environ={}),
    )
    assert result.exit_code == 0 and result.step == 8
    assert 0.0 <= result.train_metrics["top2"] <= 1.0
    assert result.train_metrics["top2"] >= result.train_metrics["accuracy"]
    # The squared error of a softmax lies in [0, 2]; cross-entropy would not stay there.
    assert 0.0 <= result.train_metrics["loss"] <= 2.0
    assert result.eval_metrics is not None and result.eval_metrics["examples"] == 2
    assert "top2" in result.eval_metrics
    scalars = read_scalars(config.model_dir)
    assert [step for step, _ in scalars["train"]["top2"]] == [2, 4, 6, 8]
    assert "top2" in scalars["validation"]

    assert diagnose([config.model_dir]) == 0
    out = capsys.readouterr().out
    assert "gradient norm" in out and "loss curve" in out, out


def test_model_errors_name_the_flag_before_training(pipeline_dataset, tmp_path, caplog):
    base = [f"--data={pipeline_dataset}", f"--model_dir={tmp_path / 'm'}", "--steps=2"]
    base += ["--global_batch_size=2", "--warmup_steps=0"]
    cases = {
        "tests.models.absent:build": "cannot import module 'tests.models.absent'",
        "tests.models.subclassed:absent": "'tests.models.subclassed' has no attribute 'absent'",
        "tests.models.subclassed:NOT_A_FUNCTION": "'NOT_A_FUNCTION' is a int, not callable",
        "tests.models.subclassed:needs_depth": "missing a required argument: 'depth'",
    }
    for model, message in cases.items():
        caplog.clear()
        assert main([*base, f"--model={model}"]) == 2, model
        assert f"--model {model}: " in caplog.text and message in caplog.text, caplog.text
    assert not (tmp_path / "m").exists()  # refused before any training


def test_a_python_branch_on_a_tensor_is_named_at_the_first_step(pipeline_dataset, tmp_path, caplog):
    # The steps are traced without AutoGraph, as Keras' fit traces them: the model's line is
    # named in one line, not trained through nor shown as a traceback.
    model = "tests.models.subclassed:branches_on_a_tensor"
    args = [f"--data={pipeline_dataset}", f"--model_dir={tmp_path / 'm'}", "--steps=2"]
    args += ["--global_batch_size=2", "--warmup_steps=0", f"--model={model}"]
    assert main(args) == 2
    line = f"{Path(subclassed.__file__)}:{_line_of(subclassed.Branchy.call, '> 300.0')}"
    assert f"--model {model}: the model branches in Python on a tensor's value at {line}" in (
        caplog.text
    ), caplog.text
    assert "use tf.cond, tf.where or keras.ops.cond" in caplog.text


def _line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_model_flags_are_checked_when_parsed(capsys):
    base = ["--data=d", "--model_dir=m", "--steps=2"]
    config, _ = parse_config(
        [*base, "--model=pkg.mod:fn", "--model_arg=width=32", "--model_arg=act=gelu"]
    )
    assert config.model == "pkg.mod:fn" and config.model_args == {"width": 32, "act": "gelu"}
    for argv, message in [
        (["--model=not a path"], "model must be one of"),
        (["--model=small_cnn", "--model_arg=width=2"], "the built-in 'small_cnn' takes none"),
        (["--model=a:b", "--model_arg=width"], "--model_arg 'width' must be key=value"),
        (["--model=a:b", "--model_arg=w=1", "--model_arg=w=2"], "--model_arg w is given twice"),
    ]:
        with pytest.raises(SystemExit) as info:
            parse_config([*base, *argv])
        assert info.value.code == 2
        assert message in capsys.readouterr().err, argv


def test_model_args_are_literals_or_strings():
    assert parse_model_args(["a=3", "b=0.5", "c=True", "d=(3, 3)", "e=gelu", "f='x y'"]) == {
        "a": 3, "b": 0.5, "c": True, "d": (3, 3), "e": "gelu", "f": "x y",
    }  # fmt: skip


def test_the_model_output_is_checked_against_the_classes():
    fn = load_model_fn("tests.models.subclassed:wrong_classes")
    with pytest.raises(ValueError, match=r"output has shape \(2, 4\), expected \(batch, 3\)"):
        build_checked_model(fn, name="w", image_size=16, num_classes=3, input_dtype="uint8")
    with pytest.raises(ValueError, match="returned a int, not a keras.Model"):
        build_checked_model(
            lambda num_classes: 3, name="n", image_size=16, num_classes=3, input_dtype="uint8"
        )
    # A subclassed model comes back built: its variables exist for the optimiser.
    model = build_checked_model(
        load_model_fn("tests.models.subclassed:build"),
        name="s",
        image_size=16,
        num_classes=3,
        input_dtype="uint8",
        model_args={"width": 2},
    )
    assert model.built and model.trainable_variables


def test_objective_checks_losses_and_metrics():
    import tensorflow as tf

    with pytest.raises(ValueError, match="scalar the trainer writes itself"):
        Objective(metrics={"loss": _top2})
    labels, logits = tf.constant([0, 1]), tf.constant([[2.0, 0.0], [0.0, 2.0]])
    reduced = Objective(loss=lambda y, p: tf.reduce_mean(_squared_error(y, p)))
    with pytest.raises(ValueError, match="one value per example"):
        reduced.per_example_loss(labels, logits)
    import keras

    keras_loss = Objective(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    np.testing.assert_allclose(
        keras_loss.per_example_loss(labels, logits).numpy(),
        Objective().per_example_loss(labels, logits).numpy(),
    )
    top = Objective(metrics={"top1": functools.partial(_top2)})
    assert top.metric_values(labels, logits)[0].numpy().tolist() == [1.0, 1.0]
