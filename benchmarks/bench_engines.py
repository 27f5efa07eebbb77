"""Benchmark: the pipeline on each engine, at steady state, against a plain Pillow loop.

Inputs are ImageNet-like JPEGs (500x375, about 100 KB, quality 90). Each row runs the real
pipeline (``beam_pipelines.images_to_tfrecord.run``) once untimed to warm imports and worker
processes, then on N and on 3N images (``--repeats`` times each, fastest kept); its
steady-state rate is ``2N / (t(3N) - t(N))``, so start-up, graph submission and one-time
imports in every worker cancel out.

Rows:
  * pillow loop, 1 core: the per-image work with no Beam (the per-element cost floor);
  * in-process DirectRunner;
  * multi-process DirectRunner, 2 worker processes;
  * DaskRunner, 1 worker process (1 thread), scheduler and worker started as processes;
  * DaskRunner, 2 worker processes (1 thread each).

Per-element overhead is what each engine adds to the Pillow loop's cost per image, in CPU time
so that other load on a shared machine does not count: CPU milliseconds per extra image, over
every process the engine uses (this process, its child processes, the Dask scheduler and
workers), minus the Pillow loop's. Target: 2 Dask workers >= 1.5x one Dask worker.

Usage::

  python -m benchmarks.bench_engines [--n 200] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.steady_state import (
    NoisyMeasurement,
    add_size_flags,
    chosen_engines,
    photo_sets,
    pillow_loop,
    pipeline_run,
    sizes_from_flags,
    steady_rate,
)
from tests.fixtures.dask_cluster import local_dask_cluster

__all__ = ["ENGINES", "Row", "measure_engine", "main"]

# Fixed across rows so every engine writes the same shards; several shards let the writing
# step spread over workers too.
_SHARDS = ["--num_shards", "4"]

# name -> (row label, worker processes, extra pipeline arguments)
ENGINES: dict[str, tuple[str, int, list[str]]] = {
    "in_process": ("in-process DirectRunner", 1, []),
    "multi_process": (
        "multi-process DirectRunner",
        2,
        ["--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    ),
    "dask1": ("Dask, 1 worker", 1, []),
    "dask2": ("Dask, 2 workers", 2, []),
}


@dataclass(frozen=True)
class Row:
    """One engine's measurement."""

    label: str
    workers: int
    rate: float | None  # None when noise swamped the difference between N and 3N
    cpu_ms: float | None  # CPU milliseconds per image, every process of the engine counted
    t_n: float
    t_3n: float


def measure_engine(
    label: str,
    workers: int,
    small: Path,
    large: Path,
    work: Path,
    extra: Sequence[str],
    repeats: int,
    pids: Sequence[int] = (),
) -> Row:
    """Warms the engine with one untimed run, then measures its steady-state rate."""
    args = [*_SHARDS, *extra]
    pipeline_run(small, work / f"{label}-warm", args)
    try:
        rate, cpu_ms, t_n, t_3n = steady_rate(
            lambda: pipeline_run(small, work / f"{label}-n", args),
            lambda: pipeline_run(large, work / f"{label}-3n", args),
            repeats,
            pids,
        )
    except NoisyMeasurement as e:
        print(f"  {label}: {e}", flush=True)
        return Row(label, workers, None, None, e.t_n, e.t_3n)
    return Row(label, workers, rate, cpu_ms, t_n, t_3n)


def _ratio(row: Row, base: Row | None) -> str:
    return f"{row.rate / base.rate:.2f}x" if base and base.rate and row.rate else "-"


def _table(rows: list[Row], n: int, pillow_cpu_ms: float) -> str:
    by_label = {r.label: r for r in rows}
    in_process = by_label.get(ENGINES["in_process"][0])
    dask_one = by_label.get(ENGINES["dask1"][0])
    lines = [
        f"| engine | workers | t(N={n}) s | t(3N={3 * n}) s | steady images/s | "
        "vs in-process | vs Dask 1 worker | CPU ms/image | overhead CPU ms/image |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.rate is None:
            lines.append(
                f"| {r.label} | {r.workers} | {r.t_n:.2f} | {r.t_3n:.2f} | "
                "not measurable: t(3N) <= t(N) | - | - | - | - |"
            )
            continue
        overhead = r.cpu_ms - pillow_cpu_ms
        vs_dask = _ratio(r, dask_one) if "Dask" in r.label else "-"
        vs_in = _ratio(r, in_process) if r.workers else "-"
        lines.append(
            f"| {r.label} | {r.workers or 1} | {r.t_n:.2f} | {r.t_3n:.2f} | {r.rate:.0f} | "
            f"{vs_in} | {vs_dask} | {r.cpu_ms:.2f} | {overhead:+.2f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs every row and prints the table; returns 0 (targets are reported, not enforced)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_size_flags(parser, quick_n=12, repeats=2)
    parser.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated subset of {','.join(ENGINES)} (all)",
    )
    args = parser.parse_args(argv)
    engines = chosen_engines(parser, args.engines, list(ENGINES))
    # Worker processes log every discarded pipeline flag; the table is what matters here.
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    n, repeats = sizes_from_flags(parser, args, quick_n=12)

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        small, large = work / "n", work / "3n"
        paths_n, paths_3n, mean_kb = photo_sets(work, n)
        print(
            f"{n} + {3 * n} ImageNet-like JPEGs, 500x375, mean {mean_kb:.0f} KB, q90; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
            flush=True,
        )
        pillow_loop(paths_n + paths_3n)  # page cache and Pillow plugins
        pillow_rate, pillow_cpu_ms, t_n, t_3n = steady_rate(
            lambda: pillow_loop(paths_n), lambda: pillow_loop(paths_3n), repeats
        )
        rows = [Row("pillow loop, 1 core", 0, pillow_rate, pillow_cpu_ms, t_n, t_3n)]
        for engine in engines:
            label, workers, extra = ENGINES[engine]
            if engine.startswith("dask"):
                with local_dask_cluster(workers, work_dir=work / engine) as cluster:
                    pids = (*cluster.worker_pids, cluster.scheduler_pid)
                    row = measure_engine(
                        label, workers, small, large, work, cluster.runner_args(), repeats, pids
                    )
            else:
                row = measure_engine(label, workers, small, large, work, extra, repeats)
            rows.append(row)
            if row.rate is not None:
                print(f"  {row.label}: {row.rate:.1f} images/s", flush=True)

    print()
    print(_table(rows, n, pillow_cpu_ms))
    by_label = {r.label: r.rate for r in rows}
    print()
    dask_rates = by_label.get(ENGINES["dask1"][0]), by_label.get(ENGINES["dask2"][0])
    if all(dask_rates):
        ratio = dask_rates[1] / dask_rates[0]
        print(
            f"2 Dask workers = {ratio:.2f}x one Dask worker "
            f"(target >= 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})"
        )
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
