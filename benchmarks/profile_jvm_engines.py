"""Profile: where one build's time goes on a Flink or Spark cluster started here.

One build of ``--n`` ImageNet-like JPEGs (the throughput benchmark's images) on a fresh cluster,
after one untimed build of 50 images (the cluster's first job loads its classes), and three
views of it:

  * CPU seconds per process role (launcher, job server JVM, each SDK worker, TaskManager or
    executor JVM, ...), from ``/proc`` sampled every 0.2 s, and each role's share of the wall
    time (1.0 = one core busy for the whole build);
  * the SDK workers' Python stacks (in-process: the launcher's), sampled with py-spy (``requirements-dev.txt``) at 100 Hz
    while they run on a CPU, grouped by what the sampled frame is doing: the pipeline's own
    work (``beam_pipelines``, Pillow, NumPy, hashing), Beam's coders, the Fn API data plane and
    gRPC, the rest of Beam's harness, other;
  * the engine's task threads (Flink's ``(i/2)`` operator threads, Spark's ``Executor task
    launch worker``), from ``jcmd <pid> Thread.print`` every 2 s: how often each is running or
    waiting, and where (its innermost ``org.apache`` frame).

On Spark a fourth: the application's timeline from Spark's event log (``spark.eventLog.*``, set
through ``--job_server_jvm_properties``): when its first task started, how long the engine ran
0, 1 or 2 tasks at once, and its longest stages with their tasks' run and deserialisation time.

Usage::

  python -m benchmarks.profile_jvm_engines {flink,spark,in_process} [--n 3000] [--workdir DIR]
      [--images DIR] [--keep DIR]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from beam_pipelines.samples import write_imagenet_like_jpegs
from benchmarks.bench_jvm_engines import RolePeaks, engine_cluster
from benchmarks.common import exit_on_sigterm

__all__ = [
    "frame_category",
    "main",
    "spark_timeline",
    "stack_categories",
    "task_thread_states",
]

# What a sampled Python frame is doing, by its file: the first rule a frame's file matches wins,
# and a stack counts under the category of its innermost frame that matches any rule.
_CATEGORIES = (
    ("pipeline's own work", ("beam_pipelines/", "PIL/", "numpy/", "hashlib", "schemas/")),
    ("Beam coders", ("apache_beam/coders/",)),
    ("Fn API data plane, gRPC", ("data_plane.py", "grpc/", "protobuf", "_pb2")),
    ("Beam harness", ("apache_beam/",)),
)
_OTHER = "other (interpreter, stdlib)"
_JSTACK_EVERY_S = 2.0


def frame_category(frame: str) -> str | None:
    """The category of one py-spy frame (``function (path/file.py:line)``), or None."""
    for category, markers in _CATEGORIES:
        if any(marker in frame for marker in markers):
            return category
    return None


def stack_categories(raw: str) -> collections.Counter[str]:
    """Samples per category in py-spy's ``--format raw`` output (``f1;f2;...;leaf count``)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        category = next(filter(None, map(frame_category, reversed(frames))), _OTHER)
        counts[category] += int(count)
    return counts


def task_thread_states(dump: str) -> collections.Counter[str]:
    """``state at <innermost org.apache frame>`` for every engine task thread in one
    ``jcmd Thread.print`` dump (Flink operator threads ``... (1/2)#0``, Spark's ``Executor task
    launch worker``)."""
    states: collections.Counter[str] = collections.Counter()
    for block in dump.split("\n\n"):
        head = block.split("\n", 1)[0]
        if not re.search(r'\(\d+/\d+\)#\d+"|"Executor task launch worker', head):
            continue
        state = re.search(r"java.lang.Thread.State: (\w+)", block)
        where = re.search(r"\tat (org\.apache\.[\w.$]+)", block)
        states[
            f"{state.group(1) if state else '?'} at {where.group(1) if where else '(JDK only)'}"
        ] += 1
    return states


