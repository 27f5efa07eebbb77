"""Colour for one decoded image: high bit depth to 8 bits, then any mode to 8-bit sRGB.

Plain functions, no Beam. Each returns the events it caused (``icc_converted``,
``high_bit_depth_stretch_sbit``...), which the pipeline counts.

* **Bit depth.** Samples wider than 8 bits (``I;16`` grayscale, and 16-bit RGB(A) that Pillow
  would otherwise cut to its high bytes) become 8 bits by ``shift`` (``v >> 8``, exact for data
  that fills 16 bits) or ``stretch`` (``v * 255 / (2**bits - 1)``, for 10-, 12- or 14-bit data
  stored in 16), where ``bits`` comes from the PNG ``sBIT`` chunk or the TIFF ``BitsPerSample``
  tag when they declare fewer bits than the container and the samples agree, and otherwise from
  the largest sample (the smallest bit depth, at least 8, that holds it).
* **Colour.** An embedded ICC profile is applied with LittleCMS (Pillow's ``ImageCms``) to reach
  sRGB, whatever the mode (RGB, RGBA, grayscale, palette, CMYK, Lab). A profile that is
  unreadable or does not fit the image's mode is ignored (``icc_profile_ignored``) and the image
  is treated as having none. Without a profile an image is taken to be sRGB already, CMYK goes
  through ``R = (255 - C) * (255 - K) / 255`` and Lab through Pillow's D50 Lab conversion.
* **Alpha** is composited over the background colour, in sRGB, after the conversion.
"""

from __future__ import annotations

import io
import struct
import threading
from collections import OrderedDict

import numpy as np
from PIL import Image, ImageCms

__all__ = [
    "HIGH_BIT_DEPTH_POLICIES",
    "COLOUR_SPACE",
    "wide_colour_rawmode",
    "reduce_bit_depth",
    "to_srgb",
]

HIGH_BIT_DEPTH_POLICIES = ("shift", "stretch")
COLOUR_SPACE = "sRGB"  # of every stored image; recorded in dataset.json

SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
_WIDE_RAWMODES = {
    "RGB;16B": "RGB;16L",
    "RGB;16L": "RGB;16B",
    "RGBA;16B": "RGBA;16L",
    "RGBA;16L": "RGBA;16B",
}
_ALPHA_MODES = ("RGBA", "LA", "PA", "La", "RGBa")
_SRGB_PROFILE = ImageCms.createProfile("sRGB")
# LittleCMS falls back to relative colorimetric for matrix/TRC profiles.
_PERCEPTUAL = ImageCms.Intent.PERCEPTUAL
_CACHE_SIZE = 16
_IDENTITY = object()  # a profile that is sRGB in all but name: no transform needed
# Modes an ICC profile of each colour space can describe, and the mode it is applied in.
_PROFILE_MODES = {
    "RGB": ("RGB", ("RGB", "RGBA", "RGBX", "RGBa", "P", "PA", "L", "LA", "La", "1", "YCbCr")),
    "GRAY": ("L", ("L", "LA", "La", "1")),
    "CMYK": ("CMYK", ("CMYK",)),
    "LAB": ("LAB", ("LAB",)),
}


class _ProfileUnusable(Exception):  # a verdict on the input
    """The embedded profile cannot be read, or describes another colour space than the pixels."""


# ---------------------------------------------------------------------------------------------
# Bit depth


def wide_colour_rawmode(image: Image.Image) -> str | None:
    """The 16-bit-per-channel raw mode of an RGB(A) image not yet loaded, or None.

    Pillow has no 16-bit colour modes: it decodes such PNGs and TIFFs to 8 bits by keeping each
    sample's high byte. Called before ``load``, this says whether the low bytes exist.
    """
    for tile in getattr(image, "tile", [])[:1]:
        args = tile.args
        rawmode = args if isinstance(args, str) else (args[0] if args else None)
        if isinstance(rawmode, str) and rawmode in _WIDE_RAWMODES:
            return rawmode
    return None


