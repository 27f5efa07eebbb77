"""End-to-end runs of the images -> TFRecord pipeline through its real entry point.

One module-scoped run over a tree holding every odd-but-valid format, every bad input, a
duplicate and an EXIF-rotated photo is shared by the checks below; further runs check
determinism (a second run through the CLI, and the multi-process runner), overwrite, the
bad-fraction threshold and listings.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from beam_pipelines import images_to_tfrecord
from beam_pipelines.output.publish import OutputExistsError
from schemas.image_example import record_from_example
from schemas.manifest import Manifest
from tests.fixtures.images import (
    exif_rotated_jpeg,
    large_photo_jpeg,
    make_bad_files,
    make_format_samples,
    make_image_tree,
)
from tfrecord_io.source import load_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CLASSES = {"cat": 3, "dög": 3, "red fox": 3}
ODD_FORMATS = make_format_samples((40, 32))
BAD_FILES = make_bad_files((40, 32))
BASE_FLAGS = ["--image_size", "24", "--validation_fraction", "0.3", "--num_shards", "2"]


def _build_tree(root: Path) -> dict[str, object]:
    make_image_tree(root, CLASSES, size=(40, 32))
    for name, data in ODD_FORMATS.items():
        extension = ".JPEG" if name == "png_named_jpeg" else ".img"
        (root / "cat" / f"odd_{name}{extension}").write_bytes(data)
    for name, data in BAD_FILES.items():
        (root / "dög" / f"bad_{name}.jpg").write_bytes(data)
    (root / "red fox" / "rotated.jpg").write_bytes(exif_rotated_jpeg((64, 32), orientation=6))
    (root / "red fox" / "phone.jpg").write_bytes(large_photo_jpeg((4000, 3000)))
    shutil.copy(root / "cat" / "cat_0001.jpg", root / "red fox" / "zz_copy_of_cat_0001.jpg")
    (root / "stray.txt").write_text("a file outside any class directory\n")
    # Left by file managers: skipped, never inputs.
    for hidden in (".DS_Store", "cat/.DS_Store", "__MACOSX/cat/._cat_0001.jpg", "dög/Thumbs.db"):
        (root / hidden).parent.mkdir(parents=True, exist_ok=True)
        (root / hidden).write_bytes(b"\0\0junk")
    good = 9 + len(ODD_FORMATS) + 2
    return {"good": good, "bad": len(BAD_FILES) + 1, "duplicates": 1, "skipped": 4}


def _run(input_dir: Path, output: Path, *extra: str):
    return images_to_tfrecord.run(
        ["--input", str(input_dir), "--output", str(output), *BASE_FLAGS, *extra]
    )


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    images = root / "images"
    expected = _build_tree(images)
    output = root / "dataset"
    # Three image threads, whatever this machine's cores: reading and preparing ahead of the
    # bundle's thread (test_one_image_thread_builds_the_same_dataset runs them one at a time).
    summary = _run(images, output, "--max_bad_fraction", "0.5", "--image_threads", "3")
    return {"images": images, "output": output, "summary": summary, "expected": expected}


def _records(output: Path, manifest: Manifest):
    for shard in manifest.all_shards():
        for raw in tf.data.TFRecordDataset(str(output / shard.file)):
            yield shard, record_from_example(bytes(raw.numpy()))


def test_counts_add_up_and_the_dataset_is_published(e2e):
    summary, expected = e2e["summary"], e2e["expected"]
    manifest = load_manifest(e2e["output"])
    assert summary.published and manifest == summary.manifest
    counts = manifest.counts
    assert counts.written == expected["good"]
    assert counts.rejected == expected["bad"]
    assert counts.duplicates == expected["duplicates"]
    assert counts.skipped == expected["skipped"]
    assert counts.input == counts.written + counts.rejected + counts.duplicates
    # The stray file is reported (no_label) but is not bad image data: the gate leaves it out.
    assert summary.bad_fraction == (counts.rejected - 1) / (counts.input - 1)
    assert manifest.label_names == ("cat", "dög", "red fox")
    assert set(manifest.splits) == {"train", "validation"}
    assert [s.file for s in manifest.split("train").shards] == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert manifest.options["image_size"] == 24 and "runner" not in manifest.options
    assert summary.metrics["images_written"] == counts.written
    assert summary.metrics["rejected_truncated"] == 2


def test_class_counts_per_split_add_up(e2e):
    manifest = e2e["summary"].manifest
    for split in manifest.splits.values():
        assert list(split.class_counts) == list(manifest.label_names)
        assert sum(split.class_counts.values()) == split.num_examples
    totals = {
        name: sum(s.class_counts[name] for s in manifest.splits.values())
        for name in manifest.label_names
    }
    assert totals == {"cat": 3 + len(ODD_FORMATS), "dög": 3, "red fox": 5}
    labels: dict[str, dict[str, int]] = {}
    for shard, record in _records(e2e["output"], manifest):
        split = labels.setdefault(shard.file.split("-")[0], {})
        split[record.text] = split.get(record.text, 0) + 1
    assert labels == {
        name: {k: v for k, v in s.class_counts.items() if v} for name, s in manifest.splits.items()
    }


def test_every_shard_matches_its_manifest_entry_and_is_sorted(e2e):
    output, manifest = e2e["output"], e2e["summary"].manifest
    for shard in manifest.all_shards():
        data = (output / shard.file).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (shard.num_bytes, shard.sha256)
        keys = [
            record_from_example(bytes(r.numpy())).sha256
            for r in tf.data.TFRecordDataset(str(output / shard.file))
        ]
        assert len(keys) == shard.num_examples
        assert keys == sorted(keys)
        # The writer frames records without TensorFlow; TensorFlow's writer gives the same bytes.
        again = output.parent / f"rewritten-{shard.file}"
        with tf.io.TFRecordWriter(str(again)) as writer:
            for record in tf.data.TFRecordDataset(str(output / shard.file)):
                writer.write(record.numpy())
        assert again.read_bytes() == data
        again.unlink()
    assert not [p for p in output.iterdir() if ".tmp-" in p.name or p.name.startswith(".staged")]


def test_every_good_file_is_written_once_with_its_label(e2e):
    images, manifest = e2e["images"], e2e["summary"].manifest
    records = {r.filename: r for _, r in _records(e2e["output"], manifest)}
    assert str(images / "red fox" / "zz_copy_of_cat_0001.jpg") not in records
    for name in ODD_FORMATS:
        extension = ".JPEG" if name == "png_named_jpeg" else ".img"
        record = records[str(images / "cat" / f"odd_{name}{extension}")]
        assert (record.label, record.text, record.format, record.channels) == (0, "cat", "JPEG", 3)
        assert min(record.height, record.width) == 24
    for path in (images / "red fox").glob("red fox_*.jpg"):
        assert records[str(path)].label == 2
    for path, record in records.items():
        assert record.sha256 == hashlib.sha256(Path(path).read_bytes()).hexdigest()
        decoded = Image.open(io.BytesIO(record.encoded))
        assert decoded.size == (record.width, record.height)


def test_exif_rotated_and_large_photos(e2e):
    images, manifest = e2e["images"], e2e["summary"].manifest
    records = {r.filename: r for _, r in _records(e2e["output"], manifest)}
    rotated = records[str(images / "red fox" / "rotated.jpg")]
    assert (rotated.width, rotated.height) == (24, 48)  # stored 64x32, displayed 32x64
    pixels = np.asarray(Image.open(io.BytesIO(rotated.encoded))).astype(int)
    assert pixels[:20].mean(axis=(0, 1))[0] > 180 and pixels[28:].mean(axis=(0, 1))[2] > 180
    phone = records[str(images / "red fox" / "phone.jpg")]
    assert (phone.width, phone.height) == (32, 24)
    assert e2e["summary"].metrics["jpeg_dct_downscaled"] >= 1


def test_rejected_report_lists_every_bad_input_sorted(e2e):
    images = e2e["images"]
    lines = (e2e["output"] / "rejected.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["uri"] for r in rows] == sorted(r["uri"] for r in rows)
    got = {r["uri"]: r["reason"] for r in rows}
    expected = {str(images / "dög" / f"bad_{name}.jpg"): name for name in BAD_FILES}
    expected = {
        uri: reason.replace("_text", "").replace("_png", "") for uri, reason in expected.items()
    }
    expected[str(images / "stray.txt")] = "no_label"
    assert got == expected
    assert all(r["detail"] for r in rows)
    duplicates = [
        json.loads(line)
        for line in (e2e["output"] / "duplicates.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert duplicates == [
        {
            "uri": str(images / "red fox" / "zz_copy_of_cat_0001.jpg"),
            "label": "red fox",
            "kept_uri": str(images / "cat" / "cat_0001.jpg"),
            "kept_label": "cat",
            "label_conflict": True,
            "sha256": hashlib.sha256((images / "cat" / "cat_0001.jpg").read_bytes()).hexdigest(),
        }
    ]
    (conflict,) = e2e["summary"].label_conflicts
    assert conflict["copies"] == [
        [str(images / "cat" / "cat_0001.jpg"), "cat"],
        [str(images / "red fox" / "zz_copy_of_cat_0001.jpg"), "red fox"],
    ]


def test_second_run_on_the_multi_process_runner_through_the_cli_is_byte_identical(e2e, tmp_path):
    # A second run, through the real command line, on the other runner: two workers.
    output = tmp_path / "again"
    command = [
        sys.executable,
        "-m",
        "beam_pipelines.images_to_tfrecord",
        "--input",
        str(e2e["images"]),
        "--output",
        str(output),
        *BASE_FLAGS,
        "--max_bad_fraction",
        "0.5",
        "--direct_num_workers=2",
        "--direct_running_mode=multi_processing",
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "25 written" in done.stdout  # gathered from both workers
    assert f"published: {output / 'dataset.json'}" in done.stdout
    assert str(output / "train-00000-of-00002.tfrecord") in done.stdout
    assert "Discarding unparseable args" not in done.stderr
    assert _snapshot(output) == _snapshot(e2e["output"])


def test_one_image_thread_builds_the_same_dataset(e2e, tmp_path):
    # Every bad input, the duplicate, the odd formats (some through the decode worker): the
    # threads' results are taken in input order, so the serial run stages, counts and
    # publishes the same.
    output = tmp_path / "serial"
    summary = _run(e2e["images"], output, "--max_bad_fraction", "0.5", "--image_threads", "1")
    assert _snapshot(output) == _snapshot(e2e["output"])
    assert summary.metrics == e2e["summary"].metrics


def test_a_pipeline_run_never_imports_tensorflow(e2e, tmp_path):
    # In-process, every step runs in this child: TensorFlow costs each worker seconds of CPU.
    code = (
        "import sys\n"
        "from beam_pipelines import images_to_tfrecord\n"
        f"argv = ['--input', {str(e2e['images'])!r}, '--output', {str(tmp_path / 'out')!r},\n"
        f"        *{BASE_FLAGS!r}, '--max_bad_fraction', '0.5']\n"
        "assert images_to_tfrecord.run(argv).published\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert _snapshot(tmp_path / "out") == _snapshot(e2e["output"])


def test_existing_dataset_is_refused_and_nothing_changes(e2e):
    output = e2e["output"]
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in output.iterdir()}
    with pytest.raises(OutputExistsError, match="--overwrite"):
        _run(e2e["images"], output, "--max_bad_fraction", "0.5")
    status = images_to_tfrecord.main(
        ["--input", str(e2e["images"]), "--output", str(output), *BASE_FLAGS]
    )
    assert status == 2
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in output.iterdir()}
    assert after == before


def test_overwrite_replaces_the_dataset_and_removes_stale_shards(tmp_path):
    images = tmp_path / "images"
    make_image_tree(images, {"a": 3, "b": 3}, size=(32, 32))
    output = tmp_path / "dataset"
    first = _run(images, output, "--num_shards", "3", "--validation_fraction", "0")
    assert len(first.manifest.all_shards()) == 3
    (output / "train-00007-of-00009.tfrecord").write_bytes(b"left by an unpublished run")
    (output / "train-00007-of-00009.idx").write_bytes(b"0 20\n")
    (output / "notes.txt").write_text("user file")
    second = _run(images, output, "--num_shards", "2", "--overwrite", "--image_size", "16")
    assert second.published
    names = sorted(p.name for p in output.iterdir())
    assert names == sorted(
        ["dataset.json", "duplicates.jsonl", "near_duplicates.jsonl", "notes.txt", "rejected.jsonl"]
        + ["dataset_info.json", "features.json", "image.class.label.labels.txt"]  # for tfds
        + [split.catalog.file for split in second.manifest.splits.values()]
        + [f"shards-{name}.parquet" for name in second.manifest.splits]  # shard tables
        + [s.file for s in second.manifest.all_shards()]
        + [s.index.file for s in second.manifest.all_shards()]
    )
    manifest = load_manifest(output)
    assert manifest.image.image_size == 16
    assert {s.file for s in manifest.all_shards()}.isdisjoint(
        {s.file for s in first.manifest.all_shards()}
    )


def test_bad_fraction_above_the_limit_writes_the_report_but_does_not_publish(tmp_path, capsys):
    images = tmp_path / "images"
    make_image_tree(images, {"a": 4}, size=(32, 32))
    (images / "a" / "empty.jpg").write_bytes(b"")
    output = tmp_path / "dataset"
    status = images_to_tfrecord.main(
        ["--input", str(images), "--output", str(output), "--max_bad_fraction", "0.1"]
    )
    assert status == 1
    assert not (output / "dataset.json").exists()
    rows = [json.loads(x) for x in (output / "rejected.jsonl").read_text().splitlines()]
    assert [(Path(r["uri"]).name, r["reason"]) for r in rows] == [("empty.jpg", "empty_file")]
    out = capsys.readouterr().out
    assert "NOT published: bad fraction 20.00% is above --max_bad_fraction 0.1" in out
    # At the limit (1 of 5 = 0.2) the same input publishes.
    assert (
        images_to_tfrecord.main(
            ["--input", str(images), "--output", str(output), "--max_bad_fraction", "0.2"]
        )
        == 0
    )
    assert (output / "dataset.json").exists()


def test_label_conflicts_fail_refuses_to_publish_and_drop_both_drops_every_copy(tmp_path, capsys):
    images = tmp_path / "images"
    written = make_image_tree(images, {"a": 4, "b": 4}, size=(32, 32))
    shutil.copy(written["a"][0], images / "b" / "conflict.jpg")
    output = tmp_path / "dataset"
    flags = ["--input", str(images), "--output", str(output), "--num_shards", "1"]
    assert images_to_tfrecord.main([*flags, "--label_conflicts", "fail"]) == 1
    out = capsys.readouterr().out
    assert "NOT published: label conflicts (1) and --label_conflicts fail" in out
    assert f"{written['a'][0]} (a) = {images / 'b' / 'conflict.jpg'} (b)" in out
    assert not (output / "dataset.json").exists()

    summary = images_to_tfrecord.run(
        [*flags, "--label_conflicts", "drop_both"]
        + ["--validation_fraction", "0.5", "--stratify_validation"]
    )
    assert summary.published
    counts = summary.manifest.counts
    assert (counts.input, counts.written, counts.duplicates) == (9, 7, 2)
    # a keeps 3 examples, b 4 (the dropped conflict counts in neither): quotas
    # min(floor(0.5 * n + 1/2), n - 1) = 2 and 2.
    assert summary.manifest.split("validation").class_counts == {"a": 2, "b": 2}
    assert summary.manifest.split("train").class_counts == {"a": 1, "b": 2}
    lines = [json.loads(x) for x in (output / "duplicates.jsonl").read_text().splitlines()]
    assert [(Path(d["uri"]).name, d["kept_uri"], d["label_conflict"]) for d in lines] == [
        (written["a"][0].name, None, True),
        ("conflict.jpg", None, True),
    ]


def test_csv_listing_with_raw_center_crop(tmp_path):
    images = tmp_path / "pool"
    written = make_image_tree(images, {"x": 2, "y": 2}, size=(40, 30))
    listing = tmp_path / "listing.csv"
    rows = ["uri,label"]
    rows += [
        f"{p.relative_to(tmp_path)},{'grand chat' if n == 'x' else 'chien'}"
        for n, ps in written.items()
        for p in ps
    ]
    rows.append("pool/missing.jpg,chien")
    listing.write_text("\n".join(rows) + "\n", encoding="utf-8")
    output = tmp_path / "dataset"
    summary = images_to_tfrecord.run(
        [
            "--input", str(listing), "--output", str(output), "--image_size", "16",
            "--crop", "center", "--encoding", "raw", "--max_bad_fraction", "0.25",
        ]
    )  # fmt: skip
    assert summary.published
    manifest = summary.manifest
    assert manifest.label_names == ("chien", "grand chat")
    assert (manifest.counts.written, manifest.counts.rejected) == (4, 1)
    assert summary.rejected_by_reason == {"unreadable": 1}
    rejected = json.loads((output / "rejected.jsonl").read_text(encoding="utf-8"))
    assert rejected["uri"] == str(tmp_path / "pool" / "missing.jpg")
    assert "cannot read" in rejected["detail"]
    records = [r for _, r in _records(output, manifest)]
    assert {(r.format, r.height, r.width, len(r.encoded)) for r in records} == {
        ("RAW", 16, 16, 768)
    }
    assert {r.text for r in records if r.label == 1} == {"grand chat"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--output", "OUT"], "both --input and --output are required"),
        (["--input", "IN/missing", "--output", "OUT"], "--input 'IN/missing' does not exist"),
        (["--input", "IN/empty", "--output", "OUT"], "--input 'IN/empty' holds no files"),
        (["--input", "IN", "--output", "IN/dataset"], "must not be inside --input"),
        (["--input", "IN", "--output", "OUT", "--encoding", "raw"], "requires crop 'center'"),
        (
            ["--input", "IN", "--output", "OUT", "--validation_fraction", "1.5"],
            "validation_fraction",
        ),
        (["--input", "IN", "--output", "OUT", "--background", "white"], "'#ffffff'"),
        (["--input", "IN", "--output", "OUT", "--image_threads", "-1"], "--image_threads"),
    ],
)
def test_bad_flags_are_reported_before_anything_runs(tmp_path, capsys, flags, message):
    (tmp_path / "IN" / "a").mkdir(parents=True)
    (tmp_path / "IN" / "a" / "x.jpg").write_bytes(b"")
    (tmp_path / "IN" / "empty").mkdir()
    flags = [
        f.replace("IN", str(tmp_path / "IN")).replace("OUT", str(tmp_path / "OUT")) for f in flags
    ]
    assert images_to_tfrecord.main(flags) == 2
    err = capsys.readouterr().err
    assert message.replace("IN", str(tmp_path / "IN")) in err
    assert not (tmp_path / "OUT").exists()
