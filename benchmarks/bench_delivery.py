"""Benchmark: what exact epochs cost the reader, and what the delivered set adds to a checkpoint.

Reader rows, over RAW 64 px shards (the cheapest decode, so the filter's share is the largest it
gets) or JPEG shards stored at 256 px and read as 224 px random crops (the usual case); training
mode, one input pipeline, ``uint8`` batches of 128, a 1024-record shuffle buffer:

  * reader: ``make_dataset`` without ``exclude`` (today's file-sharded reader).
  * exact epochs, fresh: ``exclude=DeliveredSet.empty(N)``: positions ride along, no filter.
  * exact epochs, resumed: the delivered set is what the fresh row's own pipeline yielded in
    the first half of the epoch (what a trainer interrupted there had committed: whole shards,
    and the shards then open with the holes their shuffle buffer left), so the timed batches
    are the rest of that epoch, read through the filter.
  * exact epochs, every other delivered: the worst case for the filter, every record of the
    epoch goes through the bitmap lookup and half are dropped; examples/s counts yielded
    examples.
  * exact epochs, symbolic: the fresh row with ``symbolic_checkpoint=True``.
  * exact epochs, permutation: the fresh row with ``epoch_order="permutation"`` (the split
    read into memory when the pipeline is built, untimed; then keyed permutations).

The filter's cost is the *resumed* row against the *fresh* row, over the same number of
examples: by default every batch the resumed row has left of its epoch, from its first, since
what a resume pays extra (the records it looks up, and the delivered ones among them read for
nothing) comes at its start. The dataset has ImageNet's layout, shards of 1,250 examples, so
the reader has 16 of its 80 shards open at a time, as it would over ImageNet's 1,024. Each
measurement is a fresh process (as a trainer runs one pipeline): an untimed build, a fresh
iterator, then the timed batches, all inside the first epoch. Rounds visit every row in turn;
medians are reported, with the spread over rounds.

Checkpoint rows: ``tf.train.Checkpoint`` of a small model with and without a
``DeliveryTracker`` for N examples (a global batch of the next epoch already begun), on disk.

Target: the filter costs <= 2% of reader throughput; the checkpoint grows <= 1 bit per example
plus a constant.

Usage::

  python -m benchmarks.bench_delivery [--encoding raw|jpeg] [--n 20000] [--rounds 3]
      [--batches 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import run_module

__all__ = ["ROWS", "checkpoint_rows", "main", "measure_row"]

ROWS = (
    "reader",
    "exact, fresh",
    "exact, resumed",
    "exact, every other delivered",
    "exact, symbolic",
    "exact, permutation",
)
# Rows of a fresh epoch read with other ReadConfig options: symbolic checkpoints of the
# buffered reader, and permutations of the split held in memory.
_ROW_OPTIONS = {
    "exact, symbolic": {"symbolic_checkpoint": True},
    "exact, permutation": {"epoch_order": "permutation"},
}
BATCH = 128
# Stored image side per encoding, and the side the reader outputs.
STORED = {"raw": 64, "jpeg": 256}
OUTPUT = {"raw": 64, "jpeg": 224}
SHUFFLE_BUFFER = 1024
# ImageNet's layout: 1,024 train shards of about 1,250 examples.
EXAMPLES_PER_SHARD = 1250


def _shards(n: int) -> int:
    return max(16, -(-n // EXAMPLES_PER_SHARD))


def _write(root: Path, n: int, encoding: str) -> None:
    from tests.fixtures.shards import write_dataset

    write_dataset(
        root,
        encoding=encoding,
        examples={"train": n},
        num_shards={"train": _shards(n)},
        image_size=STORED[encoding],
    )


def _build(root: str, row: str, image_size: int):  # -> tf.data.Dataset
    import numpy as np

    from tfrecord_io import load_manifest
    from tfrecord_io.delivery import DeliveredSet
    from tfrecord_io.read_config import ReadConfig
    from tfrecord_io.reader import make_dataset

    n = load_manifest(root).split("train").num_examples

    def build(exclude: DeliveredSet | None):  # -> tf.data.Dataset
        options = _ROW_OPTIONS.get(row, {})
        return make_dataset(
            root,
            "train",
            global_batch_size=BATCH,
            image_size=image_size,
            seed=0,
            # A buffer well under the timed stretch, so every row reads while it is timed.
            read_config=ReadConfig(
                exclude=exclude,
                shuffle_buffer=SHUFFLE_BUFFER,
                **options,  # type: ignore[arg-type]
            ),
        )

    if row == "exact, resumed":
        fresh = iter(build(DeliveredSet.empty(n)))
        positions = [next(fresh)[-1].numpy() for _ in range(n // 2 // BATCH)]
        return build(DeliveredSet.from_indices(n, np.concatenate(positions) % n))
    exclude = {
        "reader": None,
        "exact, fresh": DeliveredSet.empty(n),
        "exact, every other delivered": DeliveredSet.from_indices(n, np.arange(0, n, 2)),
    }.get(row, DeliveredSet.empty(n))
    return build(exclude)


def measure_row(
    root: str, row: str, image_size: int, warmup: int, batches: int
) -> dict[str, float]:
    """One row in this process: (examples/s, host CPU-ms per example)."""
    next(iter(_build(root, row, image_size)))  # tracing and thread pools, untimed
    iterator = iter(_build(root, row, image_size))
    for _ in range(warmup):
        next(iterator)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(iterator)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    examples = batches * BATCH
    return {"examples_per_s": examples / wall, "cpu_ms_per_example": 1000 * cpu / examples}


def checkpoint_rows(sizes: tuple[int, ...] = (100_000, 1_281_167)) -> list[dict[str, float]]:
    """Checkpoint bytes on disk without and with a delivered set of N examples."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfrecord_io.delivery import DeliveredSet, DeliveryTracker

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])

    def size(objects: dict) -> int:
        with tempfile.TemporaryDirectory() as tmp:
            tf.train.Checkpoint(**objects).write(os.path.join(tmp, "ckpt"))
            return sum(p.stat().st_size for p in Path(tmp).iterdir())

    base = size({"model": model})
    rows = []
    for n in sizes:
        tracker = DeliveryTracker(DeliveredSet.empty(n, seed=0, split="0" * 32))
        rng = np.random.default_rng(0)
        tracker.add(rng.permutation(n)[: n // 3])  # a third of the epoch
        tracker.add(n + np.arange(256))  # and a global batch of the next one
        grown = size({"model": model, "delivered": tracker}) - base
        rows.append(
            {
                "examples": n,
                "bytes_added": grown,
                "bits_per_example": 8 * grown / n,
                "bytes_over_bitmap": grown - (n + 7) // 8,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="examples in the split")
    parser.add_argument("--encoding", choices=sorted(STORED), default="raw")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="untimed batches first (0)")
    parser.add_argument(
        "--batches",
        type=int,
        default=None,
        help="timed batches (default: all the resumed row has left of its epoch)",
    )
    parser.add_argument("--data", default=None, help="reuse this dataset directory")
    parser.add_argument("--row", default=None, help=argparse.SUPPRESS)  # one row, in-process
    args = parser.parse_args(argv)
    if args.row is not None:
        print(
            json.dumps(
                measure_row(args.data, args.row, OUTPUT[args.encoding], args.warmup, args.batches)
            )
        )
        return 0
    if args.batches is None:
        args.batches = args.n // 2 // BATCH - args.warmup
    if args.batches < 1 or (args.warmup + args.batches) * BATCH > args.n // 2:
        parser.error("--n must hold warm-up and timed batches twice over (half an epoch left)")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.data) if args.data else Path(tmp) / args.encoding
        if not (root / "dataset.json").exists():
            _write(root, args.n, args.encoding)
        results: dict[str, list[dict[str, float]]] = {row: [] for row in ROWS}
        for _ in range(args.rounds):
            for row in ROWS:
                out = run_module(
                    "benchmarks.bench_delivery",
                    [
                        "--row",
                        row,
                        "--encoding",
                        args.encoding,
                        "--data",
                        str(root),
                        "--warmup",
                        str(args.warmup),
                        "--batches",
                        str(args.batches),
                    ],
                )
                results[row].append(json.loads(out.strip().splitlines()[-1]))
    print(
        f"reader, {args.encoding.upper()} stored at {STORED[args.encoding]} px, output "
        f"{OUTPUT[args.encoding]} px, {args.n} examples in {_shards(args.n)} shards, batch "
        f"{BATCH}, {args.warmup} + {args.batches} timed batches, median of {args.rounds} rounds"
    )
    fresh = statistics.median(r["examples_per_s"] for r in results["exact, fresh"])
    fresh_cpu = statistics.median(r["cpu_ms_per_example"] for r in results["exact, fresh"])
    print(
        f"{'row':<30}{'examples/s':>12}{'range':>18}{'vs fresh':>10}{'CPU-ms/ex':>11}"
        f"{'CPU vs fresh':>14}"
    )
    for row in ROWS:
        rates = [r["examples_per_s"] for r in results[row]]
        cpu = statistics.median(r["cpu_ms_per_example"] for r in results[row])
        rate = statistics.median(rates)
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        print(
            f"{row:<30}{rate:>12,.0f}{spread:>18}{rate / fresh:>10.3f}{cpu:>11.3f}"
            f"{cpu / fresh_cpu:>14.3f}"
        )
    print()
    print(f"{'checkpoint: examples':<24}{'bytes added':>12}{'bits/example':>14}{'over N/8':>10}")
    for r in checkpoint_rows():
        print(
            f"{r['examples']:<24,}{r['bytes_added']:>12,}{r['bits_per_example']:>14.4f}"
            f"{r['bytes_over_bitmap']:>10,}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
