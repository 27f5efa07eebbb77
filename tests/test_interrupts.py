"""Ctrl-C and SIGTERM as users expect: the pipeline, run under a pseudo-terminal on the
in-process runner and on multi-process DirectRunner workers, ends within seconds with one line
(what was kept, the ``--resume`` command), status 130 or 143 and no traceback, publishes
nothing, and ``--resume`` then finishes byte-identically; the dataset tools and the sample set
end the same way (the sample set keeps whole files only, and a rerun writes the whole set), and
end quietly (141) when the reader of their output goes away (``| head``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipelines import images_to_tfrecord, samples
from beam_pipelines.interrupts import interrupted_line
from beam_pipelines.output.staging import RecordStager
from cliflags.interrupts import BROKEN_PIPE, catch_interrupts, run_command
from tests.fixtures.images import make_image_tree
from tests.fixtures.processes import REPO, catches_signal, process_env, run_in_terminal

# Tiny staging files, so the first one is committed (the event the test waits for) early in a
# run that has most of its images still to prepare.
FLAGS = [
    "--image_size", "24", "--num_shards", "2", "--validation_fraction", "0.2",
    "--staging_file_mb", "0.002", "--progress", "off",
]  # fmt: skip
MULTI_PROCESS = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]
DASK = ("dask",)  # stands for the session's Dask cluster's runner flags
DEADLINE_S = 180.0
FEW_SECONDS = 15.0  # from the signal to the exit, on a shared, loaded CI machine


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _assert_no_tasks_left(address: str) -> None:
    """The job was cancelled on the cluster: within seconds its scheduler holds no task (a task
    already running on a worker ends with its partition)."""
    from distributed import Client

    with Client(address, timeout=30) as client:
        deadline = time.monotonic() + FEW_SECONDS
        while tasks := client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)):
            assert time.monotonic() < deadline, f"{tasks} tasks still on the Dask scheduler"
            time.sleep(0.2)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """300 small JPEGs in 2 classes: a few seconds of work after the first staged file."""
    root = tmp_path_factory.mktemp("interrupts") / "images"
    make_image_tree(root, {"cat": 150, "dog": 150}, size=(64, 48))
    return root


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory) -> dict[str, bytes]:
    """An uninterrupted build's files."""
    output = tmp_path_factory.mktemp("interrupts") / "reference"
    assert images_to_tfrecord.run(["--input", str(images), "--output", str(output), *FLAGS])
    return _snapshot(output)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "runner", "status"),
    [
        ("ctrl-c", (), 130),
        ("ctrl-c", MULTI_PROCESS, 130),
        ("sigterm", MULTI_PROCESS, 143),
        ("ctrl-c", DASK, 130),
    ],
    ids=["ctrl-c-in-process", "ctrl-c-multi-process", "sigterm-multi-process", "ctrl-c-dask"],
)
def test_an_interrupted_build_says_how_to_resume_and_resumes_byte_identically(
    images, reference, tmp_path, request, how, runner, status
):
    dask = request.getfixturevalue("dask_cluster") if runner == DASK else None
    if dask is not None:
        runner = dask.runner_args()
    output = tmp_path / "dataset"
    argv = ["--input", str(images), "--output", str(output), *FLAGS, *runner]
    code, text, elapsed = run_in_terminal(
        ["-m", "beam_pipelines.images_to_tfrecord", *argv],
        # A staging file counts as kept once its sidecar is written, just after the file.
        wait_for=str(output / ".staging" / "records" / "*.json"),
        how=how,
        deadline_s=DEADLINE_S,
    )
    assert code == status, text
    assert elapsed < FEW_SECONDS, text
    assert "Traceback" not in text and "Exception" not in text, text
    lines = [line for line in text.replace("^C", "").splitlines() if line.strip()]
    assert len(lines) == 1, text
    signal_name = "Ctrl-C (SIGINT)" if how == "ctrl-c" else "SIGTERM"
    assert lines[0].startswith(f"interrupted by {signal_name}; nothing new was published"), text
    # It waited for a committed staging file, so some prepared images are kept, and it says so.
    assert re.search(r"; [1-9]\d* prepared images? (is|are) kept in ", lines[0]), text
    assert lines[0].endswith(" --resume"), text
    assert str(output / ".staging") in lines[0]
    assert not (output / "dataset.json").exists()
    if dask is not None:
        _assert_no_tasks_left(dask.address)
    # The command it names continues the build to the same bytes as an uninterrupted one.
    summary = images_to_tfrecord.run([*argv, "--resume"])
    assert summary.published
    assert _snapshot(output) == reference


