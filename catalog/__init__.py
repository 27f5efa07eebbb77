"""The dataset catalog (one Parquet row per example), per-shard index files, and the
perceptual hash and near-duplicate search over the catalog's ``phash`` column.

A bottom package: it imports only ``schemas``, ``pyarrow`` and ``numpy``, so the pipeline's
workers, the reader and the tools can all use it.
"""

from catalog.index_files import (
    INDEX_SUFFIX,
    check_contiguous,
    entries_from_payload_sizes,
    format_index,
    index_filename,
    parse_index,
)
from catalog.keys import key_prefixes
from catalog.near_duplicates import (
    DEFAULT_THRESHOLD,
    Pairs,
    classify,
    find_pairs,
    leakage_moves,
)
from catalog.partitions import (
    DEFAULT_PARTITION_ROWS,
    catalog_partition_filename,
    check_catalog_bytes,
    iter_catalog_batches,
    partition_count,
    partition_of,
    partition_shards,
    read_catalog_files,
    shards_per_partition,
)
from catalog.phash import FLIP_MASK, flip_hash, hamming, phash_of_grid
from catalog.table import (
    CATALOG_VERSION,
    COLUMNS,
    LOCATION_COLUMNS,
    ROW_GROUP_SIZE,
    SCHEMA,
    CatalogWriter,
    build_table,
    catalog_filename,
    check_schema,
    empty_table,
    merge_fragments,
    read_table,
    read_table_bytes,
    table_bytes,
    write_table,
)

__all__ = [
    "DEFAULT_PARTITION_ROWS",
    "catalog_partition_filename",
    "check_catalog_bytes",
    "iter_catalog_batches",
    "partition_count",
    "partition_of",
    "partition_shards",
    "read_catalog_files",
    "shards_per_partition",
    "DEFAULT_THRESHOLD",
    "FLIP_MASK",
    "Pairs",
    "classify",
    "find_pairs",
    "flip_hash",
    "hamming",
    "leakage_moves",
    "phash_of_grid",
    "key_prefixes",
    "INDEX_SUFFIX",
    "check_contiguous",
    "entries_from_payload_sizes",
    "format_index",
    "index_filename",
    "parse_index",
    "CATALOG_VERSION",
    "COLUMNS",
    "LOCATION_COLUMNS",
    "ROW_GROUP_SIZE",
    "SCHEMA",
    "CatalogWriter",
    "build_table",
    "catalog_filename",
    "check_schema",
    "empty_table",
    "merge_fragments",
    "read_table",
    "read_table_bytes",
    "table_bytes",
    "write_table",
]
