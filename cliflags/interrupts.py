"""Ctrl-C, SIGTERM and a closed pipe as users expect them, for every command.

A command run inside ``catch_interrupts`` turns SIGINT (Ctrl-C) and SIGTERM into an
``Interrupted`` exception in its main thread, remembers which signal came, and stops logging
and stops printing other threads' failures (whatever a library logs or its threads raise while
it unwinds is noise after the user asked to stop). The command
then prints one line saying what it kept and how to continue, and exits ``128 + signal``: 130
for SIGINT, 143 for SIGTERM, as a shell reports a process the signal ended. Libraries may wrap
the exception on its way up (Beam re-raises a step's ``KeyboardInterrupt`` as a
``RuntimeError``), so the command asks ``Caught.signum`` rather than trusting the type it sees.

``run_command`` does all of this for a tool whose only state is its output, and also ends a
tool whose reader went away (``tool | head``) quietly with 141 (``128 + SIGPIPE``), not with a
``BrokenPipeError`` traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = [
    "BROKEN_PIPE",
    "Caught",
    "Interrupted",
    "catch_interrupts",
    "exit_status",
    "run_command",
    "signal_name",
]

BROKEN_PIPE = 128 + 13  # what a shell reports for a process ended by SIGPIPE
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; a ``KeyboardInterrupt``, so code that lets Ctrl-C through
    (the pipeline's per-image error policy) lets this through too.

    Attributes:
      signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


def signal_name(signum: int) -> str:
    """How a message names the signal: ``Ctrl-C (SIGINT)`` or ``SIGTERM``."""
    if signum == signal.SIGINT:
        return "Ctrl-C (SIGINT)"
    return signal.Signals(signum).name


def exit_status(signum: int) -> int:
    """The exit status after stopping for ``signum``: ``128 + signum`` (130, 143)."""
    return 128 + signum


@dataclasses.dataclass
class Caught:
    """Which signal stopped the command (None while none has come).

    Attributes:
      signum: the first SIGINT or SIGTERM received, or None.
    """

    signum: int | None = None

    @property
    def exit_status(self) -> int:
        """``128 + signum``.

        Raises:
          ValueError: if no signal was caught.
        """
        if self.signum is None:
            raise ValueError("no signal was caught: there is no interrupted exit status")
        return exit_status(self.signum)


class _QuietAfterSignal(logging.Filter):
    def __init__(self, caught: Caught) -> None:
        super().__init__()
        self._caught = caught

    def filter(self, record: logging.LogRecord) -> bool:
        return self._caught.signum is None


@contextlib.contextmanager
def catch_interrupts() -> Iterator[Caught]:
    """Turns SIGINT and SIGTERM into ``Interrupted`` in the main thread while the block runs.

    The first signal is recorded in the ``Caught`` this yields and silences every log handler
    of the root logger; later ones raise again (a second Ctrl-C still stops a slow clean-up).
    Outside the main thread (where Python allows no handler) nothing is installed. The previous
    handlers and logging are restored on exit.
    """
    caught = Caught()
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum: int, frame: object) -> None:
        if caught.signum is None:
            caught.signum = signum
        raise Interrupted(signum)

    def thread_failed(args: threading.ExceptHookArgs) -> None:
        # A library's threads fail as it unwinds (a closed channel, a stopped worker).
        if caught.signum is None:
            previous_hook(args)

    quiet = _QuietAfterSignal(caught)
    handlers = list(logging.getLogger().handlers)
    for h in handlers:
        h.addFilter(quiet)
    previous_hook, threading.excepthook = threading.excepthook, thread_failed
    previous = {s: signal.signal(s, handler) for s in _SIGNALS}
    try:
        yield caught
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        threading.excepthook = previous_hook
        for h in handlers:
            h.removeFilter(quiet)


def _close_stdout_quietly() -> None:
    # Python flushes stdout again at exit, which would raise once more: point it at devnull.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def run_command(
    body: Callable[[], int], *, on_interrupt: Callable[[int], str] | None = None
) -> int:
    """Runs a command's ``body`` and returns its exit status, ending it as users expect.

    Args:
      body: the command's work; returns its exit status.
      on_interrupt: the one line to print (to standard error) when SIGINT or SIGTERM stopped
        ``body``, given the signal's number. Default: ``interrupted by <signal>; nothing to
        keep, run the command again``.

    Returns:
      ``body``'s status; ``128 + signal`` (130, 143) after a signal; 141 when standard output
      was closed by its reader.
    """
    with catch_interrupts() as caught:
        try:
            status = body()
            sys.stdout.flush()  # a closed pipe shows up here, not at exit
            return status
        except BrokenPipeError:
            _close_stdout_quietly()
            return BROKEN_PIPE
        except KeyboardInterrupt:
            signum = caught.signum if caught.signum is not None else signal.SIGINT
            line = (
                on_interrupt(signum)
                if on_interrupt
                else f"interrupted by {signal_name(signum)}; nothing was changed"
            )
            print(line, file=sys.stderr)
            return exit_status(signum)
