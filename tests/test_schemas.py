"""Tests for the shared example layout and the dataset.json manifest."""

import hashlib
import subprocess
import sys
from pathlib import Path

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
    build_example,
    example_proto,
    feature_spec,
    parse_shard_filename,
    record_from_example,
    serialize_record,
    shard_filename,
    validate_example,
)

ROOT = Path(__file__).resolve().parent.parent
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


def _tensorflow_example(record: ImageRecord) -> bytes:
    """The record as TensorFlow's own ``tf.train.Example``, written out independently."""

    def _bytes(value: bytes) -> tf.train.Feature:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    def _int(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    example = tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": _bytes(record.encoded),
                "image/format": _bytes(record.format.encode()),
                "image/height": _int(record.height),
                "image/width": _int(record.width),
                "image/channels": _int(record.channels),
                "image/class/label": _int(record.label),
                "image/class/text": _bytes(record.text.encode()),
                "image/filename": _bytes(record.filename.encode()),
                "image/key/sha256": _bytes(record.sha256.encode()),
            }
        )
    )
    return example.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"label": 0, "text": "a"},
        {"label": 2**40, "height": 70000, "width": 1},
        {"format": "RAW", "height": 2, "width": 3, "channels": 3, "encoded": bytes(range(18))},
        {"format": "PNG", "channels": 1, "encoded": b"\x89PNG" + bytes(300_000)},
        {"text": "日本語 クラス", "filename": "s3://b/日本語 クラス/ファイル.jpeg"},
    ],
)
def test_serialised_bytes_equal_tensorflows_example(overrides):
    record = _record(**overrides)
    assert serialize_record(record) == _tensorflow_example(record)
    assert build_example(record).SerializeToString(deterministic=True) == serialize_record(record)


def test_example_proto_reads_and_writes_every_feature_kind_like_tensorflow():
    example = example_proto.Example()
    feature = example.features.feature
    feature["b"].bytes_list.value.extend([b"", b"\x00\xff"])
    feature["f"].float_list.value.extend([1.5, -0.0, 2.0**100])
    feature["i"].int64_list.value.extend([-1, 0, 2**63 - 1])
    data = example.SerializeToString(deterministic=True)
    parsed = tf.train.Example.FromString(data)
    assert list(parsed.features.feature["b"].bytes_list.value) == [b"", b"\x00\xff"]
    assert list(parsed.features.feature["f"].float_list.value) == [1.5, -0.0, 2.0**100]
    assert list(parsed.features.feature["i"].int64_list.value) == [-1, 0, 2**63 - 1]
    assert parsed.SerializeToString(deterministic=True) == data
    assert example_proto.Example.FromString(data) == example


def test_serialising_a_record_does_not_import_tensorflow():
    code = (
        "import sys\n"
        "from schemas import ImageRecord, serialize_record\n"
        "record = ImageRecord(encoded=b'x', format='JPEG', height=1, width=1, channels=3,\n"
        f"    label=0, text='a', filename='a.jpg', sha256='{SHA}')\n"
        "assert len(serialize_record(record)) > 64\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


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
    # The inline layout (format version 1); shard tables: tests/test_manifest_layout.py.
    manifest = _manifest(format_version=1)
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
    data = _manifest(format_version=1).to_dict()
    data["schema_version"] = 99
    with pytest.raises(ValueError, match="schema_version 99"):
        Manifest.from_dict(data)
    with pytest.raises(ValueError, match="missing field"):
        Manifest.from_json('{"label_names": []}')
    with pytest.raises(ValueError, match="relative path"):
        ShardInfo(file="../x.tfrecord", num_examples=1, num_bytes=1, sha256=SHA)
    with pytest.raises(ValueError, match="requires crop"):
        ImageSpec(encoding="raw", image_size=224, crop="none")
