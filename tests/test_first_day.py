"""The newcomer's path, as the README's "Your own images" gives it, on a folder of one's own: a
few percent of junk publishes by default; more is refused with the command that publishes it
anyway, which works; then verify, inspect and reading with ``tfrecord_io.make_dataset``. Every
command runs as a user's would (a fresh process, no ``TF_CPP_MIN_LOG_LEVEL``) and prints no
TensorFlow start-up line and no warning."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from beam_pipelines import images_to_tfrecord
from beam_pipelines.images_to_tfrecord import publish_anyway_command, publish_anyway_fraction
from cliflags import suggest_flag
from tests.fixtures.images import make_bad_files, make_image_tree
from tests.fixtures.processes import REPO, LoggedProcess

# What TensorFlow's libraries and Python print when nobody keeps them quiet.
NOISE = re.compile(
    r"absl::InitializeLog|oneDNN|cpu_feature_guard|^[IWE]\d{4} |Warning|WARNING|"
    r"default buffer size|Traceback",
    re.M,
)


def _user_env() -> dict[str, str]:
    """A user's shell after ``source .venv/bin/activate``: no log level of ours."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def _command(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=REPO,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    noise = NOISE.findall(done.stderr + done.stdout)
    assert not noise, f"{argv}: {noise}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    """66 photos in 3 classes (names with a space and a non-Latin letter) and 2 junk files:
    2 of 68 (2.9 %), what a folder of one's own holds."""
    root = tmp_path_factory.mktemp("first_day") / "photos"
    make_image_tree(root, {"cat": 22, "dög": 22, "red fox": 22}, size=(64, 48))
    bad = make_bad_files((64, 48))
    (root / "cat" / "notes.jpg").write_bytes(bad["not_an_image_text"])
    (root / "red fox" / "download.jpg").write_bytes(bad["truncated"])
    return root


