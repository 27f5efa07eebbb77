"""Benchmark: the pipeline on a Flink cluster (2 slots) and a Spark cluster (2 cores).

The same method as ``benchmarks/bench_engines.py`` (whose ``measure_engine`` this uses): one
untimed run, then N and 3N ImageNet-like JPEGs, fastest of ``--repeats``, steady-state rate
``2N / (t(3N) - t(N))`` so that the job server's start, the job's submission and the SDK
workers' imports cancel out. Rows:

  * in-process DirectRunner;
  * Flink 1.19 session cluster, 1 TaskManager with 2 slots, ``--parallelism 2``;
  * Spark 3.5 standalone cluster, 1 worker with 2 cores.

CPU milliseconds per image count every process: this one, the launchers and what they started
(job server, SDK workers), and the cluster's JVMs with the children they reaped (Spark
executors). Targets (issue 30): each engine >= 1.7x in-process, CPU per image within 15 %.
Besides the steady-state rows the table gives t(N): the fixed cost of one job on the engine.

Usage::

  python -m benchmarks.bench_jvm_engines [--n 200] [--quick] [--engines in_process,flink,spark]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from beam_pipelines.engines.local_clusters import local_flink_cluster, local_spark_cluster
from benchmarks.bench_engines import Row, measure_engine
from benchmarks.steady_state import photo_sets

__all__ = ["ENGINES", "main"]

ENGINES = ("in_process", "flink", "spark")


def _measure(engine: str, small: Path, large: Path, work: Path, repeats: int) -> Row:
    if engine == "in_process":
        return measure_engine("in-process DirectRunner", 1, small, large, work, [], repeats)
    with contextlib.ExitStack() as stack:
        if engine == "flink":
            cluster = stack.enter_context(local_flink_cluster(work / "flink", slots=2))
            label, pids = "Flink 1.19, 2 slots", (*cluster.taskmanager_pids, cluster.jobmanager_pid)
        else:
            cluster = stack.enter_context(local_spark_cluster(work / "spark", cores=2))
            label, pids = "Spark 3.5, 2 cores", (*cluster.worker_pids, cluster.master_pid)
        return measure_engine(label, 2, small, large, work, cluster.runner_args(), repeats, pids)


def _table(rows: list[Row], n: int) -> str:
    base = rows[0] if rows and rows[0].label.startswith("in-process") else None
    lines = [
        f"| engine | t(N={n}) s | t(3N={3 * n}) s | steady images/s | vs in-process | "
        "CPU ms/image | CPU vs in-process |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.rate is None or r.cpu_ms is None:
            lines.append(f"| {r.label} | {r.t_n:.1f} | {r.t_3n:.1f} | not measurable | - | - | - |")
            continue
        ratio = f"{r.rate / base.rate:.2f}x" if base and base.rate else "-"
        cpu = f"{r.cpu_ms / base.cpu_ms - 1:+.0%}" if base and base.cpu_ms else "-"
        lines.append(
            f"| {r.label} | {r.t_n:.1f} | {r.t_3n:.1f} | {r.rate:.1f} | {ratio} | "
            f"{r.cpu_ms:.1f} | {cpu} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the rows and prints the table; returns 0 (targets are reported, not enforced)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="N; runs use N and 3N images (200)")
    parser.add_argument("--quick", action="store_true", help="smoke run: N=12, one repeat")
    parser.add_argument("--repeats", type=int, default=1, help="timings per size, fastest kept")
    parser.add_argument("--workdir", default=None, help="where to put images and outputs")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated rows")
    args = parser.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if unknown := sorted(set(engines) - set(ENGINES)):
        parser.error(f"--engines: unknown {unknown}; expected names from {list(ENGINES)}")
    n = 12 if args.quick else args.n
    if n < 1 or args.repeats < 1:
        parser.error(f"--n and --repeats must be >= 1, got {n} and {args.repeats}")
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        _, _, mean_kb = photo_sets(work, n)
        print(
            f"{n} + {3 * n} ImageNet-like JPEGs, 500x375, mean {mean_kb:.0f} KB; "
            f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start",
            flush=True,
        )
        rows = []
        for engine in engines:
            rows.append(_measure(engine, work / "n", work / "3n", work, args.repeats))
            print(f"  {rows[-1]}", flush=True)
    print()
    print(_table(rows, n))
    print(f"\nload average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