@pytest.mark.slow
def test_interrupted_samples_keep_whole_files_and_a_rerun_writes_the_set(tmp_path):
    output = tmp_path / "samples"
    argv = ["--output", str(output), "--per_class", "8"]  # 38 files, about 2 s of work
    first_class = output / next(iter(samples.SAMPLE_CLASSES))
    code, text, elapsed = run_in_terminal(
        ["-m", "beam_pipelines.samples", *argv],
        # Its handler is in place (Python's default has none for SIGTERM) and it has begun.
        wait_for=lambda pid: catches_signal(pid, signal.SIGTERM) and any(first_class.iterdir()),
        how="ctrl-c",
        deadline_s=60.0,
    )
    assert code == 130, text
    assert elapsed < FEW_SECONDS, text
    assert "Traceback" not in text and "Error" not in text, text
    lines = [line for line in text.replace("^C", "").splitlines() if line.strip()]
    assert len(lines) == 1, text
    match = re.fullmatch(
        rf"interrupted by Ctrl-C \(SIGINT\); {re.escape(str(output))} holds (\d+) of the set's "
        "38 files, each one whole: rerun the same command to write the whole set",
        lines[0],
    )
    assert match, text
    kept = _snapshot(output)
    assert 1 <= int(match[1]) == len(kept) < 38, sorted(kept)
    reference_dir = tmp_path / "reference"
    samples.write_sample_set(reference_dir, per_class=8)
    reference = _snapshot(reference_dir)
    # Every file kept is whole: no temporary left beside them, no file cut short.
    assert set(kept) <= set(reference), sorted(set(kept) - set(reference))
    assert all(data == reference[name] for name, data in kept.items())
    # The same command writes the whole set, the same bytes as an uninterrupted run.
    assert samples.main(argv) == 0
    assert _snapshot(output) == reference


def test_the_interrupt_line_counts_the_committed_images_not_a_bare_staging_area(tmp_path):
    output = tmp_path / "dataset"
    argv = ["--input", "photos", "--output", str(output)]
    (output / ".staging").mkdir(parents=True)
    (output / ".staging" / "plan.json").write_text("{}")
    line = interrupted_line(signal.SIGINT, str(output), argv)
    assert "no prepared image was kept yet in" in line, line
    assert "--resume reuses the shard plan" in line, line
    assert line.endswith(f"--output {output} --resume"), line
    stager = RecordStager(str(output))
    for i in range(3):
        stager.add(f"{i:064x}", f"photos/cat/{i}.jpg", b"example %d" % i, None)
    stager.add(f"{9:064x}", "photos/cat/9.jpg", b"another file", None)
    assert stager.flush()  # 4 records in one committed file
    stager.add(f"{8:064x}", "photos/cat/8.jpg", b"not committed", None)  # lost with a kill
    line = interrupted_line(signal.SIGINT, str(output), argv)
    assert f"4 prepared images are kept in {output / '.staging'}: continue with" in line, line
    assert line.endswith(" --resume"), line


def test_run_command_turns_a_signal_into_its_status_and_one_line(capsys):
    def body() -> int:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        return 0

    assert run_command(body) == 143
    assert capsys.readouterr().err == "interrupted by SIGTERM; nothing was changed\n"
    assert run_command(lambda: 7) == 7
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_catch_interrupts_records_the_signal_and_restores_handlers():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), catch_interrupts() as caught:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    assert caught.signum == signal.SIGINT and caught.exit_status == 130
    assert signal.getsignal(signal.SIGINT) is before


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["dataset_tools.diff", "dataset_tools.verify"])
def test_a_tool_whose_reader_goes_away_ends_quietly(images, reference, tmp_path, tool):
    # The reference dataset's files, written where the tools can read them.
    dataset = tmp_path / "dataset"
    for name, data in reference.items():
        (dataset / name).parent.mkdir(parents=True, exist_ok=True)
        (dataset / name).write_bytes(data)
    args = (
        [str(dataset), str(dataset), "--limit", "100000"]
        if tool.endswith("diff")
        else [str(dataset)]
    )
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the tool writes its first line
    done = subprocess.run(
        [sys.executable, "-m", tool, *args],
        cwd=REPO,
        env=process_env(),
        stdout=write,
        stderr=subprocess.PIPE,
        timeout=120,
    )
    os.close(write)
    assert done.returncode == BROKEN_PIPE, done.stderr.decode()
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr
