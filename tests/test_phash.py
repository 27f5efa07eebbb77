"""The 64-bit DCT perceptual hash: invariances, the mirror rule, and the pipeline's hook."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from beam_pipelines.image.phash import (
    SAMPLE,
    luma_grid_of,
    luma_sample,
    output_sample,
    perceptual_hash,
    perceptual_hashes,
)
from beam_pipelines.image.prepare import ImageOptions, prepare_image
from beam_pipelines.samples import scene_rgb
from catalog.phash import (
    FLIP_MASK,
    GRID,
    flip_hash,
    hamming,
    hamming_many,
    luma_grid,
    phash,
    phash_of_grid,
    phashes_of_samples,
)


def _scene(seed: int, size=(320, 240)) -> np.ndarray:
    return scene_rgb(size, seed=seed)


def _jpeg(pixels: np.ndarray, quality: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


def test_hash_is_a_deterministic_unsigned_64_bit_int():
    value = phash(_scene(1))
    assert isinstance(value, int) and 0 <= value < 1 << 64
    assert phash(_scene(1)) == value
    assert phash(_scene(2)) != value


def test_mirror_bits_are_the_odd_columns():
    # Bit 8u + v holds coefficient (u, v); mirroring negates odd v, i.e. odd bit positions.
    assert FLIP_MASK == 0xAAAA_AAAA_AAAA_AAAA
    assert flip_hash(flip_hash(12345)) == 12345


@pytest.mark.parametrize("seed", range(5))
def test_mirrored_image_hash_is_the_flip_of_the_hash(seed):
    pixels = _scene(seed)
    mirrored = np.ascontiguousarray(pixels[:, ::-1])
    assert hamming(phash(mirrored), flip_hash(phash(pixels))) <= 1


def test_brightness_shift_and_contrast_do_not_change_the_hash():
    pixels = _scene(3).astype(np.float64) * 0.6 + 30  # room to shift without clipping
    base = phash(pixels)
    assert phash(pixels + 40) == base
    assert phash((pixels - 128) * 1.3 + 128) == base


def test_distinct_scenes_are_far_apart():
    hashes = np.array([phash(_scene(s)) for s in range(30)], dtype=np.uint64)
    distances = hamming_many(hashes[:, None], hashes[None, :])
    off_diagonal = distances[~np.eye(30, dtype=bool)]
    assert off_diagonal.min() > 12, off_diagonal.min()


def test_grid_accepts_luma_and_rgb_and_rejects_other_shapes():
    pixels = _scene(4)
    luma = pixels.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    assert np.allclose(luma_grid(pixels), luma_grid(luma), atol=1e-3)
    assert luma_grid(pixels).shape == (GRID, GRID)
    with pytest.raises(ValueError, match=r"\(H, W\) or \(H, W, 3\)"):
        luma_grid(np.zeros((4, 4, 4)))
    with pytest.raises(ValueError, match="empty"):
        luma_grid(np.zeros((0, 5)))
    with pytest.raises(ValueError, match=r"\(32, 32\)"):
        phash_of_grid(np.zeros((8, 8)))


def test_pipeline_sample_hash_is_close_to_the_exact_area_hash():
    distances = []
    for seed in range(8):
        image = Image.fromarray(_scene(seed, (341, 256)))
        distances.append(hamming(perceptual_hash(image), phash(np.asarray(image))))
        assert np.abs(luma_grid_of(image) - luma_grid(np.asarray(image))).mean() < 12
    assert np.mean(distances) <= 3.5 and max(distances) <= 7, distances


@pytest.mark.parametrize("size", [(64, 64), (100, 80), (341, 256), (256, 384), (40, 30)])
def test_output_sample_box_averages_luma_after_a_whole_factor_reduction(size):
    # An image whose shorter side is at least twice SAMPLE is first averaged by the one whole
    # factor that keeps that side at least SAMPLE (341x256 -> 85x64); the box filter runs on
    # luma of that, then the box filter to 64x64 on the one band.
    image = Image.fromarray(_scene(7, size))
    factor = max(1, min(size) // SAMPLE)
    reduced = image.reduce(factor) if factor > 1 else image
    if factor > 1:
        assert min(reduced.size) >= SAMPLE and min(reduced.size) < 2 * SAMPLE
    expected = reduced.convert("L").resize((SAMPLE, SAMPLE), Image.Resampling.BOX).tobytes()
    assert output_sample(image) == expected
    assert len(expected) == SAMPLE * SAMPLE


def test_many_samples_hash_as_each_alone():
    images = [Image.fromarray(_scene(seed, (300 + seed, 200))) for seed in range(5)]
    samples = [luma_sample(image) for image in images]
    assert all(len(s) == SAMPLE * SAMPLE for s in samples)
    together = perceptual_hashes(samples)
    assert together == [perceptual_hash(image) for image in images]
    assert together == [phash_of_grid(luma_grid_of(image)) for image in images]
    assert perceptual_hashes([]) == []
    with pytest.raises(ValueError, match=r"\(K, n >= 32"):
        phashes_of_samples(np.zeros((2, 16, 64), np.uint8))


def test_prepare_image_hashes_the_prepared_pixels():
    source = _jpeg(_scene(6, (500, 375)), 90)
    prepared = prepare_image(source, ImageOptions())
    decoded = Image.open(io.BytesIO(prepared.encoded))
    assert prepared.phash is not None
    assert hamming(prepared.phash, perceptual_hash(decoded)) <= 2  # stored JPEG, as decoded
    # The same photo re-encoded at another quality and half the size hashes (nearly) the same.
    smaller = Image.fromarray(_scene(6, (500, 375))).resize((250, 188))
    again = prepare_image(_jpeg(np.asarray(smaller), 60), ImageOptions())
    assert hamming(prepared.phash, again.phash) <= 4
