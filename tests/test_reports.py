"""Sorted reports written with bounded memory (``beam_pipelines.output.reports``), on a real pipeline."""

from __future__ import annotations

import json
import random
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.elements import Duplicate, Rejection
from beam_pipelines.output.reports import WriteSortedReport


class _CountReasons:
    def __init__(self) -> None:
        self.reasons: dict[str, int] = {}

    def add(self, element: Any) -> None:
        self.reasons[element.reason] = self.reasons.get(element.reason, 0) + 1

    def result(self) -> dict[str, Any]:
        return {
            "count": sum(self.reasons.values()),
            "by_reason": dict(sorted(self.reasons.items())),
        }


def test_report_is_sorted_whole_from_many_small_runs_merged_in_passes(tmp_path):
    rng = random.Random(3)
    rejections = [
        Rejection(f"/in/{rng.randrange(10**6):07d} é.jpg", rng.choice("abc"), f"detail {i}")
        for i in range(500)
    ]
    rejections += rejections[:7]  # the same line twice stays twice
    with test_pipeline.TestPipeline() as p:
        summary = (
            p
            | beam.Create(rejections)
            | beam.Reshuffle()
            # 30-element runs merged 4 at a time: 17 runs, then 5, then 2, then the report.
            | WriteSortedReport(str(tmp_path), "rejected.jsonl", Rejection, _CountReasons,
                                run_size=30, fan_in=4)
        )  # fmt: skip
        expected = {"count": len(rejections), "by_reason": {}}
        for r in rejections:
            expected["by_reason"][r.reason] = expected["by_reason"].get(r.reason, 0) + 1
        expected["by_reason"] = dict(sorted(expected["by_reason"].items()))
        assert_that(summary, equal_to([expected]))
    text = (tmp_path / "rejected.jsonl").read_text(encoding="utf-8")
    assert text == "".join(r.to_json() + "\n" for r in sorted(rejections))
    runs = list((tmp_path / ".staging" / "reports" / "rejected").glob("*.jsonl"))
    assert len(runs) >= 17  # sorted runs were spilled, not one list held


def test_an_empty_report_is_an_empty_file(tmp_path):
    class _Count:
        def __init__(self) -> None:
            self.n = 0

        def add(self, element: Any) -> None:
            self.n += 1

        def result(self) -> dict[str, Any]:
            return {"count": self.n}

    with test_pipeline.TestPipeline() as p:
        summary = (
            p
            | beam.Create([])
            | WriteSortedReport(str(tmp_path), "duplicates.jsonl", Duplicate, _Count)
        )
        assert_that(summary, equal_to([{"count": 0}]))
    assert (tmp_path / "duplicates.jsonl").read_bytes() == b""


def test_duplicates_round_trip_their_fields(tmp_path):
    duplicates = [
        Duplicate("/b.jpg", None, "f" * 64, "cat", None, True),
        Duplicate("/a.jpg", "/0.jpg", "e" * 64, "cat", "dog", True),
    ]

    class _Keep:
        def __init__(self) -> None:
            self.seen: list[Duplicate] = []

        def add(self, element: Any) -> None:
            self.seen.append(element)

        def result(self) -> dict[str, Any]:
            return {"seen": [list(d) for d in self.seen]}

    with test_pipeline.TestPipeline() as p:
        summary = (
            p
            | beam.Create(duplicates)
            | WriteSortedReport(str(tmp_path), "duplicates.jsonl", Duplicate, _Keep)
        )
        assert_that(summary, equal_to([{"seen": [list(d) for d in sorted(duplicates)]}]))
    lines = (tmp_path / "duplicates.jsonl").read_text().splitlines()
    assert [json.loads(line)["uri"] for line in lines] == ["/a.jpg", "/b.jpg"]


@pytest.mark.parametrize(("run_size", "fan_in"), [(0, 4), (10, 1)])
def test_bad_sizes_are_refused(tmp_path, run_size, fan_in):
    with pytest.raises(ValueError, match="run_size"):
        WriteSortedReport(str(tmp_path), "r.jsonl", Rejection, _CountReasons,
                          run_size=run_size, fan_in=fan_in)  # fmt: skip
