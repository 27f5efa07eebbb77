"""``--resume``: what an interrupted build left in ``DST/.staging/``, checked before it is trusted.

A build that dies (launcher killed, worker lost, runner failure, a bucket refusing writes) keeps
its staging area. Rerun with the same command plus ``--resume``, it reuses three things:

* ``plan.json``: the shard counts, reused as they are (a build whose content options differ is
  refused, naming them: ``plan.check_plan``);
* ``records/<uuid>.json`` sidecars: every staged example whose staging file is whole is reused
  by URI, so its image is neither read nor decoded again (``StagedFromEarlierAttempts``);
* ``done/<shard-stem>.json``: a shard committed with its index file and catalog fragment. It is
  trusted only after the shard's and the index file's size and SHA-256 are checked against it
  (``VerifyDoneShards``, in parallel); a trusted shard is not written again, and its
  duplicates come from the record. A record that fails its check is ignored: that shard is
  written again.

Rejected inputs leave nothing staged and are read again (they are rejected again, for the same
reason). The result is byte-identical to an uninterrupted build; ``--resume`` assumes the input
did not change in between.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.catalog_io import STAGING_DIR, fragment_path, write_file
from beam_pipelines.elements import Duplicate, ShardResult
from beam_pipelines.object_store_io import read_with_retries
from beam_pipelines.staging import read_sidecar, staging_dir
from catalog.index_files import index_filename

__all__ = [
    "DONE_DIR",
    "DONE_TAG",
    "done_record_path",
    "keys_digest",
    "write_done_record",
    "list_done_records",
    "read_done_record",
    "shard_result_from_record",
    "file_digest",
    "VerifyDoneShards",
    "StagedFromEarlierAttempts",
    "SplitReusable",
    "REUSED_TAG",
    "remove_staging",
]

DONE_DIR = "done"
DONE_TAG = "duplicates"
REUSED_TAG = "reused"
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
_CHUNK = 8 * 1024 * 1024
_DELETE_BATCH = 1000
_log = logging.getLogger(__name__)


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
    write_file(done_record_path(output_dir, result.file), text.encode("utf-8"))


def list_done_records(output_dir: str) -> list[str]:
    """Paths of every done record in ``output_dir``'s staging area, sorted."""
    pattern = FileSystems.join(output_dir, STAGING_DIR, DONE_DIR, "*.json")
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:  # noqa: BLE001  (each FileSystem reports "nothing there" its own way)
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


def file_digest(path: str) -> tuple[int, str] | None:
    """``(num_bytes, sha256 hex)`` of a file, streamed; None if it does not exist."""
    if not FileSystems.exists(path):
        return None

    def read() -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        with FileSystems.open(path, compression_type=_UNCOMPRESSED) as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()

    return read_with_retries(path, read)  # type: ignore[arg-type,return-value]


def _check_done(output_dir: str, record: dict[str, Any]) -> str | None:
    """Why a done record cannot be trusted, or None when its shard checks out."""
    shard = shard_result_from_record(record)
    expected = {
        shard.file: (shard.num_bytes, shard.sha256),
        index_filename(shard.file): (shard.index_bytes, shard.index_sha256),
    }
    for name, want in expected.items():
        got = file_digest(FileSystems.join(output_dir, name))
        if got != want:
            return f"{name} is {got or 'missing'}, the done record says {want}"
    if not FileSystems.exists(fragment_path(output_dir, shard.file)):
        return f"the catalog fragment of {shard.file} is missing"
    return None


class _VerifyDoneFn(beam.DoFn):
    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir

    def process(self, path: str):
        try:
            record = read_done_record(path)
            problem = _check_done(self._output_dir, record)
        except (ValueError, KeyError, TypeError) as e:
            problem = f"unreadable ({type(e).__name__}: {e})"
        if problem is not None:
            _log.warning(
                "--resume: not trusting %s: %s; that shard is written again", path, problem
            )
            return
        for duplicate in record["duplicates"]:
            yield beam.pvalue.TaggedOutput(DONE_TAG, Duplicate(**duplicate))
        yield shard_result_from_record(record)


