"""What the Flink and Spark runners share: job-server checks, SDK worker processes, job links.

Beam's Python ``FlinkRunner`` and ``SparkRunner`` start a Java job server, hand it the pipeline
and run the Python SDK harness beside the engine. Left to their defaults here they would
download a job-server jar while the job runs, run every SDK worker as a thread of the launcher
(one core, apache/beam#20402), and leave the job server running until the launcher exits. The
runners of ``beam_pipelines.engines.flink`` and ``.spark`` fix those through the helpers below.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from apache_beam.options.pipeline_options import (
    DebugOptions,
    JobServerOptions,
    PipelineOptions,
    PortableOptions,
)
from apache_beam.runners.portability import job_server as beam_job_server
from apache_beam.runners.portability import portable_runner
from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_pipelines.engines import beam_internals, versions

__all__ = [
    "ENVIRONMENT_CACHE_MILLIS",
    "JAVA17_JOB_SERVER_OPENS",
    "LOOPBACK_PROCESS_WORKERS",
    "JobIdServiceHandle",
    "OwnProcessGroupJobServer",
    "StopOnExitJobServer",
    "StopsJobServerResult",
    "add_job_server_opens",
    "check_job_server_jar",
    "check_reachable",
    "drop_launch_warnings",
    "http_json",
    "in_own_process_group",
    "keep_ctrl_c_from_engine_processes",
    "stop_job_server_after",
    "stop_sdk_workers",
    "use_worker_processes",
    "watch_for_engine_job",
]

_log = logging.getLogger(__name__)

# The JVM module openings Beam's own Java 17 tests give the Flink and Spark job servers.
JAVA17_JOB_SERVER_OPENS = (
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
)
LOOPBACK_PROCESS_WORKERS = "use_loopback_process_worker"
ENVIRONMENT_CACHE_MILLIS = 600_000


def http_json(url: str, timeout_s: float = 3.0) -> object | None:
    """GETs ``url`` and parses its JSON body; None when unreachable or not JSON."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


def check_job_server_jar(given: str | None, installed: Path, flag: str) -> str:
    """The job-server jar to run: ``given`` (``flag``'s value), else the one installed here.

    Raises:
      ValueError: the jar does not exist; the message names ``flag`` and the install command.
    """
    if given:
        if not os.path.exists(given):
            raise ValueError(f"{flag} {given!r} does not exist; pass a job-server jar that does")
        return given
    if not installed.exists():
        raise ValueError(
            f"the job server is not installed ({installed} is missing): run "
            f"{versions.INSTALL_COMMAND}, or pass {flag} PATH. Nothing is downloaded while a "
            "job runs."
        )
    return str(installed)


def check_reachable(url: str, flag: str, value: str, start_command: str) -> None:
    """Raises ValueError naming ``flag`` when nothing answers at ``url`` within 3 s."""
    if http_json(url) is None:
        raise ValueError(
            f"{flag} {value} is not reachable (nothing answered at {url}); start a cluster "
            f"with {start_command}, or pass the address of a running one"
        )


def add_job_server_opens(options: PipelineOptions) -> None:
    """Adds the Java 17 ``--add-opens`` the job server needs to ``--job_server_jvm_properties``."""
    job_server = options.view_as(JobServerOptions)
    properties = list(job_server.job_server_jvm_properties or [])
    job_server.job_server_jvm_properties = properties + [
        opens for opens in JAVA17_JOB_SERVER_OPENS if opens not in properties
    ]


