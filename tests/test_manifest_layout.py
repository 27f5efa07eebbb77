"""``dataset.json``'s two layouts: shard entries inline (format version 1, every dataset written
before shard tables) and per-split Parquet shard tables (format version 2, written since).

Every tool reads a dataset of either layout the same way; a damaged or missing shard table and
an unknown format version are refused with errors that say what to do.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from beam_pipelines.builds.incremental import BaseRefusedError, open_base
from beam_pipelines.builds.resume import published_by_earlier_attempt
from beam_pipelines.output.publish import publish_manifest, read_manifest, remove_unlisted_shards
from dataset_tools.adopt import adopt
from dataset_tools.diff import diff_datasets
from dataset_tools.inspect.inspection import gather
from dataset_tools.verify.verification import verify_dataset
from schemas import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    TOOL_VERSION,
    Counts,
    FileInfo,
    ImageSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    TableShards,
    shard_filename,
)
from schemas.shard_table import ShardTable, decode_manifest, encode_manifest
from tests.fixtures.shards import ForeignShards, to_inline_layout
from tfrecord_io import make_dataset
from tfrecord_io.source import load_manifest, resolve_source


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _manifest(num_shards: int = 5) -> Manifest:
    shards = tuple(
        ShardInfo(
            shard_filename("train", i, num_shards), i + 1, 100 + i, _sha(f"s{i}"),
            FileInfo(f"train-{i}.idx", 7 * (i + 1), _sha(f"i{i}")) if i % 2 else None,
        )
        for i in range(num_shards)
    )  # fmt: skip
    total = sum(s.num_examples for s in shards)
    return Manifest(
        label_names=("cat", "dog"),
        splits={"train": SplitInfo(total, shards), "validation": SplitInfo(0, ())},
        counts=Counts(input=total, written=total, rejected=0, duplicates=0),
        image=ImageSpec(encoding="jpeg", image_size=32, crop="none"),
        options={"image_size": 32},
    )


def test_shard_tables_round_trip_and_keep_dataset_json_small() -> None:
    manifest = _manifest()
    text, tables = encode_manifest(manifest)
    data = json.loads(text)
    assert data["format_version"] == FORMAT_VERSION == 2
    assert sorted(tables) == ["shards-train.parquet", "shards-validation.parquet"]
    train = data["splits"]["train"]
    assert "shards" not in train and train["num_shards"] == 5 and train["num_bytes"] == 510
    assert (
        train["shard_table"]["sha256"] == hashlib.sha256(tables["shards-train.parquet"]).hexdigest()
    )
    reads: list[str] = []

    def read(name: str) -> bytes:
        reads.append(name)
        return tables[name]

    again = decode_manifest(text, read)
    # The head answers counts without reading a table; entries load the table once.
    assert again.split("train").num_shards == 5 and again.split("train").num_bytes == 510
    assert reads == []
    assert again == manifest and again.all_shards() == manifest.all_shards()
    assert reads == ["shards-train.parquet"]  # an empty split's table is never needed
    assert again.to_json() == text and encode_manifest(again) == (text, tables)
    assert again.split("train").shards[1:4] == manifest.split("train").shards[1:4]
    assert again.split("train").shards[-1] == manifest.split("train").shards[-1]
    # Encoding is deterministic: the same manifest gives the same bytes.
    assert encode_manifest(_manifest()) == (text, tables)
    # Version 1 still writes shards inline, with no format_version (as written before).
    inline = json.loads(manifest.with_format(1).to_json())
    assert "format_version" not in inline and len(inline["splits"]["train"]["shards"]) == 5
    assert (
        Manifest.from_json(manifest.with_format(1).to_json()).all_shards() == manifest.all_shards()
    )


def test_a_manifest_read_without_its_tables_names_the_table_when_entries_are_asked_for() -> None:
    text, _ = encode_manifest(_manifest())
    head = Manifest.from_json(text)
    assert head.split("train").num_shards == 5 and isinstance(
        head.split("train").shards, TableShards
    )
    with pytest.raises(ValueError, match="shards-train.parquet, which was not read"):
        head.all_shards()


def test_an_unknown_format_version_says_to_upgrade(tmp_path: Path) -> None:
    data = json.loads(encode_manifest(_manifest())[0])
    data["format_version"] = 3
    with pytest.raises(ValueError, match=r"format_version 3, written by a newer .*upgrade"):
        Manifest.from_dict(data)
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=r"dataset.json: .*format_version 3.*pip install --upgrade"
    ):
        load_manifest(tmp_path)
    data["format_version"] = "2"
    with pytest.raises(ValueError, match="format_version must be one of"):
        Manifest.from_dict(data)


def _table_dataset(tmp_path: Path) -> tuple[Path, bytes]:
    text, tables = encode_manifest(_manifest())
    for name, blob in tables.items():
        (tmp_path / name).write_bytes(blob)
    (tmp_path / MANIFEST_NAME).write_text(text)
    return tmp_path, tables["shards-train.parquet"]


def test_a_missing_or_damaged_shard_table_is_named(tmp_path: Path) -> None:
    root, blob = _table_dataset(tmp_path)
    table = root / "shards-train.parquet"
    table.unlink()
    manifest = load_manifest(root)  # dataset.json alone still parses
    assert manifest is not None and manifest.split("train").num_shards == 5
    with pytest.raises(
        FileNotFoundError, match="'train' shard table shards-train.parquet.*missing"
    ):
        manifest.all_shards()
    with pytest.raises(FileNotFoundError, match="shards-train.parquet"):
        verify_dataset(root)
    damaged = bytearray(blob)
    damaged[len(damaged) // 2] ^= 0xFF
    table.write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="shards-train.parquet has SHA-256 .* dataset.json says"):
        load_manifest(root).split("train").shards[0]
    table.write_bytes(blob[:-10])
    with pytest.raises(ValueError, match=f"is {len(blob) - 10} bytes, but dataset.json says"):
        _ = resolve_source(root, "train").shards
    # A table whose hash dataset.json vouches for, but whose rows disagree with it.
    other = encode_manifest(_manifest(num_shards=4))[1]["shards-train.parquet"]
    table.write_bytes(other)
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["splits"]["train"]["shard_table"].update(
        num_bytes=len(other), sha256=hashlib.sha256(other).hexdigest()
    )
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ValueError, match="has 4 rows, but dataset.json says the split has 5"):
        load_manifest(root).all_shards()


@pytest.fixture
def both_layouts(pipeline_dataset: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The session's pipeline dataset (shard tables) and a copy in the inline layout."""
    old = Path(shutil.copytree(pipeline_dataset, tmp_path / "old"))
    to_inline_layout(old)
    assert "shards" in json.loads((old / MANIFEST_NAME).read_text())["splits"]["train"]
    assert not list(old.glob("shards-*.parquet"))
    assert json.loads((pipeline_dataset / MANIFEST_NAME).read_text())["format_version"] == 2
    return old, pipeline_dataset