@pytest.mark.slow
def test_a_folder_of_ones_own_publishes_then_verifies_inspects_and_reads(photos, tmp_path):
    out = tmp_path / "out" / "photos"
    done = _command(
        "-m", "beam_pipelines.images_to_tfrecord", "--input", str(photos), "--output", str(out),
        "--validation_fraction", "0.1", "--stratify_validation", "--progress", "off",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "68 inputs" in done.stdout and "66 written, 2 rejected" in done.stdout
    assert "bad fraction 2.94% (limit 5.00%)" in done.stdout
    assert f"published: {out / 'dataset.json'}" in done.stdout

    verified = _command("-m", "dataset_tools.verify", str(out), "--deep")
    assert verified.returncode == 0 and "OK: 2/2 shards sound" in verified.stdout, verified.stdout
    report = tmp_path / "report"
    inspected = _command("-m", "dataset_tools.inspect", str(out), "--out", str(report))
    assert inspected.returncode == 0 and (report / "index.html").exists(), inspected.stdout

    read = _command(
        "-c",
        "import tfrecord_io\n"
        f"ds = tfrecord_io.make_dataset({str(out)!r}, 'validation', global_batch_size=4,"
        " training=False)\n"
        "print(sum(int(images.shape[0]) for images, labels in ds))\n",
    )
    manifest = json.loads((out / "dataset.json").read_text())
    expected = manifest["splits"]["validation"]["num_examples"]
    assert read.stdout.split() == [str(expected)], read.stdout + read.stderr

    # A short training run on it, as "Your own images" gives it (fewer steps, so no warm-up:
    # the trainer warns of a warm-up as long as the run), quiet as well.
    run = tmp_path / "runs" / "photos"
    trained = _command(
        "-m", "trainer.train", "--data", str(out), "--model_dir", str(run), "--steps", "3",
        "--global_batch_size", "8", "--warmup_steps", "0", timeout=300,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert "done at step 3" in trained.stderr, trained.stderr
    assert list((run / "checkpoints").glob("ckpt-3.index")), trained.stderr


@pytest.mark.slow
def test_a_refusal_prints_the_command_that_publishes_and_that_command_does(
    photos, tmp_path, capsys, caplog
):
    images = tmp_path / "photos"
    make_image_tree(images, {"cat": 10, "dog": 9}, size=(64, 48))
    (images / "cat" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (images / "dog" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (images / "dog" / "empty.jpg").write_bytes(b"")  # 1 of 20: 5 % is at the limit...
    (images / "dog" / "page.jpg").write_bytes(make_bad_files()["not_an_image"])  # ...10 % not
    output = tmp_path / "out"
    argv = ["--input", str(images), "--output", str(output), "--num_shards", "1"]
    assert images_to_tfrecord.main([*argv, "--progress", "off"]) == 1
    out = capsys.readouterr().out
    assert "NOT published: bad fraction 9.52% is above --max_bad_fraction 0.05" in out
    assert "empty_file 1, not_an_image 1" in out
    assert f"each file and why: {output / 'rejected.jsonl'}" in out
    # Which folders the skipped files were in, not two bare ".DS_Store".
    assert "(not inputs): cat/.DS_Store, dog/.DS_Store\n" in out
    command = out.rsplit("\n", 2)[-2].strip()
    assert command.endswith("--resume --max_bad_fraction 0.1"), out
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "beam_pipelines.images_to_tfrecord"]
    caplog.set_level(logging.INFO, logger="beam_pipelines.builds.resume")
    assert images_to_tfrecord.main(words[3:]) == 0
    assert (output / "dataset.json").exists()
    # What --resume takes over is information in words, and the summary says what it reused.
    taken = [r for r in caplog.records if r.name == "beam_pipelines.builds.resume"]
    assert [(r.levelname, r.getMessage()) for r in taken] == [
        ("INFO", "--resume: plan of 1 train shard; 1 shard to check, 1 staged file to reuse"),
    ]  # fmt: skip
    resumed = capsys.readouterr().out
    assert "--resume: reused 19 prepared images from staging (not read or decoded again), " \
        "prepared 0\n" in resumed, resumed  # fmt: skip


@pytest.mark.slow
def test_a_folder_without_class_folders_is_not_published_and_says_what_to_do(tmp_path, capsys):
    flat = tmp_path / "photos" / "cats"
    make_image_tree(flat, {"cat": 4}, size=(32, 24))
    for path in (flat / "cat").iterdir():
        path.rename(flat / path.name)  # the images right in --input, as a camera leaves them
    (flat / "cat").rmdir()
    output = tmp_path / "out" / "flat"
    argv = ["--input", str(flat), "--output", str(output), "--num_shards", "1", "--progress", "off"]
    assert images_to_tfrecord.main(argv) == 1
    out = capsys.readouterr().out
    assert (
        f"NOT published: no class folders under --input {flat} (4 files directly in it): put "
        "each class's images in a folder of its own, --input DIR/<class>/<file>; or give a "
        ".csv/.jsonl listing of uri,label\n"
    ) in out + "\n", out
    assert "published: " not in out.replace("NOT published: ", "")
    assert not (output / "dataset.json").exists()
    # A folder whose every image is rejected is not published either, and says why.
    for path in flat.iterdir():
        path.write_bytes(b"")
    (flat / "cat").mkdir()
    (flat / "cat" / "a.jpg").write_bytes(b"not a JPEG")
    assert images_to_tfrecord.main([*argv, "--overwrite"]) == 1
    out = capsys.readouterr().out
    assert "NOT published: no example to write: all 5 inputs were rejected (no_label 4, " in out
    assert "--max_bad_fraction" not in out.split("NOT published")[1]  # no "publish anyway"
    assert not (output / "dataset.json").exists()


def test_publish_anyway_names_the_fraction_rounded_up_and_drops_earlier_limits():
    assert publish_anyway_fraction(0.0275) == 0.03
    assert publish_anyway_fraction(0.03) == 0.03
    assert publish_anyway_fraction(0.0301) == 0.04
    assert publish_anyway_fraction(1.0) == 1.0
    command = publish_anyway_command(
        ["--input", "my photos", "--max_bad_fraction", "0.01", "--max_bad_fraction=0", "--resume"],
        0.03,
    )
    assert command.endswith(" --input 'my photos' --resume --max_bad_fraction 0.03")


def test_a_near_miss_of_our_flag_is_suggested_before_beams():
    known = {"--stratify_validation", "--streaming", "--runner", "--direct_num_workers"}
    own = {"--stratify_validation"}
    assert suggest_flag("--stratify", known, first=own) == "--stratify_validation"
    assert suggest_flag("--direct_num", known, first=own) == "--direct_num_workers"
    assert suggest_flag("--runer", known, first=own) == "--runner"


@pytest.fixture(scope="module")
def versions(photos, tmp_path_factory) -> Path:
    """A versions root holding one published version, ``latest`` pointing at it."""
    root = tmp_path_factory.mktemp("first_day") / "versions"
    out = root / "v0001"
    assert images_to_tfrecord.run(
        ["--input", str(photos), "--output", str(out), "--num_shards", "1", "--progress", "off"]
    ).published
    (root / "latest").write_text("v0001\n")
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "dataset_tools.diff", "{out}", "{out}"],
        ["-m", "dataset_tools.verify", "{out}"],
        ["-m", "beam_pipelines.versions", "{root}"],
        ["-m", "dataset_tools.adopt", "{out}/train-*.tfrecord", "--output", "{adopted}"],
        ["-m", "beam_pipelines.samples", "--output", "{samples}", "--per_class", "3"],
    ],
    ids=["diff", "verify", "versions", "adopt", "samples"],
)
def test_every_tool_is_quiet_on_a_clean_run(versions, tmp_path, argv):
    out = versions / "v0001"
    values = {"out": str(out), "root": str(versions), "adopted": str(tmp_path / "adopted")}
    values["samples"] = str(tmp_path / "samples")
    done = _command(*(arg.format(**values) for arg in argv))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_the_tf_data_service_is_quiet_and_stops_cleanly(tmp_path):
    # Its log holds its own lines only: no TensorFlow start-up line, no warning.
    dispatcher = LoggedProcess(
        [sys.executable, "-m", "tfrecord_io.service", "dispatcher", "--port", "0"],
        env=_user_env(),
        name="dispatcher",
    )
    dispatcher.wait_for(r"tf\.data service dispatcher: 0 worker\(s\) registered", timeout=120)
    dispatcher.send_signal(signal.SIGTERM)
    assert dispatcher.finish() == 143, dispatcher.log  # 128 + SIGTERM, after a clean stop
    assert "stopped cleanly after SIGTERM" in dispatcher.log, dispatcher.log
    assert not NOISE.findall(dispatcher.log), dispatcher.log


