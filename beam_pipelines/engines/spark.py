"""The pipeline on Apache Spark: a standalone master (``--spark_master_url spark://HOST:PORT``).

``--runner SparkRunner`` selects ``SparkRunner`` below (``beam_pipelines.engines.runners``): Beam's own
runner, with what this project needs around it. It runs the job server that
``scripts/engines/install.sh`` installed (never one downloaded while the job runs; it is the
Spark driver), gives the executors the same Beam classes from the same install, runs the Python
SDK workers as one process per core, refuses an unreachable master before submitting, naming
it, logs the Spark application id and the master's web UI, and stops the job server when the job
ends (a new one per run: Beam would otherwise keep one per process, stopped or not).
"""

from __future__ import annotations

import logging
import math
import re
import socket
import time
import urllib.error
import urllib.request

from apache_beam.options.pipeline_options import (
    JobServerOptions,
    PipelineOptions,
    PortableOptions,
    SparkRunnerOptions,
)
from apache_beam.pipeline import Pipeline
from apache_beam.runners.portability import spark_runner
from apache_beam.runners.runner import PipelineResult

from beam_pipelines.engines import portable, versions
from beam_pipelines.engines.local_clusters import (
    SPARK_HEARTBEAT_WHOLE,
    SPARK_KRYO,
    SPARK_MEMORY_FRACTION,
    SPARK_SPILLING_STORAGE,
    free_port,
)

__all__ = [
    "DEFAULT_CORES",
    "IMAGES_PER_PARTITION",
    "SPARK_RUNNER",
    "SparkJobServer",
    "SparkRunner",
    "SparkStorageOptions",
    "cancel_spark_jobs",
    "partitions_for",
    "prepare_spark_options",
    "size_partitions",
]

_log = logging.getLogger(__name__)

SPARK_RUNNER = "beam_pipelines.engines.spark.SparkRunner"
DEFAULT_CORES = 2
_MASTER = re.compile(r"^spark://(?P<host>[^:/\s]+):(?P<port>\d+)$")
_START_COMMAND = "python scripts/engines/cluster.py start spark DIR"
# Beam's Spark runner holds all of a task's outputs of a stage in the executor's heap until the
# task ends: a 1 M-image build in 2 partitions ran a 3 GB heap out, 20 held (docs/scale.md).
IMAGES_PER_PARTITION = 50_000
_PARALLELISM = "-Dspark.default.parallelism="


