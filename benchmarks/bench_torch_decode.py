"""Benchmark: the PyTorch loader's per-example image step, decoders and resizers side by side.

Each candidate turns one stored JPEG (the pipeline's own bytes: ``prepare_image`` at
``--stored`` 256, quality 90, 4:2:0, of ``--family`` photos) into its training crop: the same
random-resized-crop window per photo for every candidate (``random_crop_window``, seed = photo
index), bilinear resize to ``--image_size`` and the seed's flip, written into one preallocated
``(S, S, 3)`` uint8 array. Cost is CPU time (``time.process_time``, all threads) per example,
single-threaded (``torch.set_num_threads(1)``, ``cv2.setNumThreads(1)``). Candidates take turns
photo by photo, so that load from other jobs falls on all alike; the table gives each one's
median over rounds and its median ratio to the baseline of the same round. The baseline is
what PyTorch users write today: ``torchvision.io.decode_jpeg`` + ``resized_crop`` + ``hflip``.

"MAD" is the mean absolute difference, in 0-255 levels, from the reference: Pillow's decode of
the whole image, ``resize(box=window)`` bilinear, flip. Pillow's bilinear antialiases when it
shrinks and OpenCV's (the TensorFlow reader's kind) does not, so paths with OpenCV differ from it
a little even when they decode exactly alike.

Rows that need a library that is not installed are left out: PyTurboJPEG (with Debian's
libturbojpeg0), nvImageCodec (``nvidia-nvimgcodec-cu12``, CPU backend) and the crop-window
decode through TurboJPEG 3 (set ``TFRECORD_IO_TURBOJPEG`` to a libturbojpeg of libjpeg-turbo 3).

The second table (``--rows normalize``) is the batch step: uint8 ``(B, S, S, 3)`` to normalised
float32, per image, against ``(images.float() - mean) / std``.

Usage::

  python -m benchmarks.bench_torch_decode [--rows decode,normalize] [--n 200] [--rounds 7]
      [--family imagenet_like] [--image_size 224] [--stored 256] [--quick]
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from collections.abc import Callable

import cv2
import numpy as np
import simplejpeg
import torch
from PIL import Image
from torchvision.io import decode_jpeg
from torchvision.transforms.v2 import functional as tvf

from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import prepare_image
from benchmarks.photo_families import FAMILIES, family_jpeg
from tfrecord_io.torch.image import (
    MEAN_RGB,
    STDDEV_RGB,
    CropWindow,
    ImageSpec,
    decode_into,
    jpeg_decoder,
    normalize_batch,
    random_crop_window,
)

__all__ = ["candidates", "main", "photos", "time_rounds"]

# One candidate: (stored JPEG, crop window, output array) -> None, writing the crop into out.
Candidate = Callable[[bytes, CropWindow, np.ndarray], None]


def photos(family: str, count: int, stored: int) -> list[bytes]:
    """``count`` photos of ``family`` as the pipeline stores them at shorter side ``stored``."""
    options = ImageOptions(image_size=stored)
    return [prepare_image(family_jpeg(family, seed), options).encoded for seed in range(count)]


def _torchvision(antialias: bool) -> Candidate:
    def run(data: bytes, window: CropWindow, out: np.ndarray) -> None:
        image = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        y, x, h, w, flip = window
        image = tvf.resized_crop(image, y, x, h, w, [out.shape[0]] * 2, antialias=antialias)
        if flip:
            image = tvf.horizontal_flip(image)
        torch.from_numpy(out).copy_(image.permute(1, 2, 0))

    return run


def _pillow_finish(image: Image.Image, window: CropWindow, out: np.ndarray) -> None:
    y, x, h, w, flip = window
    image = image.resize(out.shape[:2], Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    np.copyto(out, np.asarray(image))


def pillow(data: bytes, window: CropWindow, out: np.ndarray) -> None:
    """The reference: Pillow decodes everything, then ``resize(box=...)``."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        _pillow_finish(image, window, out)


