"""Versions side by side: ``DST/v0001``, ``DST/v0002`` and a ``latest`` pointer the reader follows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from schemas.lineage import (
    LATEST_NAME,
    format_latest_pointer,
    parse_latest_pointer,
    parse_version_name,
    version_name,
)
from tests.fixtures.shards import WrittenDataset
from tfrecord_io.source import load_manifest, manifest_path, resolve_source


def test_pointer_and_version_names_round_trip_and_refuse_paths() -> None:
    assert version_name(2) == "v0002" and parse_version_name("v0002") == 2
    assert parse_version_name("v12345") == 12345 and parse_version_name("latest") is None
    assert parse_latest_pointer(format_latest_pointer("v0002")) == "v0002"
    for bad in ("../v1", "a/b", "", " ", "/abs"):
        with pytest.raises(ValueError, match="directory name"):
            parse_latest_pointer(bad)
        with pytest.raises(ValueError):
            format_latest_pointer(bad)
    with pytest.raises(ValueError, match=">= 1"):
        version_name(0)


def test_reader_follows_the_pointer(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    root = tmp_path / "ds"
    shutil.copytree(jpeg_dataset.root, root / "v0001")
    (root / LATEST_NAME).write_text(format_latest_pointer("v0001"))
    for source in (root, root / LATEST_NAME, str(root) + "/"):
        resolved = resolve_source(source, "train")
        assert resolved.paths[0].startswith(str(root / "v0001") + "/")
        assert resolved.num_examples == jpeg_dataset.manifest.split("train").num_examples
    assert load_manifest(root) == jpeg_dataset.manifest
    assert manifest_path(root / "v0001") == str(root / "v0001" / "dataset.json")


def test_a_pointer_to_a_missing_version_is_named(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / LATEST_NAME).write_text("v0003\n")
    with pytest.raises(FileNotFoundError, match="names version 'v0003'"):
        resolve_source(root, "train")
    (root / LATEST_NAME).write_text("../../etc\n")
    with pytest.raises(ValueError, match="directory name"):
        load_manifest(root)


def test_lineage_round_trips_and_clean_manifests_have_none(jpeg_dataset: WrittenDataset) -> None:
    import dataclasses
    import json

    from schemas import Manifest

    clean = jpeg_dataset.manifest.with_format(1)
    assert "lineage" not in json.loads(clean.to_json())
    lineage = {"base_manifest_sha256": "ab" * 32, "reused": 30, "prepared": 4}
    incremental = dataclasses.replace(clean, lineage=lineage)
    assert Manifest.from_json(incremental.to_json()) == incremental
    assert json.loads(incremental.to_json())["lineage"] == lineage
    with pytest.raises(ValueError, match="lineage must be a JSON object"):
        dataclasses.replace(clean, lineage=[1])


def _publish_copy(dataset: WrittenDataset, root: Path, version: str) -> None:
    shutil.copytree(dataset.root, root / version)


def test_versions_command_lists_numbers_and_moves_the_pointer(
    jpeg_dataset: WrittenDataset, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from beam_pipelines import versions

    root = tmp_path / "ds"
    assert versions.next_version(str(root)) == str(root / "v0001")
    _publish_copy(jpeg_dataset, root, "v0001")
    _publish_copy(jpeg_dataset, root, "v0002")
    (root / "v0003").mkdir()
    (root / "v0003" / "train-00000-of-00001.tfrecord").write_bytes(b"")  # a failed build
    assert versions.list_versions(str(root)) == ["v0001", "v0002"]
    assert versions.next_version(str(root)) == str(root / "v0004")
    assert versions.main([str(root), "--set_latest", "v0002"]) == 0
    assert (root / LATEST_NAME).read_text() == "v0002\n"
    assert versions.main([str(root)]) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == ["v0001", "v0002  (latest)"]
    assert versions.main([str(root), "--set_latest", "v0003"]) == 2
    assert "v0003 is not a published dataset" in capsys.readouterr().err
    (root / "v0001" / ".staging").mkdir()
    (root / "v0001" / ".staging" / "plan.json").write_text("{}")
    assert versions.main([str(root), "--set_latest", "v0001"]) == 2
    assert "a build is still writing v0001" in capsys.readouterr().err
    assert (root / LATEST_NAME).read_text() == "v0002\n"  # unchanged by the refusals
    assert resolve_source(root, "train").paths[0].startswith(str(root / "v0002"))


def test_versions_on_a_bucket(
    jpeg_dataset: WrittenDataset, tmp_path: Path, s3_env, capsys: pytest.CaptureFixture[str]
) -> None:
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines import versions
    from tests.fixtures.object_store import upload_tree

    FileSystems.set_options(PipelineOptions([]))
    _publish_copy(jpeg_dataset, tmp_path / "ds", "v0001")
    upload_tree(tmp_path / "ds", s3_env.uri("ds"))
    root = s3_env.uri("ds")
    assert versions.next_version(root) == s3_env.uri("ds", "v0002")
    assert versions.main([root, "--set_latest", "v0001"]) == 0
    assert versions.latest_version(root) == "v0001"
    resolved = resolve_source(root, "train")
    assert resolved.paths[0].startswith(s3_env.uri("ds", "v0001") + "/")
