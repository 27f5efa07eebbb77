"""Pure-function tests for beam_pipelines.image.prepare: every format, every bad input, the conversions."""

from __future__ import annotations

import io
import pickle
import tracemalloc

import numpy as np
import pytest
from PIL import Image

from beam_pipelines.image.prepare import (
    REASONS,
    ImageOptions,
    RejectedImage,
    encode_image,
    open_image,
    prepare_image,
    resize_and_crop,
    sniff_format,
)
from tests.fixtures.images import (
    encode,
    exif_rotated_jpeg,
    jpeg_bomb_bytes,
    large_photo_jpeg,
    make_bad_files,
    make_format_samples,
    png_bomb_bytes,
)

SMALL = ImageOptions(image_size=32, encoding="png")  # PNG output: exact pixels to check


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


@pytest.fixture(scope="module")
def formats() -> dict[str, bytes]:
    return make_format_samples((48, 40))


EXPECTED_SOURCE_FORMAT = {
    "jpeg_baseline": "JPEG",
    "jpeg_progressive": "JPEG",
    "jpeg_grayscale": "JPEG",
    "jpeg_cmyk": "JPEG",
    "png_rgb": "PNG",
    "png_palette": "PNG",
    "png_alpha": "PNG",
    "png_16bit_gray": "PNG",
    "png_16bit_rgb": "PNG",
    "webp": "WEBP",
    "bmp": "BMP",
    "gif_animated": "GIF",
    "tiff": "TIFF",
    "png_named_jpeg": "PNG",
}


@pytest.mark.parametrize("case", sorted(EXPECTED_SOURCE_FORMAT))
def test_every_still_format_becomes_rgb_with_shorter_side_resized(formats, case):
    prepared = prepare_image(formats[case], ImageOptions(image_size=32))
    assert prepared.source_format == EXPECTED_SOURCE_FORMAT[case]
    assert sniff_format(formats[case]) == EXPECTED_SOURCE_FORMAT[case]
    assert (prepared.width, prepared.height, prepared.channels) == (38, 32, 3)
    assert prepared.format == "JPEG"
    stored = Image.open(io.BytesIO(prepared.encoded))
    assert (stored.format, stored.mode, stored.size) == ("JPEG", "RGB", (38, 32))


@pytest.mark.parametrize(
    "case", ["jpeg_progressive", "jpeg_cmyk", "png_palette", "webp", "bmp", "tiff"]
)
def test_colour_formats_match_the_baseline_colours(formats, case):
    reference = _pixels(prepare_image(formats["png_rgb"], SMALL).encoded).mean(axis=(0, 1))
    got = _pixels(prepare_image(formats[case], SMALL).encoded).mean(axis=(0, 1))
    # Lossy sources (JPEG, WebP, CMYK, palette quantisation) stay within a few levels.
    assert np.abs(got - reference).max() < 6, (case, got, reference)


def test_grayscale_jpeg_becomes_three_equal_channels(formats):
    pixels = _pixels(prepare_image(formats["jpeg_grayscale"], SMALL).encoded)
    assert np.array_equal(pixels[..., 0], pixels[..., 1])
    assert np.array_equal(pixels[..., 1], pixels[..., 2])


def test_png_named_jpeg_is_decoded_as_png(tmp_path, formats):
    data = formats["png_named_jpeg"]
    path = tmp_path / "n01739381_1309.JPEG"
    path.write_bytes(data)
    assert sniff_format(path.read_bytes()) == "PNG"
    assert prepare_image(path.read_bytes(), SMALL).source_format == "PNG"


