"""Benchmark: the per-image step on real-world files, for speed and for memory.

Throughput rows (``--rows throughput``): ``prepare_image`` from two versions of
``beam_pipelines/image/prepare.py`` in one process, over the same ImageNet-like JPEGs (500x375, about
100 KB, q90, no ICC profile), the two versions taking turns on each photo and timed in CPU
seconds, so that load from other jobs on a shared machine falls on both alike. The baseline comes from a git revision
(``--baseline_rev``), the candidate from another (``--candidate_rev``) or the working tree.
Rows: photos without a profile (the 2% budget), the candidate without the perceptual hash's
per-image step (``phash.output_sample``, ``source_sample`` or ``perceptual_hash`` in older revisions; each
revision with its own ``beam_pipelines/image/phash.py``), and the candidate on the same photos
tagged with a Display P3-like profile (the cost of converting).

Memory row (``--rows memory``): peak RSS of ``python -m beam_pipelines.images_to_tfrecord`` on
the in-process DirectRunner, run in a fresh process, over a corpus of decompression bombs
(pixel-count bombs and PNG text-chunk bombs), extreme aspect ratios and 50 MP images (JPEG,
RGB and RGBA PNG, 16-bit grayscale TIFF, a PNG with an Adobe RGB profile), against the same
run over the small photos alone. Target: under 1 GB.

Usage::

  python -m benchmarks.bench_images [--rows throughput,memory] [--n 150] [--rounds 6]
      [--baseline_rev REV] [--candidate_rev REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
GIB = 1 << 30

__all__ = ["load_images_module", "throughput_rows", "memory_rows", "main"]


def _module_from(source: str, name: str) -> ModuleType:
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def _module_at(rev: str | None, where: str, name: str) -> ModuleType | None:
    """``where`` at git revision ``rev`` (None: the working tree) as a module named ``name``;
    None if it is not there."""
    if rev is None:
        return _module_from((REPO / where).read_text(), name)
    shown = subprocess.run(
        ["git", "show", f"{rev}:{where}"], cwd=REPO, capture_output=True, text=True
    )
    return _module_from(shown.stdout, name) if shown.returncode == 0 else None


def load_images_module(rev: str | None, name: str) -> ModuleType:
    """``beam_pipelines/image/prepare.py`` at git revision ``rev`` (None: the working tree), as a
    module of its own (two loads do not share a patched function); revisions before the
    packages by stage had it at ``beam_pipelines/images.py``.

    Where the revision has ``beam_pipelines/image/phash.py`` (the perceptual hash's sample),
    the image module imports that revision's, not the working tree's."""
    if rev is None:
        return _module_from((REPO / "beam_pipelines/image/prepare.py").read_text(), name)
    phash_name = "beam_pipelines.image.phash"
    current = importlib.import_module(phash_name)
    phash = _module_at(rev, "beam_pipelines/image/phash.py", f"{name}_phash")
    sys.modules[phash_name] = phash or current  # what the image module's import finds
    try:
        for where in ("beam_pipelines/image/prepare.py", "beam_pipelines/images.py"):
            module = _module_at(rev, where, name)
            if module is not None:
                return module
    finally:
        sys.modules[phash_name] = current
    raise SystemExit(f"--baseline_rev {rev}: no image module at that revision")


def _unhashed(module: ModuleType) -> ModuleType:
    """``module`` with the perceptual hash's per-image step switched off: the sample of the
    resized output (``phash.output_sample``; the decoded source's ``source_sample`` in older
    versions), or in older versions still the hash itself."""
    for step in ("output_sample", "source_sample", "perceptual_hash"):
        if hasattr(module, step):
            setattr(module, step, lambda image: None)
            return module
    return module  # a revision before the hash: nothing to switch off


def _photos(root: Path, n: int) -> list[bytes]:
    from beam_pipelines.samples import write_imagenet_like_jpegs

    return [p.read_bytes() for p in write_imagenet_like_jpegs(root, n, seed=5)]


def _with_profile(photos: list[bytes]) -> list[bytes]:
    from tests.fixtures.icc import DISPLAY_P3_PRIMARIES, matrix_trc_profile

    icc = matrix_trc_profile(DISPLAY_P3_PRIMARIES, gamma=2.2, description="P3-like")
    tagged = []
    for data in photos:
        out = io.BytesIO()
        Image.open(io.BytesIO(data)).save(out, format="JPEG", quality=90, icc_profile=icc)
        tagged.append(out.getvalue())
    return tagged


def _cpu_seconds(modules: list[ModuleType], photos: list[bytes]) -> list[float]:
    """CPU seconds each module's ``prepare_image`` spends on ``photos``, taking turns per photo.

    Turns per photo put both versions under the same load, and CPU time (not wall time) leaves
    out the time this process waits for the cores while other jobs run.
    """
    options = [module.ImageOptions() for module in modules]
    spent = [0.0] * len(modules)
    for n, data in enumerate(photos):
        order = range(len(modules)) if n % 2 == 0 else reversed(range(len(modules)))
        for i in order:  # each version goes first on every other photo
            started = time.process_time()
            modules[i].prepare_image(data, options[i])
            spent[i] += time.process_time() - started
    return spent


def throughput_rows(n: int, rounds: int, baseline_rev: str, candidate_rev: str | None) -> None:
    baseline = load_images_module(baseline_rev, "images_baseline")
    candidate = load_images_module(candidate_rev, "images_candidate")
    # The same candidate without the perceptual hash of the catalog (a cost of its own, with
    # its own benchmark): what the rest of the per-image work costs against the baseline.
    unhashed = _unhashed(load_images_module(candidate_rev, "images_unhashed"))
    with tempfile.TemporaryDirectory() as tmp:
        photos = _photos(Path(tmp), n)
    tagged = _with_profile(photos)
    modules = [baseline, candidate, unhashed]
    _cpu_seconds(modules, photos[:10] + tagged[:10])  # warm up: first-call caches, LittleCMS
    plain: list[list[float]] = []
    profiled: list[list[float]] = []
    for _ in range(rounds):
        plain.append(_cpu_seconds(modules, photos))
        profiled.append(_cpu_seconds(modules, tagged))
    ratios = [p[0] / p[1] for p in plain]  # candidate rate / baseline rate
    unhashed_ratios = [p[0] / p[2] for p in plain]
    icc_ratios = [b[0] / p[2] for b, p in zip(plain, profiled, strict=True)]

    def rate(seconds: list[float]) -> str:
        return f"{n / statistics.median(seconds):.0f}"

    name = candidate_rev or "working tree"
    print(
        f"\nprepare_image, {n} photos 500x375 q90 -> 256 px JPEG, {rounds} rounds, versions "
        f"taking turns per photo, CPU time of 1 core; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"baseline {baseline_rev}, candidate {name}")
    print("| row | images per CPU-s (median) | candidate / baseline (median, min-max) |")
    print("|---|---:|---|")
    print(f"| baseline, no profile | {rate([p[0] for p in plain])} | 1.000 |")
    print(
        f"| candidate, no profile | {rate([p[1] for p in plain])} | "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) |"
    )
    print(
        f"| candidate without the perceptual hash's sample, no profile | {rate([p[2] for p in plain])} | "
        f"{statistics.median(unhashed_ratios):.3f} "
        f"({min(unhashed_ratios):.3f}-{max(unhashed_ratios):.3f}) |"
    )
    print(f"| baseline, P3 profile (ignored) | {rate([p[0] for p in profiled])} | – |")
    print(
        f"| candidate without the hash, P3 profile (converted) | "
        f"{rate([p[2] for p in profiled])} | "
        f"{statistics.median(icc_ratios):.3f} of baseline without profile |"
    )


def _write_memory_corpus(root: Path) -> dict[str, int]:
    """Bombs, extreme aspect ratios and 50 MP images under ``root/odd``; returns counts."""
    from tests.fixtures.icc import matrix_trc_profile
    from tests.fixtures.images import jpeg_bomb_bytes, png_bomb_bytes
    from tests.fixtures.odd_images import png_of_size, png_with_text_bomb, tiff16

    odd = root / "odd"
    odd.mkdir(parents=True)
    files = {
        "bomb_png_100000x100000.png": png_bomb_bytes(100_000, 100_000),
        "bomb_png_12000x9000.png": png_bomb_bytes(12_000, 9_000),  # 108 MP: over --max_pixels
        "bomb_jpeg_60000x60000.jpg": jpeg_bomb_bytes(60_000, 60_000),
        "bomb_text_ztxt.png": png_with_text_bomb("zTXt"),
        "bomb_text_iccp.png": png_with_text_bomb("iCCP"),
        "bomb_text_many.png": png_with_text_bomb("many"),
        "line_1x20000.png": png_of_size(1, 20_000),
        "line_1x300.png": png_of_size(1, 300),
        "strip_798x20.png": png_of_size(798, 20),
        "line_2x65000.png": png_of_size(2, 65_000),
    }
    for name, data in files.items():
        (odd / name).write_bytes(data)
    width, height = 8660, 5774  # 50 MP
    y = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, width, dtype=np.float32)[None, :]
    rgb = np.empty((height, width, 3), np.uint8)
    rgb[..., 0] = (255 * x * y).astype(np.uint8)
    rgb[..., 1] = (255 * (1 - x) * y).astype(np.uint8)
    rgb[..., 2] = (255 * x * (1 - y)).astype(np.uint8)
    image = Image.fromarray(rgb)
    image.save(odd / "photo_50mp.jpg", quality=85)
    image.save(odd / "rgb_50mp.png", compress_level=1)
    image.save(odd / "adobe_rgb_50mp.png", compress_level=1, icc_profile=matrix_trc_profile())
    rgba = image.convert("RGBA")
    rgba.putalpha(Image.fromarray(rgb[..., 0]))
    rgba.save(odd / "rgba_50mp.png", compress_level=1)
    del rgba, image
    gray16 = rgb[..., 0].astype(np.uint16) * 16  # 12-bit data in 16
    (odd / "gray16_50mp.tif").write_bytes(tiff16(gray16))
    return {"files": len(files) + 5}


# Runs the pipeline as ``python -m`` would and reports the process's own peak RSS (VmHWM, which
# starts afresh at exec; ru_maxrss would carry over the parent's peak through fork).
_LAUNCHER = (
    "import atexit, runpy, sys\n"
    "def report():\n"
    "    with open('/proc/self/status') as status:\n"
    "        peak = [l.split()[1] for l in status if l.startswith('VmHWM')][0]\n"
    "    print('VMHWM_KB', peak, file=sys.stderr)\n"
    "atexit.register(report)\n"
    "sys.argv = ['images_to_tfrecord', *sys.argv[1:]]\n"
    "runpy.run_module('beam_pipelines.images_to_tfrecord', run_name='__main__')\n"
)


def _peak_rss(args: list[str]) -> tuple[int, float, int]:
    """Runs the pipeline in a fresh process; returns (peak RSS bytes, seconds, exit status)."""
    command = [sys.executable, "-c", _LAUNCHER, *args]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1) or "VMHWM_KB" not in done.stderr:
        raise RuntimeError(f"the pipeline failed ({done.returncode}):\n{done.stderr[-3000:]}")
    peak_kb = int(done.stderr.rsplit("VMHWM_KB", 1)[1].split()[0])
    return peak_kb * 1024, elapsed, done.returncode


def memory_rows() -> None:
    from beam_pipelines.samples import write_imagenet_like_jpegs

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = root / "plain"
        write_imagenet_like_jpegs(plain / "in", 16, seed=9)
        corpus = root / "corpus"
        write_imagenet_like_jpegs(corpus / "in", 16, seed=9)
        counts = _write_memory_corpus(corpus / "in")
        common = ["--num_shards", "1", "--max_bad_fraction", "1.0"]
        rows = [
            ("16 photos (500x375) only", plain / "in", []),
            (f"same + {counts['files']} odd files, defaults", corpus / "in", []),
            (
                "same, --out_of_bounds crop --high_bit_depth stretch",
                corpus / "in",
                ["--out_of_bounds", "crop", "--high_bit_depth", "stretch"],
            ),
        ]
        print(
            "\npeak RSS, python -m beam_pipelines.images_to_tfrecord, in-process DirectRunner, "
            f"fresh process per row; load average {os.getloadavg()[0]:.2f}"
        )
        print("| run | peak RSS | seconds | under 1 GB |")
        print("|---|---:|---:|---|")
        for i, (label, source, extra) in enumerate(rows):
            output = root / f"out{i}"
            args = ["--input", str(source), "--output", str(output), *common, *extra]
            peak, seconds, _ = _peak_rss(args)
            verdict = "yes" if peak < GIB else "NO"
            print(f"| {label} | {peak / 2**20:.0f} MB | {seconds:.1f} | {verdict} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="throughput,memory")
    parser.add_argument("--n", type=int, default=150, help="photos per throughput round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--baseline_rev", default="74f1be7~1", help="git revision to compare to")
    parser.add_argument("--candidate_rev", default=None, help="default: the working tree")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 photos, 2 rounds")
    args = parser.parse_args(argv)
    rows = set(args.rows.split(","))
    if args.quick:
        args.n, args.rounds = 20, 2
    if "throughput" in rows:
        throughput_rows(args.n, args.rounds, args.baseline_rev, args.candidate_rev)
    if "memory" in rows:
        memory_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