def _low_bytes(source: bytes, image_format: str) -> np.ndarray | None:
    """Decodes the low byte of every sample of a 16-bit colour image, or None if impossible.

    The decoder is run a second time with the raw mode of the other byte order, so its
    unpacker keeps the low bytes instead of the high ones (the filters and decompression are
    Pillow's own).
    """
    try:
        other = Image.open(io.BytesIO(source), formats=[image_format])
        other.tile = [
            tile._replace(
                args=_WIDE_RAWMODES[tile.args]
                if isinstance(tile.args, str)
                else (_WIDE_RAWMODES[tile.args[0]], *tile.args[1:])  # type: ignore[index]  # a raw tile's args are (rawmode, ...)
            )
            for tile in other.tile
        ]
        other.load()
        return np.asarray(other)
    except (OSError, ValueError, KeyError, IndexError, TypeError, SyntaxError):
        return None


def _png_significant_bits(source: bytes) -> int | None:
    """The largest sample depth the PNG ``sBIT`` chunk declares, or None without one."""
    position = 8
    while position + 8 <= len(source):
        length, kind = struct.unpack_from(">I4s", source, position)
        if kind == b"sBIT":
            values = source[position + 8 : position + 8 + min(length, 4)]
            return max(values) if values else None
        if kind in (b"IDAT", b"IEND"):
            return None
        position += 12 + length
    return None


def _tiff_bits_per_sample(image: Image.Image) -> int | None:
    tags = getattr(image, "tag_v2", None)
    if tags is None:
        return None
    value = tags.get(258)
    if isinstance(value, (tuple, list)):
        return max(value) if value else None
    return value if isinstance(value, int) else None


def _declared_bits(image: Image.Image, source: bytes | None) -> tuple[int | None, str]:
    if image.format == "PNG" and source is not None:
        return _png_significant_bits(source), "sbit"
    if image.format == "TIFF":
        return _tiff_bits_per_sample(image), "bits_per_sample"
    return None, ""