def spark_timeline(event_log: str, longest: int = 6) -> Iterator[str]:
    """Lines describing one Spark application from its event log (JSON, one event a line):
    start-up until its first task, seconds with 0, 1, 2, ... tasks running, and the ``longest``
    stages (wall time, tasks, their summed run and deserialisation time, where they came from).
    """
    start = None
    stages: dict[int, tuple[float, float, int, str]] = {}
    tasks: list[tuple[float, float, int, float, float]] = []
    for line in event_log.splitlines():
        event = json.loads(line)
        kind = event["Event"]
        if kind == "SparkListenerApplicationStart":
            start = event["Timestamp"] / 1000
        elif kind == "SparkListenerStageCompleted":
            info = event["Stage Info"]
            stages[info["Stage ID"]] = (
                info["Submission Time"] / 1000,
                info["Completion Time"] / 1000,
                info["Number of Tasks"],
                info["Stage Name"],
            )
        elif kind == "SparkListenerTaskEnd":
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            tasks.append(
                (
                    info["Launch Time"] / 1000,
                    info["Finish Time"] / 1000,
                    event["Stage ID"],
                    metrics.get("Executor Run Time", 0) / 1000,
                    metrics.get("Executor Deserialize Time", 0) / 1000,
                )
            )
    if start is None or not tasks:
        yield "Spark event log: no application or no task in it"
        return
    first, last = min(t[0] for t in tasks), max(t[1] for t in tasks)
    yield (
        f"Spark application: {last - start:.1f} s from its start to its last task; first task "
        f"at {first - start:.1f} s; {len(stages)} stages, {len(tasks)} tasks"
    )
    # Seconds during which k tasks were running, from the first task's start to the last's end.
    edges = sorted([(t[0], 1) for t in tasks] + [(t[1], -1) for t in tasks])
    running, previous = 0, first
    spent: dict[int, float] = collections.defaultdict(float)
    for at, step in edges:
        spent[running] += at - previous
        running, previous = running + step, at
    yield "seconds with k tasks running: " + ", ".join(
        f"{k}: {s:.1f}" for k, s in sorted(spent.items()) if s >= 0.05
    )
    yield "| stage | from s | wall s | tasks | task run s | task deserialise s | created at |"
    yield "|---:|---:|---:|---:|---:|---:|---|"
    by_wall = sorted(stages.items(), key=lambda item: item[1][0] - item[1][1])[:longest]
    for stage, (submitted, done, count, name) in sorted(by_wall, key=lambda item: item[1][0]):
        mine = [t for t in tasks if t[2] == stage]
        run_s, deserialise_s = sum(t[3] for t in mine), sum(t[4] for t in mine)
        yield (
            f"| {stage} | {submitted - start:.1f} | {done - submitted:.1f} | {count} | "
            f"{run_s:.1f} | {deserialise_s:.1f} | {name} |"
        )
    rest = [done - submitted for stage, (submitted, done, _, _) in stages.items()]
    rest = sorted(rest)[: max(0, len(rest) - longest)]
    if rest:
        yield f"the other {len(rest)} stages: {sum(rest):.1f} s, {max(rest):.1f} s at most"


