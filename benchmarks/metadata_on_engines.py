"""One simulated build (``bench_metadata_scale build ...``) on a Flink or Spark cluster, measured
by process role.

The build's launcher runs in a fresh process; its job server and SDK workers, and the
cluster's JVMs (JobManager and TaskManagers; Spark master, worker and the executors it starts;
a job server the cluster keeps) are sampled every 0.2 s from ``/proc`` by role
(``bench_jvm_engines.RolePeaks``): the largest process of each role, and each role's CPU over
the build. The cluster's scratch directories (Flink's ``io.tmp.dirs``, Spark's local dirs),
where the engines' shuffles spill, are sampled every second for the bytes they hold.

The cluster is either a fresh one for the build (in ``work``), or one that
``scripts/engines/cluster.py start`` started (its directory), left running.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psutil

from beam_pipelines.engines.local_clusters import FlinkCluster, SparkCluster, read_cluster
from beam_pipelines.engines.spark import partitions_for
from benchmarks.bench_jvm_engines import RolePeaks, cluster_jvm_pids, engine_cluster

__all__ = [
    "ENGINE_MODES",
    "SpillDisk",
    "engine_run",
    "spill_dirs",
]

ENGINE_MODES = ("flink", "spark")
_REPO = Path(__file__).resolve().parents[1]
_DISK_EVERY_S = 1.0
_NOT_DATA = ("blobStore", "blobStorage")


def spill_dirs(cluster: FlinkCluster | SparkCluster) -> list[Path]:
    """Where the cluster's shuffles write: Flink's ``io.tmp.dirs``, Spark's local dirs."""
    return [cluster.work_dir / ("tmp" if isinstance(cluster, FlinkCluster) else "local")]


def _du(root: Path, skip: tuple[str, ...]) -> int:
    """Bytes allocated under ``root``, leaving out directories whose names start with ``skip``."""
    total = 0
    stack = [root]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.name.startswith(skip):
                    continue
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
                    else:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
    return total


class SpillDisk:
    """Samples, in a thread, the bytes under ``dirs``; ``peak`` is the most seen at once.

    Flink's blob stores (the job's jars: the JobManager's ``blobStore-*``, each TaskManager's
    ``tm_*/blobStorage``, in the same ``io.tmp.dirs``) are left out: they are the job's
    classpath, not its data.
    """

    def __init__(self, dirs: Sequence[Path]) -> None:
        self._dirs = list(dirs)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, sum(_du(d, _NOT_DATA) for d in self._dirs))
            self._stop.wait(_DISK_EVERY_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _cpu(pids: Sequence[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            found[pid] = times.user + times.system
    return found


@contextlib.contextmanager
def _cluster(
    mode: str, work: Path, existing: str | None, images: int
) -> Iterator[tuple[list[str], FlinkCluster | SparkCluster]]:
    if existing:
        cluster = read_cluster(Path(existing))
        yield _launcher_sized(cluster.runner_args()), cluster
        return
    # The launcher's rule (engines.spark): the kept job server is the driver, started here.
    spark = [f"-Dspark.default.parallelism={partitions_for(images)}"]
    with engine_cluster(mode, work, spark_properties=spark) as (_, runner_args, _):
        yield _launcher_sized(runner_args), read_cluster(work / mode)


def _launcher_sized(runner_args: list[str]) -> list[str]:
    """A cluster's runner flags without ``--parallelism``: the launcher sizes Flink's tasks
    from the listing (``flink.size_parallelism``), as for a user who passes none."""
    if "--parallelism" not in runner_args:
        return runner_args
    at = runner_args.index("--parallelism")
    return runner_args[:at] + runner_args[at + 2 :]


def engine_run(
    flags: Sequence[str], mode: str, work: Path, images: int, existing: str | None = None
) -> dict:
    """Runs ``python -m benchmarks.bench_metadata_scale FLAGS`` on ``mode``'s cluster.

    Args:
      flags: the ``build`` command and its pipeline flags (the runner's are added).
      mode: ``flink`` or ``spark``.
      images: how many images the build has (a fresh Spark cluster's parallelism).
      work: the fresh cluster's directory and the launcher's log.
      existing: the directory of a running cluster to use instead of a fresh one.

    Returns:
      ``wall_s``, ``cpu_s`` (every process of the build and the cluster's JVMs over it),
      ``peak_mb`` (the largest sum over the roles' peaks), ``each_mb`` ((role, largest
      process MB), largest first), ``role_cpu_s`` and ``spill_mb`` (the scratch directories'
      peak).

    Raises:
      RuntimeError: the build failed (with the end of its log).
    """
    work.mkdir(parents=True, exist_ok=True)
    log = work / "launcher.log"
    with _cluster(mode, work, existing, images) as (runner_args, cluster):
        jvms = cluster_jvm_pids(cluster)
        before = _cpu(jvms)
        disk = SpillDisk(spill_dirs(cluster))
        start = time.perf_counter()
        with log.open("wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_metadata_scale", *flags, *runner_args],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                cwd=_REPO,
                start_new_session=True,
            )
            peaks = RolePeaks(proc.pid, jvms)
            code = proc.wait()
        wall = time.perf_counter() - start
        peaks.stop()
        disk.stop()
        after = _cpu(jvms)
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{mode} build failed ({code}):\n{tail}")
    role_cpu: dict[str, float] = {}
    for pid, (role, cpu) in peaks.cpu.items():
        if pid in jvms:  # long-lived: only what the build used
            cpu = after.get(pid, cpu) - before.get(pid, 0.0)
        role_cpu[role] = role_cpu.get(role, 0.0) + cpu
    each = sorted(((r, b / 2**20) for r, b in peaks.largest.items()), key=lambda x: -x[1])
    return {
        "wall_s": wall,
        "cpu_s": sum(role_cpu.values()),
        "peak_mb": sum(peaks.peaks.values()) / 2**20,
        "each_mb": each,
        "role_cpu_s": role_cpu,
        "spill_mb": disk.peak / 2**20,
    }