def use_worker_processes(options: PipelineOptions, parallelism: int) -> None:
    """Runs the Python SDK workers as ``parallelism`` processes of this host, not threads.

    With no ``--environment_type`` given this chooses LOOPBACK with
    ``--experiments=use_loopback_process_worker`` and ``--sdk_worker_parallelism`` (unless
    given) ``parallelism``, so that every slot or core has a Python process of its own, kept
    for the whole job (``--environment_cache_millis``) rather than started anew per stage. Those
    processes are started as ``python`` from ``PATH``; this interpreter's directory goes first
    on ``PATH`` so that they run in the same environment.
    """
    portable = options.view_as(PortableOptions)
    if portable.environment_type:
        return
    portable.environment_type = "LOOPBACK"
    debug = options.view_as(DebugOptions)
    if LOOPBACK_PROCESS_WORKERS not in (debug.experiments or []):
        debug.add_experiment(LOOPBACK_PROCESS_WORKERS)
    if portable.sdk_worker_parallelism in (None, 0, 1):
        portable.sdk_worker_parallelism = max(1, parallelism)
    if not portable.environment_cache_millis:
        # Without a cache every stage of the job starts (and imports Beam in) new SDK worker
        # processes: about 6 s a stage, dozens of stages.
        portable.environment_cache_millis = ENVIRONMENT_CACHE_MILLIS
    # The SDK workers inherit this environment. glibc gives each of their gRPC and harness
    # threads a malloc arena of its own, and those arenas kept what earlier bundles freed: the
    # two workers' peak RSS grew 601 -> 735 MB from 16,000 to 64,000 tiny images on Flink.
    # Two arenas keep it flat (benchmarks/bench_jvm_engines.py --memory). A value set wins.
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")
    here = os.path.dirname(sys.executable)
    found = shutil.which("python")
    if found is None or os.path.dirname(os.path.realpath(found)) != os.path.realpath(here):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


# Runs the command after it in a process group of its own: ``exec`` keeps the pid, so the
# ``Popen`` that started it (Beam's) still signals and waits for the command itself.
_OWN_PROCESS_GROUP = (
    sys.executable,
    "-I",
    "-S",
    "-c",
    "import os, sys; os.setpgid(0, 0); os.execvp(sys.argv[1], sys.argv[1:])",
)


def in_own_process_group(command: Sequence[str]) -> list[str]:
    """``command``, run in a process group of its own (Linux and macOS)."""
    return [*_OWN_PROCESS_GROUP, *command]


class OwnProcessGroupJobServer(beam_job_server.JavaJarJobServer):
    """Put before Beam's job-server class (``FlinkJarJobServer``, ``SparkJarJobServer``) in a
    subclass's bases: the job server's JVM then runs in a process group of its own.

    A terminal sends Ctrl-C's SIGINT to its whole foreground process group: the job server
    (the Spark driver; Flink's client) would die at once, before the launcher could cancel the
    job through it. ``subprocess_cmd_and_endpoint`` is how Beam's job servers give the command
    their ``start`` runs.
    """

    def subprocess_cmd_and_endpoint(self):
        command, endpoint = super().subprocess_cmd_and_endpoint()
        return in_own_process_group(command), endpoint


def keep_ctrl_c_from_engine_processes() -> None:
    """Starts Beam's LOOPBACK SDK worker processes in process groups of their own.

    Each would otherwise print a traceback at a terminal's Ctrl-C. Out of the terminal's
    foreground group (like the job server, ``OwnProcessGroupJobServer``), only the launcher
    sees Ctrl-C; it cancels the job, and the job's end stops them (``stop_job_server_after``).
    Idempotent.
    """
    beam_internals.start_loopback_workers_in_own_process_group()


# What Beam logs at WARNING on every run with a job server (the commands it starts and stops),
# or when the job server is slow to start: a user's terminal got a dozen lines per run.
_LAUNCH_NOISE = (
    "Really starting service",
    "Really destroying service",
    "Starting worker with",
    "Waiting for grpc channel to be ready",
)
_NOISY_LOGGERS = (
    "apache_beam.utils.subprocess_server",
    "apache_beam.runners.worker.worker_pool_main",
    "",
)


def _not_launch_noise(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_LAUNCH_NOISE)


def drop_launch_warnings() -> None:
    """Drops Beam's WARNING lines about starting the job server and SDK workers (the commands
    it runs, its wait for the job server's port); errors still show. Idempotent."""
    for name in _NOISY_LOGGERS:
        logger = logging.getLogger(name or None)
        if _not_launch_noise not in logger.filters:
            logger.addFilter(_not_launch_noise)