def _labels(source: Path, **kwargs) -> list[int]:
    dataset = make_dataset(source, "train", global_batch_size=4, training=False, **kwargs)
    return [int(x) for _, labels in dataset for x in labels.numpy()]


def test_the_reader_reads_both_layouts_alike(both_layouts: tuple[Path, Path]) -> None:
    old, new = both_layouts
    old_manifest, new_manifest = load_manifest(old), load_manifest(new)
    assert old_manifest is not None and new_manifest is not None
    assert old_manifest.format_version == 1 and new_manifest.format_version == 2
    assert old_manifest == new_manifest.with_format(1)
    assert isinstance(new_manifest.split("train").shards, ShardTable)
    assert _labels(old) == _labels(new)
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 1)
        assert _labels(old, input_context=context) == _labels(new, input_context=context)
    # An input pipeline's share is built from the table's rows alone, as from inline entries.
    old_files, new_files = resolve_source(old, "train"), resolve_source(new, "train")
    assert [s.path for s in new_files.shard_files[1::2]] == [
        s.path.replace(str(old), str(new)) for s in old_files.shard_files[1::2]
    ]
    assert [dataclasses.replace(s, path="") for s in new_files.shard_files[::2]] == [
        dataclasses.replace(s, path="") for s in old_files.shards[::2]
    ]


