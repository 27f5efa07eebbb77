"""Which split each example goes to: by content hash, optionally stratified by class.

Both ways are functions of the examples' content hashes (and classes) only, so every runner
and every rerun puts each example in the same split, whatever order workers see the data.

* Plain (``assign_split``): an example is in ``validation`` when its split value (bits 64-127
  of its SHA-256, as a fraction in [0, 1)) is below ``validation_fraction``. Each class gets
  *about* that share; a small class may get none or many.
* Stratified (``--stratify_validation``): each class with ``n`` distinct examples puts the
  ``k = min(floor(f * n + 1/2), n - 1)`` with the smallest split values in ``validation``, so
  every class gets its share, rounded, and keeps at least one training example. This needs
  every class's split values before any example can be placed: records wait for that (a side
  input), as they do for shard counts planned from ``--target_shard_mb``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import apache_beam as beam

from beam_pipelines.elements import PreparedRecord
from beam_pipelines.shards import TRAIN, VALIDATION, assign_split

__all__ = [
    "split_value",
    "stratified_cutoff",
    "assign_split_stratified",
    "AssignSplits",
]


def split_value(sha256: str) -> float:
    """The fraction in [0, 1) that places an example: bits 64-127 of its content hash."""
    return int(sha256[16:32], 16) / float(1 << 64)


def stratified_cutoff(values: Iterable[float], validation_fraction: float) -> float:
    """The largest split value of a class that goes to ``validation`` (-1.0 when none does).

    Args:
      values: the split values of the class's examples (duplicates count once).
      validation_fraction: the wanted share in [0, 1).

    Raises:
      ValueError: if ``validation_fraction`` is not in [0, 1).
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    ordered = sorted(set(values))
    k = min(math.floor(validation_fraction * len(ordered) + 0.5), len(ordered) - 1)
    return ordered[k - 1] if k > 0 else -1.0


def assign_split_stratified(sha256: str, label: int, cutoffs: Mapping[int, float]) -> str:
    """``validation`` if the example's split value is within its class's cutoff, else ``train``.

    Raises:
      ValueError: if ``cutoffs`` has no entry for ``label``.
    """
    try:
        cutoff = cutoffs[label]
    except KeyError:
        raise ValueError(
            f"no stratified cutoff for label {label} (example {sha256}); the cutoffs name only "
            f"{sorted(cutoffs)}"
        ) from None
    return VALIDATION if split_value(sha256) <= cutoff else TRAIN


def _label(record: PreparedRecord) -> int:
    if record.meta is None:
        raise ValueError(f"{record.uri}: a stratified split needs the record's class (meta)")
    return record.meta.label


class AssignSplits(beam.PTransform):
    """``PreparedRecord -> (split, PreparedRecord)``.

    Args:
      validation_fraction: share of examples in ``validation`` (0 puts all in ``train``).
      stratify: give every class its share (see the module docstring).
    """

    def __init__(self, validation_fraction: float, *, stratify: bool = False) -> None:
        super().__init__()
        self._fraction = validation_fraction
        self._stratify = stratify and validation_fraction > 0

    def expand(self, records):
        fraction = self._fraction
        if not self._stratify:
            return records | "BySplitValue" >> beam.Map(
                lambda record: (assign_split(record.sha256, fraction), record)
            )
        cutoffs = (
            records
            | "ClassAndValue" >> beam.Map(lambda r: (_label(r), split_value(r.sha256)))
            # (label, split value)
            | "GroupByClass" >> beam.GroupByKey()
            # (label, [split value])
            | "Cutoff" >> beam.MapTuple(lambda label, vs: (label, stratified_cutoff(vs, fraction)))
            | "CutoffsToDict" >> beam.combiners.ToDict()
            # {label: cutoff}, one element
        )
        return records | "ByClassCutoff" >> beam.Map(
            lambda record, cuts: (
                assign_split_stratified(record.sha256, _label(record), cuts),
                record,
            ),
            beam.pvalue.AsSingleton(cutoffs),
        )
