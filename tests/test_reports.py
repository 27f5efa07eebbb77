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
from beam_pipelines.output.publish import DuplicatesSummary, RejectedSummary, label_conflict_groups
from beam_pipelines.output.reports import WriteSortedReport, choose_boundaries


class _CountReasons:
    def __init__(self) -> None:
        self.reasons: dict[str, int] = {}

    def add(self, element: Any) -> None:
        self.reasons[element.reason] = self.reasons.get(element.reason, 0) + 1

    def state(self) -> dict[str, int]:
        return dict(self.reasons)

    def merge(self, state: dict[str, int]) -> None:
        for reason, n in state.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + n

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

        def state(self) -> int:
            return self.n

        def merge(self, state: int) -> None:
            self.n += state

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

        def state(self) -> list[Duplicate]:
            return list(self.seen)

        def merge(self, state: list[Duplicate]) -> None:
            self.seen.extend(state)

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


@pytest.mark.parametrize(("run_size", "fan_in", "range_lines"), [(0, 4, 1), (10, 1, 1), (10, 4, 0)])
def test_bad_sizes_are_refused(tmp_path, run_size, fan_in, range_lines):
    with pytest.raises(ValueError, match="run_size"):
        WriteSortedReport(str(tmp_path), "r.jsonl", Rejection, _CountReasons,
                          run_size=run_size, fan_in=fan_in, range_lines=range_lines)  # fmt: skip


class _KeepOrder:
    """Keeps every element in the order seen: the merged states must give sorted order."""

    def __init__(self) -> None:
        self.seen: list[Rejection] = []

    def add(self, element: Any) -> None:
        self.seen.append(element)

    def state(self) -> list[Rejection]:
        return list(self.seen)

    def merge(self, state: list[Rejection]) -> None:
        self.seen.extend(state)

    def result(self) -> dict[str, Any]:
        return {"seen": [list(r) for r in self.seen]}


def _tied_rejections() -> list[Rejection]:
    rng = random.Random(11)
    rejections = [
        Rejection(f"/in/{rng.randrange(300):04d} ü.jpg", rng.choice("ab"), f"d{rng.randrange(3)}")
        for _ in range(400)
    ]
    # A crowd of equal lines, heavier than a range: boundaries repeat, leaving ranges empty.
    return rejections + [Rejection("/in/0150 ü.jpg", "a", "d1")] * 90


def _write(root, elements, summarizer, **sizes) -> tuple[bytes, list[str]]:
    with test_pipeline.TestPipeline() as p:
        summary = (
            p
            | beam.Create(elements)
            | beam.Reshuffle()
            | WriteSortedReport(str(root), "rejected.jsonl", Rejection, summarizer, **sizes)
        )
        results = summary | beam.Map(json.dumps, sort_keys=True)
        assert_that(results, lambda got: len(got) == 1 or pytest.fail(f"{got}"))
        _ = results | beam.Map(lambda text: (root / "summary.json").write_text(text))
    parts_dir = root / ".staging" / "reports" / "rejected" / "parts"
    parts = sorted(path.name for path in parts_dir.glob("*.jsonl"))
    return (root / "rejected.jsonl").read_bytes(), parts


def test_a_report_merged_in_many_ranges_has_the_bytes_of_one_range(tmp_path):
    rejections = _tied_rejections()
    expected = "".join(r.to_json() + "\n" for r in sorted(rejections)).encode("utf-8")
    one, one_parts = _write(tmp_path / "one", rejections, _KeepOrder, run_size=25, fan_in=3)
    assert len(one_parts) == 1  # 490 lines: one range by default
    assert one == expected
    # 490 lines a range of 20: 25 ranges, some empty (the crowd), runs merged in passes.
    many, many_parts = _write(
        tmp_path / "many", rejections, _KeepOrder, run_size=25, fan_in=3, range_lines=20
    )
    assert many == one
    assert 5 < len(many_parts) < 25, many_parts
    numbers = [int(name.split("-")[0]) for name in many_parts]
    assert len(set(numbers)) == len(numbers)  # one part per range
    for root in ("one", "many"):  # the summary saw every element in sorted order
        summary = json.loads((tmp_path / root / "summary.json").read_text())
        assert summary == {"seen": [list(r) for r in sorted(rejections)]}


