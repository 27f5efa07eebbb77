"""Incremental builds (``--base``): CPU against a clean build of the same input, and identity.

``python -m benchmarks.bench_incremental [--n 200] [--repeats 1]``

For N and 3N ImageNet-like JPEGs (500x375, ~95 KB): build v1 from a directory; then change 5%
of it in place (2% new images, 1% removed, 1% moved to another class, 1% re-encoded at another
JPEG quality, i.e. new bytes) and build v2 twice, in-process (the default DirectRunner), each in a
fresh process: clean, and with ``--base v1``. The steady-state CPU per image (``(cpu(3N) -
cpu(N)) / 2N``, so start-up cancels out) of the incremental build is compared with the clean
one's (the minimum of the repeats, and each repeat's ratio, for the spread); the whole-run CPU
of both is printed too. Every incremental output is checked
byte-identical to the clean one (``dataset.json`` apart from its ``lineage``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from PIL import Image

from beam_pipelines.samples import write_imagenet_like_jpegs
from benchmarks.common import run_module
from benchmarks.steady_state import cpu_seconds

__all__ = ["change_five_percent", "main"]

_FLAGS = ["--num_shards", "8", "--max_bad_fraction", "0", "--validation_fraction", "0.1"]


def change_five_percent(source: Path, target: Path, seed: int) -> dict[str, int]:
    """Copies ``source`` to ``target`` with 5% of its images added, removed, moved or
    re-encoded; returns how many of each."""
    shutil.copytree(source, target)
    paths = sorted(p for p in target.rglob("*.JPEG"))
    n = len(paths)
    k = max(1, n // 100)
    removed, moved, reencoded = paths[0:k], paths[k : 2 * k], paths[2 * k : 3 * k]
    for path in removed:
        path.unlink()
    classes = sorted(p.name for p in target.iterdir() if p.is_dir())
    for path in moved:
        other = classes[(classes.index(path.parent.name) + 1) % len(classes)]
        path.rename(target / other / path.name)
    for path in reencoded:
        Image.open(path).save(path, format="JPEG", quality=80)
    added = write_imagenet_like_jpegs(target / "_new", 2 * k, seed=seed)
    for i, path in enumerate(added):  # into the class directories
        path.rename(target / classes[i % len(classes)] / ("new_" + path.name))
    shutil.rmtree(target / "_new")
    return {"removed": k, "moved": k, "reencoded": k, "added": 2 * k, "images": n}


def _write_images(images: Path, size: int, cache: Path | None) -> None:
    """``size`` ImageNet-like JPEGs (seed ``size``) in ``images``: written, or copied from
    ``cache`` (a real copy: the benchmark changes them in place)."""
    if cache is None:
        write_imagenet_like_jpegs(images, size, seed=size)
        return
    cached = cache / f"imagenet-like-{size}-seed{size}"
    if not cached.exists():
        write_imagenet_like_jpegs(cached.with_suffix(".part"), size, seed=size)
        cached.with_suffix(".part").rename(cached)
    shutil.copytree(cached, images)


def _build(images: Path, output: Path, *extra: str) -> float:
    before = cpu_seconds()
    run_module(
        "beam_pipelines.images_to_tfrecord",
        ["--input", str(images), "--output", str(output), *_FLAGS, *extra],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    return cpu_seconds() - before


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir()) if p.is_file()}


def _check_identical(clean: Path, incremental: Path) -> dict:
    a, b = _snapshot(clean), _snapshot(incremental)
    manifest_a, manifest_b = json.loads(a.pop("dataset.json")), json.loads(b.pop("dataset.json"))
    lineage = manifest_b.pop("lineage", None)
    different = sorted(name for name in set(a) | set(b) if a.get(name) != b.get(name))
    if different or manifest_a != manifest_b or lineage is None:
        raise RuntimeError(f"incremental build differs from the clean one: {different}")
    return lineage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--cache", default=None, help="write the images here once, copy them from it after"
    )
    args = parser.parse_args()
    cpu: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_incremental-") as tmp:
        for size in (args.n, 3 * args.n):
            root = Path(tmp) / str(size)
            images = root / "images"
            _write_images(images, size, Path(args.cache) if args.cache else None)
            _build(images, root / "v1")
            # The same input directory, changed in place, as a data engineer's would be.
            changes = change_five_percent(images, root / "changed", seed=size + 1)
            shutil.rmtree(images)
            (root / "changed").rename(images)
            for _ in range(args.repeats):
                for name, extra in (("clean", ()), ("incremental", ("--base", str(root / "v1")))):
                    out = root / f"v2-{name}"
                    shutil.rmtree(out, ignore_errors=True)
                    cpu.setdefault((name, size), []).append(_build(images, out, *extra))
            lineage = _check_identical(root / "v2-clean", root / "v2-incremental")
            print(f"{size} images: changes {changes}; lineage {lineage}; byte-identical")
    n, n3 = args.n, 3 * args.n
    extra = n3 - n

    def steady(name: str, pick) -> float:
        return 1000 * (pick(cpu[(name, n3)]) - pick(cpu[(name, n)])) / extra

    best = {name: steady(name, min) for name in ("clean", "incremental")}
    # Repeat i of N against repeat i of 3N: the spread the minimum hides.
    per_repeat = [
        steady("incremental", lambda runs, i=i: runs[i])
        / steady("clean", lambda runs, i=i: runs[i])
        for i in range(args.repeats)
    ]
    print(f"load average {os.getloadavg()[0]:.2f} (machine shared with other work)")
    print("| build of v2 (5% changed) | CPU s, N | CPU s, 3N | steady CPU-ms/image | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name in ("clean", "incremental"):
        print(
            f"| {name} | {min(cpu[(name, n)]):.2f} | {min(cpu[(name, n3)]):.2f} | "
            f"{best[name]:.2f} | {best[name] / best['clean']:.2f} |"
        )
    print(
        "ratio per repeat (repeat i of N against repeat i of 3N): "
        + ", ".join(f"{r:.3f}" for r in per_repeat)
    )
    print(
        "whole runs at 3N (start-up included), incremental / clean: "
        f"{min(cpu[('incremental', n3)]):.2f} / {min(cpu[('clean', n3)]):.2f} CPU-s = "
        f"{min(cpu[('incremental', n3)]) / min(cpu[('clean', n3)]):.0%}"
    )


if __name__ == "__main__":
    main()
