"""Pixel work for one image: sniff, check, decode, orient, convert, resize, crop, encode.

Pure functions with no Beam in them, so that tests and benchmarks call them directly and the
pipeline's DoFns stay thin. Every way an input can be bad ends in ``RejectedImage`` with a short,
stable reason code; nothing else escapes ``prepare_image`` for bad bytes.

Conversion rules (where the source is not already 8-bit RGB):

* 16-bit samples (``I;16`` PNG/TIFF) are scaled to 8 bits (``v >> 8``), never clipped.
* Alpha (``RGBA``, ``LA``, ``PA`` and palette or grayscale images with a transparent colour) is
  composited over ``ImageOptions.background``, white by default, as a browser shows it.
* CMYK, including Adobe's inverted CMYK JPEGs (which Pillow un-inverts while decoding), goes
  through the embedded ICC profile to sRGB when there is one, and otherwise through the
  multiplicative formula ``R = (255 - C) * (255 - K) / 255``.
* Multi-frame GIF, WebP, PNG and TIFF files contribute their first frame.
* The EXIF orientation is applied, and the stored image carries no EXIF, so readers need not
  apply it again.
"""

from __future__ import annotations

import dataclasses
import io
import warnings

import numpy as np
from PIL import Image, ImageCms, ImageOps

__all__ = [
    "REASONS",
    "STILL_FORMATS",
    "ImageOptions",
    "PreparedImage",
    "RejectedImage",
    "sniff_format",
    "open_image",
    "decode_rgb",
    "resize_and_crop",
    "encode_image",
    "prepare_image",
]

# Stable reason codes, written to rejected.jsonl and used as Beam counter names.
REASONS = (
    "empty_file",
    "not_an_image",
    "truncated",
    "too_many_pixels",
    "unreadable",
    "decode_error",
    "no_label",
    "invalid_record",
)

# Formats tried when opening. Weakly identified formats (TGA, which has no magic number, and
# the scientific and vector formats) are left out so that random bytes are not "decoded".
STILL_FORMATS = (
    "JPEG",
    "PNG",
    "GIF",
    "WEBP",
    "BMP",
    "DIB",
    "TIFF",
    "PPM",
    "ICO",
    "JPEG2000",
    "AVIF",
    "QOI",
    "PCX",
    "SGI",
)

_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"BM", "BMP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG2000"),
    (0, b"qoif", "QOI"),
)

_ORIENTATION = 0x0112  # the EXIF tag
_SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_ENCODINGS = ("jpeg", "png", "raw")
_CROPS = ("none", "center")
_SRGB_PROFILE = ImageCms.createProfile("sRGB")


