"""``tfrecord_io.torch.example_fields`` against protobuf: wherever protobuf parses a message,
the same answer or the same refusal, on examples as our writer makes them, as other writers
may (unknown fields, unpacked and negative labels, duplicated features, other feature kinds),
and on damaged bytes. Where protobuf refuses a message for damage inside a feature the loader
does not read, the scanner may still read the features it needs (records reach it only after
their CRCs are checked, so such damage can only come from a writer)."""

from __future__ import annotations

import random

import pytest

from schemas import ImageRecord, serialize_record
from schemas.example_proto import Example
from tfrecord_io.torch.example_fields import read_fields
from tfrecord_io.torch.records import parse_example


def _both(data: bytes, with_key: bool = True):
    """``(scanner's answer, protobuf's answer)``, each a value or the exception type."""

    def run(fn):
        try:
            image, label, key = fn()
            return bytes(image), label, key
        except ValueError:
            return ValueError

    scanned = run(lambda: read_fields(data, 0, len(data), with_key=with_key, parse=parse_example))
    parsed = run(lambda: parse_example(data, with_key=with_key))
    return scanned, parsed


def _record(i: int) -> bytes:
    return serialize_record(
        ImageRecord(
            encoded=random.Random(i).randbytes(48),
            format="RAW",
            height=4,
            width=4,
            channels=3,
            label=i % 5,
            text=f"class {i % 5}",
            filename=f"/images/{i}.png",
            sha256=f"{i:064x}",
        )
    )


def test_our_records_read_in_place_as_protobuf_reads_them() -> None:
    for i in range(40):
        data = _record(i)
        image, label, key = read_fields(data, 0, len(data), with_key=True, parse=parse_example)
        assert isinstance(image, memoryview), "the image should be a view, not a copy"
        expected_image, expected_label, expected_key = parse_example(data, with_key=True)
        assert (bytes(image), label, key) == (expected_image, expected_label, expected_key)
        assert (label, key) == (i % 5, f"{i:064x}")


def _example(rng: random.Random) -> bytes:
    example = Example()
    features = example.features.feature
    if rng.random() < 0.95:
        features["image/encoded"].bytes_list.value.extend(
            [rng.randbytes(rng.randrange(0, 40)) for _ in range(rng.choice([1, 1, 1, 2, 0]))]
        )
    kind = rng.random()
    if kind < 0.8:
        features["image/class/label"].int64_list.value.extend(
            [rng.choice([0, 3, -1, 2**40, -(2**63)]) for _ in range(rng.choice([1, 1, 2, 0]))]
        )
    elif kind < 0.9:
        features["image/class/label"].float_list.value.append(1.0)
    if rng.random() < 0.5:
        features["image/key/sha256"].bytes_list.value.append(rng.choice([b"ab" * 32, b"\xff"]))
    for name in rng.sample(["image/format", "image/height", "zz", "image/class/text"], 2):
        features[name].int64_list.value.append(rng.randrange(1000))
    return example.SerializeToString(deterministic=rng.random() < 0.5)


def _mutations(data: bytes, rng: random.Random) -> list[bytes]:
    out = [data, data[: rng.randrange(len(data) + 1)], data + data]
    for _ in range(6):
        damaged = bytearray(data)
        if damaged:
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        out.append(bytes(damaged))
    # Unknown fields, and a field protobuf merges (a second "features").
    out.append(data + b"\x10\x05")
    out.append(b"\x1a\x02hi" + data)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_and_damaged_messages_get_protobufs_answer(seed: int) -> None:
    rng = random.Random(seed)
    agreed = scanned_ok = lenient = 0
    for _ in range(150):
        for data in _mutations(_example(rng), rng):
            for with_key in (True, False):
                scanned, parsed = _both(data, with_key)
                if parsed is ValueError and scanned is not ValueError:
                    lenient += 1  # damage outside the three features read
                    continue
                assert scanned == parsed, data
                agreed += 1
                scanned_ok += scanned is not ValueError
    assert agreed > 1000 and scanned_ok > 100  # both outcomes were exercised
    assert lenient < agreed / 10


def test_unpacked_labels_and_other_orders_read_as_protobuf_reads_them() -> None:
    # A label as an unpacked varint field (tag 8), and the map entry's value before its key.
    label = b"\x1a\x02\x08\x07"  # Feature{int64_list: Int64List{value: 7 (unpacked)}}
    entry_label = b"\x12" + bytes([len(label)]) + label + b"\x0a\x11image/class/label"
    image = b"\x0a\x05\x0a\x03abc"  # Feature{bytes_list: {value: "abc"}}
    entry_image = b"\x0a\x0dimage/encoded\x12" + bytes([len(image)]) + image
    body = b"".join(b"\x0a" + bytes([len(e)]) + e for e in (entry_label, entry_image))
    data = b"\x0a" + bytes([len(body)]) + body
    scanned, parsed = _both(data)
    assert scanned == parsed == (b"abc", 7, "")
