"""Progress of the image step while the pipeline runs: a bar on a terminal, log lines elsewhere.

The image step reports every image it prepares or rejects to a ``ProgressReporter`` of its own
process. Where the workers run in the launching process (the DirectRunner's default modes) and
standard error is a terminal, that is a tqdm bar the launcher closes at the end. Everywhere else
(a pipe, a CI log, Dataflow or Dask workers) each process logs a line every ``interval_s``
seconds with its own counts and rate, so worker logs show that work is moving.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

__all__ = ["ProgressSpec", "ProgressReporter", "reporter_for", "close_reporter"]

_log = logging.getLogger(__name__)
MODES = ("bar", "log", "off")


@dataclasses.dataclass(frozen=True)
class ProgressSpec:
    """How a run shows progress; pickled with the image step to every worker.

    Attributes:
      run_id: identifies the run, so that each run in one process gets its own counts.
      mode: ``bar`` (tqdm on standard error), ``log`` (a log line every ``interval_s``) or
        ``off``.
      interval_s: seconds between log lines (and at most between bar refreshes).
    """

    run_id: str
    mode: str = "log"
    interval_s: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"progress mode must be one of {MODES}, got {self.mode!r}")
        if not self.interval_s > 0:
            raise ValueError(f"progress interval_s must be > 0, got {self.interval_s!r}")


class ProgressReporter:
    """Counts prepared and rejected images in one process and shows them (thread-safe)."""

    def __init__(self, spec: ProgressSpec) -> None:
        self._spec = spec
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last_log = self._start
        self.prepared = 0
        self.rejected = 0
        self._bar = None
        if spec.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                desc="images",
                unit=" img",
                dynamic_ncols=True,
                mininterval=0.5,
                maxinterval=spec.interval_s,
            )

    def set_total(self, total: int) -> None:
        """Gives the bar the number of images to expect: it then shows a percentage and the
        time left. Log lines are per process, and a worker's share is not known: no change."""
        with self._lock:
            if self._bar is not None and self._bar.total != total:
                self._bar.total = total
                self._bar.refresh()

    def add(self, *, prepared: int = 0, rejected: int = 0) -> None:
        """Counts images the image step has finished with."""
        if self._spec.mode == "off":
            return
        with self._lock:
            self.prepared += prepared
            self.rejected += rejected
            if self._bar is not None:
                self._bar.set_postfix_str(f"rejected {self.rejected}", refresh=False)
                self._bar.update(prepared + rejected)
                return
            now = time.monotonic()
            if now - self._last_log >= self._spec.interval_s:
                self._last_log = now
                _log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        """``images 1200 (150.0/s), rejected 3, 8 s`` for this process so far."""
        elapsed = max((now or time.monotonic()) - self._start, 1e-9)
        done = self.prepared + self.rejected
        return f"images {done} ({done / elapsed:.1f}/s), rejected {self.rejected}, {elapsed:.0f} s"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


_REPORTERS: dict[str, ProgressReporter] = {}
_REPORTERS_LOCK = threading.Lock()


def reporter_for(spec: ProgressSpec) -> ProgressReporter:
    """This process's reporter for the run ``spec`` names (made on first use)."""
    with _REPORTERS_LOCK:
        reporter = _REPORTERS.get(spec.run_id)
        if reporter is None:
            reporter = _REPORTERS[spec.run_id] = ProgressReporter(spec)
        return reporter


def close_reporter(run_id: str) -> None:
    """Closes this process's reporter of a run, if the run made one here (ends a bar)."""
    with _REPORTERS_LOCK:
        reporter = _REPORTERS.pop(run_id, None)
    if reporter is not None:
        reporter.close()
