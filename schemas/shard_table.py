"""Per-split shard tables: the shard entries of a ``dataset.json`` of format version 2.

A shard table is a Parquet file (``shards-<split>.parquet``, next to ``dataset.json``) with one
row per shard, in read order: ``file``, ``num_examples``, ``num_bytes``, ``sha256`` and the
shard's index file (``index_file``, ``index_num_bytes``, ``index_sha256``; null without one).
Hashes are stored as 32 raw bytes (half the size of hex text; ``ShardInfo`` holds them as hex).
``dataset.json`` names each table with its size and SHA-256, so it stays a few kilobytes
whatever the shard count, and a table that does not match is refused when it loads.

Like ``schemas.manifest`` this module does no I/O: ``decode_manifest`` takes a function that
reads a file of the dataset, ``encode_manifest`` returns the bytes to write. Readers that need
only some columns or rows of a table (an input pipeline's share of the shards) ask
``ShardTable.columns`` for them; Parquet decodes only the column chunks asked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas.manifest import (
    INLINE_FORMAT,
    FileInfo,
    Manifest,
    ShardInfo,
    TableShards,
    shard_table_name,
)

__all__ = [
    "SHARD_TABLE_SCHEMA",
    "ShardTable",
    "decode_manifest",
    "encode_manifest",
    "encode_shard_table",
    "split_digest",
]

SHARD_TABLE_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("num_examples", pa.int64(), nullable=False),
        pa.field("num_bytes", pa.int64(), nullable=False),
        pa.field("sha256", pa.binary(32), nullable=False),
        pa.field("index_file", pa.string()),
        pa.field("index_num_bytes", pa.int64()),
        pa.field("index_sha256", pa.binary(32)),
    ]
)
# Row groups of this many shards: a reader of a few rows decodes at most one group a column.
_ROW_GROUP = 65_536
# Rows turned into ShardInfo at a time when a whole table is iterated (bounded Python lists).
_BATCH = 65_536
# A table's columns decode in milliseconds in one thread; starting Arrow's thread pool for them
# cost 0.1 s on a loaded 2-core host (400 k shards: 0.3 s with threads, 0.04 s without).
_THREADS = False


def encode_shard_table(shards: Iterable[ShardInfo]) -> bytes:
    """The Parquet bytes of a shard table listing ``shards`` in order (deterministic for a
    given pyarrow: no timestamps)."""
    if isinstance(shards, ShardTable):
        return shards.raw_bytes()
    rows = list(shards)
    columns = {
        "file": [s.file for s in rows],
        "num_examples": [s.num_examples for s in rows],
        "num_bytes": [s.num_bytes for s in rows],
        "sha256": [bytes.fromhex(s.sha256) for s in rows],
        "index_file": [s.index.file if s.index else None for s in rows],
        "index_num_bytes": [s.index.num_bytes if s.index else None for s in rows],
        "index_sha256": [bytes.fromhex(s.index.sha256) if s.index else None for s in rows],
    }
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table(columns, schema=SHARD_TABLE_SCHEMA),
        sink,
        compression="zstd",
        row_group_size=_ROW_GROUP,
        use_dictionary=False,  # names and hashes are unique: a dictionary only costs
    )
    return bytes(sink.getvalue().to_pybytes())


def encode_manifest(manifest: Manifest) -> tuple[str, dict[str, bytes]]:
    """``dataset.json``'s text and the shard tables it names, ``{relative file: bytes}``.

    Write the tables first and ``dataset.json`` last: it is the commit point, and names each
    table's size and SHA-256. A format-version-1 manifest has no tables.
    """
    if manifest.format_version == INLINE_FORMAT:
        return manifest.to_json(), {}
    files: dict[str, bytes] = {}
    infos: dict[str, FileInfo] = {}
    for name, split in sorted(manifest.splits.items()):
        data = encode_shard_table(split.shards)
        info = FileInfo(shard_table_name(name), len(data), hashlib.sha256(data).hexdigest())
        files[info.file], infos[name] = data, info
    return manifest.to_json(infos), files


def decode_manifest(text: str | bytes, read_file: Callable[[str], bytes]) -> Manifest:
    """Parses ``dataset.json`` of either layout; a version-2 split's shard table is read with
    ``read_file(relative path)`` when its entries are first used, and checked then.

    Raises:
      ValueError: as ``Manifest.from_json``.
    """

    def open_table(
        split: str, table: FileInfo, num_shards: int, num_examples: int, num_bytes: int
    ) -> TableShards:
        return ShardTable(
            split, table, num_shards, num_examples, num_bytes, lambda: read_file(table.file)
        )

    return Manifest.from_json(text, open_table)


class ShardTable(TableShards):
    """A split's shard table, read (whole, then checked against ``dataset.json``) on first use.

    Entries come out as ``ShardInfo``; ``columns`` gives readers Arrow columns of only the
    columns and rows they need.
    """

    def __init__(
        self,
        split: str,
        table: FileInfo,
        num_shards: int,
        num_examples: int,
        total_bytes: int,
        read: Callable[[], bytes],
    ) -> None:
        super().__init__(table, num_shards, total_bytes)
        self.split = split
        self.num_examples = num_examples
        self._read: Callable[[], bytes] | None = read
        self._data: bytes | None = None
        self._parquet: pq.ParquetFile | None = None
        self._columns: dict[str, pa.ChunkedArray] = {}

    def raw_bytes(self) -> bytes:
        """The table's Parquet bytes, checked against ``dataset.json``.

        Raises:
          FileNotFoundError: if the table is missing, naming it.
          ValueError: if it cannot be read, or its size or SHA-256 is not what
            ``dataset.json`` says.
        """
        if self._data is None:
            assert self._read is not None
            where = f"the {self.split!r} shard table {self.table.file}"
            try:
                data = self._read()
            except FileNotFoundError as e:
                raise FileNotFoundError(
                    f"{where} named in dataset.json is missing ({e}); restore it or republish "
                    "the dataset"
                ) from e
            except OSError as e:
                raise ValueError(f"{where} cannot be read: {e}") from e
            if len(data) != self.table.num_bytes:
                raise ValueError(
                    f"{where} is {len(data)} bytes, but dataset.json says {self.table.num_bytes}:"
                    " it is damaged or was replaced; restore it or republish the dataset"
                )
            digest = hashlib.sha256(data).hexdigest()
            if digest != self.table.sha256:
                raise ValueError(
                    f"{where} has SHA-256 {digest}, but dataset.json says {self.table.sha256}: "
                    "it is damaged or was replaced; restore it or republish the dataset"
                )
            self._data, self._read = data, None
        return self._data

    def _file(self) -> pq.ParquetFile:
        if self._parquet is None:
            where = f"the {self.split!r} shard table {self.table.file}"
            try:
                parquet = pq.ParquetFile(pa.BufferReader(self.raw_bytes()))
            except pa.ArrowException as e:
                raise ValueError(f"{where} is not a readable Parquet file: {e}") from e
            if not parquet.schema_arrow.equals(SHARD_TABLE_SCHEMA):
                raise ValueError(
                    f"{where} has columns {parquet.schema_arrow.names}, expected "
                    f"{SHARD_TABLE_SCHEMA.names} with their types"
                )
            if parquet.metadata.num_rows != self.num_shards:
                raise ValueError(
                    f"{where} has {parquet.metadata.num_rows} rows, but dataset.json says the "
                    f"split has {self.num_shards} shards"
                )
            self._parquet = parquet
            self._check_totals()
        return self._parquet

    def _check_totals(self) -> None:
        for column, expected in (
            ("num_examples", self.num_examples),
            ("num_bytes", self.total_bytes),
        ):
            total = pc.sum(self.column(column)).as_py() or 0
            if total != expected:
                raise ValueError(
                    f"the {self.split!r} shard table {self.table.file} adds up to {total} "
                    f"{column}, but dataset.json says {expected}"
                )

    def column(self, name: str) -> pa.ChunkedArray:
        """One column of the whole table (decoded once, then kept).

        Raises:
          ValueError, FileNotFoundError: as ``raw_bytes``, or for a malformed table.
        """
        if name not in self._columns:
            self._columns[name] = self._file().read([name], use_threads=_THREADS).column(name)
        return self._columns[name]

    def columns(self, names: Sequence[str], rows: Sequence[int] | None = None) -> pa.Table:
        """The ``names`` columns of the table, only ``rows`` (in that order) when given."""
        missing = [name for name in names if name not in self._columns]
        if missing:
            read = self._file().read(missing, use_threads=_THREADS)
            self._columns.update({name: read.column(name) for name in missing})
        table = pa.table({name: self._columns[name] for name in names})
        return table if rows is None else table.take(pa.array(rows, pa.int64()))

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return tuple(self._infos(range(len(self))[index]))
        if not -len(self) <= index < len(self):
            raise IndexError(f"shard {index} of a split of {len(self)} shards")
        return next(self._infos([index % len(self)]))

    def __iter__(self) -> Iterator[ShardInfo]:
        for start in range(0, len(self), _BATCH):
            yield from self._infos(range(start, min(start + _BATCH, len(self))))

    def _infos(self, rows: Sequence[int]) -> Iterator[ShardInfo]:
        picked = self.columns(SHARD_TABLE_SCHEMA.names, list(rows)).to_pydict()
        for i in range(len(rows)):
            yield _shard_info({name: values[i] for name, values in picked.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        # Workers get the checked bytes, not the caller's read function.
        data = self.raw_bytes()
        args = (self.split, self.table, self.num_shards, self.num_examples, self.total_bytes)
        return (_loaded_table, (*args, data))


def _loaded_table(
    split: str, table: FileInfo, num_shards: int, num_examples: int, total: int, data: bytes
) -> ShardTable:
    return ShardTable(split, table, num_shards, num_examples, total, lambda: data)


def _shard_info(row: Mapping[str, Any]) -> ShardInfo:
    index = None
    if row["index_file"] is not None:
        index = FileInfo(row["index_file"], row["index_num_bytes"], row["index_sha256"].hex())
    return ShardInfo(
        file=row["file"],
        num_examples=row["num_examples"],
        num_bytes=row["num_bytes"],
        sha256=row["sha256"].hex(),
        index=index,
    )


def split_digest(shards: Iterable[tuple[str, int]]) -> str:
    """A digest of a split's layout: its shard file names and record counts, in order.

    Two splits with the same digest number their examples the same way, so a position taken on
    one (a delivered set, a torch loader's state) applies to the other. Paths are reduced to
    their file names, so the same dataset read from another directory or bucket keeps its
    digest.
    """
    text = "\n".join(f"{path.rstrip('/').rsplit('/', 1)[-1]}:{count}" for path, count in shards)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
