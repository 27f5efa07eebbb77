"""The small value types that flow between the pipeline's steps.

Plain named tuples: they pickle cheaply between Beam workers and compare by value, which
``assert_that`` in tests relies on.
"""

from __future__ import annotations

import json
from typing import NamedTuple

__all__ = [
    "SourceFile",
    "Rejection",
    "Duplicate",
    "CatalogMeta",
    "PreparedRecord",
    "StagedRecord",
    "ShardResult",
]


class SourceFile(NamedTuple):
    """One input: its URI and its class name (None when the layout gives it no class).

    ``problem``: ``(reason, detail)`` when the input is known to be unusable before it is read
    (a listing line that cannot be parsed, a class name that cannot be stored): the image step
    rejects it with that reason, so it is counted and reported like any other input.
    """

    uri: str
    label: str | None
    problem: tuple[str, str] | None = None


class Rejection(NamedTuple):
    """An input that did not become an example; one line of ``rejected.jsonl``."""

    uri: str
    reason: str
    detail: str

    def to_json(self) -> str:
        return json.dumps(
            {"uri": self.uri, "reason": self.reason, "detail": self.detail},
            ensure_ascii=False,
            sort_keys=True,
        )


class Duplicate(NamedTuple):
    """An input dropped because another input has the same bytes; one line of ``duplicates.jsonl``.

    ``kept_uri`` is the copy that was kept (the first in URI order), ``label`` and ``kept_label``
    the class names of the two. ``label_conflict`` marks bytes found under different classes:
    a labelling error. With ``--label_conflicts drop_both`` no copy is kept (``kept_uri`` and
    ``kept_label`` are None) and every copy has a line; the lines of one conflict share the
    ``sha256``.
    """

    uri: str
    kept_uri: str | None
    sha256: str
    label: str | None = None
    kept_label: str | None = None
    label_conflict: bool = False

    def to_json(self) -> str:
        return json.dumps(self._asdict(), ensure_ascii=False, sort_keys=True)


class CatalogMeta(NamedTuple):
    """What the catalog records about an example besides its key, URI and place in a shard.

    One flat tuple of plain values, made by the image step, so that it travels with the
    example (or with a small location of it) to the shard writer at little cost. ``None`` marks
    a value that is not known (it becomes a null in the catalog). ``window_phash`` holds the
    hashes of the centred windows after the whole frame (``catalog.window_hashes``, unsigned),
    which pair a crop with its original.
    """

    label: int
    text: str
    height: int
    width: int
    format: str
    source_format: str | None = None
    source_bytes: int | None = None
    source_height: int | None = None
    source_width: int | None = None
    phash: int | None = None
    window_phash: tuple[int, ...] | None = None


class PreparedRecord(NamedTuple):
    """A validated, serialised example and what the shard writer needs to place it.

    ``meta`` is the example's catalog row (without its location); None leaves those catalog
    columns null.
    """

    sha256: str
    uri: str
    serialized: bytes
    meta: CatalogMeta | None = None


class StagedRecord(NamedTuple):
    """Where a prepared example waits for its shard: a small location instead of its bytes.

    The image step appends each example, TFRecord-framed, to a staging file under
    ``DST/.staging/records/`` and emits this once the file is durable; only these cross the
    group-by-shard, and the shard writer reads the frames back in key order.
    ``file`` is the staging file's name in that directory, ``offset`` where the example's frame
    starts and ``length`` the whole frame (``catalog.index_files.frame_length``). ``sha256``,
    ``uri`` and ``meta`` are as in ``PreparedRecord``.
    """

    sha256: str
    uri: str
    file: str
    offset: int
    length: int
    meta: CatalogMeta | None = None


class ShardResult(NamedTuple):
    """A shard file written and committed under its final name, with its index file's size and
    hash (the index file is named after the shard, ``catalog.index_files.index_filename``).

    ``label_counts`` holds ``(label, examples)`` pairs in label order; it is empty when the
    records carried no class (``PreparedRecord.meta`` None). ``upscaled`` counts the records
    stored larger than their source (``shards.upscaled_count``).
    """

    split: str
    # Fields named like tuple.index and tuple.count (the shard name's parts): mypy objects to a
    # NamedTuple field shadowing a tuple method, which is harmless here.
    index: int  # type: ignore[assignment]
    count: int  # type: ignore[assignment]
    file: str
    num_examples: int
    num_bytes: int
    sha256: str
    index_bytes: int = 0
    index_sha256: str = ""
    label_counts: tuple[tuple[int, int], ...] = ()
    upscaled: int = 0

    def without_label_counts(self) -> ShardResult:
        """This shard without its label counts: for steps that hold many shards and need none
        of them (74 KB a shard as Python objects at 1,000 classes)."""
        return self._replace(label_counts=())
