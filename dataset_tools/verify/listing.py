"""The shards ``verify`` checks, as ``dataset.json`` lists them, built one at a time.

``ListedShards`` is every listed shard's empty ``ShardReport``, splits in name order, built
from the manifest only when asked for (iterated or indexed): a split's entries come from its
shard table's columns (``schemas.shard_table``) in bounded batches, so nothing is held per
shard beyond the table's own Arrow columns. A dataset of 400,000 shards starts verifying
without 400,000 report objects.
"""

from __future__ import annotations

import bisect
import os
import posixpath
from collections.abc import Iterator, Sequence
from typing import overload

from dataset_tools.verify.report import ShardReport
from schemas import Manifest, ShardInfo
from tfrecord_io.random_access import DatasetFiles
from tfrecord_io.source import is_remote, join, manifest_path

__all__ = ["ListedShards"]


class ListedShards(Sequence[ShardReport]):
    """An empty report for every shard ``dataset.json`` lists, splits in name order: the
    shards ``verify`` checks, in the order it reports them. Each report is built when asked
    for, a new object each time.

    Every split's shard table is read and checked when this is made, so a missing or damaged
    table fails before any shard is read.

    Raises:
      FileNotFoundError: if a split's shard table is missing.
      ValueError: if one is damaged (size, SHA-256, schema or totals not as listed).
    """

    def __init__(self, source: str, manifest: Manifest) -> None:
        path = manifest_path(source)
        here = (
            (posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)) if path else ""
        )
        # Adopted shards may stay where they are, apart from dataset.json (``shard_root``).
        self.files = DatasetFiles(manifest, here or ".", manifest.shard_root or here or ".")
        self.splits = sorted(manifest.splits)
        self._starts = [0]
        for split in self.splits:
            shards = manifest.split(split).shards
            shards[:0]  # reads, checks and decodes a shard table; no entry is built
            self._starts.append(self._starts[-1] + len(shards))

    @property
    def manifest(self) -> Manifest:
        return self.files.manifest

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, index: int) -> ShardReport: ...

    @overload
    def __getitem__(self, index: slice) -> list[ShardReport]: ...

    def __getitem__(self, index: int | slice) -> ShardReport | list[ShardReport]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        return self.entry(index)[1]

    def entry(self, index: int) -> tuple[ShardInfo, ShardReport]:
        """The listed shard at ``index`` (of all splits' shards) and its empty report.

        Raises:
          IndexError: if there is no such shard.
        """
        if not -len(self) <= index < len(self):
            raise IndexError(f"shard {index} of a dataset of {len(self)} listed shards")
        index %= len(self)
        which = bisect.bisect_right(self._starts, index) - 1
        split = self.splits[which]
        info = self.manifest.split(split).shards[index - self._starts[which]]
        return info, self.report(split, info)

    def __iter__(self) -> Iterator[ShardReport]:
        for split in self.splits:
            for info in self.manifest.split(split).shards:
                yield self.report(split, info)

    def entries(self, split: str) -> Iterator[tuple[ShardInfo, ShardReport]]:
        """A split's shards in order, each entry with its empty report."""
        for info in self.manifest.split(split).shards:
            yield info, self.report(split, info)

    def report(self, split: str, info: ShardInfo) -> ShardReport:
        """The empty report of one listed shard: the values ``dataset.json`` commits to."""
        return ShardReport(
            split=split,
            file=info.file,
            path=join(self.files.shard_root, info.file),
            expected_examples=info.num_examples,
            expected_bytes=info.num_bytes,
            expected_sha256=info.sha256,
        )

    def start(self, split: str) -> int:
        """The position of a split's first shard among all listed shards."""
        return self._starts[self.splits.index(split)]
