"""Real-world image files through ``prepare_image``: output bounds checked from the header, the
accepted-format list, precise reason codes, and no exception other than a rejection."""

from __future__ import annotations

import io
import random
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from beam_pipelines.image.formats import (
    DEFAULT_ACCEPTED_FORMATS,
    EXCLUDED_FORMATS,
    parse_accepted_formats,
    pillow_formats,
)
from beam_pipelines.image.prepare import (
    REASONS,
    ImageOptions,
    RejectedImage,
    check_output_bounds,
    internal_error,
    prepare_image,
)
from tests.fixtures.images import encode, jpeg_bytes, make_format_samples
from tests.fixtures.odd_images import (
    bmp_with_field,
    excluded_format_files,
    format_zoo,
    png_of_size,
    png_with_text_bomb,
    tiff_with_ifd_past_end,
    tiff_with_strip_past_end,
    unwritable_format_files,
    zoo_rgb,
)

PNG_OUT = ImageOptions(image_size=32, encoding="png")
DEFAULTS = ImageOptions()


def _rejection(data: bytes, options: ImageOptions = DEFAULTS) -> RejectedImage:
    with pytest.raises(RejectedImage) as info:
        prepare_image(data, options)
    assert info.value.reason in REASONS
    return info.value


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


# --- Output bounds, from the header ----------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "ratio"),
    [((1, 20_000), "20000.0"), ((1, 300), "300.0"), ((1, 200), "200.0"), ((798, 20), "39.9")],
)
def test_extreme_aspect_ratios_are_rejected_from_the_header(size, ratio):
    data = png_of_size(*size)
    tracemalloc.start()
    try:
        rejected = _rejection(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rejected.reason == "extreme_aspect_ratio"
    assert f"declares {size[0]}x{size[1]}, an aspect ratio of {ratio}" in rejected.detail
    assert "--max_aspect_ratio 10" in rejected.detail and "--out_of_bounds crop" in rejected.detail
    assert peak < 2 * 1024 * 1024, f"peak {peak} bytes: pixels were allocated"


def test_the_165_byte_line_that_took_the_job_down():
    data = png_of_size(1, 20_000)
    assert len(data) < 200
    assert _rejection(data).reason == "extreme_aspect_ratio"


def test_an_aspect_ratio_at_the_limit_is_stored_whole():
    prepared = prepare_image(
        png_of_size(200, 20), ImageOptions(image_size=32, small_images="upscale")
    )
    assert (prepared.width, prepared.height) == (320, 32)
    assert prepared.events == ("upscaled",)  # 20 px tall, stored 32


def test_out_of_bounds_crop_keeps_the_centre_of_the_longer_side():
    array = np.zeros((20, 798, 3), np.uint8)
    array[:, :299] = (255, 0, 0)
    array[:, 299:499] = (0, 255, 0)  # the centre 200 columns: 10 x the height of 20
    array[:, 499:] = (0, 0, 255)
    options = ImageOptions(image_size=16, encoding="png", out_of_bounds="crop")
    prepared = prepare_image(encode(Image.fromarray(array), "PNG"), options)
    assert (prepared.width, prepared.height) == (160, 16)
    assert prepared.events == ("cropped_out_of_bounds",)
    pixels = _pixels(prepared.encoded)
    assert np.abs(pixels[:, 4:-4] - (0, 255, 0)).max() <= 2


def test_out_of_bounds_crop_of_a_one_pixel_line():
    prepared = prepare_image(
        png_of_size(1, 20_000), ImageOptions(out_of_bounds="crop", small_images="upscale")
    )
    assert (prepared.width, prepared.height) == (256, 2560)
    assert prepared.source_size == (1, 20_000)


def test_output_pixel_bound_rejects_or_crops():
    data = png_of_size(40, 10)  # ratio 4 -> stored 128x32 = 4096 pixels
    options = ImageOptions(image_size=32, max_output_pixels=3200, small_images="upscale")
    rejected = _rejection(data, options)
    assert rejected.reason == "output_too_large"
    assert "stored as 32x128 = 4096 pixels, more than --max_output_pixels 3200" in rejected.detail
    cropped = prepare_image(data, ImageOptions(**{**vars(options), "out_of_bounds": "crop"}))
    assert (cropped.width, cropped.height) == (100, 32)


def test_jpeg_side_limit_is_checked_before_decoding():
    options = ImageOptions(image_size=8000, max_output_pixels=10**9)
    rejected = _rejection(png_of_size(9, 1), options)
    assert rejected.reason == "output_too_large"
    assert "a side longer than JPEG's 65500" in rejected.detail
    # PNG has no such limit: the same header passes the check (nothing is decoded here).
    assert check_output_bounds(9, 1, ImageOptions(**{**vars(options), "encoding": "png"})) is None


def test_center_crop_needs_no_output_bound_but_keeps_the_aspect_check():
    square = ImageOptions(image_size=32, crop="center", encoding="raw")
    assert _rejection(png_of_size(798, 20), square).reason == "extreme_aspect_ratio"
    kept = ImageOptions(
        image_size=32, crop="center", encoding="raw", out_of_bounds="crop", small_images="upscale"
    )
    assert prepare_image(png_of_size(798, 20), kept).width == 32


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_aspect_ratio": 0.5}, "max_aspect_ratio must be a number >= 1"),
        ({"max_output_pixels": 1000}, "raise --max_output_pixels or lower --image_size"),
        ({"out_of_bounds": "shrink"}, "out_of_bounds must be one of"),
        ({"accepted_formats": ("JPG",)}, "accepted_formats must be a non-empty tuple"),
        ({"accepted_formats": ()}, "accepted_formats must be a non-empty tuple"),
        ({"high_bit_depth": "scale"}, "high_bit_depth must be one of"),
    ],
)
def test_new_image_options_name_the_bad_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ImageOptions(**kwargs)


