"""Ctrl-C and SIGTERM in the pipeline command: the line it prints, and what it names.

The command catches SIGINT and SIGTERM in the launching process (``cliflags.interrupts``) and
unwinds the runner, which stops its workers; nothing is published, and what was staged stays for
``--resume``. The workers themselves never act on a terminal's Ctrl-C: the in-process runner
starts its ``multi_processing`` workers with SIGINT ignored
(``beam_pipelines.engines.runners.SHIELDED_SDK_WORKER``), the Flink and Spark runners start
theirs and their job servers in process groups of their own (``beam_pipelines.engines.portable``).
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.engines.filesystems import read_object
from beam_pipelines.graph.plan import plan_path
from beam_pipelines.output.catalog_io import STAGING_DIR
from beam_pipelines.output.staging import DEFAULT_FILE_BYTES, DEFAULT_FILE_SECONDS, list_sidecars
from cliflags import command_name
from cliflags.interrupts import signal_name

__all__ = ["interrupted_line", "kept_in_staging"]


# Past this many committed staging files the line gives their count only: reading every
# sidecar of a large build on a bucket would keep the user waiting after Ctrl-C.
_SIDECARS_COUNTED = 200


def kept_in_staging(output: str, staging: str) -> str:
    """What an interrupted build's staging area holds that ``--resume`` reuses, in words.

    Only committed staging files count (those with a sidecar): an image prepared into a file
    not yet committed is lost with the process, and is prepared again.
    """
    sidecars = list_sidecars(output)
    if not sidecars:
        plan = "reuses the shard plan" if FileSystems.exists(plan_path(output)) else "starts over"
        return (
            f"no prepared image was kept yet in {staging} (staged files are committed every "
            f"{DEFAULT_FILE_SECONDS:g} s or --staging_file_mb MiB, {DEFAULT_FILE_BYTES // 2**20} "
            f"by default; --resume {plan})"
        )
    if len(sidecars) > _SIDECARS_COUNTED:
        return f"{len(sidecars)} committed staging files of prepared images are kept in {staging}"
    images = 0
    for path in sidecars:
        try:
            images += len(json.loads(read_object(path).decode("utf-8"))["records"])
        except (OSError, ValueError, KeyError):
            continue  # a sidecar being written as the signal came: counted by --resume, not here
    return f"{images} prepared image{' is' if images == 1 else 's are'} kept in {staging}"


def interrupted_line(signum: int, output: str | None, argv: Sequence[str]) -> str:
    """The one line the command prints when a signal stopped it: what was kept, and the
    command that continues the build (``--resume``)."""
    stopped = f"interrupted by {signal_name(signum)}"
    if not output:
        return f"{stopped}; nothing was written"
    output = output if "://" in output else os.path.abspath(output)
    staging = FileSystems.join(output, STAGING_DIR)
    if not FileSystems.exists(staging):
        return f"{stopped} before any image was prepared; nothing was written to {output}"
    resume = [token for token in argv if token != "--resume"] + ["--resume"]
    command = f"{command_name('beam_pipelines.images_to_tfrecord')} {shlex.join(resume)}"
    return (
        f"{stopped}; nothing new was published; {kept_in_staging(output, staging)}: continue "
        f"with {command}"
    )