def test_every_line_equal_is_one_range_and_the_rest_empty(tmp_path):
    same = [Rejection("/in/a.jpg", "decode_error", "x")] * 60
    data, parts = _write(tmp_path, same, RejectedSummary, run_size=7, range_lines=5)
    assert data == (same[0].to_json() + "\n").encode("utf-8") * 60
    assert [int(name.split("-")[0]) for name in parts] == [11]  # the last of 12 ranges
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"count": 60, "by_reason": {"decode_error": 60}}


def test_label_conflicts_across_ranges_are_grouped_as_in_one_pass(tmp_path):
    rng = random.Random(5)
    duplicates = []
    for group in range(40):
        sha = f"{group % 13:064x}"  # a content's copies spread over the whole URI order
        kept = None if group % 4 == 0 else f"/k/{rng.randrange(10**4):05d}.jpg"
        duplicates += [
            Duplicate(f"/d/{rng.randrange(10**5):06d}.jpg", kept, sha, rng.choice("xyz"),
                      None if kept is None else "x", rng.random() < 0.6)
            for _ in range(rng.randrange(1, 12))
        ]  # fmt: skip
    with test_pipeline.TestPipeline() as p:
        summary = (
            p
            | beam.Create(duplicates)
            | beam.Reshuffle()
            | WriteSortedReport(str(tmp_path), "duplicates.jsonl", Duplicate, DuplicatesSummary,
                                run_size=9, fan_in=2, range_lines=15)
        )  # fmt: skip
        expected = {
            "count": len(duplicates),
            "label_conflicts": label_conflict_groups(sorted(duplicates)),
        }
        assert_that(summary, equal_to([expected]))
    text = (tmp_path / "duplicates.jsonl").read_text(encoding="utf-8")
    assert text == "".join(d.to_json() + "\n" for d in sorted(duplicates))
    parts = list((tmp_path / ".staging" / "reports" / "duplicates" / "parts").glob("*"))
    assert len(parts) > 3


def test_boundaries_split_the_sampled_weight_evenly_and_repeat_for_heavy_elements():
    def line(uri: str) -> str:
        return json.dumps([uri, "r", "d"])

    samples = [(line(f"/{i:02d}"), 10) for i in range(10)]
    assert choose_boundaries(samples, Rejection, 1) == []
    assert choose_boundaries(reversed(samples), Rejection, 5) == [
        line(f"/{i:02d}") for i in (1, 3, 5, 7)
    ]
    heavy = [(line("/a"), 1), (line("/b"), 100), (line("/c"), 1)]
    assert choose_boundaries(heavy, Rejection, 4) == [line("/b")] * 3
    with pytest.raises(ValueError, match="at least 1 range"):
        choose_boundaries(samples, Rejection, 0)


@pytest.mark.slow
def test_ranges_on_dask_give_the_in_process_bytes(dask_cluster, tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines.engines.runners import resolve_runner_aliases

    rejections = _tied_rejections()
    options = PipelineOptions(resolve_runner_aliases(dask_cluster.runner_args()))
    pipeline = beam.Pipeline(options=options)
    _ = (
        pipeline
        | beam.Create(rejections)
        | beam.Reshuffle()
        | WriteSortedReport(str(tmp_path), "rejected.jsonl", Rejection, RejectedSummary,
                            run_size=25, fan_in=3, range_lines=20)
        | beam.Map(lambda s, path: open(path, "w").write(json.dumps(s)),
                   str(tmp_path / "summary.json"))
    )  # fmt: skip
    assert pipeline.run().wait_until_finish() == "DONE", dask_cluster.logs()
    expected = "".join(r.to_json() + "\n" for r in sorted(rejections)).encode("utf-8")
    assert (tmp_path / "rejected.jsonl").read_bytes() == expected
    parts = list((tmp_path / ".staging" / "reports" / "rejected" / "parts").glob("*"))
    assert len(parts) > 5
    reasons: dict[str, int] = {}
    for r in rejections:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"count": len(rejections), "by_reason": dict(sorted(reasons.items()))}
