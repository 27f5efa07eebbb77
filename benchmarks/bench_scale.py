"""Benchmark: the pipeline at scale: peak memory against the number of images, Beam's CPU
overhead per image for large records, a build killed and resumed, an ImageNet-shaped run.

Inputs are tiny distinct PNGs of noise (decoding them costs little, so the pipeline's own
costs show), in 4 class folders; the stored examples are RAW center crops, whose size the image
options fix: ``--image_size 64`` gives 12,288-byte images (the "12 KB records"), 192 gives
110,592 bytes (ImageNet-sized: JPEG-256 or RAW-192). Every pipeline run is a fresh
``python -m beam_pipelines.images_to_tfrecord`` process, as users run it.

* ``memory``: peak RSS summed over the launcher and every process under it (sampled every
  0.1 s), per N, in-process and on the 2-process DirectRunner, default options; ``--modes
  dask`` adds a run on a Dask scheduler and two workers the launcher starts itself
  (``benchmarks/on_dask.py``), so they are counted too.
* ``overhead``: Beam's CPU per image for 110 KB records, in-process: the pipeline's CPU per
  extra image (N vs 3N, so start-up cancels) minus that of a plain loop doing the same per-image
  work (read, SHA-256, ``prepare_image``, ``serialize_record``).
* ``resume``: on ImageNet-like JPEGs with default options, CPU of a clean build, then of the
  same build killed (SIGKILL) at ``--kill_at`` of the clean build's wall time and resumed with
  ``--resume``; the resumed dataset is checked to be byte-identical to the clean one. A build of
  8 images gives the start-up cost every run pays, so the ratio is also given net of it.
* ``imagenet``: one run of ``--n`` images (100,000) with 110 KB records, in-process, default
  options: peak RSS and time.
* ``buffers``: what the in-process runner holds between steps, per N (``--sizes``): the
  largest encoded size of every PCollection buffered between fused stages, grouping buffer and
  side input (``runner_buffers``), in bytes per image. Beam's FnApiRunner runs each stage to
  completion and keeps its whole output until the next stage reads it: an element per image
  that waits for a GroupByKey, a side input or a CoGroupByKey stays in memory, all of them.

``--pythonpath DIR`` runs the pipeline from another checkout (e.g. ``git archive`` of an
older commit), to measure an alternative with the same harness.

Usage::

  python -m benchmarks.bench_scale memory [--sizes 16000,64000]
      [--modes in_process,two_process,dask]
  python -m benchmarks.bench_scale overhead [--n 2000]
  python -m benchmarks.bench_scale resume [--n 6000] [--kill_at 0.7]
  python -m benchmarks.bench_scale imagenet [--n 100000] [--workdir DIR]
  python -m benchmarks.bench_scale buffers [--sizes 2000,8000]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import psutil
from PIL import Image

from beam_pipelines.engines import beam_internals

__all__ = ["write_noise_pngs", "measured_run", "runner_buffers", "main"]

CLASSES = ("cat", "dog", "fox", "owl")
TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
MODES = {"in_process": [], "two_process": TWO_PROCESSES, "dask": []}
# The module each mode runs: Dask's starts its own scheduler and two workers first.
MODULES = {"dask": "benchmarks.on_dask"}
# The inputs are 16-pixel noise, below the default --min_source_side: upscale them, not reject.
_CROP = ["--crop", "center", "--encoding", "raw", "--small_images", "upscale"]
SMALL_RECORDS = ["--image_size", "64", *_CROP]
LARGE_RECORDS = ["--image_size", "192", *_CROP]
_SAMPLE_S = 0.1


def write_noise_pngs(root: Path, n: int, *, side: int = 16, seed: int = 0) -> list[Path]:
    """Writes ``n`` distinct ``side``x``side`` noise PNGs under ``root/<class>/``."""
    rng = np.random.default_rng(seed)
    paths = []
    for name in CLASSES:
        (root / name).mkdir(parents=True, exist_ok=True)
    block = 4096
    for start in range(0, n, block):
        pixels = rng.integers(0, 256, (min(block, n - start), side, side, 3), dtype=np.uint8)
        for offset, array in enumerate(pixels):
            i = start + offset
            path = root / CLASSES[i % len(CLASSES)] / f"img_{seed:02d}_{i:07d}.png"
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, format="PNG", compress_level=1)
            path.write_bytes(buffer.getvalue())
            paths.append(path)
    return paths


def _role(proc: psutil.Process) -> str:
    """What a process runs: the module after ``-m``, else its executable's name."""
    try:
        args = proc.cmdline()
    except psutil.Error:
        return "?"
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    return Path(args[0]).name if args else "?"


