"""Near-duplicates at build time: the report, --leakage move_to_train, and the flags."""

from __future__ import annotations

import array
import hashlib
import json

import pyarrow.parquet as pq
import pytest

from beam_pipelines.config import PipelineConfig
from beam_pipelines.graph.leakage import _COLUMN_TYPES, key_number, search_columns
from beam_pipelines.image.prepare import ImageOptions, prepare_image
from catalog.window_search import WindowRule


def _report(output):
    text = (output / "near_duplicates.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def _uris(output, split):
    return set(
        pq.read_table(output / f"catalog-{split}.parquet", columns=["uri"])["uri"].to_pylist()
    )


@pytest.mark.slow
def test_report_lists_the_planted_leakage_first_then_the_cross_class_pair(sample_datasets):
    built = sample_datasets.report
    counts = built.near_duplicates
    assert (counts["pairs"], counts["leakage"], counts["cross_class"]) == (2, 1, 1)
    assert counts["moved_to_train"] == 0 and counts["complete"]
    leak, cross = _report(built.path)
    members = {leak["a"]["split"]: leak["a"], leak["b"]["split"]: leak["b"]}
    assert leak["leakage"] and not leak["cross_class"]
    assert members["train"]["uri"].endswith("_reencoded.JPEG")
    assert members["validation"]["uri"] == members["train"]["uri"].replace("_reencoded", "")
    assert members["validation"]["uri"] in _uris(built.path, "validation")
    assert cross["cross_class"] and not cross["leakage"]
    assert {cross["a"]["text"], cross["b"]["text"]} == {"desert", "forêt"}
    assert "near_copy_of_" in cross["a"]["uri"] + cross["b"]["uri"]
    # The re-encoded copy has its original's size; the cross-class copy is half size.
    assert (leak["probably"], cross["probably"]) == ("re-encode or edit", "scale")
    assert "2 pairs (1 train-validation leakage, 1 cross-class)" in built.described
    # The summary names the fix: what move_to_train does, and --base on this build.
    assert (
        "  leakage: rebuild with --leakage move_to_train: it moves the validation member of "
        f"each leaking pair into train, before the shards are written; with --base {built.path} "
    ) in built.described
    manifest = json.loads((built.path / "dataset.json").read_text(encoding="utf-8"))
    assert manifest["options"]["leakage"] == "report"
    # Every example's hash is in the catalog (hashed per staging file), as prepare_image's.
    rows = pq.read_table(built.path / "catalog-train.parquet", columns=["uri", "phash"])
    assert rows["phash"].null_count == 0
    for row in rows.to_pylist()[:5]:
        with open(row["uri"], "rb") as source:
            assert prepare_image(source.read(), ImageOptions()).phash == row["phash"]


@pytest.mark.slow
def test_move_to_train_leaves_no_leakage_in_the_published_splits(sample_datasets):
    built = sample_datasets.moved
    assert built.near_duplicates["leakage"] == 0
    assert built.near_duplicates["moved_to_train"] == 1
    (moved,) = [m for p in _report(built.path) for m in (p["a"], p["b"]) if m["moved"]]
    assert moved["split"] == "train"
    assert moved["uri"] in _uris(built.path, "train")
    assert moved["uri"] not in _uris(built.path, "validation")
    manifest = json.loads((built.path / "dataset.json").read_text(encoding="utf-8"))
    assert manifest["options"]["leakage"] == "move_to_train"
    assert "1 validation example moved to train" in built.described
    assert "rebuild with --leakage" not in built.described  # nothing left to fix


@pytest.mark.slow
def test_move_to_train_on_a_base_built_with_report_reuses_every_example(sample_datasets, tmp_path):
    """The leakage action is not an image option: ``--base`` on the ``report`` build with
    ``--leakage move_to_train`` reuses every example and writes what a clean
    ``move_to_train`` build writes, the leaking validation example in train."""
    from beam_pipelines import images_to_tfrecord

    base, clean = sample_datasets.report.path, sample_datasets.moved.path
    out = tmp_path / "moved_on_base"
    summary = images_to_tfrecord.run(
        [
            "--input", str(sample_datasets.images), "--output", str(out),
            "--validation_fraction", "0.2", "--max_bad_fraction", "0.2",
            "--leakage", "move_to_train", "--base", str(base),
        ]
    )  # fmt: skip
    assert summary.published, summary.describe()
    counts = summary.manifest.counts
    examples = counts.written + counts.duplicates
    assert summary.manifest.lineage["reused"] == examples and examples > 30
    assert summary.manifest.lineage["prepared"] == 0
    assert summary.metrics.get("images_reused", 0) == examples
    assert f"--base: reused {examples} examples from the base" in summary.describe()
    assert summary.near_duplicates["moved_to_train"] == 1
    assert summary.near_duplicates["leakage"] == 0
    names = sorted(p.name for p in clean.iterdir() if p.is_file())
    assert names == sorted(p.name for p in out.iterdir() if p.is_file())
    for name in names:
        if name != "dataset.json":
            assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    (moved,) = [m for p in _report(out) for m in (p["a"], p["b"]) if m["moved"]]
    assert moved["uri"] in _uris(out, "train") and moved["uri"] in _uris(base, "validation")


def _columns(rows):
    """The gathered search's columns; each row's window hashes its whole frame repeated (as
    ``hash_entry`` gives a record without them)."""
    columns = tuple(array.array(code) for code in _COLUMN_TYPES)
    for row in rows:
        row = (*row, *[row[1]] * (len(columns) - len(row)))
        for column, value in zip(columns, row, strict=True):
            column.append(value)
    return columns


def _key(text: str) -> int:
    return key_number(hashlib.sha256(text.encode()).hexdigest())


def test_search_counts_each_content_once_and_leaves_label_conflicts_out():
    rows = [
        (_key("a"), 100, 0, 0),  # train
        (_key("a"), 100, 0, 0),  # the same bytes again (a duplicate): one example
        (_key("b"), 101, 1, 0),  # validation, 1 bit from a: leakage
        (_key("c"), 100, 1, 0),  # the same bytes under two classes: left out
        (_key("c"), 100, 1, 2),
        (_key("d"), -1, 1, 1),  # a hash above 2**63, carried signed: far from the rest
    ]
    found = search_columns(_columns(rows), WindowRule(8, 7), move=True)
    assert found["examples"] == 3
    assert sorted([found["a"][0], found["b"][0]]) == sorted([_key("a"), _key("b")])
    assert found["leakage"] == [False]  # b was moved, so no leakage is left
    assert found["moved"] == [_key("b")]
    reported = search_columns(_columns(rows), WindowRule(8, 7), move=False)
    assert reported["leakage"] == [True] and reported["moved"] == []


def test_empty_search():
    found = search_columns(_columns([]), WindowRule(8, 7), move=True)
    assert found["examples"] == 0 and found["a"] == [] and found["complete"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("leakage", "drop", "--leakage must be one of report, move_to_train"),
        ("near_duplicate_threshold", 17, r"--near_duplicate_threshold must be an int in \[0, 16\]"),
        ("near_duplicate_threshold", -1, "--near_duplicate_threshold"),
        ("near_duplicate_window_threshold", 17, "--near_duplicate_window_threshold must be an"),
        ("near_duplicate_window_threshold", True, "--near_duplicate_window_threshold"),
        ("near_duplicate_bucket_entries", 1, "--near_duplicate_bucket_entries must be an int"),
        ("near_duplicate_bucket_entries", True, "--near_duplicate_bucket_entries"),
    ],
)
def test_bad_flags_are_named(tmp_path, field, value, message):
    with pytest.raises(ValueError, match=message):
        PipelineConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"), **{field: value})


