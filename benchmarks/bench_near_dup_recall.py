"""Benchmark: near-duplicate recall per transformation, and false pairs among distinct photos.

Photos not made for this project: scikit-image's bundled sample photos (``skimage.data``), each
whole and cut into a 3x3 grid of crops, which multiplies the set. Every original is
transformed (resize 50-90 %, JPEG quality 30-70, crop 5-15 %, mirror, brightness +-10 %, and
combinations of these); originals and copies go through the pipeline's own ``prepare_image``
(256 px shorter side, JPEG q90), and each pair's distance is measured two ways:

* ``windows``: the pipeline's features (``phash.window_hashes`` of ``phash.output_sample``)
  under the crop rule (``catalog.window_hashes.window_distance``);
* ``whole frame``: the whole frame's hash alone (the catalog's ``phash``).

A mirrored copy is matched as ``near_duplicates`` matches it: ``min(d(a, b), d(a, flip(b)))``.
Recall at threshold ``t`` is the share of (original, copy) pairs within ``t`` bits; false pairs
are pairs of distinct originals within ``t`` bits (flips included).

``--false_pairs`` lists the false pairs at the largest threshold with how blank each side is
(its share of dark pixels and of pixels near its median luma, on the hash's own sample), and
how many originals are at least as dark: whether a rule that leaves near-blank images unpaired
would remove them, and what else it would leave out.

Usage::

  python -m benchmarks.bench_near_dup_recall [--thresholds 4,6,8,10,12] [--false_pairs]
"""

from __future__ import annotations

import argparse
import io
import itertools

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.phash import SAMPLE, output_sample, window_hashes
from beam_pipelines.image.prepare import prepare_image
from catalog.phash import flip_hash, hamming
from catalog.window_hashes import window_distance

__all__ = ["PHOTOS", "TRANSFORMS", "originals", "main"]

# Photographs among skimage.data's bundled images (not its drawings or synthetic ones).
PHOTOS = (
    "astronaut", "camera", "coffee", "chelsea", "rocket", "hubble_deep_field",
    "immunohistochemistry", "retina", "coins", "moon", "page", "text", "brick", "grass",
    "gravel", "cell", "stereo_motorcycle",
)  # fmt: skip


def _load(name: str) -> Image.Image:
    import skimage.data

    array = getattr(skimage.data, name)()
    array = array[0] if isinstance(array, tuple) else array
    image = Image.fromarray(np.asarray(array, dtype=np.uint8))
    return image.convert("RGB")


def originals() -> dict[str, Image.Image]:
    """Each photo whole and its 3x3 grid of crops (distinct content), by name."""
    found = {}
    for name in PHOTOS:
        image = _load(name)
        found[name] = image
        w, h = image.size
        for i, j in itertools.product(range(3), range(3)):
            box = (i * w // 3, j * h // 3, (i + 1) * w // 3, (j + 1) * h // 3)
            found[f"{name}[{i},{j}]"] = image.crop(box)
    return found


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(out.getvalue()))


def _scale(image: Image.Image, f: float) -> Image.Image:
    w, h = image.size
    return image.resize((max(1, round(w * f)), max(1, round(h * f))), Image.Resampling.LANCZOS)


def _crop(image: Image.Image, f: float) -> Image.Image:
    w, h = image.size
    dx, dy = round(w * f / 2), round(h * f / 2)
    return image.crop((dx, dy, w - dx, h - dy))


TRANSFORMS = {
    "resize 50%": lambda im: _scale(im, 0.5),
    "resize 70%": lambda im: _scale(im, 0.7),
    "resize 90%": lambda im: _scale(im, 0.9),
    "jpeg q30": lambda im: _jpeg(im, 30),
    "jpeg q50": lambda im: _jpeg(im, 50),
    "jpeg q70": lambda im: _jpeg(im, 70),
    "crop 5%": lambda im: _crop(im, 0.05),
    "crop 8%": lambda im: _crop(im, 0.08),
    "crop 10%": lambda im: _crop(im, 0.10),
    "crop 15%": lambda im: _crop(im, 0.15),
    "mirror": ImageOps.mirror,
    "brightness +10%": lambda im: ImageEnhance.Brightness(im).enhance(1.1),
    "brightness -10%": lambda im: ImageEnhance.Brightness(im).enhance(0.9),
    "resize 70% + jpeg q50": lambda im: _jpeg(_scale(im, 0.7), 50),
    "crop 5% + mirror": lambda im: ImageOps.mirror(_crop(im, 0.05)),
    "resize 50% + jpeg q30": lambda im: _jpeg(_scale(im, 0.5), 30),
    "crop 10% + mirror": lambda im: ImageOps.mirror(_crop(im, 0.10)),
    "crop 10% + resize 50% + jpeg q50": lambda im: _jpeg(_scale(_crop(im, 0.10), 0.5), 50),
}


