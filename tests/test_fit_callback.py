"""Keras ``model.fit`` with ``BackupAndRestore`` and ``trainer.keras_fit.ExactEpochs`` as a real
process (``tests/models/fit_with_exact_epochs.py``), killed mid-epoch and resumed: every
example of the epoch is trained on exactly once, and each run's batches are the reader's own
order from its delivered set (so the callback records the batches Keras trained on, not those
its prefetching produced).

``ModelCheckpoint`` beside ``BackupAndRestore``: each weights file it keeps restores the data
position saved with it. Two workers are not tested: Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy`` in
this TensorFlow (docs/training.md gives the error).
"""

from __future__ import annotations

import collections
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import LoggedProcess, process_env
from trainer.keras_fit import ExactEpochs

EXAMPLES, BATCH, SEED = 14, 2, 7


def _fit(data: Path, run: Path, epochs: int, *extra: str) -> LoggedProcess:
    command = [sys.executable, "-m", "tests.models.fit_with_exact_epochs", str(data), str(run)]
    return LoggedProcess([*command, str(epochs), *extra], env=process_env(), name="fit")


def _kill_after_batch_4(data: Path, run: Path, *extra: str) -> list[list[int]]:
    """Starts a fit, SIGKILLs it after the save at batch 4 and one more batch; returns the
    positions of the batches it trained."""
    killed = _fit(data, run, 3, *extra)
    killed.wait_for_path(run / "delivered" / f"delivered-{4:012d}.bin")
    killed.wait_for(r"trained batch 4\b")
    killed.send_signal(signal.SIGKILL)
    assert killed.finish() == -signal.SIGKILL, killed.log
    lines = (run / "positions").read_text().splitlines()
    before = [[int(p) for p in line.split()] for line in lines]
    assert len(before) >= 5 and (run / "backup" / "latest.weights.h5").exists()
    assert before[:5] == _reader_order(data, [], 5)
    return before


def _resume_and_check(data: Path, run: Path, before: list[list[int]], *extra: str) -> None:
    """Resumes the fit killed after batch 4 for one Keras epoch; checks it trains the rest of
    data epoch 0 in the reader's order from the delivered set, every example once."""
    committed = [p for batch in before[:4] for p in batch]
    resumed = _fit(data, run, 1, *extra)
    assert resumed.finish() == 0, resumed.log
    assert "fit done" in resumed.log
    assert f"resuming from {run}/delivered/delivered-{4:012d}.bin" in resumed.log, resumed.log
    assert "epoch 0, 6 of 14 examples remain" in resumed.log, resumed.log
    assert "epoch 0 complete at batch 7: every example exactly once" in resumed.log
    assert "exactly once is broken" not in resumed.log
    after = [[int(p) for p in line.split()] for line in (run / "positions").read_text().split("\n")]
    after = [batch for batch in after[len(before) :] if batch]
    assert len(after) == EXAMPLES // BATCH  # one Keras epoch of steps
    assert after == _reader_order(data, committed, len(after))
    epoch0 = committed + [p for batch in after for p in batch if p < EXAMPLES]
    assert collections.Counter(epoch0) == collections.Counter(range(EXAMPLES))


def _exact(data: Path, run: Path, checkpoint: Path) -> ExactEpochs:
    return ExactEpochs(
        str(run / "delivered"),
        checkpoint=str(checkpoint),
        source=str(data),
        global_batch_size=BATCH,
        seed=SEED,
        save_freq=2,
    )


def _reader_order(data: Path, delivered: list[int], batches: int) -> list[list[int]]:
    """The positions of the first ``batches`` batches the reader gives after ``delivered``."""
    import tfrecord_io

    manifest = tfrecord_io.load_manifest(str(data))
    shards = manifest.split("train").shards
    origin = tfrecord_io.DeliveredSet.from_indices(
        EXAMPLES,
        delivered,
        seed=SEED,
        split=tfrecord_io.split_digest((s.file, s.num_examples) for s in shards),
    )
    dataset = tfrecord_io.make_dataset(
        data,
        global_batch_size=BATCH,
        seed=SEED,
        read_config=tfrecord_io.ReadConfig(exclude=origin),
    )
    return [element[-1].numpy().tolist() for element in dataset.take(batches)]


@pytest.mark.slow
def test_fit_killed_mid_epoch_resumes_with_every_example_once(pipeline_dataset, tmp_path):
    run = tmp_path / "run"
    before = _kill_after_batch_4(pipeline_dataset, run)
    _resume_and_check(pipeline_dataset, run, before)


@pytest.mark.slow
def test_model_checkpoint_files_pair_with_their_delivered_sets(pipeline_dataset, tmp_path):
    """ModelCheckpoint beside BackupAndRestore: killed mid-epoch, each of its weights files
    pairs with the delivered set saved with it, and the resume trains every example once."""
    run = tmp_path / "run"
    before = _kill_after_batch_4(pipeline_dataset, run, "model_checkpoint")
    weights = run / "checkpoints"
    assert sorted(p.name for p in weights.iterdir()) == [
        "model-01-02.weights.h5",
        "model-01-04.weights.h5",
    ]
    # Restoring either weights file restores the data position saved with it.
    for name, batches in [("model-01-02.weights.h5", 2), ("model-01-04.weights.h5", 4)]:
        exact = _exact(pipeline_dataset, run, weights / name)
        assert exact.batches == batches and exact.tracker.delivered.remaining == 14 - 2 * batches
        assert exact.restored_from == str(run / "delivered" / f"delivered-{batches:012d}.bin")

    _resume_and_check(pipeline_dataset, run, before, "model_checkpoint")
    # The resumed fit's saves (after 2, 4, 6 of its batches) pair the same way.
    latest = _exact(pipeline_dataset, run, weights / "model-01-06.weights.h5")
    assert latest.batches == 4 + 6 and latest.tracker.delivered.epoch == 1


def test_a_checkpoint_older_than_every_delivered_set_is_refused(pipeline_dataset, tmp_path):
    exact = _exact(pipeline_dataset, tmp_path, tmp_path / "absent.weights.h5")
    assert exact.restored_from is None and exact.batches == 0  # a first run
    exact.save()
    old = tmp_path / "old.weights.h5"
    old.write_bytes(b"weights")
    os.utime(old, ns=(0, 0))
    with pytest.raises(ValueError, match="no delivered set in .* is as old as the checkpoint"):
        _exact(pipeline_dataset, tmp_path, old)
