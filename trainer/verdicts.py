"""The rows ``tfrecord-diagnose`` prints: a check, its status, what it means and the numbers."""

from __future__ import annotations

import dataclasses

__all__ = ["NA", "OK", "WARN", "Series", "Verdict"]

OK, WARN, NA = "OK", "WARN", "n/a"

#: A scalar's points, ``[(step, value), ...]``.
Series = list[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One row of the table.

    Attributes:
      check: which row of the monitoring table.
      status: ``OK``, ``WARN`` or ``n/a``.
      finding: what it means.
      evidence: the numbers.
    """

    check: str
    status: str
    finding: str
    evidence: str