class StopOnExitJobServer(beam_job_server.StopOnExitJobServer):
    """Beam's ``StopOnExitJobServer`` without the SIGINT handler its ``start`` installs.

    That handler stopped the job server at Ctrl-C, before the launcher's own handler ran: the
    launcher could then not cancel the job through it, and it logged the stop. The launcher's
    handling (``cancel_job``, then ``stop_job_server_after``) stops it instead; at exit it is
    stopped as before.
    """

    def start(self):
        handler = signal.getsignal(signal.SIGINT)
        try:
            return super().start()
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGINT, handler)


def stop_sdk_workers() -> int:
    """Ends this process's LOOPBACK SDK worker processes (its children running Beam's
    ``SdkHarness``) with SIGTERM, once their job is over; returns how many. Linux (``/proc``)
    only; elsewhere they end with this process, as Beam leaves them."""
    if not os.path.isdir("/proc"):
        return 0
    me, ended = os.getpid(), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            if ppid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"SdkHarness" not in f.read():
                    continue
            os.kill(int(entry), signal.SIGTERM)
            ended += 1
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return ended


class JobIdServiceHandle(portable_runner.JobServiceHandle):
    """Beam's ``JobServiceHandle``, keeping the id the job service gave the submitted job
    (for the engine's job link), which Beam's ``PipelineResult`` keeps to itself."""

    job_id = ""

    def submit(self, proto_pipeline):
        job_id, message_stream, state_stream = super().submit(proto_pipeline)
        self.job_id = job_id
        return job_id, message_stream, state_stream


class StopsJobServerResult(PipelineResult):
    """A portable job's ``PipelineResult`` that stops the job server as soon as the job ends,
    after reading the job's metrics (which are read from it; ``metrics()`` then returns them).

    Beam would stop the job server only when the launcher exits, after the run's private
    temporary directory is gone. The job has ended when ``wait_until_finish`` returns or
    raises (Ctrl-C included), unless it was given a ``duration`` and the job still runs.
    """

    def __init__(self, result: PipelineResult, job_server) -> None:
        super().__init__(PipelineState.UNKNOWN)
        self.result = result
        self._job_server = job_server
        self._metrics = None
        self._finished = False

    @property
    def state(self):
        return self.result.state

    def wait_until_finish(self, duration=None):
        ended = True
        try:
            state = self.result.wait_until_finish(duration)
            ended = not duration or PipelineState.is_terminal(state)
            return state
        finally:
            if ended:
                self._finish()

    def cancel(self):
        return self.result.cancel()

    def metrics(self):
        return self._metrics if self._metrics is not None else self.result.metrics()

    def _finish(self) -> None:
        if self._finished:
            return
        try:
            self._metrics = self.result.metrics()
        except Exception as e:  # the job server may already be gone; metrics are then empty
            _log.warning("could not read the job's metrics: %s", e)
        self._finished = True
        # The job is over: its SDK workers would only print a traceback each when the job
        # server (with an embedded Flink, their data plane's other end) goes away.
        stop_sdk_workers()
        if self._job_server is not None:  # None: a job server given by --job_endpoint, kept
            self._job_server.stop()


def stop_job_server_after(result: PipelineResult, job_server) -> StopsJobServerResult:
    """``result``, stopping ``job_server`` as soon as the job ends (``StopsJobServerResult``).

    ``job_server`` None (the job went to a running job server, ``--job_endpoint``): only the
    job's SDK workers are stopped, and the job server is left running for the next job."""
    return StopsJobServerResult(result, job_server)


def watch_for_engine_job(
    find: Callable[[], tuple[str, str] | None], engine: str, beam_job_id: str
) -> None:
    """Logs the engine's own job id and web UI address once ``find`` sees the job (≤ 60 s).

    Args:
      find: returns ``(engine job id, web UI address)`` once the engine lists the job.
      engine: ``Flink`` or ``Spark``, for the message.
      beam_job_id: the job server's id of the job.
    """

    def poll() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = find()
            if found:
                job_id, ui = found
                _log.info("%s job %s (Beam job %s): %s", engine, job_id, beam_job_id, ui)
                return
            time.sleep(0.5)
        _log.info("%s job of Beam job %s: not listed by the engine after 60 s", engine, beam_job_id)

    threading.Thread(target=poll, name=f"{engine.lower()}-job-link", daemon=True).start()
