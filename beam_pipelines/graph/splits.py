"""Which split each example goes to: by content hash, class quotas, and what a base holds.

Every rule here is a function of the examples' content hashes and classes (and, on a base, of
the split the base gave each example), so every runner and every rerun puts each example in the
same split, whatever order workers see the data. ``dataset.json`` records the rule that placed
the examples as ``options.split_rule`` (``split_rule``).

* ``split_value`` (the default; ``assign_split``): an example is in ``validation`` when its
  split value (bits 64-127 of its SHA-256, as a fraction in [0, 1)) is below
  ``validation_fraction``. Adding or removing images never moves another example between train
  and validation, in a clean build or a ``--base`` one. Each class gets *about* that share: a
  class of ``n`` holds ``f * n`` validation examples on average, give or take
  ``sqrt(n * f * (1 - f))`` (a class of 20 at 10 %: 2, often 1 to 3; a small class may get
  none).
* ``class_quota`` (``--stratify_validation``): each class of ``n`` distinct examples gets the
  validation quota ``k = min(floor(f * n + 1/2), n - 1)``, and its ``k`` examples with the
  smallest split values go to ``validation``: every class gets its share, rounded, and keeps
  at least one training example (a class of 35 at 10 % gets 4). Classes are counted as the
  shard writer will write them: byte-identical copies once, under the class of the copy kept
  (none for a label conflict under ``drop_both``), and all copies of one content go to one
  split, so that the shard writer meets them together. This needs every class's split values
  before any example is placed: records wait for that (a side input).
* ``class_quota_keeping_base`` (``--stratify_validation --base``): examples already in the
  base keep their split, the one the base's catalogs list them under (never re-derived: the
  base may have been placed by another rule or fraction); new examples fill each class's gap
  to its quota, ``max(0, k - validation examples of the class kept from the base)``, ``k``
  counted on the grown class, with the new examples of the smallest split values. Nothing in
  the base ever moves: a class over its quota (examples removed from it since, a base placed
  by split value, a smaller ``--validation_fraction``) stays over it, and one under it reaches
  it only if it has enough new examples. So the result depends on the base, unlike a clean
  build; a build without ``--base`` places every example by the quota again.

An exact share per class and stability are at odds (the cutoff moves with ``n``): a clean
``class_quota`` build of a grown dataset may move examples, which is why a build on a base
keeps the base's splits instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import apache_beam as beam

from beam_pipelines.elements import PreparedRecord
from beam_pipelines.output.shards import TRAIN, VALIDATION, assign_split

__all__ = [
    "QUOTA_RULE",
    "SPLIT_RULES",
    "split_rule",
    "split_value",
    "class_quota",
    "gap_cutoff",
    "stratified_cutoff",
    "kept_class",
    "assign_split_stratified",
    "AssignSplits",
]

#: The validation quota of a class of n distinct examples at --validation_fraction f, as the
#: help, the docs and this module state it (a test holds them and the behaviour to it).
QUOTA_RULE = "k = min(floor(f * n + 1/2), n - 1)"
#: The rules that place examples, as ``dataset.json`` records them (``options.split_rule``).
SPLIT_RULES = ("split_value", "class_quota", "class_quota_keeping_base")


def split_rule(*, stratify: bool, base: bool) -> str:
    """The rule a build places its examples by (one of ``SPLIT_RULES``).

    Args:
      stratify: ``--stratify_validation``.
      base: whether the build is on a ``--base``.
    """
    if not stratify:
        return "split_value"
    return "class_quota_keeping_base" if base else "class_quota"


def split_value(sha256: str) -> float:
    """The fraction in [0, 1) that places an example: bits 64-127 of its content hash."""
    return int(sha256[16:32], 16) / float(1 << 64)


def _check_fraction(validation_fraction: float) -> None:
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(
            f"validation_fraction must be in [0, 1) (--validation_fraction), "
            f"got {validation_fraction!r}"
        )


def class_quota(n: int, validation_fraction: float) -> int:
    """``QUOTA_RULE``: the validation examples a class of ``n`` gets (0 for an empty class).

    Raises:
      ValueError: if ``validation_fraction`` is not in [0, 1) or ``n`` is negative.
    """
    _check_fraction(validation_fraction)
    if n < 0:
        raise ValueError(f"a class holds n >= 0 examples, got {n!r}")
    return max(0, min(math.floor(validation_fraction * n + 0.5), n - 1))


def gap_cutoff(
    new_values: Iterable[float],
    validation_fraction: float,
    *,
    kept_train: int = 0,
    kept_validation: int = 0,
) -> float:
    """The largest split value of a class's new examples that goes to ``validation`` (-1.0
    when none does): the class's gap to its quota, filled by its smallest new values.

    Args:
      new_values: the split values of the class's examples that are not in the base (one per
        distinct example).
      validation_fraction: the wanted share in [0, 1).
      kept_train, kept_validation: the class's examples kept from the base in each split.

    Raises:
      ValueError: if ``validation_fraction`` is not in [0, 1).
    """
    ordered = sorted(new_values)
    n = len(ordered) + kept_train + kept_validation
    gap = min(max(0, class_quota(n, validation_fraction) - kept_validation), len(ordered))
    return ordered[gap - 1] if gap > 0 else -1.0


def stratified_cutoff(values: Iterable[float], validation_fraction: float) -> float:
    """The largest split value of a class that goes to ``validation`` (-1.0 when none does),
    without a base: the ``k`` of ``QUOTA_RULE`` smallest.

    Args:
      values: the split values of the class's examples (duplicates count once).
      validation_fraction: the wanted share in [0, 1).

    Raises:
      ValueError: if ``validation_fraction`` is not in [0, 1).
    """
    return gap_cutoff(set(values), validation_fraction)


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


class _Content(NamedTuple):
    """Every record of one content, the class it counts under and the base's split for it."""

    sha256: str
    records: list[Any]  # PreparedRecord or StagedRecord, every copy
    label: int  # the class of the first copy in URI order
    kept: bool  # whether the shard writer writes a copy (not a conflict under drop_both)
    base_split: str | None  # the split the base lists it in; None when it is new


