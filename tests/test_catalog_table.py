"""Catalog schema v2: deterministic Parquet bytes, validation, the streaming merge, and v1
catalogs read as v2 (their window hashes null)."""

from __future__ import annotations

import hashlib
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from catalog import table as catalog_table
from catalog.table import (
    COLUMNS,
    SCHEMA,
    CatalogWriter,
    build_table,
    catalog_filename,
    merge_fragments,
    read_table,
    write_table,
)


def _rows(n: int, *, shard: str = "train-00000-of-00001.tfrecord", start: int = 0) -> pa.Table:
    offsets = [116 * i for i in range(n)]
    return build_table(
        {
            "key": [hashlib.sha256(f"{shard}{i}".encode()).hexdigest() for i in range(n)],
            "uri": [f"/src/c{i % 3}/{i}.jpg" for i in range(n)],
            "label": [i % 3 for i in range(n)],
            "text": [f"c{i % 3}" for i in range(n)],
            "split": ["train"] * n,
            "index": list(range(start, start + n)),
            "shard": [shard] * n,
            "record": list(range(n)),
            "offset": offsets,
            "length": [116] * n,
            "height": [64] * n,
            "width": [48] * n,
            "format": ["JPEG"] * n,
            "phash": [None if i % 2 else (1 << 63) + i for i in range(n)],
        }
    )


def _bytes(table: pa.Table, **kwargs) -> bytes:
    sink = io.BytesIO()
    if kwargs:
        with CatalogWriter(sink, **kwargs) as writer:
            writer.write(table)
    else:
        write_table(table, sink)
    return sink.getvalue()


def test_schema_v2_columns_and_types():
    assert COLUMNS == (
        "key", "uri", "label", "text", "split", "index", "shard", "record", "offset",
        "length", "height", "width", "format", "source_format", "source_bytes",
        "source_height", "source_width", "phash", "window_phash",
    )  # fmt: skip
    assert SCHEMA.field("phash").type == pa.uint64() and SCHEMA.field("phash").nullable
    assert SCHEMA.field("window_phash").type == pa.list_(pa.uint64())
    assert SCHEMA.field("height").type == pa.int32()
    assert not SCHEMA.field("offset").nullable
    assert catalog_filename("validation") == "catalog-validation.parquet"
    with pytest.raises(ValueError, match="lowercase identifier"):
        catalog_filename("Train")


def test_round_trip_keeps_values_and_nulls(tmp_path):
    table = _rows(10)
    path = str(tmp_path / "c.parquet")
    write_table(table, path)
    back = read_table(path)
    assert back.equals(table)
    assert back.column("phash").to_pylist()[:2] == [1 << 63, None]
    assert back.column("source_bytes").null_count == 10
    assert read_table(path, columns=["key", "label"]).num_columns == 2


def test_bytes_are_deterministic_and_independent_of_how_rows_arrive():
    table = _rows(1000)
    whole = _bytes(table, row_group_size=300)
    assert whole == _bytes(table, row_group_size=300)
    pieces = io.BytesIO()  # uneven pieces, one of them empty
    with CatalogWriter(pieces, row_group_size=300) as writer:
        for start, end in ((0, 7), (7, 7), (7, 350), (350, 999), (999, 1000)):
            writer.write(table.slice(start, end - start))
    assert pieces.getvalue() == whole
    metadata = pq.ParquetFile(io.BytesIO(whole)).metadata
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [
        300, 300, 300, 100,
    ]  # fmt: skip
    assert b"pandas" not in whole


def test_merge_equals_writing_the_concatenation(tmp_path):
    fragments = []
    tables = []
    for shard, n in (("a", 5), ("b", 0), ("c", 9), ("d", 4)):
        t = _rows(n, shard=f"train-{shard}.tfrecord")  # index restarts at 0 in each fragment
        tables.append(t)
        path = tmp_path / f"{shard}.parquet"
        write_table(t, str(path))
        fragments.append(str(path))
    merged = tmp_path / "catalog-train.parquet"
    assert merge_fragments(fragments, str(merged), split="train", row_group_size=4) == 18
    expected = pa.concat_tables(tables)
    expected = expected.set_column(
        COLUMNS.index("index"), SCHEMA.field("index"), pa.array(range(18), pa.int64())
    )
    assert read_table(str(merged)).equals(expected)
    assert merged.read_bytes() == _bytes(expected, row_group_size=4)