def _pillow_draft(data: bytes, window: CropWindow, out: np.ndarray) -> None:
    # Pillow's decoder settings ``(scale, draft)``: draft=1 is libjpeg's fast IDCT and plain
    # chroma upsampling; ``Image.draft`` itself only sets it with a reduced scale.
    with Image.open(io.BytesIO(data)) as image:
        image.decoderconfig = (1, 1)
        image.load()
        _pillow_finish(image, window, out)


def _opencv_finish(pixels: np.ndarray, window: CropWindow, out: np.ndarray) -> None:
    y, x, h, w, flip = window
    cv2.resize(pixels[y : y + h, x : x + w], out.shape[:2], dst=out, interpolation=cv2.INTER_LINEAR)
    if flip:
        cv2.flip(out, 1, dst=out)


def _simplejpeg(fast: bool, finish: str) -> Candidate:
    def run(data: bytes, window: CropWindow, out: np.ndarray) -> None:
        pixels = simplejpeg.decode_jpeg(data, fastdct=fast, fastupsample=fast)
        if finish == "opencv":
            _opencv_finish(pixels, window, out)
        elif finish == "pillow":
            _pillow_finish(Image.fromarray(pixels), window, out)
        else:
            y, x, h, w, flip = window
            crop = torch.from_numpy(pixels[y : y + h, x : x + w]).permute(2, 0, 1)[None]
            size = list(out.shape[:2])
            image = torch.nn.functional.interpolate(crop, size=size, mode="bilinear")[0]
            torch.from_numpy(out).copy_((image.flip(-1) if flip else image).permute(1, 2, 0))

    return run


def _opencv_decode(data: bytes, window: CropWindow, out: np.ndarray) -> None:
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)
    _opencv_finish(pixels, window, out)


def _decode_into(spec: ImageSpec, seeds: dict[bytes, int]) -> Candidate:
    def run(data: bytes, window: CropWindow, out: np.ndarray) -> None:
        decode_into(data, out, seed=seeds[data], spec=spec)

    return run


def _optional_candidates() -> dict[str, Candidate]:
    """PyTurboJPEG and nvImageCodec rows, where they are installed."""
    found: dict[str, Candidate] = {}
    try:
        import turbojpeg

        library = turbojpeg.TurboJPEG()
        flags = turbojpeg.TJFLAG_FASTDCT | turbojpeg.TJFLAG_FASTUPSAMPLE

        def pyturbojpeg(data: bytes, window: CropWindow, out: np.ndarray) -> None:
            pixels = library.decode(data, pixel_format=turbojpeg.TJPF_RGB, flags=flags)
            _opencv_finish(pixels, window, out)

        found["PyTurboJPEG fast + OpenCV (whole image)"] = pyturbojpeg
    except (ImportError, AttributeError, OSError, RuntimeError):
        pass
    try:
        from nvidia import nvimgcodec as nv

        decoder = nv.Decoder(
            device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
            max_num_cpu_threads=1,
            backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
            options=":fancy_upsampling=0 libjpeg_turbo_decoder:fast_idct=1",
        )
        params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB)

        def nvimgcodec(data: bytes, window: CropWindow, out: np.ndarray) -> None:
            y, x, h, w, flip = window
            region = nv.Region(y, x, y + h, x + w)
            stream = nv.CodeStream(data).get_sub_code_stream(region=region)
            pixels = np.asarray(decoder.decode(stream, params=params))
            _opencv_finish(pixels, CropWindow(0, 0, h, w, flip), out)

        found["nvImageCodec CPU, window only, fast + OpenCV"] = nvimgcodec
    except (ImportError, AttributeError, OSError, RuntimeError):
        pass
    return found


# decode_into's JPEG options per row: (label, jpeg_dct_method, jpeg_fast_upsampling).
_DECODE_INTO_ROWS = (
    ("accurate IDCT + upsampling", "", False),
    ("fast IDCT only", "INTEGER_FAST", False),
    ("fast upsampling only", "", True),
    ("fast both (default)", "INTEGER_FAST", True),
)


