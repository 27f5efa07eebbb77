"""A split's catalog in partitions: their names, the rule that cuts them, and reading them.

A split whose catalog would hold more than ``DEFAULT_PARTITION_ROWS`` rows is written as
partitions of consecutive shards, each merged by its own worker (no worker holds a split's
whole catalog): ``catalog-train-00003-of-00016.parquet``, numbered like shards and widening
like them past 99,999. A split that fits in one partition keeps today's single file
``catalog-train.parquet``. A split of ``n`` shards of at most ``m`` records each gets
``P = ceil(n / K)`` partitions, ``K = max(1, partition_rows // m)`` (``shards_per_partition``),
and partition ``p`` holds the consecutive shards ``[floor(p·n/P), floor((p+1)·n/P))``
(``partition_shards``): at most ``K`` shards, so at most ``partition_rows`` rows. The cut
depends only on the shards' record counts, so it is the same on every runner and rerun, and a
reader that knows ``n`` and ``P`` (``dataset.json`` lists both) knows which shards a partition
holds. Rows keep their split-wide ``index``.

Readers list a split's files with ``SplitInfo.catalog_files`` (one file, or the partitions in
order) and read them with ``iter_catalog_batches``: one file's bytes and one batch at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from catalog.table import COLUMNS, SCHEMA, check_schema, readable_columns, upgrade
from schemas.manifest import FileInfo, shard_number_width

__all__ = [
    "DEFAULT_PARTITION_ROWS",
    "catalog_partition_filename",
    "shards_per_partition",
    "partition_count",
    "partition_of",
    "partition_shards",
    "check_catalog_bytes",
    "iter_catalog_batches",
    "read_catalog_files",
]

#: Rows a partition holds at most (unless one shard alone holds more): about 120 MB of
#: catalog at 60 bytes a row, merged in about one row group of memory.
DEFAULT_PARTITION_ROWS = 2_000_000


def catalog_partition_filename(split: str, index: int, count: int) -> str:
    """``catalog-train-00003-of-00016.parquet``: partition ``index`` of ``count``.

    Both numbers are five digits, or as wide as ``count`` needs (as shard names).

    Raises:
      ValueError: if ``split`` is not a lowercase identifier or ``index`` is not in
        ``[0, count)``.
    """
    if not split or not split.replace("_", "a").isalnum() or split != split.lower():
        raise ValueError(f"split name must be a lowercase identifier like 'train', got {split!r}")
    if not 0 <= index < count:
        raise ValueError(f"catalog partition must be in [0, count), got {index} of {count}")
    width = shard_number_width(count)
    return f"catalog-{split}-{index:0{width}d}-of-{count:0{width}d}.parquet"


def shards_per_partition(max_shard_rows: int, partition_rows: int = DEFAULT_PARTITION_ROWS) -> int:
    """``K``: how many consecutive shards a partition holds, so it holds at most
    ``partition_rows`` rows (at least one shard, however large).

    Args:
      max_shard_rows: the most records any shard of the split holds.
      partition_rows: the rows a partition may hold.

    Raises:
      ValueError: if ``partition_rows`` < 1 or ``max_shard_rows`` < 0.
    """
    if partition_rows < 1:
        raise ValueError(f"catalog partition_rows must be >= 1, got {partition_rows!r}")
    if max_shard_rows < 0:
        raise ValueError(f"max_shard_rows must be >= 0, got {max_shard_rows!r}")
    return max(1, partition_rows // max(1, max_shard_rows))


def partition_count(num_shards: int, per_partition: int) -> int:
    """Partitions of a split of ``num_shards`` shards, ``per_partition`` a partition."""
    return max(1, -(-num_shards // per_partition))


def partition_of(shard: int, partitions: int, num_shards: int) -> int:
    """The partition holding shard ``shard`` of ``num_shards`` cut in ``partitions``.

    Raises:
      ValueError: unless ``0 <= shard < num_shards`` and ``1 <= partitions <= num_shards``.
    """
    if not 0 <= shard < num_shards or not 1 <= partitions <= num_shards:
        raise ValueError(
            f"shard {shard} of {num_shards} in {partitions} catalog partitions: out of range"
        )
    return ((shard + 1) * partitions - 1) // num_shards


def partition_shards(partition: int, partitions: int, num_shards: int) -> range:
    """The shards partition ``partition`` of ``partitions`` holds, of ``num_shards``.

    Raises:
      ValueError: unless ``0 <= partition < partitions <= num_shards``.
    """
    if not 0 <= partition < partitions <= num_shards:
        raise ValueError(
            f"catalog partition {partition} of {partitions} over {num_shards} shards: out of range"
        )
    return range(partition * num_shards // partitions, (partition + 1) * num_shards // partitions)


def check_catalog_bytes(data: bytes, info: FileInfo, *, where: str) -> None:
    """Checks a catalog file's bytes against the size and SHA-256 ``dataset.json`` lists.

    Raises:
      ValueError: naming ``where``, both sizes and both hashes.
    """
    digest = hashlib.sha256(data).hexdigest()
    if (len(data), digest) != (info.num_bytes, info.sha256):
        raise ValueError(
            f"catalog {where} is damaged: {len(data)} bytes with SHA-256 {digest}, dataset.json "
            f"says {info.num_bytes} bytes with {info.sha256}"
        )


def iter_catalog_batches(
    files: Sequence[FileInfo],
    read: Callable[[FileInfo], bytes],
    *,
    columns: Sequence[str] | None = None,
    batch_size: int = 65536,
    where: Callable[[FileInfo], str] = lambda info: info.file,
) -> Iterator[pa.RecordBatch]:
    """Yields a split's catalog rows in order, one batch of one file at a time.

    Args:
      files: the split's catalog files in order (``SplitInfo.catalog_files``).
      read: the bytes of one file (the caller's storage: local, bucket, shard cache).
      columns: the columns to read (all by default).
      batch_size: rows a batch holds at most.
      where: what to call a file in errors (its path, say).

    Raises:
      ValueError: if a file's bytes differ from what is listed, or it is not a catalog.
      Whatever ``read`` raises for a missing file.
    """
    unknown = sorted(set(columns or ()) - set(COLUMNS))
    if unknown:
        raise ValueError(f"unknown catalog columns {unknown}; the columns are {list(COLUMNS)}")
    for info in files:
        name = where(info)
        data = read(info)
        check_catalog_bytes(data, info, where=name)
        # Arrow-owned copy: see catalog.table.read_table_bytes on buffers of Python objects.
        stream = pa.BufferOutputStream()
        stream.write(data)
        try:
            parquet = pq.ParquetFile(pa.BufferReader(stream.getvalue()))
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{name}: not a readable Parquet file ({e})") from e
        check_schema(parquet.schema_arrow, name=name)
        try:
            for batch in parquet.iter_batches(
                batch_size=batch_size,
                columns=readable_columns(parquet.schema_arrow, columns),
                use_threads=False,
            ):
                yield upgrade(batch, columns)
        except (pa.ArrowInvalid, OSError) as e:
            raise ValueError(f"{name}: damaged Parquet data ({e})") from e


def read_catalog_files(
    files: Sequence[FileInfo],
    read: Callable[[FileInfo], bytes],
    *,
    columns: Sequence[str] | None = None,
    where: Callable[[FileInfo], str] = lambda info: info.file,
) -> pa.Table:
    """A split's whole catalog (or ``columns`` of it) as one table, its files read in order
    (``iter_catalog_batches``), for readers that need every row at once.

    Raises:
      ValueError / whatever ``read`` raises: as ``iter_catalog_batches``.
    """
    batches = list(iter_catalog_batches(files, read, columns=columns, where=where))
    names = list(columns) if columns is not None else list(COLUMNS)
    schema = pa.schema([SCHEMA.field(name) for name in names], metadata=SCHEMA.metadata)
    if not batches:
        return schema.empty_table()
    return pa.Table.from_batches(batches).cast(schema)
