"""The tf.data service processes: ``python -m tfrecord_io.service dispatcher|worker``.

``dispatcher --port P [--work_dir DIR]`` runs the dispatcher, which registers datasets,
creates jobs and hands out shards. Given a ``work_dir`` it runs in fault-tolerant mode: it
journals its state there, so a dispatcher restarted with the same ``work_dir`` and port
recovers its datasets, jobs and workers, and trainers reconnect without restarting.

``worker --dispatcher HOST:P [--port Q]`` runs a worker, which runs the input pipelines the
dispatcher assigns it and streams their elements to the trainers.

Both log what they serve when they start and when it changes (workers registered, tasks
running), and stop cleanly on SIGTERM or SIGINT (Ctrl-C): the server is stopped, one line says
so, what was kept (the dispatcher's journal in its ``work_dir``) and how to continue (rerun the
same command), and the process exits 143 (SIGTERM) or 130 (SIGINT), as a shell reports a process
the signal ended. If stopping takes longer than ``--stop_timeout_s`` (a worker winds down each
running task first), the process dumps its stacks to the log and exits 1.

Jobs whose consumers have gone keep their tasks running on the workers until the dispatcher
collects them (``--job_gc_timeout_ms``, checked every ``--job_gc_check_interval_ms``; by
default 5 and 10 minutes). tf.data never collects dynamic-sharding jobs unless told to, so
this dispatcher turns ``gc_dynamic_sharding_jobs`` on (``--no-gc_dynamic_sharding_jobs`` to
keep tf.data's behaviour): otherwise every abandoned endless training job runs forever.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cliflags import (
    StrictArgumentParser,
    add_dataclass_flags,
    command_name,
    flag_values,
    quiet_tensorflow,
)
from cliflags.interrupts import exit_status, signal_name
from tfrecord_io.service.client import ServiceAddress

__all__ = [
    "DEFAULT_STOP_TIMEOUT_S",
    "DispatcherSettings",
    "StopRequest",
    "WorkerSettings",
    "command_line_parser",
    "serve_dispatcher",
    "serve_worker",
    "main",
]

_LOG = logging.getLogger("tfrecord_io.service")
_POLL_SECONDS = 1.0
# Below Kubernetes' default 30 s grace period, so the exit is ours and logged.
DEFAULT_STOP_TIMEOUT_S = 25.0


def _check_optional_ms(name: str, value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be None or an int >= 1 (milliseconds), got {value!r}")


def _check_stop_timeout(value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"stop_timeout_s must be a number > 0 (seconds), got {value!r}")


def _check_port(name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 65536:
        raise ValueError(f"{name} must be an int in 0..65535 (0 picks a free port), got {value!r}")


@dataclasses.dataclass(frozen=True)
class DispatcherSettings:
    """How to run a dispatcher.

    Attributes:
      port: port to listen on; 0 picks a free one (logged).
      work_dir: directory or URI for the dispatcher's journal. Given one, the dispatcher runs
        in fault-tolerant mode and recovers its state from it on restart.
      job_gc_timeout_ms: how long a job with no consumer is kept (its tasks keep running on
        the workers until then), which is also how long a restarted trainer has to rejoin
        its job. None keeps tf.data's default (5 minutes).
      job_gc_check_interval_ms: how often the dispatcher looks for such jobs, and for
        silent workers. None keeps tf.data's default (10 minutes).
      gc_dynamic_sharding_jobs: also collect dynamic-sharding jobs (every job this project
        creates). tf.data keeps them forever by default, so each abandoned endless training
        job would keep running on the workers, holding memory and slowing their shutdown.
        The price: a trainer that returns after its job was collected starts a fresh job.
      client_timeout_ms: how long a consumer may go silent (a crashed trainer) before it is
        released from its job. None keeps tf.data's default.
      worker_timeout_ms: how long a silent worker may go before the dispatcher logs it as
        lost. tf.data 2.21 does not hand a lost worker's job tasks to others: a replacement
        worker started on the same address takes them over. None keeps tf.data's default.
      stop_timeout_s: how long SIGTERM waits for the server to stop before exiting anyway.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    port: int
    work_dir: str | None = None
    job_gc_timeout_ms: int | None = None
    job_gc_check_interval_ms: int | None = None
    gc_dynamic_sharding_jobs: bool = True
    client_timeout_ms: int | None = None
    worker_timeout_ms: int | None = None
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_port("port", self.port)
        if self.work_dir is not None and (not isinstance(self.work_dir, str) or not self.work_dir):
            raise ValueError(f"work_dir must be None or a non-empty path, got {self.work_dir!r}")
        _check_optional_ms("job_gc_timeout_ms", self.job_gc_timeout_ms)
        _check_optional_ms("job_gc_check_interval_ms", self.job_gc_check_interval_ms)
        if not isinstance(self.gc_dynamic_sharding_jobs, bool):
            raise ValueError(
                f"gc_dynamic_sharding_jobs must be a bool, got {self.gc_dynamic_sharding_jobs!r}"
            )
        _check_optional_ms("client_timeout_ms", self.client_timeout_ms)
        _check_optional_ms("worker_timeout_ms", self.worker_timeout_ms)
        _check_stop_timeout(self.stop_timeout_s)

    @property
    def fault_tolerant(self) -> bool:
        return self.work_dir is not None


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    """How to run a worker.

    Attributes:
      dispatcher: the dispatcher, ``"host:port"`` or ``"grpc://host:port"``.
      port: port to listen on; 0 picks a free one (logged).
      worker_address: the address trainers and the dispatcher use to reach this worker, with
        ``%port%`` standing for the bound port. The default, ``localhost:%port%``, only works
        when trainers run on the same host; give a routable name otherwise.
      heartbeat_interval_ms: how often the worker reports to the dispatcher. None keeps
        tf.data's default.
      dispatcher_timeout_ms: how long the worker retries an unreachable dispatcher before
        failing a request. None keeps tf.data's default.
      stop_timeout_s: how long SIGTERM waits for the server to stop before exiting anyway.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    dispatcher: str
    port: int = 0
    worker_address: str = "localhost:%port%"
    heartbeat_interval_ms: int | None = None
    dispatcher_timeout_ms: int | None = None
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S

    def __post_init__(self) -> None:
        address = ServiceAddress.parse(self.dispatcher)
        object.__setattr__(self, "dispatcher", address.host_port)
        _check_port("port", self.port)
        if not isinstance(self.worker_address, str) or ":" not in self.worker_address:
            raise ValueError(
                f"worker_address must be 'host:port' or 'host:%port%', got {self.worker_address!r}"
            )
        _check_optional_ms("heartbeat_interval_ms", self.heartbeat_interval_ms)
        _check_optional_ms("dispatcher_timeout_ms", self.dispatcher_timeout_ms)
        _check_stop_timeout(self.stop_timeout_s)


class StopRequest(threading.Event):
    """A request to stop serving: set by SIGTERM or SIGINT, which it records, or by code.

    Attributes:
      signum: the first signal that asked to stop, or None (not set, or set by code).
    """

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None


class _Server(Protocol):
    def stop(self) -> None: ...


def _serve(
    role: str,
    server: _Server,
    describe_state: Callable[[], str],
    stop_event: threading.Event,
    stop_timeout_s: float,
    kept: Callable[[], str],
) -> int:
    """Keeps ``server`` up until ``stop_event`` is set, logging changes of its state.

    Args:
      kept: after a signal, the end of the one line the stop logs: what was kept and how to
        continue.

    Returns:
      ``128 + signal`` (130, 143) once the server has stopped after SIGINT or SIGTERM (a
      ``StopRequest`` that recorded one); 0 after a stop asked for by code. If stopping takes
      over ``stop_timeout_s``, the process exits with status 1 instead of returning.
    """
    state = describe_state()
    _LOG.info("tf.data service %s: %s", role, state)
    while not stop_event.wait(_POLL_SECONDS):
        latest = describe_state()
        if latest != state:
            state = latest
            _LOG.info("tf.data service %s: %s", role, state)
    # tf.data's stop() holds the GIL while each task winds down, so no Python timer or signal
    # handler can run until it returns: the deadline is faulthandler's C watchdog thread, which
    # dumps the stacks to the log ("Timeout (0:00:25)!") and exits with status 1.
    faulthandler.dump_traceback_later(stop_timeout_s, exit=True, file=sys.stderr)
    server.stop()
    faulthandler.cancel_dump_traceback_later()
    signum = stop_event.signum if isinstance(stop_event, StopRequest) else None
    if signum is None:
        _LOG.info("tf.data service %s stopped cleanly (%s)", role, state)
        return 0
    # The one line a signal gives: nothing is logged between the signal and it.
    _LOG.info(
        "tf.data service %s stopped cleanly after %s, with %s; %s",
        role,
        signal_name(signum),
        state,
        kept(),
    )
    return exit_status(signum)


def _install_stop_handlers() -> StopRequest:
    """Turns SIGTERM and SIGINT into a stop request the serving loop sees at once."""
    stop_event = StopRequest()

    def _request_stop(signum: int, _frame: Any) -> None:
        if stop_event.signum is None:
            stop_event.signum = signum
        stop_event.set()

    signal.signal(signal.SIGTERM, _request_stop)
    signal.signal(signal.SIGINT, _request_stop)
    return stop_event


def _bound_port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def _rerun(asked_port: int, port: int) -> str:
    """How to start the same server again: on the port it had (a restart recovers or takes
    over only there), which a rerun of ``--port 0`` would not get back."""
    return "rerun the same command" if asked_port == port else f"rerun it with --port {port}"


def serve_dispatcher(settings: DispatcherSettings, stop_event: threading.Event) -> int:
    """Runs a dispatcher until ``stop_event`` is set.

    Returns:
      The process exit status: 130 or 143 after SIGINT or SIGTERM, 0 after a stop asked for
      by code.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import service_config_pb2

    if settings.work_dir is not None:
        tf.io.gfile.makedirs(settings.work_dir)
    # DispatchServer takes the config proto as well as the Python tuple; only the proto has
    # gc_dynamic_sharding_jobs and client_timeout_ms. 0 means "tf.data's default".
    config = service_config_pb2.DispatcherConfig(
        port=settings.port,
        protocol="grpc",
        work_dir=settings.work_dir or "",
        fault_tolerant_mode=settings.fault_tolerant,
        job_gc_check_interval_ms=settings.job_gc_check_interval_ms or 0,
        job_gc_timeout_ms=settings.job_gc_timeout_ms or 0,
        gc_dynamic_sharding_jobs=settings.gc_dynamic_sharding_jobs,
        client_timeout_ms=settings.client_timeout_ms or 0,
        worker_timeout_ms=settings.worker_timeout_ms or 0,
    )
    server = tf.data.experimental.service.DispatchServer(config)
    port = _bound_port(server.target)
    _LOG.info(
        "tf.data service dispatcher serving at grpc://%s:%d (pid %d, port %d, mode %s, "
        "work_dir %s, job_gc_timeout_ms %s, job_gc_check_interval_ms %s, "
        "gc_dynamic_sharding_jobs %s, client_timeout_ms %s, worker_timeout_ms %s)",
        _host_name(),
        port,
        os.getpid(),
        port,
        "fault-tolerant" if settings.fault_tolerant else "in-memory (state lost on restart)",
        settings.work_dir or "-",
        settings.job_gc_timeout_ms or "default",
        settings.job_gc_check_interval_ms or "default",
        settings.gc_dynamic_sharding_jobs,
        settings.client_timeout_ms or "default",
        settings.worker_timeout_ms or "default",
    )

    def describe_state() -> str:
        # A private accessor, but the only way to see registrations from Python.
        return f"{server._num_workers()} worker(s) registered"

    def kept() -> str:
        rerun = _rerun(settings.port, port)
        if settings.work_dir is None:
            return (
                "nothing was kept (without --work_dir its datasets and jobs were in memory): "
                f"{rerun} to serve again"
            )
        return (
            f"its journal in {settings.work_dir} is kept: {rerun} to recover its datasets, "
            "jobs and workers"
        )

    return _serve("dispatcher", server, describe_state, stop_event, settings.stop_timeout_s, kept)


