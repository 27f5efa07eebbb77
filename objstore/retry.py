"""The one retry policy and the one retry loop for every storage call of the project.

The stores (``objstore.stores``, ``objstore.local``), which the pipeline, the reader and the tools
share, and what the pipeline still reads through Beam FileSystems
(``beam_pipelines.engines.filesystems``) run their calls through ``retry_call``, so they retry the
same failures with the same bounded backoff and log each retry the same way.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from objstore.errors import ObjectStoreError, classify, describe

__all__ = ["Failure", "RetryPolicy", "retry_call"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and full jitter.

    Attempt ``n`` (1-based) that fails transiently is followed by a sleep drawn uniformly from
    ``[0, min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))]``.

    Attributes:
      max_attempts: total attempts per call, including the first (>= 1).
      initial_backoff_s: the backoff cap after the first failure.
      max_backoff_s: the largest backoff cap.
      multiplier: growth of the cap per attempt (>= 1).
      timeout_s: per-request connect/read timeout.
    """

    max_attempts: int = 6
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        if not self.initial_backoff_s >= 0:
            raise ValueError(f"initial_backoff_s must be >= 0, got {self.initial_backoff_s!r}")
        if not self.max_backoff_s >= self.initial_backoff_s:
            raise ValueError(
                f"max_backoff_s must be >= initial_backoff_s ({self.initial_backoff_s}), got "
                f"{self.max_backoff_s!r}"
            )
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")

    def backoff_cap(self, attempt: int) -> float:
        """The largest sleep after failed attempt ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))


@dataclasses.dataclass(frozen=True)
class Failure:
    """How a retried call finally failed, for ``retry_call``'s ``on_failure``.

    Attributes:
      exc: the last exception.
      status: its HTTP status, if one was found.
      transient: True if it was transient (so every attempt was used).
      attempts: how many attempts were made.
      elapsed_s: seconds since the first attempt started.
    """

    exc: Exception
    status: int | None
    transient: bool
    attempts: int
    elapsed_s: float


def retry_call(
    fn: Callable[[], _T],
    *,
    policy: RetryPolicy,
    action: str,
    uri: str,
    rng: random.Random | None = None,
    on_failure: Callable[[Failure], BaseException] | None = None,
) -> _T:
    """Runs ``fn`` (one attempt), retrying transient failures as ``policy`` says.

    A permanent failure ends the loop at once; a transient one is retried after a jittered sleep
    until ``policy.max_attempts`` attempts were made. Each retry is logged (redacted) with the
    URI, the action and the error. An ``ObjectStoreError`` raised by ``fn`` is already final and
    passes through untouched.

    Args:
      fn: one attempt.
      policy: how many attempts and how long to wait between them.
      action: what is being done, for messages ("read", "list"…).
      uri: the URI it is done to, for messages.
      rng: draws the jitter (seed it for repeatable sleeps); the ``random`` module by default.
      on_failure: builds the exception to raise from the final failure (raised ``from None``);
        without it the last exception itself is re-raised.

    Returns:
      What ``fn`` returns.

    Raises:
      The exception ``on_failure`` builds, or else the last exception of ``fn``.
    """
    draw = rng.uniform if rng is not None else random.uniform
    started = time.monotonic()
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return fn()
        except ObjectStoreError:
            raise
        except Exception as e:  # classified below; nothing is swallowed
            status, transient = classify(e)
            if not transient or attempt == policy.max_attempts:
                if on_failure is None:
                    raise
                failure = Failure(e, status, transient, attempt, time.monotonic() - started)
                raise on_failure(failure) from None
            delay = draw(0.0, policy.backoff_cap(attempt))
            _log.warning(
                "%s: %s failed (%s); retry %d of %d in %.2fs",
                uri,
                action,
                describe(e),
                attempt,
                policy.max_attempts - 1,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
