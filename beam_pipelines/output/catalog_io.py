"""The shard writer's by-products: index files, catalog fragments, and each split's catalog.

For every shard the writer commits, in this order:

1. the shard (``train-00003-of-00016.tfrecord``), by ``shards.WriteShardFn``;
2. its index file (``train-00003-of-00016.idx``, ``catalog.index_files``), next to it, from the
   offsets the writer counted while writing: no second scan;
3. its catalog rows as a fragment (``.staging/done/train-00003-of-00016.catalog.parquet``).

The launcher then writes tfds's metadata (``write_tfds_metadata``) before ``dataset.json``, and
after publishing removes the fragments and any index file or catalog no manifest lists.

``MergeCatalogs`` then concatenates each split's fragments in shard order, streaming one row
group at a time: into ``catalog-<split>.parquet`` when the split fits in one partition
(``catalog.partitions``), otherwise into partitions of consecutive shards
(``catalog-<split>-00003-of-00016.parquet``), each merged by its own worker. All of them depend
only on the records the shards hold, so they are byte-identical across runners, as the shards
are.
Every write goes through Beam FileSystems under a temporary name, then a rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_pipelines.elements import CatalogMeta, ShardResult
from beam_pipelines.engines.filesystems import file_digest, write_object
from beam_pipelines.graph.heap import release_freed_memory
from catalog.index_files import format_index, index_filename
from catalog.partitions import (
    DEFAULT_PARTITION_ROWS,
    catalog_partition_filename,
    partition_count,
    partition_of,
    shards_per_partition,
)
from catalog.table import build_table, catalog_filename, merge_fragments, table_bytes
from schemas.manifest import Manifest
from schemas.tfds_metadata import tfds_metadata_files

__all__ = [
    "STAGING_DIR",
    "CatalogResult",
    "fragment_path",
    "fragment_table",
    "write_index_and_fragment",
    "merge_split_catalog",
    "read_catalog_batches",
    "MergeCatalogs",
    "PARTITION_ROWS",
    "write_tfds_metadata",
    "remove_staged_fragments",
    "remove_unlisted_catalog_files",
]

STAGING_DIR = ".staging"
_INDEX_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*-\d{5,}-of-\d{5,}\.idx$")
_CATALOG_NAME_RE = re.compile(r"^catalog-[a-z][a-z0-9_]*(-\d{5,}-of-\d{5,})?\.parquet$")
_UNCOMPRESSED = CompressionTypes.UNCOMPRESSED
#: The rows a catalog partition holds at most when ``MergeCatalogs`` is not told.
PARTITION_ROWS = DEFAULT_PARTITION_ROWS
_COPY_CHUNK = 8 * 1024 * 1024

# Arrow's default allocator (mimalloc) kept what catalog fragments and merges had used: in
# process, the merge of a 21,600-row split catalog raised the peak by 34-55 MB, growing with the
# split, and releasing unused memory after each fragment did not help. On the system allocator
# the same merge added 9 MB. Every process that runs the pipeline's steps imports this module;
# readers and the trainer never do (they do not import beam_pipelines).
pa.set_memory_pool(pa.system_memory_pool())
_log = logging.getLogger(__name__)


class CatalogResult(NamedTuple):
    """A split's catalog, or partition ``partition`` of ``partitions`` of it, committed under
    its final name."""

    split: str
    file: str
    num_examples: int
    num_bytes: int
    sha256: str
    partition: int = 0
    partitions: int = 1


def fragment_path(output_dir: str, shard_name: str) -> str:
    """Where a shard's catalog fragment is staged until the split's catalog is merged."""
    stem = index_filename(shard_name)[: -len(".idx")]
    return FileSystems.join(output_dir, STAGING_DIR, "done", f"{stem}.catalog.parquet")


def fragment_table(
    split: str, shard_name: str, records: Sequence[Any], entries: Sequence[tuple[int, int]]
):
    """A shard's catalog rows (``pyarrow.Table``), ``index`` holding the position in the shard.

    Args:
      split, shard_name: the shard.
      records: what the shard holds, in order; anything with ``sha256``, ``uri`` and ``meta``
        (a ``CatalogMeta`` or None) attributes: ``PreparedRecord`` or a location of one.
      entries: each record's ``(offset, length)`` in the shard, as ``write_shard_file`` returns.

    Raises:
      ValueError: if ``records`` and ``entries`` differ in length, or a value breaks the
        catalog schema.
    """
    if len(records) != len(entries):
        raise ValueError(f"{shard_name}: {len(records)} records but {len(entries)} index entries")
    n = len(records)
    columns: dict[str, list[Any]] = {
        "key": [r.sha256 for r in records],
        "uri": [r.uri for r in records],
        "split": [split] * n,
        "index": list(range(n)),
        "shard": [shard_name] * n,
        "record": list(range(n)),
        "offset": [int(e[0]) for e in entries],
        "length": [int(e[1]) for e in entries],
    }
    for field in CatalogMeta._fields:
        columns[field] = [None if r.meta is None else getattr(r.meta, field) for r in records]
    return build_table(columns)


def write_index_and_fragment(
    output_dir: str,
    split: str,
    shard_name: str,
    records: Sequence[Any],
    entries: Sequence[tuple[int, int]],
) -> tuple[int, str]:
    """Commits a written shard's index file, then its catalog fragment.

    Returns:
      ``(num_bytes, sha256)`` of the index file.
    """
    # Both are small: one retried PUT each on buckets (whole or absent), temp + rename locally.
    index_bytes = format_index(entries)
    write_object(FileSystems.join(output_dir, index_filename(shard_name)), index_bytes)
    table = fragment_table(split, shard_name, records, entries)
    # One shard's rows: a few MB at most.
    write_object(fragment_path(output_dir, shard_name), table_bytes(table))
    return len(index_bytes), hashlib.sha256(index_bytes).hexdigest()


@contextlib.contextmanager
def _local_copies(paths: Iterable[str]) -> Iterator[Iterator[str]]:
    """Yields an iterator of local copies of ``paths``, one on disk at a time."""
    with tempfile.TemporaryDirectory(prefix="catalog-merge-") as tmp:

        def copies() -> Iterator[str]:
            for number, path in enumerate(paths):
                local = os.path.join(tmp, f"{number}.parquet")
                with FileSystems.open(path, compression_type=_UNCOMPRESSED) as source:
                    with open(local, "wb") as sink:
                        while chunk := source.read(_COPY_CHUNK):
                            sink.write(chunk)
                yield local
                os.remove(local)
                release_freed_memory()  # what Arrow freed reading it (a merge reads hundreds)

        yield copies()


def merge_split_catalog(
    output_dir: str,
    split: str,
    shards: Iterable[ShardResult],
    *,
    partition: int = 0,
    partitions: int = 1,
    first_index: int = 0,
) -> CatalogResult:
    """Merges fragments in shard order into a split's catalog, or one partition of it.

    With one partition the file is ``catalog-<split>.parquet``; otherwise
    ``catalog-<split>-<partition>-of-<partitions>.parquet``, holding ``shards`` only.
    Memory stays at about one row group whatever the size: fragments are copied locally one
    at a time and the merged file is written to a local temporary file, then copied to
    ``output_dir`` under a temporary name and renamed.

    Args:
      output_dir, split: the dataset and split.
      shards: the shards of the file (all of the split's, or the partition's).
      partition, partitions: which partition this is, of how many.
      first_index: the split-wide index of the partition's first row.

    Raises:
      ValueError: if a fragment is not a catalog of this split, or the row count of the merged
        catalog differs from the shards' record counts.
    """
    ordered = sorted(shards, key=lambda s: s.index)
    expected = sum(s.num_examples for s in ordered)
    if partitions == 1:
        name = catalog_filename(split)
    else:
        name = catalog_partition_filename(split, partition, partitions)
    destination = FileSystems.join(output_dir, name)
    fd, local = tempfile.mkstemp(suffix=".parquet")
    os.close(fd)
    try:
        with _local_copies(fragment_path(output_dir, s.file) for s in ordered) as fragments:
            rows = merge_fragments(fragments, local, split=split, first_index=first_index)
        if rows != expected:
            raise ValueError(
                f"{name}: merged {rows} catalog rows, but the shards of {split!r} hold {expected}"
            )
        found = file_digest(local)
        assert found is not None  # written just above
        num_bytes, digest = found
        write_object(destination, local_path=local)  # retried; whole or absent on buckets
    finally:
        os.remove(local)
    return CatalogResult(split, name, rows, num_bytes, digest, partition, partitions)


def read_catalog_batches(
    output_dir: str, names: str | Sequence[str], columns: Sequence[str], *, batch_size: int = 8192
) -> Iterator[pa.RecordBatch]:
    """Yields published catalog files' ``columns``, file after file, in batches of at most
    ``batch_size`` rows.

    Memory stays at about one batch whatever the catalog's size: each file (a split's catalog
    or one of its partitions) is copied locally (Parquet reads need random access), then read
    one batch at a time.
    """
    listed = [names] if isinstance(names, str) else list(names)
    with _local_copies(FileSystems.join(output_dir, name) for name in listed) as copies:
        for local in copies:
            yield from pq.ParquetFile(local).iter_batches(
                batch_size=batch_size, columns=list(columns), use_threads=False
            )


def _partition_key(shard: ShardResult, max_rows: dict[str, int], partition_rows: int):
    parts = partition_count(
        shard.count, shards_per_partition(max_rows[shard.split], partition_rows)
    )
    # A merge holds every shard of its partition at once: 74 MB of label counts for 1,000.
    key = (shard.split, partition_of(shard.index, parts, shard.count), parts)
    return key, shard.without_label_counts()


def _first_indexes(element) -> tuple[str, dict[int, int]]:
    """``(split, [(partition, rows)]) -> (split, {partition: its first row's index})``."""
    split, counts = element
    ordered = sorted(counts)
    if [p for p, _ in ordered] != list(range(len(ordered))):
        raise ValueError(
            f"catalog partitions of {split!r} are not 0..n-1: {[p for p, _ in ordered]}"
        )
    firsts, total = {}, 0
    for partition, rows in ordered:
        firsts[partition] = total
        total += rows
    return split, firsts


@beam.typehints.with_output_types(CatalogResult)
class _MergeFn(beam.DoFn):
    def __init__(self, output_dir: str) -> None:
        self._output_dir = output_dir

    def process(self, element, first_indexes):
        (split, partition, partitions), shards = element
        yield merge_split_catalog(
            self._output_dir,
            split,
            shards,
            partition=partition,
            partitions=partitions,
            first_index=first_indexes[split][partition],
        )


class MergeCatalogs(beam.PTransform):
    """``ShardResult -> CatalogResult``: each split's catalog, one file or partitions of
    consecutive shards, each merged by its own worker once its shards are in.

    Only the small ``ShardResult`` values, without their label counts, cross the shuffles
    (a merge holds those of its partition), and per split only the most
    records of a shard and each partition's row count are gathered (hundreds of numbers at a
    billion rows); the rows are read back from the staged fragments.

    Args:
      output_dir: the dataset directory.
      partition_rows: the rows a partition holds at most (``catalog.partitions``); None
        for ``PARTITION_ROWS``, read when the pipeline is built (tests set it small to get
        several partitions from a few shards).
    """

    def __init__(self, output_dir: str, *, partition_rows: int | None = None) -> None:
        super().__init__()
        if partition_rows is None:
            partition_rows = PARTITION_ROWS
        shards_per_partition(0, partition_rows)  # checks it
        self._output_dir = output_dir
        self._partition_rows = partition_rows

    def expand(self, shards):
        max_rows = (
            shards
            | "ShardRows" >> beam.Map(lambda s: (s.split, s.num_examples))
            # (split, records of a shard)
            | "MaxShardRows" >> beam.CombinePerKey(max)
        )
        # (split, most records of any of its shards)
        keyed = shards | "ToPartition" >> beam.Map(
            _partition_key, beam.pvalue.AsDict(max_rows), self._partition_rows
        )
        # ((split, partition, partitions), ShardResult)
        first_indexes = (
            keyed
            | "PartitionRows" >> beam.Map(lambda kv: (kv[0][:2], kv[1].num_examples))
            | "SumPartitionRows" >> beam.CombinePerKey(sum)
            # ((split, partition), rows)
            | "BySplit" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1])))
            | "GroupBySplit" >> beam.GroupByKey()
            # (split, [(partition, rows)])
            | "FirstIndexes" >> beam.Map(_first_indexes)
        )
        # (split, {partition: first index})
        return (
            keyed
            | "GroupByPartition" >> beam.GroupByKey()
            # ((split, partition, partitions), [ShardResult])
            | "MergeFragments"
            >> beam.ParDo(_MergeFn(self._output_dir), beam.pvalue.AsDict(first_indexes))
        )