def test_verify_diff_and_inspect_read_both_layouts_alike(both_layouts: tuple[Path, Path]) -> None:
    old, new = both_layouts
    reports = verify_dataset(old), verify_dataset(new)
    assert all(r.ok for r in reports), [r.to_dict() for r in reports]
    assert [s.file for s in reports[0].shards] == [s.file for s in reports[1].shards]
    diff = diff_datasets(old, new)
    assert diff.totals["unchanged"] == diff.totals["old"] == diff.totals["new"] == 16
    assert diff.totals["added"] == diff.totals["removed"] == diff.totals["changed"] == 0
    old_stats, new_stats = (gather(str(p), per_class=1).stats for p in (old, new))
    for key in ("num_shards", "total_bytes", "splits", "counts"):
        assert old_stats[key] == new_stats[key], key
    assert old_stats["distributions"]["shards"] == new_stats["distributions"]["shards"]


def test_an_old_layout_dataset_serves_as_base_and_as_an_earlier_attempt(
    both_layouts: tuple[Path, Path],
) -> None:
    old, new = both_layouts
    options = load_manifest(new).options  # type: ignore[union-attr]
    bases = [open_base(str(p), options=options, tool_version=TOOL_VERSION) for p in (old, new)]
    assert all(b.reusable for b in bases)
    assert bases[0].index.num_examples == bases[1].index.num_examples == 16
    assert np.array_equal(bases[0].index.prefixes, bases[1].index.prefixes)
    assert bases[0].index.shards == bases[1].index.shards
    published = [published_by_earlier_attempt(str(p), options) for p in (old, new)]
    assert published[0] is not None and published[1] is not None
    assert published[0].all_shards() == published[1].all_shards()
    assert read_manifest(str(old)) == read_manifest(str(new)).with_format(1)  # type: ignore[union-attr]


def test_a_base_with_a_damaged_shard_table_is_refused(
    pipeline_dataset: Path, tmp_path: Path
) -> None:
    base = Path(shutil.copytree(pipeline_dataset, tmp_path / "base"))
    (base / "shards-train.parquet").write_bytes(b"not parquet")
    options = load_manifest(pipeline_dataset).options  # type: ignore[union-attr]
    with pytest.raises(BaseRefusedError, match="shards-train.parquet is 11 bytes"):
        open_base(str(base), options=options, tool_version=TOOL_VERSION)


def test_publishing_writes_tables_before_dataset_json_and_removes_stale_tables(
    tmp_path: Path,
) -> None:
    manifest = _manifest()
    (tmp_path / "shards-test.parquet").write_bytes(b"left by an unpublished run")
    publish_manifest(str(tmp_path), manifest)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        MANIFEST_NAME, "shards-test.parquet", "shards-train.parquet", "shards-validation.parquet"
    ]  # fmt: skip
    published = read_manifest(str(tmp_path))
    assert published == manifest
    remove_unlisted_shards(str(tmp_path), published, None)  # type: ignore[arg-type]
    assert not (tmp_path / "shards-test.parquet").exists()
    assert (tmp_path / "shards-train.parquet").exists()


def test_adopt_writes_shard_tables_and_refuses_an_old_layout_dataset(
    foreign_shards: ForeignShards, both_layouts: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "adopted"
    adopt(str(foreign_shards.directory / "*"), output=str(out), label_offset=1)
    assert json.loads((out / MANIFEST_NAME).read_text())["format_version"] == 2
    assert verify_dataset(out).ok
    labels = _labels(out)
    to_inline_layout(out)  # adopted before shard tables: read the same
    assert _labels(out) == labels and verify_dataset(out).ok
    old, _ = both_layouts
    with pytest.raises(ValueError, match="already a dataset"):
        adopt(str(old), output=str(tmp_path / "again"))
