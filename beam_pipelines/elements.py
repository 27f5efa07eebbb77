"""The small value types that flow between the pipeline's steps.

Plain named tuples: they pickle cheaply between Beam workers and compare by value, which
``assert_that`` in tests relies on.
"""

from __future__ import annotations

import json
from typing import NamedTuple

__all__ = ["SourceFile", "Rejection", "Duplicate", "PreparedRecord", "ShardResult"]


class SourceFile(NamedTuple):
    """One input: its URI and its class name (None when the layout gives it no class)."""

    uri: str
    label: str | None


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
    """An input whose bytes equal an earlier (in URI order) input's; one line of ``duplicates.jsonl``."""

    uri: str
    kept_uri: str
    sha256: str

    def to_json(self) -> str:
        return json.dumps(
            {"uri": self.uri, "kept_uri": self.kept_uri, "sha256": self.sha256},
            ensure_ascii=False,
            sort_keys=True,
        )


class PreparedRecord(NamedTuple):
    """A validated, serialised example and what the shard writer needs to place it."""

    sha256: str
    uri: str
    serialized: bytes


class ShardResult(NamedTuple):
    """A shard file written and committed under its final name."""

    split: str
    index: int
    count: int
    file: str
    num_examples: int
    num_bytes: int
    sha256: str
