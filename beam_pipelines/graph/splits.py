"""Which split each example goes to: by content hash, and so never moved by other examples.

Every rule here is a function of the examples' content hashes (and classes) only, so every
runner and every rerun puts each example in the same split, whatever order workers see the data.

* By split value (``assign_split``), the default with or without ``--stratify_validation``: an
  example is in ``validation`` when its split value (bits 64-127 of its SHA-256, as a fraction
  in [0, 1)) is below ``validation_fraction``. Adding or removing images never moves another
  example between train and validation, in a clean build or a ``--base`` one. Each class gets
  *about* that share: a class of ``n`` holds ``f * n`` validation examples on average, give or
  take ``sqrt(n * f * (1 - f))`` (a class of 20 at 10 %: 2, often 1 to 3; a small class may get
  none).
* Exact shares (``AssignSplits(exact_shares=True)``): each class with ``n`` distinct examples
  puts the ``k = min(floor(f * n + 1/2), n - 1)`` with the smallest split values in
  ``validation``, so every class gets its share, rounded, and keeps at least one training
  example. No rule can give exact shares and also leave every example where it was when
  images are added or removed (the cutoff moves with ``n``), so stability wins: this rule is
  not what ``--stratify_validation`` runs. Classes are counted as the shard writer will write
  them: byte-identical copies once, under the class of the copy kept (none for a label
  conflict under ``drop_both``), and all copies of a label conflict go to the split of the
  first copy's class, so that the shard writer meets them together. This needs every class's
  split values before any example can be placed: records wait for that (a side input), as
  they do for shard counts planned from ``--target_shard_mb``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import apache_beam as beam

from beam_pipelines.elements import PreparedRecord
from beam_pipelines.output.shards import TRAIN, VALIDATION, assign_split

__all__ = [
    "split_value",
    "stratified_cutoff",
    "kept_class",
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


def kept_class(
    sha256: str, copies: Iterable[tuple[str, int]], label_conflicts: str
) -> list[tuple[int, float]]:
    """``[(label, split value)]`` of the copy of some content the shard writer keeps, if any.

    Args:
      sha256: the content hash.
      copies: ``(uri, label)`` of every input with that content.
      label_conflicts: the policy (``shards.dedupe_sorted``): the first copy in URI order is
        kept, except that ``drop_both`` keeps none of copies under different classes.
    """
    ordered = sorted(copies)
    labels = {label for _, label in ordered}
    if label_conflicts == "drop_both" and len(labels) > 1:
        return []
    return [(ordered[0][1], split_value(sha256))]


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


def _conflict_owner(sha256: str, copies: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    ordered = sorted(copies)
    if len({label for _, label in ordered}) > 1:
        return [(sha256, ordered[0][1])]
    return []


class AssignSplits(beam.PTransform):
    """``PreparedRecord -> (split, PreparedRecord)``.

    Args:
      validation_fraction: share of examples in ``validation`` (0 puts all in ``train``).
      stratify: ``--stratify_validation``; places examples by their split value, as without it,
        unless ``exact_shares`` (see the module docstring: stability wins).
      label_conflicts: the shard writer's policy, so classes are counted as they are written.
      exact_shares: with ``stratify``, give every class exactly its rounded share, at the cost
        of moving examples when images are added or removed.
    """

    def __init__(
        self,
        validation_fraction: float,
        *,
        stratify: bool = False,
        label_conflicts: str = "keep_first",
        exact_shares: bool = False,
    ) -> None:
        super().__init__()
        self._fraction = validation_fraction
        self._stratify = stratify and exact_shares and validation_fraction > 0
        self._label_conflicts = label_conflicts

    def expand(self, records):
        fraction = self._fraction
        if not self._stratify:
            return records | "BySplitValue" >> beam.Map(
                lambda record: (assign_split(record.sha256, fraction), record)
            )
        policy = self._label_conflicts
        by_content = (
            records
            | "KeyByContent" >> beam.Map(lambda r: (r.sha256, (r.uri, _label(r))))
            | "GroupByContent" >> beam.GroupByKey()
            # (sha256, [(uri, label)])
        )
        cutoffs = (
            by_content
            | "KeptClass" >> beam.FlatMapTuple(lambda sha, copies: kept_class(sha, copies, policy))
            # (label, split value)
            | "GroupByClass" >> beam.GroupByKey()
            # (label, [split value])
            | "Cutoff" >> beam.MapTuple(lambda label, vs: (label, stratified_cutoff(vs, fraction)))
            | "CutoffsToDict" >> beam.combiners.ToDict()
            # {label: cutoff}, one element
        )
        # Copies of one content under several classes (rare) all follow the first one's class.
        owners = (
            by_content
            | "ConflictOwner" >> beam.FlatMapTuple(_conflict_owner)
            # (sha256, label)
            | "OwnersToDict" >> beam.combiners.ToDict()
        )
        return records | "ByClassCutoff" >> beam.Map(
            lambda record, cuts, owner: (
                assign_split_stratified(
                    record.sha256, owner.get(record.sha256, _label(record)), cuts
                ),
                record,
            ),
            beam.pvalue.AsSingleton(cutoffs),
            beam.pvalue.AsSingleton(owners),
        )
