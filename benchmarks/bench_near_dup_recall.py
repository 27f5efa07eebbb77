"""Benchmark: near-duplicate recall per transformation, and false pairs among distinct images.

Photos not made for this project: scikit-image's bundled sample photos (``skimage.data``), each
whole and cut into a 3x3 grid of crops, which multiplies the set. Every original is
transformed (resize 50-90 %, JPEG quality 30-70, crop 5-15 %, mirror, brightness +-10 %, and
combinations of these); originals and copies go through the pipeline's own ``prepare_image``
(256 px shorter side, JPEG q90) and are hashed as the pipeline hashes them: the window hashes
(``catalog.window_hashes``) of the stored image's 64x64 luma sample.

The match rule (``catalog.window_search.WindowRule``): whole frame to whole frame within
``--threshold`` bits, or a whole frame within the window threshold of one of the other's
centred windows (``--scales``), plainly or mirrored. Recall at a window threshold is the share
of (original, copy) pairs the rule joins; the same table gives the whole frame alone.

False pairs are counted on three sets of distinct images, at each window threshold:

* the photos' 170 originals (14,365 pairs);
* generated texture and noise images (``texture_images``): uniform and fractal noise, tiled
  patches, gratings, which have little coarse structure for a DCT hash to hold on to;
* the quickstart's sample set (``beam_pipelines.samples.write_sample_set``, 400 synthetic
  scenes), whose two planted near-duplicates must be found and nothing else.

``--false_pairs`` lists each false pair with the window it matched at.

Usage::

  python -m benchmarks.bench_near_dup_recall [--threshold 8] [--window_thresholds 4,5,6,7,8]
      [--scales 0.95,0.9,0.85] [--false_pairs]
"""

from __future__ import annotations

import argparse
import io
import itertools
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import prepare_image
from beam_pipelines.samples import textured_rgb, write_sample_set
from catalog.phash import FLIP_MASK
from catalog.window_hashes import window_hashes_of_samples

__all__ = ["PHOTOS", "TRANSFORMS", "originals", "texture_images", "main"]

# Photographs among skimage.data's bundled images (not its drawings or synthetic ones).
PHOTOS = (
    "astronaut", "camera", "coffee", "chelsea", "rocket", "hubble_deep_field",
    "immunohistochemistry", "retina", "coins", "moon", "page", "text", "brick", "grass",
    "gravel", "cell", "stereo_motorcycle",
)  # fmt: skip
# Every scale any rule here may use; a rule picks its columns by scale.
_ALL_SCALES = (1.0, 0.95, 0.92, 0.9, 0.88, 0.85, 0.8)


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


def _fractal(rng: np.random.Generator, size: tuple[int, int], beta: float) -> np.ndarray:
    """``(h, w)`` noise with a ``1/f^beta`` amplitude spectrum, scaled to 0-255."""
    width, height = size
    radius = np.hypot(np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :])
    radius[0, 0] = 1.0
    spectrum = (rng.normal(size=radius.shape) + 1j * rng.normal(size=radius.shape)) / radius**beta
    spectrum[0, 0] = 0
    field = np.fft.irfft2(spectrum, s=(height, width))
    field = (field - field.mean()) / (field.std() + 1e-9)
    return np.clip(128 + 45 * field, 0, 255)


