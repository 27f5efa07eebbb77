"""Done records: what the shard writer leaves once a shard is complete, for ``--resume``.

``DST/.staging/done/<shard-stem>.json`` is written after the shard, its index file and its
catalog fragment are committed. It holds the shard's ``ShardResult`` (file, count, size,
SHA-256, index file size and SHA-256, per-class counts), the duplicates it dropped, and a digest
of its keys. A resumed build trusts it only after checking the files against it
(``resume.VerifyDoneShards``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import Duplicate, ShardResult
from beam_pipelines.engines.filesystems import read_with_retries, write_object
from beam_pipelines.output.catalog_io import STAGING_DIR
from catalog.index_files import index_filename

__all__ = [
    "DONE_DIR",
    "done_record_path",
    "keys_digest",
    "write_done_record",
    "list_done_records",
    "read_done_record",
    "shard_result_from_record",
]

DONE_DIR = "done"
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED


def done_record_path(output_dir: str, shard_name: str) -> str:
    """``DST/.staging/done/<shard-stem>.json``."""
    stem = index_filename(shard_name)[: -len(".idx")]
    return FileSystems.join(output_dir, STAGING_DIR, DONE_DIR, f"{stem}.json")


def keys_digest(records: Iterable[Any]) -> str:
    """SHA-256 (hex) of the ``key<TAB>uri`` lines of a shard's records, in shard order."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(f"{record.sha256}\t{record.uri}\n".encode())
    return digest.hexdigest()


def write_done_record(
    output_dir: str,
    result: ShardResult,
    duplicates: Sequence[Duplicate],
    keys: str,
) -> None:
    """Records a committed shard; call after the shard, its index file and its fragment.

    Args:
      output_dir: the dataset directory.
      result: the shard as committed.
      duplicates: the inputs it dropped as copies (they go to ``duplicates.jsonl``).
      keys: ``keys_digest`` of its records.
    """
    record = {
        "shard": result._asdict(),
        "duplicates": [d._asdict() for d in duplicates],
        "keys_sha256": keys,
    }
    text = json.dumps(record, ensure_ascii=False, sort_keys=True)
    write_object(done_record_path(output_dir, result.file), text.encode("utf-8"))


def list_done_records(output_dir: str) -> list[str]:
    """Paths of every done record in ``output_dir``'s staging area, sorted."""
    pattern = FileSystems.join(output_dir, STAGING_DIR, DONE_DIR, "*.json")
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # each FileSystem reports "nothing there" its own way
        return []


def read_done_record(path: str) -> dict[str, Any]:
    """Reads one done record (retrying transient failures)."""

    def read() -> bytes:
        with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
            return handle.read()

    return json.loads(read_with_retries(path, read).decode("utf-8"))


def shard_result_from_record(record: dict[str, Any]) -> ShardResult:
    """The ``ShardResult`` a done record holds (JSON lists back to tuples)."""
    fields = dict(record["shard"])
    if "label_counts" in fields:
        fields["label_counts"] = tuple(tuple(pair) for pair in fields["label_counts"])
    return ShardResult(**fields)
