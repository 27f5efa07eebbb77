"""Kill and resume with real processes: DDP ranks (``gloo``), each with DataLoader workers.

A job of two ranks with two workers each reads a split whose shards differ tenfold in size;
after a checkpoint mid-epoch every process of it (ranks and workers) is SIGKILLed. The
checkpoint (``StatefulDataLoader.state_dict()`` of rank 0) is then resumed on the same two
ranks through ``StatefulDataLoader.load_state_dict``, and on one rank and on three (with other
numbers of workers) through the dataset's ``load_state_dict``. The stream the job trained on, the steps up to the
checkpoint plus every step after the resume, must hold every example of the epoch exactly
once; every rank must take the same number of steps. The same runs from an S3 bucket on
loopback behind a proxy that injects 503s, resets and cut bodies.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.object_store import BucketEnv, upload_tree
from tests.fixtures.processes import LoggedProcess, finish_all, free_ports, process_env
from tests.fixtures.split_datasets import write_split_dataset

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

# Tenfold differences between shards; 174 examples, not a multiple of the global batch (12).
SHARD_COUNTS = (60, 6, 30, 12, 48, 6, 12)
GLOBAL_BATCH = 12


def _start(world: int, args: list[str], name: str, **env: str) -> list[LoggedProcess]:
    (port,) = free_ports(1)
    processes = []
    for rank in range(world):
        rank_env = process_env(
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **env,
        )
        command = [sys.executable, "-m", "tests.torch_ddp_job", *args]
        processes.append(LoggedProcess(command, env=rank_env, name=f"{name} rank {rank}"))
    return processes


def _kill_tree(processes: list[LoggedProcess]) -> None:
    """SIGKILLs every rank and every DataLoader worker at once."""
    victims = []
    for process in processes:
        assert process.running, f"{process.name} ended before the kill:\n{process.log}"
        parent = psutil.Process(process.proc.pid)
        victims += [parent, *parent.children(recursive=True)]
    for victim in victims:
        victim.send_signal(signal.SIGKILL)
    assert finish_all(processes) == [-signal.SIGKILL] * len(processes)


def _steps(log: Path, up_to: int | None = None) -> list[list[int]]:
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    return [r["indices"] for r in rows if "indices" in r and (up_to is None or r["step"] <= up_to)]


def _rank_batches(log: Path) -> list[list[int]]:
    return [
        r["batches_per_rank"]
        for r in map(json.loads, log.read_text().splitlines())
        if "batches_per_rank" in r
    ]


def _job_args(data: Path | str, run: Path, *extra: str) -> list[str]:
    return [
        "--data", str(data), "--log", str(run / "log.jsonl"),
        "--checkpoint", str(run / "checkpoint.pt"),
        "--global_batch_size", str(GLOBAL_BATCH), *extra,
    ]  # fmt: skip


def _interrupted_run(data: Path | str, run: Path, *extra: str, **env: str) -> int:
    """Two ranks of two workers, killed after the checkpoint of step 4; returns that step."""
    run.mkdir()
    args = _job_args(data, run, "--step_sleep", "0.15", *extra)
    job = _start(2, args, "first run", **env)
    checkpoint = run / "checkpoint.pt"
    for process in job:
        process.wait_for_path(checkpoint, timeout=180)
    # Rank 0 saves every 2 steps: wait for the checkpoint of step 4, then kill mid-epoch.
    deadline = time.monotonic() + 120
    while torch.load(checkpoint, weights_only=False)["step"] < 4:
        if not job[0].running or time.monotonic() > deadline:
            pytest.fail(f"the first run ended or stalled before step 4:\n{job[0].log}")
        time.sleep(0.1)
    _kill_tree(job)
    return int(torch.load(checkpoint, weights_only=False)["step"])


def _resume(
    data: Path | str,
    first: Path,
    run: Path,
    world: int,
    workers: int,
    extra: tuple[str, ...] = (),
    **env: str,
) -> None:
    run.mkdir()
    shutil.copy(first / "checkpoint.pt", run / "checkpoint.pt")
    args = _job_args(data, run, "--resume", "--workers", str(workers), *extra)
    job = _start(world, args, f"resume on {world}", **env)
    statuses = finish_all(job, timeout=240)
    assert statuses == [0] * world, "\n".join(p.log for p in job)


def _check_exactly_once(
    first: Path, committed: int, resumed: Path, num_examples: int, passes: int = 1
) -> None:
    stream = [i for step in _steps(first / "log.jsonl", committed) for i in step]
    after = _steps(resumed / "log.jsonl")
    assert after, "the resumed run trained nothing"
    stream += [i for step in after for i in step]
    epoch = stream[:num_examples]
    assert sorted(epoch) == list(range(num_examples)), (
        f"not every example exactly once: {len(set(epoch))} distinct of {len(epoch)}"
    )
    # A pass ends with its last step started in its epoch: less than a step of the next.
    assert 0 <= len(stream) - passes * num_examples < GLOBAL_BATCH
    for epoch in range(1, passes):
        later = stream[epoch * num_examples : (epoch + 1) * num_examples]
        assert sorted(later) == list(range(num_examples)), f"epoch {epoch} is not exact"
    per_pass = _rank_batches(resumed / "log.jsonl")
    assert len(per_pass) == passes
    for counts in per_pass:
        assert len(set(counts)) == 1, f"ranks stepped unequally: {counts}"


@pytest.fixture(scope="module")
def uneven_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch_uneven") / "ds"
    write_split_dataset(root, SHARD_COUNTS, encoding="jpeg", image_size=32)
    return root


def test_kill_and_resume_on_two_one_and_three_ranks(uneven_split: Path, tmp_path: Path) -> None:
    committed = _interrupted_run(uneven_split, tmp_path / "first")
    rows = _steps(tmp_path / "first" / "log.jsonl")
    assert committed < len(rows) + 1 and committed * GLOBAL_BATCH < sum(SHARD_COUNTS), (
        "the kill did not land mid-epoch"
    )
    # The same two ranks of two workers, through StatefulDataLoader.load_state_dict.
    _resume(
        uneven_split, tmp_path / "first", tmp_path / "two", world=2, workers=2,
        extra=("--resume_loader",),
    )  # fmt: skip
    _check_exactly_once(tmp_path / "first", committed, tmp_path / "two", sum(SHARD_COUNTS))
    _resume(uneven_split, tmp_path / "first", tmp_path / "one", world=1, workers=2)
    _check_exactly_once(tmp_path / "first", committed, tmp_path / "one", sum(SHARD_COUNTS))
    # Three ranks finish the epoch and read the next whole (shards tenfold uneven: equal steps).
    _resume(
        uneven_split, tmp_path / "first", tmp_path / "three", world=3, workers=1,
        extra=("--passes", "2"),
    )  # fmt: skip
    _check_exactly_once(
        tmp_path / "first", committed, tmp_path / "three", sum(SHARD_COUNTS), passes=2
    )


def test_kill_and_resume_training_from_a_faulty_bucket(
    uneven_split: Path, tmp_path: Path, s3_env: BucketEnv, fault_proxy: Callable
) -> None:
    """The same from S3 behind 503s, resets and cut bodies, with ResNet-18 trained under DDP:
    each host downloads through one cache, owned by one rank, that the workers read through."""
    upload_tree(uneven_split, s3_env.uri("ds"))
    plan = FaultPlan(
        seed=3, error_rate=0.15, reset_rate=0.1, truncate_rate=0.1, fail_first=".tfrecord"
    )
    proxy = fault_proxy(s3_env.server_url, plan, flavour="s3")
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    env["AWS_ENDPOINT_URL"] = proxy.url
    data = s3_env.uri("ds")
    first = tmp_path / "first"
    committed = _interrupted_run(data, first, "--cache_dir", str(tmp_path / "cache1"), **env)
    _resume(
        data, first, tmp_path / "one", world=1, workers=2,
        extra=("--train", "--cache_dir", str(tmp_path / "cache2")), **env,
    )  # fmt: skip
    _check_exactly_once(first, committed, tmp_path / "one", sum(SHARD_COUNTS))
    losses = [
        r["loss"]
        for r in map(json.loads, (tmp_path / "one" / "log.jsonl").read_text().splitlines())
        if "loss" in r
    ]
    assert losses and all(math.isfinite(x) for x in losses)
    assert proxy.stats.faults >= 3 and proxy.stats.truncations, proxy.stats