def candidates(data: list[bytes], image_size: int) -> dict[str, Candidate]:
    """The rows of the decode table, baseline first."""
    seeds = {photo: seed for seed, photo in enumerate(data)}
    rows: dict[str, Candidate] = {
        "torchvision decode_jpeg + resized_crop (baseline)": _torchvision(antialias=True),
        "torchvision, resized_crop antialias=False": _torchvision(antialias=False),
        "Pillow: decode, resize(box=), flip": pillow,
        "Pillow, fast IDCT + upsampling": _pillow_draft,
        "simplejpeg + Pillow resize(box=)": _simplejpeg(False, "pillow"),
        "simplejpeg + torch interpolate": _simplejpeg(False, "torch"),
        "simplejpeg + OpenCV": _simplejpeg(False, "opencv"),
        "simplejpeg fast + OpenCV": _simplejpeg(True, "opencv"),
        "OpenCV imdecode + OpenCV": _opencv_decode,
    }
    rows.update(_optional_candidates())
    for label, dct, upsampling in _DECODE_INTO_ROWS:
        spec = ImageSpec(
            image_size=image_size,
            training=True,
            jpeg_dct_method=dct,
            jpeg_fast_upsampling=upsampling,
            crop_decode=False,
        )
        rows[f"decode_into, whole image, {label}"] = _decode_into(spec, seeds)
    spec = ImageSpec(image_size=image_size, training=True)
    if jpeg_decoder(spec).startswith("turbojpeg3"):
        rows["decode_into, TurboJPEG 3 window only, fast both"] = _decode_into(spec, seeds)
    return rows


def time_rounds(
    rows: dict[str, Candidate],
    data: list[bytes],
    windows: list[CropWindow],
    image_size: int,
    rounds: int,
) -> dict[str, list[float]]:
    """Per row, the CPU microseconds per example of each round.

    The rows take turns photo by photo (each photo through every row, starting from a
    different row each time), so that a burst of load from other jobs falls on all rows alike.
    """
    out = np.empty((image_size, image_size, 3), np.uint8)
    runs = list(rows.items())
    times: dict[str, list[float]] = {name: [] for name in rows}
    clock = time.process_time
    for _ in range(rounds):
        spent = dict.fromkeys(rows, 0.0)
        for index, (photo, window) in enumerate(zip(data, windows, strict=True)):
            first = index % len(runs)
            for name, run in runs[first:] + runs[:first]:
                start = clock()
                run(photo, window, out)
                spent[name] += clock() - start
        for name, value in spent.items():
            times[name].append(value / len(data) * 1e6)
    return times


def _differences(
    rows: dict[str, Candidate], data: list[bytes], windows: list[CropWindow], image_size: int
) -> dict[str, float]:
    """Per row, the mean absolute difference from ``pillow``'s output over the photos."""
    ours = np.empty((image_size, image_size, 3), np.uint8)
    reference = np.empty_like(ours)
    total = dict.fromkeys(rows, 0.0)
    for photo, window in zip(data, windows, strict=True):
        pillow(photo, window, reference)
        for name, run in rows.items():
            run(photo, window, ours)
            total[name] += float(np.abs(ours.astype(np.int16) - reference).mean())
    return {name: value / len(data) for name, value in total.items()}


def _ratios(times: dict[str, list[float]]) -> dict[str, list[float]]:
    baseline = next(iter(times.values()))
    return {name: [t / b for t, b in zip(v, baseline, strict=True)] for name, v in times.items()}


