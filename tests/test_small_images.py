"""Upscaling is a choice the user sees: sources below --min_source_side are rejected
(``too_small``, the default), kept at their own size or upscaled (--small_images), and every
example stored larger than its source is counted in the run's summary."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from beam_pipelines import images_to_tfrecord
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import RejectedImage, prepare_image
from dataset_tools.diff import diff_catalogs, load_catalog
from dataset_tools.inspect.__main__ import main as inspect_main
from dataset_tools.inspect.inspection import gather
from dataset_tools.inspect.report_html import render_html
from tests.fixtures.images import encode, make_image_tree
from tfrecord_io.source import load_manifest


def _png(width: int, height: int) -> bytes:
    return encode(Image.new("RGB", (width, height), (200, 30, 30)), "PNG")


def test_by_default_an_icon_is_too_small_and_a_small_photo_is_upscaled_and_said_so():
    with pytest.raises(RejectedImage) as info:
        prepare_image(_png(16, 16), ImageOptions())
    assert info.value.reason == "too_small"
    assert "below --min_source_side 32" in info.value.detail
    photo = prepare_image(_png(100, 80), ImageOptions())
    assert (photo.width, photo.height) == (320, 256) and "upscaled" in photo.events
    large = prepare_image(_png(600, 400), ImageOptions())
    assert "upscaled" not in large.events


@pytest.mark.parametrize("crop", ["none", "center"])
def test_keep_stores_a_small_image_at_its_own_size(crop):
    kept = prepare_image(_png(14, 25), ImageOptions(small_images="keep", crop=crop))
    expected = (14, 25) if crop == "none" else (14, 14)
    assert (kept.width, kept.height) == expected and "upscaled" not in kept.events
    assert Image.open(io.BytesIO(kept.encoded)).size == expected


def test_upscale_enlarges_it_and_counts_it():
    big = prepare_image(_png(14, 25), ImageOptions(small_images="upscale"))
    assert (big.width, big.height) == (256, 457) and "upscaled" in big.events


def test_policies_are_checked():
    with pytest.raises(ValueError, match="small_images"):
        ImageOptions(small_images="shrink")
    with pytest.raises(ValueError, match="raw"):
        ImageOptions(small_images="keep", encoding="raw", crop="center")
    with pytest.raises(ValueError, match="min_source_side"):
        ImageOptions(min_source_side=-1)


def _small_tree(root: Path) -> Path:
    """Five sources below --image_size 128 (upscaled), an icon below --min_source_side 32
    (too small) and one large image."""
    make_image_tree(root, {"a": 3, "b": 2}, size=(64, 48))
    (root / "a" / "icon.png").write_bytes(_png(16, 16))
    (root / "b" / "large.png").write_bytes(_png(300, 200))
    return root


def _build(images: Path, output: Path, *extra: str) -> int:
    argv = ["--input", str(images), "--output", str(output), "--image_size", "128"]
    return images_to_tfrecord.main([*argv, "--num_shards", "1", *extra])


def _counts(output: Path) -> dict:
    return json.loads((output / "dataset.json").read_text())["counts"]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> tuple[Path, Path]:
    """``(images, dataset)``: the small tree built with the defaults (published at 0.5)."""
    root = tmp_path_factory.mktemp("small")
    images = _small_tree(root / "images")
    assert _build(images, root / "dataset", "--max_bad_fraction", "0.5") == 0
    return images, root / "dataset"


@pytest.mark.slow
def test_the_summary_and_dataset_json_count_upscaled_and_too_small_images(
    small_dataset, tmp_path, capsys
):
    images, output = small_dataset
    manifest = json.loads((output / "dataset.json").read_text())
    assert manifest["counts"]["upscaled"] == 5 and manifest["counts"]["too_small"] == 1
    # The defaults are recorded with the dataset: a demanding user's choice, visible later.
    assert manifest["options"]["small_images"] == "reject"
    assert manifest["options"]["min_source_side"] == 32
    assert _build(images, tmp_path / "again", "--max_bad_fraction", "0.5") == 0
    out = capsys.readouterr().out
    assert "upscaled: 5 images stored larger than the source" in out
    assert "too small: 1 image with a shorter side below --min_source_side rejected" in out
    output2 = tmp_path / "dataset2"
    assert _build(images, output2, "--json", "--small_images", "upscale") == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["upscaled"] == 6 and "too_small" not in summary["rejected_by_reason"]
    assert summary["counts"]["upscaled"] == 6 and summary["counts"]["too_small"] == 0
    assert json.loads((output2 / "dataset.json").read_text())["options"]["small_images"] == (
        "upscale"
    )
    assert _build(images, tmp_path / "kept", "--small_images", "keep") == 0
    assert _counts(tmp_path / "kept")["upscaled"] == 5  # the icon is kept at 16 px: not counted


def test_a_resumed_build_counts_the_examples_of_shards_done_before(tmp_path, capsys):
    images = _small_tree(tmp_path / "images")
    output = tmp_path / "dataset"
    assert _build(images, output, "--max_bad_fraction", "0") == 1  # refused: the icon
    assert not (output / "dataset.json").exists()
    capsys.readouterr()
    assert _build(images, output, "--resume", "--max_bad_fraction", "0.5", "--json") == 0
    summary = json.loads(capsys.readouterr().out)
    assert _counts(output)["upscaled"] == 5 and _counts(output)["too_small"] == 1
    assert summary["upscaled"] == 5
    assert summary["metrics"].get("upscaled", 0) == 0  # the done shard's examples: not prepared


def test_a_base_build_counts_the_examples_it_reused(small_dataset, tmp_path, capsys):
    images, base = small_dataset
    grown = tmp_path / "images"
    shutil.copytree(images, grown)
    (grown / "b" / "small_new.png").write_bytes(_png(90, 60))
    output = tmp_path / "dataset"
    capsys.readouterr()
    status = _build(grown, output, "--base", str(base), "--max_bad_fraction", "0.5", "--json")
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((output / "dataset.json").read_text())
    assert manifest["lineage"]["reused"] == 6 and manifest["lineage"]["prepared"] == 1
    assert manifest["counts"]["upscaled"] == 6 and summary["upscaled"] == 6
    assert manifest["counts"]["too_small"] == 1


def test_the_report_shows_the_counts_and_the_rule(small_dataset, tmp_path):
    _, dataset = small_dataset
    report = gather(str(dataset), per_class=2)
    assert report.stats["counts"]["upscaled"] == 5 and report.stats["counts"]["too_small"] == 1
    html = render_html(report)
    assert '<dd data-count="upscaled">5</dd>' in html
    assert '<dd data-count="too_small">1</dd>' in html
    assert "(--small_images reject, --min_source_side 32)" in html
    assert inspect_main([str(dataset), "--out", str(tmp_path / "report")]) == 0


def test_a_dataset_without_the_counts_stays_readable(small_dataset, tmp_path):
    """Datasets made before the counts were recorded: inspect counts from the catalog and the
    rejected report; diff and the manifest read them as they are."""
    _, dataset = small_dataset
    old = tmp_path / "old"
    shutil.copytree(dataset, old)
    manifest = json.loads((old / "dataset.json").read_text())
    del manifest["counts"]["upscaled"], manifest["counts"]["too_small"]
    for option in ("small_images", "min_source_side"):
        del manifest["options"][option]
    (old / "dataset.json").write_text(json.dumps(manifest))
    parsed = load_manifest(old)
    assert parsed.counts.upscaled is None and "upscaled" not in parsed.to_dict()["counts"]
    report = gather(str(old), per_class=1)
    assert report.stats["counts"]["upscaled"] == 5 and report.stats["counts"]["too_small"] == 1
    assert "rejected as too small." in render_html(report)  # no rule recorded: none shown
    diff = diff_catalogs(load_catalog(str(old)), load_catalog(str(dataset)))
    assert diff.totals["added"] == diff.totals["removed"] == diff.totals["changed"] == 0
    # Unrecorded is not the same as recorded: builds before the flag upscaled every source.
    assert "small_images None -> reject" in diff.image_option_changes
