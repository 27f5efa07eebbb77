"""Benchmark: the dataset report costs about the same on a big dataset as on a small one.

Two datasets of one shape (10 classes, 64x48 JPEG examples, 90 % train), one ``--small`` and
one ``--big`` examples, are written as shards and described by ``python -m dataset_tools.adopt``
(``dataset.json``, index files, catalogs), then ``python -m dataset_tools.inspect`` runs on each
in a fresh process, ``--repeats`` times, interleaved. Rows: wall and CPU seconds (the process
and its children), records read by byte range, and the bytes of the catalogs it reads.

What still grows with the dataset is reading the catalogs (their SHA-256 is checked, and the
distributions are computed from their columns); the records read do not grow.

Usage::

  python -m benchmarks.bench_inspect [--small 1000] [--big 1000000] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from beam_pipelines.output.shards import write_shard_file
from beam_pipelines.samples import scene_rgb
from benchmarks.common import run_module
from schemas.image_example import ImageRecord, serialize_record

CLASSES = 10
EXAMPLES_PER_SHARD = 50_000


def _jpegs(count: int) -> list[bytes]:
    out = []
    for seed in range(count):
        buffer = io.BytesIO()
        Image.fromarray(scene_rgb((64, 48), seed=seed)).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def write_dataset(root: Path, n: int) -> None:
    """``n`` examples as train/validation shards, then adopted (index files and catalogs)."""
    root.mkdir(parents=True)
    images = _jpegs(64)
    splits = {"train": int(n * 0.9), "validation": n - int(n * 0.9)}
    number = 0
    for split, count in splits.items():
        shards = max(1, -(-count // EXAMPLES_PER_SHARD))
        for shard in range(shards):
            size = count // shards + (1 if shard < count % shards else 0)
            payloads = []
            for _ in range(size):
                label = number % CLASSES
                payloads.append(
                    serialize_record(
                        ImageRecord(
                            encoded=images[number % len(images)],
                            format="JPEG",
                            height=48,
                            width=64,
                            channels=3,
                            label=label,
                            text=f"class_{label:02d}",
                            filename=f"s3://photos/class_{label:02d}/{number:08d}.jpg",
                            sha256=hashlib.sha256(number.to_bytes(8, "little")).hexdigest(),
                        )
                    )
                )
                number += 1
            write_shard_file(payloads, str(root / f"{split}-{shard:05d}-of-{shards:05d}.tfrecord"))
    run_module("dataset_tools.adopt", [str(root / "*.tfrecord")])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(dataset: Path, out: Path) -> tuple[float, float, dict]:
    """One ``python -m dataset_tools.inspect`` run: wall s, CPU s, its stats.json."""
    cpu = _children_cpu()
    start = time.perf_counter()
    run_module(
        "dataset_tools.inspect",
        [str(dataset), "--out", str(out), "--per_class", "16"],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    wall = time.perf_counter() - start
    stats = json.loads((out / "stats.json").read_text(encoding="utf-8"))
    return wall, _children_cpu() - cpu, stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=1000, help="examples in the small dataset")
    parser.add_argument("--big", type=int, default=1_000_000, help="examples in the big one")
    parser.add_argument("--repeats", type=int, default=3, help="runs per dataset (3)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.small, args.big, args.repeats = 200, 5000, 1
    with tempfile.TemporaryDirectory(prefix="bench_inspect-") as tmp:
        root = Path(tmp)
        sizes = {"small": args.small, "big": args.big}
        for name, n in sizes.items():
            start = time.perf_counter()
            write_dataset(root / name, n)
            print(f"wrote and adopted {n:,} examples in {time.perf_counter() - start:.0f} s")
            sys.stdout.flush()
        runs: dict[str, list[tuple[float, float, dict]]] = {name: [] for name in sizes}
        for _ in range(args.repeats):
            for name in sizes:
                runs[name].append(measure(root / name, root / f"report-{name}"))
        print(
            "\n| dataset | examples | catalogs | inspect wall s | CPU s | records read | vs small |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        base = min(w for w, _, _ in runs["small"])
        for name, n in sizes.items():
            wall = min(w for w, _, _ in runs[name])
            cpu = min(c for _, c, _ in runs[name])
            stats = runs[name][0][2]
            catalogs = sum(f.stat().st_size for f in (root / name).glob("catalog-*.parquet"))
            print(
                f"| {name} | {n:,} | {catalogs / 2**20:.1f} MiB | {wall:.1f} | {cpu:.1f} | "
                f"{stats['records_read']} | {wall / base:.2f}x |"
            )
        print(f"(best of {args.repeats}; each run a fresh process, including its imports)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
