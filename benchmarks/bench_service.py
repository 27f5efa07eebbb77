"""Benchmark: what the trainer process pays for its input, with and without the tf.data service.

Inputs are ImageNet-like photos (500x375, about 100 KB, quality 90) that the pipeline
(``python -m beam_pipelines.images_to_tfrecord``) writes once as JPEG shards at
``--image_size 256``. Every row is the reader's training pipeline (``make_dataset``: file
shuffle, parallel interleave, record shuffle, batch, ``parse_example``, random-crop JPEG decode
to 224x224, flip, uint8 output):

  * in-process: the pipeline runs in the trainer (consumer) process, as without the service;
  * service, compression X: the same pipeline on a dispatcher and 2 worker processes started
    with ``python -m tfrecord_io.service`` on loopback; the consumer only receives batches.

Floor rows bound what any trainer pays: the consumer's loop over one repeated batch; the
same over one repeated message split into batches; and TensorFlow's service client alone,
receiving messages of zeros of the same shape that the workers make with no reading or
decoding. The last one is what the tf.data service client costs for these bytes: a target
below it cannot be met by anything this side of TensorFlow, so the service rows are judged
as that floor plus their own overhead.

Metrics, per row:
  * trainer CPU-ms/example: CPU time of the consumer process (all its threads, user and
    system, from ``getrusage(RUSAGE_SELF)``) over the timed batches. The worker processes are
    not included: this is what the trainer host pays. Target: service <= 10% of in-process.
    Through the service, "system" is mostly the kernel copying the batches off the loopback
    socket (and faulting in the buffers they land in), which grows with bytes, not with work.
  * worker CPU-ms/example: CPU time of the worker processes over the same span (from
    /proc/<pid>/stat), i.e. the work moved off the trainer.
  * examples/s through the consumer. On this 2-core machine the workers and the consumer
    share the same cores, so this measures the service's overhead, not a scaled-out cluster.

Warm-up is 20 batches and 100 are timed: the consumer's heap needs some batches to grow to what
it holds in flight, and until then received batches still land in fresh pages (a run with 10 +
60 measured half again as much system time for the NONE row).

Each measurement runs in a fresh consumer process, as each row is a trainer of its own: the
service rows first make glibc keep freed memory for reuse and gRPC read large messages in bulk,
as ``python -m trainer.train`` does with ``--data_service`` (``trainer/host_memory.py``,
``tfrecord_io.service.client.enable_bulk_reads``); the in-process row keeps the defaults, as
the trainer does without the service. Rows are interleaved round by round (the machine is
shared, so they see the same noise) and the median over rounds is reported. Each service
measurement uses its own job.

Usage::

  python -m benchmarks.bench_service [--n 512] [--rounds 3] [--batch_size 32,128] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import parse_batch_sizes, parse_rows, photo_datasets, run_module

__all__ = ["main", "measure"]

IMAGE_SIZE = 224
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _process_cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of other live processes, from /proc (Linux)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _CLOCK_TICKS


def _own_cpu_seconds() -> tuple[float, float]:
    """(user, system) CPU seconds of this process, all threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def measure(
    build: Callable[[], Any],
    batch_size: int,
    warmup: int,
    batches: int,
    worker_pids: Sequence[int] = (),
) -> tuple[float, float, float, float]:
    """Times ``batches`` batches of a fresh iterator after ``warmup``.

    Returns:
      ``(examples/s, consumer user CPU-ms/example, consumer system CPU-ms/example,
      worker CPU-ms/example)``.
    """
    iterator = iter(build())
    for _ in range(warmup):
        next(iterator)
    wall, (user, system) = time.perf_counter(), _own_cpu_seconds()
    workers = _process_cpu_seconds(worker_pids)
    for _ in range(batches):
        next(iterator)
    wall = time.perf_counter() - wall
    user_end, system_end = _own_cpu_seconds()
    workers = _process_cpu_seconds(worker_pids) - workers
    del iterator
    gc.collect()
    per_example = 1000.0 / (batches * batch_size)
    return (
        batches * batch_size / wall,
        (user_end - user) * per_example,
        (system_end - system) * per_example,
        workers * per_example,
    )


