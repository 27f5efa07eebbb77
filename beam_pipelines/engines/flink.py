"""The pipeline on Apache Flink: a session cluster (``--flink_master HOST:PORT``) or ``[local]``.

``--runner FlinkRunner`` selects ``FlinkRunner`` below (``beam_pipelines.engines.runners``): Beam's own
runner, with what this project needs around it. It runs the job server that
``scripts/engines/install.sh`` installed (never one downloaded while the job runs), with the
Java 17 module openings; runs the Python SDK workers as one process per slot
(``--parallelism``, default 2); refuses an unreachable ``--flink_master`` before submitting,
naming it; logs the Flink job id and its web UI page; and stops the job server when the job ends.
"""

from __future__ import annotations

import logging
import math
import re
import time
import urllib.request

from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions
from apache_beam.pipeline import Pipeline
from apache_beam.runners.portability import flink_runner, job_server
from apache_beam.runners.runner import PipelineResult

from beam_pipelines.engines import portable, versions

__all__ = [
    "DEFAULT_PARALLELISM",
    "FLINK_RUNNER",
    "FlinkJobServer",
    "FlinkRunner",
    "IMAGES_PER_TASK",
    "cancel_flink_job",
    "prepare_flink_options",
    "size_parallelism",
]

_log = logging.getLogger(__name__)

FLINK_RUNNER = "beam_pipelines.engines.flink.FlinkRunner"
DEFAULT_PARALLELISM = 2
# Beam's Flink runner hands each task's whole partition to an SDK worker as one bundle; a
# bundle of 1.5 M images stalled for good in its Fn API buffering, 500 k ran (docs/scale.md).
IMAGES_PER_TASK = 500_000
_LOCAL = ("[local]", "[auto]")
_START_COMMAND = "python scripts/engines/cluster.py start flink DIR"


def _rest_url(master: str) -> str:
    master = master.strip().rstrip("/")
    return master if re.match(r"^https?://", master) else f"http://{master}"


def prepare_flink_options(options: PipelineOptions) -> None:
    """Fills in and checks the Flink options of a run, in place.

    Raises:
      ValueError: the job-server jar is missing (names ``--flink_job_server_jar`` and the
        install command), ``--parallelism`` is below 1, or ``--flink_master`` does not answer.
    """
    flink = options.view_as(FlinkRunnerOptions)
    flink.flink_job_server_jar = portable.check_job_server_jar(
        flink.flink_job_server_jar, versions.flink_job_server_jar(), "--flink_job_server_jar"
    )
    if flink.flink_job_server_jar == str(versions.flink_job_server_jar()):
        flink.flink_version = versions.FLINK_MINOR
    if flink.parallelism in (None, -1):
        flink.parallelism = DEFAULT_PARALLELISM
    if flink.parallelism < 1:
        raise ValueError(f"--parallelism {flink.parallelism} must be >= 1")
    workers = flink.parallelism
    if flink.flink_master.strip() not in _LOCAL:
        rest = _rest_url(flink.flink_master)
        portable.check_reachable(
            f"{rest}/config", "--flink_master", flink.flink_master, _START_COMMAND
        )
        overview = _overview(flink.flink_master)
        _check_slots(flink.parallelism, _total_slots(overview), flink.flink_master)
        # An SDK worker a slot of each TaskManager: the job's tasks are spread over them.
        workers = min(workers, _slots_per_taskmanager(overview) or workers)
    portable.add_job_server_opens(options)
    portable.use_worker_processes(options, workers)


def _overview(master: str) -> object | None:
    """The REST overview of the session cluster at ``master``; None for an embedded Flink or
    a cluster that does not answer."""
    if master.strip() in _LOCAL:
        return None
    return portable.http_json(f"{_rest_url(master)}/overview")


def _total_slots(overview: object) -> int | None:
    """The task slots of every TaskManager together, from a REST overview, or None."""
    slots = overview.get("slots-total") if isinstance(overview, dict) else None
    return slots if isinstance(slots, int) and slots >= 1 else None


