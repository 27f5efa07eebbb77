"""Exact epochs' shard columns and the split digest from a shard table's columns.

``manifest_split_digest`` must give what ``split_digest`` gave over every entry (runs begun
before it keep their delivered sets), and ``SplitColumns`` must name the paths, sizes and
counts that the ``ShardFile`` of each shard holds.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from schemas import FileInfo, ShardInfo
from schemas.shard_table import ShardTable, encode_shard_table
from tests.fixtures.shards import WrittenDataset, to_inline_layout, write_dataset
from tfrecord_io.delivery import manifest_split_digest, split_digest
from tfrecord_io.shard_reading import damage_records
from tfrecord_io.source import resolve_source
from tfrecord_io.split_columns import DamageMarker, SplitColumns


def _table(infos: list[ShardInfo]) -> ShardTable:
    data = encode_shard_table(infos)
    info = FileInfo("shards-train.parquet", len(data), hashlib.sha256(data).hexdigest())
    total = sum(s.num_examples for s in infos)
    size = sum(s.num_bytes for s in infos)
    return ShardTable("train", info, len(infos), total, size, lambda: data)


def test_the_digest_from_columns_is_the_digest_over_entries() -> None:
    # Names in sub-directories, with a trailing "/", non-ASCII and a newline; counts from 0 to
    # beyond 32 bits; more rows than one block of the columnar digest (65,536).
    names = ["a/train-1.tfrecord", "b/c/x\ny.tfrecord", "plain", "d/", "é/ü.tfrecord"]
    infos = [
        ShardInfo(f"{names[i % 5]}{i}", [0, 7, 123_456_789_012][i % 3], 10, f"{i % 256:02x}" * 32)
        for i in range(70_001)
    ]
    expected = split_digest((s.file, s.num_examples) for s in infos)
    assert manifest_split_digest(_table(infos)) == expected
    assert manifest_split_digest(tuple(infos)) == expected
    # And it still tells layouts apart.
    infos[-1] = ShardInfo(infos[-1].file, infos[-1].num_examples + 1, 10, "00" * 32)
    assert manifest_split_digest(_table(infos)) != expected


def test_the_digest_of_a_pipeline_name_table_skips_the_path_cut() -> None:
    infos = [ShardInfo(f"train-{i:05d}-of-00100.tfrecord", i, 1, "00" * 32) for i in range(100)]
    assert manifest_split_digest(_table(infos)) == split_digest(
        (s.file, s.num_examples) for s in infos
    )


@pytest.fixture
def dataset(tmp_path: Path) -> WrittenDataset:
    # Per test: the inline case rewrites dataset.json.
    return write_dataset(
        tmp_path / "ds",
        examples={"train": 23},
        num_shards={"train": 4},
        image_size=8,
    )


@pytest.mark.parametrize("layout", ["tables", "inline"])
def test_split_columns_are_the_shard_files(dataset: WrittenDataset, layout: str) -> None:
    if layout == "inline":
        to_inline_layout(dataset.root)
    resolved = resolve_source(dataset.root, "train")
    shards = resolved.shards
    columns = SplitColumns.of(resolved)
    paths = [columns.prefix + n.decode() for n in columns.names_tensor().numpy()]
    assert paths == [s.path for s in shards]
    assert columns.counts.tolist() == [s.num_examples for s in shards]
    assert columns.sizes.tolist() == [s.num_bytes for s in shards]
    assert columns.rows(np.array([2, 0])) == tuple(
        type(s)(s.path, s.num_bytes, s.num_examples) for s in (shards[2], shards[0])
    )
    assert not columns.has_glob
    # The end marker made in the graph carries the message of shard_reading's marker.
    marker = DamageMarker(columns)
    for shard in shards:
        made = marker.record(tf.constant(shard.path), tf.constant(shard.num_examples, tf.int64))
        example = tf.train.Example.FromString(made.numpy())
        original = tf.train.Example.FromString(damage_records((shard,))[0])
        assert set(example.features.feature) == set(original.features.feature)
        for key, feature in original.features.feature.items():
            values = example.features.feature[key].bytes_list.value
            if feature.bytes_list.value and feature.bytes_list.value[0]:
                expected = feature.bytes_list.value[0].decode()
                assert values[0].decode().rstrip(" ") == expected
            else:
                assert example.features.feature[key] == feature
