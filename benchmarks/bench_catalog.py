"""Benchmark: the catalog and index files, what they cost to load and to write.

Rows:
  * catalog load, 1 M rows: a synthetic ``catalog-train.parquet`` of 1,000,000 rows (1,024
    shards of 977 records, 1,000 classes, ImageNet-like URIs and sizes, phash set) written with
    ``catalog.table.write_table``; then the best of 3 loads of the whole table
    (``read_table``), of the location columns only (key, split, index, shard, record, offset,
    length), and a lookup of 100 keys with ``pyarrow.compute.is_in`` (what ``read_examples``
    does per split).
  * index + catalog cost: the pipeline (in-process DirectRunner, ``--num_shards 8``) over N and
    3N ImageNet-like JPEGs (500x375, ~100 KB), run alternately with and without writing index
    files, catalog fragments and the merged catalogs (without: those steps are replaced by
    no-ops in the child process). Each run is a fresh process. Steady-state CPU ms per image is
    ``(cpu(3N) - cpu(N)) / 2N`` (start-up cancels out), and the cost is the ratio of the two.
    The same runs also time the index and catalog code itself (thread CPU time inside
    ``write_index_and_fragment`` and ``merge_split_catalog``), which on a loaded machine is the
    steadier figure.

Target: index + catalog <= 3% of the pipeline's per-image CPU.

Usage::

  python -m benchmarks.bench_catalog [--rows 1000000] [--n 150] [--rounds 2] [--skip-pipeline]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main", "synthetic_catalog"]

_CHILD_FLAG = "--pipeline-child"


def synthetic_catalog(rows: int, *, shards: int = 1024, classes: int = 1000):
    """A catalog table of ``rows`` ImageNet-like rows, in shard order (``pyarrow.Table``)."""
    import numpy as np

    from catalog.table import build_table

    rng = np.random.default_rng(0)
    per_shard = -(-rows // shards)
    record = np.arange(rows) % per_shard
    shard_of = np.arange(rows) // per_shard
    lengths = rng.integers(20_000, 200_000, size=rows, dtype=np.int64)
    offsets = np.zeros(rows, dtype=np.int64)
    for s in range(shards):  # offsets restart at each shard
        lo, hi = s * per_shard, min(rows, (s + 1) * per_shard)
        if lo < hi:
            offsets[lo + 1 : hi] = np.cumsum(lengths[lo : hi - 1])
    labels = rng.integers(0, classes, size=rows)
    keys = sorted(hashlib.sha256(i.to_bytes(8, "little")).hexdigest() for i in range(rows))
    names = [f"n{c:08d}" for c in range(classes)]
    return build_table(
        {
            "key": keys,
            "uri": [f"gs://bucket/imagenet/train/{names[c]}/{names[c]}_{i}.JPEG" for i, c in
                    enumerate(labels)],
            "label": labels,
            "text": [names[c] for c in labels],
            "split": ["train"] * rows,
            "index": np.arange(rows),
            "shard": [f"train-{s:05d}-of-{shards:05d}.tfrecord" for s in shard_of],
            "record": record,
            "offset": offsets,
            "length": lengths,
            "height": np.full(rows, 256, dtype=np.int32),
            "width": rng.integers(256, 400, size=rows, dtype=np.int32),
            "format": ["JPEG"] * rows,
            "source_format": ["JPEG"] * rows,
            "source_bytes": rng.integers(20_000, 300_000, size=rows),
            "source_height": np.full(rows, 375, dtype=np.int32),
            "source_width": np.full(rows, 500, dtype=np.int32),
            "phash": rng.integers(0, 2**63, size=rows, dtype=np.uint64),
        }
    )  # fmt: skip


def _best(fn, repeats: int = 3) -> str:
    """Best wall time of ``repeats`` calls, and the process CPU time (all threads) of that call."""
    best = (float("inf"), 0.0)
    for _ in range(repeats):
        cpu, start = time.process_time(), time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - start, time.process_time() - cpu))
    return f"{best[0]:.2f} s (CPU {best[1]:.2f} s)"


def catalog_rows(rows: int) -> list[tuple[str, str]]:
    import pyarrow as pa
    import pyarrow.compute as pc

    from catalog.table import LOCATION_COLUMNS, read_table, write_table

    start = time.perf_counter()
    table = synthetic_catalog(rows)
    built = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        path = os.path.join(tmp, "catalog-train.parquet")
        start = time.perf_counter()
        write_table(table, path)
        written = time.perf_counter() - start
        size_mb = os.path.getsize(path) / 2**20
        del table  # the loads below start from the file alone
        full = _best(lambda: read_table(path))
        location = _best(lambda: read_table(path, columns=list(LOCATION_COLUMNS)))
        keys = read_table(path, columns=["key"]).column("key")
        wanted = pa.array(keys.to_pylist()[:: max(1, rows // 100)][:100])

        def lookup() -> None:
            t = read_table(path, columns=list(LOCATION_COLUMNS))
            assert t.filter(pc.is_in(t.column("key"), value_set=wanted)).num_rows == len(wanted)

        lookup_s = _best(lookup)
    return [
        ("synthetic rows", f"{rows:,}"),
        ("build (Arrow arrays from Python lists)", f"{built:.1f} s"),
        ("write (zstd, 64 Ki-row groups)", f"{written:.2f} s, {size_mb:.0f} MiB"),
        ("load, all 18 columns (best of 3)", full),
        ("load, 7 location columns (best of 3)", location),
        ("load locations + find 100 keys (best of 3)", lookup_s),
    ]


def _child(mode: str, argv: list[str]) -> None:
    """One pipeline run in this process; ``without`` turns index and catalog writing off."""
    import beam_pipelines.output.catalog_io as catalog_io
    import beam_pipelines.output.shards as shards
    from beam_pipelines import images_to_tfrecord

    spent = [0.0]
    write_index, merge = shards.write_index_and_fragment, catalog_io.merge_split_catalog
    if mode == "without":
        shards.write_index_and_fragment = lambda *args, **kwargs: (0, "")
        catalog_io.MergeCatalogs.expand = lambda self, s: s | "NoCatalogs" >> _drop_all()
    else:

        def timed(fn):
            # functools.wraps keeps the return annotation Beam infers the output coder from.
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                start = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[0] += time.thread_time() - start

            return wrapper

        shards.write_index_and_fragment = timed(write_index)
        catalog_io.merge_split_catalog = timed(merge)
    summary = images_to_tfrecord.run(argv)
    assert summary.published
    print(json.dumps({"catalog_cpu_s": spent[0], "written": summary.manifest.counts.written}))


def _drop_all():
    import apache_beam as beam

    return beam.Filter(lambda _: False)


def _pipeline_run(mode: str, images: Path, output: Path) -> tuple[float, float, int]:
    """Returns ``(cpu seconds of the child, seconds inside index+catalog code, images)``."""
    import subprocess

    from benchmarks.steady_state import cpu_seconds

    argv = [
        "--input", str(images), "--output", str(output), "--overwrite",
        "--num_shards", "8", "--max_bad_fraction", "0",
    ]  # fmt: skip
    before = cpu_seconds()
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_catalog", _CHILD_FLAG, mode, *argv],
        capture_output=True, text=True, check=False, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"pipeline child failed:\n{done.stderr[-3000:]}")
    cpu = cpu_seconds() - before
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return cpu, result["catalog_cpu_s"], result["written"]


def cost_rows(n: int, rounds: int) -> list[tuple[str, str]]:
    from benchmarks.steady_state import photo_sets

    per_image: dict[str, list[float]] = {"with": [], "without": []}
    whole_3n: dict[str, list[float]] = {"with": [], "without": []}
    inside = []
    with tempfile.TemporaryDirectory(prefix="bench-catalog-cost-") as tmp:
        root = Path(tmp)
        photo_sets(root, n)
        for _ in range(rounds):
            for mode in ("with", "without"):
                cpu_n, spent_n, done_n = _pipeline_run(mode, root / "n", root / f"out-{mode}")
                cpu_3n, spent_3n, done_3n = _pipeline_run(mode, root / "3n", root / f"out-{mode}")
                per_image[mode].append(1000 * (cpu_3n - cpu_n) / (done_3n - done_n))
                whole_3n[mode].append(1000 * cpu_3n / done_3n)
                if mode == "with":
                    inside.append(1000 * spent_3n / done_3n)
    with_ms = statistics.median(per_image["with"])
    without_ms = statistics.median(per_image["without"])
    inside_ms = statistics.median(inside)
    return [
        ("images (N, 3N), rounds", f"{n}, {3 * n}, {rounds}"),
        ("pipeline CPU ms/image, with index + catalog", f"{with_ms:.2f} "
         f"({', '.join(f'{v:.2f}' for v in per_image['with'])})"),
        ("pipeline CPU ms/image, without", f"{without_ms:.2f} "
         f"({', '.join(f'{v:.2f}' for v in per_image['without'])})"),
        ("difference (with / without - 1)", f"{100 * (with_ms / without_ms - 1):+.1f}%"),
        ("whole 3N run, CPU ms/image with / without (start-up included)",
         f"{statistics.median(whole_3n['with']):.2f} / "
         f"{statistics.median(whole_3n['without']):.2f} "
         f"({100 * (statistics.median(whole_3n['with']) / statistics.median(whole_3n['without']) - 1):+.1f}%)"),
        ("index + catalog code, CPU ms/image (3N runs)", f"{inside_ms:.3f}"),
        ("index + catalog code / pipeline CPU", f"{100 * inside_ms / with_ms:.2f}%"),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == _CHILD_FLAG:
        _child(args_list[1], args_list[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_catalog")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--n", type=int, default=150, help="images in the small pipeline set")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args(args_list)
    rows: list[tuple[str, str]] = []
    if not args.skip_load:
        rows += catalog_rows(args.rows)
    if not args.skip_pipeline:
        rows += cost_rows(args.n, args.rounds)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
