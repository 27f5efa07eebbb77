"""Benchmark: the fixed cost of one job on a local Flink or Spark cluster, with the job server
the cluster keeps (``--job_endpoint``) against one the launcher starts for the job.

A build of ``--n`` tiny noise PNGs (``bench_scale memory``'s 12 KB records: the images cost
next to nothing, so the wall time is the job's fixed cost) on two clusters per engine, one
keeping a job server and one without: one untimed build on each first (a cluster's first job
loads its classes), then ``--rounds`` rounds of one build each way, side by side, so that the
machine's load falls on both alike. On Flink each
build's wall time is split by the job's start and end on the JobManager (its REST API): before
the engine's job (the launcher's imports and graph, the job server's start, staging,
translation, the hand-over to the JobManager), the engine's job, and after it (metrics, the
manifest, the launcher's exit).

Usage::

  python -m benchmarks.bench_job_startup [--engines flink,spark] [--rounds 3] [--n 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from beam_pipelines.engines.local_clusters import (
    FlinkCluster,
    SparkCluster,
    local_flink_cluster,
    local_spark_cluster,
)
from beam_pipelines.engines.portable import http_json
from benchmarks.bench_jvm_engines import start_build
from benchmarks.bench_scale import SMALL_RECORDS, write_noise_pngs
from benchmarks.common import exit_on_sigterm

__all__ = ["flink_job_times", "main"]

WAYS = ("job server per job", "kept job server")


@contextlib.contextmanager
def _cluster(engine: str, work: Path, job_server: bool) -> Iterator[FlinkCluster | SparkCluster]:
    name = f"{engine}-{'kept' if job_server else 'plain'}"
    if engine == "flink":
        with local_flink_cluster(work / name, slots=2, job_server=job_server) as cluster:
            yield cluster
    else:
        with local_spark_cluster(work / name, cores=2, job_server=job_server) as cluster:
            yield cluster


def flink_job_times(cluster: FlinkCluster) -> dict[str, tuple[float, float]]:
    """Every job the cluster ran: name -> (start, end), seconds since the epoch."""
    overview = http_json(f"{cluster.web_ui}/jobs/overview")
    jobs = overview.get("jobs", []) if isinstance(overview, dict) else []
    return {j["jid"]: (j["start-time"] / 1000, j["end-time"] / 1000) for j in jobs}


def _build(cluster: FlinkCluster | SparkCluster, images: Path, work: Path, kept: bool) -> dict:
    """One build; its wall time and, on Flink, the parts before, in and after the engine's job.

    Raises:
      RuntimeError: the build failed (with the end of its log).
    """
    out, log = work / "out", work / "build.log"
    flags = [*SMALL_RECORDS, *cluster.runner_args(kept_job_server=kept)]
    flink = isinstance(cluster, FlinkCluster)
    jobs_before = set(flink_job_times(cluster)) if flink else set()
    start = time.time()
    with log.open("wb") as stderr:
        code = start_build(images, out, flags, stderr).wait()
    end = time.time()
    shutil.rmtree(out, ignore_errors=True)
    if code != 0:
        raise RuntimeError(f"build failed ({code}):\n{log.read_text(errors='replace')[-3000:]}")
    row = {"wall_s": end - start}
    new = (
        [t for jid, t in flink_job_times(cluster).items() if jid not in jobs_before]
        if flink
        else []
    )
    if len(new) == 1:
        job_start, job_end = new[0]
        row.update(before_s=job_start - start, job_s=job_end - job_start, after_s=end - job_end)
    return row


def _median(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows if key in r]
    return f"{statistics.median(values):.1f}" if values else "-"


def _engine(engine: str, images: Path, work: Path, rounds: int) -> list[str]:
    # Two clusters, one for each way: a kept Spark job server keeps its application, whose
    # executors hold the worker's cores, so an application of another job server would wait.
    lines = []
    with _cluster(engine, work, False) as plain, _cluster(engine, work, True) as kept:
        clusters = {WAYS[0]: plain, WAYS[1]: kept}
        for way, cluster in clusters.items():  # untimed: each cluster's first job
            _build(cluster, images, work, kept=way == WAYS[1])
        found: dict[str, list[dict]] = {way: [] for way in WAYS}
        for i in range(rounds):
            # Alternate which way goes first, so that neither always follows the other.
            for way in WAYS if i % 2 == 0 else WAYS[::-1]:
                row = _build(clusters[way], images, work, kept=way == WAYS[1])
                found[way].append(row)
                print(f"  {engine}, {way}: {row}; load {os.getloadavg()[0]:.2f}", flush=True)
        for way in WAYS:
            rows = found[way]
            walls = ", ".join(f"{r['wall_s']:.1f}" for r in rows)
            lines.append(
                f"| {engine} | {way} | {_median(rows, 'wall_s')} ({walls}) | "
                f"{_median(rows, 'before_s')} | {_median(rows, 'job_s')} | "
                f"{_median(rows, 'after_s')} |"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Measures and prints the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="flink,spark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n", type=int, default=100, help="tiny images a build")
    parser.add_argument("--workdir", help="scratch directory (default: a temporary one)")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # the clusters this starts stop on SIGTERM too
    engines = [e for e in args.engines.split(",") if e]
    if unknown := sorted(set(engines) - {"flink", "spark"}):
        parser.error(f"--engines: unknown {unknown}; expected flink, spark")
    print(f"{args.n} tiny PNGs a build; load average {os.getloadavg()[0]:.2f} at start")
    lines = [
        "| engine | job server | wall s, median (each) | before the engine's job s | "
        "the engine's job s | after s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        write_noise_pngs(work / "images", args.n)
        for engine in engines:
            lines += _engine(engine, work / "images", work, args.rounds)
    print("\n".join(lines))
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
