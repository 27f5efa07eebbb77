"""Benchmark: training ``small_cnn`` on CPU, fed by the project's reader or by a well-tuned
tf.data pipeline over the original JPEGs. Does the input keep the model busy?

Inputs are ImageNet-like photos (500x375, about 100 KB, quality 90). The pipeline
(``python -m beam_pipelines.images_to_tfrecord``) writes them once as JPEG shards at
``--image_size 256`` and once as RAW shards at ``--image_size 224 --crop center --encoding raw``.

Rows, each a real ``trainer`` run (``run_training``: ``OneDeviceStrategy``, custom loop,
checkpoints, TensorBoard scalars) at ``--image_size`` (224) in the same process, one after the other, for
``--rounds`` rounds:
  * tuned JPEG pipeline: the usual pipeline over the original files (list files -> shuffle ->
    parallel map(read, decode_jpeg, resize 224, normalise) -> batch -> prefetch), float32
    normalised on the host (the model skips its own normalisation);
  * reader, JPEG-256 shards: ``tfrecord_io.make_dataset``, uint8 out, normalised in the model;
  * reader, RAW-224 shards: the same over RAW shards.

Columns: ``input alone`` is the pipeline's examples/s with nothing else running (a fresh
iterator after warm-up); the training columns are medians over the run's logged windows (the
first one, which holds compilation, left out) of what the trainer writes to TensorBoard:
examples/s, ``input_wait`` (share of the step blocked on the next batch) and step time. On a
CPU the model and the input pipeline share the same cores, so a cheaper input also leaves more
CPU to the model.

Usage::

  python -m benchmarks.bench_trainer [--n 512] [--steps 120] [--image_size 224] [--rounds 1]
                                     [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from beam_pipelines.samples import SAMPLE_CLASSES
from benchmarks.common import photo_datasets, tuned_jpeg_dataset

__all__ = ["TunedJpegInputs", "main"]


@dataclasses.dataclass(frozen=True)
class TunedJpegInputs:
    """``trainer.inputs.Inputs`` over ``benchmarks.common.tuned_jpeg_dataset``."""

    photos: Path
    global_batch_size: int
    num_classes: int
    train_examples: int | None = None
    has_eval: bool = False
    checkpointable: bool = True
    exact_epochs: bool = False
    split_digest: str | None = None

    image_size: int = 224

    def train_dataset(
        self,
        input_context: Any,
        *,
        with_keys: bool,
        exclude: Any = None,
        service_job_name: str | None = None,
    ) -> Any:
        if with_keys:
            raise ValueError("the tuned JPEG pipeline has no example keys")
        assert exclude is None and service_job_name is None  # no exact epochs, no service
        return tuned_jpeg_dataset(
            self.photos,
            input_context.get_per_replica_batch_size(self.global_batch_size),
            self.image_size,
        )

    def eval_dataset(self, input_context: Any) -> Any:
        raise NotImplementedError("the benchmark does not evaluate")

    def layout(self) -> dict[str, Any]:
        return {"photos": str(self.photos), "global_batch_size": self.global_batch_size}


def _input_alone(dataset: Any, warmup: int, batches: int, batch_size: int) -> float:
    iterator = iter(dataset)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches * batch_size / (time.perf_counter() - start)


def _train(model_dir: Path, inputs: Any, args: argparse.Namespace, dist: Any) -> dict[str, float]:
    from trainer.config import DataConfig, OptimConfig, TrainConfig
    from trainer.diagnosis import read_scalars
    from trainer.loop import run_training

    config = TrainConfig(
        model_dir=str(model_dir),
        data=DataConfig(source="benchmark", image_size=args.image_size),
        model="small_cnn",
        global_batch_size=args.batch_size,
        steps=args.steps,
        log_every=args.log_every,
        checkpoint_every=10**9,
        optim=OptimConfig(base_lr=0.2, warmup_steps=10),
    )
    run_training(config, dist, inputs)
    train = read_scalars(str(model_dir))["train"]

    def median(tag: str) -> float:
        return statistics.median(v for _, v in train[tag][1:])

    return {
        "examples_per_sec": median("examples_per_sec"),
        "input_wait": median("input_wait"),
        "step_time_ms": 1000 * median("step_time"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="photos to generate (512)")
    parser.add_argument("--steps", type=int, default=120, help="training steps per row (120)")
    parser.add_argument("--log_every", type=int, default=10, help="steps per logged window (10)")
    parser.add_argument("--batch_size", type=int, default=32, help="global batch (32)")
    parser.add_argument(
        "--image_size",
        type=int,
        default=224,
        help="training image side (224); smaller "
        "makes the model cheaper, so the input's share of the CPU shows more",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds over all rows (1)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 photos, 12 steps")
    parser.add_argument("--workdir", default=None, help="where to put photos, shards and runs")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.steps, args.log_every, args.batch_size, args.rounds = 64, 12, 3, 16, 1
    with photo_datasets(args.n, shards=max(2, args.n // 125), workdir=args.workdir) as data:
        root, mean_kb, shards, prepare = data.root, data.mean_kb, data.shards, data.prepare_s

        import tensorflow as tf

        from trainer.config import DataConfig
        from trainer.inputs import ReaderInputs
        from trainer.strategy import create_distribution

        dist = create_distribution("one_device")
        b = args.batch_size

        def reader(name: str) -> Callable[[], Any]:
            return lambda: ReaderInputs.from_config(
                DataConfig(source=str(root / name), image_size=args.image_size),
                global_batch_size=b,
                seed=0,
            )

        rows: dict[str, Callable[[], Any]] = {
            "tuned pipeline, original JPEGs (float32 from host)": lambda: TunedJpegInputs(
                root / "photos", b, num_classes=len(SAMPLE_CLASSES), image_size=args.image_size
            ),
            "reader, JPEG-256 shards (uint8)": reader("jpeg256"),
            "reader, RAW-224 shards (uint8)": reader("raw224"),
        }
        context = tf.distribute.InputContext()
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
        load = [os.getloadavg()[0]]
        for round_index in range(args.rounds):
            for i, (name, make) in enumerate(rows.items()):
                inputs = make()
                alone = _input_alone(
                    inputs.train_dataset(context, with_keys=False),
                    warmup=5,
                    batches=max(10, args.steps // 2),
                    batch_size=b,
                )
                figures = _train(root / "runs" / f"{round_index}-{i}", inputs, args, dist)
                samples[name].append({"input_alone": alone, **figures})
                print(f"round {round_index + 1}: {name}: {samples[name][-1]}", file=sys.stderr)
        load.append(os.getloadavg()[0])

    table = []
    for name, values in samples.items():
        table.append(
            {
                "row": name,
                **{k: statistics.median(v[k] for v in values) for k in values[0]},
            }
        )
    base = table[0]["examples_per_sec"]
    print(
        f"small_cnn at {args.image_size}x{args.image_size}, global batch {b}, {args.steps} steps per row, "
        f"{args.rounds} round(s), OneDeviceStrategy on {os.cpu_count()} CPU cores; "
        f"{args.n} ImageNet-like JPEGs (500x375, mean {mean_kb:.0f} KB), {shards} shards per "
        f"dataset, pipeline {prepare:.0f}s; load average {load[0]:.1f} -> {load[1]:.1f}"
    )
    header = (
        "| input | input alone (ex/s) | training (ex/s) | input_wait | step time (ms) "
        "| training vs tuned JPEG pipeline |"
    )
    print(header)
    print("|---|---:|---:|---:|---:|---:|")
    for row in table:
        print(
            f"| {row['row']} | {row['input_alone']:.0f} | {row['examples_per_sec']:.0f} | "
            f"{row['input_wait']:.0%} | {row['step_time_ms']:.0f} | "
            f"{row['examples_per_sec'] / base:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": table, "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
