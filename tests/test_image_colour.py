"""Colour that survives: embedded ICC profiles to sRGB (checked against plain-numpy colour
maths, not LittleCMS itself), and 10-14-bit data in 16-bit containers."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageCms

from beam_pipelines.image.prepare import ImageOptions, prepare_image
from tests.fixtures.icc import (
    DISPLAY_P3_PRIMARIES,
    gray_gamma_profile,
    matrix_trc_profile,
    reference_to_srgb,
)
from tests.fixtures.images import encode, jpeg_bytes
from tests.fixtures.odd_images import png16, tiff12_packed, tiff16, with_icc

SIZE = 32
EXACT = ImageOptions(image_size=SIZE, encoding="png")  # no resize, lossless: pixels compare


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def _saturated(seed: int = 0) -> np.ndarray:
    """Colours that tell wide gamuts from sRGB: saturated primaries, mid-tones and greys."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    pixels[:8, :8] = (0, 200, 0)
    pixels[:8, 8:16] = (200, 30, 40)
    pixels[8:16, :8] = (128, 128, 128)
    return pixels


def test_adobe_rgb_png_is_converted_to_srgb_like_the_reference():
    source = _saturated()
    prepared = prepare_image(with_icc(Image.fromarray(source), "PNG", matrix_trc_profile()), EXACT)
    got = _pixels(prepared.encoded)
    expected = reference_to_srgb(source).astype(int)
    assert np.abs(got - expected).mean() < 0.5
    assert np.abs(got - expected).max() <= 2
    # Read as if it were sRGB, the same pixels would be visibly off: the test can fail.
    assert np.abs(source.astype(int) - expected).mean() > 8
    assert prepared.events == ("icc_converted",)
    stored = Image.open(io.BytesIO(prepared.encoded))
    assert "icc_profile" not in stored.info  # the stored image is plain sRGB


@pytest.mark.parametrize(
    ("fmt", "save_args"),
    [("JPEG", {"quality": 95}), ("TIFF", {}), ("WEBP", {"lossless": True})],
)
def test_profile_is_read_from_every_container(fmt, save_args):
    source = _saturated(1)
    data = with_icc(Image.fromarray(source), fmt, matrix_trc_profile(), **save_args)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # the file's own pixels
    prepared = prepare_image(data, EXACT)
    got = _pixels(prepared.encoded)
    assert np.abs(got - reference_to_srgb(decoded).astype(int)).mean() < 0.5
    assert prepared.events == ("icc_converted",)


def test_profile_of_a_downscaled_photo_is_applied_to_the_stored_pixels():
    # Converted after the resize (half the pixels at ImageNet sizes); on a smooth photo that
    # differs from converting first by well under a level.
    from tests.fixtures.images import large_photo_jpeg

    photo = Image.open(io.BytesIO(large_photo_jpeg((160, 128), seed=4))).convert("RGB")
    data = with_icc(photo, "PNG", matrix_trc_profile())
    prepared = prepare_image(data, EXACT)
    assert (prepared.width, prepared.height) == (40, 32)
    assert prepared.events == ("icc_converted",)
    got = _pixels(prepared.encoded)
    resized_first = reference_to_srgb(np.asarray(photo.resize((40, 32), Image.Resampling.BICUBIC)))
    assert np.abs(got - resized_first.astype(int)).mean() < 0.5
    converted_first = Image.fromarray(reference_to_srgb(np.asarray(photo))).resize(
        (40, 32), Image.Resampling.BICUBIC
    )
    assert np.abs(got - np.asarray(converted_first).astype(int)).mean() < 1.0
    assert "icc_profile" not in Image.open(io.BytesIO(prepared.encoded)).info


def test_display_p3_profile_is_converted():
    source = _saturated(2)
    icc = matrix_trc_profile(DISPLAY_P3_PRIMARIES, description="Display P3-like, built in a test")
    prepared = prepare_image(with_icc(Image.fromarray(source), "PNG", icc), EXACT)
    expected = reference_to_srgb(source, DISPLAY_P3_PRIMARIES).astype(int)
    assert np.abs(_pixels(prepared.encoded) - expected).mean() < 0.5


def test_grayscale_with_a_linear_gray_profile():
    data = with_icc(Image.new("L", (SIZE, SIZE), 128), "PNG", gray_gamma_profile(1.0))
    prepared = prepare_image(data, EXACT)
    # Linear 128/255 = 0.502 is sRGB 188 (it would stay 128 if the profile were ignored).
    assert np.abs(_pixels(prepared.encoded) - 188).max() <= 1
    assert prepared.events == ("icc_converted",)


