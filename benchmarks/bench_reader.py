"""Benchmark: the project's tf.data reader against a well-tuned tf.data pipeline over JPEG files.

Inputs are ImageNet-like photos (500x375, about 100 KB, quality 90, texture and noise). The
pipeline (``python -m beam_pipelines.images_to_tfrecord``) writes them once as JPEG shards at
``--image_size 256`` and once as RAW shards at ``--image_size 224 --crop center --encoding raw``.

Rows, all training-mode pipelines producing 224x224x3 batches, measured in the same process and
interleaved round by round (the machine is shared, so rows see the same noise):
  * baseline: the usual tuned pipeline over the original files: list files -> shuffle ->
    parallel map(read_file, decode_jpeg, resize 224, normalise) -> batch -> prefetch.
  * reader, JPEG-256 shards: ``make_dataset`` (random resized crop with decode_and_crop_jpeg,
    flip, uint8 output).
  * reader, RAW shards: ``make_dataset`` (decode_raw, flip, uint8 output).
  * bytes only, RAW shards: parallel interleave of ``TFRecordDataset`` over the same RAW files,
    batch, prefetch; no parsing, no order kept. The ceiling for reading those files.
  * reader, RAW shards, ``deterministic=False``: the RAW row without the deterministic order
    a seeded pipeline keeps for exact resume.
  * (--extra) the reader with float32 output, normalised on the host like the baseline.

Each measurement runs in a fresh process, as a trainer runs one input pipeline: rows measured
one after another in one process swung by a third with what the rows before them had left in
the allocator. The process builds the row's pipeline once untimed (tracing, thread pools), then
a fresh iterator, discards warm-up batches (autotune ramp-up) and times a fixed number of
batches: examples/s from wall time, host CPU-ms per example from the process CPU time (all
threads). Rounds visit every row in turn; the median over rounds is reported.

Targets: JPEG reader >= 2x baseline; RAW reader >= 4x baseline and >= 50% of bytes only.

Usage::

  python -m benchmarks.bench_reader [--n 1000] [--rounds 3] [--quick] [--extra]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.common import photo_datasets, run_module, tuned_jpeg_dataset

__all__ = ["ROWS", "EXTRA_ROWS", "build_row", "bytes_only_dataset", "main", "measure"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
IMAGE_SIZE = 224


def bytes_only_dataset(dataset_dir: Path, batch_size: int):  # -> tf.data.Dataset
    """Reads the shard files' records and nothing else: the I/O ceiling for those files."""
    import tensorflow as tf

    from tfrecord_io import resolve_source
    from tfrecord_io.reader import DEFAULT_READ_BUFFER_BYTES

    paths = resolve_source(str(dataset_dir)).paths
    files = tf.data.Dataset.from_tensor_slices(paths).repeat()
    records = files.interleave(
        lambda p: tf.data.TFRecordDataset(p, buffer_size=DEFAULT_READ_BUFFER_BYTES),
        cycle_length=min(16, len(paths)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return records.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


# Row name -> (dataset directory under the work root, how the row builds its pipeline).
ROWS: dict[str, tuple[str, str]] = {
    "baseline: tuned pipeline, original JPEGs": ("photos", "tuned_jpeg"),
    "reader, JPEG-256 shards": ("jpeg256", "reader"),
    "reader, RAW-224 shards": ("raw224", "reader"),
    "bytes only, RAW-224 shards": ("raw224", "bytes"),
    # Seeded pipelines keep a deterministic order (exact resume); this row shows what that
    # costs against the bytes-only read, which has no order to keep.
    "reader, RAW-224, deterministic=False": ("raw224", "reader-unordered"),
}
EXTRA_ROWS: dict[str, tuple[str, str]] = {
    "reader, JPEG-256, float32 out": ("jpeg256", "reader-float32"),
    "reader, RAW-224, float32 out": ("raw224", "reader-float32"),
}


def build_row(name: str, root: Path, batch_size: int):  # -> tf.data.Dataset
    """The pipeline a row measures, over the datasets written under ``root``."""
    from tfrecord_io import ReadConfig, make_dataset

    directory, kind = {**ROWS, **EXTRA_ROWS}[name]
    data = root / directory
    if kind == "tuned_jpeg":
        return tuned_jpeg_dataset(data, batch_size, IMAGE_SIZE)
    if kind == "bytes":
        return bytes_only_dataset(data, batch_size)
    options = {
        "reader-unordered": ReadConfig(deterministic=False),
        "reader-float32": ReadConfig(output="float32"),
    }
    return make_dataset(
        data,
        global_batch_size=batch_size,
        image_size=IMAGE_SIZE,
        seed=0,
        read_config=options.get(kind),
    )


def _measure_in_child(name: str, root: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Runs ``measure`` for one row in a fresh Python process; returns (ex/s, CPU-ms/ex)."""
    flags = [
        "--measure_row",
        name,
        "--measure_root",
        str(root),
        "--batch_size",
        str(args.batch_size),
        "--batches",
        str(args.batches),
        "--warmup",
        str(args.warmup),
    ]
    out = run_module("benchmarks.bench_reader", flags)
    rate, cpu_ms = json.loads(out.strip().splitlines()[-1])
    return rate, cpu_ms


def _child_main(args: argparse.Namespace) -> int:
    root, b = Path(args.measure_root), args.batch_size
    # Untimed first: the first pipeline of a process pays one-off costs (tracing, thread pools).
    measure(lambda: build_row(args.measure_row, root, b), b, args.warmup, 1)
    rate, cpu_ms = measure(
        lambda: build_row(args.measure_row, root, b), b, args.warmup, args.batches
    )
    print(json.dumps([rate, cpu_ms]))
    return 0


def measure(
    build: Callable[[], object], batch_size: int, warmup: int, batches: int
) -> tuple[float, float]:
    """Times ``batches`` batches of a fresh iterator after ``warmup``; returns (ex/s, CPU-ms/ex)."""
    iterator = iter(build())
    for _ in range(warmup):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del iterator
    gc.collect()
    examples = batches * batch_size
    return examples / wall, 1000.0 * cpu / examples


def _chart(rows: list[dict], path: Path, title: str) -> None:
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["row"] for r in rows]
    rates = [r["examples_per_s"] for r in rows]
    cpu = [r["cpu_ms_per_example"] for r in rows]
    colours = ["#999999"] + ["#1f77b4"] * (len(rows) - 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 0.7 * len(rows) + 2.2))
    left.barh(names, rates, color=colours)
    left.set_xlabel("examples / s (higher is better)")
    left.invert_yaxis()
    left.set_xlim(0, max(rates) * 1.18)
    base = rates[0]
    for multiple, style in ((2, "--"), (4, ":")):
        left.axvline(
            base * multiple,
            color="#d62728",
            linestyle=style,
            linewidth=1,
            label=f"{multiple}x baseline",
        )
    left.legend(loc="lower right", fontsize=8)
    for i, value in enumerate(rates):
        left.text(value, i, f" {value:,.0f}", va="center", fontsize=9)
    right.barh(names, cpu, color=colours)
    right.set_xlabel("host CPU-ms per example (lower is better)")
    right.invert_yaxis()
    right.set_yticklabels([])
    right.set_xlim(0, max(cpu) * 1.18)
    for i, value in enumerate(cpu):
        right.text(value, i, f" {value:.2f}", va="center", fontsize=9)
    fig.suptitle("\n".join(textwrap.wrap(title, 130)), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="photos to generate (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--batch_size", type=int, default=128, help="batch size (128)")
    parser.add_argument("--batches", type=int, default=100, help="timed batches per row (100)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed batches per row (20)")
    parser.add_argument("--extra", action="store_true", help="also time float32 reader output")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 photos, tiny runs")
    parser.add_argument("--workdir", default=None, help="where to put photos and shards")
    parser.add_argument(
        "--chart",
        default=None,
        help=f"PNG chart path, '' for none (default {RESULTS_DIR / 'reader.png'}; "
        "with --quick, a temporary file)",
    )
    # A child process measuring one row (see _measure_in_child).
    parser.add_argument("--measure_row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure_root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_row is not None:
        return _child_main(args)
    if args.chart is None:
        args.chart = str(
            Path(tempfile.gettempdir()) / "bench_reader_quick.png"
            if args.quick
            else RESULTS_DIR / "reader.png"
        )
    if args.quick:
        args.n, args.rounds, args.batch_size, args.batches, args.warmup = 64, 1, 16, 4, 2
    with photo_datasets(args.n, shards=max(2, args.n // 125), workdir=args.workdir) as data:
        root, mean_kb, shards, prepare = data.root, data.mean_kb, data.shards, data.prepare_s

        import tensorflow as tf

        b = args.batch_size
        names = list(ROWS) + (list(EXTRA_ROWS) if args.extra else [])
        load_start = os.getloadavg()[0]
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                samples[name].append(_measure_in_child(name, root, args))
        load_end = os.getloadavg()[0]

    rows = []
    for name, values in samples.items():
        rows.append(
            {
                "row": name,
                "examples_per_s": statistics.median(v[0] for v in values),
                "cpu_ms_per_example": statistics.median(v[1] for v in values),
                "rounds": [list(v) for v in values],
            }
        )
    by_name = {r["row"]: r for r in rows}
    base = rows[0]["examples_per_s"]
    jpeg = by_name["reader, JPEG-256 shards"]["examples_per_s"]
    raw = by_name["reader, RAW-224 shards"]["examples_per_s"]
    ceiling = by_name["bytes only, RAW-224 shards"]["examples_per_s"]
    conditions = (
        f"{args.n} ImageNet-like JPEGs, 500x375, mean {mean_kb:.0f} KB, q90; {shards} shards per "
        f"dataset; batch {b}; {args.rounds} interleaved rounds x {args.batches} batches, "
        "a process per measurement; "
        f"{os.cpu_count()} CPUs, load average {load_start:.1f} -> {load_end:.1f}; "
        f"TensorFlow {tf.__version__}"
    )
    print(conditions)
    print(f"(pipeline wrote both datasets in {prepare:.0f} s)")
    print()
    print("| row | examples/s | host CPU-ms/example | vs baseline | target |")
    print("|---|---:|---:|---:|---|")
    targets = {
        "reader, JPEG-256 shards": ">= 2x baseline",
        "reader, RAW-224 shards": f">= 4x baseline, >= 50% of bytes only ({raw / ceiling:.0%})",
        "reader, RAW-224, deterministic=False": (
            f"{by_name['reader, RAW-224, deterministic=False']['examples_per_s'] / ceiling:.0%} "
            "of bytes only"
        ),
    }
    for r in rows:
        print(
            f"| {r['row']} | {r['examples_per_s']:,.0f} | {r['cpu_ms_per_example']:.2f} | "
            f"{r['examples_per_s'] / base:.2f}x | {targets.get(r['row'], '-')} |"
        )
    print()
    verdicts = [
        ("JPEG >= 2x baseline", jpeg >= 2 * base),
        ("RAW >= 4x baseline", raw >= 4 * base),
        ("RAW >= 50% of bytes only", raw >= 0.5 * ceiling),
    ]
    print("; ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in verdicts))
    if args.chart:
        _chart(rows, Path(args.chart), "tf.data reader benchmark: " + conditions)
        Path(args.chart).with_suffix(".json").write_text(
            json.dumps({"conditions": conditions, "rows": rows}, indent=2) + "\n"
        )
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
