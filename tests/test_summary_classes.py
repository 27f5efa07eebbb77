"""The build summary's class table: every class when there are few, the smallest and the
largest when there are many (``beam_pipelines.summary``)."""

from __future__ import annotations

import pytest

from beam_pipelines.summary import CLASSES_AT_EACH_END, CLASSES_IN_FULL, RunSummary
from schemas.manifest import Counts, ImageSpec, Manifest, ShardInfo, SplitInfo

SHA = "0" * 64


def _summary(sizes: dict[str, tuple[int, int]]) -> RunSummary:
    """A published build whose classes hold ``(train, validation)`` examples each."""
    names = tuple(sorted(sizes))
    splits = {}
    for position, split in enumerate(("train", "validation")):
        counts = {name: sizes[name][position] for name in names}
        total = sum(counts.values())
        shard = ShardInfo(f"{split}-00000-of-00001.tfrecord", total, 100, SHA)
        splits[split] = SplitInfo(num_examples=total, shards=(shard,), class_counts=counts)
    written = sum(s.num_examples for s in splits.values())
    manifest = Manifest(
        label_names=names,
        splits=splits,
        counts=Counts(input=written, written=written, rejected=0, duplicates=0),
        image=ImageSpec(encoding="jpeg", image_size=256, crop="none"),
        options={"image_size": 256},
    )
    return RunSummary("/out", True, manifest, 0.0, {}, {})


def _table(summary: RunSummary) -> list[str]:
    lines = summary.describe().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class "))
    end = next(i for i, line in enumerate(lines) if line.startswith("shards "))
    return lines[start : end + 1]


def test_a_few_classes_are_listed_whole_in_label_order():
    table = _table(_summary({"cat": (5, 1), "dog": (3, 0), "red fox": (9, 2)}))
    assert [line.split("  ")[0].strip() for line in table[1:-2]] == ["cat", "dog", "red fox"]
    assert table[-2].split() == ["total", "17", "3"]


@pytest.mark.parametrize("classes", [CLASSES_IN_FULL + 1, 1000])
def test_many_classes_show_the_smallest_and_the_largest(classes):
    sizes = {f"class{i:04d}": (100 + (i * 37) % classes, i % 3) for i in range(classes)}
    table = _table(_summary(sizes))
    assert len(table) == 1 + 2 * CLASSES_AT_EACH_END + 1 + 2
    assert "the smallest and the largest classes" in table[0]
    by_size = sorted(sizes, key=lambda n: (sum(sizes[n]), n))
    shown = [line.split()[0] for line in table[1:-2]]
    ends = by_size[:CLASSES_AT_EACH_END] + by_size[-CLASSES_AT_EACH_END:]
    assert [name for name in shown if name != "…"] == ends
    between = classes - 2 * CLASSES_AT_EACH_END
    assert table[1 + CLASSES_AT_EACH_END].startswith(f"… {between} classes between them")
    assert "class_counts in dataset.json" in table[1 + CLASSES_AT_EACH_END]
    smallest = table[1].split()
    assert smallest[1:] == [str(n) for n in sizes[by_size[0]]]