def test_flags_parse(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_pipelines.config import config_from_options

    options = PipelineOptions(
        [
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "out"),
            "--leakage",
            "move_to_train",
            "--near_duplicate_threshold",
            "6",
            "--near_duplicate_window_threshold",
            "5",
            "--near_duplicate_bucket_entries",
            "4096",
        ]
    )
    config = config_from_options(options)
    assert (config.leakage, config.near_duplicate_threshold) == ("move_to_train", 6)
    assert config.near_duplicate_bucket_entries == 4096
    # The same pairs at any cap: not an option of the dataset.
    assert "near_duplicate_bucket_entries" not in config.manifest_options()
    assert config.manifest_options()["near_duplicate_threshold"] == 6
    assert config.near_duplicate_rule == WindowRule(6, 5, (1.0, 0.95, 0.9, 0.85))
    assert config.manifest_options()["near_duplicate_window_threshold"] == 5
    assert config.manifest_options()["near_duplicate_windows"] == [1.0, 0.95, 0.9, 0.85]


def _crop_set(root) -> tuple[str, str]:
    """Distinct scenes in two classes, and a 10 % crop of one whose bytes put it in validation
    while the original is in train; returns (original, crop) file names."""
    import io

    from PIL import Image

    from beam_pipelines.output.shards import assign_split
    from beam_pipelines.samples import scene_rgb

    def jpeg(image, quality=90) -> bytes:
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=quality)
        return out.getvalue()

    def split(data: bytes) -> str:
        return assign_split(hashlib.sha256(data).hexdigest(), 0.3)

    original = crop = None
    for seed in range(40):
        name = ("cat", "dog")[seed % 2]
        (root / name).mkdir(parents=True, exist_ok=True)
        image = Image.fromarray(scene_rgb((500, 375), seed=seed))
        data = jpeg(image)
        (root / name / f"scene{seed}.jpg").write_bytes(data)
        if original is None and split(data) == "train":
            cropped = image.crop((25, 19, 475, 356))  # 10 % off each axis, centred
            for quality in range(90, 60, -1):
                copy = jpeg(cropped, quality)
                if split(copy) == "validation":
                    break
            (root / name / "crop.jpg").write_bytes(copy)
            original, crop = f"scene{seed}.jpg", "crop.jpg"
    return original, crop