class _Watchers:
    """Starts py-spy on each SDK worker and takes JVM thread dumps, while a build runs."""

    def __init__(self, sampler: RolePeaks, out: Path, python_role: str) -> None:
        self._sampler, self._out, self._role = sampler, out, python_role
        self.spies: dict[int, tuple[subprocess.Popen, Path]] = {}
        self.dumps: collections.Counter[str] = collections.Counter()
        self.dump_count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        spy = shutil.which("py-spy")
        next_dump = time.monotonic()
        while not self._stop.wait(0.2):
            for pid in self._sampler.pids(self._role):
                if spy and pid not in self.spies:
                    path = self._out / f"py-spy-{pid}.txt"
                    cmd = [spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw"]
                    cmd += ["--nonblocking", "--output", str(path)]
                    log = (self._out / f"py-spy-{pid}.log").open("wb")
                    self.spies[pid] = (subprocess.Popen(cmd, stdout=log, stderr=log), path)
            if time.monotonic() >= next_dump:
                next_dump += _JSTACK_EVERY_S
                for pid in self._sampler.pids("TaskManager JVM") + self._sampler.pids(
                    "executor JVM"
                ):
                    self._dump(pid)

    def _dump(self, pid: int) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            dump = subprocess.run(
                ["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, timeout=10
            ).stdout
            self.dumps.update(task_thread_states(dump))
            self.dump_count += 1

    def stop(self) -> collections.Counter[str]:
        """Stops dumping, waits for py-spy (it ends with its process); samples per category."""
        self._stop.set()
        self._thread.join()
        counts: collections.Counter[str] = collections.Counter()
        for proc, path in self.spies.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            if path.exists():
                counts.update(stack_categories(path.read_text(errors="replace")))
        return counts


def _build(images: Path, out: Path, runner_args: Sequence[str], log: Path) -> subprocess.Popen:
    args = [
        "--input", str(images), "--output", str(out), "--max_bad_fraction", "0", "--overwrite",
        "--progress", "off", "--num_shards", "4", *runner_args,
    ]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipelines.images_to_tfrecord", *args],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        start_new_session=True,
    )


def _report(
    label: str,
    n: int,
    wall: float,
    sampler: RolePeaks,
    spy: collections.Counter,
    watch: _Watchers,
    python_role: str,
) -> Iterator[str]:
    yield f"{label}: {n} images in {wall:.1f} s ({n / wall:.1f} images/s, fixed costs included)"
    yield "| process | CPU s | CPU ms/image | busy share of the wall time |"
    yield "|---|---:|---:|---:|"
    total = 0.0
    for pid, (role, cpu) in sorted(sampler.cpu.items(), key=lambda item: item[1]):
        total += cpu
        yield f"| {role} (pid {pid}) | {cpu:.1f} | {1000 * cpu / n:.2f} | {cpu / wall:.2f} |"
    yield f"| all | {total:.1f} | {1000 * total / n:.2f} | {total / wall:.2f} |"
    if spy:
        # py-spy falls behind on a loaded machine and counts every busy thread: its shares are
        # what it tells, and the CPU they split is the one /proc measured.
        samples = sum(spy.values())
        cpu_ms = 1000 * sum(c for r, c in sampler.cpu.values() if r == python_role) / n
        yield f"\nPython work ({python_role}, {cpu_ms:.2f} CPU ms/image), py-spy shares:"
        for category, count in spy.most_common():
            share = count / samples
            yield f"  {category}: {share:.0%} ({share * cpu_ms:.2f} ms/image)"
    if watch.dump_count:
        threads = sum(watch.dumps.values())
        yield f"\nengine task threads, {watch.dump_count} dumps ({threads} thread samples):"
        for state, count in watch.dumps.most_common(12):
            yield f"  {count / threads:.0%} {state}"


def _event_log_options(work: Path) -> list[str]:
    # Spark reads spark.* system properties of its driver, which is the job server.
    events = work / "events"
    events.mkdir()
    return [
        "--job_server_jvm_properties=-Dspark.eventLog.enabled=true",
        f"--job_server_jvm_properties=-Dspark.eventLog.dir=file:{events}",
    ]


def _profile(engine: str, images: Path, n: int, work: Path) -> Iterator[str]:
    """Builds ``images`` once on ``engine`` (after a warm-up build) and yields the report."""
    with engine_cluster(engine, work) as (label, runner_args, pids):
        if _build(work / "warm", work / "out", runner_args, work / "warm.log").wait():
            raise RuntimeError((work / "warm.log").read_text(errors="replace")[-3000:])
        if engine == "spark":
            runner_args = [*runner_args, *_event_log_options(work)]
        start = time.perf_counter()
        proc = _build(images, work / "out", runner_args, work / "build.log")
        sampler = RolePeaks(proc.pid, pids)
        # In-process the launcher does the Python work; on an engine its SDK workers do.
        role = "launcher" if engine == "in_process" else "SDK workers"
        watch = _Watchers(sampler, work, role)
        code = proc.wait()
        wall = time.perf_counter() - start
        sampler.stop()
        spy = watch.stop()
    if code:
        raise RuntimeError((work / "build.log").read_text(errors="replace")[-3000:])
    yield from _report(label, n, wall, sampler, spy, watch, role)
    for event_log in sorted((work / "events").glob("app-*")) if engine == "spark" else ():
        yield ""
        yield from spark_timeline(event_log.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """Profiles one build on the named engine and prints the views; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("flink", "spark", "in_process"))
    parser.add_argument("--n", type=int, default=3000, help="images in the profiled build")
    parser.add_argument("--workdir", default=None, help="where to put images, outputs, stacks")
    parser.add_argument(
        "--images", default=None, help="build these images (a folder of class folders) instead"
    )
    parser.add_argument(
        "--keep", default=None, help="copy the logs, py-spy stacks and event log to this folder"
    )
    args = parser.parse_args(argv)
    exit_on_sigterm()  # the clusters this starts stop on SIGTERM too
    if args.n < 1:
        parser.error(f"--n must be >= 1, got {args.n}")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        write_imagenet_like_jpegs(work / "warm", 50, seed=1)
        images = work / "images"
        if args.images:
            images = Path(args.images)
            args.n = sum(1 for p in images.rglob("*") if p.is_file())
        else:
            write_imagenet_like_jpegs(images, args.n, seed=2)
        print(f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
        try:
            print("\n".join(_profile(args.engine, images, args.n, work)))
        finally:
            if args.keep:
                keep = Path(args.keep)
                keep.mkdir(parents=True, exist_ok=True)
                for path in [*work.glob("*.log"), *work.glob("py-spy-*"), *work.glob("events/*")]:
                    shutil.copy2(path, keep / path.name)
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
