"""What goes in and where: skipped hidden/system files, label conflicts and stratified splits.

Pure functions first, then the Beam transforms on real (TestPipeline) runners.
"""

from __future__ import annotations

import hashlib
import json

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_pipelines.elements import CatalogMeta, Duplicate, PreparedRecord, SourceFile
from beam_pipelines.graph.splits import (
    AssignSplits,
    assign_split_stratified,
    split_value,
    stratified_cutoff,
)
from beam_pipelines.inputs.sources import SKIPPED_TAG, ListSources, is_skipped
from beam_pipelines.output.shards import TRAIN, VALIDATION, dedupe_sorted
from tests.fixtures.images import make_image_tree


def _sha(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _record(sha: str, uri: str, label: int, text: str) -> PreparedRecord:
    return PreparedRecord(sha, uri, b"x", CatalogMeta(label, text, 8, 8, "JPEG"))


# --- skipped files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        ".DS_Store",
        "cat/.DS_Store",
        "cat/._photo.jpg",
        ".git/objects/ab",
        "cat/.thumbnails/a.jpg",
        "__MACOSX/cat/._a.jpg",
        "cat/Thumbs.db",
        "cat/thumbs.DB",
        "dog/Desktop.ini",
    ],
)
def test_hidden_and_system_files_are_skipped(path):
    assert is_skipped(path)


@pytest.mark.parametrize("path", ["cat/a.jpg", "red fox/x.y.jpg", "stray.jpg", "cat/sub/b.png"])
def test_ordinary_files_are_not_skipped(path):
    assert not is_skipped(path)


def test_list_sources_skips_hidden_and_system_files(tmp_path):
    root = tmp_path / "images"
    written = make_image_tree(root, {"cat": 2, "dog": 1}, size=(8, 8))
    skipped = [
        root / ".DS_Store",
        root / "cat" / ".DS_Store",
        root / "cat" / "Thumbs.db",
        root / "__MACOSX" / "cat" / "._cat_0000.jpg",
        root / ".hidden" / "x.jpg",
    ]
    for path in skipped:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0junk")
    (root / "stray.jpg").write_bytes(b"outside any class")
    expected = [SourceFile(str(p), name) for name, paths in written.items() for p in paths]
    expected.append(SourceFile(str(root / "stray.jpg"), None))
    with test_pipeline.TestPipeline() as p:
        listed = p | ListSources(str(root))
        assert_that(listed["sources"], equal_to(expected), label="Sources")
        assert_that(listed[SKIPPED_TAG], equal_to([str(s) for s in skipped]), label="Skipped")


# --- label conflicts ---------------------------------------------------------------------------


def _conflicting_records() -> list[PreparedRecord]:
    return [
        _record(_sha(1), "/d/cat/a.jpg", 0, "cat"),
        _record(_sha(1), "/d/dog/a-copy.jpg", 1, "dog"),
        _record(_sha(2), "/d/cat/b.jpg", 0, "cat"),
        _record(_sha(2), "/d/cat/b-copy.jpg", 0, "cat"),
    ]


def test_a_copy_under_another_class_is_a_label_conflict_and_the_first_is_kept():
    kept, duplicates = dedupe_sorted(_conflicting_records())
    assert sorted(r.uri for r in kept) == ["/d/cat/a.jpg", "/d/cat/b-copy.jpg"]
    assert sorted(duplicates) == [
        Duplicate("/d/cat/b.jpg", "/d/cat/b-copy.jpg", _sha(2), "cat", "cat", False),
        Duplicate("/d/dog/a-copy.jpg", "/d/cat/a.jpg", _sha(1), "dog", "cat", True),
    ]
    line = json.loads(duplicates[[d.label_conflict for d in duplicates].index(True)].to_json())
    assert line == {
        "uri": "/d/dog/a-copy.jpg",
        "label": "dog",
        "kept_uri": "/d/cat/a.jpg",
        "kept_label": "cat",
        "sha256": _sha(1),
        "label_conflict": True,
    }


def test_drop_both_keeps_no_copy_of_a_conflict_but_keeps_plain_duplicates():
    kept, duplicates = dedupe_sorted(_conflicting_records(), label_conflicts="drop_both")
    assert [r.uri for r in kept] == ["/d/cat/b-copy.jpg"]
    assert sorted(d for d in duplicates if d.label_conflict) == [
        Duplicate("/d/cat/a.jpg", None, _sha(1), "cat", None, True),
        Duplicate("/d/dog/a-copy.jpg", None, _sha(1), "dog", None, True),
    ]
    assert len(kept) + len(duplicates) == 4


def test_an_unknown_conflict_policy_is_refused():
    with pytest.raises(ValueError, match="label_conflicts must be one of"):
        dedupe_sorted([], label_conflicts="keep_last")


# --- stratified split --------------------------------------------------------------------------


def test_stratified_cutoff_takes_the_rounded_share_and_leaves_one_for_training():
    values = [0.9, 0.1, 0.5, 0.3, 0.7]
    assert stratified_cutoff(values, 0.4) == 0.3  # 2 of 5
    assert stratified_cutoff(values, 0.3) == 0.3  # floor(1.5 + 0.5) = 2
    assert stratified_cutoff(values, 0.0) == -1.0
    assert stratified_cutoff([0.2], 0.9) == -1.0  # a class of one stays in train
    assert stratified_cutoff([0.2, 0.2, 0.8], 0.5) == 0.2  # copies count once
    with pytest.raises(ValueError, match="validation_fraction"):
        stratified_cutoff(values, 1.0)


def test_every_class_gets_its_share_of_validation_deterministically():
    # 3 classes of 10, 20 and 3 examples at 20%: 2, 4 and 1 in validation, whatever their hashes.
    sizes = {0: 10, 1: 20, 2: 3}
    records = [
        _record(_sha(1000 * label + i), f"/d/{label}/{i}.jpg", label, str(label))
        for label, n in sizes.items()
        for i in range(n)
    ]

    def counts(pairs):
        got: dict[tuple[str, int], int] = {}
        for split, record in pairs:
            key = (split, record.meta.label)
            got[key] = got.get(key, 0) + 1
        return got

    def check(pairs):
        assert counts(pairs) == {
            (VALIDATION, 0): 2,
            (TRAIN, 0): 8,
            (VALIDATION, 1): 4,
            (TRAIN, 1): 16,
            (VALIDATION, 2): 1,
            (TRAIN, 2): 2,
        }
        # The validation examples of each class are those with the smallest split values.
        for label in sizes:
            ordered = sorted((split_value(r.sha256), s) for s, r in pairs if r.meta.label == label)
            splits = [s for _, s in ordered]
            assert splits == sorted(splits, key=lambda s: s != VALIDATION)

    for order in (records, list(reversed(records))):
        with test_pipeline.TestPipeline() as p:
            out = p | beam.Create(order) | AssignSplits(0.2, stratify=True)
            assert_that(out, check)


def test_a_record_of_a_class_without_a_cutoff_is_refused():
    with pytest.raises(ValueError, match="no stratified cutoff for label 3"):
        assign_split_stratified(_sha(1), 3, {0: 0.5})
