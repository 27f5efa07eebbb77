"""Beam transforms (TestPipeline + assert_that) and the pure placement/listing functions."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import apache_beam as beam
import pytest
import tensorflow as tf
from apache_beam import typehints
from apache_beam.pipeline import PipelineVisitor
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.config import PipelineConfig, resolve_image_threads
from beam_pipelines.elements import Duplicate, PreparedRecord, Rejection, ShardResult, SourceFile
from beam_pipelines.graph.transforms import REJECTED_TAG, PrepareImages
from beam_pipelines.image.prepare import ImageOptions
from beam_pipelines.inputs.sources import (
    LabelNames,
    ListSources,
    parse_listing_line,
    source_from_path,
)
from beam_pipelines.output.shards import (
    DUPLICATES_TAG,
    TRAIN,
    VALIDATION,
    WriteShards,
    assign_shard,
    assign_split,
    dedupe_sorted,
    fixed_shard_counts,
)
from beam_pipelines.output.staging import RecordStager
from schemas.image_example import record_from_example
from tests.fixtures.images import jpeg_bytes, make_bad_files, make_image_tree


def _sha(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


# --- pure functions ----------------------------------------------------------------------------


def test_source_from_path_takes_the_top_directory_as_class():
    assert source_from_path("/d/red fox/a.jpg", "/d") == SourceFile("/d/red fox/a.jpg", "red fox")
    assert source_from_path("/d/cat/sub/a.jpg", "/d/") == SourceFile("/d/cat/sub/a.jpg", "cat")
    assert source_from_path("/d/readme.txt", "/d") == SourceFile("/d/readme.txt", None)
    with pytest.raises(ValueError, match="not under the input directory"):
        source_from_path("/e/cat/a.jpg", "/d")


def test_class_names_are_nfc_normalised():
    decomposed = "do\u0308g"  # as macOS stores "dög"
    assert source_from_path(f"/d/{decomposed}/a.jpg", "/d").label == "d\u00f6g"


def test_parse_listing_lines():
    assert parse_listing_line("uri,label", jsonl=False, base="/l") is None
    assert parse_listing_line("  ", jsonl=False, base="/l") is None
    assert parse_listing_line('"a, b.jpg",red fox', jsonl=False, base="/l") == SourceFile(
        "/l/a, b.jpg", "red fox"
    )
    assert parse_listing_line("gs://b/x.jpg,cat", jsonl=False, base="/l") == SourceFile(
        "gs://b/x.jpg", "cat"
    )
    line = json.dumps({"uri": "/abs/x.png", "label": "dög"})
    assert parse_listing_line(line, jsonl=True, base="/l") == SourceFile("/abs/x.png", "dög")


@pytest.mark.parametrize(
    ("line", "jsonl", "message"),
    [
        ("a.jpg", False, "has 1 fields; expected 2: uri,label"),
        ("a.jpg,cat,extra", False, "has 3 fields"),
        (",cat", False, "empty uri"),
        ("{not json", True, "not JSON"),
        ('{"uri": "a.jpg"}', True, 'string "uri" and "label"'),
    ],
)
def test_bad_listing_lines_are_named(line, jsonl, message):
    with pytest.raises(ValueError, match=message):
        parse_listing_line(line, jsonl=jsonl, base="/l")


def test_split_assignment_is_deterministic_and_near_the_fraction():
    shas = [_sha(i) for i in range(4000)]
    splits = [assign_split(s, 0.2) for s in shas]
    assert splits == [assign_split(s, 0.2) for s in shas]
    assert 0.17 < splits.count(VALIDATION) / len(splits) < 0.23
    assert all(assign_split(s, 0.0) == TRAIN for s in shas[:100])


def test_shard_assignment_is_a_range_partition_of_the_hash():
    assert assign_shard("0" * 64, 16) == 0
    assert assign_shard("f" * 64, 16) == 15
    assert assign_shard("8" + "0" * 63, 16) == 8
    counts = [0] * 8
    for i in range(4000):
        counts[assign_shard(_sha(i), 8)] += 1
    assert min(counts) > 400


def test_fixed_shard_counts():
    assert fixed_shard_counts(40, 0.0) == {TRAIN: 40}
    # Validation shards the size of train's: 40 * 0.05 / 0.95 = 2.1 -> 3.
    assert fixed_shard_counts(40, 0.05) == {TRAIN: 40, VALIDATION: 3}
    assert fixed_shard_counts(2, 0.3) == {TRAIN: 2, VALIDATION: 1}
    with pytest.raises(ValueError, match="num_shards must be in"):
        fixed_shard_counts(0, 0.1)
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        fixed_shard_counts(4, 1.0)


def test_write_shards_needs_exactly_one_way_to_count():
    with pytest.raises(ValueError, match="exactly one of shard_counts and plan"):
        WriteShards("/out")
    with pytest.raises(ValueError, match="exactly one of shard_counts and plan"):
        WriteShards("/out", shard_counts={TRAIN: 2}, plan=object())
    with pytest.raises(ValueError, match="counts >= 1"):
        WriteShards("/out", shard_counts={TRAIN: 0})


def test_dedupe_keeps_the_first_uri_of_identical_bytes():
    records = [
        PreparedRecord(_sha(2), "/d/b/2.jpg", b"x"),
        PreparedRecord(_sha(1), "/d/z/copy.jpg", b"y"),
        PreparedRecord(_sha(1), "/d/a/orig.jpg", b"y"),
    ]
    kept, duplicates = dedupe_sorted(records)
    by_hash = sorted([(_sha(2), "/d/b/2.jpg"), (_sha(1), "/d/a/orig.jpg")])
    assert [r.uri for r in kept] == [uri for _, uri in by_hash]
    assert duplicates == [Duplicate("/d/z/copy.jpg", "/d/a/orig.jpg", _sha(1))]


# --- Beam transforms ---------------------------------------------------------------------------


def test_list_sources_and_label_names_from_a_directory(tmp_path):
    root = tmp_path / "images"
    written = make_image_tree(root, {"cat": 2, "red fox": 1, "dög": 1}, size=(8, 8))
    (root / "README.txt").write_text("not in a class directory")
    expected = [SourceFile(str(p), name) for name, paths in written.items() for p in paths]
    expected.append(SourceFile(str(root / "README.txt"), None))
    with test_pipeline.TestPipeline() as p:
        sources = (p | ListSources(str(root)))["sources"]
        assert_that(sources, equal_to(expected), label="Sources")
        labels = sources | LabelNames()
        assert_that(labels, equal_to([("cat", "dög", "red fox")]), label="Labels")


def test_list_sources_from_csv_and_jsonl_listings(tmp_path):
    (tmp_path / "imgs").mkdir()
    csv_listing = tmp_path / "list.csv"
    csv_listing.write_text("uri,label\nimgs/a.jpg,cat\n/abs/b.jpg,red fox\n\n", encoding="utf-8")
    jsonl_listing = tmp_path / "list.jsonl"
    jsonl_listing.write_text(
        json.dumps({"uri": "imgs/a.jpg", "label": "dög"}) + "\n", encoding="utf-8"
    )
    with test_pipeline.TestPipeline() as p:
        from_csv = (p | "Csv" >> ListSources(str(csv_listing)))["sources"]
        assert_that(
            from_csv,
            equal_to(
                [
                    SourceFile(str(tmp_path / "imgs/a.jpg"), "cat"),
                    SourceFile("/abs/b.jpg", "red fox"),
                ]
            ),
            label="CsvSources",
        )
        from_jsonl = (p | "Jsonl" >> ListSources(str(jsonl_listing)))["sources"]
        assert_that(
            from_jsonl,
            equal_to([SourceFile(str(tmp_path / "imgs/a.jpg"), "dög")]),
            label="JsonlSources",
        )


@pytest.mark.parametrize("threads", [1, 3])
def test_prepare_images_routes_good_and_bad_inputs(tmp_path, threads):
    good = tmp_path / "cat" / "good.jpg"
    good.parent.mkdir()
    good.write_bytes(jpeg_bytes((40, 30), seed=5))
    html = tmp_path / "cat" / "page.jpg"
    html.write_bytes(make_bad_files()["not_an_image"])
    sources = [
        SourceFile(str(good), "cat"),
        SourceFile(str(html), "cat"),
        SourceFile(str(tmp_path / "cat" / "missing.jpg"), "cat"),
        SourceFile(str(tmp_path / "stray.jpg"), None),
    ]
    sha = hashlib.sha256(good.read_bytes()).hexdigest()

    def check_record(records):
        assert len(records) == 1
        record = records[0]
        assert (record.sha256, record.uri) == (sha, str(good))
        parsed = record_from_example(record.serialized)
        assert (parsed.label, parsed.text, parsed.height, parsed.width) == (1, "cat", 24, 32)
        assert parsed.sha256 == sha and parsed.filename == str(good)

    with test_pipeline.TestPipeline() as p:
        labels = p | "Labels" >> beam.Create([("ant", "cat")])
        out = (
            p
            | beam.Create(sources)
            | PrepareImages(ImageOptions(image_size=24), labels, threads=threads)
        )
        assert_that(out.records, check_record, label="Records")
        assert_that(
            out[REJECTED_TAG] | beam.Map(lambda r: (r.uri, r.reason)),
            equal_to(
                [
                    (str(html), "not_an_image"),
                    (str(tmp_path / "cat" / "missing.jpg"), "unreadable"),
                    (str(tmp_path / "stray.jpg"), "no_label"),
                ]
            ),
            label="Rejected",
        )


def test_rejection_details_name_the_problem(tmp_path):
    missing = str(tmp_path / "cat" / "missing.jpg")
    with test_pipeline.TestPipeline() as p:
        labels = p | "Labels" >> beam.Create([("cat",)])
        out = p | beam.Create([SourceFile(missing, "cat")]) | PrepareImages(ImageOptions(), labels)
        assert_that(
            out[REJECTED_TAG]
            | beam.Map(lambda r: missing in r.detail and "cannot read" in r.detail),
            equal_to([True]),
        )


def _staged(out_dir: Path, elements, *, max_file_bytes: int = 64) -> list:
    """``(split, PreparedRecord)`` -> ``(split, StagedRecord)``, staged in ``out_dir`` as the
    image step stages them (several small staging files)."""
    stager = RecordStager(str(out_dir), max_file_bytes=max_file_bytes)
    staged = []
    for _, record in elements:
        staged += stager.add(record.sha256, record.uri, record.serialized, record.meta)
    staged += stager.flush()
    split_of = {(r.sha256, r.uri): split for split, r in elements}
    return [(split_of[(r.sha256, r.uri)], r) for r in staged]


def test_write_shards_writes_every_planned_shard_sorted_and_deduplicated(tmp_path):
    out_dir = tmp_path / "out"
    records = [
        PreparedRecord(_sha(i), f"/d/c/{i:02d}.jpg", f"payload-{i}".encode()) for i in range(12)
    ]
    copy = PreparedRecord(_sha(3), "/d/z/copy-of-03.jpg", b"payload-3")
    elements = _staged(out_dir, [(TRAIN, r) for r in records + [copy]])

    def check_shards(results):
        assert sorted((r.split, r.index, r.count) for r in results) == [
            (TRAIN, i, 4) for i in range(4)
        ]
        assert sum(r.num_examples for r in results) == 12
        for r in results:
            path = out_dir / r.file
            assert r.file == f"train-{r.index:05d}-of-00004.tfrecord"
            assert path.stat().st_size == r.num_bytes
            assert hashlib.sha256(path.read_bytes()).hexdigest() == r.sha256
            payloads = [bytes(x.numpy()) for x in tf.data.TFRecordDataset(str(path))]
            expected = sorted(
                (rec for rec in records if assign_shard(rec.sha256, 4) == r.index),
                key=lambda rec: rec.sha256,
            )
            assert payloads == [rec.serialized for rec in expected]

    with test_pipeline.TestPipeline() as p:
        out = p | beam.Create(elements) | WriteShards(str(out_dir), shard_counts={TRAIN: 4})
        assert_that(out["shards"], check_shards, label="Shards")
        assert_that(
            out[DUPLICATES_TAG],
            equal_to([Duplicate("/d/z/copy-of-03.jpg", "/d/c/03.jpg", _sha(3))]),
            label="Duplicates",
        )
    assert not [p for p in Path(out_dir).rglob("*") if ".tmp-" in p.name]
    # Each shard leaves a done record (for --resume) after its index file and catalog rows.
    done = sorted(p.name for p in (out_dir / ".staging" / "done").glob("*.json"))
    assert done == [f"train-{i:05d}-of-00004.json" for i in range(4)]


def test_write_shards_with_few_records_writes_empty_shards_too(tmp_path):
    elements = _staged(
        tmp_path,
        [
            (TRAIN, PreparedRecord("0" * 64, "/a.jpg", b"a")),
            (TRAIN, PreparedRecord("1" + "0" * 63, "/b.jpg", b"b")),
        ],
    )
    with test_pipeline.TestPipeline() as p:
        out = p | beam.Create(elements) | WriteShards(str(tmp_path), shard_counts={TRAIN: 2})
        assert_that(
            out["shards"] | beam.Map(lambda r: (r.file, r.num_examples)),
            # Both hashes fall in the first half of the range: shard 1 is written empty.
            equal_to([("train-00000-of-00002.tfrecord", 2), ("train-00001-of-00002.tfrecord", 0)]),
        )
    assert (tmp_path / "train-00001-of-00002.tfrecord").stat().st_size == 0


def test_side_inputs_of_every_shard_carry_names_not_label_counts(tmp_path):
    # A ShardResult carries its label counts (74 KB decoded at 1,000 classes): as side inputs
    # of every shard, the finished and the done ones grew each worker that read them with the
    # dataset (0.39 GB at 10 M images).
    done = ShardResult(TRAIN, 0, 2, "train-00000-of-00002.tfrecord", 1, 1, "0" * 64)
    done = done._replace(label_counts=tuple((label, 1) for label in range(1000)))
    p = beam.Pipeline()
    written = (
        p
        | "Records" >> beam.Create([])
        | WriteShards(
            str(tmp_path),
            shard_counts={TRAIN: 2},
            done={
                "shards": p | "Done" >> beam.Create([done]),
                DUPLICATES_TAG: p | "None" >> beam.Create([]),
            },
        )
    )
    assert written["shards"]
    side_inputs = {}

    class _Visitor(PipelineVisitor):
        def visit_transform(self, node):
            for side in node.side_inputs:
                side_inputs[node.full_label] = side.pvalue.element_type

    p.visit(_Visitor())
    by_step = {label.split("/")[1]: kind for label, kind in side_inputs.items()}
    assert by_step["WriteShard"] == by_step["EmptyShards"] == typehints.Tuple[str, int], by_step


def _shard_files(directory: Path) -> dict[str, bytes]:
    # Shards, their index files and (under .staging/done) their catalog fragments.
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "records" not in p.parts
    }


def test_planned_and_fixed_counts_write_the_same_shards(tmp_path):
    # Counts handed over as a one-element PCollection (the planning step's way) or fixed up
    # front: the same 3 shards, byte for byte, whatever staging files the records came from.
    records = [(TRAIN, PreparedRecord(_sha(i), f"/c/{i}.jpg", bytes([i]) * 100)) for i in range(12)]
    planned, fixed = tmp_path / "planned", tmp_path / "fixed"
    for out_dir, file_bytes in ((planned, 300), (fixed, 10_000)):
        elements = _staged(out_dir, records, max_file_bytes=file_bytes)
        with test_pipeline.TestPipeline() as p:
            if out_dir == planned:
                plan = p | "Plan" >> beam.Create([{TRAIN: 3}])
                sharding = {"plan": plan}
            else:
                sharding = {"shard_counts": {TRAIN: 3}}
            out = p | beam.Create(elements) | WriteShards(str(out_dir), **sharding)
            assert_that(
                out["shards"] | beam.Map(lambda r: (r.index, r.count)),
                equal_to([(0, 3), (1, 3), (2, 3)]),
            )
    assert _shard_files(planned) == _shard_files(fixed)
    assert len([name for name in _shard_files(fixed) if name.endswith(".tfrecord")]) == 3
    assert len([name for name in _shard_files(fixed) if name.endswith(".idx")]) == 3


def test_fixed_counts_write_no_shards_for_a_split_without_records(tmp_path):
    elements = _staged(
        tmp_path, [(TRAIN, PreparedRecord(_sha(i), f"/c/{i}.jpg", b"x")) for i in range(4)]
    )
    with test_pipeline.TestPipeline() as p:
        out = (
            p
            | beam.Create(elements)
            | WriteShards(str(tmp_path), shard_counts={TRAIN: 2, VALIDATION: 3})
        )
        assert_that(
            out["shards"] | beam.Map(lambda r: r.file),
            equal_to(["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]),
        )
    assert sorted(p.name for p in tmp_path.glob("*.tfrecord")) == [
        "train-00000-of-00002.tfrecord",
        "train-00001-of-00002.tfrecord",
    ]
    assert sorted(p.name for p in tmp_path.glob("*.idx")) == [
        "train-00000-of-00002.idx",
        "train-00001-of-00002.idx",
    ]


def test_fixed_counts_refuse_a_split_they_do_not_name(tmp_path):
    elements = _staged(tmp_path, [(VALIDATION, PreparedRecord(_sha(1), "/c/odd.jpg", b"x"))])
    with pytest.raises(Exception, match=r"no shard count for split 'validation' \(of /c/odd.jpg\)"):
        with test_pipeline.TestPipeline() as p:
            _ = p | beam.Create(elements) | WriteShards(str(tmp_path), shard_counts={TRAIN: 2})


def test_result_and_rejection_tuples_serialise():
    assert json.loads(Rejection("/a b.jpg", "truncated", "cut").to_json()) == {
        "uri": "/a b.jpg",
        "reason": "truncated",
        "detail": "cut",
    }
    result = ShardResult("train", 0, 1, "train-00000-of-00001.tfrecord", 1, 10, "0" * 64)
    assert ShardResult(**result._asdict()) == result


@pytest.mark.parametrize(
    "given, one_process, cores, expected",
    [(0, True, 6, 6), (0, False, 6, 1), (4, False, 6, 4), (1, True, 6, 1), (0, True, 1, 1)],
)
def test_image_threads_auto_is_a_core_each_in_one_process_else_one(
    monkeypatch, given, one_process, cores, expected
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    config = PipelineConfig(input="in", output="out", image_threads=given)
    assert resolve_image_threads(config, one_process=one_process).image_threads == expected


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_image_threads_must_be_a_count(bad):
    with pytest.raises(ValueError, match="--image_threads"):
        PipelineConfig(input="in", output="out", image_threads=bad)