@pytest.mark.slow
def test_a_crop_in_validation_is_found_named_and_moved_and_a_base_keeps_its_windows(tmp_path):
    """A 10 % crop of a train image, in validation: the window rule pairs it (the report says
    ``crop 90%``), ``move_to_train`` moves it; a rebuild on that
    dataset reuses every example with its window hashes (nothing prepared) and finds it too."""
    from beam_pipelines import images_to_tfrecord

    images = tmp_path / "images"
    original, crop = _crop_set(images)
    out = tmp_path / "moved"
    common = ["--input", str(images), "--validation_fraction", "0.3", "--leakage", "move_to_train"]
    summary = images_to_tfrecord.run([*common, "--output", str(out)])
    assert summary.published, summary.describe()
    (pair,) = _report(out)
    assert {pair["a"]["uri"].rsplit("/", 1)[-1], pair["b"]["uri"].rsplit("/", 1)[-1]} == {
        original,
        crop,
    }
    assert pair["probably"] == "crop 90%" and pair["leakage"] is False
    assert [m["uri"].endswith(crop) for m in (pair["a"], pair["b"]) if m["moved"]] == [True]
    assert summary.near_duplicates["moved_to_train"] == 1
    assert all(not uri.endswith(crop) for uri in _uris(out, "validation"))
    catalog = pq.read_table(out / "catalog-train.parquet", columns=["uri", "window_phash"])
    assert catalog["window_phash"].null_count == 0
    assert {len(w) for w in catalog["window_phash"].to_pylist()} == {3}
    options = json.loads((out / "dataset.json").read_text())["options"]
    assert options["near_duplicate_windows"] == [1.0, 0.95, 0.9, 0.85]
    assert options["near_duplicate_window_threshold"] == 7
    rebuilt = tmp_path / "rebuilt"
    again = images_to_tfrecord.run([*common, "--output", str(rebuilt), "--base", str(out)])
    assert again.published and again.manifest.lineage["prepared"] == 0
    assert again.near_duplicates["moved_to_train"] == 1
    for name in ("catalog-train.parquet", "catalog-validation.parquet", "near_duplicates.jsonl"):
        assert (rebuilt / name).read_bytes() == (out / name).read_bytes(), name
