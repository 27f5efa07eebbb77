"""Runner short names accepted on the command line, and checks of runner-specific options."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.pipeline import Pipeline
from apache_beam.runners.runner import PipelineResult, PipelineRunner

__all__ = [
    "DASK_RUNNER",
    "FLINK_RUNNER",
    "RUNNER_ALIASES",
    "SHIELDED_SDK_WORKER",
    "SPARK_RUNNER",
    "InProcessRunner",
    "cancel_job",
    "in_process_runner",
    "private_temp_dir",
    "resolve_runner_aliases",
]

# Beam's own DaskRunner computes only one branch of a pipeline and mixes tagged outputs (see
# beam_pipelines.engines.dask_runner), so both its short name and its full class path select the
# corrected subclass.
DASK_RUNNER = "beam_pipelines.engines.dask_runner.DaskRunner"
# Beam's Flink and Spark runners, with the installed job servers and SDK workers in processes
# (see beam_pipelines.engines).
FLINK_RUNNER = "beam_pipelines.engines.flink.FlinkRunner"
SPARK_RUNNER = "beam_pipelines.engines.spark.SparkRunner"
RUNNER_ALIASES = {
    "DaskRunner": DASK_RUNNER,
    "apache_beam.runners.dask.dask_runner.DaskRunner": DASK_RUNNER,
    "FlinkRunner": FLINK_RUNNER,
    "apache_beam.runners.portability.flink_runner.FlinkRunner": FLINK_RUNNER,
    "SparkRunner": SPARK_RUNNER,
    "apache_beam.runners.portability.spark_runner.SparkRunner": SPARK_RUNNER,
}

# Beam's command for a ``multi_processing`` SDK worker (``FnApiRunner.run_pipeline``), run by
# /bin/sh with SIGINT ignored: an ignored signal stays ignored across ``exec``, and Python then
# installs no KeyboardInterrupt handler. (A blocked mask would not do: the shell clears it.)
SHIELDED_SDK_WORKER = (
    f"trap '' INT; exec {shlex.quote(sys.executable)} -m apache_beam.runners.worker.sdk_worker_main"
)

# The names under which --runner selects Beam's DirectRunner (its default runner).
_DIRECT_RUNNER_NAMES = (
    "direct",
    "directrunner",
    "apache_beam.runners.direct.direct_runner.directrunner",
)

_DASK_FLAGS = (
    "--dask_client_address",
    "--dask_scheduler_file",
    "--dask_connection_timeout",
    "--dask_client_name",
    "--dask_connection_limit",
    "--dask_npartitions",
    "--dask_partition_size",
)
_DASK_ADDRESS = re.compile(
    r"^(?:(?:tcp|tls|ucx|ws|wss)://)?(?P<host>\[[0-9a-fA-F:]+\]|[^:/\s]+):(?P<port>\d+)$"
)


class InProcessRunner(PipelineRunner):
    """Beam's DirectRunner for a batch pipeline, without its attempt to run on Prism first.

    Beam 2.77's DirectRunner tries Prism before anything else: it downloads Prism's binary on
    every run, so offline each run pays for a failed download before falling back to the
    FnApiRunner, and online it would run on Prism, which this project does not test. This runs
    what the DirectRunner falls back to, built as the DirectRunner builds it (the pipeline
    options in the workers' provision info, so ``--direct_running_mode multi_processing``
    workers get them): the same runner, steps and output, minus the detour.

    ``multi_processing`` workers run ``SHIELDED_SDK_WORKER``, Beam's own worker command with
    SIGINT ignored: a terminal's Ctrl-C reaches every process of its foreground group, and each
    worker would die printing a traceback while the launcher unwinds (and stops them).
    """

    def run_pipeline(self, pipeline: Pipeline, options: PipelineOptions) -> PipelineResult:
        from apache_beam.portability.api import beam_provision_api_pb2
        from apache_beam.runners.portability.fn_api_runner import fn_runner
        from apache_beam.runners.portability.portable_runner import JobServiceHandle
        from apache_beam.transforms.environments import SubprocessSDKEnvironment

        encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
        provision_info = fn_runner.ExtendedProvisionInfo(
            beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)
        )
        direct = options.view_as(DirectOptions)
        if direct.direct_running_mode != "multi_processing" or os.name != "posix":
            runner = fn_runner.FnApiRunner(provision_info=provision_info)
            return runner.run_pipeline(pipeline, options)
        environment = SubprocessSDKEnvironment.from_command_string(SHIELDED_SDK_WORKER)
        runner = fn_runner.FnApiRunner(
            default_environment=environment, provision_info=provision_info
        )
        # FnApiRunner replaces the environment it was given when the mode is multi_processing;
        # the workers still see the mode the user gave (the provision info above).
        direct.direct_running_mode = None
        try:
            return runner.run_pipeline(pipeline, options)
        finally:
            direct.direct_running_mode = "multi_processing"


def cancel_job(result: PipelineResult) -> None:
    """Cancels ``result``'s job on its engine (after Ctrl-C or SIGTERM), quietly.

    On a cluster (Dask, Flink, Spark) the job would otherwise go on without its launcher,
    preparing images and writing staging files that nobody waits for. A runner that cannot
    cancel (the in-process one: its work ends with the launcher) or a job already over is
    left as it is.
    """
    with contextlib.suppress(Exception):
        result.cancel()


def in_process_runner(options: PipelineOptions) -> PipelineRunner | None:
    """The runner to give ``beam.Pipeline`` for ``options``.

    Returns:
        An ``InProcessRunner`` when ``--runner`` is unset or names the DirectRunner and the
        pipeline is a batch one; None otherwise, so that ``--runner`` chooses.
    """
    standard = options.view_as(StandardOptions)
    runner = standard.runner
    if standard.streaming or not (runner is None or runner.lower() in _DIRECT_RUNNER_NAMES):
        return None
    return InProcessRunner()


@contextlib.contextmanager
def private_temp_dir() -> Iterator[str]:
    """Points Python's temporary directory at a new private one for the block, then removes it.

    Launching a Beam pipeline leaves directories in the system temp dir every time (the job
    server's ``beam-temp*``, the SDK's staging ``tmp*`` and ``beam-requirements-cache``); made
    in here, they go when the run ends, failed or not. In-process workers' own temporary files
    (shards being written) land here too.
    """
    private = tempfile.mkdtemp(prefix="images_to_tfrecord-")
    previous = tempfile.tempdir
    tempfile.tempdir = private
    try:
        yield private
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(private, ignore_errors=True)


def _flag_values(argv: Sequence[str], flag: str) -> list[str]:
    values: list[str] = []
    for i, arg in enumerate(argv):
        if arg == flag:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise ValueError(f"{flag} needs a value")
            values.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            values.append(arg.split("=", 1)[1])
    return values


def _check_dask_address(address: str) -> None:
    match = _DASK_ADDRESS.match(address)
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ValueError(
            f"--dask_client_address {address!r} is not a Dask scheduler address; expected "
            "[tcp://]HOST:PORT, for example tcp://127.0.0.1:8786"
        )


def resolve_runner_aliases(argv: Sequence[str]) -> list[str]:
    """Expands ``--runner`` short names and checks the options that go with the runner.

    Args:
        argv: Command-line arguments, Beam pipeline options included.

    Returns:
        ``argv`` with any ``--runner`` name from ``RUNNER_ALIASES`` replaced by its class path.

    Raises:
        ValueError: ``--runner`` has no value; a ``--dask_*`` option is given for a runner
            other than the DaskRunner; ``--dask_client_address`` is not ``[tcp://]HOST:PORT``;
            or it is given together with ``--dask_scheduler_file``.
    """
    out: list[str] = []
    expand_next = False
    for arg in argv:
        if expand_next:
            out.append(RUNNER_ALIASES.get(arg, arg))
            expand_next = False
        elif arg == "--runner":
            out.append(arg)
            expand_next = True
        elif arg.startswith("--runner="):
            name = arg.split("=", 1)[1]
            out.append(f"--runner={RUNNER_ALIASES.get(name, name)}")
        else:
            out.append(arg)
    runners = _flag_values(out, "--runner")
    runner = runners[-1] if runners else "DirectRunner"
    dask_flags = [
        flag for flag in _DASK_FLAGS if any(a == flag or a.startswith(flag + "=") for a in out)
    ]
    if dask_flags and runner != DASK_RUNNER:
        raise ValueError(
            f"{', '.join(dask_flags)} can only be used with --runner DaskRunner, but the "
            f"runner is {runner!r}"
        )
    addresses = _flag_values(out, "--dask_client_address")
    for address in addresses:
        _check_dask_address(address)
    if addresses and _flag_values(out, "--dask_scheduler_file"):
        raise ValueError(
            "--dask_client_address and --dask_scheduler_file both name the scheduler; give one"
        )
    return out
