"""Upscaling is a choice the user sees: sources below --min_source_side are rejected
(``too_small``, the default), kept at their own size or upscaled (--small_images), and every
example stored larger than its source is counted in the run's summary."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from beam_pipelines import images_to_tfrecord
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import RejectedImage, prepare_image
from tests.fixtures.images import encode, make_image_tree


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


def test_the_summary_counts_upscaled_and_too_small_images(tmp_path, capsys):
    images = tmp_path / "images"
    make_image_tree(images, {"a": 3, "b": 2}, size=(64, 48))  # below --image_size 128
    (images / "a" / "icon.png").write_bytes(_png(16, 16))
    (images / "b" / "large.png").write_bytes(_png(300, 200))
    output = tmp_path / "dataset"
    argv = ["--input", str(images), "--output", str(output), "--image_size", "128"]
    status = images_to_tfrecord.main([*argv, "--num_shards", "1", "--max_bad_fraction", "0.5"])
    assert status == 0
    out = capsys.readouterr().out
    assert "upscaled: 5 images stored larger than the source" in out
    assert "too small: 1 image with a shorter side below --min_source_side rejected" in out
    output2 = tmp_path / "dataset2"
    argv = ["--input", str(images), "--output", str(output2), "--image_size", "128", "--json"]
    status = images_to_tfrecord.main([*argv, "--num_shards", "1", "--small_images", "upscale"])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["upscaled"] == 6 and "too_small" not in summary["rejected_by_reason"]