def test_sixteen_bit_grayscale_is_scaled_not_clipped():
    values = np.array([[0, 1000, 32768, 65535]], np.uint16).repeat(4, axis=0)
    data = encode(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    image = open_image(data, 10**6)
    from beam_pipelines.image.prepare import decode_rgb

    rgb = np.asarray(decode_rgb(image, min_side=1)).astype(int)
    # v >> 8: 1000 -> 3 and 32768 -> 128; clipping would give 255 for both.
    assert rgb[0, :, 0].tolist() == [0, 3, 128, 255]


def test_sixteen_bit_rgb_is_scaled(formats):
    image = open_image(formats["png_16bit_rgb"], 10**6)
    from beam_pipelines.image.prepare import decode_rgb

    rgb = np.asarray(decode_rgb(image, min_side=1)).astype(int)
    assert rgb[:, :, 1].min() == rgb[:, :, 1].max() == 40000 >> 8
    assert rgb[:, :, 2].min() == rgb[:, :, 2].max() == 1000 >> 8


@pytest.mark.parametrize(("background", "expected"), [((255, 255, 255), 255), ((0, 0, 0), 0)])
def test_alpha_is_composited_on_the_background(background, expected):
    rgba = np.zeros((40, 40, 4), np.uint8)
    rgba[..., 0] = 200  # red, fully transparent on the left half, opaque on the right
    rgba[:, 20:, 3] = 255
    data = encode(Image.fromarray(rgba, "RGBA"), "PNG")
    options = ImageOptions(image_size=40, encoding="png", background=background)
    pixels = _pixels(prepare_image(data, options).encoded)
    assert pixels[:, :15].tolist() == np.full((40, 15, 3), expected).tolist()
    assert pixels[:, 25:].tolist() == np.tile([200, 0, 0], (40, 15, 1)).tolist()


def test_palette_transparency_is_composited():
    image = Image.new("P", (40, 40), 0)
    image.putpalette([0, 0, 0, 10, 200, 10] + [0] * 762)
    image.paste(1, (20, 0, 40, 40))
    data = encode(image, "PNG", transparency=0)
    pixels = _pixels(prepare_image(data, SMALL).encoded)
    assert pixels[:, :10].min() == 255  # transparent index -> white, not black
    assert np.abs(pixels[:, 25:] - [10, 200, 10]).max() <= 2


@pytest.mark.parametrize(
    ("cmyk", "rgb"),
    [
        ((0, 255, 255, 0), (255, 0, 0)),
        ((255, 0, 255, 0), (0, 255, 0)),
        ((0, 0, 0, 128), (127, 127, 127)),
        ((128, 0, 0, 128), (63, 127, 127)),  # multiplicative: (255-C)(255-K)/255
    ],
)
def test_adobe_inverted_cmyk_jpeg_is_faithful(cmyk, rgb):
    data = encode(Image.new("CMYK", (32, 32), cmyk), "JPEG", quality=95)
    source = Image.open(io.BytesIO(data))
    # Pillow writes CMYK JPEGs the way Photoshop does: an Adobe marker and inverted samples.
    assert source.mode == "CMYK" and "adobe" in source.info
    pixels = _pixels(prepare_image(data, SMALL).encoded)
    assert np.abs(pixels.mean(axis=(0, 1)) - rgb).max() < 4


def test_cmyk_with_icc_profile_goes_through_the_profile():
    from PIL import ImageCms

    # An sRGB profile on a CMYK image is invalid; the code must fall back to the formula.
    bogus = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    data = encode(Image.new("CMYK", (32, 32), (0, 255, 255, 0)), "JPEG", icc_profile=bogus)
    pixels = _pixels(prepare_image(data, SMALL).encoded)
    assert np.abs(pixels.mean(axis=(0, 1)) - (255, 0, 0)).max() < 4


def test_gif_contributes_its_first_frame(formats):
    pixels = _pixels(prepare_image(formats["gif_animated"], SMALL).encoded)
    assert np.abs(pixels.mean(axis=(0, 1)) - (255, 0, 0)).max() < 3


def test_exif_orientation_moves_the_pixels():
    # Stored 64x32: red left, blue right. Orientation 6 displays 32x64: red top, blue bottom.
    data = exif_rotated_jpeg((64, 32), orientation=6)
    prepared = prepare_image(data, ImageOptions(image_size=32, encoding="png"))
    assert (prepared.width, prepared.height) == (32, 64)
    pixels = _pixels(prepared.encoded)
    top, bottom = pixels[4:24].mean(axis=(0, 1)), pixels[40:60].mean(axis=(0, 1))
    assert top[0] > 200 and top[2] < 50, top
    assert bottom[2] > 200 and bottom[0] < 50, bottom
    stored = Image.open(io.BytesIO(prepared.encoded))
    assert stored.getexif().get(0x0112) is None


def test_twelve_megapixel_jpeg_is_decoded_downscaled_by_draft():
    data = large_photo_jpeg((4000, 3000))
    prepared = prepare_image(data, ImageOptions(image_size=256, encoding="png"))
    assert prepared.source_size == (4000, 3000)
    # draft picks the largest DCT scale (1/8 here) that keeps both sides >= 256.
    assert prepared.decoded_size == (500, 375)
    assert (prepared.width, prepared.height) == (341, 256)
    # The same result without draft would need the full 12 MP decode; the pixels must agree.
    full = Image.open(io.BytesIO(data)).convert("RGB").resize((341, 256), Image.Resampling.BICUBIC)
    got = _pixels(prepared.encoded)
    assert np.abs(got - np.asarray(full).astype(int)).mean() < 6


def test_draft_keeps_the_requested_size_reachable():
    data = large_photo_jpeg((1600, 1200))
    prepared = prepare_image(data, ImageOptions(image_size=256))
    assert min(prepared.decoded_size) >= 256
    assert prepared.decoded_size == (400, 300)


@pytest.mark.parametrize(
    ("size", "crop", "expected"),
    [
        ((500, 375), "none", (341, 256)),
        ((375, 500), "none", (256, 341)),
        ((500, 375), "center", (256, 256)),
        ((100, 50), "none", (512, 256)),  # small images are upscaled to the same shorter side
    ],
)
def test_resize_and_crop_sizes(size, crop, expected):
    image = Image.new("RGB", size, (10, 20, 30))
    assert resize_and_crop(image, image_size=256, crop=crop).size == expected


def test_center_crop_keeps_the_middle():
    array = np.zeros((40, 120, 3), np.uint8)
    array[:, 40:80] = 255  # a white middle third
    out = resize_and_crop(Image.fromarray(array), image_size=40, crop="center")
    pixels = np.asarray(out).astype(int)
    assert pixels[:, 3:37].min() > 240


def test_raw_encoding_is_uint8_hwc():
    options = ImageOptions(image_size=16, crop="center", encoding="raw")
    prepared = prepare_image(encode(Image.new("RGB", (40, 30), (1, 2, 3)), "PNG"), options)
    assert prepared.format == "RAW"
    assert prepared.encoded == bytes([1, 2, 3]) * (16 * 16)


def test_encoders_are_deterministic(formats):
    image = Image.open(io.BytesIO(formats["png_rgb"])).convert("RGB")
    for encoding in ("jpeg", "png", "raw"):
        assert encode_image(image, encoding=encoding) == encode_image(image, encoding=encoding)


BAD_REASONS = {
    "empty_file": "empty_file",
    "not_an_image": "not_an_image",
    "not_an_image_text": "not_an_image",
    "truncated": "truncated",
    "truncated_png": "truncated",
    "too_many_pixels": "too_many_pixels",
}


@pytest.mark.parametrize("case", sorted(BAD_REASONS))
def test_bad_inputs_are_rejected_with_a_stable_reason(case):
    with pytest.raises(RejectedImage) as info:
        prepare_image(make_bad_files()[case], ImageOptions(image_size=32))
    assert info.value.reason == BAD_REASONS[case]
    assert info.value.reason in REASONS
    assert info.value.detail


def test_html_error_page_detail_names_what_was_found():
    with pytest.raises(RejectedImage, match="DOCTYPE html"):
        prepare_image(make_bad_files()["not_an_image"], SMALL)


def test_header_cut_short_is_truncated():
    data = encode(Image.new("RGB", (32, 32)), "PNG")[:20]
    with pytest.raises(RejectedImage) as info:
        prepare_image(data, SMALL)
    assert info.value.reason == "truncated"


@pytest.mark.parametrize(
    "bomb",
    [
        lambda: png_bomb_bytes(100_000, 100_000),
        lambda: jpeg_bomb_bytes(60_000, 60_000),
        lambda: png_bomb_bytes(5_000, 4_000),  # below Pillow's own limit, above max_pixels
    ],
)
def test_decompression_bombs_are_rejected_from_the_header_with_bounded_memory(bomb):
    data = bomb()
    tracemalloc.start()
    try:
        with pytest.raises(RejectedImage) as info:
            prepare_image(data, ImageOptions(image_size=32, max_pixels=10_000_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.reason == "too_many_pixels"
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes: the pixels were allocated"


def test_max_pixels_is_the_limit():
    data = encode(Image.new("RGB", (40, 30)), "PNG")
    prepare_image(data, ImageOptions(image_size=8, max_pixels=1200))
    with pytest.raises(RejectedImage, match="40x30 = 1200 pixels, more than --max_pixels 1199"):
        prepare_image(data, ImageOptions(image_size=8, max_pixels=1199))


def test_rejected_image_pickles_with_its_reason():
    error = pickle.loads(pickle.dumps(RejectedImage("truncated", "cut at 10 bytes")))
    assert (error.reason, error.detail) == ("truncated", "cut at 10 bytes")
    with pytest.raises(ValueError, match="unknown rejection reason 'oops'"):
        RejectedImage("oops", "x")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_size": 0}, "image_size must be an int in"),
        ({"crop": "top"}, "crop must be one of"),
        ({"encoding": "gif"}, "encoding must be one of"),
        ({"encoding": "raw"}, "requires crop 'center'"),
        ({"jpeg_quality": 101}, "jpeg_quality must be an int in"),
        ({"max_pixels": 0}, "max_pixels must be a positive int"),
        ({"background": (0, 0, 300)}, "background must be an"),
    ],
)
def test_image_options_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageOptions(**kwargs)
