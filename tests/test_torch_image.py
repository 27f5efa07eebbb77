"""tfrecord_io.torch.image: the PyTorch loader's per-example image step.

Crop windows (inside the image, within the area and aspect ranges, a function of the seed
alone), the eval centre crop against Pillow, the training path against a reference built from
the public window, flips that are exact mirrors, RAW crops and flips, the Pillow path for PNG,
grayscale and CMYK, errors that name what is wrong, and the batch normalisation. Every image is
made here.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

cv2 = pytest.importorskip("cv2", reason="decode_into needs opencv-python-headless")
pytest.importorskip("simplejpeg", reason="decode_into needs simplejpeg")

from tfrecord_io.torch.image import (  # noqa: E402 (after the skips)
    CROP_PADDING,
    DCT_METHODS,
    ENCODINGS,
    MEAN_RGB,
    STDDEV_RGB,
    TURBOJPEG_ENV,
    CropWindow,
    ImageSpec,
    center_crop_window,
    decode_into,
    jpeg_decoder,
    normalize_batch,
    random_crop_window,
)

REPO = Path(__file__).resolve().parents[1]
SIZE = 224
# libjpeg's accurate IDCT and chroma upsampling: what Pillow decodes with.
ACCURATE = {"jpeg_dct_method": "", "jpeg_fast_upsampling": False}


def _photo(seed: int, height: int = 256, width: int = 341) -> np.ndarray:
    """Photo-like uint8 RGB: gradients, a few edges and sensor-like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], -1)
    base[(x // 40 + y // 30 + seed) % 3 == 0] *= 0.5
    noise = rng.normal(0.0, 10.0, (height, width, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _encoded(array: np.ndarray, fmt: str = "JPEG", mode: str | None = None, **options) -> bytes:
    image = Image.fromarray(array)
    if mode is not None:
        image = image.convert(mode)
    buffer = io.BytesIO()
    if fmt == "JPEG":
        options.setdefault("quality", 90)
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _decoded(data: bytes, seed: int | None, spec: ImageSpec) -> np.ndarray:
    out = np.empty((spec.image_size, spec.image_size, 3), np.uint8)
    decode_into(data, out, seed=seed, spec=spec)
    return out


def _mad(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# -- Crop windows -----------------------------------------------------------------------------


# A panorama's crops often do not fit in 10 tries: then the whole image is the window.
@pytest.mark.parametrize(
    "height,width,fallback_share",
    [(256, 341, 0.01), (341, 256, 0.01), (256, 256, 0.01), (120, 700, 0.5)],
)
def test_random_windows_stay_inside_the_image_and_in_the_ranges(
    height: int, width: int, fallback_share: float
) -> None:
    spec = ImageSpec(image_size=SIZE, training=True)
    windows = [random_crop_window(height, width, seed, spec) for seed in range(3000)]
    fallbacks = 0
    for window in windows:
        y, x, h, w, _ = window
        assert 0 <= y and y + h <= height and 0 <= x and x + w <= width and h > 0 and w > 0
        if (h, w) == (height, width):
            fallbacks += 1
            continue
        # w and h are rounded to whole pixels: allow half a pixel each way.
        low = 0.08 * (1 - 0.5 / w) * (1 - 0.5 / h)
        assert low - 1e-9 <= h * w / (height * width) <= 1.0
        assert 3 / 4 * (1 - 0.5 / w) / (1 + 0.5 / h) <= w / h
        assert w / h <= 4 / 3 * (1 + 0.5 / w) / (1 - 0.5 / h)
    assert fallbacks <= fallback_share * len(windows)
    flips = sum(window.flip for window in windows)
    assert abs(flips - len(windows) / 2) < 4 * (len(windows) / 4) ** 0.5
    assert len({(w.y, w.x, w.height, w.width) for w in windows}) > len(windows) // 2


def test_a_window_that_never_fits_falls_back_to_the_whole_image() -> None:
    spec = ImageSpec(image_size=SIZE, training=True)
    # 10 x 1000: no crop of aspect 3/4..4/3 is 8 % of the image.
    for seed in range(50):
        window = random_crop_window(10, 1000, seed, spec)
        assert window[:4] == (0, 0, 10, 1000)


def test_windows_are_a_function_of_the_seed_alone() -> None:
    spec = ImageSpec(image_size=SIZE, training=True)
    assert random_crop_window(256, 341, 7, spec) == random_crop_window(256, 341, 7, spec)
    assert random_crop_window(256, 341, -1, spec) == random_crop_window(256, 341, 2**64 - 1, spec)
    assert random_crop_window(256, 341, np.int64(5), spec) == random_crop_window(256, 341, 5, spec)
    narrow = ImageSpec(image_size=SIZE, training=True, area_range=(0.5, 0.5))
    window = random_crop_window(256, 341, 3, narrow)
    assert abs(window.height * window.width / (256 * 341) - 0.5) < 0.01


def test_center_window_is_the_tensorflow_readers() -> None:
    assert center_crop_window(256, 341, 224) == CropWindow(16, 59, 224, 224, False)
    assert center_crop_window(341, 256, 224) == CropWindow(59, 16, 224, 224, False)
    side = round(128 / (128 + CROP_PADDING) * 300)
    assert center_crop_window(300, 400, 128) == CropWindow(
        (300 - side + 1) // 2, (400 - side + 1) // 2, side, side, False
    )
    assert center_crop_window(1, 1, 224).height == 1


# -- JPEG -------------------------------------------------------------------------------------


def test_same_seed_same_pixels_and_different_seeds_different_crops() -> None:
    data = _encoded(_photo(0))
    spec = ImageSpec(image_size=SIZE, training=True)
    first = _decoded(data, 11, spec)
    assert np.array_equal(first, _decoded(data, 11, spec))
    outputs = {_decoded(data, seed, spec).tobytes() for seed in range(12)}
    assert len(outputs) == 12


def test_eval_center_crop_matches_pillow() -> None:
    data = _encoded(_photo(1))
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    # 341x256 -> the centred 224 square: no resize, so the decoders must agree.
    exact = _decoded(data, None, ImageSpec(image_size=SIZE, training=False, **ACCURATE))
    assert _mad(exact, reference[16:240, 59:283]) < 0.05
    fast = _decoded(data, None, ImageSpec(image_size=SIZE, training=False))
    assert _mad(fast, reference[16:240, 59:283]) < 2.0
    # 160: a 213 square resized; Pillow's bilinear antialiases when shrinking, OpenCV's not.
    window = center_crop_window(256, 341, 160)
    y, x, h, w, _ = window
    pillow = Image.fromarray(reference).resize(
        (160, 160), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h)
    )
    resized = _decoded(data, None, ImageSpec(image_size=160, training=False, **ACCURATE))
    assert _mad(resized, np.asarray(pillow)) < 2.0


def test_training_output_is_the_window_resized_and_flipped() -> None:
    data = _encoded(_photo(2))
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    spec = ImageSpec(image_size=SIZE, training=True, **ACCURATE)
    flips = set()
    for seed in range(8):
        y, x, h, w, flip = random_crop_window(256, 341, seed, spec)
        expected = cv2.resize(
            np.ascontiguousarray(reference[y : y + h, x : x + w]),
            (SIZE, SIZE),
            interpolation=cv2.INTER_LINEAR,
        )
        if flip:
            expected = expected[:, ::-1]
        # Whole-image decoding is exact; window-only decoding may round the left edge apart.
        assert _mad(_decoded(data, seed, spec), expected) < 0.05
        flips.add(flip)
    assert flips == {True, False}


def test_a_flipped_output_is_the_unflipped_one_mirrored() -> None:
    # Area 1 and the image's own aspect ratio: every seed's window is the whole image, so two
    # seeds that differ in the flip must give mirror images.
    data = _encoded(_photo(3))
    spec = ImageSpec(
        image_size=SIZE, training=True, area_range=(1.0, 1.0), aspect_ratio_range=(341 / 256,) * 2
    )
    by_flip = {}
    for seed in range(16):
        window = random_crop_window(256, 341, seed, spec)
        assert window[:4] == (0, 0, 256, 341)
        by_flip.setdefault(window.flip, _decoded(data, seed, spec))
    assert set(by_flip) == {True, False}
    assert np.array_equal(by_flip[True], by_flip[False][:, ::-1])


def test_decode_into_writes_one_row_of_a_batch_in_place() -> None:
    data = _encoded(_photo(4))
    spec = ImageSpec(image_size=SIZE, training=True)
    batch = np.zeros((4, SIZE, SIZE, 3), np.uint8)
    decode_into(memoryview(data), batch[2], seed=5, spec=spec)
    assert not batch[[0, 1, 3]].any()
    assert np.array_equal(batch[2], _decoded(bytearray(data), 5, spec))


def test_threads_decode_as_one_thread_does() -> None:
    photos = [_encoded(_photo(seed)) for seed in range(6)]
    spec = ImageSpec(image_size=SIZE, training=True)
    expected = [_decoded(photos[i % 6], i, spec) for i in range(24)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: _decoded(photos[i % 6], i, spec), range(24)))
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.slow
def test_a_large_foreign_jpeg_decodes() -> None:
    # Larger than the per-thread buffer that is kept (16 MiB).
    data = _encoded(_photo(5, height=2100, width=2900), quality=80)
    out = _decoded(data, None, ImageSpec(image_size=SIZE, training=False))
    reference = Image.open(io.BytesIO(data)).convert("RGB")
    y, x, h, w, _ = center_crop_window(2100, 2900, SIZE)
    expected = cv2.resize(np.asarray(reference)[y : y + h, x : x + w], (SIZE, SIZE))
    assert _mad(out, expected) < 2.0


def test_window_only_decoding_matches_whole_image_decoding() -> None:
    spec = ImageSpec(image_size=SIZE, training=True, **ACCURATE)
    if not jpeg_decoder(spec).startswith("turbojpeg3"):
        pytest.skip(f"no TurboJPEG 3 library (set {TURBOJPEG_ENV}): decode_into decodes whole")
    whole = ImageSpec(image_size=SIZE, training=True, crop_decode=False, **ACCURATE)
    for seed in range(10):
        data = _encoded(_photo(seed), subsampling=seed % 3)
        assert _mad(_decoded(data, seed, spec), _decoded(data, seed, whole)) < 0.05
        fast = ImageSpec(image_size=SIZE, training=True)
        fast_whole = ImageSpec(image_size=SIZE, training=True, crop_decode=False)
        assert np.array_equal(_decoded(data, seed, fast), _decoded(data, seed, fast_whole))


@pytest.mark.slow
def test_a_library_named_that_is_not_turbojpeg_3_is_an_error() -> None:
    script = (
        "from tfrecord_io.torch.image import ImageSpec, jpeg_decoder\n"
        "try:\n"
        "    jpeg_decoder(ImageSpec(image_size=8, training=False))\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, TURBOJPEG_ENV: "libc.so.6", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert f"{TURBOJPEG_ENV}='libc.so.6' cannot be used" in result.stdout
    assert "tj3SetCroppingRegion" in result.stdout


# -- Other formats ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,mode",
    [("PNG", "RGB"), ("PNG", "RGBA"), ("PNG", "L"), ("PNG", "P"), ("JPEG", "L"), ("JPEG", "CMYK")],
)
def test_other_images_decode_to_rgb(fmt: str, mode: str) -> None:
    data = _encoded(_photo(6, height=256, width=256), fmt, mode)
    # Pillow's own RGB conversion is the reference; 256 -> 224 needs no resize.
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[16:240, 16:240]
    for encoding in ("jpeg", "png", "auto"):
        spec = ImageSpec(image_size=SIZE, training=False, encoding=encoding, **ACCURATE)
        assert _mad(_decoded(data, None, spec), reference) < 0.05
    training = _decoded(data, 3, ImageSpec(image_size=SIZE, training=True))
    assert training.shape == (SIZE, SIZE, 3)


# -- RAW --------------------------------------------------------------------------------------


def _coordinates(stored: int) -> np.ndarray:
    """RAW pixels that say where they are: R = row, G = column."""
    y, x = np.mgrid[0:stored, 0:stored]
    return np.stack([y, x, (x + y) % 256], -1).astype(np.uint8)


def test_raw_eval_is_the_centre_crop() -> None:
    pixels = _coordinates(256)
    spec = ImageSpec(image_size=SIZE, training=False, encoding="raw", stored_size=256)
    assert np.array_equal(_decoded(pixels.tobytes(), None, spec), pixels[16:240, 16:240])


def test_raw_training_crops_are_exact_windows_flipped_half_the_time() -> None:
    pixels = _coordinates(256)
    spec = ImageSpec(image_size=SIZE, training=True, encoding="raw", stored_size=256)
    corners, flips = set(), []
    for seed in range(64):
        out = _decoded(pixels.tobytes(), seed, spec)
        flipped = out[0, 0, 1] > out[0, -1, 1]  # columns run right to left
        unflipped = out[:, ::-1] if flipped else out
        y, x = int(unflipped[0, 0, 0]), int(unflipped[0, 0, 1])
        assert 0 <= y <= 256 - SIZE and 0 <= x <= 256 - SIZE
        assert np.array_equal(unflipped, pixels[y : y + SIZE, x : x + SIZE])
        corners.add((y, x))
        flips.append(flipped)
    assert len(corners) > 32
    assert 16 <= sum(flips) <= 48
    # The same seed gives the same crop and flip.
    assert np.array_equal(_decoded(pixels.tobytes(), 9, spec), _decoded(pixels.tobytes(), 9, spec))


def test_raw_flip_without_crop_is_an_exact_mirror() -> None:
    pixels = _photo(7, height=SIZE, width=SIZE)
    spec = ImageSpec(image_size=SIZE, training=True, encoding="raw", stored_size=SIZE)
    outputs = [_decoded(pixels.tobytes(), seed, spec) for seed in range(16)]
    plain = [o for o in outputs if np.array_equal(o, pixels)]
    mirrored = [o for o in outputs if np.array_equal(o, pixels[:, ::-1])]
    assert plain and mirrored and len(plain) + len(mirrored) == len(outputs)


def test_raw_smaller_than_the_output_is_upscaled() -> None:
    pixels = _photo(8, height=64, width=64)
    spec = ImageSpec(image_size=96, training=False, encoding="raw", stored_size=64)
    expected = cv2.resize(pixels, (96, 96), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(_decoded(pixels.tobytes(), None, spec), expected)


# -- Errors -----------------------------------------------------------------------------------


def test_bad_bytes_raise_value_errors_that_say_what_is_wrong() -> None:
    data = _encoded(_photo(9))
    spec = ImageSpec(image_size=SIZE, training=False)
    cases = [
        (data[: len(data) // 2], "cannot decode JPEG"),
        (data[:40], "cannot decode JPEG"),
        (b"", "empty"),
        (b"hello, this is not an image", "hello, t"),
        (_encoded(_photo(9), "PNG")[:300], "cannot decode image"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=message):
            _decoded(bad, None, spec)
    raw = ImageSpec(image_size=SIZE, training=False, encoding="raw", stored_size=256)
    with pytest.raises(ValueError, match=r"expected 256\*256\*3 = 196608"):
        _decoded(b"\0" * 1000, None, raw)


def test_bad_calls_raise() -> None:
    data = _encoded(_photo(10))
    spec = ImageSpec(image_size=SIZE, training=True)
    with pytest.raises(ValueError, match="seed=None"):
        decode_into(data, np.empty((SIZE, SIZE, 3), np.uint8), seed=None, spec=spec)
    with pytest.raises(ValueError, match=r"\(224, 224, 3\)"):
        decode_into(data, np.empty((SIZE, SIZE, 4), np.uint8), seed=1, spec=spec)
    with pytest.raises(ValueError, match="float32"):
        decode_into(data, np.empty((SIZE, SIZE, 3), np.float32), seed=1, spec=spec)
    with pytest.raises(ValueError, match="C-contiguous"):
        decode_into(data, np.empty((SIZE, SIZE * 2, 3), np.uint8)[:, ::2], seed=1, spec=spec)
    with pytest.raises(TypeError, match="list"):
        decode_into(data, [], seed=1, spec=spec)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"image_size": 0}, "image_size must be a positive int, got 0"),
        ({"image_size": True}, "image_size"),
        ({"training": 1}, "training must be True or False, got 1"),
        ({"encoding": "webp"}, "encoding must be one of .*'webp'"),
        ({"encoding": "raw"}, "stored_size=None"),
        ({"encoding": "raw", "stored_size": -3}, "stored_size=-3"),
        ({"area_range": (0.0, 1.0)}, r"area_range .* got \(0.0, 1.0\)"),
        ({"area_range": (0.5, 1.5)}, "area_range"),
        ({"aspect_ratio_range": (2.0, 1.0)}, "aspect_ratio_range"),
        ({"jpeg_dct_method": "FLOAT"}, "jpeg_dct_method must be one of .*'FLOAT'"),
        ({"crop_decode": "yes"}, "crop_decode must be True or False"),
    ],
)
def test_image_spec_checks_itself(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ImageSpec(**{"image_size": SIZE, "training": False, **options})


# -- The batch step and the shared constants ---------------------------------------------------


def test_normalize_batch_matches_the_formula_in_both_layouts() -> None:
    torch = pytest.importorskip("torch")
    images = np.random.default_rng(0).integers(0, 256, (3, 20, 24, 3), dtype=np.uint8)
    expected = (torch.from_numpy(images).float() - torch.tensor(MEAN_RGB)) / torch.tensor(
        STDDEV_RGB
    )
    hwc = normalize_batch(images)
    assert hwc.shape == (3, 20, 24, 3) and hwc.is_contiguous()
    torch.testing.assert_close(hwc, expected)
    out = torch.empty(3, 3, 20, 24)
    chw = normalize_batch(torch.from_numpy(images), layout="CHW", out=out)
    assert chw is out
    torch.testing.assert_close(chw, expected.permute(0, 3, 1, 2))
    with pytest.raises(ValueError, match="uint8"):
        normalize_batch(images.astype(np.float32))
    with pytest.raises(ValueError, match="layout"):
        normalize_batch(images, layout="NCHW")
    with pytest.raises(ValueError, match="out must be"):
        normalize_batch(images, out=torch.empty(3, 20, 24, 3, dtype=torch.float64))


def test_constants_are_the_tensorflow_readers() -> None:
    decode = pytest.importorskip("tfrecord_io.decode")
    assert MEAN_RGB == decode.MEAN_RGB and STDDEV_RGB == decode.STDDEV_RGB
    assert CROP_PADDING == decode.CROP_PADDING
    assert DCT_METHODS == decode.DCT_METHODS and ENCODINGS == decode.ENCODINGS
    spec, config = (
        ImageSpec(image_size=SIZE, training=True),
        decode.DecodeConfig(image_size=SIZE, training=True, encoding="jpeg"),
    )
    assert spec.area_range == config.area_range
    assert spec.aspect_ratio_range == config.aspect_ratio_range
    assert spec.jpeg_dct_method == config.jpeg_dct_method
