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

Usage::

  python -m benchmarks.profile_jvm_engines flink [--n 3000] [--workdir DIR] [--images DIR]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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

__all__ = ["frame_category", "main", "stack_categories", "task_thread_states"]

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


def main(argv: Sequence[str] | None = None) -> int:
    """Profiles one build on the named engine and prints the three views; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=("flink", "spark", "in_process"))
    parser.add_argument("--n", type=int, default=3000, help="images in the profiled build")
    parser.add_argument("--workdir", default=None, help="where to put images, outputs, stacks")
    parser.add_argument(
        "--images", default=None, help="build these images (a folder of class folders) instead"
    )
    args = parser.parse_args(argv)
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
        with engine_cluster(args.engine, work) as (label, runner_args, pids):
            if _build(work / "warm", work / "out", runner_args, work / "warm.log").wait():
                raise RuntimeError((work / "warm.log").read_text(errors="replace")[-3000:])
            start = time.perf_counter()
            proc = _build(images, work / "out", runner_args, work / "build.log")
            sampler = RolePeaks(proc.pid, pids)
            # In-process the launcher does the Python work; on an engine its SDK workers do.
            role = "launcher" if args.engine == "in_process" else "SDK workers"
            watch = _Watchers(sampler, work, role)
            code = proc.wait()
            wall = time.perf_counter() - start
            sampler.stop()
            spy = watch.stop()
        if code:
            raise RuntimeError((work / "build.log").read_text(errors="replace")[-3000:])
        print("\n".join(_report(label, args.n, wall, sampler, spy, watch, role)))
    print(f"load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
