"""The steady-state harness of the pipeline and engine benchmarks.

Each row is timed on N and on 3N images, and its steady-state rate is
``2N / (t(3N) - t(N))``, so start-up (imports, worker processes, graph submission) cancels out.
CPU time is counted too, over this process, its reaped children and any other processes named
(a Dask scheduler and workers): on a shared machine it does not depend on other load.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from PIL import Image, ImageOps

from beam_pipelines.samples import write_imagenet_like_jpegs
from benchmarks.common import run_module
from schemas.manifest import MANIFEST_NAME, Manifest

__all__ = [
    "IMAGE_SIZE",
    "chosen_engines",
    "NoisyMeasurement",
    "add_size_flags",
    "cpu_seconds",
    "photo_sets",
    "pillow_loop",
    "pillow_loops_at_once",
    "pipeline_run",
    "sizes_from_flags",
    "steady_rate",
    "steady_rates",
]

IMAGE_SIZE = 256  # the pipeline's default --image_size, which pillow_loop matches


def add_size_flags(parser: argparse.ArgumentParser, *, quick_n: int, repeats: int) -> None:
    """Adds the flags every steady-state benchmark takes: ``--n`` (runs use N and 3N images),
    ``--quick`` (a smoke run: N = ``quick_n``, one repeat), ``--repeats`` (timings per size,
    the fastest kept; default ``repeats``) and ``--workdir``. ``sizes_from_flags`` reads them."""
    parser.add_argument("--n", type=int, default=200, help="N; runs use N and 3N images (200)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: N={quick_n}, one repeat")
    parser.add_argument(
        "--repeats",
        type=int,
        default=repeats,
        help=f"timings per size, fastest kept ({repeats})",
    )
    parser.add_argument("--workdir", default=None, help="where to put images and outputs")


def chosen_engines(parser: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """The engines of a comma-separated ``--engines`` value; a name not in ``known`` is an
    error of the parser (exit 2) naming the names it takes."""
    engines = [e for e in text.split(",") if e]
    unknown = sorted(set(engines) - set(known))
    if unknown:
        parser.error(f"--engines: unknown {unknown}; expected names from {list(known)}")
    return engines


def sizes_from_flags(
    parser: argparse.ArgumentParser, args: argparse.Namespace, *, quick_n: int
) -> tuple[int, int]:
    """``(N, repeats)`` as the flags of ``add_size_flags`` ask: ``quick_n`` and one repeat with
    ``--quick``. Exits through ``parser.error`` unless both are at least 1."""
    n = quick_n if args.quick else args.n
    repeats = 1 if args.quick else args.repeats
    if n < 1 or repeats < 1:
        parser.error(f"--n and --repeats must be >= 1, got {n} and {repeats}")
    return n, repeats


def pillow_loop(paths: Sequence[Path]) -> int:
    """The baseline: the pipeline's per-image work as a plain loop; returns images done.

    Per image: read, sniff and open, ``draft``, EXIF orientation, RGB, resize to a 256 shorter
    side, JPEG q90 encode, SHA-256. No Beam, no TFRecords.
    """
    for path in paths:
        data = path.read_bytes()
        hashlib.sha256(data).hexdigest()
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (IMAGE_SIZE, IMAGE_SIZE))
        image = ImageOps.exif_transpose(image).convert("RGB")
        width, height = image.size
        scale = IMAGE_SIZE / min(width, height)
        image = image.resize(
            (max(1, round(width * scale)), max(1, round(height * scale))),
            Image.Resampling.BICUBIC,
        )
        out = io.BytesIO()
        image.save(out, format="JPEG", quality=90)
    return len(paths)


def pillow_loops_at_once(paths: Sequence[Path], processes: int = 2) -> int:
    """``pillow_loop`` in ``processes`` fresh processes at once, each on its share of
    ``paths``; returns images done.

    What this machine gives two processes that share nothing: the ceiling of any 2-process
    runner's speed-up over one process. The children are reaped, so ``cpu_seconds`` counts them.
    """
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=pillow_loop, args=(list(paths[i::processes]),))
        for i in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    failed = [w.exitcode for w in workers if w.exitcode != 0]
    if failed:
        raise RuntimeError(f"a Pillow loop process failed: exit codes {failed}")
    return len(paths)


def pipeline_run(input_dir: Path, output: Path, extra: Sequence[str]) -> int:
    """One run of ``python -m beam_pipelines.images_to_tfrecord`` in a fresh process, as a user
    runs it, overwriting ``output``; returns images written.

    A fresh process per run: runs made one after another in one process, each leaving the
    allocator's heaps as it had grown them, measured the 2-process DirectRunner up to a third
    slower (its runner process moves every record). Its imports and start-up are in every run,
    so they cancel out of ``steady_rate``'s difference.
    """
    args = [
        "--input",
        str(input_dir),
        "--output",
        str(output),
        "--max_bad_fraction",
        "0",
        "--overwrite",
        *extra,
    ]
    run_module("beam_pipelines.images_to_tfrecord", args)
    manifest = Manifest.from_json((output / MANIFEST_NAME).read_text(encoding="utf-8"))
    return manifest.counts.written


def photo_sets(
    root: Path, n: int, cache: Path | None = None
) -> tuple[list[Path], list[Path], float]:
    """Writes N and 3N ImageNet-like JPEGs under ``root/n`` and ``root/3n``.

    Disjoint seeds: the 3N set shares no bytes with the N set (no duplicates, no cache).
    ``cache``: a directory where the sets are written once and hard-linked from on later calls
    (the images are deterministic; writing 4N of them takes longer than a measured run).

    Returns:
      ``(paths_n, paths_3n, mean KB of the 3N set)``.
    """
    paths = []
    for name, count, seed in (("n", n, 1), ("3n", 3 * n, 2)):
        if cache is None:
            paths.append(write_imagenet_like_jpegs(root / name, count, seed=seed))
            continue
        cached = cache / f"imagenet-like-{count}-seed{seed}"
        if not cached.exists():
            write_imagenet_like_jpegs(cached.with_suffix(".part"), count, seed=seed)
            cached.with_suffix(".part").rename(cached)
        shutil.copytree(cached, root / name, copy_function=os.link)
        paths.append(sorted(p for p in (root / name).rglob("*") if p.is_file()))
    paths_n, paths_3n = paths
    mean_kb = sum(p.stat().st_size for p in paths_3n) / len(paths_3n) / 1024
    return paths_n, paths_3n, mean_kb


class NoisyMeasurement(RuntimeError):
    """The 3N run was not slower than the N run: start-up noise swamped the per-image work."""

    def __init__(self, t_n: float, t_3n: float) -> None:
        super().__init__(f"3N run ({t_3n:.2f}s) was not slower than N run ({t_n:.2f}s)")
        self.t_n = t_n
        self.t_3n = t_3n


def cpu_seconds(pids: Sequence[int] = ()) -> float:
    """CPU time (user + system) of this process, its reaped children and the given processes
    (with the children they reaped).

    On a shared machine wall time depends on everyone else's load; CPU time per image does
    not, so it is what the per-element overhead is computed from.
    """
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        # utime, stime, and cutime, cstime: children the process reaped (Spark executors)
        total += sum(int(f) for f in fields[11:15]) / tick
    return total


def steady_rate(
    run_n: Callable[[], int],
    run_3n: Callable[[], int],
    repeats: int,
    pids: Sequence[int] = (),
) -> tuple[float, float, float, float]:
    """Times both sizes ``repeats`` times and keeps the fastest of each (the least disturbed
    by other load).

    Returns:
      ``(rate, cpu_ms, t_n, t_3n)``: extra images per extra wall second, and extra CPU
      milliseconds (this process, its children and ``pids``) per extra image.

    Raises:
      NoisyMeasurement: the 3N run was not slower than the N run (noise swamped the signal).
    """
    found = steady_rates({"row": (run_n, run_3n)}, repeats, pids)["row"]
    if isinstance(found, NoisyMeasurement):
        raise found
    return found


def steady_rates(
    rows: Mapping[str, tuple[Callable[[], int], Callable[[], int]]],
    repeats: int,
    pids: Sequence[int] = (),
) -> dict[str, tuple[float, float, float, float] | NoisyMeasurement]:
    """``steady_rate`` of several rows whose runs take turns: each repeat runs every row's N
    and 3N once, so a machine whose speed drifts during the benchmark (other load, clocks)
    slows every row alike instead of the rows measured last.

    Returns:
      per row, ``steady_rate``'s tuple, or the ``NoisyMeasurement`` it would raise.
    """
    best: dict[str, dict[str, tuple[float, int, float]]] = {name: {} for name in rows}
    for _ in range(repeats):
        for name, (run_n, run_3n) in rows.items():
            for size, fn in (("n", run_n), ("3n", run_3n)):
                cpu = cpu_seconds(pids)
                start = time.perf_counter()
                done = fn()
                elapsed = time.perf_counter() - start
                cpu = cpu_seconds(pids) - cpu
                if size not in best[name] or elapsed < best[name][size][0]:
                    best[name][size] = (elapsed, done, cpu)
    found: dict[str, tuple[float, float, float, float] | NoisyMeasurement] = {}
    for name, sizes in best.items():
        (t_n, done_n, cpu_n), (t_3n, done_3n, cpu_3n) = sizes["n"], sizes["3n"]
        if t_3n <= t_n:
            found[name] = NoisyMeasurement(t_n, t_3n)
            continue
        extra = done_3n - done_n
        found[name] = (extra / (t_3n - t_n), 1000 * (cpu_3n - cpu_n) / extra, t_n, t_3n)
    return found