def serve_worker(settings: WorkerSettings, stop_event: threading.Event) -> int:
    """Runs a worker until ``stop_event`` is set.

    Returns:
      The process exit status: 130 or 143 after SIGINT or SIGTERM, 0 after a stop asked for
      by code.
    """
    import tensorflow as tf

    service = tf.data.experimental.service
    server = service.WorkerServer(
        service.WorkerConfig(
            dispatcher_address=settings.dispatcher,
            worker_address=settings.worker_address,
            port=settings.port,
            protocol="grpc",
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            dispatcher_timeout_ms=settings.dispatcher_timeout_ms,
        )
    )
    port = _bound_port(server._address)
    _LOG.info(
        "tf.data service worker serving at %s (pid %d, port %d) for dispatcher grpc://%s",
        settings.worker_address.replace("%port%", str(port)),
        os.getpid(),
        port,
        settings.dispatcher,
    )

    def describe_state() -> str:
        return f"{server._num_tasks()} task(s) running"

    def kept() -> str:
        return (
            "nothing was kept (a worker holds no state): "
            f"{_rerun(settings.port, port)} to serve its dispatcher again at the same address"
        )

    return _serve("worker", server, describe_state, stop_event, settings.stop_timeout_s, kept)


def _host_name() -> str:
    import socket

    return socket.gethostname() or "localhost"


