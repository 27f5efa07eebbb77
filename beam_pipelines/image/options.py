"""How every image is prepared (``ImageOptions``), with the command-line flag of each option.

The flags' help, group and parsing sit on the fields (``cliflags.flag``), so that the pipeline's
command line is generated from this one declaration.
"""

from __future__ import annotations

import dataclasses
import re

from beam_pipelines.image.colour import HIGH_BIT_DEPTH_POLICIES
from beam_pipelines.image.formats import (
    DEFAULT_ACCEPTED_FORMATS,
    parse_accepted_formats,
    pillow_formats,
)
from cliflags import flag
from schemas.constants import CROPS, ENCODINGS

__all__ = ["ImageOptions", "OUT_OF_BOUNDS_POLICIES", "SMALL_IMAGE_POLICIES", "parse_background"]

OUT_OF_BOUNDS_POLICIES = ("reject", "crop")
SMALL_IMAGE_POLICIES = ("reject", "keep", "upscale")
_HEX_COLOUR = re.compile(r"^#?([0-9a-fA-F]{6})$")
_IMAGE = "image"  # the --help group of every flag here


def parse_background(text: str) -> tuple[int, int, int]:
    """Parses ``#rrggbb`` (or ``rrggbb``) into an RGB tuple.

    Raises:
      ValueError: naming the text and the expected form.
    """
    match = _HEX_COLOUR.match(text.strip())
    if not match:
        raise ValueError(f"background colour must look like '#ffffff', got {text!r}")
    value = match.group(1)
    return (int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ImageOptions:
    """How every image is prepared.

    Attributes:
      image_size: the shorter side after resizing (and the side of the square with center crop).
      crop: ``"none"`` keeps the aspect ratio; ``"center"`` crops the middle square.
      encoding: ``"jpeg"``, ``"png"`` or ``"raw"`` (uint8 HWC, needs ``crop="center"``).
      jpeg_quality: 1-95, for ``encoding="jpeg"``.
      max_pixels: inputs whose header declares more pixels are rejected before decoding.
      max_aspect_ratio: inputs whose longer side is more than this many times the shorter one
        are out of bounds (checked from the header).
      max_output_pixels: the most pixels a stored image may have (with ``crop="none"`` an
        elongated input makes a long stored image); JPEG also caps each side at 65,500.
      out_of_bounds: ``"reject"`` (``extreme_aspect_ratio`` / ``output_too_large``) or
        ``"crop"``: keep the centre of the longer side, as much as the bounds allow.
      accepted_formats: Pillow format names accepted, in the order they are tried.
      high_bit_depth: ``"shift"`` (``v >> 8``) or ``"stretch"`` (scale by the real bit depth).
      background: RGB colour that transparent pixels are composited over.
      decode_memory_mb: the address space of the worker process that prepares images
        (``bounds.BoundedPreparer``); an image needing more is rejected as ``over_budget``.
      decode_time_s: the wall time one image may take there before it is stopped and rejected
        as ``over_budget``.
      small_images: what happens to a source whose shorter side is below ``min_source_side``:
        ``"reject"`` (``too_small``), ``"keep"`` (stored at its own size) or ``"upscale"``.
      min_source_side: that threshold, in pixels (0: none).

    Raises:
      ValueError: naming the bad field and value.
    """

    image_size: int = dataclasses.field(
        default=256,
        metadata=flag(help="shorter side after resizing (%(default)s)", group=_IMAGE),
    )
    crop: str = dataclasses.field(
        default="none",
        metadata=flag(help="center: square crop (%(default)s)", group=_IMAGE, choices=CROPS),
    )
    encoding: str = dataclasses.field(
        default="jpeg",
        metadata=flag(
            help="stored encoding; raw (uint8 HWC) requires --crop center (%(default)s)",
            group=_IMAGE,
            choices=ENCODINGS,
        ),
    )
    jpeg_quality: int = dataclasses.field(
        default=90, metadata=flag(help="JPEG quality (%(default)s)", group=_IMAGE)
    )
    max_pixels: int = dataclasses.field(
        default=100_000_000,
        metadata=flag(
            help="reject images whose header declares more pixels (%(default)s)", group=_IMAGE
        ),
    )
    max_aspect_ratio: float = dataclasses.field(
        default=10.0,
        metadata=flag(
            help="longer side over shorter side above which an image is out of bounds, checked "
            "from the header (%(default)s)",
            group=_IMAGE,
        ),
    )
    max_output_pixels: int = dataclasses.field(
        default=1 << 26,
        metadata=flag(
            help="most pixels a stored image may have; JPEG also caps each side at 65500 "
            "(%(default)s)",
            group=_IMAGE,
        ),
    )
    out_of_bounds: str = dataclasses.field(
        default="reject",
        metadata=flag(
            help="images past --max_aspect_ratio or --max_output_pixels: reject them, or keep "
            "the centre of the longer side (%(default)s)",
            group=_IMAGE,
            choices=OUT_OF_BOUNDS_POLICIES,
        ),
    )
    accepted_formats: tuple[str, ...] = dataclasses.field(
        default=DEFAULT_ACCEPTED_FORMATS,
        metadata=flag(
            help="Pillow formats to accept: 'default' (every raster format Pillow decodes "
            "without external programs), a list 'JPEG,PNG', or changes 'default,+EPS,-TGA' "
            "(%(default)s)",
            group=_IMAGE,
            parse=parse_accepted_formats,
            text_default="default",
        ),
    )
    high_bit_depth: str = dataclasses.field(
        default="shift",
        metadata=flag(
            help="16-bit samples to 8: shift (v >> 8) or stretch by the real bit depth from "
            "sBIT / BitsPerSample / the largest sample, for 10-14 bit data (%(default)s)",
            group=_IMAGE,
            choices=HIGH_BIT_DEPTH_POLICIES,
        ),
    )
    background: tuple[int, int, int] = dataclasses.field(
        default=(255, 255, 255),
        metadata=flag(
            help="colour transparent pixels are composited over (%(default)s)",
            group=_IMAGE,
            parse=parse_background,
            text_default="#ffffff",
        ),
    )
    decode_memory_mb: int = dataclasses.field(
        default=1536,
        metadata=flag(
            help="address space of the process that decodes an image (one per image step "
            "thread); an image needing more is rejected as over_budget (%(default)s)",
            group=_IMAGE,
        ),
    )
    decode_time_s: float = dataclasses.field(
        default=60.0,
        metadata=flag(
            help="wall time one image may take to prepare; a slower one is stopped and "
            "rejected as over_budget (%(default)s)",
            group=_IMAGE,
        ),
    )
    small_images: str = dataclasses.field(
        default="reject",
        metadata=flag(
            help="images whose shorter side is below --min_source_side: reject them "
            "(too_small), keep them at their own size, or upscale them to --image_size like "
            "the others (%(default)s)",
            group=_IMAGE,
            choices=SMALL_IMAGE_POLICIES,
        ),
    )
    min_source_side: int = dataclasses.field(
        default=32,
        metadata=flag(
            help="shorter side below which --small_images decides; larger sources smaller "
            "than --image_size are upscaled and counted as upscaled (%(default)s)",
            group=_IMAGE,
        ),
    )

    def _check_small_images(self) -> None:
        if self.small_images not in SMALL_IMAGE_POLICIES:
            raise ValueError(
                f"small_images must be one of {SMALL_IMAGE_POLICIES}, got {self.small_images!r}"
            )
        if not isinstance(self.min_source_side, int) or self.min_source_side < 0:
            raise ValueError(
                f"min_source_side must be an int >= 0, got {self.min_source_side!r}: set "
                "--min_source_side"
            )
        if self.small_images == "keep" and self.encoding == "raw":
            raise ValueError(
                "--small_images keep stores small images at their own size, but encoding 'raw' "
                "needs one shape for all: use --small_images reject or upscale"
            )

    def __post_init__(self) -> None:
        if not isinstance(self.image_size, int) or not 1 <= self.image_size <= 16384:
            raise ValueError(f"image_size must be an int in [1, 16384], got {self.image_size!r}")
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {self.crop!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.encoding == "raw" and self.crop != "center":
            raise ValueError(
                "encoding 'raw' stores uint8 HWC arrays that must share one shape: "
                f"it requires crop 'center', got crop {self.crop!r}"
            )
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 95:
            raise ValueError(f"jpeg_quality must be an int in [1, 95], got {self.jpeg_quality!r}")
        if not isinstance(self.max_pixels, int) or self.max_pixels < 1:
            raise ValueError(f"max_pixels must be a positive int, got {self.max_pixels!r}")
        if not isinstance(self.max_aspect_ratio, (int, float)) or not self.max_aspect_ratio >= 1:
            raise ValueError(
                f"max_aspect_ratio must be a number >= 1, got {self.max_aspect_ratio!r}"
            )
        if (
            not isinstance(self.max_output_pixels, int)
            or self.max_output_pixels < self.image_size**2
        ):
            raise ValueError(
                f"max_output_pixels must be an int >= image_size**2 = {self.image_size**2}, "
                f"got {self.max_output_pixels!r}: raise --max_output_pixels or lower --image_size"
            )
        if self.out_of_bounds not in OUT_OF_BOUNDS_POLICIES:
            raise ValueError(
                f"out_of_bounds must be one of {OUT_OF_BOUNDS_POLICIES}, got {self.out_of_bounds!r}"
            )
        known = pillow_formats()
        if (
            not isinstance(self.accepted_formats, tuple)
            or not self.accepted_formats
            or any(f not in known for f in self.accepted_formats)
        ):
            raise ValueError(
                f"accepted_formats must be a non-empty tuple of Pillow format names ({known}), "
                f"got {self.accepted_formats!r}"
            )
        if self.high_bit_depth not in HIGH_BIT_DEPTH_POLICIES:
            raise ValueError(
                f"high_bit_depth must be one of {HIGH_BIT_DEPTH_POLICIES}, "
                f"got {self.high_bit_depth!r}"
            )
        if (
            not isinstance(self.background, tuple)
            or len(self.background) != 3
            or not all(isinstance(c, int) and 0 <= c <= 255 for c in self.background)
        ):
            raise ValueError(
                f"background must be an (r, g, b) tuple of ints in [0, 255], got {self.background!r}"
            )
        self._check_small_images()
        if not isinstance(self.decode_memory_mb, int) or self.decode_memory_mb < 256:
            raise ValueError(
                f"decode_memory_mb must be an int >= 256 (the decoder's own code needs about "
                f"200 MB), got {self.decode_memory_mb!r}: set --decode_memory_mb"
            )
        if not isinstance(self.decode_time_s, (int, float)) or not self.decode_time_s > 0:
            raise ValueError(
                f"decode_time_s must be a number > 0, got {self.decode_time_s!r}: set "
                "--decode_time_s"
            )
