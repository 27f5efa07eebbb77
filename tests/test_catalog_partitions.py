"""Catalogs written in partitions (``catalog.partitions``, ``MergeCatalogs``) and every reader
of them, beside a single-file dataset built from the same images."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines import images_to_tfrecord
from beam_pipelines.elements import ShardResult
from beam_pipelines.output import catalog_io
from beam_pipelines.output.publish import split_catalog_files
from catalog.partitions import (
    catalog_partition_filename,
    iter_catalog_batches,
    partition_count,
    partition_of,
    partition_shards,
    shards_per_partition,
)
from catalog.table import read_table
from dataset_tools.diff import diff_datasets
from dataset_tools.verify import verify_dataset
from dataset_tools.verify.job import run_verify_job
from schemas import MANIFEST_NAME
from schemas.manifest import FileInfo, Manifest, SplitInfo
from tests.fixtures.pipeline_datasets import build_pipeline_dataset, built_once
from tfrecord_io.random_access import load_catalog, read_examples
from tfrecord_io.source import load_manifest

# 16 images, 3 train shards of 3-5 records: 3 rows a partition gives one shard a partition;
# validation's single shard keeps today's single file.
_PARTITION_ROWS = 3
_TRAIN_PARTS = [catalog_partition_filename("train", p, 3) for p in range(3)]


_FLAGS = ["--num_shards", "3", "--validation_fraction", "0.25", "--image_size", "32"]


def _build(images: Path, output: Path, *, base: Path, partition_rows: int) -> int:
    """Builds ``output`` from ``images`` reusing ``base``; returns the examples reused."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog_io, "PARTITION_ROWS", partition_rows)
        summary = images_to_tfrecord.run(
            ["--input", str(images), "--output", str(output), *_FLAGS, "--base", str(base)]
        )
    assert summary.published, summary.describe()
    return summary.metrics.get("images_reused", 0)


def _build_both(directory: Path) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog_io, "PARTITION_ROWS", _PARTITION_ROWS)
        build_pipeline_dataset(directory)
    # Today's layout from the same images (shards and URIs alike), through a partitioned base.
    default = catalog_io.PARTITION_ROWS
    reused = _build(directory / "images", directory / "single", base=directory / "dataset",
                    partition_rows=default)  # fmt: skip
    return {"reused": reused}


