"""The pipeline over real-world odd files: it publishes, the accounting holds, every bad file has
its precise reason, colour and bit depth are counted; a MemoryError in the image step is a
rejection; a failure of the job itself exits 3, apart from the bad-fraction refusal (1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_pipelines import images_to_tfrecord
from tests.fixtures.icc import matrix_trc_profile
from tests.fixtures.images import make_image_tree
from tests.fixtures.odd_images import (
    bmp_with_field,
    excluded_format_files,
    format_zoo,
    png16,
    png_of_size,
    png_with_text_bomb,
    tiff_with_ifd_past_end,
    with_icc,
    zero_png,
)
from tfrecord_io.source import load_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TWELVE_BIT = ((np.arange(48 * 40).reshape(40, 48) * 2) % 4096).astype(np.uint16)

# file name -> reason, for every bad file of the tree
BAD = {
    "line_1x20000.png": "extreme_aspect_ratio",
    "line_1x300.png": "extreme_aspect_ratio",
    "strip_798x20.png": "extreme_aspect_ratio",
    "drawing.eps": "unsupported_format",
    "photo.heic": "unsupported_format",
    "bmp_7bit.bmp": "unsupported_feature",
    "bad_offsets.tif": "corrupt_header",
    "text_bomb.png": "decompression_bomb",
}
EXTREME = ("line_1x20000.png", "line_1x300.png", "strip_798x20.png")


def _build_tree(root: Path) -> dict[str, int]:
    make_image_tree(root, {"a": 4, "b": 4}, size=(48, 40))
    zoo = format_zoo()
    odd = {
        "a/adobe_rgb.png": with_icc(
            Image.fromarray(np.full((40, 48, 3), (0, 200, 0), np.uint8)),
            "PNG",
            matrix_trc_profile(),
        ),
        "a/twelve_bit.png": png16(TWELVE_BIT, sbit=12),
        "a/texture.tga": zoo["tga"][0],
        "a/layers.psd": zoo["psd"][0],
        "b/line_1x20000.png": png_of_size(1, 20_000),
        "b/line_1x300.png": png_of_size(1, 300, colour=(9, 9, 9)),
        "b/strip_798x20.png": png_of_size(798, 20),
        "b/drawing.eps": excluded_format_files()["eps"][0],
        "b/photo.heic": excluded_format_files()["heic"][0],
        "b/bmp_7bit.bmp": bmp_with_field(28, 7),
        "b/bad_offsets.tif": tiff_with_ifd_past_end(),
        "b/text_bomb.png": png_with_text_bomb("zTXt"),
    }
    for name, data in odd.items():
        (root / name).write_bytes(data)
    return {"good": 8 + 4, "bad": len(BAD)}


def _rejected(output: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (output / "rejected.jsonl").read_text().splitlines()]
    return {Path(row["uri"]).name: row for row in rows}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("real_world") / "images"
    return root, _build_tree(root)


def test_real_world_files_publish_with_precise_reasons(tree, tmp_path):
    images, expected = tree
    output = tmp_path / "dataset"
    summary = images_to_tfrecord.run(
        [
            "--input", str(images), "--output", str(output), "--image_size", "32",
            "--num_shards", "1", "--high_bit_depth", "stretch", "--max_bad_fraction", "0.5",
        ]
    )  # fmt: skip
    assert summary.published
    counts = summary.manifest.counts
    assert (counts.written, counts.rejected, counts.duplicates) == (expected["good"], len(BAD), 0)
    assert counts.input == counts.written + counts.rejected + counts.duplicates
    rejected = _rejected(output)
    assert {name: row["reason"] for name, row in rejected.items()} == BAD
    assert rejected["drawing.eps"]["detail"].startswith("EPS file: not accepted by default")
    assert rejected["photo.heic"]["detail"].startswith("HEIF file: ")
    assert "1x20000" in rejected["line_1x20000.png"]["detail"]
    metrics = summary.metrics
    assert metrics["icc_converted"] == 1
    assert metrics["high_bit_depth_stretch_sbit"] == 1
    assert metrics["source_format_TGA"] == metrics["source_format_PSD"] == 1
    assert metrics["rejected_extreme_aspect_ratio"] == 3
    manifest = load_manifest(output)
    assert manifest.image.color_space == "sRGB"
    raw = json.loads((output / "dataset.json").read_text(encoding="utf-8"))
    assert raw["image"]["color_space"] == "sRGB"
    assert raw["options"]["high_bit_depth"] == "stretch"
    assert raw["options"]["max_aspect_ratio"] == 10
    assert "TGA" in raw["options"]["accepted_formats"]


def test_out_of_bounds_crop_writes_the_extreme_files(tree, tmp_path):
    images, expected = tree
    output = tmp_path / "dataset"
    summary = images_to_tfrecord.run(
        [
            "--input", str(images), "--output", str(output), "--image_size", "32",
            "--num_shards", "1", "--out_of_bounds", "crop", "--accepted_formats", "default,-TGA",
            "--max_bad_fraction", "0.5", "--small_images", "upscale",
        ]
    )  # fmt: skip
    assert summary.published
    counts = summary.manifest.counts
    assert counts.written == expected["good"] - 1 + len(EXTREME)
    assert counts.input == counts.written + counts.rejected + counts.duplicates
    assert summary.metrics["cropped_out_of_bounds"] == len(EXTREME)
    rejected = _rejected(output)
    assert not set(EXTREME) & set(rejected)
    assert rejected["texture.tga"]["reason"] == "unsupported_format"


_LIMITED_RUN = textwrap.dedent(
    """
    import resource, sys
    from beam_pipelines import images_to_tfrecord
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    status = images_to_tfrecord.main(sys.argv[2:])
    with open("/proc/self/status") as proc:
        peak = [int(line.split()[1]) for line in proc if line.startswith("VmPeak")][0]
    print("VMPEAK", peak * 1024)
    sys.exit(status)
    """
)


def _limited_run(limit: int, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _LIMITED_RUN, str(limit), *flags],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


def test_memory_error_in_the_image_step_is_a_rejection_and_the_job_publishes(tmp_path):
    images = tmp_path / "images"
    make_image_tree(images, {"a": 3, "b": 3}, size=(48, 40))
    flags = ["--input", str(images), "--image_size", "32", "--num_shards", "1"]
    flags += ["--max_pixels", "1000000000", "--max_bad_fraction", "0.5"]
    # The job's own address-space peak, measured on the same images without the big one...
    first = _limited_run(0, *flags, "--output", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    peak = int(first.stdout.split("VMPEAK")[-1])
    # ...then 600 MB more: far less than the 3.6 GB that 30000x30000 RGB(X) pixels need (the
    # image step runs before the job's own peak, so its headroom is larger than 600 MB).
    (images / "b" / "huge.png").write_bytes(zero_png(30_000, 30_000))
    output = tmp_path / "dataset"
    run = _limited_run(peak + 600 * 2**20, *flags, "--output", str(output))
    assert run.returncode == 0, run.stderr[-3000:]
    rejected = _rejected(output)
    assert list(rejected) == ["huge.png"]
    # The decode worker (--decode_memory_mb) ran out of room, not the job.
    assert rejected["huge.png"]["reason"] == "over_budget"
    assert rejected["huge.png"]["detail"].startswith("MemoryError")
    manifest = load_manifest(output)
    assert (manifest.counts.written, manifest.counts.rejected, manifest.counts.input) == (6, 1, 7)


def test_a_failure_of_the_job_itself_exits_3_not_1(tmp_path, capsys):
    # A bad listing line is a rejection now (test_listings); a listing that cannot be read at
    # all (a directory by the listing's name) fails the job itself.
    make_image_tree(tmp_path / "images", {"a": 2}, size=(32, 32))
    listing = tmp_path / "listing.jsonl"
    listing.mkdir()
    output = tmp_path / "dataset"
    status = images_to_tfrecord.main(["--input", str(listing), "--output", str(output)])
    assert status == images_to_tfrecord.JOB_FAILED == 3
    err = capsys.readouterr().err
    assert "the pipeline failed" in err and "IsADirectoryError" in err
    assert "nothing was published" in err
    assert not (output / "dataset.json").exists()