# Row name -> service compression[:examples per message], None for the in-process reader, ""
# and "split" and "client" for the floors.
ROWS: dict[str, str | None] = {
    "in-process reader": None,
    # What the consumer's own loop costs per batch whatever feeds it: one batch of the same
    # shape, made once and repeated, through prefetch. The service rows cannot go below it.
    "floor: the consumer loop over one repeated batch": "",
    # The same loop over one repeated 128-example message, split into its batches as the
    # service rows split theirs: what the split itself costs.
    "floor: one repeated message, split into batches": "split",
    # TensorFlow's service client receiving messages of the same shape and size (zeros) that
    # the workers make with no work at all, split into batches like the service rows: the least
    # any trainer pays to receive these bytes through the tf.data service. What the service
    # rows pay above it is the rest of the path (this project's part).
    "floor: the service client alone, receiving the same bytes": "client",
    "service, compression AUTO": "AUTO",
    "service, compression NONE": "NONE",
    # As before messages held several batches: one per-replica batch per message.
    "service, compression NONE, one batch per message": "NONE:1",
}
# Rows measured only when --rows names them.
EXTRA_ROWS: dict[str, str | None] = {
    # glibc backing its heap with transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1,
    # set when the consumer process starts): 512 page faults fewer per 2 MiB received.
    "service, compression NONE, huge pages": "NONE+thp",
    # Larger messages: fewer per-message costs, more memory in flight.
    "service, compression NONE, 256 examples per message": "NONE:256",
    "service, compression NONE, 512 examples per message": "NONE:512",
}
ALL_ROWS = {**ROWS, **EXTRA_ROWS}
# Short names for --rows.
ROW_KEYS = dict(
    zip(
        (
            "in_process",
            "floor",
            "split",
            "client",
            "auto",
            "none",
            "none_1",
            "none_thp",
            "none_256",
            "none_512",
        ),
        ALL_ROWS,
        strict=True,
    )
)
IN_PROCESS = "in-process reader"
CLIENT_FLOOR = "floor: the service client alone, receiving the same bytes"
HUGE_PAGES_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def _measure_in_child(
    name: str,
    root: Path,
    address: str,
    worker_pids: Sequence[int],
    job: int,
    args: argparse.Namespace,
) -> tuple[float, ...]:
    """Runs one row's measurement in a fresh consumer process; returns ``measure``'s tuple."""
    flags = [
        "--measure_row",
        name,
        "--measure_root",
        str(root),
        "--measure_service",
        address,
        "--measure_job",
        f"bench-{job}",
        "--measure_worker_pids",
        ",".join(str(p) for p in worker_pids),
        "--batch_size",
        str(args.batch_size),
        "--batches",
        str(args.batches),
        "--warmup",
        str(args.warmup),
    ]
    env = {**os.environ, **HUGE_PAGES_ENV} if (ALL_ROWS[name] or "").endswith("+thp") else None
    out = run_module("benchmarks.bench_service", flags, env=env)
    return tuple(json.loads(out.strip().splitlines()[-1]))


