"""Keras ``model.fit`` with ``BackupAndRestore`` and ``trainer.keras_fit.ExactEpochs`` as real
processes, killed mid-epoch and resumed: every example of the epoch is trained on exactly
once, and each run's batches are the reader's own order from its delivered set (so the
callback records the batches Keras trained on, not those its prefetching produced).

* one worker (``tests/models/fit_with_exact_epochs.py``) with ``ModelCheckpoint`` beside
  ``BackupAndRestore``: the resume from the backup is exact, and each weights file it keeps
  restores the data position saved with it;
* two workers on loopback (``tests/models/fit_on_workers.py``, ``MultiWorkerMirroredStrategy``
  with ``ExactEpochs.attach``): each worker records the global batches.

The SIGKILL is sent after the save at batch 4 and the next batch's log line; on a loaded
machine the process may have saved at batch 6 before the signal lands, so the resume is
checked from whichever delivered set it restored.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import sys
from pathlib import Path

import pytest

from tests.fixtures.processes import LoggedProcess, finish_all, free_ports, process_env
from trainer.keras_fit import ExactEpochs

EXAMPLES, BATCH, SEED = 14, 2, 7


def _fit(data: Path, run: Path, epochs: int, *extra: str) -> LoggedProcess:
    command = [sys.executable, "-m", "tests.models.fit_with_exact_epochs", str(data), str(run)]
    return LoggedProcess([*command, str(epochs), *extra], env=process_env(), name="fit")


def _fit_on_workers(data: Path, run: Path, epochs: int) -> list[LoggedProcess]:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    command = [sys.executable, "-m", "tests.models.fit_on_workers", str(data), str(run)]
    return [
        LoggedProcess(
            [*command, str(epochs)],
            env=process_env(
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": k}})
            ),
            name=f"worker {k}",
        )
        for k in range(2)
    ]


def _positions(path: Path) -> list[list[int]]:
    return [[int(p) for p in line.split()] for line in path.read_text().splitlines() if line]


def _reader_order(
    data: Path, delivered: list[int], batches: int, workers: int = 1
) -> list[list[int]]:
    """The positions of the first ``batches`` global batches the reader gives after
    ``delivered``: on several workers, each worker's part in turn (the gather's order)."""
    import tensorflow as tf

    import tfrecord_io

    manifest = tfrecord_io.load_manifest(str(data))
    shards = manifest.split("train").shards
    origin = tfrecord_io.DeliveredSet.from_indices(
        EXAMPLES,
        delivered,
        seed=SEED,
        split=tfrecord_io.split_digest((s.file, s.num_examples) for s in shards),
    )
    parts = []
    for worker in range(workers):
        context = tf.distribute.InputContext(workers, worker, workers) if workers > 1 else None
        dataset = tfrecord_io.make_dataset(
            data,
            global_batch_size=BATCH,
            seed=SEED,
            input_context=context,
            read_config=tfrecord_io.ReadConfig(exclude=origin),
        )
        parts.append([element[-1].numpy().tolist() for element in dataset.take(batches)])
    return [sum(batch, []) for batch in zip(*parts, strict=True)]


def _kill_after_batch_4(processes: list[LoggedProcess], runs: list[Path]) -> None:
    """SIGKILLs the processes once each has saved at batch 4 and logged the next batch."""
    for process, run in zip(processes, runs, strict=True):
        process.wait_for_path(run / "delivered" / f"delivered-{4:012d}.bin")
        process.wait_for(r"trained batch 4\b")
    for process in processes:
        process.send_signal(signal.SIGKILL)
    assert finish_all(processes) == [-signal.SIGKILL] * len(processes), [p.log for p in processes]


def _check_resumed(
    data: Path, run: Path, log: str, before: list[list[int]], workers: int = 1
) -> int:
    """Checks a resumed fit of one Keras epoch trained the rest of data epoch 0 in the
    reader's order from the delivered set it restored, every example once; returns the
    batches that delivered set had counted."""
    restored = re.search(
        rf"resuming from {re.escape(str(run))}/delivered/delivered-(\d+)\.bin", log
    )
    assert restored, log
    saved = int(restored.group(1))
    assert saved in (4, 6) and len(before) >= saved, log
    committed = [p for batch in before[:saved] for p in batch]
    assert f"epoch 0, {EXAMPLES - BATCH * saved} of {EXAMPLES} examples remain" in log, log
    assert "epoch 0 complete at batch 7: every example exactly once" in log, log
    assert "exactly once is broken" not in log
    after = _positions(run / "positions")[len(before) :]
    assert len(after) == EXAMPLES // BATCH  # one Keras epoch of steps
    assert after == _reader_order(data, committed, len(after), workers)
    epoch0 = committed + [p for batch in after for p in batch if p < EXAMPLES]
    assert collections.Counter(epoch0) == collections.Counter(range(EXAMPLES))
    return saved


def _exact(data: Path, run: Path, checkpoint: Path) -> ExactEpochs:
    return ExactEpochs(
        str(run / "delivered"),
        checkpoint=str(checkpoint),
        source=str(data),
        global_batch_size=BATCH,
        seed=SEED,
        save_freq=2,
    )


@pytest.mark.slow
def test_model_checkpoint_files_pair_with_their_delivered_sets(pipeline_dataset, tmp_path):
    """ModelCheckpoint beside BackupAndRestore: killed mid-epoch, each of its weights files
    pairs with the delivered set saved with it, and the resume from BackupAndRestore's backup
    trains every example once, in the reader's order."""
    run = tmp_path / "run"
    _kill_after_batch_4([_fit(pipeline_dataset, run, 3, "model_checkpoint")], [run])
    before = _positions(run / "positions")
    assert before[:5] == _reader_order(pipeline_dataset, [], 5)
    weights = run / "checkpoints"
    # Named by Keras epoch and batch: model-01-04 is the save after 4 batches.
    saves = sorted(int(p.name[len("model-01-") : -len(".weights.h5")]) for p in weights.iterdir())
    assert saves in ([2, 4], [2, 4, 6]), saves
    # Restoring any weights file restores the data position saved with it.
    for batches in saves:
        exact = _exact(pipeline_dataset, run, weights / f"model-01-{batches:02d}.weights.h5")
        assert exact.batches == batches
        assert exact.tracker.delivered.remaining == EXAMPLES - BATCH * batches
        assert exact.restored_from == str(run / "delivered" / f"delivered-{batches:012d}.bin")

    resumed = _fit(pipeline_dataset, run, 1, "model_checkpoint")
    assert resumed.finish() == 0, resumed.log
    assert "fit done" in resumed.log
    saved = _check_resumed(pipeline_dataset, run, resumed.log, before)
    # The resumed fit's saves (after 2, 4, 6 of its batches) pair the same way.
    latest = _exact(pipeline_dataset, run, weights / "model-01-06.weights.h5")
    assert latest.batches == saved + 6 and latest.tracker.delivered.epoch == 1


