"""verify_dataset and ``python -m dataset_tools.verify``: every check, and the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from dataset_tools.verify import VerifyReport, verify_dataset
from dataset_tools.verify.__main__ import main
from schemas import MANIFEST_NAME, ImageRecord, serialize_record
from tests.fixtures.shards import WrittenDataset, copy_dataset, to_inline_layout


def _only_failure(report: VerifyReport, shard_file: str) -> list[str]:
    assert not report.ok
    failed = {s.file: s.problems for s in report.shards if not s.ok}
    assert list(failed) == [shard_file], failed
    return failed[shard_file]


def test_sound_dataset_passes_deep(jpeg_dataset: WrittenDataset) -> None:
    report = verify_dataset(jpeg_dataset.root, deep=True)
    assert report.ok, report.to_dict()
    assert sum(s.num_records for s in report.shards) == 34
    assert all(s.present and s.sha256 == s.expected_sha256 for s in report.shards)


def test_raw_dataset_passes(raw_dataset: WrittenDataset) -> None:
    assert verify_dataset(raw_dataset.root / MANIFEST_NAME, deep=True).ok


def test_flipped_byte_is_caught_naming_the_shard(
    jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard = dataset.shard_paths("train")[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    problems = _only_failure(verify_dataset(dataset.root), shard.name)
    assert any("SHA-256" in p for p in problems)
    assert any("damaged" in p and "CRC" in p for p in problems)
    assert any("readable records, dataset.json says" in p for p in problems)


def test_missing_shard_is_caught(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard = dataset.shard_paths("validation")[0]
    shard.unlink()
    problems = _only_failure(verify_dataset(dataset.root), shard.name)
    assert problems == [f"missing: {shard} does not exist"]


def test_wrong_count_is_caught(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    """A manifest whose count disagrees with a shard that is otherwise intact (same bytes)."""
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    to_inline_layout(dataset.root)  # shard entries edited as JSON
    data = json.loads((dataset.root / MANIFEST_NAME).read_text())
    shards = data["splits"]["train"]["shards"]
    shards[0]["num_examples"] += 1
    shards[1]["num_examples"] -= 1
    (dataset.root / MANIFEST_NAME).write_text(json.dumps(data))
    report = verify_dataset(dataset.root)
    failed = {s.file: s.problems for s in report.shards if not s.ok}
    assert set(failed) == {shards[0]["file"], shards[1]["file"]}
    assert all(
        len(p) == 1 and "readable records, dataset.json says" in p[0] for p in failed.values()
    )


def test_record_breaking_the_schema_is_caught(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    """A shard with valid framing and hash in the manifest, but a record missing a key and a
    record whose label names another class."""
    import hashlib

    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard = dataset.shard_paths("validation")[0]
    good = dataset.records["validation"][0]
    example = tf.train.Example()
    example.features.feature["image/encoded"].bytes_list.value.append(good.encoded)
    mislabelled = ImageRecord(**{**good.__dict__, "text": "not-a-class"})
    count = dataset.manifest.split("validation").shards[0].num_examples
    with tf.io.TFRecordWriter(str(shard)) as writer:
        writer.write(example.SerializeToString())
        writer.write(serialize_record(mislabelled))
        for record in dataset.records["validation"][2:count]:
            writer.write(serialize_record(record))
    to_inline_layout(dataset.root)  # shard entries edited as JSON
    data = json.loads((dataset.root / MANIFEST_NAME).read_text())
    entry = data["splits"]["validation"]["shards"][0]
    entry["num_bytes"] = shard.stat().st_size
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (dataset.root / MANIFEST_NAME).write_text(json.dumps(data))
    problems = _only_failure(verify_dataset(dataset.root), shard.name)
    assert any("record 0: does not parse against the schema" in p for p in problems)
    assert any("record 1: class text 'not-a-class'" in p for p in problems)


def test_deep_decodes_images(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    """A JPEG whose bytes are broken inside a record that is otherwise well framed."""
    import hashlib

    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard = dataset.shard_paths("validation")[1]
    count = dataset.manifest.split("validation").shards[1].num_examples
    first = dataset.manifest.split("validation").shards[0].num_examples
    records = list(dataset.records["validation"][first : first + count])
    broken = records[0].encoded[:40] + b"\x00" * 20
    records[0] = ImageRecord(**{**records[0].__dict__, "encoded": broken})
    with tf.io.TFRecordWriter(str(shard)) as writer:
        for record in records:
            writer.write(serialize_record(record))
    to_inline_layout(dataset.root)  # shard entries edited as JSON
    data = json.loads((dataset.root / MANIFEST_NAME).read_text())
    entry = data["splits"]["validation"]["shards"][1]
    entry["num_bytes"] = shard.stat().st_size
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (dataset.root / MANIFEST_NAME).write_text(json.dumps(data))
    assert verify_dataset(dataset.root).ok  # shallow: framing, hash and schema all hold
    problems = _only_failure(verify_dataset(dataset.root, deep=True), shard.name)
    assert any(p.startswith("record 0: JPEG image does not decode") for p in problems)


def test_main_exit_codes_and_json(
    jpeg_dataset: WrittenDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(jpeg_dataset.root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["num_records"] == 34 and report["num_failed_shards"] == 0

    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    victim = dataset.shard_paths("train")[3]
    victim.write_bytes(victim.read_bytes()[:-5])
    assert main([str(dataset.root)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {victim.name}" in out and out.strip().splitlines()[-1].startswith("FAILED")
    assert main([str(dataset.root), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [s["file"] for s in report["shards"] if not s["ok"]] == [victim.name]

    assert main([str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_runs_as_a_module(jpeg_dataset: WrittenDataset) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dataset_tools.verify", str(jpeg_dataset.root), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["ok"] is True
