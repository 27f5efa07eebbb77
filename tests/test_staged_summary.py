"""The staged summary the launcher reads holds each split's class counts, summed in the
pipeline, and shard entries without their per-class counts: a shard of N classes carries up to
N pairs, so the launcher (and the worker writing the summary) would hold shards x classes of
them (``beam_pipelines.output.publish``)."""

from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.testing import test_pipeline

from beam_pipelines.elements import ShardResult, SourceFile
from beam_pipelines.output.publish import StagedResult, StageResults, staged_path


def _shard(split: str, index: int, counts: tuple[tuple[int, int], ...], extra: int = 0):
    examples = sum(n for _, n in counts) + extra
    return ShardResult(
        split, index, 3, f"{split}-{index}.tfrecord", examples, 100, "0" * 64,
        label_counts=counts,
    )  # fmt: skip


def test_the_staged_summary_sums_class_counts_per_split(tmp_path):
    shards = [
        _shard("train", 0, ((0, 5), (2, 1))),
        _shard("train", 1, ((0, 2), (1, 4))),
        _shard("train", 2, ((1, 1),)),
        _shard("validation", 0, ((2, 3),), extra=1),  # one record without a class
    ]
    out = str(tmp_path)
    with test_pipeline.TestPipeline() as p:
        results = {
            "sources": p
            | "Sources" >> beam.Create([SourceFile(f"/{i}.jpg", "a") for i in range(14)]),
            "rejected": p | "Rejected" >> beam.Create([]),
            "duplicates": p | "Duplicates" >> beam.Create([]),
            "label_names": p | "Labels" >> beam.Create([("a", "b", "c")]),
            "shards": p | "Shards" >> beam.Create(shards),
        }
        _ = results | StageResults(out, "run1")
    data = json.loads((tmp_path / staged_path(out, "run1").split("/")[-1]).read_text())
    assert [s["label_counts"] for s in data["shards"]] == [[]] * 4
    assert [s["num_examples"] for s in data["shards"]] == [6, 6, 1, 4]
    staged = StagedResult(data)
    assert staged.class_counts("train") == {"a": 7, "b": 5, "c": 1}
    assert staged.class_counts("validation") is None  # 4 examples, 3 with a class
    assert staged.written == 17 and staged.input == 14