class RejectedImage(Exception):  # noqa: N818  (a verdict, not a programming error)
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """How every image is prepared.

    Attributes:
      image_size: the shorter side after resizing (and the side of the square with center crop).
      crop: ``"none"`` keeps the aspect ratio; ``"center"`` crops the middle square.
      encoding: ``"jpeg"``, ``"png"`` or ``"raw"`` (uint8 HWC, needs ``crop="center"``).
      jpeg_quality: 1-95, for ``encoding="jpeg"``.
      max_pixels: inputs whose header declares more pixels are rejected before decoding.
      background: RGB colour that transparent pixels are composited over.

    Raises:
      ValueError: naming the bad field and value.
    """

    image_size: int = 256
    crop: str = "none"
    encoding: str = "jpeg"
    jpeg_quality: int = 90
    max_pixels: int = 100_000_000
    background: tuple[int, int, int] = (255, 255, 255)

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, int) or not 1 <= self.image_size <= 16384:
            raise ValueError(f"image_size must be an int in [1, 16384], got {self.image_size!r}")
        if self.crop not in _CROPS:
            raise ValueError(f"crop must be one of {_CROPS}, got {self.crop!r}")
        if self.encoding not in _ENCODINGS:
            raise ValueError(f"encoding must be one of {_ENCODINGS}, got {self.encoding!r}")
        if self.encoding == "raw" and self.crop != "center":
            raise ValueError(
                "encoding 'raw' stores uint8 HWC arrays that must share one shape: "
                f"it requires crop 'center', got crop {self.crop!r}"
            )
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 95:
            raise ValueError(f"jpeg_quality must be an int in [1, 95], got {self.jpeg_quality!r}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"max_pixels must be a positive int, got {self.max_pixels!r}")
        if (
            not isinstance(self.background, tuple)
            or len(self.background) != 3
            or not all(isinstance(c, int) and 0 <= c <= 255 for c in self.background)
        ):
            raise ValueError(
                f"background must be an (r, g, b) tuple of ints in [0, 255], got {self.background!r}"
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
    """

    encoded: bytes
    format: str
    height: int
    width: int
    channels: int
    source_format: str
    source_size: tuple[int, int]
    decoded_size: tuple[int, int]


def sniff_format(data: bytes) -> str | None:
    """Names the image format announced by the leading bytes, or None if none is recognised.

    The extension is never consulted: a PNG saved as ``.JPEG`` is a known ImageNet case.
    """
    for offset, magic, name in _MAGIC:
        if data[offset : offset + len(magic)] == magic:
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis"):
        return "AVIF"
    return None


def _describe_start(data: bytes) -> str:
    head = data[:16]
    return f"starts with {head!r}"


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Opens image bytes and checks the declared size, reading only the header.

    Args:
      data: the source file's bytes.
      max_pixels: the largest ``width * height`` accepted.

    Returns:
      The lazily-decoding Pillow image (pixels are not decoded yet).

    Raises:
      RejectedImage: ``empty_file``, ``not_an_image``, ``too_many_pixels`` or ``truncated``
        (when even the header is cut short).
    """
    if not data:
        raise RejectedImage("empty_file", "the file has 0 bytes")
    sniffed = sniff_format(data)
    formats = (sniffed, *[f for f in STILL_FORMATS if f != sniffed]) if sniffed else STILL_FORMATS
    try:
        with warnings.catch_warnings():
            # Our own max_pixels check below is the limit; Pillow's warning adds nothing.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=formats)
    except Image.DecompressionBombError as e:
        # Pillow refuses headers above twice its MAX_IMAGE_PIXELS before we see the size.
        raise RejectedImage(
            "too_many_pixels",
            f"header declares too many pixels ({e}); --max_pixels is {max_pixels}",
        ) from e
    except Image.UnidentifiedImageError as e:
        if sniffed:
            raise RejectedImage(
                "truncated",
                f"{sniffed} signature but the header cannot be read ({len(data)} bytes)",
            ) from e
        raise RejectedImage(
            "not_an_image",
            f"no image format recognised in {len(data)} bytes; {_describe_start(data)}",
        ) from e
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise RejectedImage("truncated", f"{sniffed or 'image'} header unreadable: {e}") from e
    width, height = image.size
    if width * height > max_pixels:
        raise RejectedImage(
            "too_many_pixels",
            f"{image.format} header declares {width}x{height} = {width * height} pixels, "
            f"more than --max_pixels {max_pixels}",
        )
    if width < 1 or height < 1:
        raise RejectedImage("decode_error", f"{image.format} header declares {width}x{height}")
    return image


def _scale_sixteen_bit(image: Image.Image) -> Image.Image:
    array = np.asarray(image)
    if image.mode in _SIXTEEN_BIT_MODES:
        return Image.fromarray((array.astype(np.uint16) >> 8).astype(np.uint8))
    if image.mode == "I":
        # 32-bit integer images here come from 16-bit sources; scale that range.
        return Image.fromarray((np.clip(array, 0, 65535) >> 8).astype(np.uint8))
    # Mode "F": floats in [0, 1] are scaled, anything larger is taken as already 0-255.
    array = np.nan_to_num(array.astype(np.float64))
    if array.max(initial=0.0) <= 1.0:
        array = array * 255.0
    return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8))


def _cmyk_to_rgb(image: Image.Image) -> Image.Image:
    icc = image.info.get("icc_profile")
    if icc:
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(icc))
            return ImageCms.profileToProfile(
                image, source, _SRGB_PROFILE, renderingIntent=0, outputMode="RGB"
            )
        except (ImageCms.PyCMSError, OSError, ValueError):
            pass  # a broken profile falls back to the formula below
    # Pillow's CMYK -> RGB conversion is the multiplicative one: (255-C)(255-K)/255.
    return image.convert("RGB")


def _composite(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    rgba = image.convert("RGBA")
    base = Image.new("RGBA", rgba.size, (*background, 255))
    return Image.alpha_composite(base, rgba).convert("RGB")


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "La", "RGBa") or "transparency" in image.info