def test_rgba_with_a_profile_converts_then_composites():
    source = _saturated(3)
    alpha = np.full((SIZE, SIZE), 255, np.uint8)
    alpha[:, : SIZE // 2] = 0
    rgba = Image.fromarray(np.dstack([source, alpha]), "RGBA")
    options = ImageOptions(image_size=SIZE, encoding="png", background=(0, 0, 0))
    prepared = prepare_image(with_icc(rgba, "PNG", matrix_trc_profile()), options)
    got = _pixels(prepared.encoded)
    assert got[:, : SIZE // 2].max() == 0  # transparent: the background, untouched by the profile
    expected = reference_to_srgb(source).astype(int)[:, SIZE // 2 :]
    assert np.abs(got[:, SIZE // 2 :] - expected).mean() < 0.5


def test_palette_image_with_a_profile_is_converted():
    source = Image.fromarray(_saturated(4)).convert("P", palette=Image.Palette.ADAPTIVE)
    prepared = prepare_image(with_icc(source, "PNG", matrix_trc_profile()), EXACT)
    expected = reference_to_srgb(np.asarray(source.convert("RGB"))).astype(int)
    assert np.abs(_pixels(prepared.encoded) - expected).mean() < 0.5


def test_an_srgb_profile_changes_nothing():
    source = _saturated(5)
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    prepared = prepare_image(with_icc(Image.fromarray(source), "PNG", srgb), EXACT)
    assert np.abs(_pixels(prepared.encoded) - source).max() <= 1
    assert prepared.events == ("icc_converted",)
    assert "icc_profile" not in Image.open(io.BytesIO(prepared.encoded)).info


@pytest.mark.parametrize(
    "icc",
    [b"not a profile at all", gray_gamma_profile(1.0)],  # garbage; a GRAY profile on RGB pixels
)
def test_unusable_profiles_are_ignored_and_counted(icc):
    source = _saturated(6)
    prepared = prepare_image(with_icc(Image.fromarray(source), "PNG", icc), EXACT)
    assert np.array_equal(_pixels(prepared.encoded), source)
    assert prepared.events == ("icc_profile_ignored",)
    assert "icc_profile" not in Image.open(io.BytesIO(prepared.encoded)).info


def test_photos_without_a_profile_are_untouched():
    prepared = prepare_image(jpeg_bytes((64, 48), seed=3), ImageOptions(image_size=48))
    assert prepared.events == ()


# --- High bit depth --------------------------------------------------------------------------

TWELVE_BIT = ((np.arange(64 * 32).reshape(32, 64) * 2) % 4096).astype(np.uint16)
BITS_OPTIONS = {
    policy: ImageOptions(image_size=32, encoding="png", high_bit_depth=policy)
    for policy in ("shift", "stretch")
}


def _stretched(values: np.ndarray, bits: int) -> np.ndarray:
    scale = (1 << bits) - 1
    return (values.astype(np.int64) * 255 + scale // 2) // scale


@pytest.mark.parametrize(
    ("case", "data", "event"),
    [
        ("png", png16(TWELVE_BIT), "high_bit_depth_stretch_max_sample"),
        ("png_sbit", png16(TWELVE_BIT, sbit=12), "high_bit_depth_stretch_sbit"),
        ("tiff", tiff16(TWELVE_BIT), "high_bit_depth_stretch_max_sample"),
        ("tiff_12bit", tiff12_packed(TWELVE_BIT), "high_bit_depth_stretch_bits_per_sample"),
    ],
)
def test_twelve_bits_in_sixteen_shift_is_dark_stretch_fills_the_range(case, data, event):
    shifted = prepare_image(data, BITS_OPTIONS["shift"])
    assert shifted.events == ("high_bit_depth_shift",)
    assert _pixels(shifted.encoded).mean() < 8  # nearly black: the reported problem
    stretched = prepare_image(data, BITS_OPTIONS["stretch"])
    assert stretched.events == (event,)
    got = _pixels(stretched.encoded)[..., 0]
    assert np.array_equal(got, _stretched(TWELVE_BIT, 12)), case


def test_sbit_wins_over_the_largest_sample_for_a_dim_image():
    dim = (TWELVE_BIT // 4).astype(np.uint16)  # at most 1023: max sample alone would say 10 bits
    by_sbit = prepare_image(png16(dim, sbit=12), BITS_OPTIONS["stretch"])
    assert np.array_equal(_pixels(by_sbit.encoded)[..., 0], _stretched(dim, 12))
    by_max = prepare_image(png16(dim), BITS_OPTIONS["stretch"])
    assert by_max.events == ("high_bit_depth_stretch_max_sample",)
    assert np.array_equal(_pixels(by_max.encoded)[..., 0], _stretched(dim, 10))


def test_sbit_contradicted_by_the_samples_falls_back_to_the_largest_sample():
    # The PNG specification scales 12-bit data up to 16 bits and still writes sBIT 12.
    scaled = (TWELVE_BIT.astype(np.uint32) * 65535 // 4095).astype(np.uint16)
    prepared = prepare_image(png16(scaled, sbit=12), BITS_OPTIONS["stretch"])
    assert prepared.events == ("high_bit_depth_stretch_max_sample",)
    assert np.array_equal(_pixels(prepared.encoded)[..., 0], _stretched(scaled, 16))


@pytest.mark.parametrize("container", ["png", "tiff"])
def test_sixteen_bit_rgb_stretch_reads_the_low_bytes(container):
    rgb = np.stack([TWELVE_BIT, TWELVE_BIT // 2, 4095 - TWELVE_BIT], axis=-1).astype(np.uint16)
    data = png16(rgb) if container == "png" else tiff16(rgb)
    shifted = _pixels(prepare_image(data, BITS_OPTIONS["shift"]).encoded)
    assert np.array_equal(shifted, rgb >> 8)
    stretched = prepare_image(data, BITS_OPTIONS["stretch"])
    assert stretched.events == ("high_bit_depth_stretch_max_sample",)
    assert np.array_equal(_pixels(stretched.encoded), _stretched(rgb, 12))


def test_eight_bit_images_have_no_bit_depth_event():
    data = encode(Image.fromarray(_saturated(7)), "PNG")
    assert prepare_image(data, BITS_OPTIONS["stretch"]).events == ()
