"""Tests for the shared example layout and the dataset.json manifest."""

import hashlib

import pytest
import tensorflow as tf

from schemas import (
    SCHEMA_VERSION,
    Counts,
    ImageRecord,
    ImageSpec,
    Manifest,
    ShardInfo,
    SplitInfo,
    feature_spec,
    parse_shard_filename,
    record_from_example,
    serialize_record,
    shard_filename,
    validate_example,
)

SHA = hashlib.sha256(b"x").hexdigest()


def _record(**overrides):
    fields = dict(
        encoded=b"\xff\xd8jpeg",
        format="JPEG",
        height=4,
        width=6,
        channels=3,
        label=2,
        text="grüne Äpfel",
        filename="gs://bucket/grüne Äpfel/a.jpg",
        sha256=SHA,
    )
    fields.update(overrides)
    return ImageRecord(**fields)


def test_round_trip_through_serialised_example():
    record = _record()
    data = serialize_record(record)
    assert record_from_example(data) == record
    assert serialize_record(record) == data  # deterministic


def test_parse_spec_matches_built_example():
    record = _record()
    parsed = tf.io.parse_example(tf.constant([serialize_record(record)]), feature_spec())
    assert parsed["image/class/label"].numpy().tolist() == [2]
    assert parsed["image/class/text"].numpy()[0].decode() == "grüne Äpfel"
    assert parsed["image/format"].numpy()[0] == b"JPEG"


def test_lenient_spec_reads_foreign_examples():
    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"abc"])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[7])),
            }
        )
    )
    parsed = tf.io.parse_example(
        tf.constant([example.SerializeToString()]), feature_spec(strict=False)
    )
    assert parsed["image/class/label"].numpy().tolist() == [7]
    assert parsed["image/format"].numpy().tolist() == [b""]
    with pytest.raises(ValueError, match="missing bytes feature"):
        validate_example(example)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoded=b""), "non-empty bytes"),
        (dict(format="GIF"), "must be one of"),
        (dict(height=0), "positive int"),
        (dict(channels=4), "channels"),
        (dict(label=-1), ">= 0"),
        (dict(text=""), "class/text"),
        (dict(sha256="ABC"), "64 lowercase hex"),
        (dict(format="RAW", encoded=b"\x00" * 5), "RAW"),
    ],
)
def test_bad_records_are_refused_with_the_bad_value(overrides, message):
    with pytest.raises(ValueError, match=message):
        _record(**overrides)


def test_shard_names_round_trip_and_refuse_bad_input():
    name = shard_filename("train", 3, 16)
    assert name == "train-00003-of-00016.tfrecord"
    assert parse_shard_filename(name) == ("train", 3, 16)
    with pytest.raises(ValueError):
        shard_filename("train", 16, 16)
    with pytest.raises(ValueError):
        parse_shard_filename("train-3-of-16.tfrecord")


def _manifest(**overrides):
    shard = ShardInfo(
        file="train-00000-of-00001.tfrecord", num_examples=3, num_bytes=100, sha256=SHA
    )
    fields = dict(
        label_names=("cat", "dog"),
        splits={"train": SplitInfo(num_examples=3, shards=(shard,))},
        counts=Counts(input=5, written=3, rejected=1, duplicates=1),
        image=ImageSpec(encoding="jpeg", image_size=256, crop="none"),
        options={"image_size": 256},
    )
    fields.update(overrides)
    return Manifest(**fields)


def test_manifest_json_round_trip_is_deterministic():
    manifest = _manifest()
    text = manifest.to_json()
    again = Manifest.from_json(text)
    assert again == manifest
    assert again.to_json() == text
    assert again.schema_version == SCHEMA_VERSION
    assert [s.file for s in again.all_shards()] == ["train-00000-of-00001.tfrecord"]


def test_manifest_refuses_inconsistent_counts_and_versions():
    with pytest.raises(ValueError, match="do not add up"):
        Counts(input=5, written=3, rejected=1, duplicates=0)
    with pytest.raises(ValueError, match="counts.written"):
        _manifest(counts=Counts(input=4, written=4, rejected=0, duplicates=0))
    data = _manifest().to_dict()
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99"):
        Manifest.from_dict(data)
    with pytest.raises(ValueError, match="missing field"):
        Manifest.from_json('{"label_names": []}')
    with pytest.raises(ValueError, match="relative path"):
        ShardInfo(file="../x.tfrecord", num_examples=1, num_bytes=1, sha256=SHA)
    with pytest.raises(ValueError, match="requires crop"):
        ImageSpec(encoding="raw", image_size=224, crop="none")
