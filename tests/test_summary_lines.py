"""The build summary's wording (``beam_pipelines.summary``, ``graph.leakage.summary_lines``):
counts that agree with their nouns, images/s over images only, only the reports that hold a
line, and leakage named with its fix."""

from __future__ import annotations

import numpy as np
import pytest

from beam_pipelines.graph.leakage import summary_lines
from beam_pipelines.summary import RunSummary
from cliflags import plural
from schemas.manifest import Counts, ImageSpec, Manifest, ShardInfo, SplitInfo

SHA = "0" * 64


def _summary(
    *, rejected: dict[str, int] | None = None, duplicates: int = 0, near: dict | None = None
) -> RunSummary:
    """A published build of one class: 1 train and 1 validation example, plus ``rejected``
    inputs by reason and ``duplicates``, in 2.0 s."""
    rejected = rejected or {}
    splits = {
        split: SplitInfo(
            num_examples=1,
            shards=(ShardInfo(f"{split}-00000-of-00001.tfrecord", 1, 100, SHA),),
            class_counts={"cat": 1},
        )
        for split in ("train", "validation")
    }
    counts = Counts(
        input=2 + sum(rejected.values()) + duplicates,
        written=2,
        rejected=sum(rejected.values()),
        duplicates=duplicates,
    )
    manifest = Manifest(
        label_names=("cat",),
        splits=splits,
        counts=counts,
        image=ImageSpec(encoding="jpeg", image_size=256, crop="none"),
        options={"image_size": 256, "max_bad_fraction": 0.5},
    )
    return RunSummary(
        "/out/photos", True, manifest, 0.0, rejected, {}, elapsed_s=2.0, near_duplicates=near
    )


def _near(pairs: int, leakage: int, *, action: str = "report", moved: int = 0) -> dict:
    return {
        "file": "near_duplicates.jsonl",
        "threshold": 8,
        "action": action,
        "examples": 10,
        "pairs": pairs,
        "leakage": leakage,
        "cross_class": 0,
        "moved_to_train": moved,
        "complete": True,
    }


def test_plural_agrees_with_the_count():
    assert plural(1, "duplicate") == "1 duplicate"
    assert [plural(n, "pair") for n in (0, 2)] == ["0 pairs", "2 pairs"]
    assert (
        plural(1, "class", "classes") == "1 class" and plural(3, "class", "classes") == "3 classes"
    )
    assert plural(np.int64(1234), "example", grouped=True) == "1,234 examples"
    with pytest.raises(TypeError, match="got 1.5"):
        plural(1.5, "image")


def test_one_duplicate_is_singular_and_only_reports_with_lines_are_listed():
    clean = _summary().describe()
    assert "0 duplicates" in clean and "reports: (none: no file rejected, no duplicate)" in clean
    assert "rejected.jsonl" not in clean and "duplicates.jsonl" not in clean
    one = _summary(duplicates=1).describe()
    assert "0 rejected, 1 duplicate\n" in one
    assert "reports: /out/photos/duplicates.jsonl\n" in one
    both = _summary(rejected={"truncated": 1}, duplicates=2).describe()
    assert "reports: /out/photos/rejected.jsonl, /out/photos/duplicates.jsonl\n" in both


def test_images_per_second_counts_images_not_text_files():
    # 2 written, 1 duplicate, 1 truncated JPEG: 4 images; a README.txt and an empty file are not.
    summary = _summary(rejected={"not_an_image": 1, "empty_file": 1, "truncated": 1}, duplicates=1)
    assert summary.images == 4 and summary.images_per_s == 2.0
    first = summary.describe().splitlines()[0]
    assert first.startswith("6 inputs (4 images) in 2.0 s (2.0 images/s): 2 written, 3 rejected")
    assert summary.to_dict()["images"] == 4
    # When every input is an image, the line does not repeat the count.
    assert _summary(duplicates=1).describe().startswith("3 inputs in 2.0 s (1.5 images/s)")


def test_leakage_names_move_to_train_and_what_it_does():
    lines = list(summary_lines(_near(16, 6), "/out/photos"))
    assert lines[0] == (
        "near-duplicates (<= 8 bits): 16 pairs (6 train-validation leakage, 0 cross-class)"
    )
    assert lines[1] == (
        "  leakage: rebuild with --leakage move_to_train: it moves the validation member of each "
        "leaking pair into train, before the shards are written; with --base /out/photos and a "
        "new --output the rebuild reuses this dataset's examples instead of decoding the images "
        "again"
    )
    assert lines[2] == "near-duplicates report: /out/photos/near_duplicates.jsonl"
    described = _summary(near=_near(16, 6)).describe()
    assert "--leakage move_to_train" in described


def test_no_fix_without_leakage_and_no_report_without_pairs():
    assert list(summary_lines(_near(0, 0), "/out")) == [
        "near-duplicates (<= 8 bits): 0 pairs (0 train-validation leakage, 0 cross-class)"
    ]
    one = list(summary_lines(_near(1, 0), "/out"))
    assert one[0].startswith("near-duplicates (<= 8 bits): 1 pair (") and len(one) == 2
    moved = list(summary_lines(_near(2, 0, action="move_to_train", moved=1), "/out"))
    assert moved[0].endswith("; 1 validation example moved to train")
    assert not any("--leakage" in line for line in moved)