class VerifyDoneShards(beam.PTransform):
    """``PBegin -> {"shards": ShardResult, "duplicates": Duplicate}`` for the trusted shards.

    Args:
      output_dir: the dataset directory.
      paths: the done records to check (``list_done_records``), read and checked in parallel.
    """

    def __init__(self, output_dir: str, paths: Sequence[str]) -> None:
        super().__init__()
        self._output_dir = output_dir
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "DoneRecords" >> beam.Create(self._paths)
            | "Spread" >> beam.Reshuffle()
            # str: a done record's path
            | "CheckShard"
            >> beam.ParDo(_VerifyDoneFn(self._output_dir)).with_outputs(DONE_TAG, main="shards")
        )


class StagedFromEarlierAttempts(beam.PTransform):
    """``PBegin -> StagedRecord``: every example an earlier attempt committed to staging.

    Args:
      paths: the sidecars to read (``staging.list_sidecars``), read in parallel.
    """

    def __init__(self, paths: Sequence[str]) -> None:
        super().__init__()
        self._paths = list(paths)

    def expand(self, pbegin):
        return (
            pbegin
            | "Sidecars" >> beam.Create(self._paths)
            | "Spread" >> beam.Reshuffle()
            # str: a sidecar's path
            | "ReadSidecar" >> beam.FlatMap(read_sidecar)
        )


def _pair_by_uri(element):
    # (uri, {"sources": [SourceFile], "staged": [StagedRecord]})
    #   -> SourceFile to prepare, or StagedRecord (reused) on the "reused" output
    _, groups = element
    sources = sorted(groups["sources"])
    # Any staged copy will do: the same source gives the same example bytes. One per listing
    # line, so a URI listed twice stays two inputs, as in an uninterrupted build.
    staged = sorted(groups["staged"], key=lambda r: (r.file, r.offset))
    for i, source in enumerate(sources):
        if i < len(staged):
            yield beam.pvalue.TaggedOutput(REUSED_TAG, staged[i])
        else:
            yield source


class SplitReusable(beam.PTransform):
    """``SourceFile -> {"sources": SourceFile, "reused": StagedRecord}``.

    Joins the inputs with what an earlier attempt staged, by URI: an input with a staged
    example comes out as that ``StagedRecord`` (nothing to read or decode), the others as
    ``SourceFile`` for the image step.

    Args:
      staged: a PCollection of ``StagedRecord`` (``StagedFromEarlierAttempts``).
    """

    def __init__(self, staged) -> None:
        super().__init__()
        self._staged = staged

    def expand(self, sources):
        keyed_sources = sources | "SourceByUri" >> beam.Map(lambda s: (s.uri, s))
        keyed_staged = self._staged | "StagedByUri" >> beam.Map(lambda r: (r.uri, r))
        return (
            {"sources": keyed_sources, "staged": keyed_staged}
            | "JoinByUri" >> beam.CoGroupByKey()
            # (uri, {"sources": [SourceFile], "staged": [StagedRecord]})
            | "Pair" >> beam.FlatMap(_pair_by_uri).with_outputs(REUSED_TAG, main="sources")
        )


def remove_staging(output_dir: str) -> int:
    """Deletes ``DST/.staging/`` and everything in it; returns the number of files deleted."""
    root = staging_dir(output_dir)
    try:
        matched = FileSystems.match([FileSystems.join(root, "**")])[0].metadata_list
    except Exception:  # noqa: BLE001  (nothing there)
        matched = []
    paths = sorted(m.path for m in matched)
    for start in range(0, len(paths), _DELETE_BATCH):
        FileSystems.delete(paths[start : start + _DELETE_BATCH])
    if FileSystems.get_scheme(output_dir) in (None, "file"):
        import shutil

        local = root[len("file://") :] if root.startswith("file://") else root
        shutil.rmtree(local, ignore_errors=True)  # the empty directories left behind
    return len(paths)