@pytest.mark.slow
def test_fit_on_two_workers_killed_mid_epoch_resumes_with_every_example_once(
    pipeline_dataset, tmp_path
):
    """Keras fit under MultiWorkerMirroredStrategy with ExactEpochs.attach, both workers
    SIGKILLed mid-epoch and resumed: each worker records every global batch."""
    run = tmp_path / "run"
    own = [run / f"worker-{k}" for k in range(2)]
    _kill_after_batch_4(_fit_on_workers(pipeline_dataset, run, 3), own)
    before = [_positions(directory / "positions") for directory in own]
    # The steps are synchronous, so both record the same global batches.
    assert before[0][:5] == before[1][:5] == _reader_order(pipeline_dataset, [], 5, workers=2)

    resumed = _fit_on_workers(pipeline_dataset, run, 1)
    assert finish_all(resumed) == [0, 0], [w.log for w in resumed]
    saved = [
        _check_resumed(pipeline_dataset, directory, worker.log, mine, workers=2)
        for directory, worker, mine in zip(own, resumed, before, strict=True)
    ]
    assert saved[0] == saved[1], saved  # both resumed from the same step


def test_a_checkpoint_older_than_every_delivered_set_is_refused(pipeline_dataset, tmp_path):
    exact = _exact(pipeline_dataset, tmp_path, tmp_path / "absent.weights.h5")
    assert exact.restored_from is None and exact.batches == 0  # a first run
    exact.save()
    old = tmp_path / "old.weights.h5"
    old.write_bytes(b"weights")
    os.utime(old, ns=(0, 0))
    with pytest.raises(ValueError, match="no delivered set in .* is as old as the checkpoint"):
        _exact(pipeline_dataset, tmp_path, old)
