"""Benchmark: what the project's Dask runner gives over the in-process runner and Flink.

One row per engine, in one run, one after another: the in-process DirectRunner, the Dask
runner on a scheduler and 2 one-thread workers, and Flink 1.19 (1 TaskManager, 2 slots;
installed by ``scripts/engines/install.sh``). Each row starts its cluster, builds N images once
untimed (imports, JVM and worker warm-up), then builds N and 3N ImageNet-like JPEGs once each in
a fresh launcher process (``steady_state.pipeline_run``), and a build of 10 images. It reports:

  * start-up per job: the wall time of the 10-image build (nearly all of it the job's fixed
    cost: starting the launcher, submitting, scheduling, writing the outputs);
  * t(N): a small build's wall time;
  * the steady rate 2N / (t(3N) - t(N)), when the difference is not swamped by the fixed cost
    moving between jobs (on Flink it moves by several seconds with the machine's load);
  * CPU ms per image of the N build, everything counted (start-up included), and at steady
    state (the 2N images between the builds): this process, the launcher and what it started,
    and the cluster's processes with the children they reaped.

Usage::

  python -m benchmarks.bench_dask_runner [--n 200] [--engines in_process,dask,flink]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from beam_pipelines.samples import write_imagenet_like_jpegs
from benchmarks.bench_jvm_engines import engine_cluster
from benchmarks.common import exit_on_sigterm
from benchmarks.steady_state import chosen_engines, cpu_seconds, photo_sets, pipeline_run
from tests.fixtures.dask_cluster import local_dask_cluster

__all__ = ["ENGINES", "main"]

ENGINES = ("in_process", "dask", "flink", "spark")
_SHARDS = ["--num_shards", "4"]
_TINY = 10  # images in the build that measures a job's start-up


@contextlib.contextmanager
def _cluster(engine: str, work: Path) -> Iterator[tuple[str, list[str], tuple[int, ...]]]:
    if engine == "dask":
        with local_dask_cluster(2, work_dir=work / "dask") as cluster:
            yield (
                "Dask runner, 2 workers",
                cluster.runner_args(),
                (*cluster.worker_pids, cluster.scheduler_pid),
            )
    else:
        with engine_cluster(engine, work) as found:
            yield found


def _timed_build(images: Path, out: Path, args: list[str], pids: Sequence[int]) -> tuple:
    cpu = cpu_seconds(pids)
    start = time.perf_counter()
    done = pipeline_run(images, out, args)
    return time.perf_counter() - start, cpu_seconds(pids) - cpu, done


def _row(engine: str, small: Path, large: Path, work: Path, n: int) -> str:
    with _cluster(engine, work) as (label, runner_args, pids):
        args = [*_SHARDS, *runner_args]
        pipeline_run(small, work / f"{engine}-warm", args)
        t_tiny, _, _ = _timed_build(work / "tiny", work / f"{engine}-tiny", args, pids)
        t_n, cpu_n, done_n = _timed_build(small, work / f"{engine}-n", args, pids)
        t_3n, cpu_3n, done_3n = _timed_build(large, work / f"{engine}-3n", args, pids)
    extra = done_3n - done_n
    if t_3n > t_n:
        steady = f"{extra / (t_3n - t_n):.0f} | {1000 * (cpu_3n - cpu_n) / extra:.1f}"
    else:  # the fixed cost moved by more than 2N images take
        steady = "not measurable | -"
    return (
        f"| {label} | {t_tiny:.1f} | {t_n:.1f} | {t_3n:.1f} | "
        f"{1000 * cpu_n / done_n:.1f} | {steady} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Runs every row and prints the table; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="N; builds of N and 3N images")
    parser.add_argument("--engines", default="in_process,dask,flink", help=f"from {ENGINES}")
    parser.add_argument("--workdir", default=None, help="where to put images and outputs")
    args = parser.parse_args(argv)
    exit_on_sigterm()  # the clusters this starts stop on SIGTERM too
    engines = chosen_engines(parser, args.engines, list(ENGINES))
    logging.getLogger("apache_beam").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        photo_sets(work, args.n)
        write_imagenet_like_jpegs(work / "tiny", _TINY, seed=3)
        print(
            f"{args.n} + {3 * args.n} ImageNet-like JPEGs; {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f} at start",
            flush=True,
        )
        lines = [
            f"| engine | start-up per job ({_TINY} images) s | t(N={args.n}) s | t(3N) s | "
            "CPU ms/image, N build | steady images/s | CPU ms/image, steady |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for engine in engines:
            lines.append(_row(engine, work / "n", work / "3n", work, args.n))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