def command_line_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m tfrecord_io.service``: one subcommand per role, whose flags
    are the fields of its settings dataclass."""
    parser = StrictArgumentParser(
        prog=command_name("tfrecord_io.service"),
        description="Run a tf.data service dispatcher or worker.",
    )
    roles = parser.add_subparsers(dest="role", required=True, metavar="{dispatcher,worker}")
    # Each flag's help is its field's line in the settings' Attributes section; the values are
    # checked once, by the dataclass (main), not by argparse.
    add_dataclass_flags(
        roles.add_parser("dispatcher", help="run the dispatcher"), DispatcherSettings
    )
    add_dataclass_flags(roles.add_parser("worker", help="run a worker"), WorkerSettings)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m tfrecord_io.service``.

    Returns:
      The process exit status.
    """
    quiet_tensorflow()
    parser = command_line_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )
    try:
        role = DispatcherSettings if args.role == "dispatcher" else WorkerSettings
        settings: DispatcherSettings | WorkerSettings = role(**flag_values(role, args))
    except ValueError as e:
        parser.error(str(e))
    # Handlers go in before the server starts, so a SIGTERM during start-up is a clean stop.
    stop_event = _install_stop_handlers()
    if isinstance(settings, DispatcherSettings):
        return serve_dispatcher(settings, stop_event)
    return serve_worker(settings, stop_event)