def test_merge_refuses_a_fragment_of_another_split(tmp_path):
    t = _rows(3)
    t = t.set_column(COLUMNS.index("split"), SCHEMA.field("split"), pa.array(["validation"] * 3))
    write_table(t, str(tmp_path / "f.parquet"))
    with pytest.raises(ValueError, match=r"f\.parquet: holds rows of splits \['validation'\]"):
        merge_fragments([str(tmp_path / "f.parquet")], io.BytesIO(), split="train")


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"colour": [1]}, "unknown catalog columns"),
        ({"key": ["k"]}, "location columns"),
    ],
)
def test_build_table_rejects_bad_columns(columns, match):
    with pytest.raises(ValueError, match=match):
        build_table(columns)


def test_build_table_rejects_nulls_in_location_columns_and_bad_types():
    base = {name: _rows(2).column(name).to_pylist() for name in catalog_table.LOCATION_COLUMNS}
    with pytest.raises(ValueError, match="'offset' may not hold nulls"):
        build_table({**base, "offset": [0, None]})
    with pytest.raises(ValueError, match="'label'"):
        build_table({**base, "label": ["cat", "dog"]})
    with pytest.raises(ValueError, match="different lengths"):
        build_table({**base, "label": [1]})


def test_read_rejects_other_files_naming_them(tmp_path):
    bad = tmp_path / "catalog-train.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match="catalog-train.parquet: not a readable Parquet file"):
        read_table(str(bad))
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"key": ["x"]}), str(other))
    with pytest.raises(ValueError, match="other.parquet: catalog version None"):
        read_table(str(other))
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"key": ["x"]}).replace_schema_metadata(SCHEMA.metadata), str(wrong))
    with pytest.raises(ValueError, match="columns"):
        read_table(str(wrong))
    truncated = tmp_path / "truncated.parquet"
    write_table(_rows(50), str(truncated))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated.parquet"):
        read_table(str(truncated))


def test_a_version_1_catalog_is_read_with_null_window_hashes(tmp_path):
    from catalog.partitions import iter_catalog_batches
    from schemas.manifest import FileInfo

    table = _rows(6).set_column(
        COLUMNS.index("window_phash"),
        SCHEMA.field("window_phash"),
        pa.array([[1, 2, 2**64 - 1]] * 6, pa.list_(pa.uint64())),
    )
    assert read_table(pa.BufferReader(_bytes(table)))["window_phash"][0].as_py() == [
        1,
        2,
        2**64 - 1,
    ]
    old = table.drop_columns(["window_phash"]).replace_schema_metadata(
        {b"tfrecord_service.catalog_version": b"1"}
    )
    sink = io.BytesIO()
    pq.write_table(old, sink)
    data = sink.getvalue()
    back = read_table(pa.BufferReader(data))
    assert back.column_names == list(COLUMNS) and back["window_phash"].null_count == 6
    assert back["phash"].equals(table["phash"])
    some = read_table(pa.BufferReader(data), columns=["window_phash", "key"])
    assert some.column_names == ["window_phash", "key"]
    info = FileInfo("old.parquet", len(data), hashlib.sha256(data).hexdigest())
    (batch,) = iter_catalog_batches([info], lambda _: data, columns=["key", "window_phash"])
    assert batch.schema.names == ["key", "window_phash"] and batch.column(1).null_count == 6
    merged = io.BytesIO()
    merge_fragments([io.BytesIO(data)], merged, split=old["split"][0].as_py())
    assert read_table(pa.BufferReader(merged.getvalue())).equals(
        back.set_column(COLUMNS.index("index"), SCHEMA.field("index"), back["index"])
    )
