"""Ctrl-C and SIGTERM in the pipeline command: workers left to the launcher, and the line it prints.

The command catches SIGINT and SIGTERM in the launching process (``cliflags.interrupts``) and
unwinds the runner, which stops its workers; nothing is published, and what was staged stays for
``--resume``. A terminal sends Ctrl-C's SIGINT to every process of the foreground group, the
DirectRunner's ``multi_processing`` workers included, and each would die printing its own
traceback. ``workers_shielded_from_ctrl_c`` starts those workers with SIGINT ignored (which
``exec`` keeps), so only the launcher acts on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_pipelines.engines.filesystems import read_object
from beam_pipelines.graph.plan import plan_path
from beam_pipelines.output.catalog_io import STAGING_DIR
from beam_pipelines.output.staging import DEFAULT_FILE_BYTES, DEFAULT_FILE_SECONDS, list_sidecars
from cliflags import command_name
from cliflags.interrupts import signal_name

__all__ = ["interrupted_line", "kept_in_staging", "workers_shielded_from_ctrl_c"]


_SIG_IGN = 1
# glibc's struct sigaction (handler, 128-byte mask, flags, restorer) fits in 152 bytes; the
# buffers are larger so that no libc writes past them.
_SIGACTION_BYTES = 256


def _libc_sigaction() -> Any:
    """libc's ``sigaction`` where the layout above holds (Linux with glibc), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.sigaction
    except (OSError, AttributeError):
        return None


class _SpawnIgnoringSigint:
    """Stands in for Beam's ``SUBPROCESS_LOCK``, which it holds around each worker's
    ``Popen``: while held, SIGINT is ignored process-wide, so the worker starts with it ignored.

    An ignored signal stays ignored across ``fork`` and ``exec`` (a mask would not: the
    ``/bin/sh`` Beam starts the worker with clears it), and Python then installs no Ctrl-C
    handler. ``signal.signal`` works only in the main thread and Beam spawns from others, so
    this calls libc's ``sigaction``, and puts the launcher's handler back, as it was, at once:
    a Ctrl-C in those few milliseconds is lost, and the next one counts.
    """

    def __init__(self, lock: Any, sigaction: Any) -> None:
        self.lock = lock
        self._sigaction = sigaction
        self._old = ctypes.create_string_buffer(_SIGACTION_BYTES)
        self._ignore = ctypes.create_string_buffer(_SIGACTION_BYTES)
        ctypes.memmove(
            self._ignore, ctypes.byref(ctypes.c_void_p(_SIG_IGN)), ctypes.sizeof(ctypes.c_void_p)
        )

    def __enter__(self) -> _SpawnIgnoringSigint:
        self.lock.acquire()
        self._ignoring = self._sigaction(signal.SIGINT, self._ignore, self._old) == 0
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._ignoring:
            self._sigaction(signal.SIGINT, self._old, None)
        self.lock.release()


@contextlib.contextmanager
def workers_shielded_from_ctrl_c() -> Iterator[None]:
    """Within the block, Beam's subprocess workers start with SIGINT ignored (on Linux).

    The launcher stops them when it unwinds (closing their control channel), so a Ctrl-C ends
    the run once, with the launcher's one line instead of a traceback per worker.
    """
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    original = worker_handlers.SUBPROCESS_LOCK
    sigaction = _libc_sigaction()
    if sigaction is None or isinstance(original, _SpawnIgnoringSigint):
        yield  # elsewhere (or in a run inside a run) workers see Ctrl-C as before
        return
    worker_handlers.SUBPROCESS_LOCK = _SpawnIgnoringSigint(original, sigaction)  # type: ignore[assignment]  # a stand-in that holds the lock
    try:
        yield
    finally:
        worker_handlers.SUBPROCESS_LOCK = original


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