def _depth_table(bits: int) -> np.ndarray:
    scale = (1 << bits) - 1
    values = np.arange(65536, dtype=np.uint32)
    return np.minimum((values * 255 + scale // 2) // scale, 255).astype(np.uint8)


_SHIFT_TABLE = (np.arange(65536, dtype=np.uint32) >> 8).astype(np.uint8)


def _to_eight_bits(
    samples: np.ndarray, policy: str, declared: int | None, declared_by: str
) -> tuple[np.ndarray, str]:
    """Maps uint16-range samples to uint8 through a 65,536-entry table; returns the event."""
    if policy == "shift":
        return _SHIFT_TABLE[samples], "high_bit_depth_shift"
    largest = int(samples.max(initial=0))
    if declared is not None and 8 < declared < 16 and largest < (1 << declared):
        bits, source = declared, declared_by
    else:
        # No declaration, one that says only "16", or samples the declaration cannot hold
        # (PNG's sBIT with the samples scaled up to 16 bits, as the PNG specification asks).
        bits, source = max(8, largest.bit_length()), "max_sample"
    return _depth_table(bits)[samples], f"high_bit_depth_stretch_{source}"


def reduce_bit_depth(
    image: Image.Image,
    *,
    policy: str = "shift",
    source: bytes | None = None,
    wide_rawmode: str | None = None,
) -> tuple[Image.Image, tuple[str, ...]]:
    """Brings a loaded image with samples wider than 8 bits to 8 bits per sample.

    Args:
      image: loaded; modes ``I;16*``, ``I`` and ``F`` are reduced, 16-bit RGB(A) too when
        ``wide_rawmode`` (from ``wide_colour_rawmode`` before loading) and ``source`` are given.
      policy: ``"shift"`` or ``"stretch"`` (see the module docstring).
      source: the file's bytes (for PNG's ``sBIT`` and the low bytes of 16-bit colour).
      wide_rawmode: the raw mode Pillow decoded 16-bit colour with, if any.

    Returns:
      The 8-bit image (``L``, ``RGB`` or ``RGBA``; other images unchanged) and its events.
    """
    mode = image.mode
    if mode in SIXTEEN_BIT_MODES or mode == "I":
        samples = np.asarray(image)
        if mode == "I":
            # 32-bit integer images here come from 16-bit sources; that range is kept.
            samples = np.clip(samples, 0, 65535).astype(np.uint16)
        declared, declared_by = _declared_bits(image, source)
        eight, event = _to_eight_bits(samples, policy, declared, declared_by)
        return Image.fromarray(eight), (event,)
    if mode == "F":
        array = np.nan_to_num(np.asarray(image, dtype=np.float64))
        if array.max(initial=0.0) <= 1.0:  # floats in [0, 1] are scaled; larger ones kept
            array = array * 255.0
        return Image.fromarray(np.clip(np.rint(array), 0, 255).astype(np.uint8)), ()
    if wide_rawmode is None:
        return image, ()
    if policy == "shift" or source is None or image.format is None:
        return image, ("high_bit_depth_shift",)  # Pillow kept the high bytes: v >> 8
    low = _low_bytes(source, image.format)
    high = np.asarray(image)
    if low is None or low.shape != high.shape:
        return image, ("high_bit_depth_shift",)
    samples = (high.astype(np.uint16) << 8) | low
    declared, declared_by = _declared_bits(image, source)
    eight, event = _to_eight_bits(samples, policy, declared, declared_by)
    return Image.fromarray(eight, mode), (event,)


# ---------------------------------------------------------------------------------------------
# Colour management


class _Transforms(threading.local):
    """Built LittleCMS transforms per thread (a transform's pixel cache is not shared)."""

    def __init__(self) -> None:
        # (profile bytes, mode) -> transform, _IDENTITY, or the text of why it is unusable
        self.cache: OrderedDict[tuple[bytes, str], object] = OrderedDict()


_TRANSFORMS = _Transforms()


def _profile_space(profile: ImageCms.ImageCmsProfile) -> str:
    return profile.profile.xcolor_space.strip().upper()


def _is_srgb_equivalent(transform, mode: str) -> bool:
    """True when the transform moves no colour of a 17x17x17 grid by more than one level."""
    levels = np.linspace(0, 255, 17).round().astype(np.uint8)
    grid = np.stack(np.meshgrid(levels, levels, levels, indexing="ij"), axis=-1).reshape(-1, 3)
    probe = Image.fromarray(grid.reshape(17, 289, 3), "RGB")
    if mode == "RGBA":
        probe = probe.convert("RGBA")
    out = np.asarray(ImageCms.applyTransform(probe, transform))[..., :3].reshape(-1, 3)
    return int(np.abs(out.astype(np.int16) - grid).max()) <= 1


def _apply(pixels: Image.Image, transform) -> Image.Image:
    """``ImageCms.applyTransform`` out of place: it returns ``None`` only when ``inPlace``."""
    converted = ImageCms.applyTransform(pixels, transform)
    assert converted is not None
    return converted


def _transform_for(icc: bytes, mode: str):
    """The transform from ``icc`` in ``mode`` to sRGB, ``_IDENTITY``, or _ProfileUnusable."""
    key = (icc, mode)
    cache = _TRANSFORMS.cache
    if key in cache:
        cache.move_to_end(key)
        found = cache[key]
        if isinstance(found, str):
            raise _ProfileUnusable(found)
        return found
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        space = _profile_space(profile)
        out_mode = "RGBA" if mode == "RGBA" else "RGB"
        transform: object = ImageCms.buildTransform(
            profile, _SRGB_PROFILE, mode, out_mode, renderingIntent=_PERCEPTUAL
        )
        if space == "RGB" and _is_srgb_equivalent(transform, mode):
            transform = _IDENTITY
        found = transform
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError) as e:
        found = f"{type(e).__name__}: {e}"  # cached as text, raised afresh each time
    cache[key] = found
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    if isinstance(found, str):
        raise _ProfileUnusable(found)
    return found


def _has_alpha(image: Image.Image) -> bool:
    # An RGB image's transparent colour key (PNG tRNS) has always been ignored; kept so.
    return image.mode in _ALPHA_MODES or (image.mode != "RGB" and "transparency" in image.info)


def _composite(image: Image.Image, background: tuple[int, int, int]) -> Image.Image:
    rgba = image.convert("RGBA")
    base = Image.new("RGBA", rgba.size, (*background, 255))
    return Image.alpha_composite(base, rgba).convert("RGB")


def _through_profile(image: Image.Image, icc: bytes) -> Image.Image:
    """Applies the embedded profile; returns ``RGB`` or ``RGBA`` sRGB pixels.

    Raises:
      _ProfileUnusable: for an unreadable profile or one for another colour space.
    """
    try:
        space = _profile_space(ImageCms.ImageCmsProfile(io.BytesIO(icc)))
    except (ImageCms.PyCMSError, OSError, ValueError, TypeError) as e:
        raise _ProfileUnusable(f"{type(e).__name__}: {e}") from e
    if space not in _PROFILE_MODES or image.mode not in _PROFILE_MODES[space][1]:
        raise _ProfileUnusable(f"a {space} profile on a {image.mode} image")
    base_mode = _PROFILE_MODES[space][0]
    alpha = image.convert("RGBA").getchannel("A") if _has_alpha(image) else None
    if base_mode == "RGB" and alpha is not None:
        pixels = image if image.mode == "RGBA" else image.convert("RGBA")
        transform = _transform_for(icc, "RGBA")
        return pixels if transform is _IDENTITY else _apply(pixels, transform)
    pixels = image if image.mode == base_mode else image.convert(base_mode)
    transform = _transform_for(icc, base_mode)
    rgb = pixels if transform is _IDENTITY else _apply(pixels, transform)
    if alpha is not None:
        rgb.putalpha(alpha)
    return rgb


def to_srgb(
    image: Image.Image,
    *,
    background: tuple[int, int, int] = (255, 255, 255),
    defer_rgb_profile: bool = False,
) -> tuple[Image.Image, tuple[str, ...]]:
    """Converts an 8-bit image of any mode to ``RGB`` sRGB, through its ICC profile if any.

    Args:
      image: loaded, 8 bits per sample (after ``reduce_bit_depth``).
      background: RGB colour that transparent pixels are composited over.
      defer_rgb_profile: leave an ``RGB`` image with a profile as it is (profile still in
        ``info``), for a caller that converts it after downscaling, where there are fewer
        pixels to convert; ``resize`` and ``transpose`` carry ``info`` along.

    Returns:
      The ``RGB`` image, with no ``icc_profile`` in its ``info`` once the profile is applied,
      and its events (``icc_converted`` or ``icc_profile_ignored``).

    Raises:
      OSError, ValueError: from Pillow, for a mode it cannot convert.
    """
    icc = image.info.get("icc_profile")
    if image.mode == "RGB" and (not icc or defer_rgb_profile):
        return image, ()  # the common case: nothing to do
    events: tuple[str, ...] = ()
    if icc:
        try:
            converted = _through_profile(image, icc)
        except _ProfileUnusable:
            events = ("icc_profile_ignored",)
            image.info.pop("icc_profile", None)  # taken as sRGB, and stored without it
            if image.mode == "RGB":
                return image, events
        else:
            if converted.mode == "RGBA":
                converted = _composite(converted, background)
            # The pixels are sRGB now; a profile left in info would be written by encoders
            # (and resize copies info). The stored image carries none.
            converted.info.pop("icc_profile", None)
            return converted, ("icc_converted",)
    if _has_alpha(image):
        return _composite(image, background), events
    # Pillow's CMYK -> RGB conversion is the multiplicative one: (255-C)(255-K)/255.
    return image.convert("RGB"), events