def decode_rgb(
    image: Image.Image, *, min_side: int, background: tuple[int, int, int] = (255, 255, 255)
) -> Image.Image:
    """Decodes an opened image to oriented 8-bit RGB, no smaller than ``min_side`` if possible.

    For JPEG the decoder is asked (``draft``) to downscale in the DCT domain by 1/2, 1/4 or 1/8
    while keeping both sides at least ``min_side``, so a 12 MP photo bound for 256 px decodes at
    about 1/64 of the pixels and memory.

    Args:
      image: from ``open_image``.
      min_side: the smallest side the caller still needs.
      background: RGB colour that transparent pixels are composited over.

    Returns:
      A loaded ``RGB`` image with the EXIF orientation applied.

    Raises:
      RejectedImage: ``truncated`` or ``decode_error``.
    """
    try:
        image.seek(0)  # the first frame of animated GIF/WebP/PNG and multi-page TIFF
        if image.format in ("JPEG", "MPO"):
            image.draft(None, (min_side, min_side))
        image.load()
    except (OSError, EOFError, SyntaxError) as e:
        message = str(e)
        if "truncated" in message or "broken" in message or isinstance(e, EOFError):
            raise RejectedImage("truncated", f"{image.format} data ends early: {message}") from e
        raise RejectedImage("decode_error", f"{image.format}: {message}") from e
    except (ValueError, MemoryError, Image.DecompressionBombError) as e:
        raise RejectedImage("decode_error", f"{image.format}: {e}") from e
    try:
        # Most files carry no rotation; exif_transpose would still copy the whole image.
        needs_turn = image.getexif().get(_ORIENTATION, 1) not in (1, None)
        oriented = (ImageOps.exif_transpose(image) or image) if needs_turn else image
    except Exception:  # noqa: BLE001  (Pillow raises many types for malformed EXIF)
        oriented = image  # a damaged EXIF block must not cost the image
    try:
        return _to_rgb(oriented, background)
    except (OSError, ValueError) as e:
        raise RejectedImage(
            "decode_error", f"cannot convert {image.format} mode {image.mode!r} to RGB: {e}"
        ) from e


def _to_rgb(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in _SIXTEEN_BIT_MODES or mode in ("I", "F"):
        return _scale_sixteen_bit(image).convert("RGB")
    if mode == "CMYK":
        return _cmyk_to_rgb(image)
    if _has_alpha(image):
        return _composite(image, background)
    return image.convert("RGB")


def _target_size(width: int, height: int, size: int) -> tuple[int, int]:
    if width <= height:
        return size, max(1, round(height * size / width))
    return max(1, round(width * size / height)), size


def resize_and_crop(image: Image.Image, *, image_size: int, crop: str) -> Image.Image:
    """Resizes so the shorter side is ``image_size``; with ``crop="center"`` keeps the middle square.

    The crop is folded into the resize (Pillow's ``box``) so only the kept pixels are resampled.
    Resampling is bicubic with antialiasing.
    """
    width, height = image.size
    if crop == "center":
        side = min(width, height)
        left = (width - side) / 2
        top = (height - side) / 2
        box = (left, top, left + side, top + side)
        if image.size == (image_size, image_size):
            return image
        return image.resize((image_size, image_size), Image.Resampling.BICUBIC, box=box)
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
    raise ValueError(f"encoding must be one of {_ENCODINGS}, got {encoding!r}")


def prepare_image(data: bytes, options: ImageOptions) -> PreparedImage:
    """Turns a source file's bytes into the image to store.

    Args:
      data: the whole source file.
      options: sizes, crop, encoding, limits.

    Returns:
      The encoded image and its dimensions.

    Raises:
      RejectedImage: for every kind of bad input, with a stable reason code.
    """
    image = open_image(data, options.max_pixels)
    source_format = image.format or "unknown"
    source_size = image.size
    rgb = decode_rgb(image, min_side=options.image_size, background=options.background)
    decoded_size = image.size  # after draft, before orientation
    try:
        final = resize_and_crop(rgb, image_size=options.image_size, crop=options.crop)
        encoded, fmt = encode_image(
            final, encoding=options.encoding, jpeg_quality=options.jpeg_quality
        )
    except (OSError, ValueError) as e:
        raise RejectedImage("decode_error", f"{source_format}: {e}") from e
    return PreparedImage(
        encoded=encoded,
        format=fmt,
        height=final.height,
        width=final.width,
        channels=3,
        source_format=source_format,
        source_size=source_size,
        decoded_size=decoded_size,
    )
