"""SIGTERM (preemption) and Ctrl-C: finish the step, save, exit.

The handler only sets a flag; the loop checks it after each step. With several workers the
flag goes through the step's all-reduce, so every worker learns that one of them was told to
stop, and all save at the same step (a synchronous save needs every worker). A second Ctrl-C
interrupts at once. The handler logs nothing: the command says in one line, once it has
saved, what it kept and how to continue (``trainer.train``).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["StopSignal"]

_log = logging.getLogger(__name__)


class StopSignal:
    """Catches SIGTERM and SIGINT while active (a context manager).

    Attributes:
      signum: the first signal received, or None.
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self._signals = signals
        self._previous: dict[int, Any] = {}  # what signal.signal returned
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum is None:
            self.signum = signum
            _log.debug("received %s: saving after this step", signal.Signals(signum).name)

    def __enter__(self) -> StopSignal:
        # Signal handlers can only be installed from the main thread; elsewhere (a test
        # harness thread) training simply runs without them.
        if threading.current_thread() is threading.main_thread():
            for s in self._signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, previous in self._previous.items():
            # None: the handler was not installed from Python; the default is the way back.
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        """The shell's convention for death by signal: 128 + signal number."""
        return 128 + (self.signum or signal.SIGTERM)
