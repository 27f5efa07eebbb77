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

Two near-duplicates test the leakage report (``dataset_tools.inspect``): a validation image
re-encoded at another JPEG quality, whose bytes put it in train (at ``--validation_fraction
0.2``, not stratified, as the quickstart runs), and a half-size copy of a train image filed
under another class (a possible label error). Every image also gets its own soft patches of
light and shade, so distinct images differ in their coarse structure, as photos do, and only the
planted copies come within the default near-duplicate threshold.

Everything is generated from fixed seeds: the same arguments always write the same bytes.
Each file is written under a hidden temporary name and renamed into place, so an interrupted
run (Ctrl-C, SIGTERM: it ends with one line and status 130 or 143) leaves whole files only, and
rerunning the same command writes the whole set.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from cliflags import StrictArgumentParser, command_name, plural
from cliflags.interrupts import run_command, signal_name
from objstore import write_atomic
from schemas.constants import TRAIN, VALIDATION

__all__ = [
    "SAMPLE_CLASSES",
    "ClassStyle",
    "textured_rgb",
    "scene_rgb",
    "imagenet_like_jpeg",
    "write_class_jpegs",
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


def scene_rgb(size: tuple[int, int], *, seed: int = 0) -> np.ndarray:
    """A distinct photo-like ``(height, width, 3)`` uint8 scene: 1/f colour noise and shapes.

    Natural photos have a power spectrum falling as 1/f^2; colour noise with that spectrum,
    mixed across channels and overlaid with a few flat ellipses and rectangles, gives scenes
    that differ from one another in their coarse structure, as distinct photos do. Used to
    measure near-duplicate detection (``benchmarks/bench_near_duplicates.py``).

    Args:
      size: ``(width, height)``.
      seed: different seeds give different scenes.
    """
    from PIL import ImageDraw

    width, height = size
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    radius = np.sqrt(fx * fx + fy * fy)
    radius[0, 0] = 1.0
    channels = []
    for _ in range(3):
        spectrum = (rng.normal(size=radius.shape) + 1j * rng.normal(size=radius.shape)) / radius
        spectrum[0, 0] = 0
        field = np.fft.irfft2(spectrum, s=(height, width))
        channels.append((field - field.mean()) / (field.std() + 1e-9))
    mix = rng.normal(size=(3, 3)) * 0.5 + np.eye(3)
    pixels = np.tensordot(np.stack(channels, -1), mix, axes=([2], [1])) * 40
    pixels += rng.uniform(60, 190, 3)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(2, 6))):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        w, h = rng.uniform(0.06, 0.4, 2) * (width, height)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x0, y0, x0 + w, y0 + h], fill=colour)
    return np.asarray(image)


def _write(path: Path, data: bytes) -> None:
    # Whole or not at all: an interrupted run leaves no half-written image.
    write_atomic(str(path), data)


def _jpeg(array: np.ndarray, quality: int = 90, **save_args) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="JPEG", quality=quality, **save_args)
    return buffer.getvalue()


def _lighting(size: tuple[int, int], seed: int, patches: int = 12, amplitude: float = 50.0):
    # Soft Gaussian patches of light and shade, different for every image; small and many
    # enough to give each image its own coarse structure (as the hash sees it, 32x32).
    width, height = size
    rng = np.random.default_rng(seed + 104_729)
    x = np.arange(width, dtype=np.float32)
    y = np.arange(height, dtype=np.float32)
    field = np.zeros((height, width), np.float32)
    for _ in range(patches):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        sigma = rng.uniform(0.05, 0.15) * max(width, height)
        gain = rng.uniform(-amplitude, amplitude)
        # A round Gaussian is the outer product of two 1-D ones.
        field += gain * np.outer(
            np.exp(-((y - cy) ** 2) / (2 * sigma * sigma)),
            np.exp(-((x - cx) ** 2) / (2 * sigma * sigma)),
        )
    return field


