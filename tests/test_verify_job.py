"""``verify`` as a Beam job: the same report as the local command, on the in-process runner and
on a Dask cluster, with a damaged shard named."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from dataset_tools.verify import verify_dataset
from dataset_tools.verify.job import main, run_verify_job
from schemas import MANIFEST_NAME
from tests.fixtures.shards import WrittenDataset, copy_dataset, to_inline_layout


def _flip_a_byte(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def _same_as_local(root: Path, report_path: Path, *args: str) -> dict:
    job = run_verify_job(root, str(report_path), pipeline_args=args).to_dict()
    assert job == verify_dataset(root).to_dict()
    assert json.loads(report_path.read_text()) == job  # the one report written
    return job


@pytest.fixture()
def pipeline_copy(pipeline_dataset: Path, tmp_path: Path) -> Path:
    """The pipeline-built dataset (index files and catalogs included), to damage."""
    target = tmp_path / "dataset"
    shutil.copytree(pipeline_dataset, target)
    return target


def test_a_sound_dataset_passes_with_its_index_files_and_catalogs(
    pipeline_copy: Path, tmp_path: Path
) -> None:
    report = _same_as_local(pipeline_copy, tmp_path / "report.json")
    assert report["ok"] and report["num_shards"] >= 4 and report["num_records"] > 0


def test_a_damaged_shard_is_named_as_the_local_command_names_it(
    pipeline_copy: Path, tmp_path: Path
) -> None:
    shard = sorted(pipeline_copy.glob("train-*.tfrecord"))[1]
    _flip_a_byte(shard)
    report = _same_as_local(pipeline_copy, tmp_path / "report.json")
    assert [s["file"] for s in report["shards"] if not s["ok"]] == [shard.name]


def test_a_missing_shard_index_file_and_catalog_are_reported(
    pipeline_copy: Path, tmp_path: Path
) -> None:
    sorted(pipeline_copy.glob("validation-*.tfrecord"))[0].unlink()
    sorted(pipeline_copy.glob("train-*.idx"))[0].unlink()
    next(pipeline_copy.glob("catalog-train*")).unlink()
    report = _same_as_local(pipeline_copy, tmp_path / "report.json")
    assert len([s for s in report["shards"] if not s["ok"]]) == 2
    assert any("catalog" in p for p in report["problems"])


def test_keys_held_in_two_shards_are_found_across_buckets(
    jpeg_dataset: WrittenDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard copied over another, relisted: every key of it is held twice."""
    import dataset_tools.verify.job as job

    monkeypatch.setattr(job, "KEYS_PER_BUCKET", 3)  # many buckets for a small dataset
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    first, second = dataset.shard_paths("train")[:2]
    shutil.copyfile(first, second)
    to_inline_layout(dataset.root)  # entries edited as JSON
    data = json.loads((dataset.root / MANIFEST_NAME).read_text())
    shards = data["splits"]["train"]["shards"]
    more = shards[0]["num_examples"] - shards[1]["num_examples"]
    data["splits"]["train"]["num_examples"] += more
    data["counts"]["written"] += more
    data["counts"]["input"] += more
    shards[1].update(
        num_examples=shards[0]["num_examples"],
        num_bytes=second.stat().st_size,
        sha256=hashlib.sha256(second.read_bytes()).hexdigest(),
    )
    (dataset.root / MANIFEST_NAME).write_text(json.dumps(data))
    report = _same_as_local(dataset.root, tmp_path / "report.json")
    duplicated = [p for p in report["problems"] if "appears 2 times" in p]
    assert len(duplicated) == shards[0]["num_examples"] > 0


def test_the_command_writes_the_report_and_exits_1_on_damage(
    jpeg_dataset: WrittenDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    assert main([str(dataset.root), "--report", str(report)]) == 0
    assert json.loads(report.read_text())["ok"]
    shard = dataset.shard_paths("validation")[1]
    _flip_a_byte(shard)
    assert main([str(dataset.root), "--report", str(report)]) == 1
    out = capsys.readouterr().out
    assert f"FAIL {shard.name}: " in out and "FAILED: 5/6 shards sound" in out
    assert main([str(tmp_path / "nowhere"), "--report", str(report)]) == 2


@pytest.mark.slow
def test_on_a_dask_cluster_a_damaged_shard_is_named(
    pipeline_copy: Path, tmp_path: Path, dask_cluster
) -> None:
    shard = sorted(pipeline_copy.glob("train-*.tfrecord"))[0]
    _flip_a_byte(shard)
    # The project's corrected DaskRunner, by class path (Beam's own computes one branch only).
    args = (
        "--runner",
        "beam_pipelines.engines.dask_runner.DaskRunner",
        "--dask_client_address",
        dask_cluster.address,
    )
    report = _same_as_local(pipeline_copy, tmp_path / "report.json", *args)
    assert [s["file"] for s in report["shards"] if not s["ok"]] == [shard.name]
