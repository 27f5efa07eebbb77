"""Pixel work for one image: sniff, check, decode, convert, orient, resize, crop, encode.

Pure functions with no Beam in them, so that tests and benchmarks call them directly and the
pipeline's DoFns stay thin. Every way an input can be bad ends in ``RejectedImage`` with a short,
stable reason code; nothing else escapes ``prepare_image``: an unexpected exception (even
``MemoryError``) becomes ``internal_error`` naming its type and where it was raised.

Before any pixel is decoded, the header's size is checked against ``max_pixels`` (the decode)
and against ``max_aspect_ratio`` and ``max_output_pixels`` (the stored image), so that neither a
decompression bomb nor a 1x20,000 line can make the job allocate gigabytes.

Conversion rules (``image_colour``): samples wider than 8 bits by ``high_bit_depth`` (``shift``
or ``stretch``); an embedded ICC profile to sRGB through LittleCMS, whatever the mode; without
a profile, sRGB is assumed and CMYK uses ``(255 - C)(255 - K)/255``; alpha is composited over
``ImageOptions.background``. Multi-frame files contribute their first frame. The EXIF (or XMP)
orientation is applied, and the stored image carries no EXIF and no profile: it is sRGB.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import traceback
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from beam_pipelines.image.colour import (
    COLOUR_SPACE,
    reduce_bit_depth,
    to_srgb,
    wide_colour_rawmode,
)
from beam_pipelines.image.formats import (
    DEFAULT_ACCEPTED_FORMATS,
    NOT_DECODABLE,
    classify_error,
    error_text,
    pillow_formats,
    sniff_format,
    why_not_accepted,
)
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.phash import output_sample, perceptual_hashes
from schemas.constants import ENCODINGS

__all__ = [
    "REASONS",
    "COLOUR_SPACE",
    "DEFAULT_ACCEPTED_FORMATS",
    "ImageOptions",
    "PreparedImage",
    "RejectedImage",
    "internal_error",
    "sniff_format",
    "open_image",
    "check_output_bounds",
    "decode_rgb",
    "decode_srgb",
    "DecodedImage",
    "resize_and_crop",
    "encode_image",
    "prepare_image",
]

# Stable reason codes, written to rejected.jsonl and used as Beam counter names. The README
# says what each means and what a user can do about it.
REASONS = (
    "empty_file",
    "not_an_image",
    "unsupported_format",
    "truncated",
    "corrupt_header",
    "unsupported_feature",
    "decompression_bomb",
    "too_many_pixels",
    "extreme_aspect_ratio",
    "output_too_large",
    "too_small",
    "unreadable",
    "decode_error",
    "no_label",
    "bad_listing_line",
    "bad_label",
    "invalid_record",
    "over_budget",
    "decoder_crashed",
    "internal_error",
)

_ORIENTATION = 0x0112  # the EXIF tag
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_JPEG_MAX_SIDE = 65_500  # libjpeg's limit on either side
_SHRINK_ABOVE_PIXELS = 16_000_000  # decoded images larger than this are reduced first
_SHRINKABLE_MODES = ("L", "LA", "RGB", "RGBA", "RGBX", "CMYK", "I", "F")

# Pillow's own decompression-bomb checks (Image.MAX_IMAGE_PIXELS, some inside plugins' load())
# are left on and untouched here: importing this module must not change them for the rest of a
# program. The decode worker (bounds.py), a process of its own, sets them from --max_pixels.
# Exceptions Pillow's plugins raise for bad files (anything else is internal_error). The AVIF
# plugin raises RuntimeError for what libavif refuses; some plugins check a header with
# ``assert`` (FTEX: its count of formats), and a header field too large for the C decoder's
# arguments raises OverflowError (a McIDAS line stride): both found by fuzzing.
_PILLOW_ERRORS = (
    AssertionError,
    ArithmeticError,
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    TypeError,
    KeyError,
    RuntimeError,
)


class RejectedImage(Exception):  # a verdict, not a programming error
    """An input that cannot become an example.

    Attributes:
      reason: one of ``REASONS``; stable, for counters and reports.
      detail: a human-readable explanation naming what was found and what was expected.
    """

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown rejection reason {reason!r}; expected one of {REASONS}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail

    def __reduce__(self):  # keeps reason and detail when pickled between Beam workers
        return (RejectedImage, (self.reason, self.detail))


def internal_error(error: BaseException) -> RejectedImage:
    """An ``internal_error`` rejection for an unexpected exception: its type, message and the
    innermost frames where it was raised (file:line function), short enough for a report line."""
    frames = traceback.extract_tb(error.__traceback__)[-3:]
    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
    message = str(error).replace("\n", " ")
    if len(message) > 200:
        message = message[:200] + "…"
    return RejectedImage(
        "internal_error", f"{type(error).__name__}: {message}" + (f" (at {where})" if where else "")
    )


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """An image ready to store.

    Attributes:
      encoded: JPEG or PNG bytes, or uint8 HWC pixels for RAW.
      format: ``"JPEG"``, ``"PNG"`` or ``"RAW"`` (the schema's ``image/format``).
      height, width, channels: the stored image's dimensions (channels is always 3).
      source_format: the format Pillow identified from the source bytes (``"JPEG"``, ``"PNG"``…).
      source_size: the source's ``(width, height)`` as declared in its header.
      decoded_size: the ``(width, height)`` actually decoded (smaller than ``source_size`` when
        JPEG DCT-domain downscaling applied).
      luma_sample: the stored image's 64x64 luma area averages before encoding
        (``phash.output_sample``), from which ``phash.window_hashes`` makes the near-duplicate
        features (``phash`` is their whole frame's).
      events: what preparing it involved, as counter names (``icc_converted``,
        ``high_bit_depth_stretch_sbit``, ``cropped_out_of_bounds``…).
    """

    encoded: bytes
    format: str
    height: int
    width: int
    channels: int
    source_format: str
    source_size: tuple[int, int]
    decoded_size: tuple[int, int]
    luma_sample: bytes | None = None
    events: tuple[str, ...] = ()

    @functools.cached_property
    def phash(self) -> int | None:
        """The 64-bit perceptual hash of the stored pixels (``catalog.phash``), unsigned."""
        return perceptual_hashes([self.luma_sample])[0] if self.luma_sample is not None else None


class DecodedImage(NamedTuple):
    """What ``decode_srgb`` returns."""

    image: Image.Image  # RGB, sRGB, oriented
    events: tuple[str, ...]  # counter names: icc_converted, high_bit_depth_*...
    full_size: tuple[int, int]  # oriented (width, height) before a large image was reduced


def _describe_start(data: bytes) -> str:
    head = data[:16]
    return f"starts with {head!r}"


def _guess_format(data: bytes, sniffed: str | None) -> str:
    """The format a file that failed to open claims to be, for the rejection's detail."""
    if sniffed:
        return sniffed
    for name in pillow_formats():
        factory_accept = Image.OPEN.get(name)
        accept = factory_accept[1] if factory_accept else None
        try:
            if accept is not None and accept(data[:16]) is True:
                return name
        except _PILLOW_ERRORS:
            continue
    return "image"


def _header_error_detail(fmt: str, data: bytes) -> str:
    """Structure a header error can be explained by (a TIFF's first IFD past the end)."""
    if fmt == "TIFF" and len(data) >= 8:
        order = "<" if data[:2] == b"II" else ">"
        offset = int.from_bytes(data[4:8], "little" if order == "<" else "big")
        if offset + 2 > len(data):
            return f"; its first IFD offset {offset} is past the end of the {len(data)}-byte file"
    return ""


def _factory_error(fmt: str, data: bytes) -> BaseException | None:
    """Opens ``data`` as ``fmt`` alone to learn why it failed (Image.open keeps no message)."""
    entry = Image.OPEN.get(fmt)
    if entry is None:
        return None
    try:
        entry[0](io.BytesIO(data), "")
    except Exception as e:  # the exception is the answer sought
        return e
    return None


def _unidentified(data: bytes, sniffed: str | None, accepted: tuple[str, ...]) -> RejectedImage:
    """The rejection for bytes no accepted format would open."""
    others = [f for f in pillow_formats() if f not in accepted and f != "MPO"]
    if others:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                probe = Image.open(io.BytesIO(data), formats=others)
            name = probe.format or "unknown"
            probe.close()
            return RejectedImage(
                "unsupported_format", f"{name} file: {why_not_accepted(name)} ({len(data)} bytes)"
            )
        except Exception:  # only naming the format is attempted here
            pass
    if sniffed in NOT_DECODABLE or (sniffed and sniffed not in accepted):
        return RejectedImage(
            "unsupported_format", f"{sniffed} file: {why_not_accepted(sniffed)} ({len(data)} bytes)"
        )
    if sniffed:
        error = _factory_error(sniffed, data)
        reason = classify_error(error, stage="header") if error else "corrupt_header"
        cause = f": {type(error).__name__}: {error}" if error else ""
        return RejectedImage(
            reason,
            f"{sniffed} signature but the header cannot be read{cause}"
            f"{_header_error_detail(sniffed, data)} ({len(data)} bytes)",
        )
    return RejectedImage(
        "not_an_image",
        f"no image format recognised in {len(data)} bytes; {_describe_start(data)}",
    )


@functools.lru_cache(maxsize=64)
def _open_order(accepted_formats: tuple[str, ...], sniffed: str | None) -> tuple[str, ...]:
    """The formats ``Image.open`` tries, the sniffed one first."""
    # MPO has no opener of its own: Pillow's JPEG opener returns MPO files.
    formats = [f for f in accepted_formats if f != "MPO"]
    if "MPO" in accepted_formats and "JPEG" not in formats:
        formats.insert(0, "JPEG")
    if sniffed in formats:
        formats.remove(sniffed)
        formats.insert(0, sniffed)
    return tuple(formats)


def open_image(
    data: bytes,
    max_pixels: int,
    *,
    accepted_formats: tuple[str, ...] = DEFAULT_ACCEPTED_FORMATS,
) -> Image.Image:
    """Opens image bytes and checks the declared size, reading only the header.

    Args:
      data: the source file's bytes.
      max_pixels: the largest ``width * height`` accepted.
      accepted_formats: the Pillow formats to try, in order (the sniffed one goes first).

    Returns:
      The lazily-decoding Pillow image (pixels are not decoded yet).

    Raises:
      RejectedImage: ``empty_file``, ``not_an_image``, ``unsupported_format``,
        ``too_many_pixels``, ``decompression_bomb``, ``unsupported_feature``, ``truncated`` or
        ``corrupt_header``.
    """
    if not data:
        raise RejectedImage("empty_file", "the file has 0 bytes")
    sniffed = sniff_format(data)
    formats = _open_order(accepted_formats, sniffed)
    try:
        # Pillow's limit is the process's (the decode worker's: --max_pixels); ours is below.
        image = Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError as e:
        # Pillow refuses headers above twice its MAX_IMAGE_PIXELS before we see the size.
        raise RejectedImage(
            "too_many_pixels",
            f"header declares too many pixels ({e}); --max_pixels is {max_pixels}",
        ) from e
    except Image.UnidentifiedImageError as e:
        raise _unidentified(data, sniffed, accepted_formats) from e
    except _PILLOW_ERRORS as e:
        fmt = _guess_format(data, sniffed)
        raise RejectedImage(
            classify_error(e, stage="header"),
            f"{fmt} header unreadable: {error_text(e, fmt)}{_header_error_detail(fmt, data)}",
        ) from e
    fmt = image.format or "unknown"
    if fmt not in accepted_formats:
        raise RejectedImage("unsupported_format", f"{fmt} file: {why_not_accepted(fmt)}")
    width, height = image.size
    if width * height > max_pixels:
        raise RejectedImage(
            "too_many_pixels",
            f"{fmt} header declares {width}x{height} = {width * height} pixels, "
            f"more than --max_pixels {max_pixels}",
        )
    if width < 1 or height < 1:
        raise RejectedImage("corrupt_header", f"{fmt} header declares {width}x{height}")
    for tile in image.tile:
        if tile.offset is not None and tile.offset > len(data):
            raise RejectedImage(
                "corrupt_header",
                f"{fmt} header places pixel data at byte {tile.offset}, past the end of the "
                f"{len(data)}-byte file",
            )
    return image


def check_output_bounds(
    width: int, height: int, options: ImageOptions, source_format: str = "image"
) -> float | None:
    """Checks the stored image an input of ``width`` x ``height`` would make, before decoding.

    Args:
      width, height: the source's size from its header.
      options: the image size, crop, bounds and what to do out of bounds.
      source_format: for the rejection's detail.

    Returns:
      None when the image fits, else the longer:shorter ratio to centre-crop it to
      (``out_of_bounds="crop"``).

    Raises:
      RejectedImage: ``extreme_aspect_ratio`` or ``output_too_large`` (``out_of_bounds="reject"``).
    """
    short, long = min(width, height), max(width, height)
    crop = options.out_of_bounds == "crop"
    ratio = long / short
    keep = None
    if long > options.max_aspect_ratio * short:
        if not crop:
            raise RejectedImage(
                "extreme_aspect_ratio",
                f"{source_format} header declares {width}x{height}, an aspect ratio of "
                f"{ratio:.1f}, above --max_aspect_ratio {options.max_aspect_ratio:g}; "
                "--out_of_bounds crop keeps its centre instead",
            )
        keep = float(options.max_aspect_ratio)
    if options.crop == "center":
        return None  # a square of image_size: within every bound, whatever the input
    size = options.image_size
    longest = options.max_output_pixels // size
    if options.encoding == "jpeg":
        longest = min(longest, _JPEG_MAX_SIDE)
    stored_long = max(1, round((keep or ratio) * size))
    if stored_long > longest:
        if not crop:
            limit = (
                f"more than --max_output_pixels {options.max_output_pixels}"
                if stored_long * size > options.max_output_pixels
                else f"a side longer than JPEG's {_JPEG_MAX_SIDE}"
            )
            raise RejectedImage(
                "output_too_large",
                f"{source_format} {width}x{height} would be stored as {size}x{stored_long} = "
                f"{size * stored_long} pixels, {limit}; --out_of_bounds crop keeps its centre",
            )
        keep = longest / size
    return keep


def _shrink_large(image: Image.Image, min_side: int) -> Image.Image:
    """Box-reduces a large decoded image by an integer factor before any conversion.

    Conversions (alpha compositing, ICC, grayscale to RGB) each hold a full-size copy: four
    bytes a pixel, 200 MB at 50 MP. Above ``_SHRINK_ABOVE_PIXELS`` the image is first reduced
    (Pillow's ``reduce``, premultiplied for alpha) by the largest factor that keeps its shorter
    side at least twice ``min_side``: Pillow's own ``reducing_gap=2`` rule, which it documents
    as indistinguishable from resampling the whole image. JPEG is already small (``draft``).
    """
    width, height = image.size
    factor = min(width, height) // (2 * min_side)
    if width * height <= _SHRINK_ABOVE_PIXELS or factor < 2:
        return image
    source = image
    if image.mode in ("P", "PA", "1", "La", "RGBa"):
        alpha = image.mode in ("PA", "La", "RGBa") or "transparency" in image.info
        source = image.convert("RGBA" if alpha else "RGB")
    if source.mode not in _SHRINKABLE_MODES:
        return image
    small = source.reduce(factor)
    if "icc_profile" in image.info:
        small.info["icc_profile"] = image.info["icc_profile"]
    return small


def _orientation(image: Image.Image) -> int:
    try:
        return int(image.getexif().get(_ORIENTATION, 1) or 1)
    except Exception:  # Pillow raises many types for malformed EXIF
        return 1  # a damaged EXIF block must not cost the image


def decode_srgb(
    image: Image.Image,
    *,
    min_side: int,
    background: tuple[int, int, int] = (255, 255, 255),
    high_bit_depth: str = "shift",
    source: bytes | None = None,
    defer_rgb_profile: bool = False,
) -> DecodedImage:
    """Decodes an opened image to oriented 8-bit sRGB, no smaller than ``min_side`` if possible.

    For JPEG the decoder is asked (``draft``) to downscale in the DCT domain by 1/2, 1/4 or 1/8
    while keeping both sides at least ``min_side``, so a 12 MP photo bound for 256 px decodes at
    about 1/64 of the pixels and memory.

    Args:
      image: from ``open_image``.
      min_side: the smallest side the caller still needs.
      background: RGB colour that transparent pixels are composited over.
      high_bit_depth: ``"shift"`` or ``"stretch"``.
      source: the file's bytes (needed for ``stretch``: PNG ``sBIT``, 16-bit colour).
      defer_rgb_profile: leave the profile of an RGB image unapplied (still in ``info``) for
        the caller to apply after downscaling (``image_colour.to_srgb``).

    Returns:
      A loaded ``RGB`` image with the orientation applied, the events it involved, and its
      oriented size before any reduction of a large image (``_shrink_large``).

    Raises:
      RejectedImage: ``truncated``, ``decompression_bomb``, ``unsupported_feature``,
        ``too_many_pixels`` or ``decode_error``.
    """
    fmt = image.format
    try:
        # Image.open leaves animated GIF/WebP/PNG and multi-page TIFF at their first frame, and
        # PSD at its composite image; seeking to 0 would pick PSD's first layer (or fail).
        if fmt in ("JPEG", "MPO"):
            image.draft(None, (min_side, min_side))
        wide = wide_colour_rawmode(image)
        image.load()
    except (*_PILLOW_ERRORS, Image.DecompressionBombError) as e:
        reason = classify_error(e, stage="pixels")
        if reason == "truncated":
            raise RejectedImage("truncated", f"{fmt} data ends early: {e}") from e
        raise RejectedImage(reason, f"{fmt}: {error_text(e, fmt)}") from e
    orientation = _orientation(image)
    try:
        eight, depth_events = reduce_bit_depth(
            image, policy=high_bit_depth, source=source, wide_rawmode=wide
        )
        if eight is not image and "icc_profile" in image.info:
            eight.info["icc_profile"] = image.info["icc_profile"]
        full_size = eight.size
        eight = _shrink_large(eight, min_side)
        rgb, colour_events = to_srgb(
            eight, background=background, defer_rgb_profile=defer_rgb_profile
        )
    except (OSError, ValueError) as e:
        raise RejectedImage(
            "decode_error", f"cannot convert {fmt} mode {image.mode!r} to RGB: {e}"
        ) from e
    if orientation in _TRANSPOSE:
        rgb = rgb.transpose(_TRANSPOSE[orientation])
        if orientation >= 5:  # the transposing ones
            full_size = full_size[::-1]
    return DecodedImage(rgb, depth_events + colour_events, full_size)


def decode_rgb(
    image: Image.Image,
    *,
    min_side: int,
    background: tuple[int, int, int] = (255, 255, 255),
    high_bit_depth: str = "shift",
    source: bytes | None = None,
) -> Image.Image:
    """``decode_srgb``'s image alone: loaded, oriented, ``RGB`` sRGB (reduced if large)."""
    rgb, _, _ = decode_srgb(
        image,
        min_side=min_side,
        background=background,
        high_bit_depth=high_bit_depth,
        source=source,
    )
    return rgb


def _target_size(width: int, height: int, size: int) -> tuple[int, int]:
    if width <= height:
        return size, max(1, round(height * size / width))
    return max(1, round(width * size / height)), size


def resize_and_crop(
    image: Image.Image,
    *,
    image_size: int,
    crop: str,
    max_aspect_ratio: float | None = None,
    full_size: tuple[int, int] | None = None,
) -> Image.Image:
    """Resizes so the shorter side is ``image_size``; with ``crop="center"`` keeps the middle square.

    ``max_aspect_ratio`` (from ``check_output_bounds``) keeps only the centre of the longer side,
    that many times the shorter one. The crop is folded into the resize (Pillow's ``box``) so
    only the kept pixels are resampled. Resampling is bicubic with antialiasing.
    ``full_size``: the size the stored shape is computed from, when ``image`` is a reduced copy
    (``decode_srgb``), so that the reduction's rounding does not change the stored size.
    """
    width, height = full_size or image.size
    sx, sy = image.width / width, image.height / height

    def scaled(box: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        return (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)

    if crop == "center":
        side = min(width, height)
        left = (width - side) / 2
        top = (height - side) / 2
        box = (left, top, left + side, top + side)
        if image.size == (image_size, image_size):
            return image
        return image.resize((image_size, image_size), Image.Resampling.BICUBIC, box=scaled(box))
    short = min(width, height)
    if max_aspect_ratio is not None and max(width, height) > short * max_aspect_ratio:
        kept = short * max_aspect_ratio
        stored = max(1, round(kept * image_size / short))
        if width > height:
            box = ((width - kept) / 2, 0, (width + kept) / 2, height)
            target = (stored, image_size)
        else:
            box = (0, (height - kept) / 2, width, (height + kept) / 2)
            target = (image_size, stored)
        return image.resize(target, Image.Resampling.BICUBIC, box=scaled(box))
    target = _target_size(width, height, image_size)
    if target == image.size:
        return image
    return image.resize(target, Image.Resampling.BICUBIC)


def encode_image(image: Image.Image, *, encoding: str, jpeg_quality: int = 90) -> tuple[bytes, str]:
    """Encodes an RGB image; returns ``(bytes, schema format)``.

    Encoders are deterministic: the same pixels always give the same bytes.
    """
    if encoding == "raw":
        return np.asarray(image, dtype=np.uint8).tobytes(), "RAW"
    buffer = io.BytesIO()
    if encoding == "jpeg":
        image.save(buffer, format="JPEG", quality=jpeg_quality)
        return buffer.getvalue(), "JPEG"
    if encoding == "png":
        image.save(buffer, format="PNG")
        return buffer.getvalue(), "PNG"
    raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")


def prepare_image(data: bytes, options: ImageOptions) -> PreparedImage:
    """Turns a source file's bytes into the image to store.

    Args:
      data: the whole source file.
      options: sizes, crop, encoding, limits, formats, bit depth policy.

    Returns:
      The encoded image and its dimensions.

    Raises:
      RejectedImage: for every kind of bad input, with a stable reason code, and
        ``internal_error`` for any unexpected exception (``MemoryError`` included); only
        ``KeyboardInterrupt`` and ``SystemExit`` pass.
    """
    try:
        return _prepare(data, options)
    except RejectedImage:
        raise
    except Exception as e:  # no input may take the job down
        raise internal_error(e) from e


def _stored_side(source_size: tuple[int, int], options: ImageOptions, source_format: str) -> int:
    """The stored shorter side: ``image_size``, or the source's own for a small image kept.

    Raises:
      RejectedImage: ``too_small``, for a small image under ``small_images="reject"``.
    """
    short = min(source_size)
    # Only a source that would be enlarged is small: at --image_size 16, 20 px is plenty.
    if (
        short >= min(options.min_source_side, options.image_size)
        or options.small_images == "upscale"
    ):
        return options.image_size
    if options.small_images == "reject":
        width, height = source_size
        raise RejectedImage(
            "too_small",
            f"{source_format} {width}x{height}: its shorter side {short} is below "
            f"--min_source_side {options.min_source_side}; --small_images keep stores it at its "
            "own size, upscale enlarges it",
        )
    return min(short, options.image_size)


def _prepare(data: bytes, options: ImageOptions) -> PreparedImage:
    image = open_image(data, options.max_pixels, accepted_formats=options.accepted_formats)
    source_format = image.format or "unknown"
    source_size = image.size
    keep_ratio = check_output_bounds(*source_size, options, source_format)
    size = _stored_side(source_size, options, source_format)
    # An RGB profile is applied after downscaling (a phone photo's Display P3, say): LittleCMS
    # then converts the stored pixels only, about half the decoded ones at 256 px.
    downscaling = min(source_size) > size
    rgb, events, full_size = decode_srgb(
        image,
        min_side=size,
        background=options.background,
        high_bit_depth=options.high_bit_depth,
        source=data,
        defer_rgb_profile=downscaling,
    )
    decoded_size = image.size  # after draft, before orientation
    try:
        final = resize_and_crop(
            rgb,
            image_size=size,
            crop=options.crop,
            max_aspect_ratio=keep_ratio,
            full_size=full_size,
        )
        if downscaling:
            final, converted = to_srgb(final, background=options.background)
            events += converted
        # The near-duplicate features are taken from the output, the smallest image at hand
        # (phash.output_sample); they are computed later, many at once.
        sample = output_sample(final)
        encoded, fmt = encode_image(
            final, encoding=options.encoding, jpeg_quality=options.jpeg_quality
        )
    except (OSError, ValueError) as e:
        raise RejectedImage("decode_error", f"{source_format}: {e}") from e
    if keep_ratio is not None:
        events += ("cropped_out_of_bounds",)
    if min(final.size) > min(source_size):
        events += ("upscaled",)  # counted: the summary and report say how many
    return PreparedImage(
        encoded=encoded,
        format=fmt,
        height=final.height,
        width=final.width,
        channels=3,
        source_format=source_format,
        source_size=source_size,
        decoded_size=decoded_size,
        luma_sample=sample,
        events=events,
    )
