"""Benchmark: what the decode worker's budgets cost on ordinary photos.

``prepare_image`` in process against ``BoundedPreparer.prepare``, on ImageNet-like JPEGs
(500x375, about 100 KB, q90) and on the same photos as TIFF, the two taking turns photo by photo
so that load from other jobs falls on both alike. JPEG (like PNG and WebP) is prepared in
process by ``BoundedPreparer`` too; TIFF goes to the decode worker held within
``--decode_memory_mb`` and ``--decode_time_s``. Cost is CPU time from ``/proc/<pid>/schedstat``
(nanoseconds): for the worker, the parent's and the child's together. Target: at most 3 % more
than in process for the photos.

Usage::

  python -m benchmarks.bench_decode_bounds [--n 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
from pathlib import Path

from PIL import Image

from beam_pipelines.image.bounds import BoundedPreparer
from beam_pipelines.image.options import ImageOptions
from beam_pipelines.image.prepare import prepare_image
from beam_pipelines.samples import write_imagenet_like_jpegs

__all__ = ["cpu_ns", "measure", "main"]


def cpu_ns(pid: int | str = "self") -> int:
    """CPU time a process (or this one) has run, in nanoseconds."""
    with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
        return int(stat.read().split()[0])


def measure(photos: list[bytes], rounds: int) -> list[tuple[float, float]]:
    """Per round, ``(in-process ms, bounded ms)`` of CPU per photo."""
    options = ImageOptions()
    preparer = BoundedPreparer(options)
    preparer.prepare(photos[0])  # starts the worker, for formats that use it
    child = preparer.worker_pid()
    results = []
    try:
        for _ in range(rounds):
            inside = bounded = 0
            for data in photos:
                start = cpu_ns()
                prepare_image(data, options)
                middle, worker = cpu_ns(), cpu_ns(child) if child else 0
                preparer.prepare(data)
                inside += middle - start
                bounded += cpu_ns() - middle + (cpu_ns(child) - worker if child else 0)
            results.append((inside / len(photos) / 1e6, bounded / len(photos) / 1e6))
    finally:
        preparer.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        paths = write_imagenet_like_jpegs(Path(root), args.n, seed=5)
        photos = [p.read_bytes() for p in paths]
    for name, data in (("JPEG (in process)", photos), ("TIFF (decode worker)", _as_tiff(photos))):
        rows = measure(data, args.rounds)
        print(f"{name}\nround  in-process ms  bounded ms  extra")
        for i, (inside, bounded) in enumerate(rows):
            print(f"{i:5d}  {inside:13.3f}  {bounded:10.3f}  {bounded / inside - 1:6.1%}")
        inside = statistics.median(r[0] for r in rows)
        bounded = statistics.median(r[1] for r in rows)
        print(f"median {inside:12.3f}  {bounded:10.3f}  {bounded / inside - 1:6.1%}")


def _as_tiff(photos: list[bytes]) -> list[bytes]:
    tiffs = []
    for data in photos:
        out = io.BytesIO()
        Image.open(io.BytesIO(data)).save(out, format="TIFF")
        tiffs.append(out.getvalue())
    return tiffs


if __name__ == "__main__":
    main()
