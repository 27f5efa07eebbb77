"""The training loop in-process, on in-memory ``tf.data`` inputs of the reader's element
structure, with ``OneDeviceStrategy``: metrics, evaluation, resume, and its failure modes.

Multi-replica and multi-worker runs need devices configured before TensorFlow starts, so they
run as real processes in ``test_train_cli.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainer.config import DataConfig, OptimConfig, TrainConfig
from trainer.diagnosis import read_scalars
from trainer.metrics import TAGS
from trainer.optim import learning_rate_at

IMAGE = 16
CLASSES = 3


@dataclasses.dataclass(frozen=True)
class MemoryInputs:
    """``trainer.inputs.Inputs`` over arrays: class k is an image whose channel k is bright."""

    global_batch_size: int
    train_examples: int = 48
    eval_examples: int = 10
    repeat: bool = True
    seed: int = 0
    normalised: bool = False
    checkpointable: bool = True
    num_classes: int = CLASSES
    has_eval: bool = True
    exact_epochs: bool = False
    split_digest: str | None = None

    @staticmethod
    def _arrays(count: int, offset: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(offset)
        labels = (np.arange(count) % CLASSES).astype(np.int32)
        images = rng.integers(0, 60, size=(count, IMAGE, IMAGE, 3)).astype(np.uint8)
        images[np.arange(count), :, :, labels] += 150
        keys = np.array([f"key-{offset + i:05d}".encode() for i in range(count)])
        return images, labels, keys

    def _pixels(self, images: np.ndarray) -> np.ndarray:
        # Like the reader's output="float32": normalised on the host.
        return (images.astype(np.float32) / 127.5 - 1.0) if self.normalised else images

    def train_dataset(
        self,
        input_context: Any,
        *,
        with_keys: bool,
        exclude: Any = None,
        service_job_name: str | None = None,
    ) -> Any:
        import tensorflow as tf

        assert exclude is None and service_job_name is None  # no exact epochs, no service
        images, labels, keys = self._arrays(self.train_examples, 0)
        images = self._pixels(images)
        ds = tf.data.Dataset.from_tensor_slices((images, labels, keys))
        ds = ds.shuffle(self.train_examples, seed=self.seed, reshuffle_each_iteration=True)
        if self.repeat:
            ds = ds.repeat()
        ds = ds.batch(
            input_context.get_per_replica_batch_size(self.global_batch_size), drop_remainder=True
        )
        return ds if with_keys else ds.map(lambda x, y, k: (x, y))

    def eval_dataset(self, input_context: Any) -> Any:
        import tensorflow as tf

        images, labels, _ = self._arrays(self.eval_examples, 10_000)
        images = self._pixels(images)
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(input_context.get_per_replica_batch_size(self.global_batch_size))

    def layout(self) -> dict[str, Any]:
        return {"seed": self.seed, "global_batch_size": self.global_batch_size}


@pytest.fixture(scope="module")
def one_device():
    from trainer.strategy import create_distribution

    return create_distribution("one_device", environ={})


def _config(model_dir: Path, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = {
        "model_dir": str(model_dir),
        "data": DataConfig(source="memory", image_size=IMAGE),
        "global_batch_size": 12,
        "steps": 20,
        "log_every": 5,
        "eval_every": 10,
        "checkpoint_every": 10,
        # peak LR 0.1 = base_lr * 12 / 256
        "optim": OptimConfig(base_lr=0.1 * 256 / 12, warmup_steps=4),
    }
    values.update(overrides)
    return TrainConfig(**values)


def _run(config: TrainConfig, dist: Any, inputs: MemoryInputs | None = None) -> Any:
    from trainer.loop import run_training

    return run_training(config, dist, inputs or MemoryInputs(config.global_batch_size))


@pytest.mark.slow
def test_trains_logs_every_scalar_and_evaluates_five_times(tmp_path, one_device):
    # 48 examples in global batches of 12: 4 steps per epoch, 8 epochs.
    result = _run(_config(tmp_path, steps=None, epochs=8, eval_every=None), one_device)
    assert (result.start_step, result.step, result.exit_code) == (0, 32, 0)
    assert result.train_metrics["accuracy"] > 0.6, result.train_metrics
    # 10 eval examples in per-worker batches of 12: one partial batch, counted exactly once.
    assert result.eval_metrics["examples"] == 10
    assert result.eval_metrics["accuracy"] > 0.6, result.eval_metrics
    assert result.checkpoint.endswith("ckpt-32")

    runs = read_scalars(str(tmp_path))
    train = runs["train"]
    assert set(train) == set(TAGS) - {"gpu_utilization"}  # no GPU here
    assert [s for s, _ in train["loss"]] == [5, 10, 15, 20, 25, 30, 32]
    peak = 0.1
    for step, lr in train["learning_rate"]:
        expected = learning_rate_at(
            step - 1, peak_lr=peak, warmup_steps=4, schedule="constant", total_steps=32
        )
        assert lr == pytest.approx(expected, rel=1e-6)
    assert all(0.0 <= v <= 1.0 for _, v in train["input_wait"])
    assert all(v > 0 for _, v in train["grad_norm"] + train["step_time"])
    # Without --eval_every, a fifth of the run (7 steps, rounded up) and the end: not once per
    # epoch, which on a small dataset makes a run mostly evaluation.
    assert [s for s, _ in runs["validation"]["accuracy"]] == [7, 14, 21, 28, 32]


@pytest.mark.slow
def test_resume_trains_on_the_same_examples_to_the_same_weights(tmp_path, one_device):
    audit_a, audit_b = tmp_path / "a.keys", tmp_path / "b.keys"
    first = _run(_config(tmp_path / "a", steps=10, audit_keys=str(audit_a)), one_device)
    resumed = _run(_config(tmp_path / "a", steps=20, audit_keys=str(audit_a)), one_device)
    straight = _run(_config(tmp_path / "b", steps=20, audit_keys=str(audit_b)), one_device)
    assert first.step == 10 and resumed.start_step == 10 and resumed.input_restored
    keys_a, keys_b = audit_a.read_text().split(), audit_b.read_text().split()
    assert len(keys_a) == 20 * 12 and keys_a == keys_b
    # 48 examples per epoch, batches of 12: the resumed run crossed epoch boundaries too.
    assert len(set(keys_a)) == 48
    for tag in ("loss", "grad_norm", "accuracy"):
        assert resumed.train_metrics[tag] == pytest.approx(straight.train_metrics[tag], rel=1e-5)
    assert resumed.eval_metrics["loss"] == pytest.approx(straight.eval_metrics["loss"], rel=1e-5)


@pytest.mark.slow
def test_rerun_layout_change_uncheckpointable_input_and_wrong_model(tmp_path, one_device):
    quiet = {"eval_every": None, "log_every": 100}
    plain = MemoryInputs(12, has_eval=False)
    _run(_config(tmp_path, steps=2, **quiet), one_device, plain)
    # The same command again: already at the target, nothing to do.
    again = _run(_config(tmp_path, steps=2, **quiet), one_device, plain)
    assert (again.start_step, again.step, again.exit_code, again.input_restored) == (2, 2, 0, True)
    # Another data order (seed): the model resumes, the data position starts afresh.
    reseeded = dataclasses.replace(plain, seed=7)
    result = _run(_config(tmp_path, steps=3, **quiet), one_device, reseeded)
    assert (result.start_step, result.step, result.input_restored) == (2, 3, False)
    # An input that cannot be saved (tf.data service): model and step only.
    service_like = dataclasses.replace(reseeded, checkpointable=False)
    result = _run(_config(tmp_path, steps=4, **quiet), one_device, service_like)
    assert (result.start_step, result.step, result.input_restored) == (3, 4, False)
    input_dir = tmp_path / "checkpoints" / "input" / "worker-00000"
    assert (input_dir / "ckpt-3.index").exists() and not (input_dir / "ckpt-4.index").exists()
    # A checkpoint of another model (5 classes instead of 3) is refused, naming it.
    with pytest.raises(ValueError, match=r"ckpt-4 does not fit this model"):
        _run(_config(tmp_path, steps=6), one_device, dataclasses.replace(plain, num_classes=5))


def test_finite_training_data_is_an_error(tmp_path, one_device):
    inputs = MemoryInputs(12, repeat=False)
    with pytest.raises(RuntimeError, match="training data ended after step 4"):
        _run(_config(tmp_path, steps=10), one_device, inputs)


def test_divergence_stops_training(tmp_path, one_device):
    config = _config(tmp_path, steps=30, optim=OptimConfig(base_lr=1e12, warmup_steps=0))
    with pytest.raises(FloatingPointError, match=r"training diverged.*Lower --base_lr"):
        _run(config, one_device)


def test_host_normalised_float_images_are_accepted(tmp_path, one_device):
    inputs = MemoryInputs(12, normalised=True)
    result = _run(_config(tmp_path, steps=12, eval_every=None), one_device, inputs)
    assert result.step == 12 and result.eval_metrics["examples"] == 10
    assert result.train_metrics["accuracy"] > 0.5


def test_images_of_the_wrong_size_are_refused(tmp_path, one_device):
    config = _config(tmp_path, data=DataConfig(source="memory", image_size=24))
    with pytest.raises(
        ValueError, match=r"expected uint8 or float32 of shape \[batch, 24, 24, 3\]"
    ):
        _run(config, one_device)


@pytest.mark.slow
def test_tf_data_service_input_resumes_from_the_delivered_set(jpeg_dataset, tmp_path, one_device):
    import tensorflow as tf

    from trainer.inputs import ReaderInputs

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    worker = service.WorkerServer(
        service.WorkerConfig(
            dispatcher_address=dispatcher.target.split("://")[1],
            port=0,
            heartbeat_interval_ms=250,
        )
    )
    try:
        data = DataConfig(
            source=str(jpeg_dataset.root), image_size=IMAGE, data_service=dispatcher.target
        )
        inputs = ReaderInputs.from_config(data, global_batch_size=8, seed=0)
        assert not inputs.checkpointable
        keys = tmp_path / "keys"
        config = {"data": data, "global_batch_size": 8, "audit_keys": str(keys), "eval_every": None}
        first = _run(_config(tmp_path / "run", steps=3, **config), one_device, inputs)
        resumed = _run(_config(tmp_path / "run", steps=5, **config), one_device, inputs)
    finally:
        worker.stop()
        dispatcher.stop()
    assert first.step == 3 and first.resume_kind == "fresh"
    # The service's position is not an iterator: the resume reads the rest of the epoch.
    assert (resumed.start_step, resumed.step, resumed.input_restored) == (3, 5, True)
    assert resumed.resume_kind == "elastic"
    # Evaluation reads directly (exactly once per example), not through the service.
    assert resumed.eval_metrics["examples"] == 10
    # The resume started a new segment of audit files at step 3.
    assert len(keys.read_text().split()) == 3 * 8
    trained = keys.read_text().split() + (tmp_path / "keys.from-00000003").read_text().split()
    assert len(trained) == 5 * 8 and set(trained) == set(jpeg_dataset.keys("train"))
    # 40 keys of a 24-example split: the first epoch whole, each key at most twice.
    assert max(Counter(trained).values()) == 2
    assert not (tmp_path / "run" / "checkpoints" / "input" / "worker-00000").exists()


def test_float16_loss_scaling_reports_the_unscaled_gradient_norm(one_device):
    import keras
    import tensorflow as tf

    from trainer.models import build_model
    from trainer.optim import build_optimizer
    from trainer.steps import TrainSteps

    images, labels, _ = MemoryInputs._arrays(12, 0)
    x, y = tf.constant(images), tf.constant(labels)
    norms = {}
    try:
        for policy in ("float32", "mixed_float16"):
            keras.mixed_precision.set_dtype_policy(policy)
            keras.utils.set_random_seed(0)
            with one_device.strategy.scope():
                model = build_model("small_cnn", num_classes=CLASSES, image_size=IMAGE)
                optimizer = build_optimizer(
                    OptimConfig(),
                    global_batch_size=12,
                    total_steps=10,
                    loss_scaling=policy == "mixed_float16",
                )
                optimizer.build(model.trainable_variables)
            steps = TrainSteps(
                dist=one_device,
                model=model,
                optimizer=optimizer,
                global_batch_size=12,
                image_size=IMAGE,
                loss_scaling=policy == "mixed_float16",
                image_dtype=tf.uint8,
                label_dtype=tf.int32,
            )
            totals, norm, _ = steps.train_with_norm(x, y, tf.constant(0.0))
            norms[policy] = float(norm)
            assert np.isfinite(totals.numpy()).all()
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    # The loss is scaled by 2**15 before differentiating; the logged norm must not be.
    assert norms["mixed_float16"] == pytest.approx(norms["float32"], rel=0.05)


def test_a_slow_end_of_run_says_what_it_waits_for(caplog):
    from trainer.loop import _Stopping

    with caplog.at_level(logging.INFO, logger="trainer.loop"):
        quick = _Stopping(after=0.5)
        quick.done()
        assert not caplog.records
        slow = _Stopping(after=0.05)
        time.sleep(0.3)
        slow.done()
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("finishing the run: closing the event files and stopping the")
    took = re.fullmatch(r"run finished in (\d+\.\d)s", messages[1])
    assert took and float(took.group(1)) >= 0.3, messages
