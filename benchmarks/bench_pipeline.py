"""Benchmark: the images -> TFRecord pipeline against a plain single-core Pillow loop.

Inputs are ImageNet-like JPEGs (500x375, about 100 KB, quality 90, texture and noise). Each
row is measured on N and on 3N images, and its steady-state rate is ``2N / (t(3N) - t(N))``,
so start-up (imports, worker processes, pipeline construction) cancels out.

Rows:
  * pillow loop: one core, per image: read, sniff and open, ``draft``, EXIF orientation, RGB,
    resize to a 256 shorter side, JPEG q90 encode, SHA-256. No Beam, no TFRecords.
  * pipeline, in-process: ``python -m beam_pipelines.images_to_tfrecord`` on the DirectRunner,
    with ``--num_shards 8`` (the default 128 MB shards would make one shard of these few
    hundred images, written by a single worker) and the default ``--image_threads`` (one a
    core: images are read and prepared on threads while the runner's thread stages them).
  * pipeline, in-process, one image thread: the same with ``--image_threads 1``, every
    image on the runner's thread: the pipeline's CPU against the loop's, core for core.
  * pipeline, 2 processes: the same with ``--direct_num_workers=2
    --direct_running_mode=multi_processing`` (one image thread a process).
  * two pillow loops at once: the loop in two fresh processes at the same time, half the
    images each. What this machine gives two processes that share nothing (2 cores, shared
    caches and memory bandwidth): the ceiling of any 2-process runner's speed-up.
  * pipeline, 2 processes, default options: no shard flag at all (counts planned from the
    listing, ``beam_pipelines.graph.plan``: one shard at these N), as a user who passes nothing runs it.

Targets: in-process (default options) >= 100% of the Pillow loop, the near-duplicate search
on; in-process with one image thread >= 80%; 2 processes >= 1.5x in-process with one image
thread; 2 processes with default options >= 1.7x that.

The rows' runs take turns (``steady_rates``): each repeat runs every row once, so a machine
whose speed drifts slows all rows alike.

Three more rows run the previous design's data plane (Reshuffle, then a GroupByKey by shard of
the records themselves) over 32 KB blobs made on the workers, with no image work at all: what
each runner mode charged for moving a record of the size our JPEG examples have, which the
pipeline no longer pays (only small locations cross its shuffle, ``beam_pipelines.output.staging``).
The last one has the old byte-planned shape, where the shard of each record needed a side input
computed from all records.

Every run is a fresh process (``python -m beam_pipelines.images_to_tfrecord``, as a user runs
it): runs made one after another in one process left the allocator's heaps as earlier runs had
grown them, and measured the 2-process rows up to a third slower.

Besides wall-clock rates the table gives CPU milliseconds per image (the run's process and its
worker processes), which stays meaningful when other jobs share the machine.

Usage::

  python -m benchmarks.bench_pipeline [--n 200] [--repeats 2] [--quick] [--rows ROW,...]

``--rows in_process_one_thread,two_process_default`` measures only the default-options speed-up;
``--rows pillow,pillow_x2,in_process_one_thread,two_process_default`` also the machine's own 2-process
ceiling beside it.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.common import run_module
from benchmarks.steady_state import (
    IMAGE_SIZE,
    NoisyMeasurement,
    add_size_flags,
    photo_sets,
    pillow_loop,
    pillow_loops_at_once,
    pipeline_run,
    sizes_from_flags,
    steady_rates,
)

__all__ = ["data_plane_run", "main"]

MULTI_PROCESS_FLAGS = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
BLOB_BYTES = 32 * 1024
# At a few hundred images the default 128 MB shard target gives one shard, which one worker
# would write alone; a real dataset has hundreds of shards, written in parallel.
NUM_SHARDS = 8
PIPELINE_FLAGS = ["--image_size", str(IMAGE_SIZE), "--num_shards", str(NUM_SHARDS)]
# What a user who passes no sharding flag runs.
DEFAULT_FLAGS = ["--image_size", str(IMAGE_SIZE)]
PIPELINE_ROWS = {
    "in_process": PIPELINE_FLAGS,
    "in_process_one_thread": [*PIPELINE_FLAGS, "--image_threads", "1"],
    "two_process": [*PIPELINE_FLAGS, *MULTI_PROCESS_FLAGS],
    "two_process_default": [*DEFAULT_FLAGS, *MULTI_PROCESS_FLAGS],
}
DATA_PLANE_ROWS = {  # (Beam flags, shard counts planned from bytes)
    "records_in_process": ([], False),
    "records_two_process": (MULTI_PROCESS_FLAGS, False),
    "records_two_process_planned": (MULTI_PROCESS_FLAGS, True),
}
LABELS = {
    "pillow": "pillow loop, 1 core",
    "pillow_x2": "two pillow loops at once (2 processes, half the images each)",
    "in_process": "pipeline, in-process",
    "in_process_one_thread": "pipeline, in-process, one image thread",
    "two_process": "pipeline, 2 processes",
    "two_process_default": "pipeline, 2 processes, default options",
    "records_in_process": "records only, in-process",
    "records_two_process": "records only, 2 processes",
    "records_two_process_planned": "records only, 2 processes, counts from bytes",
}
ROW_GROUPS = ("pillow", "pillow_x2", *PIPELINE_ROWS, "data_plane")


def _measure(
    runs: dict[str, tuple[Callable[[], int], Callable[[], int]]], repeats: int
) -> dict[str, dict[str, float]]:
    """``steady_rates`` as rows: rate and CPU-ms are NaN where noise swamped the signal."""
    rows: dict[str, dict[str, float]] = {}
    for name, found in steady_rates(runs, repeats).items():
        if isinstance(found, NoisyMeasurement):
            rows[name] = {
                "rate": math.nan,
                "cpu_ms": math.nan,
                "t_n": found.t_n,
                "t_3n": found.t_3n,
            }
            continue
        rate, cpu_ms, t_n, t_3n = found
        rows[name] = {"rate": rate, "cpu_ms": cpu_ms, "t_n": t_n, "t_3n": t_3n}
    return rows


def _blob(index: int) -> tuple[str, bytes]:
    key = hashlib.sha256(str(index).encode()).digest()
    return key.hex(), (key * (BLOB_BYTES // len(key)))[:BLOB_BYTES]


def _shard_of(record: tuple[str, bytes], total_bytes: int) -> tuple[int, tuple[str, bytes]]:
    return (int(record[0][:4], 16) * NUM_SHARDS) >> 16, record


def data_plane_run(n: int, extra: Sequence[str], *, planned: bool = False) -> int:
    """Moves ``n`` blobs of ``BLOB_BYTES`` through the writer's graph shape in a fresh process
    (as ``pipeline_run`` runs the pipeline); returns ``n``.

    ``planned``: the shard of each blob takes a side input computed from all blobs, as when
    the writer plans shard counts from bytes.
    """
    flags = ["--data_plane_n", str(n), *(["--data_plane_planned"] if planned else []), *extra]
    run_module("benchmarks.bench_pipeline", flags)
    return n


def _data_plane_in_this_process(n: int, extra: Sequence[str], *, planned: bool) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    with beam.Pipeline(options=PipelineOptions(list(extra))) as p:
        records = p | beam.Create(range(n)) | beam.Reshuffle() | beam.Map(_blob)
        if planned:
            total = records | "Size" >> beam.Map(lambda r: len(r[1])) | beam.CombineGlobally(sum)
            keyed = records | "AssignShard" >> beam.Map(_shard_of, beam.pvalue.AsSingleton(total))
        else:
            keyed = records | "AssignShard" >> beam.Map(_shard_of, 0)
        _ = (
            keyed
            | beam.GroupByKey()
            | "Write" >> beam.Map(lambda kv: sum(len(r[1]) for r in kv[1]))
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_size_flags(parser, quick_n=16, repeats=2)
    parser.add_argument(
        "--photos_cache", default=None, help="write the photos here once, reuse them after"
    )
    parser.add_argument(
        "--rows",
        default=",".join(ROW_GROUPS),
        help=f"comma-separated rows to measure, of {','.join(ROW_GROUPS)} (all)",
    )
    # A child process running one data-plane pipeline (see data_plane_run); the rest of the
    # command line is Beam's options.
    parser.add_argument("--data_plane_n", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data_plane_planned", action="store_true", help=argparse.SUPPRESS)
    args, beam_flags = parser.parse_known_args(argv)
    if args.data_plane_n is not None:
        _data_plane_in_this_process(args.data_plane_n, beam_flags, planned=args.data_plane_planned)
        return 0
    if beam_flags:
        parser.error(f"unrecognized arguments: {' '.join(beam_flags)}")
    # Workers' start-up chatter, forwarded by the runner, would bury the table.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)
    selected = set(args.rows.split(","))
    if unknown := selected - set(ROW_GROUPS):
        parser.error(f"--rows: unknown {','.join(sorted(unknown))}; choose from {ROW_GROUPS}")
    n, repeats = sizes_from_flags(parser, args, quick_n=16)

    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        root = Path(work)
        small, large = root / "n", root / "3n"
        cache = Path(args.photos_cache) if args.photos_cache else None
        paths_n, paths_3n, mean_kb = photo_sets(root, n, cache)
        print(
            f"{3 * n} + {n} ImageNet-like JPEGs, 500x375, mean {mean_kb:.0f} KB, q90; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start"
        )

        runs: dict[str, tuple[Callable[[], int], Callable[[], int]]] = {}
        if "pillow" in selected or "pillow_x2" in selected:
            pillow_loop(paths_n + paths_3n)  # warm the page cache and Pillow's plugins
        if "pillow" in selected:
            runs["pillow"] = (lambda: pillow_loop(paths_n), lambda: pillow_loop(paths_3n))
        if "pillow_x2" in selected:
            runs["pillow_x2"] = (
                lambda: pillow_loops_at_once(paths_n),
                lambda: pillow_loops_at_once(paths_3n),
            )
        for name, flags in PIPELINE_ROWS.items():
            if name not in selected:
                continue
            # An untimed run first: it warms the page cache with the input files.
            pipeline_run(small, root / "warm", flags)
            runs[name] = (
                lambda f=flags: pipeline_run(small, root / "out_n", f),
                lambda f=flags: pipeline_run(large, root / "out_3n", f),
            )
        for name, (extra, planned) in DATA_PLANE_ROWS.items():
            if "data_plane" not in selected:
                continue
            data_plane_run(n, extra, planned=planned)
            runs[name] = (
                lambda e=extra, pl=planned: data_plane_run(n, e, planned=pl),
                lambda e=extra, pl=planned: data_plane_run(3 * n, e, planned=pl),
            )
        rows = _measure(runs, repeats)

    print()
    print(
        f"| row | t(N={n}) s | t(3N={3 * n}) s | steady images/s | CPU ms/image | ratio | target |"
    )
    print("|---|---:|---:|---:|---:|---|---|")
    for name, m in rows.items():
        ratio, target = _ratio(name, rows)
        if math.isnan(m["rate"]):
            ratio = "unmeasurable: t(3N) <= t(N), the machine is too busy"
        print(
            f"| {LABELS[name]} | {m['t_n']:.2f} | {m['t_3n']:.2f} | {m['rate']:.0f} | "
            f"{m['cpu_ms']:.2f} | {ratio} | {target} |"
        )
    print()
    needed = {"pillow", "in_process_one_thread", "records_in_process", "records_two_process"}
    if needed <= set(rows):
        _explain(rows)
    print(f"load average at end {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


def _ratio(name: str, rows: dict[str, dict[str, float]]) -> tuple[str, str]:
    """The row's ratio column and target, against the rows measured in this run."""
    base = rows.get("pillow")
    in_process = rows.get("in_process_one_thread")
    if name == "pillow":
        return "1.00 (baseline)", "-"
    if name in ("in_process", "in_process_one_thread"):
        target = ">= 1.00 of pillow loop" if name == "in_process" else ">= 0.80 of pillow loop"
        if base is None:
            return "-", target
        return f"{rows[name]['rate'] / base['rate']:.2f} of pillow loop", target
    if name == "records_in_process":
        return "no image work: the mode's ceiling", "-"
    if name == "pillow_x2":
        if base is None:
            return "this machine's ceiling for 2 processes", "-"
        return f"{rows[name]['rate'] / base['rate']:.2f}x pillow loop: the 2-process ceiling", "-"
    targets = {
        "two_process": ">= 1.5x in-process, one thread",
        "two_process_default": ">= 1.7x in-process, one thread",
    }
    if in_process is None:
        return "-", targets.get(name, "-")
    ratio = rows[name]["rate"] / in_process["rate"]
    if name in targets:
        ceiling = ""
        if base is not None and "pillow_x2" in rows:
            machine = rows["pillow_x2"]["rate"] / base["rate"]
            ceiling = f" ({ratio / machine:.0%} of the machine's {machine:.2f}x)"
        return f"{ratio:.2f}x in-process, one thread{ceiling}", targets[name]
    return f"no image work: {ratio:.2f}x the in-process pipeline, one thread", "-"


def _explain(rows: dict[str, dict[str, float]]) -> None:
    in_process, plane_in = rows["in_process_one_thread"], rows["records_in_process"]
    plane_multi, baseline = rows["records_two_process"], rows["pillow"]
    cores = os.cpu_count() or 1
    budget = 1000 * min(cores, 2) / (1.5 * in_process["rate"])
    work = in_process["cpu_ms"] - plane_in["cpu_ms"]
    print()
    print(
        f"2 processes reach 1.5x in-process only if an image costs <= {budget:.2f} CPU-ms on "
        f"{min(cores, 2)} cores; its work in-process is {work:.2f} (pipeline minus moving records "
        f"in-process) and moving one record between processes costs {plane_multi['cpu_ms']:.2f}"
        f" more: {work + plane_multi['cpu_ms']:.2f} CPU-ms"
    )
    print(
        f"CPU efficiency of the in-process pipeline (pillow CPU ms / pipeline CPU ms per image): "
        f"{baseline['cpu_ms'] / in_process['cpu_ms']:.2f}"
    )


if __name__ == "__main__":
    sys.exit(main())