def decode_rows(args: argparse.Namespace) -> None:
    data = photos(args.family, args.n, args.stored)
    spec = ImageSpec(image_size=args.image_size, training=True)
    windows = []
    for seed, photo in enumerate(data):
        height, width, _, _ = simplejpeg.decode_jpeg_header(photo)
        windows.append(random_crop_window(height, width, seed, spec))
    rows = candidates(data, args.image_size)
    checked = min(len(data), 50)
    differences = _differences(rows, data[:checked], windows[:checked], args.image_size)
    times = time_rounds(rows, data, windows, args.image_size, args.rounds)
    ratios = _ratios(times)
    area = statistics.mean(w.height * w.width for w in windows) / statistics.mean(
        h * w for h, w, _, _ in map(simplejpeg.decode_jpeg_header, data)
    )
    print(
        f"\n{len(data)} {args.family} photos stored at {args.stored} px (mean "
        f"{statistics.mean(map(len, data)) / 1024:.1f} KiB), random resized crop to "
        f"{args.image_size} (mean window {area:.0%} of the image) + flip; {args.rounds} rounds, "
        f"1 thread; JPEG decoder of decode_into: {jpeg_decoder(spec)}"
    )
    print("| candidate | CPU us/example (median) | / baseline (median, min-max) | MAD vs Pillow |")
    print("|---|---:|---|---:|")
    for name, values in times.items():
        ratio = ratios[name]
        print(
            f"| {name} | {statistics.median(values):.0f} | {statistics.median(ratio):.3f} "
            f"({min(ratio):.2f}-{max(ratio):.2f}) | {differences[name]:.2f} |"
        )
    _seed_rows(spec, windows)


def _seed_rows(spec: ImageSpec, windows: list[CropWindow]) -> None:
    """What turning a seed into a window costs: ours (BLAKE2b) against numpy's Philox."""
    count = 20_000

    def philox(seed: int) -> None:
        np.random.Generator(np.random.Philox(key=seed)).random(8).tolist()

    timings = {}
    for name, run in (
        ("random_crop_window (BLAKE2b stream)", lambda s: random_crop_window(256, 341, s, spec)),
        ("np.random.Generator(Philox(key=seed)) + 8 floats", philox),
    ):
        start = time.process_time()
        for seed in range(count):
            run(seed)
        timings[name] = (time.process_time() - start) / count * 1e6
    print("\n| per-example randomness | CPU us/example |\n|---|---:|")
    for name, value in timings.items():
        print(f"| {name} | {value:.1f} |")


def normalize_rows(args: argparse.Namespace) -> None:
    batch, size = 64, args.image_size
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8))
    mean, std = torch.tensor(MEAN_RGB), torch.tensor(STDDEV_RGB)
    hwc, chw = torch.empty(batch, size, size, 3), torch.empty(batch, 3, size, size)
    rows: dict[str, Callable[[], object]] = {
        "(images.float() - mean) / std, HWC (baseline)": lambda: (images.float() - mean) / std,
        "the same, then .permute(0, 3, 1, 2).contiguous()": lambda: (
            ((images.float() - mean) / std).permute(0, 3, 1, 2).contiguous()
        ),
        "normalize_batch(layout='HWC', out=...)": lambda: normalize_batch(images, out=hwc),
        "normalize_batch(layout='CHW', out=...)": lambda: normalize_batch(
            images, layout="CHW", out=chw
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, run in rows.items():
            start = time.process_time()
            run()
            times[name].append((time.process_time() - start) / batch * 1e6)
    ratios = _ratios(times)
    print(f"\nuint8 ({batch}, {size}, {size}, 3) -> normalised float32, {args.rounds} rounds")
    print("| batch step | CPU us/image (median) | / baseline (median) |\n|---|---:|---:|")
    for name, values in times.items():
        print(
            f"| {name} | {statistics.median(values):.0f} | {statistics.median(ratios[name]):.3f} |"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="decode,normalize")
    parser.add_argument("--n", type=int, default=200, help="photos per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--family", default="imagenet_like", choices=sorted(FAMILIES))
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--stored", type=int, default=256, help="stored shorter side")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 30 photos, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.rounds = 30, 2
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    rows = set(args.rows.split(","))
    if "decode" in rows:
        decode_rows(args)
    if "normalize" in rows:
        normalize_rows(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