def write_tfds_metadata(output_dir: str, manifest: Manifest) -> list[str]:
    """Writes ``dataset_info.json``, ``features.json`` and the class names file for tfds.

    Called before ``dataset.json`` is published; the JSON is made without TensorFlow
    (``schemas.tfds_metadata``).

    Returns:
      The names of the files written.
    """
    try:
        files = tfds_metadata_files(manifest)
    except ValueError as e:  # a dataset tfds cannot describe is still a dataset
        _log.warning("no tfds metadata written to %s: %s", output_dir, e)
        return []
    for name, text in sorted(files.items()):
        write_object(FileSystems.join(output_dir, name), text.encode("utf-8"))
    return sorted(files)


def remove_staged_fragments(output_dir: str, manifest: Manifest) -> None:
    """Deletes the catalog fragments of the listed shards, once their catalogs are published."""
    paths = [fragment_path(output_dir, s.file) for s in manifest.all_shards()]
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)
    if FileSystems.get_scheme(output_dir) in (None, "file"):
        # Object stores have no directories; local ones are removed once empty.
        staging = FileSystems.join(output_dir, STAGING_DIR)
        for directory in (FileSystems.join(staging, "done"), staging):
            with contextlib.suppress(OSError):
                os.rmdir(directory.removeprefix("file://"))


def remove_unlisted_catalog_files(output_dir: str, manifest: Manifest) -> list[str]:
    """Deletes index files and catalogs the published manifest does not list.

    They are left by an earlier run with other shard counts or splits. Only files named like
    ours (``<split>-NNNNN-of-NNNNN.idx``, ``catalog-<split>.parquet``,
    ``catalog-<split>-NNNNN-of-NNNNN.parquet``) are candidates.

    Returns:
      The paths deleted.
    """
    listed = {s.index.file for s in manifest.all_shards() if s.index is not None}
    listed |= {f.file for s in manifest.splits.values() for f in s.catalog_files}
    stale = []
    for pattern, name_re in (
        ("*.idx", _INDEX_NAME_RE),
        ("catalog-*.parquet", _CATALOG_NAME_RE),
    ):
        matched = FileSystems.match([FileSystems.join(output_dir, pattern)])[0].metadata_list
        for meta in matched:
            name = FileSystems.split(meta.path)[1]
            if name_re.match(name) and name not in listed:
                stale.append(meta.path)
    if stale:
        FileSystems.delete(sorted(stale))
    return sorted(stale)
