"""Adopting foreign shards: dataset.json, index files and catalogs, without rewriting a shard."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import tensorflow as tf

from catalog.index_files import entries_from_payload_sizes, format_index
from catalog.table import read_table
from dataset_tools.adopt import adopt, main
from tests.fixtures.shards import write_foreign_shards
from tfrecord_io.random_access import read_examples
from tfrecord_io.source import load_manifest


def _records(path) -> list[tf.train.Example]:
    return [
        tf.train.Example.FromString(bytes(r.numpy())) for r in tf.data.TFRecordDataset(str(path))
    ]


def _feature(example, key):
    feature = example.features.feature[key]
    return (feature.bytes_list.value or feature.int64_list.value)[0]


def test_adopt_in_place_describes_every_record(tmp_path):
    foreign = write_foreign_shards(tmp_path / "imagenet", num_examples=14, png_every=4)
    before = {p.name: p.read_bytes() for p in foreign.paths}
    manifest = adopt(str(tmp_path / "imagenet" / "train-*"), label_offset=1)
    assert {p.name: p.read_bytes() for p in foreign.paths} == before  # shards untouched
    assert manifest.shard_root is None
    assert manifest.label_names == ("n00000000", "n00000001", "n00000002")
    split = manifest.split("train")
    assert split.num_examples == 14 and [s.file for s in split.shards] == [
        p.name for p in foreign.paths
    ]
    rows = read_table(str(tmp_path / "imagenet" / split.catalog.file)).to_pylist()
    row = 0
    for shard, path in zip(split.shards, foreign.paths, strict=True):
        data = path.read_bytes()
        assert (shard.num_bytes, shard.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        examples = _records(path)
        index = (tmp_path / "imagenet" / shard.index.file).read_bytes()
        sizes = [len(e.SerializeToString()) for e in examples]
        assert shard.index.file == path.name + ".idx"
        assert index == format_index(entries_from_payload_sizes(sizes))
        for position, example in enumerate(examples):
            r = rows[row]
            filename = _feature(example, "image/filename").decode()
            assert r["key"] == hashlib.sha256(_feature(example, "image/encoded")).hexdigest()
            assert r["label"] == foreign.labels[filename]  # stored label minus the offset
            assert (r["uri"], r["shard"], r["record"], r["index"]) == (
                filename,
                path.name,
                position,
                row,
            )
            assert r["source_bytes"] is None and r["text"] is None
            row += 1
    assert row == 14
    dataset_info = json.loads((tmp_path / "imagenet" / "dataset_info.json").read_text())
    assert dataset_info["splits"][0]["filepathTemplate"] == "{SPLIT}-{SHARD_X_OF_Y}"


def test_adopt_elsewhere_reads_through_byte_ranges(tmp_path):
    write_foreign_shards(tmp_path / "shards", num_examples=6, num_shards=2)
    out = tmp_path / "described"
    status = main(
        [str(tmp_path / "shards" / "train-*"), "--label_offset", "1", "--output", str(out)]
    )
    assert status == 0
    manifest = load_manifest(out)
    assert manifest.shard_root == str(tmp_path / "shards")
    assert not list(out.glob("train-0000?-of-00002"))  # no shard copied
    assert not (out / "features.json").exists()  # tfds reads shards only next to its metadata
    keys = read_table(str(out / "catalog-train.parquet")).column("key").to_pylist()
    examples = read_examples(str(out), keys[::-1])
    for key, example in zip(keys[::-1], examples, strict=True):
        encoded = _feature(tf.train.Example.FromString(example.serialized), "image/encoded")
        assert hashlib.sha256(encoded).hexdigest() == key
    # A second adoption into the same place is refused; with --overwrite it is the same.
    assert main([str(tmp_path / "shards" / "train-*"), "--output", str(out)]) == 2
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = [str(tmp_path / "shards" / "train-*"), "--output", str(out), "--label_offset", "1"]
    assert main([*args, "--overwrite"]) == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_damaged_shard_is_named_and_nothing_is_written(tmp_path, capsys):
    foreign = write_foreign_shards(tmp_path / "shards", num_examples=6, num_shards=2)
    data = bytearray(foreign.paths[1].read_bytes())
    data[len(data) // 2] ^= 0x55
    foreign.paths[1].write_bytes(bytes(data))
    assert main([str(tmp_path / "shards" / "train-*")]) == 1
    err = capsys.readouterr().err
    assert foreign.paths[1].name in err and "CRC mismatch" in err
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [
        p.name for p in foreign.paths
    ]


def test_bad_arguments(tmp_path, capsys):
    write_foreign_shards(tmp_path / "shards", num_examples=3, num_shards=1, label_offset=0)
    assert main([str(tmp_path / "shards" / "train-*"), "--label_offset", "1"]) == 2
    assert "label 0 minus --label_offset 1 is negative" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing" / "train-*")]) == 2
    assert "no TFRecord files match" in capsys.readouterr().err


def test_the_cli_runs_as_a_module(tmp_path):
    write_foreign_shards(tmp_path / "shards", num_examples=3, num_shards=1)
    done = subprocess.run(
        [sys.executable, "-m", "dataset_tools.adopt", str(tmp_path / "shards" / "train-*"),
         "--label_offset", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train: 3 examples in 1 shard\n" in done.stdout


def test_the_reader_reads_adopted_shards_with_their_recorded_offset(tmp_path):
    from tfrecord_io import make_dataset

    foreign = write_foreign_shards(tmp_path / "shards", num_examples=10, png_every=3)
    out = tmp_path / "adopted"
    adopt(str(tmp_path / "shards" / "train-*"), output=str(out), label_offset=1)
    labels = []
    for images, batch_labels in make_dataset(
        str(out), global_batch_size=4, training=False, image_size=24
    ):
        assert images.shape[1:] == (24, 24, 3)
        labels.extend(batch_labels.numpy().tolist())
    assert sorted(labels) == sorted(foreign.labels.values())  # 0-based: the offset was applied