def _check_slots(parallelism: int, slots: int | None, master: str) -> None:
    """Refuses a ``--parallelism`` above the cluster's task ``slots``: Beam's Flink runner asks
    for all of a batch job's slots at once (pipelined exchanges), and such a job waits for
    slots that never come (a 300-image build at 6 on 2 slots: nothing in 10 minutes). A
    cluster whose slots are not known (None) is not checked."""
    if slots is None or parallelism <= slots:
        return
    raise ValueError(
        f"--parallelism {parallelism} is more than the {slots} task slots of --flink_master "
        f"{master}: Beam's Flink runner runs every task of a job at once, so the job would wait "
        f"for slots. Give the cluster {parallelism} slots (more TaskManagers, or "
        f"taskmanager.numberOfTaskSlots; here: cluster.py start flink DIR --slots "
        f"{parallelism}), or pass --parallelism {slots}: then each task takes 1/{slots} of "
        f"the inputs, and Beam's runner stalled on tasks of 1.5 M images (docs/scale.md)"
    )


def _slots_per_taskmanager(overview: object) -> int | None:
    """The task slots of one TaskManager of the cluster (its REST overview), or None."""
    slots = _total_slots(overview)
    taskmanagers = overview.get("taskmanagers") if isinstance(overview, dict) else None
    if slots is None or not isinstance(taskmanagers, int) or taskmanagers < 1:
        return None
    return max(1, slots // taskmanagers)


def size_parallelism(options: PipelineOptions, images: int) -> None:
    """Makes a build of about ``images`` inputs give each Flink task at most
    ``IMAGES_PER_TASK`` of them where the cluster allows, in place.

    ``--parallelism`` not given becomes that many tasks (at least ``DEFAULT_PARALLELISM``), or
    the cluster's task slots if it has fewer (a job with more tasks than slots would wait for
    them: ``prepare_flink_options`` refuses it), with a warning that names the slots it needs.
    One given below the rule is kept, with a warning naming the value that would do.
    """
    flink = options.view_as(FlinkRunnerOptions)
    # ``images`` is an estimate (a listing's size over its first lines): within 1 % of a
    # multiple of the rule, that multiple.
    needed = max(1, math.ceil(images / IMAGES_PER_TASK - 0.01))
    if flink.parallelism not in (None, -1):
        if flink.parallelism < needed:
            _log.warning(
                "Flink: --parallelism %d gives each task about %s of these %s inputs; Beam's "
                "Flink runner stalled for good on tasks of 1.5 M images (docs/scale.md): pass "
                "--parallelism %d or more",
                flink.parallelism,
                f"{math.ceil(images / flink.parallelism):,}",
                f"{images:,}",
                needed,
            )
        return
    chosen = max(DEFAULT_PARALLELISM, needed)
    slots = _total_slots(_overview(flink.flink_master))
    if slots is not None and chosen > slots:
        chosen = slots
        if needed > slots:
            _log.warning(
                "Flink: about %s inputs want %d tasks of at most %s images, and the cluster has "
                "%d task slots: each task takes about %s (Beam's Flink runner stalled for good "
                "on tasks of 1.5 M images; docs/scale.md); give it %d slots",
                f"{images:,}",
                needed,
                f"{IMAGES_PER_TASK:,}",
                slots,
                f"{math.ceil(images / slots):,}",
                needed,
            )
    flink.parallelism = chosen
    if chosen > DEFAULT_PARALLELISM:
        _log.info(
            "Flink: --parallelism %d for about %s inputs (at most %s a task; Beam's Flink "
            "runner stalls on much larger tasks)",
            chosen,
            f"{images:,}",
            f"{IMAGES_PER_TASK:,}",
        )


class FlinkJobServer(portable.OwnProcessGroupJobServer, flink_runner.FlinkJarJobServer):
    """Beam's Flink job server, run in a process group of its own."""


class FlinkRunner(flink_runner.FlinkRunner):
    """Beam's FlinkRunner with the installed job server and SDK workers in processes."""

    def __init__(self) -> None:
        super().__init__()
        self._job_server = None
        self._handle: portable.JobIdServiceHandle | None = None

    def default_job_server(self, options):
        server = super().default_job_server(options)
        if type(server) is job_server.StopOnExitJobServer:
            server = portable.StopOnExitJobServer(FlinkJobServer(options))
        self._job_server = server
        return self._job_server

    def create_job_service_handle(self, job_service, options):
        # As Beam's FlinkRunner makes it, keeping the submitted job's id.
        self._handle = portable.JobIdServiceHandle(
            job_service,
            options,
            retain_unknown_options=options.view_as(FlinkRunnerOptions).flink_submit_uber_jar,
        )
        return self._handle

    def run_pipeline(self, pipeline: Pipeline, options: PipelineOptions) -> PipelineResult:
        prepare_flink_options(options)
        portable.keep_ctrl_c_from_engine_processes()
        portable.drop_launch_warnings()
        master = options.view_as(FlinkRunnerOptions).flink_master.strip()
        result = super().run_pipeline(pipeline, options)
        result = portable.stop_job_server_after(result, self._job_server)
        beam_job_id = self._handle.job_id if self._handle else ""
        if master in _LOCAL:
            _log.info("Flink job of Beam job %s runs in an embedded Flink", beam_job_id)
        else:
            rest = _rest_url(master)
            portable.watch_for_engine_job(
                lambda: _find_flink_job(rest, beam_job_id), "Flink", beam_job_id
            )
            _cancel_on_the_cluster_too(result, rest, beam_job_id)
        return result


def _cancel_on_the_cluster_too(result: PipelineResult, rest: str, beam_job_id: str) -> None:
    """Makes ``result.cancel()`` cancel the Flink job through the cluster's REST API first.

    Beam's cancel goes through the job server, which only stops waiting for the job: on a
    session cluster the job would go on preparing images and writing staging files, with no
    launcher. Flink's own cancel ends it (CANCELED); Beam's then stops the job server.
    """
    beam_cancel = result.cancel

    def cancel():
        try:
            cancel_flink_job(rest, beam_job_id)
        except Exception as e:  # Beam's cancel below still stops the job server
            _log.debug("cancelling the Flink job of %s: %s", beam_job_id, e)
        return beam_cancel()

    result.cancel = cancel  # type: ignore[method-assign]  # the same call, one step more


def cancel_flink_job(rest: str, beam_job_id: str, timeout_s: float = 10.0) -> str | None:
    """Cancels the Flink job of ``beam_job_id`` and waits (≤ ``timeout_s``) for it to end.

    Returns:
      The job's last state (``CANCELED`` once cancelled), or None when the cluster lists no
      such job.
    """
    found = _find_flink_job(rest, beam_job_id)
    if found is None:
        return None
    jid = found[0]
    deadline = time.monotonic() + timeout_s
    state = _job_state(rest, jid)
    if state not in _TERMINAL:
        request = urllib.request.Request(f"{rest}/jobs/{jid}?mode=cancel", method="PATCH")
        try:
            urllib.request.urlopen(request, timeout=3).close()
        except OSError as e:  # ended meanwhile, or the cluster is gone
            _log.debug("cancelling Flink job %s: %s", jid, e)
    while state not in _TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        state = _job_state(rest, jid)
    return state


_TERMINAL = ("CANCELED", "FAILED", "FINISHED")


def _job_state(rest: str, jid: str) -> str | None:
    job = portable.http_json(f"{rest}/jobs/{jid}")
    return job.get("state") if isinstance(job, dict) else None


def _find_flink_job(rest: str, beam_job_id: str) -> tuple[str, str] | None:
    overview = portable.http_json(f"{rest}/jobs/overview")
    if not isinstance(overview, dict):
        return None
    # The job server names the Flink job after the Beam job (the part before its "_<uuid>").
    name = beam_job_id.split("_")[0]
    for job in sorted(overview.get("jobs", []), key=lambda j: -j.get("start-time", 0)):
        if job.get("name", "").startswith(name):
            return job["jid"], f"{rest}/#/job/{job['jid']}/overview"
    return None
