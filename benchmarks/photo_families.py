"""Generated photo families with the spread of real photos, for the reading benchmarks.

A reader tuned on one kind of image overstates its gain on another: JPEG decode cost follows
the entropy of the stored bytes (how much detail and noise survive compression). Each family
here is a different kind of photo, deterministic from a seed and quick to make with numpy and
Pillow (about 0.1-0.2 s per 500x375 image, 0.9 s per ``large`` one on a loaded core):

==============  =======================================================  ==================
family          what it looks like                                       JPEG at 500x375
==============  =======================================================  ==================
imagenet_like   the benchmarks' original photos (``beam_pipelines.        about 93 KB, q90
                samples``): colour, stripes, soft light, mild noise
smooth          sky, studio, out-of-focus: a steep 1/f^2.6 scene, little  about 55-80 KB, q90
                noise
textured        foliage, fabric, gravel: a 1/f^2 scene under fine        about 95-125 KB, q90
                gratings
sensor          a high-ISO phone photo: a 1/f^2 scene with shot noise     about 160-180 KB,
                that grows with brightness and 2x2 chroma noise           q92 4:2:2
detail          a sharp, busy scene: a flat 1/f^1.3 spectrum, many small  about 270-360 KB,
                shapes and edges, sensor noise                           q95 4:4:4
large           the ``detail`` and ``sensor`` kinds at 0.3-12 MP          0.5-8 MB each;
                (log-uniform), as cameras and phones store them           95-115 KB scaled
==============  =======================================================  ==================

The sizes at 500x375 span the 60-400 KB range of real photos at that size (ImageNet's mean is
about 110 KB at about 400x350). ``imagenet_like`` is the family the benchmarks' README figures
were measured on, so new results stay comparable with the old.

Usage::

  from benchmarks.photo_families import FAMILIES, write_family
  paths = write_family("sensor", Path("photos"), 300, seed=0)
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from beam_pipelines.samples import (
    SAMPLE_CLASSES,
    imagenet_like_jpeg,
    write_class_jpegs,
    write_imagenet_like_jpegs,
)

__all__ = [
    "CLASSES",
    "FAMILIES",
    "DEFAULT_SIZE",
    "Family",
    "family_jpeg",
    "write_family",
]

DEFAULT_SIZE = (500, 375)
# Class folders of every family: the reader labels examples by folder, as ImageNet's.
CLASSES = tuple(SAMPLE_CLASSES)
# Largest and smallest image of the ``large`` family, in pixels.
_MIN_PIXELS, _MAX_PIXELS = 300_000, 12_000_000


@dataclasses.dataclass(frozen=True)
class Family:
    """One kind of photo.

    Attributes:
      name: the family's name (``--family`` in the benchmarks).
      pixels: ``(seed, size) -> (height, width, 3)`` uint8 array.
      quality: the JPEG quality the photos are saved at.
      subsampling: Pillow's chroma subsampling (0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0).
      sizes: ``seed -> (width, height)``; every photo 500x375 when None.
      description: one line for reports.
    """

    name: str
    pixels: Callable[[int, tuple[int, int]], np.ndarray]
    quality: int
    subsampling: int
    sizes: Callable[[int], tuple[int, int]] | None
    description: str

    def __post_init__(self) -> None:
        if not 1 <= self.quality <= 95:
            raise ValueError(f"quality must be in [1, 95], got {self.quality!r}")
        if self.subsampling not in (0, 1, 2):
            raise ValueError(f"subsampling must be 0, 1 or 2, got {self.subsampling!r}")

    def size(self, seed: int) -> tuple[int, int]:
        """The ``(width, height)`` of the photo made from ``seed``."""
        return DEFAULT_SIZE if self.sizes is None else self.sizes(seed)


def _power_law_field(
    rng: np.random.Generator, height: int, width: int, exponent: float, channels: int = 3
) -> np.ndarray:
    """``channels`` planes of noise with a 1/f^exponent power spectrum, each scaled to zero
    mean and unit variance; three are mixed as the colours of a scene are. Returns
    ``(height, width, channels)`` float32."""
    fy = np.fft.fftfreq(height).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(width).astype(np.float32)[None, :]
    radius = np.sqrt(fx * fx + fy * fy)
    radius[0, 0] = 1.0
    amplitude = radius ** (-exponent / 2)  # power ~ 1/f^exponent
    amplitude[0, 0] = 0.0
    planes = []
    for _ in range(channels):
        spectrum = rng.standard_normal(radius.shape, np.float32) + 1j * rng.standard_normal(
            radius.shape, np.float32
        )
        field = np.fft.irfft2(spectrum * amplitude, s=(height, width)).astype(np.float32)
        planes.append((field - field.mean()) / (field.std() + 1e-9))
    if channels != 3:
        return np.stack(planes, -1)
    mix = (rng.normal(size=(3, 3)) * 0.45 + np.eye(3)).astype(np.float32)
    return np.tensordot(np.stack(planes, -1), mix, axes=([2], [1])).astype(np.float32)


def _scene(rng: np.random.Generator, size: tuple[int, int], exponent: float, contrast: float):
    """A photo-like float32 scene around a random mean colour."""
    width, height = size
    scene = _power_law_field(rng, height, width, exponent) * contrast
    return scene + rng.uniform(70, 180, 3).astype(np.float32)


def _shapes(image: np.ndarray, rng: np.random.Generator, count: int, max_fraction: float):
    """Draws ``count`` flat ellipses, rectangles and lines (hard edges) onto a uint8 image."""
    picture = Image.fromarray(image)
    draw = ImageDraw.Draw(picture)
    height, width = image.shape[:2]
    for _ in range(count):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        w, h = rng.uniform(0.01, max_fraction, 2) * (width, height)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.random()
        if kind < 0.4:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=colour)
        elif kind < 0.8:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=colour)
        else:
            draw.line([x0, y0, x0 + w, y0 + h], fill=colour, width=max(1, int(width / 400)))
    return np.asarray(picture)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(values, 0, 255).astype(np.uint8)


def _smooth(seed: int, size: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng([seed, 1])
    scene = _scene(rng, size, 2.6, 45.0)
    scene += rng.normal(0.0, 1.5, scene.shape).astype(np.float32)
    return _to_uint8(scene)


def _textured(seed: int, size: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng([seed, 2])
    width, height = size
    scene = _scene(rng, size, 2.0, 30.0)
    # Fine gratings modulated by a coarse mask, as foliage or fabric covers parts of a scene.
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    scale = max(width, height) / 500.0
    texture = np.zeros((height, width), np.float32)
    for _ in range(3):
        period = rng.uniform(2.5, 7.0) * scale
        angle = rng.uniform(0, math.pi)
        phase = (x * math.cos(angle) + y * math.sin(angle)) * (2 * math.pi / period)
        texture += np.sin(phase + rng.uniform(0, 2 * math.pi))
    mask = _power_law_field(rng, height, width, 3.0, channels=1)[..., 0]
    texture *= 1.0 / (1.0 + np.exp(-2.0 * mask))
    scene += (texture * 20.0)[..., None]
    scene += rng.normal(0.0, 4.0, scene.shape).astype(np.float32)
    return _to_uint8(scene)


def _sensor_noise(rng: np.random.Generator, scene: np.ndarray, strength: float) -> np.ndarray:
    """Adds the noise of a small sensor at high ISO: shot noise growing with brightness, read
    noise, and chroma noise in 2x2 blotches (demosaicking spreads it)."""
    height, width = scene.shape[:2]
    luma = np.clip(scene.mean(axis=2, keepdims=True), 0, 255)
    shot = rng.standard_normal((height, width, 1), np.float32) * np.sqrt(luma) * (strength / 10)
    read = rng.standard_normal((height, width, 1), np.float32) * (strength / 3)
    coarse = rng.standard_normal(((height + 1) // 2, (width + 1) // 2, 3), np.float32)
    chroma = np.repeat(np.repeat(coarse, 2, axis=0), 2, axis=1)[:height, :width] * (strength / 2.5)
    return scene + shot + read + chroma


def _sensor(seed: int, size: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng([seed, 3])
    scene = _scene(rng, size, 2.0, 40.0)
    return _to_uint8(_sensor_noise(rng, scene, 12.0))


def _detail(seed: int, size: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng([seed, 4])
    width, height = size
    scene = _to_uint8(_scene(rng, size, 1.3, 38.0))
    count = int(rng.integers(60, 120) * max(1.0, width * height / 187_500) ** 0.5)
    busy = _shapes(scene, rng, count, 0.12).astype(np.float32)
    return _to_uint8(_sensor_noise(rng, busy, 10.0))


def _large(seed: int, size: tuple[int, int]) -> np.ndarray:
    # Made at a quarter of the side and enlarged (lenses and demosaicking blur at full size
    # anyway), then given full-size sensor noise: 12 MP in well under a second.
    rng = np.random.default_rng([seed, 5])
    width, height = size
    small = (max(64, width // 4), max(48, height // 4))
    kind = _detail if seed % 2 else _sensor
    base = Image.fromarray(kind(seed, small)).resize(size, Image.Resampling.BICUBIC)
    return _to_uint8(_sensor_noise(rng, np.asarray(base, np.float32), 5.0 if seed % 2 else 7.0))


def _large_size(seed: int) -> tuple[int, int]:
    rng = np.random.default_rng([seed, 6])
    pixels = math.exp(rng.uniform(math.log(_MIN_PIXELS), math.log(_MAX_PIXELS)))
    aspect = (4 / 3, 3 / 2, 16 / 9)[int(rng.integers(0, 3))]
    width = int(round(math.sqrt(pixels * aspect)))
    height = int(round(width / aspect))
    return (width, height) if rng.random() < 0.75 else (height, width)


def _imagenet_like(seed: int, size: tuple[int, int]) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(imagenet_like_jpeg(seed, size))))


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family("imagenet_like", _imagenet_like, 90, 2, None, "the original benchmark photos"),
        Family("smooth", _smooth, 90, 2, None, "smooth scenes, little noise"),
        Family("textured", _textured, 90, 2, None, "fine textures over a scene"),
        Family("sensor", _sensor, 92, 1, None, "high-ISO sensor noise, luma and chroma, 4:2:2"),
        Family("detail", _detail, 95, 0, None, "sharp, busy scenes with noise, q95 4:4:4"),
        Family("large", _large, 92, 1, _large_size, "detail and sensor kinds at 0.3-12 MP"),
    )
}


def family_jpeg(name: str, seed: int) -> bytes:
    """The JPEG bytes of photo ``seed`` of family ``name``.

    Raises:
      ValueError: naming the family, if there is none of that name.
    """
    family = _family(name)
    if family.name == "imagenet_like":
        # Exactly the bytes the benchmarks used before there were families.
        return imagenet_like_jpeg(seed, family.size(seed))
    buffer = io.BytesIO()
    image = Image.fromarray(family.pixels(seed, family.size(seed)))
    image.save(buffer, format="JPEG", quality=family.quality, subsampling=family.subsampling)
    return buffer.getvalue()


def write_family(name: str, root: Path | str, count: int, *, seed: int = 0) -> list[Path]:
    """Writes ``count`` photos of family ``name`` under ``root/<class>/``; returns their paths.

    Photos cycle through ``CLASSES``; photo ``i`` is made from seed ``seed * 1_000_003 + i``.
    ``imagenet_like`` is ``beam_pipelines.samples.write_imagenet_like_jpegs``: the same files.

    Raises:
      ValueError: naming the family, if there is none of that name, or a negative count.
    """
    _family(name)
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count!r}")
    if name == "imagenet_like":
        return write_imagenet_like_jpegs(root, count, seed=seed)
    return write_class_jpegs(
        root, count, lambda _, image_seed: family_jpeg(name, image_seed), seed=seed
    )


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown photo family {name!r}; --family takes one of {list(FAMILIES)}")
    return FAMILIES[name]