class SparkStorageOptions(PipelineOptions):
    """Beam's Spark runner option ``storageLevel``, which the Python SDK's ``SparkRunnerOptions``
    does not carry: ``--storage_level`` reaches the job server as ``storage_level`` (Beam's
    portable options travel in snake case, read back as ``storageLevel``)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument(
            "--storage_level",
            default=None,
            help=(
                "Spark: the storage level of the datasets Beam caches because two steps read "
                "them (a Spark StorageLevel name). A job server started for the job gets "
                f"{SPARK_SPILLING_STORAGE} and Kryo unless given, so what does not fit the "
                "executors' memory spills to their disk instead of being computed again; one "
                "at --job_endpoint keeps Beam's MEMORY_ONLY unless given (spilling needs its "
                f"driver started with {SPARK_KRYO})"
            ),
        )


def _local_cores(master: str) -> int | None:
    match = re.match(spark_runner.LOCAL_MASTER_PATTERN, master)
    if not match:
        return None
    inside = master[len("local[") : -1] if "[" in master else "1"
    return int(inside) if inside.isdigit() else DEFAULT_CORES


def _check_master(master: str) -> None:
    match = _MASTER.match(master)
    if match is None:
        raise ValueError(
            f"--spark_master_url {master!r} is not a Spark master; expected spark://HOST:PORT "
            "or local[N]"
        )
    try:
        with socket.create_connection((match["host"], int(match["port"])), timeout=3):
            pass
    except OSError as e:
        raise ValueError(
            f"--spark_master_url {master} is not reachable ({e}); start a cluster with "
            f"{_START_COMMAND}, or pass the address of a running one"
        ) from e


def prepare_spark_options(options: PipelineOptions) -> str | None:
    """Fills in and checks the Spark options of a run, in place.

    Returns:
      The web UI of the application (the job server is its driver, on this host), or None
      when ``--job_server_jvm_properties`` chose a port that is not a number.

    Raises:
      ValueError: the job-server jar is missing (names ``--spark_job_server_jar`` and the
        install command), or ``--spark_master_url`` is malformed or does not answer.
    """
    spark = options.view_as(SparkRunnerOptions)
    installed = versions.spark_job_server_jar()
    spark.spark_job_server_jar = portable.check_job_server_jar(
        spark.spark_job_server_jar, installed, "--spark_job_server_jar"
    )
    master = spark.spark_master_url.strip()
    cores = _local_cores(master)
    if cores is None:
        _check_master(master)
    portable.add_job_server_opens(options)
    if spark.spark_job_server_jar == str(installed):
        # The job server's jar names its classpath in its manifest, which executors never see:
        # they load the same jars from the same install (on this host, or the same path on
        # every worker of a remote cluster).
        extra = f"-Dspark.executor.extraClassPath={installed.parent / 'lib'}/*"
        _add_jvm_property(options, extra)
    chosen = [p for p in _jvm_properties(options) if p.startswith("-Dspark.ui.port=")]
    port = chosen[0].split("=", 1)[1] if chosen else str(free_port())
    _add_jvm_property(options, f"-Dspark.ui.port={port}")
    # The job server runs here, or is a local cluster's kept one (which names its UI port).
    ui = f"http://127.0.0.1:{port}" if port.isdigit() else None
    portable.use_worker_processes(options, cores or DEFAULT_CORES)
    # Beam's Spark runner caches every PCollection that two steps read, at its storageLevel
    # (MEMORY_ONLY unless told): what did not fit the executor's storage memory was dropped and
    # computed again for its second reader (a 1 M-image build's CPU per image 1.6x a 300 k
    # one's). A driver started here spills them instead, with Kryo (SPARK_KRYO), and leaves
    # the executors' heap to Beam's queues sooner (SPARK_MEMORY_FRACTION), unless given; its
    # executors' heartbeats do not die on Beam's accumulator (SPARK_HEARTBEAT_WHOLE).
    if not options.view_as(PortableOptions).job_endpoint:
        _add_jvm_property(options, SPARK_KRYO)
        _add_jvm_property(options, SPARK_MEMORY_FRACTION)
        _add_jvm_property(options, SPARK_HEARTBEAT_WHOLE)
        storage = options.view_as(SparkStorageOptions)
        storage.storage_level = storage.storage_level or SPARK_SPILLING_STORAGE
    return ui


def _jvm_properties(options: PipelineOptions) -> list[str]:
    return list(options.view_as(JobServerOptions).job_server_jvm_properties or [])


def _add_jvm_property(options: PipelineOptions, prop: str) -> None:
    name = prop.split("=", 1)[0] + "="
    properties = _jvm_properties(options)
    if not any(p.startswith(name) for p in properties):
        options.view_as(JobServerOptions).job_server_jvm_properties = [*properties, prop]


def partitions_for(images: int) -> int:
    """The partitions a build of about ``images`` inputs wants: at most
    ``IMAGES_PER_PARTITION`` each, at least ``DEFAULT_CORES``."""
    # ``images`` may be an estimate: within 1 % of a multiple of the rule, that multiple.
    return max(DEFAULT_CORES, math.ceil(images / IMAGES_PER_PARTITION - 0.01))


def size_partitions(options: PipelineOptions, images: int) -> None:
    """Makes a build of about ``images`` inputs give each Spark partition at most
    ``IMAGES_PER_PARTITION`` of them, in place, where this run can: the job server started for
    this job (its driver) gets ``spark.default.parallelism`` unless one is given; a given one
    below that, or a running job server's (``--job_endpoint``, whose driver is set already),
    gets a warning naming the value that would do."""
    needed = partitions_for(images)
    if needed <= DEFAULT_CORES:
        return
    given = [p for p in _jvm_properties(options) if p.startswith(_PARALLELISM)]
    value = given[0][len(_PARALLELISM) :] if given else ""
    if options.view_as(PortableOptions).job_endpoint:
        _log.warning(
            "Spark: about %s inputs need spark.default.parallelism >= %d (at most %s a "
            "partition; docs/scale.md): the job server at --job_endpoint has its own, set "
            "where it was started (cluster.py start spark "
            "--spark_property=-Dspark.default.parallelism=%d)",
            f"{images:,}",
            needed,
            f"{IMAGES_PER_PARTITION:,}",
            needed,
        )
    elif not given:
        _add_jvm_property(options, f"{_PARALLELISM}{needed}")
        _log.info(
            "Spark: spark.default.parallelism %d for about %s inputs (at most %s a partition)",
            needed,
            f"{images:,}",
            f"{IMAGES_PER_PARTITION:,}",
        )
    elif not value.isdigit() or int(value) < needed:
        _log.warning(
            "Spark: %s%s gives partitions of more than %s of these %s inputs; Beam's Spark "
            "runner holds a partition's outputs in the executor's heap (docs/scale.md): pass "
            "--job_server_jvm_properties=%s%d",
            _PARALLELISM,
            value,
            f"{IMAGES_PER_PARTITION:,}",
            f"{images:,}",
            _PARALLELISM,
            needed,
        )


class SparkJobServer(portable.OwnProcessGroupJobServer, spark_runner.SparkJarJobServer):
    """Beam's Spark job server (the Spark driver), run in a process group of its own."""


