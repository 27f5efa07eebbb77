"""A bundled sample image set, and ImageNet-like JPEGs for benchmarks.

Usage::

  python -m beam_pipelines.samples --output DIR [--per_class N] [--size WxH]

The sample set is laid out as ``<class name>/<image file>`` like an ImageNet training folder:
four classes (one name has a space, one a non-ASCII letter) of synthetic photo-like JPEGs,
about 500x375 at quality 90, each class with its own dominant colour and texture so that a small
CNN learns to tell them apart in a few hundred steps at 64-96 px. It also holds the files real
datasets hold: an empty file, an HTML error page saved as ``.jpg``, a truncated JPEG, one exact
duplicate, a PNG named ``.JPEG`` and an EXIF-rotated JPEG. With the default 100 images per
class the 3 bad files stay under the pipeline's default ``--max_bad_fraction`` of 1%.

Everything is generated from fixed seeds: the same arguments always write the same bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

__all__ = [
    "SAMPLE_CLASSES",
    "ClassStyle",
    "textured_rgb",
    "imagenet_like_jpeg",
    "write_imagenet_like_jpegs",
    "write_sample_set",
    "main",
]


@dataclasses.dataclass(frozen=True)
class ClassStyle:
    """How one synthetic class looks: a dominant colour and a stripe pattern."""

    colour: tuple[int, int, int]
    period: tuple[int, int]  # stripe period range in pixels
    angle: tuple[float, float]  # stripe angle range in radians


SAMPLE_CLASSES: dict[str, ClassStyle] = {
    "desert": ClassStyle((205, 170, 95), (40, 70), (0.0, 0.3)),
    "forêt": ClassStyle((45, 120, 50), (8, 14), (1.2, 1.9)),
    "ocean": ClassStyle((30, 80, 170), (18, 30), (0.0, 3.1)),
    "red fox": ClassStyle((190, 75, 30), (5, 9), (0.6, 0.9)),
}


def textured_rgb(
    size: tuple[int, int],
    *,
    seed: int = 0,
    colour: tuple[int, int, int] = (128, 128, 128),
    period: float | None = None,
    angle: float | None = None,
    noise: float = 18.0,
) -> np.ndarray:
    """A photo-like ``(height, width, 3)`` uint8 array: colour, stripes, a gradient and noise.

    Args:
      size: ``(width, height)``.
      seed: varies texture and noise; different seeds give different bytes.
      colour: the dominant colour.
      period: stripe period in pixels (default derived from ``seed``).
      angle: stripe angle in radians (default derived from ``seed``).
      noise: standard deviation of the Gaussian noise, in 8-bit levels.
    """
    width, height = size
    rng = np.random.default_rng(seed)
    period = float(period if period is not None else 6 + (seed % 7) * 3)
    angle = float(angle if angle is not None else (seed % 11) / 11 * np.pi)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    stripes = np.sin((x * np.cos(angle) + y * np.sin(angle)) * (2 * np.pi / period))
    gradient = (x / max(width - 1, 1) - 0.5) * 40 + (y / max(height - 1, 1) - 0.5) * 20
    base = np.asarray(colour, np.float32)[None, None, :]
    tint = rng.uniform(-25, 25, 3).astype(np.float32)[None, None, :]
    image = base + tint + (stripes * 35 + gradient)[..., None]
    image += rng.normal(0.0, noise, (height, width, 3)).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def _jpeg(array: np.ndarray, quality: int = 90, **save_args) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality, **save_args)
    return buffer.getvalue()


def _styled(style: ClassStyle, size: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 7_919)
    return textured_rgb(
        size,
        seed=seed,
        colour=style.colour,
        period=rng.uniform(*style.period),
        angle=rng.uniform(*style.angle),
    )


def imagenet_like_jpeg(seed: int, size: tuple[int, int] = (500, 375), quality: int = 90) -> bytes:
    """One ImageNet-like JPEG (about 100 KB at 500x375, quality 90)."""
    styles = list(SAMPLE_CLASSES.values())
    return _jpeg(_styled(styles[seed % len(styles)], size, seed), quality)


def write_imagenet_like_jpegs(
    root: Path | str, count: int, *, size: tuple[int, int] = (500, 375), seed: int = 0
) -> list[Path]:
    """Writes ``count`` distinct ImageNet-like JPEGs under ``root/<class>/``; returns their paths.

    Images cycle through ``SAMPLE_CLASSES``; ``seed`` offsets every image's seed, so sets made
    with different seeds share no bytes.
    """
    root = Path(root)
    names = list(SAMPLE_CLASSES)
    paths = []
    for i in range(count):
        name = names[i % len(names)]
        path = root / name / f"img_{seed:03d}_{i:06d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(_jpeg(_styled(SAMPLE_CLASSES[name], size, seed * 1_000_003 + i)))
        paths.append(path)
    return paths


def _exif_rotated(array: np.ndarray) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise
    return _jpeg(np.ascontiguousarray(np.rot90(array, k=1)), exif=exif.tobytes())


def write_sample_set(
    root: Path | str, *, per_class: int = 100, size: tuple[int, int] = (500, 375)
) -> dict[str, int]:
    """Writes the sample set under ``root``.

    Returns:
      Counts of what was written: ``images`` (good, distinct), ``bad``, ``duplicates``.

    Raises:
      ValueError: if ``per_class`` < 3 (each class holds a rotated, a PNG and a plain image)
        or ``size`` is below 8x8.
    """
    if per_class < 3:
        raise ValueError(f"per_class must be >= 3, got {per_class}")
    if size[0] < 8 or size[1] < 8:
        raise ValueError(f"size must be at least 8x8, got {size[0]}x{size[1]}")
    root = Path(root)
    for c, (name, style) in enumerate(SAMPLE_CLASSES.items()):
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            array = _styled(style, size, c * 100_003 + i)
            path = directory / f"{name.replace(' ', '_')}_{i:04d}.JPEG"
            if i == 0:
                path.write_bytes(_exif_rotated(array))  # stored sideways, EXIF says rotate
            elif i == 1:
                buffer = io.BytesIO()
                Image.fromarray(array).save(buffer, format="PNG")
                path.write_bytes(buffer.getvalue())  # the ImageNet PNG-named-.JPEG case
            else:
                path.write_bytes(_jpeg(array))
    first = sorted(SAMPLE_CLASSES)[0]
    source = root / first / f"{first.replace(' ', '_')}_0002.JPEG"
    (root / first / "copy_of_0002.JPEG").write_bytes(source.read_bytes())
    good = source.read_bytes()
    bad_dir = root / sorted(SAMPLE_CLASSES)[-1]
    (bad_dir / "empty.JPEG").write_bytes(b"")
    (bad_dir / "error_page.jpg").write_bytes(
        b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>"
        b"<body><h1>Forbidden</h1></body></html>\n"
    )
    (bad_dir / "truncated.JPEG").write_bytes(good[: len(good) // 3])
    return {"images": per_class * len(SAMPLE_CLASSES), "bad": 3, "duplicates": 1}


def _parse_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size must look like 500x375, got {text!r}") from e
    return width, height


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: writes the sample set and says what it holds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="directory to fill")
    parser.add_argument("--per_class", type=int, default=100, help="images per class (100)")
    parser.add_argument("--size", type=_parse_size, default=(500, 375), help="WxH (500x375)")
    args = parser.parse_args(argv)
    try:
        counts = write_sample_set(args.output, per_class=args.per_class, size=args.size)
    except ValueError as e:
        parser.error(str(e))
    print(
        f"wrote {counts['images']} images in {len(SAMPLE_CLASSES)} classes "
        f"({', '.join(SAMPLE_CLASSES)}), plus {counts['bad']} bad files and "
        f"{counts['duplicates']} duplicate, to {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
