"""The catalog: one Parquet row per example of a split, in shard order (schema v2).

``catalog-<split>.parquet`` lists every example of a split in the order the shards hold them
(shard order, then record order), so row ``i`` is the example a reader meets at position ``i``
of the split. Columns (``SCHEMA``):

=================  ========  ==========================================================
``key``            string    hex SHA-256 of the source file's bytes (the example's key)
``uri``            string    the source URI
``label``          int64     the class index into ``dataset.json``'s ``label_names``
``text``           string    the class name
``split``          string    the split (``train``, ``validation``)
``index``          int64     position in the split, 0..n-1
``shard``          string    the shard's file name
``record``         int64     position in the shard
``offset``         int64     byte position of the record's frame in the shard (as the .idx)
``length``         int64     the whole frame's bytes (as the .idx)
``height``         int32     stored image height
``width``          int32     stored image width
``format``         string    stored format (``JPEG``, ``PNG``, ``RAW``)
``source_format``  string    format of the source bytes (``JPEG``, ``PNG``, ``WEBP``...)
``source_bytes``   int64     size of the source file
``source_height``  int32     the source's height as declared in its header
``source_width``   int32     the source's width
``phash``          uint64    64-bit perceptual hash (``catalog.phash``), null when not computed
``window_phash``   list      the hashes of the centred windows after the whole frame
                   <uint64>  (``catalog.window_hashes``; their scales are in ``dataset.json``'s
                             ``near_duplicate_windows``), null when not computed
=================  ========  ==========================================================

The location columns (``key`` to ``length``) are never null. The others are null where the
value is unknown, for example the source columns of shards adopted from another tool.

The bytes are a function of the rows alone: written from Arrow (no pandas metadata), with a
fixed compression, dictionary columns and row-group size, and with row groups of exactly
``ROW_GROUP_SIZE`` rows however the rows arrive (``CatalogWriter``). Merging per-shard
fragments therefore gives the same file as writing the whole table at once.

Version 1 (before ``window_phash``) is still read: its tables come back with that column null
(``upgrade``), so readers see one schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "CATALOG_VERSION",
    "SCHEMA",
    "COLUMNS",
    "LOCATION_COLUMNS",
    "ROW_GROUP_SIZE",
    "catalog_filename",
    "build_table",
    "empty_table",
    "check_schema",
    "readable_columns",
    "upgrade",
    "write_table",
    "table_bytes",
    "read_table",
    "read_table_bytes",
    "CatalogWriter",
    "merge_fragments",
]

CATALOG_VERSION = 2
_VERSION_KEY = b"tfrecord_service.catalog_version"

LOCATION_COLUMNS = ("key", "split", "index", "shard", "record", "offset", "length")
_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("key", pa.string()),
    ("uri", pa.string()),
    ("label", pa.int64()),
    ("text", pa.string()),
    ("split", pa.string()),
    ("index", pa.int64()),
    ("shard", pa.string()),
    ("record", pa.int64()),
    ("offset", pa.int64()),
    ("length", pa.int64()),
    ("height", pa.int32()),
    ("width", pa.int32()),
    ("format", pa.string()),
    ("source_format", pa.string()),
    ("source_bytes", pa.int64()),
    ("source_height", pa.int32()),
    ("source_width", pa.int32()),
    ("phash", pa.uint64()),
    ("window_phash", pa.list_(pa.uint64())),
)
# Columns a version-1 catalog lacks, filled with nulls when it is read.
_ADDED_IN_2 = ("window_phash",)
SCHEMA = pa.schema(
    [pa.field(name, kind, nullable=name not in LOCATION_COLUMNS) for name, kind in _FIELDS],
    metadata={_VERSION_KEY: str(CATALOG_VERSION).encode("ascii")},
)
COLUMNS = tuple(SCHEMA.names)

# Fixed writer settings: any change here changes every catalog's bytes (and sha256).
ROW_GROUP_SIZE = 65536
_COMPRESSION = "zstd"
_COMPRESSION_LEVEL = 3
# Columns with few distinct values; the unique ones (key, uri) gain nothing from a dictionary.
_DICTIONARY_COLUMNS = ["text", "split", "shard", "format", "source_format"]


def catalog_filename(split: str) -> str:
    """``catalog-train.parquet`` for split ``train``."""
    if not split or not split.replace("_", "a").isalnum() or split != split.lower():
        raise ValueError(f"split name must be a lowercase identifier like 'train', got {split!r}")
    return f"catalog-{split}.parquet"


def build_table(columns: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Builds a catalog table from columns given by name (lists or arrays).

    Nullable columns that are left out are filled with nulls; the location columns are
    required.

    Raises:
      ValueError: for an unknown or missing required column, columns of different lengths,
        or a value that does not fit its column's type (naming the column).
    """
    unknown = sorted(set(columns) - set(COLUMNS))
    if unknown:
        raise ValueError(f"unknown catalog columns {unknown}; the columns are {list(COLUMNS)}")
    missing = [name for name in LOCATION_COLUMNS if name not in columns]
    if missing:
        raise ValueError(f"catalog rows need the location columns {missing}")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"catalog columns have different lengths: {lengths}")
    num_rows = next(iter(lengths.values()))
    arrays = []
    for field in SCHEMA:
        if field.name not in columns:
            arrays.append(pa.nulls(num_rows, field.type))
            continue
        try:
            array = pa.array(columns[field.name], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
            raise ValueError(f"catalog column {field.name!r}: {e}") from e
        if not field.nullable and array.null_count:
            raise ValueError(f"catalog column {field.name!r} may not hold nulls")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def empty_table() -> pa.Table:
    """A catalog with no rows."""
    return SCHEMA.empty_table()


def check_schema(schema: pa.Schema, *, name: str = "catalog") -> None:
    """Checks that a table or file holds a catalog this build reads: schema v2 exactly, or v1
    (v2 without ``window_phash``), names, types and version.

    Raises:
      ValueError: naming ``name`` and the first difference.
    """
    version = (schema.metadata or {}).get(_VERSION_KEY)
    expected = COLUMNS
    if version == b"1":
        expected = tuple(c for c in COLUMNS if c not in _ADDED_IN_2)
    elif version != str(CATALOG_VERSION).encode("ascii"):
        raise ValueError(
            f"{name}: catalog version {version!r} is not supported; this build reads "
            f"versions 1 and {CATALOG_VERSION}"
        )
    if tuple(schema.names) != expected:
        raise ValueError(
            f"{name}: columns {schema.names} differ from catalog v{version.decode()}'s "
            f"{list(expected)}"
        )
    for field_name in expected:
        field = SCHEMA.field(field_name)
        found = schema.field(field.name).type
        if found != field.type:
            raise ValueError(f"{name}: column {field.name!r} is {found}, expected {field.type}")


def readable_columns(schema: pa.Schema, columns: Sequence[str] | None) -> list[str]:
    """The columns to read from a catalog file of ``schema`` for ``columns`` (all when None):
    a version-1 file's lacks those version 2 added (``upgrade`` adds them)."""
    wanted = list(columns) if columns is not None else list(COLUMNS)
    return [c for c in wanted if c in schema.names]


def upgrade(rows: pa.Table | pa.RecordBatch, columns: Sequence[str] | None = None):
    """Rows read from a catalog (``columns`` of it; all when None) with any column a
    version-1 catalog lacks added, null, in the order asked for."""
    wanted = list(columns) if columns is not None else list(COLUMNS)
    missing = [c for c in wanted if c not in rows.schema.names]
    if not missing:
        return rows
    for column in missing:
        field = SCHEMA.field(column)
        rows = rows.append_column(field, pa.nulls(rows.num_rows, field.type))
    return rows.select(wanted).replace_schema_metadata(SCHEMA.metadata)


def _writer(where: str | BinaryIO | pa.NativeFile) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        where,
        SCHEMA,
        compression=_COMPRESSION,
        compression_level=_COMPRESSION_LEVEL,
        use_dictionary=_DICTIONARY_COLUMNS,
        write_statistics=True,
        version="2.6",
        data_page_version="1.0",
        store_schema=True,
    )