def _styled(style: ClassStyle, size: tuple[int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + 7_919)
    texture = textured_rgb(
        size,
        seed=seed,
        colour=style.colour,
        period=rng.uniform(*style.period),
        angle=rng.uniform(*style.angle),
    )
    lit = texture.astype(np.float32) + _lighting(size, seed)[..., None]
    return np.clip(lit, 0, 255).astype(np.uint8)


def imagenet_like_jpeg(seed: int, size: tuple[int, int] = (500, 375), quality: int = 90) -> bytes:
    """One ImageNet-like JPEG (about 100 KB at 500x375, quality 90)."""
    styles = list(SAMPLE_CLASSES.values())
    return _jpeg(_styled(styles[seed % len(styles)], size, seed), quality)


def write_class_jpegs(
    root: Path | str, count: int, make: Callable[[str, int], bytes], *, seed: int = 0
) -> list[Path]:
    """Writes ``count`` JPEGs ``make(class_name, image_seed)`` under ``root/<class>/``; returns
    their paths.

    Images cycle through ``SAMPLE_CLASSES``; image ``i`` gets seed ``seed * 1_000_003 + i``, so
    sets made with different seeds share no bytes.
    """
    root = Path(root)
    names = list(SAMPLE_CLASSES)
    paths = []
    for i in range(count):
        name = names[i % len(names)]
        path = root / name / f"img_{seed:03d}_{i:06d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, make(name, seed * 1_000_003 + i))
        paths.append(path)
    return paths


def write_imagenet_like_jpegs(
    root: Path | str, count: int, *, size: tuple[int, int] = (500, 375), seed: int = 0
) -> list[Path]:
    """Writes ``count`` distinct ImageNet-like JPEGs under ``root/<class>/``; returns their paths
    (``write_class_jpegs``, each class in its own style)."""
    return write_class_jpegs(
        root,
        count,
        lambda name, image_seed: _jpeg(_styled(SAMPLE_CLASSES[name], size, image_seed)),
        seed=seed,
    )


def _exif_rotated(array: np.ndarray) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated 90 degrees clockwise
    return _jpeg(np.ascontiguousarray(np.rot90(array, k=1)), exif=exif.tobytes())


def _split(data: bytes, validation_fraction: float) -> str:
    # Here, not at the top: the shard writer's module imports Apache Beam, which takes seconds
    # that a Ctrl-C would interrupt before the command's own handling is in place.
    from beam_pipelines.output.shards import assign_split

    return assign_split(hashlib.sha256(data).hexdigest(), validation_fraction)


def _plant_near_duplicates(
    root: Path, plain: list[Path], validation_fraction: float
) -> list[tuple[Path, Path]]:
    """Writes the two near-duplicates; returns ``(copy, original)`` paths.

    1. The first plain JPEG (in path order) in validation, re-encoded at the first quality from
       75 down whose bytes land in train: leakage.
    2. The first plain JPEG in train, at half size, filed under the next class, at the first
       JPEG quality from 90 down that keeps it in train: a cross-class pair.
    Without any image in validation (a tiny set) the first image is re-encoded as is.
    """
    names = sorted(SAMPLE_CLASSES)
    in_validation = [p for p in plain if _split(p.read_bytes(), validation_fraction) == VALIDATION]
    in_train = [p for p in plain if p not in in_validation]
    planted = []
    original = (in_validation or plain)[0]
    pixels = np.asarray(Image.open(original))
    for quality in range(75, 40, -1):
        data = _jpeg(pixels, quality)
        if _split(data, validation_fraction) == TRAIN:
            break
    copy = original.with_name(f"{original.stem}_reencoded.JPEG")
    _write(copy, data)
    planted.append((copy, original))
    original = (in_train or plain)[0]
    image = Image.open(original)
    half = np.asarray(image.resize((max(8, image.width // 2), max(8, image.height // 2))))
    for quality in range(90, 40, -1):
        data = _jpeg(half, quality)
        if _split(data, validation_fraction) == TRAIN:
            break
    other = names[(names.index(original.parent.name) + 1) % len(names)]
    copy = root / other / f"near_copy_of_{original.stem}.JPEG"
    _write(copy, data)
    planted.append((copy, original))
    return planted


def write_sample_set(
    root: Path | str,
    *,
    per_class: int = 100,
    size: tuple[int, int] = (500, 375),
    validation_fraction: float = 0.2,
) -> dict[str, int]:
    """Writes the sample set under ``root``.

    Args:
      root: the directory to fill.
      per_class: distinct images per class.
      size: their ``(width, height)``.
      validation_fraction: the pipeline's ``--validation_fraction`` the leakage near-duplicate
        is placed for (the quickstart's 0.2).

    Returns:
      Counts of what was written: ``images`` (good, distinct), ``bad``, ``duplicates``,
      ``near_duplicates``.

    Raises:
      ValueError: if ``per_class`` < 3 (each class holds a rotated, a PNG and a plain image),
        ``size`` is below 8x8 or ``validation_fraction`` is not in (0, 1).
    """
    if per_class < 3:
        raise ValueError(f"per_class must be >= 3, got {per_class}")
    if size[0] < 8 or size[1] < 8:
        raise ValueError(f"size must be at least 8x8, got {size[0]}x{size[1]}")
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction!r}")
    root = Path(root)
    plain: list[Path] = []
    for c, (name, style) in enumerate(SAMPLE_CLASSES.items()):
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            array = _styled(style, size, c * 100_003 + i)
            path = directory / f"{name.replace(' ', '_')}_{i:04d}.JPEG"
            if i == 0:
                _write(path, _exif_rotated(array))  # stored sideways, EXIF says rotate
            elif i == 1:
                buffer = io.BytesIO()
                Image.fromarray(array).save(buffer, format="PNG")
                _write(path, buffer.getvalue())  # the ImageNet PNG-named-.JPEG case
            else:
                _write(path, _jpeg(array))
                plain.append(path)
    _plant_near_duplicates(root, sorted(plain), validation_fraction)
    first = sorted(SAMPLE_CLASSES)[0]
    source = root / first / f"{first.replace(' ', '_')}_0002.JPEG"
    _write(root / first / "copy_of_0002.JPEG", source.read_bytes())
    good = source.read_bytes()
    bad_dir = root / sorted(SAMPLE_CLASSES)[-1]
    _write(bad_dir / "empty.JPEG", b"")
    _write(
        bad_dir / "error_page.jpg",
        b"<!DOCTYPE html>\n<html><head><title>403 Forbidden</title></head>"
        b"<body><h1>Forbidden</h1></body></html>\n",
    )
    _write(bad_dir / "truncated.JPEG", good[: len(good) // 3])
    return {
        "images": per_class * len(SAMPLE_CLASSES),
        "bad": 3,
        "duplicates": 1,
        "near_duplicates": 2,
    }


def _parse_size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"size must look like 500x375, got {text!r}") from e
    return width, height


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: writes the sample set and says what it holds."""
    parser = StrictArgumentParser(
        prog=command_name("beam_pipelines.samples"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", required=True, help="directory to fill")
    parser.add_argument("--per_class", type=int, default=100, help="images per class (100)")
    parser.add_argument("--size", type=_parse_size, default=(500, 375), help="WxH (500x375)")
    parser.add_argument(
        "--validation_fraction",
        type=float,
        default=0.2,
        help="the pipeline's --validation_fraction the leakage near-duplicate is placed for (0.2)",
    )
    args = parser.parse_args(argv)
    return run_command(
        lambda: _write_and_report(parser, args),
        on_interrupt=lambda signum: _interrupted_line(signum, Path(args.output), args.per_class),
    )


def _write_and_report(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        counts = write_sample_set(
            args.output,
            per_class=args.per_class,
            size=args.size,
            validation_fraction=args.validation_fraction,
        )
    except ValueError as e:
        parser.error(str(e))
    print(
        f"wrote {plural(counts['images'], 'image')} in {len(SAMPLE_CLASSES)} classes "
        f"({', '.join(SAMPLE_CLASSES)}), plus {plural(counts['bad'], 'bad file')}, "
        f"{plural(counts['duplicates'], 'duplicate')} and "
        f"{plural(counts['near_duplicates'], 'near-duplicate')}, to {args.output}"
    )
    return 0


def _interrupted_line(signum: int, output: Path, per_class: int) -> str:
    """The one line after Ctrl-C or SIGTERM: how much of the set ``output`` holds (every file
    in it is whole, written atomically) and how to finish it."""
    total = per_class * len(SAMPLE_CLASSES) + 6  # + 3 bad, 1 duplicate, 2 near-duplicates
    whole = sum(
        1
        for name in SAMPLE_CLASSES
        if (output / name).is_dir()
        for path in (output / name).iterdir()
        if path.is_file() and not path.name.startswith(".")
    )
    return (
        f"interrupted by {signal_name(signum)}; {output} holds {whole} of the set's {total} "
        "files, each one whole: rerun the same command to write the whole set"
    )


if __name__ == "__main__":
    sys.exit(main())
