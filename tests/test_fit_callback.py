"""Keras ``model.fit`` with ``BackupAndRestore`` and ``trainer.keras_fit.ExactEpochs`` as a real
process (``tests/models/fit_with_exact_epochs.py``), killed mid-epoch and resumed: every
example of the epoch is trained on exactly once, and each run's batches are the reader's own
order from its delivered set (so the callback records the batches Keras trained on, not those
its prefetching produced).

Two workers are not tested: Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy`` in
this TensorFlow (docs/training.md gives the error).
"""

from __future__ import annotations

import collections
import signal
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import LoggedProcess, process_env

EXAMPLES, BATCH, SEED = 14, 2, 7


def _fit(data: Path, run: Path, epochs: int) -> LoggedProcess:
    command = [sys.executable, "-m", "tests.models.fit_with_exact_epochs", str(data), str(run)]
    return LoggedProcess([*command, str(epochs)], env=process_env(), name="fit")


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
    killed = _fit(pipeline_dataset, run, epochs=3)
    # Killed after the save at batch 4 (delivered set, then weights) and one more batch.
    killed.wait_for_path(run / "delivered" / f"delivered-{4:012d}.bin")
    killed.wait_for(r"trained batch 4\b")
    killed.send_signal(signal.SIGKILL)
    assert killed.finish() == -signal.SIGKILL, killed.log
    lines = (run / "positions").read_text().splitlines()
    before = [[int(p) for p in line.split()] for line in lines]
    assert len(before) >= 5 and (run / "backup" / "latest.weights.h5").exists()
    assert before[:5] == _reader_order(pipeline_dataset, [], 5)
    committed = [p for batch in before[:4] for p in batch]

    resumed = _fit(pipeline_dataset, run, epochs=1)
    assert resumed.finish() == 0, resumed.log
    assert "fit done" in resumed.log
    assert f"resuming from {run}/delivered/delivered-{4:012d}.bin" in resumed.log, resumed.log
    assert "epoch 0, 6 of 14 examples remain" in resumed.log, resumed.log
    assert "epoch 0 complete at batch 7: every example exactly once" in resumed.log
    assert "exactly once is broken" not in resumed.log
    after = [[int(p) for p in line.split()] for line in (run / "positions").read_text().split("\n")]
    after = [batch for batch in after[len(before) :] if batch]
    assert len(after) == EXAMPLES // BATCH  # one Keras epoch of steps
    assert after == _reader_order(pipeline_dataset, committed, len(after))
    epoch0 = committed + [p for batch in after for p in batch if p < EXAMPLES]
    assert collections.Counter(epoch0) == collections.Counter(range(EXAMPLES))
