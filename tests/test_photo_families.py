"""The benchmarks' generated photo families: deterministic, distinct, and sized like photos."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from beam_pipelines.samples import write_imagenet_like_jpegs
from benchmarks.photo_families import CLASSES, FAMILIES, family_jpeg, write_family


def _kb_at_500x375(data: bytes) -> float:
    width, height = Image.open(io.BytesIO(data)).size
    return len(data) * (500 * 375) / (width * height) / 1024


def test_every_family_is_deterministic_and_seeds_differ() -> None:
    for name in FAMILIES:
        if name == "large":
            continue  # covered below, at its own cost
        assert family_jpeg(name, 3) == family_jpeg(name, 3), name
        assert family_jpeg(name, 3) != family_jpeg(name, 4), name


def test_families_span_the_sizes_of_real_photos() -> None:
    sizes = {
        name: np.mean([_kb_at_500x375(family_jpeg(name, seed)) for seed in range(3)])
        for name in ("smooth", "imagenet_like", "textured", "sensor", "detail")
    }
    assert 50 <= sizes["smooth"] < sizes["textured"] < sizes["sensor"] < sizes["detail"] <= 420
    assert sizes["detail"] >= 2.5 * sizes["smooth"]
    for name, kb in sizes.items():
        assert 50 <= kb <= 420, (name, kb)


def test_large_family_is_0_3_to_12_megapixels() -> None:
    family = FAMILIES["large"]
    pixels = [w * h for w, h in (family.size(seed) for seed in range(200))]
    assert 300_000 * 0.98 <= min(pixels) and max(pixels) <= 12_000_000 * 1.02
    assert min(pixels) < 1_000_000 and max(pixels) > 6_000_000
    data = family_jpeg("large", 1)
    image = Image.open(io.BytesIO(data))
    assert image.size == family.size(1) and image.mode == "RGB"


def test_imagenet_like_family_writes_the_original_benchmark_photos(tmp_path) -> None:
    ours = write_family("imagenet_like", tmp_path / "a", 5)
    before = write_imagenet_like_jpegs(tmp_path / "b", 5)
    assert [p.relative_to(tmp_path / "a") for p in ours] == [
        p.relative_to(tmp_path / "b") for p in before
    ]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(ours, before, strict=True))
    assert {p.parent.name for p in ours} <= set(CLASSES)


def test_unknown_family_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'nope'.*--family"):
        family_jpeg("nope", 0)
