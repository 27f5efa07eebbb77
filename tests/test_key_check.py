"""dataset_tools.keys.KeyCollector: duplicate keys found in 24 bytes per example."""

from __future__ import annotations

import hashlib

from dataset_tools.keys import BYTES_PER_EXAMPLE, KeyCollector
from tests.fixtures.shards import to_inline_layout


def _key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_no_duplicates_and_the_memory_per_example() -> None:
    keys = KeyCollector()
    shard = keys.add_shard("train-00000-of-00001.tfrecord")
    n = 100_000
    for i in range(n):
        keys.add(shard, i, _key(i))
    assert keys.duplicates() == []
    assert keys.nbytes == BYTES_PER_EXAMPLE * n


def test_duplicates_within_and_across_shards_name_every_place() -> None:
    keys = KeyCollector()
    a, b = keys.add_shard("a.tfrecord"), keys.add_shard("b.tfrecord")
    for i in range(50):
        keys.add(a, i, _key(i))
    keys.add(b, 0, _key(7))  # across shards
    keys.add(b, 1, _key(1000))
    keys.add(b, 2, _key(1000))  # within a shard
    keys.add(b, 3, _key(7))  # a third time
    lines = keys.duplicates()
    assert len(lines) == 2
    seven = next(line for line in lines if _key(7)[:32] in line)
    assert (
        "appears 3 times: in a.tfrecord (record 7) and b.tfrecord (record 0) and "
        "b.tfrecord (record 3)" in seven
    )
    assert any("b.tfrecord (record 1) and b.tfrecord (record 2)" in line for line in lines)


def test_keys_that_are_not_digests_and_the_report_limit() -> None:
    keys = KeyCollector()
    s = keys.add_shard("s")
    for i in range(5):
        keys.add(s, 2 * i, f"file-{i}.jpg")
        keys.add(s, 2 * i + 1, f"file-{i}.jpg")
    keys.add(s, 10, "file-99.jpg")
    lines = keys.duplicates(limit=3)
    assert len(lines) == 4 and lines[-1] == "... and 2 more duplicated keys"


def test_verify_reports_a_key_stored_twice_naming_both_places(jpeg_dataset, tmp_path) -> None:
    import json

    from dataset_tools.verify.verification import verify_dataset
    from schemas import MANIFEST_NAME, serialize_record
    from schemas.framing import write_frame
    from tests.fixtures.shards import copy_dataset

    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    record = dataset.records["train"][0]
    shard = dataset.shard_paths("train")[1]
    with open(shard, "ab") as handle:
        write_frame(handle, serialize_record(record))
    to_inline_layout(dataset.root)  # entries edited as JSON
    data = json.loads((dataset.root / MANIFEST_NAME).read_text())
    entry = data["splits"]["train"]["shards"][1]
    entry["num_examples"] += 1
    entry["num_bytes"] = shard.stat().st_size
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    data["splits"]["train"]["num_examples"] += 1
    data["counts"]["input"] += 1
    data["counts"]["written"] += 1
    (dataset.root / MANIFEST_NAME).write_text(json.dumps(data))
    report = verify_dataset(dataset.root)
    assert not report.ok and all(s.ok for s in report.shards)
    (line,) = report.problems
    first = dataset.manifest.split("train").shards[0].file
    assert line.startswith(f"key {record.sha256[:32]}… appears 2 times: in {first} (record 0)")
    assert f"{shard.name} (record {entry['num_examples'] - 1})" in line