def _content(
    sha256: str, grouped: Mapping[str, Sequence[Any]], label_conflicts: str
) -> list[_Content]:
    records = list(grouped.get("records", ()))
    if not records:
        return []  # a base example the new build no longer lists
    copies = [(record.uri, _label(record)) for record in records]
    kept = kept_class(sha256, copies, label_conflicts)
    in_base = sorted(set(grouped.get("base", ())))
    if len(in_base) > 1:
        raise ValueError(
            f"--base lists example {sha256} in splits {in_base}: its catalogs contradict "
            "each other; repair the base, or build without --base or --stratify_validation"
        )
    base_split = in_base[0] if in_base else None
    return [_Content(sha256, records, min(copies)[1], bool(kept), base_split)]


def _class_entry(content: _Content) -> list[tuple[int, tuple[float, str | None]]]:
    if not content.kept:
        return []
    return [(content.label, (split_value(content.sha256), content.base_split))]


def _class_cutoff(entries: Iterable[tuple[float, str | None]], fraction: float) -> float:
    new, kept = [], {TRAIN: 0, VALIDATION: 0}
    for value, base_split in entries:
        if base_split is None:
            new.append(value)
        else:
            kept[base_split] = kept.get(base_split, 0) + 1
    return gap_cutoff(new, fraction, kept_train=kept[TRAIN], kept_validation=kept[VALIDATION])


def _place(content: _Content, cutoffs: Mapping[int, float]) -> list[tuple[str, Any]]:
    if content.base_split is not None:
        split = content.base_split
    elif content.kept:
        split = assign_split_stratified(content.sha256, content.label, cutoffs)
    else:  # no copy is written (drop_both): any split that holds all copies together
        cutoff = cutoffs.get(content.label, -1.0)
        split = VALIDATION if split_value(content.sha256) <= cutoff else TRAIN
    return [(split, record) for record in content.records]


class AssignSplits(beam.PTransform):
    """``PreparedRecord`` (or ``StagedRecord``) ``-> (split, record)``, by ``split_rule``.

    Args:
      validation_fraction: share of examples in ``validation`` (0 puts all in ``train``).
      stratify: ``--stratify_validation``: each class gets its quota (``QUOTA_RULE``).
      label_conflicts: the shard writer's policy, so classes are counted as they are written.
      base_splits: with ``stratify``, ``(key, split)`` of every example of the ``--base``
        dataset (``builds.base_splits.ReadBaseSplits``): those examples keep that split and
        new ones fill each class's gap to its quota. None: no base.
    """

    def __init__(
        self,
        validation_fraction: float,
        *,
        stratify: bool = False,
        label_conflicts: str = "keep_first",
        base_splits=None,
    ) -> None:
        super().__init__()
        _check_fraction(validation_fraction)
        self._fraction = validation_fraction
        self._stratify = stratify and validation_fraction > 0
        self._label_conflicts = label_conflicts
        self._base_splits = base_splits

    def expand(self, records):
        fraction = self._fraction
        if not self._stratify:
            return records | "BySplitValue" >> beam.Map(
                lambda record: (assign_split(record.sha256, fraction), record)
            )
        policy = self._label_conflicts
        joined = {"records": records | "KeyByContent" >> beam.Map(lambda r: (r.sha256, r))}
        if self._base_splits is not None:
            joined["base"] = self._base_splits  # (key, split)
        contents = (
            joined
            | "GroupByContent" >> beam.CoGroupByKey()
            # (sha256, {"records": [record], "base": [split]})
            | "Content" >> beam.FlatMapTuple(lambda sha, grouped: _content(sha, grouped, policy))
            # _Content
        )
        cutoffs = (
            contents
            | "KeptClass" >> beam.FlatMap(_class_entry)
            # (label, (split value, base split or None))
            | "GroupByClass" >> beam.GroupByKey()
            | "Cutoff" >> beam.MapTuple(lambda label, vs: (label, _class_cutoff(vs, fraction)))
            | "CutoffsToDict" >> beam.combiners.ToDict()
            # {label: largest split value of a new example in validation}, one element
        )
        return contents | "ByClassQuota" >> beam.FlatMap(_place, beam.pvalue.AsSingleton(cutoffs))