class CatalogWriter:
    """Writes a catalog file from tables or batches that arrive in pieces, in bounded memory.

    Holds at most one row group of rows (``ROW_GROUP_SIZE``) plus the piece being added, and
    writes row groups of exactly that size, so the bytes do not depend on how the rows were cut.
    Use as a context manager; the file is complete once it exits without an exception.
    """

    def __init__(
        self, where: str | BinaryIO | pa.NativeFile, *, row_group_size: int = ROW_GROUP_SIZE
    ) -> None:
        if row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size!r}")
        self._writer = _writer(where)
        self._size = row_group_size
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self.num_rows = 0

    def write(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Appends rows (catalog schema).

        Raises:
          ValueError: if ``rows`` do not have the catalog schema.
        """
        check_schema(rows.schema, name="rows to write")
        rows = upgrade(rows)
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        # Same names and types (checked); this also gives every piece the same field flags.
        batches = pa.Table.from_arrays(rows.columns, schema=SCHEMA).to_batches()
        for batch in batches:
            if batch.num_rows:
                self._pending.append(batch)
                self._pending_rows += batch.num_rows
                self.num_rows += batch.num_rows
        while self._pending_rows >= self._size:
            self._flush(self._size)

    def _flush(self, count: int) -> None:
        table = pa.Table.from_batches(self._pending, schema=SCHEMA)
        self._writer.write_table(table.slice(0, count), row_group_size=count)
        rest = table.slice(count)
        self._pending = rest.combine_chunks().to_batches() if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def close(self) -> None:
        """Writes the last (short) row group and the file footer."""
        if self._pending_rows:
            self._flush(self._pending_rows)
        self._writer.close()

    def __enter__(self) -> CatalogWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._writer.close()


def write_table(table: pa.Table, where: str | BinaryIO | pa.NativeFile) -> None:
    """Writes a whole catalog table deterministically to a local path or a binary file.

    Raises:
      ValueError: if ``table`` does not have the catalog schema.
    """
    with CatalogWriter(where) as writer:
        writer.write(table)


def table_bytes(table: pa.Table) -> bytes:
    """The bytes of a catalog file holding ``table`` (written in memory Arrow owns)."""
    sink = pa.BufferOutputStream()
    write_table(table, sink)
    return sink.getvalue().to_pybytes()


def read_table(
    source: str | BinaryIO | pa.NativeFile,
    *,
    columns: Sequence[str] | None = None,
    name: str | None = None,
) -> pa.Table:
    """Reads a catalog file (a local path, a binary file or an Arrow buffer reader).

    A ``pa.BufferReader`` is read from a copy in memory Arrow owns (see ``read_table_bytes``).

    Args:
      source: what to read.
      columns: read only these columns (all by default).
      name: what to call the file in errors (defaults to ``source`` when it is a path).

    Raises:
      ValueError: if the file is not Parquet or not catalog schema v1, naming it.
    """
    label = name or (source if isinstance(source, str) else "catalog")
    if isinstance(source, pa.BufferReader):
        source = pa.BufferReader(_arrow_owned(source.read_buffer()))
    try:
        parquet = pq.ParquetFile(source)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{label}: not a readable Parquet file ({e})") from e
    check_schema(parquet.schema_arrow, name=label)
    if columns is not None:
        unknown = sorted(set(columns) - set(COLUMNS))
        if unknown:
            raise ValueError(f"unknown catalog columns {unknown}; the columns are {list(COLUMNS)}")
    try:
        table = parquet.read(columns=readable_columns(parquet.schema_arrow, columns))
        return upgrade(table, columns)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{label}: damaged Parquet data ({e})") from e


def read_table_bytes(
    data: bytes, *, columns: Sequence[str] | None = None, name: str = "catalog"
) -> pa.Table:
    """Reads a catalog held in memory (fetched from an object store, say).

    The bytes are first copied into memory Arrow owns. Parquet reads on Arrow's thread pool,
    and a pool thread that releases the last reference to a buffer wrapping a Python object
    must take the GIL: at interpreter exit that aborts the process ("terminate called without
    an active exception").

    Raises:
      ValueError: as ``read_table``.
    """
    return read_table(pa.BufferReader(_arrow_owned(data)), columns=columns, name=name)


def _arrow_owned(data: bytes | pa.Buffer) -> pa.Buffer:
    stream = pa.BufferOutputStream()
    stream.write(data)
    return stream.getvalue()


def merge_fragments(
    fragments: Iterable[str | BinaryIO],
    where: str | BinaryIO,
    *,
    split: str,
    row_group_size: int = ROW_GROUP_SIZE,
    first_index: int = 0,
) -> int:
    """Concatenates per-shard catalog fragments, in the order given, into one split catalog
    (or one partition of it).

    Streams one row group of each fragment at a time. Each row's ``index`` is set to its
    position in the split: ``first_index`` plus its position in the merged file (fragments do
    not know how many rows earlier shards hold).

    Args:
      fragments: the fragments in shard order (local paths or binary files).
      where: the merged catalog's local path or binary file.
      split: the split every row must belong to.
      row_group_size: rows per row group of the output.
      first_index: the split-wide index of the first row (rows of earlier partitions).

    Returns:
      The number of rows written.

    Raises:
      ValueError: if a fragment is not a catalog, or holds a row of another split (naming it).
    """
    position = 0
    index_at = SCHEMA.get_field_index("index")
    if first_index < 0:
        raise ValueError(f"first_index must be >= 0, got {first_index!r}")
    with CatalogWriter(where, row_group_size=row_group_size) as writer:
        for number, fragment in enumerate(fragments):
            label = fragment if isinstance(fragment, str) else f"fragment {number}"
            try:
                parquet = pq.ParquetFile(fragment)
            except (pa.ArrowInvalid, OSError) as e:
                raise ValueError(f"{label}: not a readable Parquet file ({e})") from e
            check_schema(parquet.schema_arrow, name=label)
            for group in range(parquet.num_row_groups):
                table = parquet.read_row_group(group)
                splits = table.column("split").unique().to_pylist()
                if splits and splits != [split]:
                    raise ValueError(f"{label}: holds rows of splits {splits}, expected {split!r}")
                start = first_index + position
                indexes = pa.array(range(start, start + table.num_rows), type=pa.int64())
                table = table.set_column(index_at, SCHEMA.field("index"), indexes)
                writer.write(table)
                position += table.num_rows
    return position
