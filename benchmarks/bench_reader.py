"""Benchmark: the project's tf.data reader against a well-tuned tf.data pipeline over JPEG files.

Inputs are generated photo families (``benchmarks/photo_families.py``: ``imagenet_like``, the
original benchmark photos, and smooth, textured, sensor-noise, high-detail and 0.3-12 MP
photos). For each family the pipeline (``python -m beam_pipelines.images_to_tfrecord``) writes
the photos once as JPEG shards at ``--image_size 256`` and once as RAW shards at
``--image_size 224 --crop center --encoding raw``.

Rows, all training-mode pipelines producing 224x224x3 batches:
  * article: the usual tuned pipeline over the original files: list files -> shuffle ->
    parallel map(read_file, decode_jpeg, resize 224, normalise) -> batch -> prefetch.
  * reader, JPEG-256 shards: ``make_dataset`` (random resized crop with decode_and_crop_jpeg,
    flip, uint8 output).
  * reader, RAW-224 shards: ``make_dataset`` (decode_raw, flip, uint8 output).
  * bytes only, RAW shards: parallel interleave of ``TFRecordDataset`` over the same RAW files,
    batch, prefetch; no parsing, no order kept. The ceiling for reading those files.
  * decode floor, JPEG-256: the JPEG-256 shards' stored JPEG bytes, held in memory, decoded
    whole by ``tf.io.decode_jpeg`` (the reader's IDCT) in a parallel map, and nothing else:
    libjpeg-turbo's own rate on those bytes, below which the JPEG reader cannot go.
  * decode floor, RAW-224: the bytes-only read plus one ``parse_example`` and ``decode_raw``
    per batch, and nothing else: the floor of any RAW reader built from TensorFlow's ops.
  * (--extra) the reader with float32 output and the RAW reader with ``deterministic=False``.

Each measurement runs in a fresh process, as a trainer runs one input pipeline: rows measured
one after another in one process swung by a third with what the rows before them had left in
the allocator. The process builds the row's pipeline once untimed (tracing, thread pools), then
a fresh iterator, discards warm-up batches (autotune ramp-up) and times a fixed number of
examples (or ``--max_seconds``, for the article's pipeline over 12 MP photos): examples/s from
wall time, host CPU-ms per example from the process CPU time (all threads). Rounds visit every
family, batch size and row in turn; the median over rounds is reported.

Targets, per family and batch size: JPEG reader >= 2x the article; RAW reader >= 5x the
article and >= 55% of bytes only.

Usage::

  python -m benchmarks.bench_reader [--family all|NAME[,NAME]] [--batch_size 32,128]
      [--n 240] [--rounds 3] [--rows all|article,jpeg,raw,bytes,floor,raw_floor] [--quick]
      [--extra]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    parse_batch_sizes,
    parse_rows,
    photo_datasets,
    run_module,
    tuned_jpeg_dataset,
)
from benchmarks.photo_families import FAMILIES

__all__ = [
    "ROWS",
    "EXTRA_ROWS",
    "build_row",
    "bytes_only_dataset",
    "decode_floor_dataset",
    "main",
    "measure",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
IMAGE_SIZE = 224


def bytes_only_dataset(dataset_dir: Path, batch_size: int):  # -> tf.data.Dataset
    """Reads the shard files' records and nothing else: the I/O ceiling for those files."""
    import tensorflow as tf

    from tfrecord_io import resolve_source
    from tfrecord_io.read_config import DEFAULT_READ_BUFFER_BYTES

    paths = resolve_source(str(dataset_dir)).paths
    files = tf.data.Dataset.from_tensor_slices(paths).repeat()
    records = files.interleave(
        lambda p: tf.data.TFRecordDataset(p, buffer_size=DEFAULT_READ_BUFFER_BYTES),
        cycle_length=min(16, len(paths)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return records.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def stored_jpegs(dataset_dir: Path) -> list[bytes]:
    """The encoded images of a dataset's train shards, in file order."""
    import tensorflow as tf

    from schemas import KEY_ENCODED
    from tfrecord_io import resolve_source

    encoded = []
    for record in tf.data.TFRecordDataset(resolve_source(str(dataset_dir)).paths):
        example = tf.train.Example.FromString(record.numpy())
        encoded.append(example.features.feature[KEY_ENCODED].bytes_list.value[0])
    return encoded


def decode_floor_dataset(dataset_dir: Path, batch_size: int):  # -> tf.data.Dataset
    """Decodes the stored JPEGs, held in memory, and does nothing else: the decode's floor.

    Whole images, with the reader's IDCT (``INTEGER_FAST``) and one thread per op as in the
    reader; each decoded image is reduced to one pixel so batching costs nothing.
    """
    import tensorflow as tf

    encoded = tf.constant(stored_jpegs(dataset_dir))
    ds = tf.data.Dataset.from_tensor_slices(encoded).repeat()
    ds = ds.map(
        lambda e: tf.io.decode_jpeg(e, channels=3, dct_method="INTEGER_FAST")[:1, :1, :],
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = 1
    ds = ds.batch(batch_size, drop_remainder=True).with_options(options)
    return ds.prefetch(tf.data.AUTOTUNE)


def raw_floor_dataset(dataset_dir: Path, batch_size: int):  # -> tf.data.Dataset
    """The bytes-only read plus the parse and ``decode_raw`` every RAW reader does, no more.

    No shuffle, no order kept, no flip: the floor of a RAW reader built from TensorFlow's own
    ops (``parse_example`` copies each image's bytes out of the record, ``decode_raw`` copies
    them into the pixel tensor).
    """
    import tensorflow as tf

    from schemas import KEY_ENCODED, KEY_LABEL

    spec = {
        KEY_ENCODED: tf.io.FixedLenFeature([], tf.string),
        KEY_LABEL: tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(records: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features = tf.io.parse_example(records, spec)
        pixels = tf.io.decode_raw(features[KEY_ENCODED], tf.uint8)
        return tf.reshape(pixels, [-1, IMAGE_SIZE, IMAGE_SIZE, 3]), features[KEY_LABEL]

    records = bytes_only_dataset(dataset_dir, batch_size)
    return records.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


# Row name -> (dataset directory under the family's root, how the row builds its pipeline).
ROWS: dict[str, tuple[str, str]] = {
    "article: tuned pipeline, original JPEGs": ("photos", "tuned_jpeg"),
    "reader, JPEG-256 shards": ("jpeg256", "reader"),
    "reader, RAW-224 shards": ("raw224", "reader"),
    "bytes only, RAW-224 shards": ("raw224", "bytes"),
    "decode floor, JPEG-256 bytes": ("jpeg256", "decode_floor"),
    "decode floor, RAW-224 shards": ("raw224", "raw_floor"),
}
EXTRA_ROWS: dict[str, tuple[str, str]] = {
    # Seeded pipelines keep a deterministic order (exact resume); this row shows what that
    # costs against the bytes-only read, which has no order to keep.
    "reader, RAW-224, deterministic=False": ("raw224", "reader-unordered"),
    "reader, JPEG-256, float32 out": ("jpeg256", "reader-float32"),
    "reader, RAW-224, float32 out": ("raw224", "reader-float32"),
    # glibc keeping freed memory for reuse (``trainer.host_memory.keep_freed_memory``): each
    # RAW batch allocates megabytes, which by default land in fresh pages the kernel faults in.
    "reader, RAW-224, malloc keeps freed memory": ("raw224", "reader-keep"),
    "bytes only, RAW-224, malloc keeps freed memory": ("raw224", "bytes-keep"),
}
ARTICLE, JPEG, RAW, BYTES, FLOOR, RAW_FLOOR = ROWS
# Short names for --rows.
ROW_KEYS: dict[str, str] = {
    "article": ARTICLE,
    "jpeg": JPEG,
    "raw": RAW,
    "bytes": BYTES,
    "floor": FLOOR,
    "raw_floor": RAW_FLOOR,
    "raw_unordered": "reader, RAW-224, deterministic=False",
    "jpeg_float32": "reader, JPEG-256, float32 out",
    "raw_float32": "reader, RAW-224, float32 out",
    "raw_keep": "reader, RAW-224, malloc keeps freed memory",
    "bytes_keep": "bytes only, RAW-224, malloc keeps freed memory",
}


def build_row(name: str, root: Path, batch_size: int):  # -> tf.data.Dataset
    """The pipeline a row measures, over the datasets written under ``root``."""
    from tfrecord_io import ReadConfig, make_dataset

    directory, kind = {**ROWS, **EXTRA_ROWS}[name]
    kind = kind.removesuffix("-keep")
    data = root / directory
    if kind == "tuned_jpeg":
        return tuned_jpeg_dataset(data, batch_size, IMAGE_SIZE)
    if kind == "bytes":
        return bytes_only_dataset(data, batch_size)
    if kind == "decode_floor":
        return decode_floor_dataset(data, batch_size)
    if kind == "raw_floor":
        return raw_floor_dataset(data, batch_size)
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


def _measure_in_child(
    name: str, root: Path, batch_size: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Runs ``measure`` for one row in a fresh Python process; returns (ex/s, CPU-ms/ex)."""
    flags = [
        "--measure_row",
        name,
        "--measure_root",
        str(root),
        "--batch_size",
        str(batch_size),
        "--examples",
        str(args.examples),
        "--warmup_examples",
        str(args.warmup_examples),
        "--max_seconds",
        str(args.max_seconds),
    ]
    out = run_module("benchmarks.bench_reader", flags)
    rate, cpu_ms = json.loads(out.strip().splitlines()[-1])
    return rate, cpu_ms


def _batches(examples: int, batch_size: int) -> int:
    return max(2, -(-examples // batch_size))


def _child_main(args: argparse.Namespace) -> int:
    if {**ROWS, **EXTRA_ROWS}[args.measure_row][1].endswith("-keep"):
        # Before TensorFlow starts any thread, as the trainer applies it.
        from trainer.host_memory import keep_freed_memory

        keep_freed_memory()
    root, b = Path(args.measure_root), int(args.batch_size)
    warmup = _batches(args.warmup_examples, b)
    # Untimed first: the first pipeline of a process pays one-off costs (tracing, thread pools).
    measure(lambda: build_row(args.measure_row, root, b), b, 2, 1)
    rate, cpu_ms = measure(
        lambda: build_row(args.measure_row, root, b),
        b,
        warmup,
        _batches(args.examples, b),
        max_seconds=args.max_seconds,
    )
    print(json.dumps([rate, cpu_ms]))
    return 0


def measure(
    build: Callable[[], Any],
    batch_size: int,
    warmup: int,
    batches: int,
    *,
    max_seconds: float | None = None,
) -> tuple[float, float]:
    """Times ``batches`` batches of a fresh iterator after ``warmup``; returns (ex/s, CPU-ms/ex).

    With ``max_seconds``, stops early once that much wall time has passed (after 3 batches at
    least), for rows too slow to time in full.
    """
    iterator = iter(build())
    for _ in range(warmup):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    done = 0
    while done < batches:
        next(iterator)
        done += 1
        if max_seconds and done >= 3 and time.perf_counter() - wall > max_seconds:
            break
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del iterator
    gc.collect()
    examples = done * batch_size
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


def _families(text: str) -> list[str]:
    names = list(FAMILIES) if text == "all" else [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise SystemExit(f"--family {text!r}: choose 'all' or names from {list(FAMILIES)}")
    return names


def _table(
    family: str, batch_size: int, samples: dict[str, list[tuple[float, float]]]
) -> list[dict]:
    """Median rows of one family and batch size, with their ratios."""
    rows = []
    for name, values in samples.items():
        rows.append(
            {
                "family": family,
                "batch_size": batch_size,
                "row": name,
                "examples_per_s": statistics.median(v[0] for v in values),
                "cpu_ms_per_example": statistics.median(v[1] for v in values),
                "rounds": [list(v) for v in values],
            }
        )
    return rows


def _paired_ratio(rows: list[dict], top: str, bottom: str, column: int = 0) -> float:
    """The median over rounds of ``top / bottom``, each round's two measurements taken side by
    side (``column`` 0: examples/s; 1: CPU-ms per example).

    Rounds interleave the rows, so a round's pair saw the same state of the shared machine: a
    stall that halves one round's rates moves its pair together, where a ratio of medians
    would pair a stalled measurement with a clean one.
    """
    by = {r["row"]: r["rounds"] for r in rows}
    return statistics.median(
        a[column] / b[column] for a, b in zip(by[top], by[bottom], strict=True)
    )


def _print_table(rows: list[dict]) -> list[tuple[str, bool]]:
    """Prints one family's rows at one batch size; returns the verdicts its rows allow."""
    by = {r["row"]: r["examples_per_s"] for r in rows}
    base = by.get(ARTICLE)
    notes: dict[str, list[str]] = {}
    verdicts: list[tuple[str, bool]] = []
    if base and JPEG in by:
        verdicts.append(("JPEG >= 2x article", by[JPEG] >= 2 * base))
    if JPEG in by and FLOOR in by:
        notes.setdefault(JPEG, []).append(f"{by[JPEG] / by[FLOOR]:.0%} of the decode floor")
    if base and RAW in by:
        verdicts.append(("RAW >= 5x article", by[RAW] >= 5 * base))
    if RAW in by and BYTES in by:
        paired = _paired_ratio(rows, RAW, BYTES)
        per_cpu = _paired_ratio(rows, BYTES, RAW, column=1)
        notes.setdefault(RAW, []).append(
            f">= 55% of bytes only ({paired:.0%}; by CPU per example {per_cpu:.0%})"
        )
        verdicts.append(("RAW >= 55% of bytes only", paired >= 0.55))
    if RAW in by and RAW_FLOOR in by:
        notes.setdefault(RAW, []).append(f"{by[RAW] / by[RAW_FLOOR]:.0%} of the RAW floor")
    if RAW_FLOOR in by and BYTES in by:
        notes.setdefault(RAW_FLOOR, []).append(f"{by[RAW_FLOOR] / by[BYTES]:.0%} of bytes only")
    print(f"family {rows[0]['family']}, batch {rows[0]['batch_size']}:")
    print("| row | examples/s | host CPU-ms/example | vs article | notes |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        versus = f"{r['examples_per_s'] / base:.2f}x" if base else "-"
        print(
            f"| {r['row']} | {r['examples_per_s']:,.0f} | {r['cpu_ms_per_example']:.3f} | "
            f"{versus} | {'; '.join(notes.get(r['row'], ['-']))} |"
        )
    print("; ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in verdicts))
    print()
    return verdicts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--family", default="all", help=f"'all' or names from {list(FAMILIES)}, comma-separated"
    )
    parser.add_argument("--n", type=int, default=240, help="photos per family (240)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--batch_size", default="32,128", help="per-replica batch sizes, comma-separated (32,128)"
    )
    parser.add_argument(
        "--examples", type=int, default=3072, help="timed examples per measurement (3072)"
    )
    parser.add_argument(
        "--warmup_examples", type=int, default=1024, help="untimed examples first (1024)"
    )
    parser.add_argument(
        "--max_seconds", type=float, default=20.0, help="stop timing a row after this (20 s)"
    )
    parser.add_argument(
        "--rows",
        default="all",
        help=f"'all' (the six main rows) or names from {list(ROW_KEYS)}, comma-separated",
    )
    parser.add_argument("--extra", action="store_true", help="also the --extra rows")
    parser.add_argument("--quick", action="store_true", help="smoke run: 32 photos, tiny runs")
    parser.add_argument("--workdir", default=None, help="where to put photos and shards")
    parser.add_argument(
        "--cache", default=None, help="keep photos and shards here and reuse them next time"
    )
    parser.add_argument("--json", default=None, help="also write every row here")
    parser.add_argument(
        "--chart",
        default=None,
        help=f"PNG chart of the first family and batch size, '' for none (default "
        f"{RESULTS_DIR / 'reader.png'}; with --quick, a temporary file)",
    )
    # A child process measuring one row (see _measure_in_child).
    parser.add_argument("--measure_row", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure_root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_row is not None:
        return _child_main(args)
    families, batch_sizes = _families(args.family), parse_batch_sizes(args.batch_size, "32,128")
    selected = parse_rows(args.rows, ROW_KEYS, ROWS)
    if args.chart is None:
        args.chart = str(
            Path(tempfile.gettempdir()) / "bench_reader_quick.png"
            if args.quick
            else RESULTS_DIR / "reader.png"
        )
    if args.quick:
        args.n, args.rounds, args.examples, args.warmup_examples = 32, 1, 64, 32
        batch_sizes = sorted({min(b, 16) for b in batch_sizes})
    names = selected + [n for n in EXTRA_ROWS if args.extra and n not in selected]
    with contextlib.ExitStack() as stack:
        data = {}
        for family in families:
            made = stack.enter_context(
                photo_datasets(
                    args.n,
                    shards=max(2, min(8, args.n // 30)),
                    workdir=args.workdir,
                    family=family,
                    cache=args.cache,
                )
            )
            data[family] = made
            print(
                f"{family}: {args.n} photos, mean {made.mean_kb:.0f} KB, {made.shards} shards "
                f"per dataset, written in {made.prepare_s:.0f} s",
                flush=True,
            )
        import tensorflow as tf

        loads = [os.getloadavg()[0]]
        samples: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for family in families:
                for b in batch_sizes:
                    for name in names:
                        value = _measure_in_child(name, data[family].root, b, args)
                        samples.setdefault((family, b, name), []).append(value)
                        print(
                            f"  {family} b{b} {name}: {value[0]:,.0f} ex/s, "
                            f"{value[1]:.3f} CPU-ms/ex",
                            flush=True,
                        )
                    loads.append(os.getloadavg()[0])

    conditions = (
        f"{args.n} photos per family; batches {batch_sizes}; {args.rounds} interleaved rounds x "
        f"{args.examples} examples, a process per measurement; {os.cpu_count()} CPUs, load "
        f"average {min(loads):.1f}-{max(loads):.1f} (1-min); TensorFlow {tf.__version__}"
    )
    print(conditions)
    print()
    all_rows: list[dict] = []
    verdicts: list[tuple[str, bool]] = []
    for family in families:
        for b in batch_sizes:
            rows = _table(family, b, {n: samples[(family, b, n)] for n in names})
            all_rows.extend(rows)
            verdicts.extend((f"{family} b{b} {what}", ok) for what, ok in _print_table(rows))
    missed = [what for what, ok in verdicts if not ok]
    print("all targets met" if not missed else "NOT met: " + "; ".join(missed))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"conditions": conditions, "rows": all_rows}, indent=2) + "\n"
        )
    if args.chart and ARTICLE in names:
        first = [r for r in all_rows if r["family"] == families[0]]
        first = [r for r in first if r["batch_size"] == batch_sizes[0]]
        title = f"tf.data reader benchmark, {families[0]}, batch {batch_sizes[0]}: {conditions}"
        _chart(first, Path(args.chart), title)
        Path(args.chart).with_suffix(".json").write_text(
            json.dumps({"conditions": conditions, "rows": all_rows}, indent=2) + "\n"
        )
        print(f"chart: {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