class _PeakRss:
    """Samples the summed RSS of a process and everything under it, in a thread."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self.peak = 0
        self.processes = 0
        # Each process's own peak, by pid: (what it runs, peak RSS bytes).
        self.each: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._root, *self._root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                    if rss > self.each.get(proc.pid, ("", 0))[1]:
                        self.each[proc.pid] = (_role(proc), rss)
                    total += rss
                except psutil.NoSuchProcess:
                    pass
            if total > self.peak:
                self.peak, self.processes = total, len(procs)
            self._stop.wait(_SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# Beam's in-process runner, instrumented: the one module that uses Beam's private names has it.
runner_buffers = beam_internals.runner_buffer_peaks


def _env(pythonpath: str | None) -> dict[str, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def measured_run(
    args: Sequence[str],
    *,
    pythonpath: str | None = None,
    kill_after_s: float | None = None,
    cwd: str | None = None,
    module: str = "beam_pipelines.images_to_tfrecord",
) -> dict[str, float]:
    """Runs the pipeline in a fresh process; returns wall seconds, CPU seconds (the process
    and every descendant it reaped) and peak summed RSS in MB.

    ``kill_after_s``: SIGKILL the launcher (and its process group) after this many seconds.

    Raises:
      RuntimeError: with the end of stderr, if the run failed (and was not killed).
    """
    command = [sys.executable, "-m", module, *args]
    start = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=_env(pythonpath),
        # python -m puts the working directory first on the path: the tree to run must be it.
        cwd=pythonpath or cwd,
        start_new_session=True,
    )
    sampler = _PeakRss(proc.pid)
    killed = False
    stderr_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)
    reader.start()
    try:
        if kill_after_s is not None:
            try:
                proc.wait(timeout=kill_after_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # Ctrl-C, or SIGTERM (common.exit_on_sigterm): the run goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        sampler.stop()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    sampler.stop()
    reader.join(timeout=10)
    if killed:
        # Worker processes of the killed launcher's group are gone too; reap what we can.
        time.sleep(0.5)
    elif proc.returncode != 0:
        tail = b"".join(stderr_chunks).decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}):\n{tail}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "system_s": usage.ru_stime,
        "peak_mb": sampler.peak / 2**20,
        "processes": sampler.processes,
        "each_mb": sorted(
            ((role, rss / 2**20) for role, rss in sampler.each.values()), key=lambda x: -x[1]
        ),
        "killed": killed,
    }


def _pipeline_args(images: Path, output: Path, extra: Sequence[str]) -> list[str]:
    return [
        "--input", str(images), "--output", str(output), "--max_bad_fraction", "0",
        "--overwrite", "--progress", "off", *extra,
    ]  # fmt: skip


def _load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def _memory(args: argparse.Namespace, work: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    print(f"memory: 12 KB records (RAW 64x64), default options; {_load()} at start")
    print("| images | mode | peak RSS MB (all processes) | processes | wall s | CPU s |")
    print("|---:|---|---:|---:|---:|---:|")
    largest = max(sizes)
    images = work / "images"
    write_noise_pngs(images, largest)
    results: dict[tuple[str, int], float] = {}
    for n in sizes:
        subset = work / f"images-{n}"
        if n == largest:
            subset = images
        else:
            for name in CLASSES:
                (subset / name).mkdir(parents=True, exist_ok=True)
                for path in sorted((images / name).iterdir())[: n // len(CLASSES)]:
                    os.link(path, subset / name / path.name)
        for mode in modes:
            out = work / f"out-{mode}-{n}"
            r = measured_run(
                _pipeline_args(subset, out, [*SMALL_RECORDS, *MODES[mode]]),
                pythonpath=args.pythonpath,
                module=MODULES.get(mode, "beam_pipelines.images_to_tfrecord"),
            )
            results[(mode, n)] = r["peak_mb"]
            print(
                f"| {n:,} | {mode} | {r['peak_mb']:,.0f} | {r['processes']} | "
                f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} |",
                flush=True,
            )
            each = ", ".join(f"{role} {mb:,.0f}" for role, mb in r["each_mb"][:6])
            print(f"|   | each process's own peak, MB: {each} | | | | |", flush=True)
            shutil.rmtree(out, ignore_errors=True)
    if len(sizes) > 1:
        for mode in modes:
            ratio = results[(mode, largest)] / results[(mode, min(sizes))]
            print(f"{mode}: peak at {largest:,} = {ratio:.2f}x peak at {min(sizes):,}")
    print(f"{_load()} at end")


def _buffers(args: argparse.Namespace, work: Path) -> None:
    from beam_pipelines.images_to_tfrecord import run

    sizes = [int(s) for s in args.sizes.split(",")]
    found: dict[int, dict[str, int]] = {}
    for n in sizes:
        images = work / f"images-{n}"
        write_noise_pngs(images, n)
        with runner_buffers() as peaks:
            run(_pipeline_args(images, work / f"out-{n}", SMALL_RECORDS))
        found[n] = dict(peaks)
        shutil.rmtree(work / f"out-{n}", ignore_errors=True)
    largest = max(sizes)
    print("buffers: what the in-process runner holds between steps, largest size seen, bytes")
    print("per image; 12 KB records (RAW 64x64), default options")
    print("| buffered | " + " | ".join(f"{n:,} images" for n in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    names = sorted(found[largest], key=lambda name: -found[largest][name])
    for name in names:
        if found[largest][name] >= largest:  # at least a byte per image somewhere
            cells = " | ".join(f"{found[n].get(name, 0) / n:,.1f}" for n in sizes)
            print(f"| {name} | {cells} |")


def _plain_loop(paths: Sequence[Path], output: str | None = None) -> None:
    """The pipeline's per-image work with no runner: read, SHA-256, ``prepare_image``,
    ``serialize_record``. With ``output``, also what the pipeline does besides for each image
    that any conversion script would: the perceptual hash, and the record written to a TFRecord
    file (one file, ``shards.write_shard_file``).
    """
    from beam_pipelines.image.prepare import ImageOptions, prepare_image
    from beam_pipelines.output.shards import write_shard_file
    from schemas.image_example import ImageRecord, serialize_record

    options = ImageOptions(image_size=192, crop="center", encoding="raw")

    def records() -> Iterator[bytes]:
        for path in paths:
            data = path.read_bytes()
            sha = hashlib.sha256(data).hexdigest()
            prepared = prepare_image(data, options)
            if output is not None:
                _ = prepared.phash  # computed on first access, as the pipeline's catalog does
            yield serialize_record(
                ImageRecord(
                    encoded=prepared.encoded,
                    format=prepared.format,
                    height=prepared.height,
                    width=prepared.width,
                    channels=prepared.channels,
                    label=0,
                    text=path.parent.name,
                    filename=str(path),
                    sha256=sha,
                )
            )

    if output is None:
        for _ in records():
            pass
    else:
        write_shard_file(records(), output)


def touch_memory(gib: float) -> float:
    """Writes ``gib`` GiB of anonymous memory once, in a process of its own; returns its system
    CPU seconds.

    On a virtual machine the first write to a page of guest memory can be expensive (about
    13 us a page on the machine these benchmarks were written on, charged as the writing
    process's system time). A build that grows the page cache by gigabytes pays it for every
    page its files fill, and which row pays it depends on what ran before. Touching the memory
    first gives every row the same, warm, conditions.
    """
    if gib <= 0:
        return 0.0
    code = (
        "import mmap,sys\n"
        "m = mmap.mmap(-1, int(float(sys.argv[1]) * 2**30))\n"
        "for i in range(0, len(m), 4096): m[i] = 1\n"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
    subprocess.run([sys.executable, "-c", code, str(gib)], check=True)
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before


def _overhead(args: argparse.Namespace, work: Path) -> None:
    n = args.n
    small, large = work / "n", work / "3n"
    write_noise_pngs(small, n, side=48, seed=1)
    write_noise_pngs(large, 3 * n, side=48, seed=2)
    print(f"overhead: 110 KB records (RAW 192x192 from 48x48 PNGs), N={n}; {_load()} at start")
    # Before each run: the page cache its staging and shards fill (2 x 110 KB an image), and
    # 1 GiB. (Freed memory can turn cold again within minutes, so once at the start is not enough.)
    most = 0.6 * os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    touched: list[tuple[float, float]] = []

    def warm(images: int) -> None:
        gib = args.touch_memory_gib
        if gib is None:
            gib = min(images * 2 * 110e3 / 2**30 + 1, most)
        touched.append((gib, touch_memory(gib)))

    # Every row, the plain loop included, runs in fresh processes, interleaved, so that they
    # share the machine's conditions; CPU per extra image (3N - N) cancels start-up.
    # The overhead is the pipeline's CPU per image beyond each loop's: beyond the per-image work
    # alone, and beyond that work plus what a conversion script also pays for each image (the
    # perceptual hash, and writing the record once).
    loop, writing = (
        "plain loop (same per-image work)",
        "plain loop, + perceptual hash, written once",
    )
    rows = {
        loop: ("benchmarks.bench_scale", []),
        writing: ("benchmarks.bench_scale", ["--loop_output"]),
        "pipeline, in-process": ("beam_pipelines.images_to_tfrecord", []),
    }
    # (The 2-process runner is left out: its worker processes are not reaped by the launcher,
    # so their CPU does not reach this process's accounting.)
    best: dict[tuple[str, str], dict[str, float]] = {}
    for _ in range(args.repeats):
        for label, (module, extra) in rows.items():
            for size, images in (("n", small), ("3n", large)):
                if module == "benchmarks.bench_scale":
                    argv = ["loop", "--images", str(images)]
                    if extra:
                        argv += ["--loop_output", str(work / f"loop-{size}.tfrecord")]
                else:
                    argv = _pipeline_args(images, work / f"out-{size}", [*LARGE_RECORDS, *extra])
                warm(n if size == "n" else 3 * n)
                r = measured_run(argv, pythonpath=args.pythonpath, module=module)
                if (label, size) not in best or r["cpu_s"] < best[(label, size)]["cpu_s"]:
                    best[(label, size)] = r
    print(
        f"memory touched before each run: {min(g for g, _ in touched):.1f}-"
        f"{max(g for g, _ in touched):.1f} GiB, {sum(c for _, c in touched):.1f} s of system CPU"
    )

    def per_image(label: str, what: str = "cpu_s") -> float:
        return 1000 * (best[(label, "3n")][what] - best[(label, "n")][what]) / (2 * n)

    print(
        "| row | CPU ms/image | of which user | of which system | overhead beyond the "
        "per-image work | beyond the loop that writes | peak RSS MB at 3N |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label in rows:
        ms, user, system = (per_image(label, what) for what in ("cpu_s", "user_s", "system_s"))
        peak = best[(label, "3n")]["peak_mb"]
        print(
            f"| {label} | {ms:.2f} | {user:.2f} | {system:.2f} | {ms - per_image(loop):.2f} "
            f"| {ms - per_image(writing):.2f} | {peak:,.0f} |"
        )
    print(f"{_load()} at end")


def _resume(args: argparse.Namespace, work: Path) -> None:
    from beam_pipelines.samples import write_imagenet_like_jpegs

    images, tiny = work / "images", work / "tiny"
    for root, count, seed in ((images, args.n, 0), (tiny, 8, 1)):
        if args.cache is None:
            write_imagenet_like_jpegs(root, count, seed=seed)
            continue
        # Written once (they are deterministic) and hard-linked: the pipeline only reads them.
        cached = Path(args.cache) / f"imagenet-like-{count}-seed{seed}"
        if not cached.exists():
            write_imagenet_like_jpegs(cached.with_suffix(".part"), count, seed=seed)
            cached.with_suffix(".part").rename(cached)
        shutil.copytree(cached, root, copy_function=os.link)
    # Default options (JPEG 256): the per-image work of a photo dataset. Staging files scaled
    # down with the build: 2 MiB of these ~100 MB is the share 32 MiB (the default) is of 1.6 GB;
    # a kill loses at most the one file each worker has open.
    extra = [
        "--staging_file_mb",
        str(args.staging_file_mb),
        *(TWO_PROCESSES if args.two_process else []),
    ]
    print(
        f"resume: {args.n} ImageNet-like JPEGs (500x375, q90) -> JPEG 256, default options but "
        f"--staging_file_mb {args.staging_file_mb:g}, killed at {args.kill_at:.0%}; {_load()}"
    )
    clean_out, resumed_out = work / "clean", work / "resumed"
    # What any run costs before its first image (imports, graph, runner): a build of 8 images.
    startup = measured_run(
        _pipeline_args(tiny, work / "tiny-out", extra), pythonpath=args.pythonpath
    )
    clean = measured_run(_pipeline_args(images, clean_out, extra), pythonpath=args.pythonpath)
    killed = measured_run(
        _pipeline_args(images, resumed_out, extra),
        pythonpath=args.pythonpath,
        kill_after_s=args.kill_at * clean["wall_s"],
    )
    staged = sum(1 for _ in (resumed_out / ".staging" / "records").glob("*.json"))
    done = sum(1 for _ in (resumed_out / ".staging" / "done").glob("*.json"))
    resumed = measured_run(
        [*_pipeline_args(images, resumed_out, extra), "--resume"], pythonpath=args.pythonpath
    )
    clean_files = {p.name: p.read_bytes() for p in clean_out.iterdir() if p.is_file()}
    resumed_files = {p.name: p.read_bytes() for p in resumed_out.iterdir() if p.is_file()}
    differing = sorted(
        name
        for name in set(clean_files) | set(resumed_files)
        if clean_files.get(name) != resumed_files.get(name)
    )
    same = not differing and not (resumed_out / ".staging").exists()
    net = clean["cpu_s"] - startup["cpu_s"]
    print("| run | wall s | CPU s | vs clean CPU | net of start-up |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| start-up (a build of 8 images) | {startup['wall_s']:.1f} | {startup['cpu_s']:.1f} | - | - |"
    )
    print(f"| clean build | {clean['wall_s']:.1f} | {clean['cpu_s']:.1f} | 100 % | 100 % |")
    print(
        f"| killed at {args.kill_at:.0%} of its wall time ({staged} staged files, {done} done "
        f"shards) | {killed['wall_s']:.1f} | {killed['cpu_s']:.1f} | "
        f"{killed['cpu_s'] / clean['cpu_s']:.0%} | - |"
    )
    print(
        f"| --resume | {resumed['wall_s']:.1f} | {resumed['cpu_s']:.1f} | "
        f"{resumed['cpu_s'] / clean['cpu_s']:.0%} | "
        f"{(resumed['cpu_s'] - startup['cpu_s']) / net:.0%} |"
    )
    print(
        f"resumed dataset byte-identical to the clean one: {same}"
        + (f" (differing: {', '.join(differing)})" if differing else "")
        + f"; {_load()} at end"
    )


def _imagenet(args: argparse.Namespace, work: Path) -> None:
    images = work / "images"
    started = time.perf_counter()
    write_noise_pngs(images, args.n, side=48)
    print(
        f"imagenet-shaped: {args.n:,} images, 110 KB records (RAW 192), default options, "
        f"in-process (inputs written in {time.perf_counter() - started:.0f} s); {_load()}"
    )
    out = work / "dataset"
    r = measured_run(_pipeline_args(images, out, LARGE_RECORDS), pythonpath=args.pythonpath)
    size = sum(p.stat().st_size for p in out.glob("*.tfrecord"))
    print("| images | shards | dataset GB | peak RSS MB (all processes) | wall s | CPU s |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(
        f"| {args.n:,} | {len(list(out.glob('*.tfrecord')))} | {size / 1e9:.1f} | "
        f"{r['peak_mb']:,.0f} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} |"
    )
    print(f"{_load()} at end")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what", choices=("memory", "overhead", "resume", "imagenet", "buffers", "loop")
    )
    parser.add_argument("--images", default=None, help=argparse.SUPPRESS)  # loop: its input
    parser.add_argument("--loop_output", default=None, help=argparse.SUPPRESS)  # loop: writes
    parser.add_argument(
        "--sizes", default=None, help="memory (16000,64000), buffers (2000,8000): image counts"
    )
    parser.add_argument(
        "--modes",
        default="in_process,two_process",
        help=f"memory: runner modes, of {','.join(MODES)}",
    )
    parser.add_argument("--n", type=int, default=None, help="images (overhead/resume/imagenet)")
    parser.add_argument("--repeats", type=int, default=2, help="overhead: keep the best of R")
    parser.add_argument(
        "--touch_memory_gib",
        type=float,
        default=None,
        help="overhead: GiB of memory to write before each run (default: what that build's "
        "files fill, and 1; 0: none)",
    )
    parser.add_argument("--kill_at", type=float, default=0.7, help="resume: kill point")
    parser.add_argument("--two_process", action="store_true", help="resume: 2 processes")
    parser.add_argument(
        "--staging_file_mb", type=float, default=2.0, help="resume: staging file size (2)"
    )
    parser.add_argument("--pythonpath", default=None, help="run the pipeline from this tree")
    parser.add_argument("--workdir", default=None, help="where inputs and outputs go")
    parser.add_argument("--cache", default=None, help="resume: write the JPEGs here once")
    args = parser.parse_args(argv)
    if args.what == "loop":  # the overhead row's baseline, run in a process of its own
        _plain_loop(sorted(Path(args.images).glob("*/*.png")), args.loop_output)
        return 0
    defaults = {"overhead": 2000, "resume": 6000, "imagenet": 100_000}
    if args.n is None:
        args.n = defaults.get(args.what, 0)
    if args.sizes is None:
        args.sizes = "2000,8000" if args.what == "buffers" else "16000,64000"
    if args.workdir is not None:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="bench-scale-") as tmp:
        work = Path(tmp)
        modes = {"memory": _memory, "overhead": _overhead, "resume": _resume}
        modes |= {"imagenet": _imagenet, "buffers": _buffers}
        modes[args.what](args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