def texture_images(count: int = 120, size: tuple[int, int] = (500, 375)) -> dict[str, Image.Image]:
    """Distinct images that are mostly texture or noise, by name, from fixed seeds: uniform
    noise, fractal noise (grey and colour, 1/f to 1/f^2.5), tiled random patches and gratings."""
    width, height = size
    found: dict[str, Image.Image] = {}
    for i in range(count):
        rng = np.random.default_rng(1_000 + i)
        kind = i % 6
        if kind == 0:
            pixels = rng.integers(0, 256, (height, width, 3))
        elif kind in (1, 2):
            beta = (1.0, 1.5, 2.0, 2.5)[(i // 6) % 4]
            layers = 1 if kind == 1 else 3
            pixels = np.stack([_fractal(rng, size, beta) for _ in range(layers)], -1)
            pixels = np.repeat(pixels, 3 // layers, axis=-1)
        elif kind == 3:
            side = int(rng.integers(12, 64))
            patch = rng.integers(0, 256, (side, side, 3))
            pixels = np.tile(patch, (height // side + 1, width // side + 1, 1))[:height, :width]
        elif kind == 4:
            colour = tuple(int(v) for v in rng.integers(40, 220, 3))
            pixels = textured_rgb(size, seed=i, colour=colour, noise=30.0)
        else:
            pixels = _fractal(rng, size, 2.0)[..., None] * 0.5 + rng.integers(0, 128, (1, 1, 3))
            pixels = pixels + rng.normal(0, 25, (height, width, 3))  # a soft scene under grain
        found[f"texture{i:03d}/{kind}"] = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
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
    "resize 50% + jpeg q30": lambda im: _jpeg(_scale(im, 0.5), 30),
    "crop 5% + mirror": lambda im: ImageOps.mirror(_crop(im, 0.05)),
    "crop 10% + mirror": lambda im: ImageOps.mirror(_crop(im, 0.10)),
    "crop 15% + mirror": lambda im: ImageOps.mirror(_crop(im, 0.15)),
    "crop 5% + resize 50% + jpeg q50": lambda im: _jpeg(_scale(_crop(im, 0.05), 0.5), 50),
    "crop 10% + resize 50% + jpeg q50": lambda im: _jpeg(_scale(_crop(im, 0.10), 0.5), 50),
}
# What the texture set is measured on besides its false pairs (its recall is information, not
# a target: a crop of noise shows other noise).
_TEXTURE_TRANSFORMS = ("jpeg q50", "resize 50%", "mirror", "crop 5%", "crop 10%")


def _hashes(images: list[Image.Image | bytes], options: ImageOptions) -> np.ndarray:
    """``(len(images), len(_ALL_SCALES))``: the window hashes of each image as the pipeline
    prepares it (a Pillow image is given to it as a PNG file)."""
    samples = []
    for image in images:
        if isinstance(image, Image.Image):
            out = io.BytesIO()
            image.save(out, format="PNG")
            image = out.getvalue()
        sample = prepare_image(image, options).luma_sample
        assert sample is not None  # prepare_image always takes one
        samples.append(np.frombuffer(sample, np.uint8))
    side = int(round(np.sqrt(samples[0].shape[0])))
    return window_hashes_of_samples(np.stack(samples).reshape(-1, side, side), _ALL_SCALES)


def _pair_distances(a: np.ndarray, b: np.ndarray, columns: list[int]) -> tuple[np.ndarray, ...]:
    """For rows ``a[k]``, ``b[k]`` (``(K, len(_ALL_SCALES))``): the whole-frame distance, and
    the best whole-to-window distance and the window it is at, plainly or mirrored."""

    def d(x, y):
        return np.minimum(
            np.bitwise_count(x ^ y), np.bitwise_count(x ^ y ^ np.uint64(FLIP_MASK))
        ).astype(np.int64)

    whole = d(a[:, 0], b[:, 0])
    per_window = np.stack(
        [np.minimum(d(a[:, 0], b[:, c]), d(b[:, 0], a[:, c])) for c in columns], 1
    ) if columns else np.full((a.shape[0], 1), 65)  # fmt: skip
    return whole, per_window.min(1), per_window.argmin(1)


def _joined(whole, window, threshold: int, window_threshold: int | None) -> np.ndarray:
    found = whole <= threshold
    return found if window_threshold is None else found | (window <= window_threshold)


def _all_pairs(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    first, second = np.triu_indices(hashes.shape[0], 1)
    return hashes[first], hashes[second]


def _print_recall(title, base, copies, columns, threshold, window_thresholds) -> None:
    heads = ["whole"] + [f"tw={t}" for t in window_thresholds]
    print(f"\n{title}: recall at t={threshold} (whole frame alone, then with the windows)")
    print(f"{'transformation':34s}" + "".join(f"  {h:>6s}" for h in heads))
    for label, found in copies.items():
        whole, window, _ = _pair_distances(base, found, columns)
        rates = [
            np.mean(_joined(whole, window, threshold, tw)) for tw in [None, *window_thresholds]
        ]
        print(f"{label:34s}" + "".join(f"  {r:6.1%}" for r in rates))


def _false_pairs(name, hashes, columns, threshold, window_thresholds, allowed=()) -> None:
    first, second = np.triu_indices(hashes.shape[0], 1)
    whole, window, _ = _pair_distances(hashes[first], hashes[second], columns)
    planted = np.zeros(first.shape[0], bool)
    for a, b in allowed:
        planted |= ((first == a) & (second == b)) | ((first == b) & (second == a))
    counts = [
        int((_joined(whole, window, threshold, tw) & ~planted).sum())
        for tw in [None, *window_thresholds]
    ]
    found = [bool(_joined(whole, window, threshold, None)[planted].all())] if allowed else []
    line = f"{'false pairs, ' + name:34s}" + "".join(f"  {c:6d}" for c in counts)
    note = f"   (of {first.shape[0]} pairs" + (
        f"; planted pairs found: {found})" if allowed else ")"
    )
    print(line + note)


def _list_false_pairs(names, hashes, columns, scales, threshold, window_threshold) -> None:
    first, second = np.triu_indices(hashes.shape[0], 1)
    whole, window, at = _pair_distances(hashes[first], hashes[second], columns)
    for k in np.flatnonzero(_joined(whole, window, threshold, window_threshold)):
        where = f"whole {whole[k]} bits" if whole[k] <= threshold else (
            f"window {scales[at[k]]}: {window[k]} bits"
        )  # fmt: skip
        print(f"  {names[first[k]]} ~ {names[second[k]]}: {where}")


def _quickstart() -> tuple[list[str], np.ndarray, list[tuple[int, int]]]:
    """The quickstart sample set's images (the exact copy and the bad files left out), their
    hashes, and the positions of its two planted near-duplicate pairs."""
    with tempfile.TemporaryDirectory() as tmp:
        write_sample_set(tmp)
        paths = sorted(p for p in Path(tmp).rglob("*") if p.is_file())
        chosen, data = [], []
        for path in paths:
            if path.name.startswith("copy_of_") or path.stat().st_size < 4096:
                continue  # the exact copy (one example in a build), the bad files
            try:
                hashes_of = _hashes([path.read_bytes()], ImageOptions())
            except Exception:  # the truncated file is rejected by the pipeline too
                continue
            chosen.append(path.relative_to(tmp).as_posix())
            data.append(hashes_of[0])
    planted = []
    for i, name in enumerate(chosen):
        stem = Path(name).stem
        if stem.endswith("_reencoded"):
            original = name.replace("_reencoded", "")
        elif stem.startswith("near_copy_of_"):
            original = next(n for n in chosen if Path(n).stem == stem[len("near_copy_of_") :])
        else:
            continue
        planted.append((i, chosen.index(original)))
    return chosen, np.stack(data), planted


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threshold", type=int, default=8, help="whole frame to whole frame")
    parser.add_argument("--window_thresholds", default="4,5,6,7,8")
    parser.add_argument("--scales", default="0.95,0.9,0.85", help="the windows besides 1.0")
    parser.add_argument(
        "--false_pairs",
        action="store_true",
        help="list the false pairs at the largest window threshold instead of the tables",
    )
    args = parser.parse_args(argv)
    window_thresholds = [int(t) for t in args.window_thresholds.split(",")]
    scales = [float(s) for s in args.scales.split(",") if s]
    columns = [_ALL_SCALES.index(s) for s in scales]
    t = args.threshold
    photo_options = ImageOptions(small_images="upscale")
    base_images = {n: im for n, im in originals().items() if min(im.size) >= 32}
    base = _hashes(list(base_images.values()), photo_options)
    textures = texture_images()
    texture_hashes = _hashes(list(textures.values()), ImageOptions())
    scenes, scene_hashes, planted = _quickstart()
    print(
        f"{len(base_images)} originals from {len(PHOTOS)} skimage photos (each whole + 3x3 "
        f"crops); {len(textures)} texture/noise images; {len(scenes)} quickstart images; "
        f"windows {[1.0, *scales]}"
    )
    if args.false_pairs:
        tw = max(window_thresholds)
        for names, hashes in ((list(base_images), base), (list(textures), texture_hashes)):
            _list_false_pairs(names, hashes, columns, scales, t, tw)
        _list_false_pairs(scenes, scene_hashes, columns, scales, t, tw)
        return
    copies = {
        label: _hashes([transform(im) for im in base_images.values()], photo_options)
        for label, transform in TRANSFORMS.items()
    }
    _print_recall("photos", base, copies, columns, t, window_thresholds)
    _false_pairs("photos", base, columns, t, window_thresholds)
    _false_pairs("textures", texture_hashes, columns, t, window_thresholds)
    _false_pairs("quickstart", scene_hashes, columns, t, window_thresholds, planted)
    texture_copies = {
        label: _hashes([TRANSFORMS[label](im) for im in textures.values()], ImageOptions())
        for label in _TEXTURE_TRANSFORMS
    }
    _print_recall("textures", texture_hashes, texture_copies, columns, t, window_thresholds)


if __name__ == "__main__":
    main()
