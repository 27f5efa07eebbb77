"""Exactly-once epochs across resumes on other topologies: ``python -m trainer.train`` as real
processes (TF_CONFIG workers on loopback, a real tf.data dispatcher and workers), checked with
``--audit_keys``: over the union of all runs' audit files, every key of the epoch exactly once.

* one run of resumes (each process costs seconds of start-up, so they are chained): 1 worker
  with 2 CPU replicas killed (SIGKILL) between checkpoints -> the same layout with 1 replica
  (iterators restored: only the examples trained after the last checkpoint come again, in the
  same order) -> 2 workers, SIGTERM after 20 steps -> 1 worker to the end of the epoch;
* in-process -> through a dispatcher and two service workers -> in-process again.

Small on purpose: 320 examples of 16 px JPEG in 8 shards, global batch 8 (40 steps an epoch).
"""

from __future__ import annotations

import collections
import signal
from pathlib import Path

import pytest

from tests.fixtures.data_service import running_cluster
from tests.fixtures.processes import (
    LoggedProcess,
    finish_all,
    latest_checkpoint_step,
    run_trainer,
    start_trainer,
    start_trainer_workers,
)
from tests.fixtures.shards import WrittenDataset, write_dataset

EXAMPLES, BATCH = 320, 8
COMMON = [
    "--image_size=16",
    f"--global_batch_size={BATCH}",
    "--warmup_steps=2",
    "--base_lr=0.2",
    "--log_every=1",
    "--seed=5",
]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    return write_dataset(
        tmp_path_factory.mktemp("elastic") / "ds",
        examples={"train": EXAMPLES},
        num_shards={"train": 8},
        image_size=16,
    )


def _start(args: list[str]) -> LoggedProcess:
    return start_trainer([*COMMON, *args])


def _run(args: list[str]) -> LoggedProcess:
    return run_trainer([*COMMON, *args])


def _audited(run: Path) -> list[str]:
    """Every key in every audit file of a run directory (all segments, all workers)."""
    return [key for path in sorted(run.glob("keys*")) for key in path.read_text().split()]


def _assert_epoch_exactly_once(run: Path, dataset: WrittenDataset) -> None:
    keys = _audited(run)
    counts = collections.Counter(keys)
    repeated = {k: n for k, n in counts.items() if n > 1}
    assert not repeated, f"{len(repeated)} keys trained more than once: {list(repeated)[:4]}"
    assert sorted(counts) == sorted(dataset.keys("train"))


@pytest.mark.slow
def test_sigkill_then_other_replicas_then_two_workers_sigterm_then_one_to_the_end(
    small_dataset, tmp_path
):
    run = tmp_path / "run"
    args = [f"--data={small_dataset.root}", f"--model_dir={run}", f"--audit_keys={run}/keys"]

    # 1 worker (2 CPU replicas), killed between the checkpoints of steps 4 and 8: once it has
    # saved step 4 and logged step 6.
    killed = _start([*args, "--steps=100000", "--cpu_replicas=2", "--checkpoint_every=4"])
    killed.wait_for(r"(?m)saved \S+/ckpt-4$")  # the log: ckpt-4 is deleted again at step 16
    killed.wait_for(r"step 6/100000 ")
    killed.send_signal(signal.SIGKILL)
    assert killed.finish() == -signal.SIGKILL, killed.log
    assert "resume: fresh start; epoch 0: 320 examples" in killed.log, killed.log
    saved = latest_checkpoint_step(run)
    trained_before = (run / "keys").read_text().split()  # what the killed run trained on
    uncommitted = trained_before[saved * BATCH :]
    # The signal lands a few steps after the log line is read: on a fast run the trainer may
    # have saved step 8 too. Either way it resumes from the latest checkpoint.
    assert saved in (4, 8), f"killed at step {len(trained_before) // BATCH}"

    # The same layout with 1 CPU replica: iterators restored, so exactly the examples trained
    # after the checkpoint come again, in the same order, and nothing else.
    again = _run([*args, "--steps=10", "--checkpoint_every=100"])
    assert f"resume: exact at step {saved} (same input layout" in again.log, again.log
    after = (run / "keys").read_text().split()
    assert after[: saved * BATCH] == trained_before[: saved * BATCH]
    assert after[saved * BATCH : saved * BATCH + len(uncommitted)] == uncommitted
    everything = collections.Counter(trained_before + after[saved * BATCH :])
    assert {k for k, n in everything.items() if n > 1} == set(uncommitted)

    # Two workers from step 10; SIGTERM to worker 0 once they have trained 20 steps.
    workers = start_trainer_workers([*COMMON, *args, "--steps=100000", "--checkpoint_every=7"])
    workers[0].wait_for(r"step 30/100000 ")
    workers[0].send_signal(signal.SIGTERM)
    codes = finish_all(workers)
    assert codes == [128 + signal.SIGTERM] * 2, workers[0].log + workers[1].log
    log = workers[0].log
    assert "resume: elastic at step 10 (the input layout changed: num_workers 1 -> 2)" in log, log
    assert "epoch 0: 240 of 320 examples remain, 120 of them in this worker's pipeline" in log
    stopped = latest_checkpoint_step(run)
    assert stopped >= 30
    # Both stop at the same step (the stop vote goes through the all-reduce), each with one
    # line saying what was kept and how to go on.
    for worker in workers:
        assert (
            f"interrupted by SIGTERM; saved step {stopped} in {run}; rerun the same command to "
            f"resume from step {stopped}"
        ) in worker.log, worker.log

    # One worker to the end of the epoch.
    last = _run([*args, "--epochs=1", "--checkpoint_every=100"])
    assert f"resume: elastic at step {stopped} (the input layout changed: num_workers 2 -> 1)" in (
        last.log
    ), last.log
    left = EXAMPLES - BATCH * stopped
    assert f"epoch 0: {left} of 320 examples remain, {left} of them" in last.log
    assert "epoch 0 complete at step 40: every example exactly once" in last.log
    assert "exactly-once guarantee is broken" not in last.log + log + again.log
    _assert_epoch_exactly_once(run, small_dataset)
    # Each segment's audit files, cut back to the checkpoint the next segment started from.
    assert len((run / "keys").read_text().split()) == 10 * BATCH
    for i in range(2):
        segment = run / f"keys.from-00000010.worker-{i:05d}"
        assert len(segment.read_text().split()) == (stopped - 10) * BATCH // 2


@pytest.mark.slow
def test_in_process_then_tf_data_service_then_in_process(small_dataset, tmp_path):
    run = tmp_path / "run"
    args = [
        f"--data={small_dataset.root}",
        f"--model_dir={run}",
        f"--audit_keys={run}/keys",
        "--checkpoint_every=100",
    ]
    _run([*args, "--steps=5"])
    with running_cluster(tmp_path / "service", num_workers=2) as cluster:
        served = _run([*args, "--steps=15", f"--data_service={cluster.address}"])
        for worker in cluster.workers:
            assert worker.alive
    assert "resume: elastic at step 5 (the input layout changed: service False -> True)" in (
        served.log
    ), served.log
    assert "split dynamically over the tf.data service's workers" in served.log
    back = _run([*args, "--epochs=1"])
    assert "resume: elastic at step 15 (the input layout changed: service True -> False)" in (
        back.log
    ), back.log
    assert "epoch 0 complete at step 40: every example exactly once" in back.log
    _assert_epoch_exactly_once(run, small_dataset)
