"""What verification found: a ``ShardReport`` per shard, the dataset's ``VerifyReport``, and the
``RecordNote`` kept of each record while a shard is read (for its index file and catalog rows).

These are plain data, shared by the checks (``dataset_tools.verify.checks``) that fill them and
the entry points (``dataset_tools.verify.verification``) that return them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

__all__ = ["MAX_PROBLEMS_PER_SHARD", "RecordNote", "ShardReport", "VerifyReport"]

# A badly damaged shard can fail every record; past this, further problems are only counted.
MAX_PROBLEMS_PER_SHARD = 20


class RecordNote(NamedTuple):
    """What verification saw of one record: its frame and its key (None if it did not parse)."""

    offset: int
    length: int
    key: str | None


@dataclasses.dataclass
class ShardReport:
    """What verification found for one shard.

    Attributes:
      split, file: the shard as listed in ``dataset.json`` (``file`` relative to the root).
      path: the path or URI that was read.
      expected_examples, expected_bytes, expected_sha256: the committed values.
      present: whether the file exists.
      num_bytes, sha256: what was found (None if absent).
      num_records: intact records read before the end or the first damaged record.
      problems: one line per failed check; empty when the shard is sound.
    """

    split: str
    file: str
    path: str
    expected_examples: int
    expected_bytes: int
    expected_sha256: str
    present: bool = False
    num_bytes: int | None = None
    sha256: str | None = None
    num_records: int | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check failed."""
        return not self.problems

    def add(self, problem: str) -> None:
        """Records a failed check; past ``MAX_PROBLEMS_PER_SHARD`` only says there are more."""
        if len(self.problems) < MAX_PROBLEMS_PER_SHARD:
            self.problems.append(problem)
        elif len(self.problems) == MAX_PROBLEMS_PER_SHARD:
            self.problems.append("... further problems in this shard not listed")

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``verify --json``)."""
        return {**dataclasses.asdict(self), "ok": self.ok}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardReport:
        """Inverse of ``to_dict`` (``ok`` is recomputed).

        Raises:
          ValueError: if ``data`` lacks a field of a shard report.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(data)
        if missing:
            raise ValueError(f"not a shard report: no {sorted(missing)} in {sorted(data)}")
        return cls(**{name: data[name] for name in fields})


@dataclasses.dataclass
class VerifyReport:
    """The result of ``verify_dataset`` (and ``verify_foreign``).

    Attributes:
      dataset: the source verified.
      deep: whether images were decoded.
      shards: one report per listed shard, in manifest order.
      problems: dataset-level problems (duplicate keys across shards, a damaged catalog).
      manifest_found: False when the source had no ``dataset.json`` (a glob of foreign
        shards): only CRCs, parsing and record counts were checked.
    """

    dataset: str
    deep: bool
    shards: list[ShardReport]
    problems: list[str] = dataclasses.field(default_factory=list)
    manifest_found: bool = True

    @property
    def ok(self) -> bool:
        """True when every shard is sound and the dataset has no problem of its own."""
        return not self.problems and all(s.ok for s in self.shards)

    @property
    def failed_shards(self) -> list[ShardReport]:
        """The shards with at least one problem, in manifest order."""
        return [s for s in self.shards if not s.ok]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``verify --json``)."""
        return {
            "dataset": self.dataset,
            "deep": self.deep,
            "ok": self.ok,
            "num_shards": len(self.shards),
            "num_failed_shards": len(self.failed_shards),
            "num_records": sum(s.num_records or 0 for s in self.shards),
            "problems": list(self.problems),
            "manifest_found": self.manifest_found,
            "shards": [s.to_dict() for s in self.shards],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VerifyReport:
        """Inverse of ``to_dict``: a report read back from ``verify --json`` or the verify job.

        Raises:
          ValueError: if ``data`` is not such a report.
        """
        try:
            shards = [ShardReport.from_dict(s) for s in data["shards"]]
            return cls(
                dataset=data["dataset"],
                deep=data["deep"],
                shards=shards,
                problems=list(data["problems"]),
                manifest_found=data["manifest_found"],
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a verify report: {type(e).__name__}: {e}") from e