def _child_main(args: argparse.Namespace) -> int:
    row = ALL_ROWS[args.measure_row]
    if row is not None:
        row = row.removesuffix("+thp")
    compression = None if row is None else row.partition(":")[0]
    per_message = 128 if row is None else int(row.partition(":")[2] or 128)
    if compression and compression != "split":
        # What the trainer does with --data_service, before TensorFlow starts any thread.
        from trainer.host_memory import keep_freed_memory

        keep_freed_memory()
    from tfrecord_io import ServiceConfig, make_dataset

    if compression and compression != "split":
        # And, as it does, gRPC reads each batch in few wakeups (before any gRPC use).
        from tfrecord_io.service.client import enable_bulk_reads

        enable_bulk_reads()

    root, b = Path(args.measure_root), args.batch_size
    pids = [int(p) for p in args.measure_worker_pids.split(",")]
    jobs = iter(range(2))

    def build() -> object:
        if compression == "":
            import tensorflow as tf

            one = next(iter(make_dataset(root / "jpeg256", global_batch_size=b, seed=0)))
            return tf.data.Dataset.from_tensors(one).repeat().prefetch(tf.data.AUTOTUNE)
        if compression == "split":
            import tensorflow as tf

            from tfrecord_io.service.client import split_message

            one = next(iter(make_dataset(root / "jpeg256", global_batch_size=b, seed=0)))
            k = -(-per_message // b)
            message = tuple(tf.concat([part] * k, axis=0) for part in one)
            messages = tf.data.Dataset.from_tensors(message).repeat()
            split = messages.flat_map(lambda *parts: split_message(parts, b))
            return split.prefetch(tf.data.AUTOTUNE)
        if compression == "client":
            return _client_floor(
                root, b, per_message, args.measure_service, f"{args.measure_job}-{next(jobs)}"
            )
        if compression is None:
            return make_dataset(
                root / "jpeg256", global_batch_size=b, image_size=IMAGE_SIZE, seed=0
            )
        return make_dataset(
            root / "jpeg256",
            global_batch_size=b,
            image_size=IMAGE_SIZE,
            seed=0,
            service=None
            if args.measure_service is None
            else ServiceConfig(
                args.measure_service,
                job_name=f"{args.measure_job}-{next(jobs)}",
                compression=compression,
                examples_per_message=per_message,
            ),
        )

    # Untimed first: the first pipeline of a process, and a job's start, pay one-off costs.
    measure(build, b, args.warmup, 1, pids)
    print(json.dumps(measure(build, b, args.warmup, args.batches, pids)))
    return 0


def _client_floor(root: Path, batch_size: int, per_message: int, service: str, job: str) -> Any:
    """The service client's floor: the workers send messages of zeros shaped like the
    training pipeline's (whole per-replica batches, ``per_message`` examples or more), made
    with no reading or decoding; the consumer receives them and splits them into batches
    exactly as ``make_dataset`` does with a service."""
    import tensorflow as tf

    from tfrecord_io import ServiceConfig, make_dataset
    from tfrecord_io.service.client import distribute_dataset, split_message

    one = next(iter(make_dataset(root / "jpeg256", global_batch_size=batch_size, seed=0)))
    config = ServiceConfig(service, examples_per_message=per_message)
    size = config.batches_per_message(batch_size, training=True) * batch_size
    shapes = [(tuple(part.shape[1:]), part.dtype) for part in one]

    def zeros(_: tf.Tensor) -> tuple[tf.Tensor, ...]:
        return tuple(tf.zeros([size, *shape], dtype) for shape, dtype in shapes)

    messages = tf.data.Dataset.range(2**62).map(zeros)
    received = distribute_dataset(
        messages, service=service, training=True, job_name=job, compression=None
    )
    split = received.flat_map(lambda *parts: split_message(parts, batch_size))
    return split.prefetch(tf.data.AUTOTUNE)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=512, help="photos to generate (512)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument(
        "--batch_size",
        default="128",
        help="per-replica batch sizes, comma-separated, interleaved in each round (128)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=100,
        help="timed batches per row (100), at the largest batch size; smaller batch sizes "
        "time as many examples",
    )
    parser.add_argument("--warmup", type=int, default=20, help="untimed batches per row (20)")
    parser.add_argument(
        "--rows",
        default="all",
        help=f"'all' (every row but the extra ones) or names from {list(ROW_KEYS)}, "
        "comma-separated; the in-process row is always measured",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 64 photos, tiny runs")
    parser.add_argument("--workdir", default=None, help="where to put photos, shards and logs")
    parser.add_argument(
        "--cache", default=None, help="keep photos and shards here and reuse them next time"
    )
    # A child process measuring one row (see _measure_in_child).
    for hidden in ("row", "root", "service", "job", "worker_pids"):
        parser.add_argument(f"--measure_{hidden}", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_row is not None:
        args.batch_size = int(args.batch_size)
        return _child_main(args)
    batch_sizes = parse_batch_sizes(args.batch_size, "128")
    chosen = parse_rows(args.rows, ROW_KEYS, list(ROWS))
    names = [IN_PROCESS, *(n for n in chosen if n != IN_PROCESS)]
    if args.quick:
        args.n, args.rounds, args.batches, args.warmup = 64, 1, 4, 2
        batch_sizes = sorted({min(b, 16) for b in batch_sizes})
    from tests.fixtures.data_service import running_cluster

    largest = max(batch_sizes)
    with photo_datasets(
        args.n, shards=max(4, args.n // 64), workdir=args.workdir, raw=False, cache=args.cache
    ) as data:
        root, mean_kb, shards = data.root, data.mean_kb, data.shards

        # A fresh directory each run: a fault-tolerant dispatcher restores the jobs and workers
        # its journal names, and a cached dataset directory outlives the run.
        with (
            tempfile.TemporaryDirectory(dir=args.workdir) as service_dir,
            running_cluster(Path(service_dir), num_workers=2) as cluster,
        ):
            pids = [w.popen.pid for w in cluster.workers]
            load_start = os.getloadavg()[0]
            samples: dict[tuple[int, str], list[tuple[float, ...]]] = {}
            jobs = iter(range(1_000_000))
            for _ in range(args.rounds):
                for b in batch_sizes:
                    # The same examples at every batch size.
                    scale = largest // b
                    child = argparse.Namespace(
                        batch_size=b, batches=args.batches * scale, warmup=args.warmup * scale
                    )
                    for name in names:
                        samples.setdefault((b, name), []).append(
                            _measure_in_child(name, root, cluster.address, pids, next(jobs), child)
                        )
            load_end = os.getloadavg()[0]
            statuses = cluster.stop()
        if any(statuses.values()):
            raise RuntimeError(f"a service process did not stop cleanly: {statuses}")

    print(
        f"\n{args.n} ImageNet-like JPEGs (mean {mean_kb:.0f} KB) -> {shards} JPEG-256 shards; "
        f"training pipeline, {IMAGE_SIZE}px uint8 batches of {batch_sizes}; median of "
        f"{args.rounds} round(s) x {args.batches * largest} timed examples; dispatcher + 2 "
        f"workers on loopback; {os.cpu_count()} cores, load average {load_start:.1f} -> "
        f"{load_end:.1f} (shared machine)"
    )
    verdicts = []
    for b in batch_sizes:
        verdicts.append(_print_table(b, {n: samples[(b, n)] for n in names}))
    print()
    print("\n".join(verdicts))
    return 0


def _print_table(batch_size: int, samples: dict[str, list[tuple[float, ...]]]) -> str:
    """Prints one batch size's median rows; returns the verdict line."""
    medians = {
        name: tuple(statistics.median(v[i] for v in values) for i in range(4))
        for name, values in samples.items()
    }
    base_cpu = sum(medians[IN_PROCESS][1:3])
    print(f"\nbatch {batch_size}:\n")
    print(
        "| row | examples/s | trainer CPU-ms/ex (user + sys) | vs in-process | worker CPU-ms/ex |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, (rate, user, system, workers) in medians.items():
        cpu = user + system
        print(
            f"| {name} | {rate:,.0f} | {cpu:.3f} ({user:.3f} + {system:.3f}) | "
            f"{cpu / base_cpu:.1%} | {workers:.3f} |"
        )
    best = min(sum(medians[n][1:3]) for n in medians if n.startswith("service"))
    verdict = "met" if best <= 0.10 * base_cpu else "NOT met"
    line = (
        f"batch {batch_size}: trainer CPU through the service <= 10% of in-process: {verdict} "
        f"(best {best:.3f} vs {0.10 * base_cpu:.3f} CPU-ms/ex, {best / base_cpu:.1%})"
    )
    if CLIENT_FLOOR in medians:
        floor = sum(medians[CLIENT_FLOOR][1:3])
        line += (
            f"; TensorFlow's service client alone: {floor / base_cpu:.1%}, so the best service "
            f"row is the client's floor {(best - floor) / base_cpu * 100:+.1f} points"
        )
    return line


if __name__ == "__main__":
    sys.exit(main())