def test_large_images_are_reduced_before_conversion_without_visible_change():
    # 16.4 MP RGBA: reduced (box, premultiplied) before compositing, then resized as usual.
    height, width = 4000, 4100
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    rgba = np.empty((height, width, 4), np.uint8)
    rgba[..., 0] = 255 * x * y
    rgba[..., 1] = 255 * (1 - x)
    rgba[..., 2] = 255 * y
    rgba[..., 3] = 255 * (0.25 + 0.75 * x)
    source = Image.fromarray(rgba, "RGBA")
    data = encode(source, "PNG", compress_level=1)
    del rgba
    prepared = prepare_image(data, ImageOptions(image_size=64, encoding="png"))
    assert (prepared.width, prepared.height) == (66, 64)
    composited = Image.alpha_composite(Image.new("RGBA", source.size, (255,) * 4), source)
    whole = composited.convert("RGB").resize((66, 64), Image.Resampling.BICUBIC)
    assert np.abs(_pixels(prepared.encoded) - np.asarray(whole).astype(int)).mean() < 1.0


# --- Accepted formats ------------------------------------------------------------------------


def test_default_list_is_every_pillow_format_but_the_excluded_ones():
    known = set(pillow_formats())
    assert set(DEFAULT_ACCEPTED_FORMATS) | set(EXCLUDED_FORMATS) == known
    assert not set(DEFAULT_ACCEPTED_FORMATS) & set(EXCLUDED_FORMATS)
    assert DEFAULT_ACCEPTED_FORMATS[-1] == "TGA"  # no magic number: tried last


@pytest.mark.parametrize("case", sorted(format_zoo()))
def test_format_zoo_is_accepted_with_its_pixels(case):
    data, fmt, kind = format_zoo()[case]
    prepared = prepare_image(data, PNG_OUT)
    assert prepared.source_format == fmt
    assert prepared.height == 32
    reference = np.asarray(zoo_rgb().resize((prepared.width, 32))).astype(int)
    got = _pixels(prepared.encoded)
    if kind == "rgb":
        # Lossy and palette formats stay within a few levels of the picture on average.
        assert np.abs(got.mean(axis=(0, 1)) - reference.mean(axis=(0, 1))).max() < 4, case
    elif kind == "gray":
        luma = np.asarray(zoo_rgb().convert("L").resize((prepared.width, 32))).astype(int)
        assert np.abs(got[..., 0].mean() - luma.mean()) < 3, case
        assert np.array_equal(got[..., 0], got[..., 2])
    else:
        assert set(np.unique(got)) <= set(range(256))


@pytest.mark.parametrize("case", sorted(excluded_format_files()))
def test_recognised_formats_that_are_not_accepted_are_named(case):
    data, name = excluded_format_files()[case]
    rejected = _rejection(data, PNG_OUT)
    assert rejected.reason == "unsupported_format"
    assert rejected.detail.startswith(f"{name} file: ")


def test_eps_detail_says_why_and_how_to_accept_it():
    rejected = _rejection(excluded_format_files()["eps"][0], PNG_OUT)
    assert "Ghostscript" in rejected.detail and "--accepted_formats +EPS" in rejected.detail


