"""The staging area (``beam_pipelines.output.staging``), the shard plan (``plan``) and the resume
records (``resume``): pure functions and small round trips on local disk and real buckets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipelines.builds.resume import remove_staging
from beam_pipelines.elements import CatalogMeta, Duplicate, ShardResult, StagedRecord
from beam_pipelines.engines import beam_internals
from beam_pipelines.graph.plan import (
    check_plan,
    estimated_example_bytes,
    listing_shard_counts,
    make_plan,
    read_plan,
    write_plan,
)
from beam_pipelines.image.prepare import ImageOptions
from beam_pipelines.output.done_records import (
    done_record_path,
    keys_digest,
    list_done_records,
    read_done_record,
    shard_result_from_record,
    write_done_record,
)
from beam_pipelines.output.shards import TRAIN, VALIDATION
from beam_pipelines.output.staging import (
    RecordStager,
    StagedRecordReader,
    frame_pieces,
    list_sidecars,
    payload_of_frame,
    read_sidecar,
    records_dir,
)


def _sha(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _beam_frame(payload: bytes) -> bytes:
    return beam_internals.tfrecord_frame(payload)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_frames_are_the_bytes_beams_tfrecord_writer_writes():
    for payload in (b"", b"x", bytes(range(256)) * 50):
        header, footer = frame_pieces(payload)
        frame = header + payload + footer
        assert frame == _beam_frame(payload)
        assert bytes(payload_of_frame(frame)) == payload


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: f[:-1], "the frame says"),
        (lambda f: f[:20] + bytes([f[20] ^ 1]) + f[21:], "data CRC mismatch"),
        (lambda f: bytes([f[0] ^ 1]) + f[1:], "length CRC mismatch"),
        (lambda f: f[:5], "shorter than a record frame"),
    ],
)
def test_damaged_frames_are_refused_naming_where(damage, message):
    frame = _beam_frame(b"payload bytes " * 10)
    with pytest.raises(ValueError, match=message) as info:
        payload_of_frame(damage(frame), "staged example of /a.jpg")
    assert "/a.jpg" in str(info.value)


def test_stager_hands_out_locations_only_for_committed_files(tmp_path):
    clock = _Clock()
    stager = RecordStager(str(tmp_path), max_file_bytes=10_000, max_file_seconds=60, clock=clock)
    meta = CatalogMeta(1, "cat", 8, 8, "JPEG")
    assert stager.add(_sha(0), "/a/0.jpg", b"x" * 3000, meta) == []
    assert stager.add(_sha(1), "/a/1.jpg", b"y" * 3000, None) == []
    # Nothing under its final name yet: only a hidden temporary file.
    staged = Path(records_dir(str(tmp_path)))
    assert [p.name for p in staged.iterdir() if not p.name.startswith(".")] == []
    committed = stager.add(_sha(2), "/a/2.jpg", b"z" * 5000, meta)  # past 10,000 bytes
    assert [r.uri for r in committed] == ["/a/0.jpg", "/a/1.jpg", "/a/2.jpg"]
    assert len({r.file for r in committed}) == 1
    assert [r.offset for r in committed] == [0, 3016, 6032]
    assert [r.length for r in committed] == [3016, 3016, 5016]
    assert committed[0].meta == meta and committed[1].meta is None
    # Time also commits: a slow or killed build loses at most max_file_seconds of work.
    assert stager.add(_sha(3), "/a/3.jpg", b"w", None) == []
    clock.now = 61
    (late,) = stager.add(_sha(4), "/a/4.jpg", b"v", None)[1:]
    assert late.uri == "/a/4.jpg"
    assert stager.flush() == []
    # Dropped, never handed out, and nothing left behind.
    stager.add(_sha(5), "/a/5.jpg", b"u", None)
    stager.close()
    names = sorted(p.name for p in staged.iterdir())
    assert not [n for n in names if n.startswith(".")]
    assert len([n for n in names if n.endswith(".tfrecord")]) == 2

    reader = StagedRecordReader(str(tmp_path))
    try:
        frames = list(reader.frames([*committed, late]))
    finally:
        reader.close()
    payloads = [b"x" * 3000, b"y" * 3000, b"z" * 5000, b"v"]
    assert frames == [_beam_frame(p) for p in payloads]

    sidecars = list_sidecars(str(tmp_path))
    assert len(sidecars) == 2
    again = sorted(r for path in sidecars for r in read_sidecar(path))
    assert again == sorted([*committed, StagedRecord(_sha(3), "/a/3.jpg", late.file, 0, 17), late])


def test_a_sidecar_whose_file_is_damaged_or_missing_reuses_nothing(tmp_path):
    stager = RecordStager(str(tmp_path))
    stager.add(_sha(0), "/a/0.jpg", b"x" * 100, None)
    (record,) = stager.flush()
    (sidecar,) = list_sidecars(str(tmp_path))
    data = Path(records_dir(str(tmp_path))) / record.file
    data.write_bytes(data.read_bytes()[:-1])
    assert read_sidecar(sidecar) == []
    data.unlink()
    assert read_sidecar(sidecar) == []


def test_reader_names_the_record_whose_staged_bytes_are_corrupt(tmp_path):
    stager = RecordStager(str(tmp_path))
    stager.add(_sha(0), "/a/good.jpg", b"x" * 100, None)
    stager.add(_sha(1), "/a/bad.jpg", b"y" * 100, None)
    good, bad = stager.flush()
    path = Path(records_dir(str(tmp_path))) / bad.file
    data = bytearray(path.read_bytes())
    data[bad.offset + 50] ^= 0xFF
    path.write_bytes(bytes(data))
    reader = StagedRecordReader(str(tmp_path))
    with pytest.raises(ValueError, match="/a/bad.jpg"):
        list(reader.frames([good, bad]))
    reader.close()


@pytest.mark.slow
@pytest.mark.parametrize("env_name", ["s3_env", "gcs_env"])
def test_staging_round_trip_on_a_bucket_with_ranged_reads(env_name, request):
    bucket = request.getfixturevalue(env_name)
    FileSystems.set_options(PipelineOptions([]))  # as the launcher does before any pipeline
    output = bucket.uri("dataset")
    stager = RecordStager(output, max_file_bytes=50_000)
    payloads = {i: bytes([i]) * (1000 + 37 * i) for i in range(60)}
    committed: list[StagedRecord] = []
    for i, payload in payloads.items():
        committed += stager.add(_sha(i), f"/src/{i}.jpg", payload, None)
    committed += stager.flush()
    assert len({r.file for r in committed}) > 1
    # Read back out of write order, with a read-ahead smaller than the records asked for.
    order = sorted(committed, key=lambda r: r.sha256)
    reader = StagedRecordReader(output, read_ahead_bytes=4000, threads=3)
    try:
        frames = list(reader.frames(order))
    finally:
        reader.close()
    assert frames == [_beam_frame(payloads[int(r.uri.split("/")[-1][:-4])]) for r in order]
    sidecars = list_sidecars(output)
    assert sorted(r for s in sidecars for r in read_sidecar(s)) == sorted(committed)
    assert remove_staging(output) >= 2 * len(sidecars)
    assert list_sidecars(output) == []


# --- the shard plan ------------------------------------------------------------------------------


def test_example_bytes_follow_the_documented_rule():
    raw = ImageOptions(image_size=192, crop="center", encoding="raw")
    assert estimated_example_bytes(raw) == 192 * 192 * 3 + 400
    jpeg = ImageOptions(image_size=256)  # q90, a 4:3 photo: 256 x 342 pixels at 0.80 B/px
    assert estimated_example_bytes(jpeg) == int(256 * 342 * (0.25 + 0.75 * 0.9**3)) + 400
    png = ImageOptions(image_size=64, crop="center", encoding="png")
    assert estimated_example_bytes(png) == 64 * 64 * 2 + 400


def test_listing_shard_counts():
    mib = 1 << 20
    # 1.28 M inputs of ~70 KB at 128 MiB per shard: ImageNet-sized train sets get ~700 shards.
    counts = listing_shard_counts(
        1_281_167, example_bytes=70_000, validation_fraction=0.0, target_shard_bytes=128 * mib
    )
    assert counts == {TRAIN: 669}
    assert listing_shard_counts(
        1000, example_bytes=mib, validation_fraction=0.2, target_shard_bytes=100 * mib
    ) == {TRAIN: 8, VALIDATION: 2}
    assert listing_shard_counts(0, example_bytes=1, validation_fraction=0.0, target_shard_bytes=1)
    with pytest.raises(ValueError, match="num_inputs"):
        listing_shard_counts(-1, example_bytes=1, validation_fraction=0.0, target_shard_bytes=1)


def test_plan_round_trip_and_a_changed_option_is_named(tmp_path):
    options = {"input": "/in", "image_size": 256, "max_bad_fraction": 0.01, "num_shards": None}
    plan = make_plan({TRAIN: 3}, options=options, rule="listing", num_inputs=10, example_bytes=5)
    assert read_plan(str(tmp_path)) is None
    write_plan(str(tmp_path), plan)
    again = read_plan(str(tmp_path))
    assert again is not None and again["shard_counts"] == {TRAIN: 3}
    check_plan(again, options, path="p")
    # A limit on bad input does not change what a shard holds: a resume may raise it.
    check_plan(again, {**options, "max_bad_fraction": 0.5}, path="p")
    with pytest.raises(ValueError, match=r"image_size 256 -> 224"):
        check_plan(again, {**options, "image_size": 224}, path="p")
    (tmp_path / ".staging" / "plan.json").write_text('{"format": 1}')
    with pytest.raises(ValueError, match="is not a shard plan"):
        read_plan(str(tmp_path))


# --- done records ---------------------------------------------------------------------------------


def test_done_record_round_trip(tmp_path):
    result = ShardResult(
        TRAIN, 3, 16, "train-00003-of-00016.tfrecord", 2, 100, "a" * 64, 20, "b" * 64
    )
    duplicates = [Duplicate("/z/copy.jpg", "/a/orig.jpg", _sha(1))]
    records = [StagedRecord(_sha(1), "/a/orig.jpg", "f", 0, 10)]
    write_done_record(str(tmp_path), result, duplicates, keys_digest(records))
    (path,) = list_done_records(str(tmp_path))
    assert path == done_record_path(str(tmp_path), result.file)
    assert path.endswith(".staging/done/train-00003-of-00016.json")
    record = read_done_record(path)
    assert shard_result_from_record(record) == result
    assert [Duplicate(**d) for d in record["duplicates"]] == duplicates
    assert record["keys_sha256"] == hashlib.sha256(f"{_sha(1)}\t/a/orig.jpg\n".encode()).hexdigest()
    assert json.loads(Path(path).read_text())["shard"]["file"] == result.file
    assert remove_staging(str(tmp_path)) == 1
    assert not (tmp_path / ".staging").exists()
