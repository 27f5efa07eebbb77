"""tfds metadata written as JSON without tfds: the same JSON tfds writes, and tfds reads it."""

from __future__ import annotations

import json

import pytest

from schemas.manifest import Counts, ImageSpec, Manifest, ShardInfo, SplitInfo
from schemas.tfds_metadata import (
    DATASET_INFO_NAME,
    FEATURES_NAME,
    LABELS_FILE,
    filepath_template,
    tfds_metadata_files,
)

_SHA = "0" * 64


def _manifest(encoding: str = "jpeg", names=("cat", "dog", "red fox"), **kwargs) -> Manifest:
    shards = (
        ShardInfo("train-00000-of-00002.tfrecord", 2, 100, _SHA),
        ShardInfo("train-00001-of-00002.tfrecord", 1, 50, _SHA),
    )
    return Manifest(
        label_names=tuple(names),
        splits={"train": SplitInfo(3, shards), "validation": SplitInfo(0, ())},
        counts=Counts(3, 3, 0, 0),
        image=ImageSpec(encoding, 16, "center" if encoding == "raw" else "none"),
        **kwargs,
    )


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
def test_features_json_is_what_tfds_itself_writes(encoding, tmp_path):
    import tensorflow as tf
    import tensorflow_datasets as tfds

    features = tfds.features.FeaturesDict(
        {
            "image/encoded": tfds.features.Image(encoding_format=encoding)
            if encoding != "raw"
            else tfds.features.Tensor(shape=(), dtype=tf.string),
            "image/format": tfds.features.Text(),
            "image/height": tfds.features.Tensor(shape=(), dtype=tf.int64),
            "image/width": tfds.features.Tensor(shape=(), dtype=tf.int64),
            "image/channels": tfds.features.Tensor(shape=(), dtype=tf.int64),
            "image/class/label": tfds.features.ClassLabel(names=["cat", "dog", "red fox"]),
            "image/class/text": tfds.features.Text(),
            "image/filename": tfds.features.Text(),
            "image/key/sha256": tfds.features.Text(),
        }
    )
    features.save_config(str(tmp_path))  # features.json and the class names, as tfds writes
    ours = tfds_metadata_files(_manifest(encoding))
    assert json.loads(ours[FEATURES_NAME]) == json.loads((tmp_path / FEATURES_NAME).read_text())
    assert ours[LABELS_FILE] == (tmp_path / LABELS_FILE).read_text()


def test_dataset_info_lists_splits_with_shard_lengths_and_payload_bytes():
    files = tfds_metadata_files(_manifest())
    info = json.loads(files[DATASET_INFO_NAME])
    assert info["fileFormat"] == "tfrecord"
    # The empty validation split has no shards and is left out; 16 framing bytes per record.
    assert info["splits"] == [
        {
            "filepathTemplate": "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}",
            "name": "train",
            "numBytes": str(150 - 16 * 3),
            "shardLengths": ["2", "1"],
        }
    ]
    assert files[LABELS_FILE] == "cat\ndog\nred fox\n"
    assert tfds_metadata_files(_manifest()) == files  # deterministic


def test_templates_and_refusals():
    assert filepath_template("train", ["train-00000-of-01024"]) == "{SPLIT}-{SHARD_X_OF_Y}"
    assert filepath_template("train", ["validation-00000-of-00001.tfrecord"]) is None
    assert filepath_template("train", ["part-0.tfrecord"]) is None
    with pytest.raises(ValueError, match="line break"):
        tfds_metadata_files(_manifest(names=("cat", "two\nlines")))
    with pytest.raises(ValueError, match="in gs://bucket/shards"):
        tfds_metadata_files(_manifest(shard_root="gs://bucket/shards"))
    without_label = tfds_metadata_files(_manifest(), class_label=False, keys=["image/encoded"])
    assert LABELS_FILE not in without_label