def _xpm_with_unknown_code(colours: int) -> bytes:
    """A 4x2 XPM, two characters per pixel, whose last row uses a code ('  ') its colour table
    lacks; above 256 colours Pillow decodes it as RGB (a KeyError), else as P (a ValueError)."""
    codes = [chr(97 + i // 26) + chr(97 + i % 26) for i in range(colours)]
    table = "\n".join(f'"{code} c #{i:06x}",' for i, code in enumerate(codes))
    return (
        f'/* XPM */\nstatic char *x[] = {{\n"4 2 {colours} 2",\n{table}\n'
        f'"{codes[0] * 4}",\n"{codes[0]}  {codes[1] * 2}"\n}};\n'
    ).encode()


@pytest.mark.parametrize("colours", [2, 300])
def test_an_xpm_pixel_outside_its_colour_table_is_said_in_words(colours):
    options = ImageOptions(image_size=32, small_images="upscale")  # 4x2: decoded, not too small
    rejected = _rejection(_xpm_with_unknown_code(colours), options)
    assert rejected.reason == "decode_error"
    assert rejected.detail.startswith("XPM: a pixel's code ")
    assert rejected.detail.endswith(" is not in the file's colour table")
    assert "b'" not in rejected.detail and "tuple" not in rejected.detail
    if colours > 256:
        assert "'  '" in rejected.detail  # the code itself, as text


def test_a_plugin_assertion_is_a_corrupt_header_not_an_internal_error():
    """Found by fuzzing: the FTEX plugin asserts its file holds one format; two is a bad
    header, said in words (tests/fuzz_corpus/crash-9a2185bc2a20…)."""
    data = bytearray(unwritable_format_files()["ftex"][0])
    data[20:24] = (2).to_bytes(4, "little")  # the count of formats
    rejected = _rejection(bytes(data), ImageOptions(image_size=32, small_images="upscale"))
    assert rejected.reason == "corrupt_header"
    assert rejected.detail == (
        "FTEX header unreadable: a check in Pillow's FTEX plugin failed (a field it does not "
        "support)"
    )


def test_a_header_field_too_large_for_the_decoder_is_a_corrupt_header():
    """Found by fuzzing: a McIDAS file with 1.5 billion bands makes a line stride that
    overflows the C decoder's argument (OverflowError, tests/fuzz_corpus/crash-6b3b16e8…)."""
    data = bytearray(unwritable_format_files()["mcidas"][0])
    data[52:56] = (1_504_078_485).to_bytes(4, "big")  # word 14: bands
    rejected = _rejection(bytes(data), ImageOptions(image_size=32, small_images="upscale"))
    assert rejected.reason == "corrupt_header"
    assert rejected.detail.startswith(
        "MCIDAS: a header field is too large for Pillow's MCIDAS decoder ("
    )


def test_narrowed_list_rejects_a_format_it_dropped():
    tga = format_zoo()["tga"][0]
    narrowed = ImageOptions(image_size=32, accepted_formats=parse_accepted_formats("-TGA"))
    rejected = _rejection(tga, narrowed)
    assert rejected.reason == "unsupported_format"
    assert rejected.detail.startswith("TGA file: not in --accepted_formats")
    png_only = ImageOptions(image_size=32, accepted_formats=parse_accepted_formats("png"))
    assert _rejection(jpeg_bytes(), png_only).detail.startswith("JPEG file: ")
    assert prepare_image(make_format_samples()["png_rgb"], png_only).source_format == "PNG"


def test_parse_accepted_formats_forms():
    assert parse_accepted_formats("default") == DEFAULT_ACCEPTED_FORMATS
    assert parse_accepted_formats("png, jpeg,PNG") == ("PNG", "JPEG")
    widened = parse_accepted_formats("+EPS,-GIF")
    assert "EPS" in widened and "GIF" not in widened and widened[-1] == "TGA"
    assert parse_accepted_formats("default,+eps,-gif") == widened
    with pytest.raises(ValueError, match="after 'default' every item must be"):
        parse_accepted_formats("default,PNG")
    with pytest.raises(ValueError, match="unknown format 'JPG'"):
        parse_accepted_formats("JPG")
    with pytest.raises(ValueError, match="mixes signed"):
        parse_accepted_formats("PNG,-TGA")
    with pytest.raises(ValueError, match="leaves no format"):
        parse_accepted_formats(",".join(f"-{f}" for f in DEFAULT_ACCEPTED_FORMATS))


def test_html_and_text_are_still_not_images():
    for data in (b"<!DOCTYPE html><html></html>\n", b"just some text\n", bytes(range(256)) * 4):
        assert _rejection(data, PNG_OUT).reason == "not_an_image"


# --- Header and feature problems are not "truncated" -----------------------------------------


@pytest.mark.parametrize(
    ("make", "reason", "detail"),
    [
        (lambda: bmp_with_field(28, 7), "unsupported_feature", "Unsupported BMP pixel depth (7)"),
        (
            lambda: bmp_with_field(30, 9, "<I"),
            "unsupported_feature",
            "Unsupported BMP compression (9)",
        ),
        (
            tiff_with_ifd_past_end,
            "corrupt_header",
            "its first IFD offset 10000000 is past the end of the 908-byte file",
        ),
        (
            tiff_with_strip_past_end,
            "corrupt_header",
            "places pixel data at byte 10000000, past the end of the 908-byte file",
        ),
        (
            lambda: png_with_text_bomb("zTXt"),
            "decompression_bomb",
            "Decompressed data too large",
        ),
        (
            lambda: png_with_text_bomb("iCCP"),
            "decompression_bomb",
            "Decompressed data too large",
        ),
        (
            lambda: png_with_text_bomb("many"),
            "decompression_bomb",
            "Too much memory used in text chunks",
        ),
    ],
)
def test_header_problems_have_their_own_reasons(make, reason, detail):
    data = make()
    tracemalloc.start()
    try:
        rejected = _rejection(data, PNG_OUT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (rejected.reason, detail in rejected.detail) == (reason, True), rejected.detail
    # Bounded by Pillow's limits: MAX_TEXT_CHUNK per chunk, MAX_TEXT_MEMORY over all chunks.
    assert peak < PngImagePlugin.MAX_TEXT_MEMORY + 8 * 1024 * 1024, f"peak {peak} bytes"


def test_files_cut_short_are_still_truncated():
    png = make_format_samples()["png_rgb"]
    tiff = make_format_samples()["tiff"]
    assert _rejection(png[: len(png) // 2], PNG_OUT).reason == "truncated"
    assert _rejection(tiff[: len(tiff) // 2], PNG_OUT).reason == "truncated"
    assert _rejection(png[:20], PNG_OUT).reason == "truncated"


# --- Nothing but a rejection escapes ---------------------------------------------------------


def _fuzzed(seed: int) -> bytes:
    rng = random.Random(seed)
    samples = make_format_samples((24, 20))
    zoo = format_zoo()
    sources = [*samples.values(), *(v[0] for v in zoo.values())]
    data = bytearray(rng.choice(sources))
    for _ in range(rng.randint(1, 8)):
        position = rng.randrange(len(data))
        data[position] = rng.randrange(256)
    if rng.random() < 0.3:
        data = data[: rng.randrange(1, len(data))]
    return bytes(data)


def test_fuzzed_files_end_prepared_or_rejected():
    outcomes: dict[str, int] = {}
    for seed in range(120):
        try:
            prepare_image(_fuzzed(seed), PNG_OUT)
            outcome = "prepared"
        except RejectedImage as rejected:
            assert rejected.reason in REASONS and rejected.detail
            outcome = rejected.reason
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("prepared", 0) > 0 and len(outcomes) > 2, outcomes


def test_internal_error_names_the_type_and_where():
    try:
        {}["missing"]
    except KeyError as e:
        rejected = internal_error(e)
    assert rejected.reason == "internal_error"
    assert rejected.detail.startswith("KeyError: 'missing' (at test_image_inputs.py:")
    assert "test_internal_error_names_the_type_and_where" in rejected.detail


@pytest.mark.slow
def test_memory_error_while_decoding_is_an_internal_error_rejection(tmp_path):
    # A real MemoryError: a 100 MP PNG (allowed by --max_pixels) decoded in a process whose
    # address space leaves no room for its 300 MB of pixels.
    source = tmp_path / "big.png"
    source.write_bytes(png_of_size(10_000, 10_000))
    script = textwrap.dedent(
        f"""
        import resource
        from beam_pipelines.image.prepare import ImageOptions, RejectedImage, prepare_image
        data = open({str(source)!r}, "rb").read()
        with open("/proc/self/status") as status:
            size = [int(l.split()[1]) for l in status if l.startswith("VmSize")][0] * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 150 * 2**20, resource.RLIM_INFINITY))
        try:
            prepare_image(data, ImageOptions(image_size=32))
            print("prepared")
        except RejectedImage as e:
            print(e.reason, "|", e.detail)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    reason, detail = done.stdout.strip().split(" | ", 1)
    assert reason == "internal_error", done.stdout
    assert detail.startswith("MemoryError"), detail