@pytest.fixture(scope="session")
def both(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """``build_pipeline_dataset``'s images and flags built twice: its catalogs cut in
    partitions of 3 rows, and then in today's single files with the first as ``--base``.
    Returns both roots and the examples the second reused."""
    directory, facts = built_once(tmp_path_factory, "partitioned-catalog", _build_both)
    return directory / "dataset", directory / "single", facts["reused"]


@pytest.fixture(scope="session")
def partitioned(both: tuple[Path, Path, int]) -> Path:
    return both[0]


@pytest.fixture(scope="session")
def single(both: tuple[Path, Path, int]) -> Path:
    return both[1]


def _manifest(root: Path) -> Manifest:
    manifest = load_manifest(str(root))
    assert manifest is not None
    return manifest


def test_partition_names_widen_like_shard_names() -> None:
    assert catalog_partition_filename("train", 3, 16) == "catalog-train-00003-of-00016.parquet"
    assert (
        catalog_partition_filename("train", 3, 100_000) == "catalog-train-000003-of-100000.parquet"
    )
    for bad in (("Train", 0, 2), ("train", 2, 2), ("train", -1, 2)):
        with pytest.raises(ValueError):
            catalog_partition_filename(*bad)


def test_the_cut_is_consecutive_bounded_and_covers_every_shard() -> None:
    assert shards_per_partition(4_000, 2_000_000) == 500
    assert shards_per_partition(3_000_000, 2_000_000) == 1  # one shard, however large
    with pytest.raises(ValueError, match="partition_rows"):
        shards_per_partition(10, 0)
    for num_shards in range(1, 30):
        for per in range(1, 12):
            parts = partition_count(num_shards, per)
            ranges = [partition_shards(p, parts, num_shards) for p in range(parts)]
            assert [i for r in ranges for i in r] == list(range(num_shards))
            assert all(1 <= len(r) <= per for r in ranges)
            assert all(
                partition_of(i, parts, num_shards) == p for p, r in enumerate(ranges) for i in r
            )


def test_a_partitions_merge_holds_its_shards_without_their_label_counts(monkeypatch) -> None:
    # A merge holds every shard of its partition at once: at 1,000 classes each shard's label
    # counts are 74 KB as Python objects, 74 MB in a worker for a partition of 1,000 shards.
    given: list[ShardResult] = []

    def merge(output_dir, split, shards, *, partition, partitions, first_index):
        shards = list(shards)
        given.extend(shards)
        rows = sum(s.num_examples for s in shards)
        return catalog_io.CatalogResult(split, f"p{partition}", rows, 1, "0" * 64, partition,
                                        partitions)  # fmt: skip

    monkeypatch.setattr(catalog_io, "merge_split_catalog", merge)
    counts = tuple((label, 3) for label in range(1000))
    shards = [
        ShardResult("train", i, 6, f"train-{i:05d}-of-00006.tfrecord", 30, 100, "0" * 64,
                    label_counts=counts)
        for i in range(6)
    ]  # fmt: skip
    with beam.Pipeline() as pipeline:
        merged = (
            pipeline
            | beam.Create(shards)
            | catalog_io.MergeCatalogs("/unused", partition_rows=60)
            | beam.Map(lambda c: (c.partition, c.num_examples))
        )
        assert_that(merged, equal_to([(0, 60), (1, 60), (2, 60)]))
    assert sorted(s.index for s in given) == list(range(6))
    assert all(s.label_counts == () for s in given), "label counts reached a merge"


def test_missing_or_repeated_partitions_are_refused() -> None:
    result = catalog_io.CatalogResult
    digest = "0" * 64
    parts = [result("train", f"f{p}", 1, 1, digest, p, 3) for p in (0, 2)]
    with pytest.raises(ValueError, match="missing or repeated"):
        split_catalog_files(parts)
    with pytest.raises(ValueError, match="either one catalog or catalog partitions"):
        SplitInfo(
            0, (), catalog=FileInfo("a", 1, digest), catalog_partitions=(FileInfo("b", 1, digest),)
        )


def test_the_partitions_hold_the_single_catalogs_rows_and_the_shards_are_the_same(
    partitioned: Path, single: Path
) -> None:
    manifest, other = _manifest(partitioned), _manifest(single)
    train = manifest.split("train")
    assert train.catalog is None
    assert [f.file for f in train.catalog_partitions] == _TRAIN_PARTS
    assert manifest.split("validation").catalog_files == other.split("validation").catalog_files
    data = json.loads((partitioned / MANIFEST_NAME).read_text())
    assert [f["file"] for f in data["splits"]["train"]["catalog_partitions"]] == _TRAIN_PARTS
    assert not list(partitioned.glob("catalog-train.parquet"))
    for shard in other.all_shards():
        assert (partitioned / shard.file).read_bytes() == (single / shard.file).read_bytes()
    whole = read_table(str(single / "catalog-train.parquet"))
    parts = [read_table(str(partitioned / name)) for name in _TRAIN_PARTS]
    assert all(p.num_rows for p in parts)
    assert pa.concat_tables(parts).equals(whole)  # split-wide index, same rows, same order
    # The one place readers go through: the partitions in order, a batch at a time.
    batches = list(
        iter_catalog_batches(
            train.catalog_files, lambda f: (partitioned / f.file).read_bytes(), columns=["index"]
        )
    )
    assert [i for b in batches for i in b.column("index").to_pylist()] == list(
        range(whole.num_rows)
    )


def test_random_access_diff_and_inspect_read_both_layouts(partitioned: Path, single: Path) -> None:
    for split in ("train", "validation"):
        assert load_catalog(str(partitioned), split).equals(load_catalog(str(single), split))
    last = read_table(str(partitioned / _TRAIN_PARTS[-1]), columns=["key"]).column("key")[0].as_py()
    assert read_examples(str(partitioned), [last]) == read_examples(str(single), [last])
    totals = diff_datasets(single, partitioned).totals
    assert totals["old"] == totals["new"] == 16
    assert totals["unchanged"] == 16, totals
    from dataset_tools.inspect.inspection import gather

    a, b = gather(str(partitioned), per_class=2), gather(str(single), per_class=2)
    differ = {"dataset", "lineage"}  # where each is, and how the second was built
    assert {k: v for k, v in a.stats.items() if k not in differ} == {
        k: v for k, v in b.stats.items() if k not in differ
    }
    assert [x.key for x in a.samples["cat"]] == [x.key for x in b.samples["cat"]]


def test_a_damaged_partition_is_named_by_every_reader(partitioned: Path, tmp_path: Path) -> None:
    copy = tmp_path / "dataset"
    shutil.copytree(partitioned, copy)
    target = copy / _TRAIN_PARTS[1]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    problems = verify_dataset(copy).to_dict()["problems"]
    assert any(_TRAIN_PARTS[1] in p and "damaged" in p for p in problems), problems
    with pytest.raises(ValueError, match=_TRAIN_PARTS[1]):
        load_catalog(str(copy), "train")
    with pytest.raises(ValueError, match=_TRAIN_PARTS[1]):
        diff_datasets(partitioned, copy)


def test_verify_locally_and_as_a_job_checks_every_partition(
    partitioned: Path, tmp_path: Path
) -> None:
    local = verify_dataset(partitioned).to_dict()
    assert local["problems"] == [] and all(not s["problems"] for s in local["shards"])
    job = run_verify_job(partitioned, str(tmp_path / "report.json")).to_dict()
    assert job == local
    # A row out of place in a middle partition: its split-wide index is checked per partition.
    copy = tmp_path / "moved"
    shutil.copytree(partitioned, copy)
    name = _TRAIN_PARTS[1]
    table = read_table(str(copy / name))
    index = table.schema.get_field_index("index")
    shifted = pa.array([i + 1 for i in table.column("index").to_pylist()], pa.int64())
    from catalog.table import table_bytes

    blob = table_bytes(table.set_column(index, table.schema.field("index"), shifted))
    (copy / name).write_bytes(blob)
    manifest = json.loads((copy / MANIFEST_NAME).read_text())
    for entry in manifest["splits"]["train"]["catalog_partitions"]:
        if entry["file"] == name:
            entry.update(num_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    (copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    local = verify_dataset(copy).to_dict()["problems"]
    assert local and all(name in p and "index" in p for p in local), local
    assert run_verify_job(copy, str(tmp_path / "moved.json")).to_dict()["problems"] == local


def test_bases_of_either_layout_are_reused_and_partitions_rebuild_byte_for_byte(
    both: tuple[Path, Path, int], tmp_path: Path
) -> None:
    partitioned, single, reused = both
    assert reused == _manifest(single).counts.written  # every example, from the partitions
    again = tmp_path / "again"
    assert _build(partitioned.parent / "images", again, base=single, partition_rows=3) == reused
    for name in [*_TRAIN_PARTS, "catalog-validation.parquet"]:
        assert (again / name).read_bytes() == (partitioned / name).read_bytes(), name
    assert _manifest(again).splits == _manifest(partitioned).splits


@pytest.mark.slow
def test_partitions_on_dask_are_byte_identical_to_the_in_process_ones(
    partitioned: Path, dask_cluster, tmp_path: Path
) -> None:
    output = tmp_path / "dask"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog_io, "PARTITION_ROWS", _PARTITION_ROWS)
        summary = images_to_tfrecord.run(
            ["--input", str(partitioned.parent / "images"), "--output", str(output), *_FLAGS,
             *dask_cluster.runner_args()]
        )  # fmt: skip
    assert summary.published, summary.describe()
    names = sorted(p.name for p in partitioned.iterdir() if p.is_file())
    assert sorted(p.name for p in output.iterdir() if p.is_file()) == names
    for name in names:
        assert (output / name).read_bytes() == (partitioned / name).read_bytes(), name


def _catalog_results(root: Path) -> list[catalog_io.CatalogResult]:
    results = []
    for split, info in _manifest(root).splits.items():
        files = info.catalog_files
        for number, f in enumerate(files):
            results.append(
                catalog_io.CatalogResult(
                    split, f.file, 0, f.num_bytes, f.sha256, number, len(files)
                )
            )
    return results


@pytest.mark.slow
def test_the_near_duplicate_report_names_members_from_every_partition(
    partitioned: Path, single: Path
) -> None:
    from beam_pipelines.graph.leakage import key_number, members_from_catalogs

    keys = load_catalog(str(single), "train", columns=["key"]).column("key").to_pylist()
    keys += load_catalog(str(single), "validation", columns=["key"]).column("key").to_pylist()
    numbers = {key_number(k) for k in keys}
    found = members_from_catalogs(str(partitioned), _catalog_results(partitioned), numbers)
    assert len(found) == len(numbers) == 16
    assert found == members_from_catalogs(str(single), _catalog_results(single), numbers)


def _near_duplicate_report(root: Path, copy: Path, found: dict | None, pairs: int) -> bytes:
    """Runs ``ReportNearDuplicates`` over a copy of ``root``'s catalogs, checking that its
    summary counts ``pairs``; returns the report."""
    import apache_beam as beam
    from apache_beam.testing import test_pipeline
    from apache_beam.testing.util import assert_that, equal_to

    from beam_pipelines.graph.leakage import NEAR_DUPLICATES_NAME, ReportNearDuplicates

    shutil.copytree(root, copy)  # the session's dataset stays as built
    with test_pipeline.TestPipeline() as p:
        catalogs = p | "Catalogs" >> beam.Create(_catalog_results(copy))
        # An empty PCollection stands for a search that saw no record.
        searched = p | "Found" >> beam.Create([found] if found else [])
        summary = catalogs | ReportNearDuplicates(str(copy), searched)
        assert_that(summary | beam.Map(lambda counts: counts["pairs"]), equal_to([pairs]))
    return (copy / NEAR_DUPLICATES_NAME).read_bytes()


@pytest.mark.slow
def test_the_near_duplicate_report_reads_each_partition_apart_with_the_same_bytes(
    partitioned: Path, single: Path, tmp_path: Path
) -> None:
    from beam_pipelines.graph.leakage import key_number

    train = load_catalog(str(single), "train", columns=["key"]).column("key").to_pylist()
    validation = load_catalog(str(single), "validation", columns=["key"]).column("key")
    numbers = sorted(key_number(k) for k in train + validation.to_pylist())
    # Pairs joining examples of every partition and both splits; one example in two pairs.
    a, b = numbers[:7] + [numbers[0]], numbers[15:8:-1] + [numbers[8]]
    found = {
        "a": a, "b": b, "distance": [i % 4 for i in range(8)], "flipped": [i % 3 == 0 for i in range(8)],
        "window": [i % 4 for i in range(8)],
        "leakage": [i < 2 for i in range(8)], "cross_class": [i in (2, 5) for i in range(8)],
        "moved": [numbers[1]], "examples": 16, "complete": True,
    }  # fmt: skip
    report = _near_duplicate_report(partitioned, tmp_path / "partitioned", found, 8)
    assert report == _near_duplicate_report(single, tmp_path / "single", found, 8)
    lines = [json.loads(line) for line in report.decode("utf-8").splitlines()]
    assert len(lines) == 8
    keys = {key_number(m["key"]) for line in lines for m in (line["a"], line["b"])}
    assert keys == set(a) | set(b)
    assert [line["leakage"] for line in lines[:2]] == [True, True]
    assert sum(m["moved"] for line in lines for m in (line["a"], line["b"])) == 1
    assert sum("crop 90%" in line["probably"] for line in lines) == 2  # window 2 of 8 pairs
    # Without a pair, or without any record, the report is empty and no catalog is needed.
    for name, search in (("none", {**found, **dict.fromkeys(("a", "b", "distance"), [])}),
                         ("nothing", None)):  # fmt: skip
        nothing = {k: [] for k in ("flipped", "window", "leakage", "cross_class", "moved")}
        search = {**search, **nothing} if search else None
        assert _near_duplicate_report(partitioned, tmp_path / name, search, 0) == b""


def test_publishing_removes_catalogs_and_partitions_no_manifest_lists(
    partitioned: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "dataset"
    shutil.copytree(partitioned, copy)
    stale = ["catalog-train.parquet", "catalog-train-00000-of-00002.parquet",
             "catalog-validation-000001-of-100000.parquet"]  # fmt: skip
    for name in stale:
        (copy / name).write_bytes(b"left by an earlier run")
    removed = catalog_io.remove_unlisted_catalog_files(str(copy), _manifest(copy))
    assert sorted(Path(p).name for p in removed) == sorted(stale)
    assert all((copy / name).exists() for name in _TRAIN_PARTS)
