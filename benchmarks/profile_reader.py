"""Where the reader spends host CPU, stage by stage, by adding one stage at a time.

Each stage is a pipeline that does everything the stage before it did, and one thing more;
the difference in host CPU per example between two stages is what that thing costs. Every
pipeline runs in a fresh process (as ``bench_reader`` measures), producing batches of the given
size, and rounds interleave the stages.

JPEG-256 shards, training mode:

  1. read: the shard files' bytes, whole files (``tf.io.read_file``, no framing)
  2. + TFRecord framing and CRC32C (``TFRecordDataset``, interleaved, batched)
  3. + the reader's read path: seeded file order, deterministic interleave, per-file
     read-ahead, end-of-shard marker, record shuffle, per-example seeds, batch, prefetch
     (``make_dataset`` with a decode that returns the serialised batch)
  4. + ``parse_example``
  5. + JPEG decode, whole image (the floor of ``bench_reader``, inside the reader)
  6. + crop: ``decode_and_crop_jpeg`` of the random window instead of the whole image
  7. + resize to 224 and batch the images (``map_fn``'s stack)
  8. + flip: the whole reader

RAW-224 shards: stages 1-4, then ``decode_raw`` (+ reshape into the batch), then the whole
reader (+ flip).

Usage::

  python -m benchmarks.profile_reader [--family detail,sensor] [--batch_size 32,128]
      [--n 160] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_reader import measure
from benchmarks.common import photo_datasets, run_module

__all__ = ["JPEG_STAGES", "RAW_STAGES", "build_stage", "main"]

JPEG_STAGES = (
    "read file bytes",
    "+ TFRecord framing, CRC",
    "+ reader read path, shuffle, seeds, batch",
    "+ parse_example",
    "+ JPEG decode (whole)",
    "+ crop (decode_and_crop)",
    "+ resize 224, stack",
    "+ flip (whole reader)",
)
RAW_STAGES = (
    "read file bytes",
    "+ TFRecord framing, CRC",
    "+ reader read path, shuffle, seeds, batch",
    "+ parse_example",
    "+ decode_raw, reshape",
    "+ flip (whole reader)",
)


def _files_dataset(data: Path) -> tuple[Any, float]:
    """Whole shard files read into memory, one file per element, and the records per file."""
    import tensorflow as tf

    from tfrecord_io import resolve_source

    paths = resolve_source(str(data)).paths
    records = sum(1 for _ in tf.data.TFRecordDataset(paths))
    files = tf.data.Dataset.from_tensor_slices(paths).repeat()
    contents = files.map(
        lambda p: tf.strings.length(tf.io.read_file(p)),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    return contents.prefetch(tf.data.AUTOTUNE), records / len(paths)


def _patched_reader(data: Path, batch_size: int, stage: int, jpeg: bool) -> Any:
    """``make_dataset`` with the decode cut after ``stage`` (3 = no parse)."""
    import tensorflow as tf

    from schemas import KEY_ENCODED
    from tfrecord_io import batching as batching_module
    from tfrecord_io import decode as decode_module
    from tfrecord_io import make_dataset

    def pixel(image: tf.Tensor) -> tf.Tensor:
        return image[:1, :1, :]

    def small(fn: Any, encoded: tf.Tensor, seeds: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(
            lambda args: pixel(fn(args[0], args[1])),
            (encoded, seeds),
            fn_output_signature=tf.TensorSpec([1, 1, 3], tf.uint8),
        )

    def whole(encoded: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        return tf.io.decode_jpeg(encoded, channels=3, dct_method="INTEGER_FAST")

    def cropped(encoded: tf.Tensor, seed: tf.Tensor, config: Any) -> tf.Tensor:
        shape = tf.io.extract_jpeg_shape(encoded)
        window = decode_module.random_window(shape, seed, config)
        return tf.io.decode_and_crop_jpeg(encoded, window, channels=3, dct_method="INTEGER_FAST")

    def decode_batch(features: dict, seeds: tf.Tensor, config: Any) -> tuple:
        encoded = features[KEY_ENCODED] if isinstance(features, dict) else features
        if stage == 3:
            return encoded, seeds
        if stage == 4:
            return encoded, seeds
        if not jpeg:  # stage 5: decode_raw
            size = config.stored_size
            return tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [-1, size, size, 3]), seeds
        if stage == 5:
            return small(whole, encoded, seeds), seeds
        if stage == 6:
            return small(lambda e, s: cropped(e, s, config), encoded, seeds), seeds
        images = tf.map_fn(
            lambda args: decode_module.decode_one_jpeg(args[0], args[1], config),
            (encoded, seeds),
            fn_output_signature=tf.TensorSpec([224, 224, 3], tf.uint8),
        )
        return images, seeds

    if stage == 3:
        batching_module.parse_batch = lambda serialized, config: serialized
    batching_module.decode_batch = decode_batch
    return make_dataset(data, global_batch_size=batch_size, image_size=224, seed=0)


def build_stage(root: Path, encoding: str, stage: int, batch_size: int) -> tuple[Any, float]:
    """The pipeline of a stage (1-based) and the examples each of its batches stands for."""
    from benchmarks.bench_reader import build_row, bytes_only_dataset

    data = root / ("jpeg256" if encoding == "jpeg" else "raw224")
    last = len(JPEG_STAGES if encoding == "jpeg" else RAW_STAGES)
    if stage == 1:
        return _files_dataset(data)
    if stage == 2:
        return bytes_only_dataset(data, batch_size), batch_size
    if stage == last:
        row = "reader, JPEG-256 shards" if encoding == "jpeg" else "reader, RAW-224 shards"
        return build_row(row, root, batch_size), batch_size
    return _patched_reader(data, batch_size, stage, encoding == "jpeg"), batch_size


def _child(args: argparse.Namespace) -> int:
    root, b = Path(args.measure_root), args.measure_batch
    encoding, stage = args.measure_stage.split(":")
    dataset, per_batch = build_stage(root, encoding, int(stage), b)
    # measure() counts batch_size examples per element; a file of stage 1 stands for per_batch.
    step = b if per_batch == b else per_batch
    batches = max(2, round(args.examples / step))
    measure(lambda: dataset, b, 2, 1)
    rate, cpu_ms = measure(lambda: dataset, b, max(2, round(args.warmup_examples / step)), batches)
    scale = per_batch / b
    print(json.dumps([rate * scale, cpu_ms / scale]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="detail,sensor", help="families (detail,sensor)")
    parser.add_argument("--batch_size", default="32,128", help="batch sizes (32,128)")
    parser.add_argument("--encoding", default="jpeg,raw", help="jpeg, raw or both")
    parser.add_argument("--n", type=int, default=160, help="photos per family (160)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    parser.add_argument("--examples", type=int, default=2048, help="timed examples (2048)")
    parser.add_argument("--warmup_examples", type=int, default=512, help="untimed (512)")
    parser.add_argument("--workdir", default=None, help="where to put photos and shards")
    parser.add_argument(
        "--cache", default=None, help="keep photos and shards here and reuse them next time"
    )
    parser.add_argument("--json", default=None, help="also write the medians here")
    parser.add_argument("--measure_root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure_stage", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure_batch", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_stage is not None:
        return _child(args)
    families = args.family.split(",")
    batch_sizes = [int(v) for v in args.batch_size.split(",")]
    encodings = args.encoding.split(",")
    samples: dict[tuple[str, str, int, int], list[tuple[float, float]]] = {}
    loads = [os.getloadavg()[0]]
    with contextlib.ExitStack() as stack:
        roots = {
            f: stack.enter_context(
                photo_datasets(args.n, shards=8, workdir=args.workdir, family=f, cache=args.cache)
            ).root
            for f in families
        }
        for _ in range(args.rounds):
            for family in families:
                for encoding in encodings:
                    stages = JPEG_STAGES if encoding == "jpeg" else RAW_STAGES
                    for b in batch_sizes:
                        for stage in range(1, len(stages) + 1):
                            out = run_module(
                                "benchmarks.profile_reader",
                                [
                                    "--measure_root",
                                    str(roots[family]),
                                    "--measure_stage",
                                    f"{encoding}:{stage}",
                                    "--measure_batch",
                                    str(b),
                                    "--examples",
                                    str(args.examples),
                                    "--warmup_examples",
                                    str(args.warmup_examples),
                                ],
                            )
                            value = json.loads(out.strip().splitlines()[-1])
                            samples.setdefault((family, encoding, b, stage), []).append(value)
                            print(
                                f"  {family} {encoding} b{b} {stages[stage - 1]}: "
                                f"{value[1]:.3f} CPU-ms/ex",
                                flush=True,
                            )
                        loads.append(os.getloadavg()[0])
    print(
        f"{args.n} photos per family, 8 shards; {args.rounds} interleaved rounds x "
        f"{args.examples} examples, a process per measurement; load average "
        f"{min(loads):.1f}-{max(loads):.1f}"
    )
    medians = {k: statistics.median(v[1] for v in vs) for k, vs in samples.items()}
    for family in families:
        for encoding in encodings:
            stages = JPEG_STAGES if encoding == "jpeg" else RAW_STAGES
            header = " | ".join(f"batch {b}: CPU-ms/ex | stage adds" for b in batch_sizes)
            print(f"\n{family}, {encoding}:\n| stage | {header} |")
            print("|---|" + "---:|---:|" * len(batch_sizes))
            for stage, name in enumerate(stages, 1):
                cells = []
                for b in batch_sizes:
                    value = medians[(family, encoding, b, stage)]
                    before = medians[(family, encoding, b, stage - 1)] if stage > 1 else 0.0
                    cells.append(f"{value:.3f} | {value - before:+.3f}")
                print(f"| {name} | {' | '.join(cells)} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"|".join(map(str, k)): v for k, v in samples.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