@pytest.mark.slow
def test_verify_on_a_versions_folder_says_which_version_it_checked(versions):
    done = _command("-m", "dataset_tools.verify", str(versions))
    assert done.returncode == 0, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first == f"checked {versions / 'v0001'}: the version {versions / 'latest'} names"


def _split_of_each_example(dataset: Path) -> dict[str, str]:
    """``{key: split}`` from the dataset's catalogs."""
    where: dict[str, str] = {}
    for catalog in dataset.glob("catalog-*.parquet"):
        table = pq.read_table(catalog, columns=["key", "split"]).to_pydict()
        where.update(zip(table["key"], table["split"], strict=True))
    return where


def _validation_per_class(dataset: Path) -> dict[str, int]:
    return json.loads((dataset / "dataset.json").read_text())["splits"]["validation"][
        "class_counts"
    ]


@pytest.mark.parametrize(
    "stratify",
    [pytest.param([], id="plain"),
     pytest.param(["--stratify_validation"], id="stratified", marks=pytest.mark.slow)],
)  # fmt: skip
def test_adding_and_removing_images_moves_no_example_between_splits(tmp_path, stratify):
    images = tmp_path / "images"
    written = make_image_tree(images, {"cat": 12, "dog": 12}, size=(64, 48))
    flags = ["--num_shards", "1", "--validation_fraction", "0.25", "--progress", "off"]
    first = tmp_path / "v0001"
    assert images_to_tfrecord.run(
        ["--input", str(images), "--output", str(first), *flags, *stratify]
    ).published
    before = _split_of_each_example(first)
    assert set(before.values()) == {"train", "validation"}
    if stratify:  # quota k = min(floor(0.25 * 12 + 1/2), 11) = 3 a class
        assert _validation_per_class(first) == {"cat": 3, "dog": 3}
    # A new version: images added to one class and one removed from the other.
    added = make_image_tree(tmp_path / "new", {"cat": 4}, size=(64, 48), seed=99)
    for i, path in enumerate(added["cat"]):
        path.rename(images / "cat" / f"new {i}.jpg")
    removed = hashlib.sha256(written["dog"][0].read_bytes()).hexdigest()
    written["dog"][0].unlink()
    second = tmp_path / "v0002"
    summary = images_to_tfrecord.run(
        ["--input", str(images), "--output", str(second), "--base", str(first), *flags, *stratify]
    )
    assert summary.published
    assert "--base: reused 23 examples from the base" in summary.describe()
    assert "prepared 4" in summary.describe()
    after = _split_of_each_example(second)
    assert len(after) == len(before) + 4 - 1
    moved = {key for key in set(before) & set(after) if before[key] != after[key]}
    assert not moved
    rule = json.loads((second / "dataset.json").read_text())["options"]["split_rule"]
    assert rule == ("class_quota_keeping_base" if stratify else "split_value")
    if stratify:
        # cat grew to 16 (quota 4): its gap of 1 is filled by the new cat of the smallest
        # split value. dog shrank to 11 (quota 3): it keeps the validation examples it had
        # left, and has no new example to fill a gap with.
        new = sorted(
            (int(key[16:32], 16), key) for key in set(after) - set(before)
        )  # bits 64-127: the split value's order
        assert [after[key] for _, key in new] == ["validation", "train", "train", "train"]
        dog_left = 3 - (before[removed] == "validation")
        assert _validation_per_class(second) == {"cat": 4, "dog": dog_left}


def test_the_trainer_calls_an_empty_train_split_empty_not_a_batch_size_problem(tmp_path):
    from trainer.config import DataConfig
    from trainer.inputs import ReaderInputs

    make_image_tree(tmp_path / "images", {"a": 3, "b": 3}, size=(16, 16))
    output = tmp_path / "dataset"
    assert images_to_tfrecord.run(
        ["--input", str(tmp_path / "images"), "--output", str(output), "--image_size", "16",
         "--validation_fraction", "0.3", "--progress", "off"]
    ).published  # fmt: skip
    # A dataset.json whose train split holds nothing, as pipelines before the empty-build gate
    # published: its counts made consistent, so only the trainer's check can refuse it.
    manifest = json.loads((output / "dataset.json").read_text())
    kept = manifest["splits"]["validation"]["num_examples"]
    manifest["splits"]["train"].update(num_examples=0, class_counts={"a": 0, "b": 0})
    manifest["counts"].update(input=kept, written=kept)
    (output / "dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError) as refused:
        ReaderInputs.from_config(DataConfig(source=str(output)), global_batch_size=256, seed=0)
    assert str(refused.value).startswith(f"split 'train' of {str(output)!r} is empty (0 examples)")
    assert "--global_batch_size" not in str(refused.value)