def _hashes(image: Image.Image, options: ImageOptions) -> np.ndarray:
    """The window hashes of an image as the pipeline prepares it from a PNG file."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    sample = prepare_image(out.getvalue(), options).luma_sample
    assert sample is not None  # prepare_image always takes one
    return window_hashes([sample])[0]


def _plain(a: int, b: int) -> int:
    return min(hamming(a, b), hamming(a, flip_hash(b)))


def _distance(a: np.ndarray, b: np.ndarray, way: str) -> int:
    return window_distance(a, b) if way == "windows" else _plain(int(a[0]), int(b[0]))


def _blankness(image: Image.Image) -> tuple[float, float]:
    """(share of dark pixels, luma < 24; share within 8 of the median) of the hash's sample."""
    sample = np.frombuffer(output_sample(image.convert("RGB")), np.uint8).astype(np.float64)
    sample = sample.reshape(SAMPLE, SAMPLE)
    return float(np.mean(sample < 24)), float(np.mean(np.abs(sample - np.median(sample)) < 8))


def _print_false_pairs(
    base: dict[str, Image.Image], hashes: dict[str, np.ndarray], threshold: int
) -> None:
    blank = {name: _blankness(image) for name, image in base.items()}
    print(f"\nfalse pairs within {threshold} bits (window rule): dark share, flat share")
    for a, b in itertools.combinations(sorted(base), 2):
        d = _distance(hashes[a], hashes[b], "windows")
        if d > threshold:
            continue
        print(
            f"  {a} ({blank[a][0]:.0%} dark, {blank[a][1]:.0%} flat) ~ {b} "
            f"({blank[b][0]:.0%} dark, {blank[b][1]:.0%} flat): {d} bits"
        )
        darkest = min(blank[a][0], blank[b][0])
        others = sum(v[0] >= darkest for v in blank.values())
        print(f"    originals at least {darkest:.0%} dark: {others} of {len(blank)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--thresholds", default="4,6,8,10,12")
    parser.add_argument(
        "--false_pairs",
        action="store_true",
        help="only list the false pairs at the largest threshold and how blank each side is",
    )
    args = parser.parse_args(argv)
    thresholds = [int(t) for t in args.thresholds.split(",")]
    options = ImageOptions(small_images="upscale")
    base = {name: image for name, image in originals().items() if min(image.size) >= 32}
    hashes = {name: _hashes(image, options) for name, image in base.items()}
    print(f"{len(base)} originals from {len(PHOTOS)} skimage photos (each whole + 3x3 crops)")
    if args.false_pairs:
        _print_false_pairs(base, hashes, max(thresholds))
        return
    copies = {
        label: [_hashes(transform(im), options) for im in base.values()]
        for label, transform in TRANSFORMS.items()
    }
    for way in ("windows", "whole frame"):
        values = list(hashes.values())
        pair_d = [_distance(a, b, way) for a, b in itertools.combinations(values, 2)]
        print(f"\n{way}: recall per transformation at threshold t (Hamming bits)")
        print(f"{'transformation':34s}" + "".join(f"  t={t:<3d}" for t in thresholds))
        for label, found in copies.items():
            ds = np.array([_distance(a, b, way) for a, b in zip(values, found, strict=True)])
            cells = "".join(f"  {np.mean(ds <= t):6.1%}" for t in thresholds)
            print(f"{label:34s}{cells}")
        falses = "".join(f"  {sum(d <= t for d in pair_d):6d}" for t in thresholds)
        print(f"{'false pairs':34s}{falses}   (of {len(pair_d)} pairs of distinct originals)")


if __name__ == "__main__":
    main()
