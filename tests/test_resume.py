"""``--resume``: builds killed or failed at many points, then resumed, are byte-identical to an
uninterrupted build, on local disk, on a bucket that refuses writes for a while, and on a Dask
cluster that loses a worker; staged examples are not decoded again and complete shards are not
written again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from beam_pipelines import images_to_tfrecord
from beam_pipelines.images_to_tfrecord import JobFailedError
from beam_pipelines.output.staging import RECORDS_DIR
from objstore import get_store
from tests.fixtures.dask_cluster import local_dask_cluster
from tests.fixtures.fault_proxy import FaultPlan
from tests.fixtures.images import make_bad_files, make_image_tree

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# Tiny staging files (~2 examples each) so that a kill at any moment finds some committed.
FLAGS = [
    "--image_size", "24", "--num_shards", "3", "--validation_fraction", "0.25",
    "--max_bad_fraction", "0.5", "--staging_file_mb", "0.002", "--progress", "off",
]  # fmt: skip
DEFAULT_PLAN_FLAGS = [f for f in FLAGS if f not in ("--num_shards", "3")]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _bucket_snapshot(uri: str) -> dict[str, bytes]:
    store = get_store(uri)
    prefix = uri.rstrip("/") + "/"
    return {info.uri[len(prefix) :]: store.read_bytes(info.uri) for info in store.list(prefix)}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """60 small JPEGs in 3 classes, a duplicate and two bad files."""
    root = tmp_path_factory.mktemp("resume") / "images"
    paths = make_image_tree(root, {"cat": 20, "dög": 20, "red fox": 20}, size=(40, 32))
    bad = make_bad_files((40, 32))
    (root / "cat" / "empty.jpg").write_bytes(bad["empty_file"])
    (root / "dög" / "not an image.jpg").write_bytes(bad["not_an_image"])
    (root / "red fox" / "copy.jpg").write_bytes(paths["cat"][3].read_bytes())
    return root


def _cli(images: Path, output: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "beam_pipelines.images_to_tfrecord",
        "--input", str(images), "--output", str(output), *extra,
    ]  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory) -> tuple[dict[str, bytes], float]:
    """An uninterrupted build through the CLI: its files, and how long it took."""
    output = tmp_path_factory.mktemp("resume") / "reference"
    start = time.monotonic()
    done = subprocess.run(
        _cli(images, output, *FLAGS), cwd=REPO, env=_env(), capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    files = _snapshot(output)
    assert not [name for name in files if name.startswith(".staging")]
    return files, time.monotonic() - start


def _kill_when(command: list[str], event: Callable[[], bool]) -> bool:
    """Starts ``command`` and SIGKILLs its process group as soon as ``event()`` holds.

    Returns:
      True if the process was still running when it was killed; False if it ended first.
    """
    proc = subprocess.Popen(
        command,
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not event():
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the event never came"
        time.sleep(0.005)
    running = proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return running and proc.returncode == -signal.SIGKILL


def _files(directory: Path, pattern: str = "*") -> int:
    return sum(1 for p in directory.glob(pattern) if p.is_file())


# Moments of a build that the test can see from outside, in the order they come: the output's
# staging area is made (the launcher has checked its input, nothing is read yet); the first
# staged file is committed (images are being prepared); a third of the staging files the
# reference build makes (60, with their sidecars) are committed (deep in the image step).
# The shard-writing moment is the next test's.
KILL_EVENTS = {
    "staging made": lambda out: (out / ".staging").is_dir(),
    "first staged file": lambda out: _files(out / ".staging" / RECORDS_DIR) >= 1,
    "a third staged": lambda out: _files(out / ".staging" / RECORDS_DIR) >= 20,
}


@pytest.mark.parametrize("event", sorted(KILL_EVENTS))
def test_launcher_killed_at_each_stage_then_resumed_is_byte_identical(
    images, reference, tmp_path, event
):
    expected, _ = reference
    output = tmp_path / "killed"
    killed = _kill_when(_cli(images, output, *FLAGS), lambda: KILL_EVENTS[event](output))
    assert killed, f"the build ended before {event!r}"
    assert not (output / "dataset.json").exists()  # nothing half-written is published
    resumed = subprocess.run(
        _cli(images, output, *FLAGS, "--resume"),
        cwd=REPO,
        env=_env(),
        capture_output=True,
        timeout=600,
    )
    assert resumed.returncode == 0, (event, resumed.stderr[-3000:])
    got = _snapshot(output)
    assert sorted(got) == sorted(expected), event
    for name, data in expected.items():
        assert got[name] == data, f"{name} differs after a kill at {event!r} and --resume"


def test_temporaries_an_interrupted_build_left_are_removed(images, reference, tmp_path):
    # A build killed between creating a shard's temporary and renaming it leaves the hidden
    # temporary beside the outputs; the next build, resumed or not, deletes it.
    expected, _ = reference
    for resume in (False, True):
        output = tmp_path / f"resume-{resume}"
        output.mkdir()
        stale = output / f".validation-00000-of-00001.tfrecord.tmp-{'4e69d243' * 4}"
        stale.write_bytes(b"")
        other = output / ".notes.tmp-kept"  # not a name the pipeline makes: left alone
        other.write_bytes(b"mine")
        argv = ["--input", str(images), "--output", str(output), *FLAGS]
        summary = images_to_tfrecord.run([*argv, "--resume"] if resume else argv)
        assert summary.published
        assert not stale.exists()
        other.unlink()
        assert _snapshot(output) == expected


def test_staged_examples_are_not_decoded_again_and_done_shards_not_written_again(
    images, reference, tmp_path
):
    expected, _ = reference
    output = tmp_path / "partial"
    proc = subprocess.Popen(
        _cli(images, output, *FLAGS),
        cwd=REPO,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Killed once the first shard is complete: by then every example is staged.
    done_dir = output / ".staging" / "done"
    deadline = time.monotonic() + 300
    while not list(done_dir.glob("*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no shard was completed in time"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(done_dir.glob("*.json")))
    assert 1 <= done_before
    summary = images_to_tfrecord.run(
        ["--input", str(images), "--output", str(output), *FLAGS, "--resume"]
    )
    assert summary.published
    # The two bad files are read again (and rejected again); every good image is reused.
    assert summary.metrics.get("images_read", 0) == 2
    assert summary.metrics.get("images_prepared", 0) == 0
    assert summary.metrics.get("shards_written", 0) == 4 - done_before  # 3 train + 1 validation
    assert _snapshot(output) == expected


def test_a_damaged_done_shard_is_written_again(images, reference, tmp_path):
    expected, _ = reference
    output = tmp_path / "damaged"
    argv = ["--input", str(images), "--output", str(output), *FLAGS]
    # A build refused at publishing (every input counts as bad) keeps its staging area...
    refused = images_to_tfrecord.run([*argv, "--max_bad_fraction", "0"])
    assert not refused.published and (output / ".staging" / "plan.json").exists()
    # ...a shard it completed is then damaged, and the build resumed with the real limit.
    shard = output / "train-00001-of-00003.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
    summary = images_to_tfrecord.run([*argv, "--resume"])
    assert summary.published
    assert summary.metrics["shards_written"] == 1  # only the damaged one
    assert summary.metrics.get("images_prepared", 0) == 0
    assert _snapshot(output) == expected


def test_resume_refuses_other_options_naming_them(images, tmp_path, capsys):
    output = tmp_path / "other"
    argv = ["--input", str(images), "--output", str(output), *FLAGS]
    assert not images_to_tfrecord.run([*argv, "--max_bad_fraction", "0"]).published
    status = images_to_tfrecord.main([*argv, "--resume", "--image_size", "32"])
    assert status == 2
    assert "image_size 24 -> 32" in capsys.readouterr().err
    assert (output / ".staging" / "plan.json").exists()  # nothing was thrown away


def test_default_plan_is_saved_before_any_shard_and_reused(images, tmp_path):
    output = tmp_path / "planned"
    argv = ["--input", str(images), "--output", str(output), *DEFAULT_PLAN_FLAGS]
    refused = images_to_tfrecord.run([*argv, "--max_bad_fraction", "0"])
    assert not refused.published
    plan = (output / ".staging" / "plan.json").read_text()
    assert '"rule": "listing"' in plan and '"inputs": 63' in plan
    summary = images_to_tfrecord.run([*argv, "--resume"])
    assert summary.published
    assert [s.file for s in summary.manifest.all_shards()] == [
        "train-00000-of-00001.tfrecord",
        "validation-00000-of-00001.tfrecord",
    ]
    assert not (output / ".staging").exists()


def test_bucket_refusing_writes_for_a_while_then_resumed(
    images, reference, s3_env, moto_server, fault_proxy
):
    expected, _ = reference
    proxy = fault_proxy(moto_server.url, FaultPlan(), flavour="s3")
    s3_env.point_at(proxy.url)
    # Beam's S3 client is botocore's with its default retries (legacy mode: 4 more attempts
    # after sleeps of up to 1, 2, 4 and 8 s), inside the project's own retry loop: every
    # refused write would sleep ~8 s per attempt before the job fails. One botocore attempt
    # leaves the project's retries (what this test exercises) and the same failure.
    s3_env.monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    output = s3_env.uri("dataset")
    argv = ["--input", str(images), "--output", output, *FLAGS]
    # Writes start failing part-way through (after the probe, the plan and some staging).
    proxy.set_plan(
        FaultPlan(
            always_fail=True,
            methods=("PUT", "POST"),
            after_requests=proxy.stats.requests + 40,
        )
    )
    with pytest.raises(JobFailedError):
        images_to_tfrecord.run(argv)
    refused = proxy.stats.errors_503
    assert refused > 0
    proxy.set_plan(FaultPlan())  # the store recovers
    summary = images_to_tfrecord.run([*argv, "--resume"])
    assert summary.published
    assert _bucket_snapshot(output) == expected


def test_dask_worker_killed_mid_build_then_resumed(images, reference, tmp_path):
    expected, _ = reference
    output = tmp_path / "dask"
    with local_dask_cluster(2, work_dir=tmp_path / "cluster") as cluster:
        argv = ["--input", str(images), "--output", str(output), *FLAGS, *cluster.runner_args()]
        outcome: dict[str, object] = {}

        def build() -> None:
            try:
                outcome["summary"] = images_to_tfrecord.run(argv)
            except Exception as e:  # a lost worker may fail the job
                outcome["error"] = e

        thread = threading.Thread(target=build)
        thread.start()
        records = output / ".staging" / "records"
        deadline = time.monotonic() + 300
        while not list(records.glob("*.json")) and thread.is_alive():
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.02)
        os.kill(cluster.worker_pids[0], signal.SIGKILL)
        thread.join(timeout=600)
        assert not thread.is_alive()
        if "error" in outcome or not outcome["summary"].published:
            summary = images_to_tfrecord.run([*argv, "--resume"])
            assert summary.published, cluster.logs()
    assert _snapshot(output) == expected
