"""Crop-robust window hashes: a cropped copy is found, distinct images are not paired."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_pipelines.image.phash import window_hashes
from beam_pipelines.image.prepare import ImageOptions, prepare_image
from beam_pipelines.samples import scene_rgb
from catalog.near_duplicates import DEFAULT_THRESHOLD
from catalog.phash import FLIP_MASK, hamming
from catalog.window_hashes import (
    WINDOW_SCALES,
    crop_scale,
    window_distance,
    window_hashes_of_samples,
    window_matrix,
)


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _features(image: Image.Image) -> np.ndarray:
    prepared = prepare_image(_png(image), ImageOptions())
    assert prepared.luma_sample is not None
    hashes = window_hashes([prepared.luma_sample])[0]
    assert int(hashes[0]) == prepared.phash  # the whole frame is the catalog's phash
    return hashes


def _crop(image: Image.Image, fraction: float) -> Image.Image:
    w, h = image.size
    dx, dy = round(w * fraction / 2), round(h * fraction / 2)
    return image.crop((dx, dy, w - dx, h - dy))


def _scene(seed: int) -> Image.Image:
    return Image.fromarray(scene_rgb((500, 375), seed=seed))


def test_an_8_percent_crop_is_found():
    plain, windows = [], []
    for seed in range(6):
        original = _scene(seed)
        a, b = _features(original), _features(_crop(original, 0.08))
        plain.append(hamming(int(a[0]), int(b[0])))
        windows.append(window_distance(a, b))
        assert window_distance(b, a) == windows[-1]
        assert crop_scale(a, b) in (0.95, 0.9), (seed, crop_scale(a, b))
    assert max(windows) <= DEFAULT_THRESHOLD, windows
    assert sum(d > DEFAULT_THRESHOLD for d in plain) >= 3, plain  # the whole frame misses


def test_a_mirrored_crop_is_found():
    original = _scene(11)
    a, b = _features(original), _features(ImageOps.mirror(_crop(original, 0.1)))
    assert window_distance(a, b) <= DEFAULT_THRESHOLD


def test_distinct_images_are_not_paired():
    rng = np.random.default_rng(0)
    images = [_scene(seed) for seed in range(100, 112)]
    # Texture-heavy and noise images: the hardest for a low-frequency hash.
    images += [Image.fromarray(rng.integers(0, 256, (375, 500, 3), np.uint8)) for _ in range(4)]
    stripes = np.tile((np.arange(500) // 7 % 2 * 255).astype(np.uint8), (375, 1))
    images.append(Image.fromarray(stripes).convert("RGB"))
    features = [_features(image) for image in images]
    close = [
        (i, j, window_distance(features[i], features[j]))
        for i, j in itertools.combinations(range(len(features)), 2)
        if window_distance(features[i], features[j]) <= DEFAULT_THRESHOLD
    ]
    assert close == []


def test_windows_mirror_by_the_flip_mask():
    pixels = scene_rgb((256, 256), seed=3)
    samples = [np.asarray(Image.fromarray(p).convert("L").resize((64, 64), Image.Resampling.BOX))
               for p in (pixels, pixels[:, ::-1])]  # fmt: skip
    plain, mirrored = window_hashes_of_samples(np.stack(samples))
    for w in range(len(WINDOW_SCALES)):
        assert hamming(int(plain[w]) ^ FLIP_MASK, int(mirrored[w])) <= 2


def test_bad_samples_and_scales_are_refused():
    with pytest.raises(ValueError, match=r"\(K, side >= 32"):
        window_hashes_of_samples(np.zeros((2, 64, 48), np.uint8))
    with pytest.raises(ValueError, match="scale must be in"):
        window_matrix(64, 1.2)
    with pytest.raises(ValueError, match="at least 32"):
        window_matrix(16, 1.0)
    assert window_hashes_of_samples(np.zeros((0, 64, 64), np.uint8)).shape == (0, 4)