class SparkRunner(spark_runner.SparkRunner):
    """Beam's SparkRunner with the installed job server and SDK workers in processes."""

    def __init__(self) -> None:
        super().__init__()
        self._job_server = None
        self._handle: portable.JobIdServiceHandle | None = None

    def default_job_server(self, options):
        spark = options.view_as(SparkRunnerOptions)
        if spark.spark_submit_uber_jar:
            return super().default_job_server(options)
        self._job_server = portable.StopOnExitJobServer(SparkJobServer(options))
        return self._job_server

    def create_job_service_handle(self, job_service, options):
        # As Beam's SparkRunner makes it, keeping the submitted job's id.
        self._handle = portable.JobIdServiceHandle(
            job_service,
            options,
            retain_unknown_options=options.view_as(SparkRunnerOptions).spark_submit_uber_jar,
        )
        return self._handle

    def run_pipeline(self, pipeline: Pipeline, options: PipelineOptions) -> PipelineResult:
        ui = prepare_spark_options(options)
        portable.keep_ctrl_c_from_engine_processes()
        portable.drop_launch_warnings()
        result = super().run_pipeline(pipeline, options)
        result = portable.stop_job_server_after(result, self._job_server)
        beam_job_id = self._handle.job_id if self._handle else ""
        if ui is not None:
            portable.watch_for_engine_job(lambda: _find_spark_app(ui), "Spark", beam_job_id)
            _cancel_on_the_driver_too(result, ui)
        return result


def _cancel_on_the_driver_too(result: PipelineResult, ui: str) -> None:
    """Makes ``result.cancel()`` also cancel the Spark jobs still running, through the driver's
    web UI.

    Beam's cancel only stops the job server waiting for the job. A job server started for the
    job is then stopped, and its application with it; a job server a cluster keeps
    (``--job_endpoint``) keeps its application, whose running Spark jobs would go on
    preparing images and writing staging files with no launcher.
    """
    beam_cancel = result.cancel

    def cancel():
        try:
            return beam_cancel()
        finally:
            cancel_spark_jobs(ui)

    result.cancel = cancel  # type: ignore[method-assign]  # the same call, one step more


def cancel_spark_jobs(ui: str, timeout_s: float = 5.0) -> int:
    """Cancels every running job of the application whose driver serves ``ui``, until none is
    left running (at most ``timeout_s``: a job the runner submits meanwhile is cancelled
    too); returns how many it cancelled."""
    found = _find_spark_app(ui)
    if found is None:
        return 0
    jobs_url = f"{ui}/api/v1/applications/{found[0]}/jobs?status=running"
    cancelled, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = portable.http_json(jobs_url)
        if not isinstance(running, list) or not running:
            break
        for job in running:
            # Spark's own "kill" link of the job on its web UI (spark.ui.killEnabled).
            kill = urllib.request.Request(f"{ui}/jobs/job/kill/?id={job['jobId']}", method="POST")
            try:
                urllib.request.urlopen(kill, timeout=3).close()
            except urllib.error.HTTPError:
                pass  # an answer: Spark redirects to its jobs page
            except OSError:
                continue  # the driver is gone, or did not answer
            cancelled += 1
        time.sleep(0.3)
    return cancelled


def _find_spark_app(ui: str) -> tuple[str, str] | None:
    # The job server is the application's driver: its UI lists the one application it runs.
    apps = portable.http_json(f"{ui}/api/v1/applications")
    if not isinstance(apps, list) or not apps:
        return None
    return apps[0]["id"], f"{ui}/jobs/"
