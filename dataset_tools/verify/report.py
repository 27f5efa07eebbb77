"""What verification found: a ``ShardReport`` per shard, the dataset's ``VerifyReport``, and the
``RecordNote`` kept of each record while a shard is read (for its index file and catalog rows).

A dataset's report holds the failed shards' reports in full and rebuilds a sound shard's from
its listing when asked for (``ShardReports``): a sound shard is exactly what ``dataset.json``
says it is. ``verify --json`` is written a shard at a time (``VerifyReport.json_chunks``).

These are plain data, shared by the checks (``dataset_tools.verify.checks``) that fill them and
the entry points (``dataset_tools.verify.verification``) that return them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, overload

__all__ = ["MAX_PROBLEMS_PER_SHARD", "RecordNote", "ShardReport", "ShardReports", "VerifyReport"]

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


class ShardReports(Sequence[ShardReport]):
    """Every listed shard's report, held compactly: the failed shards' reports in full, a sound
    shard's rebuilt from its listing when asked for (present, with the listed size, SHA-256
    and record count, no problem).

    Args:
      listed: every listed shard's empty report, in order, a new object each time it is asked
        for (``dataset_tools.verify.listing.ListedShards``).
      failed: the reports of the shards with a problem, by position in ``listed``.
      num_records: the records read from all shards.
    """

    def __init__(
        self, listed: Sequence[ShardReport], failed: Mapping[int, ShardReport], num_records: int
    ) -> None:
        self._listed = listed
        self._failed = dict(failed)
        self.num_records = num_records

    @property
    def failed(self) -> list[ShardReport]:
        """The failed shards' reports, in order."""
        return [self._failed[i] for i in sorted(self._failed)]

    def __len__(self) -> int:
        return len(self._listed)

    @overload
    def __getitem__(self, index: int) -> ShardReport: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShardReport]: ...

    def __getitem__(self, index: int | slice) -> ShardReport | list[ShardReport]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        position = range(len(self))[index]  # IndexError past the end
        found = self._failed.get(position)
        return found if found is not None else _sound(self._listed[position])

    def __iter__(self) -> Iterator[ShardReport]:
        for position, listed in enumerate(self._listed):
            found = self._failed.get(position)
            yield found if found is not None else _sound(listed)


def _sound(listed: ShardReport) -> ShardReport:
    """A listed shard's report filled in as checked and sound."""
    listed.present = True
    listed.num_bytes, listed.sha256 = listed.expected_bytes, listed.expected_sha256
    listed.num_records = listed.expected_examples
    return listed


# Stands for the shards in the JSON of a report's other fields (json_chunks).
_SHARDS_MARK = "\x00shards\x00"


@dataclasses.dataclass
class VerifyReport:
    """The result of ``verify_dataset`` (and ``verify_foreign``).

    Attributes:
      dataset: the source verified.
      deep: whether images were decoded.
      shards: one report per listed shard, in manifest order (a list, or ``ShardReports``,
        which holds only the failed shards' reports).
      problems: dataset-level problems (duplicate keys across shards, a damaged catalog).
      manifest_found: False when the source had no ``dataset.json`` (a glob of foreign
        shards): only CRCs, parsing and record counts were checked.
    """

    dataset: str
    deep: bool
    shards: Sequence[ShardReport]
    problems: list[str] = dataclasses.field(default_factory=list)
    manifest_found: bool = True

    @property
    def ok(self) -> bool:
        """True when every shard is sound and the dataset has no problem of its own."""
        return not self.problems and not self.failed_shards

    @property
    def failed_shards(self) -> list[ShardReport]:
        """The shards with at least one problem, in manifest order."""
        if isinstance(self.shards, ShardReports):
            return self.shards.failed
        return [s for s in self.shards if not s.ok]

    @property
    def num_records(self) -> int:
        """The records read from all shards."""
        if isinstance(self.shards, ShardReports):
            return self.shards.num_records
        return sum(s.num_records or 0 for s in self.shards)

    def _summary(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "deep": self.deep,
            "ok": self.ok,
            "num_shards": len(self.shards),
            "num_failed_shards": len(self.failed_shards),
            "num_records": self.num_records,
            "problems": list(self.problems),
            "manifest_found": self.manifest_found,
        }

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (``verify --json``), every shard's report in it."""
        return {**self._summary(), "shards": [s.to_dict() for s in self.shards]}

    def json_chunks(self, **extra: Any) -> Iterator[str]:
        """The text of ``json.dumps({**self.to_dict(), **extra}, indent=2)``, in pieces, one
        shard's report at a time: ``verify --json`` writes every shard's report without
        holding them all."""
        text = json.dumps({**self._summary(), "shards": _SHARDS_MARK, **extra}, indent=2)
        before, after = text.split(json.dumps(_SHARDS_MARK))
        yield before
        # json.dumps puts a list's items at the list's depth plus one (4 spaces here).
        opening = "[\n    "
        for shard in self.shards:
            yield opening + json.dumps(shard.to_dict(), indent=2).replace("\n", "\n    ")
            opening = ",\n    "
        yield "[]" if opening.startswith("[") else "\n  ]"
        yield after

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
