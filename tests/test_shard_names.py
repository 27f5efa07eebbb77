"""Shard names past 99,999 shards: five digits as before up to ``FIVE_DIGIT_SHARDS``, wider
beyond, as tfds names them; and every reader and tool reads both.

What the third-party readers do with wide names, tested here:

* tfds computes a shard's name from its split's shard count (``naming._num_digits_needed``:
  five digits, or as many as the count has) and opens exactly ``shard_filename``'s names;
  a split of 100,001 shards is read through its metadata.
* DALI and the ``tfrecord`` package take explicit file and index paths, so any name reads.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from catalog.index_files import index_filename
from dataset_tools.adopt import adopt
from dataset_tools.verify import verify_dataset
from dataset_tools.verify.job import run_verify_job
from schemas import Counts, ImageRecord, ImageSpec, Manifest, ShardInfo, SplitInfo, serialize_record
from schemas.constants import FIVE_DIGIT_SHARDS, MAX_SHARDS
from schemas.manifest import parse_shard_filename, shard_filename
from schemas.tfds_metadata import filepath_template, tfds_metadata_files
from tests.fixtures.shards import write_foreign_shards
from tfrecord_io.source import load_manifest

REPO = Path(__file__).resolve().parents[1]
WIDE = 123_456  # shards in the split the wide names below belong to


@pytest.mark.parametrize(
    "index, count, name",
    [
        (42, 1024, "train-00042-of-01024.tfrecord"),
        (0, 1, "train-00000-of-00001.tfrecord"),
        (99_998, 99_999, "train-99998-of-99999.tfrecord"),
        (0, 100_000, "train-000000-of-100000.tfrecord"),
        (99_999, 100_000, "train-099999-of-100000.tfrecord"),
        (42, 1_000_000, "validation-0000042-of-1000000.tfrecord"),
    ],
)
def test_names_keep_five_digits_up_to_99999_shards_and_widen_beyond(index, count, name):
    split = name.split("-")[0]
    assert shard_filename(split, index, count) == name
    assert parse_shard_filename(name) == (split, index, count)
    assert index_filename(name) == name.removesuffix(".tfrecord") + ".idx"


def test_names_sort_in_shard_order_within_a_split():
    names = [shard_filename("train", i, 100_001) for i in (0, 9, 99_999, 100_000)]
    assert names == sorted(names)


@pytest.mark.parametrize(
    "name",
    [
        "train-00003-of-100000.tfrecord",  # index narrower than the count
        "train-000003-of-00016.tfrecord",  # wider than five digits need
        "train-3-of-16.tfrecord",
        "train-00003-of-00016.tfrec",
    ],
)
def test_only_the_one_name_of_each_shard_parses(name):
    with pytest.raises(ValueError, match="not a shard file name"):
        parse_shard_filename(name)


def test_counts_over_the_limit_are_refused():
    assert FIVE_DIGIT_SHARDS == 99_999 and MAX_SHARDS == 999_999_999
    with pytest.raises(ValueError, match="count <= 999999999"):
        shard_filename("train", 0, MAX_SHARDS + 1)
    assert shard_filename("train", 0, MAX_SHARDS) == "train-000000000-of-999999999.tfrecord"


@pytest.mark.parametrize("count", [1, 16, 1024, 99_999, 100_000, WIDE, 10_000_000])
def test_tfds_names_every_shard_as_we_do(count):
    from tensorflow_datasets.core import naming

    template = naming.ShardedFileTemplate(
        data_dir=Path("/d"), template="{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}", split="train",
        filetype_suffix="tfrecord",
    )  # fmt: skip
    for index in {0, count // 2, count - 1}:
        expected = shard_filename("train", index, count)
        assert template.relative_filepath(shard_index=index, num_shards=count) == expected
    wide = [shard_filename("train", i, count) for i in (0, count - 1)]
    assert filepath_template("train", wide) == "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"


@pytest.fixture()
def wide_adopted(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Converter-style shards named as the first shards of a split of ``WIDE``, adopted: their
    index files, catalog and dataset.json carry the wide names."""
    foreign = write_foreign_shards(tmp_path / "shards", num_examples=12, num_shards=3)
    shards = []
    for i, path in enumerate(foreign.paths):
        wide = path.with_name(shard_filename("train", i, WIDE).removesuffix(".tfrecord"))
        path.rename(wide)
        shards.append(wide)
    adopt(str(tmp_path / "shards" / "train-*"), label_offset=1)
    return tmp_path / "shards", shards


def test_adopt_verify_and_the_verify_job_handle_wide_names(wide_adopted, tmp_path):
    root, shards = wide_adopted
    manifest = load_manifest(root)
    names = [s.file for s in manifest.split("train").shards]
    assert names == [p.name for p in shards] and names[0] == "train-000000-of-123456"
    assert [s.index.file for s in manifest.split("train").shards] == [
        f"{n}.idx" for n in names
    ]  # fmt: skip
    assert verify_dataset(root).ok
    data = bytearray(shards[1].read_bytes())
    data[len(data) // 2] ^= 0x01
    shards[1].write_bytes(bytes(data))
    report = run_verify_job(root, str(tmp_path / "report.json"))
    assert [s.file for s in report.failed_shards] == ["train-000001-of-123456"]


def test_the_reader_and_diff_read_wide_names(wide_adopted, tmp_path):
    from dataset_tools.diff import diff_datasets
    from tfrecord_io.reader import make_dataset

    root, shards = wide_adopted
    ds = make_dataset(root, global_batch_size=4, training=False, image_size=32)
    assert sum(int(images.shape[0]) for images, _ in ds) == 12
    # The same shards under five-digit names: the same examples, each in its own shard.
    five = tmp_path / "five"
    five.mkdir()
    for i, path in enumerate(shards):
        shutil.copyfile(path, five / shard_filename("train", i, 3).removesuffix(".tfrecord"))
    adopt(str(five / "train-*"), label_offset=1)
    totals = diff_datasets(str(five), str(root)).totals
    assert totals["unchanged"] == 12 and totals["added"] == totals["removed"] == 0, totals


_TFRECORD_PACKAGE = textwrap.dedent(
    """
    import sys
    from tfrecord.reader import tfrecord_loader
    print(sum(1 for _ in tfrecord_loader(sys.argv[1], sys.argv[2], {"image/encoded": "byte"})))
    """
)


def _dali_count(paths: list[str], index_paths: list[str]) -> int:
    """Examples DALI (CPU) reads from ``paths`` through ``index_paths``."""
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def

    features = {"image/encoded": tfrec.FixedLenFeature((), tfrec.string, "")}

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=1)
    def pipeline():
        inputs = fn.readers.tfrecord(
            path=paths, index_path=index_paths, features=features, name="Reader"
        )
        return inputs["image/encoded"]

    pipe = pipeline()
    pipe.build()
    total, read = pipe.epoch_size("Reader"), 0
    while read < total:
        (encoded,) = pipe.run()
        read += len(encoded)
    return total


@pytest.mark.slow
def test_dali_and_the_tfrecord_package_read_wide_names_through_their_index_files(wide_adopted):
    root, shards = wide_adopted
    assert _dali_count([str(p) for p in shards], [f"{p}.idx" for p in shards]) == 12
    for shard in shards:
        done = subprocess.run(
            [sys.executable, "-c", _TFRECORD_PACKAGE, str(shard), f"{shard}.idx"],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout) == 4


@pytest.mark.slow
def test_tfds_reads_a_split_of_100001_shards(tmp_path):
    """Only the first and last shard hold examples; tfds opens no other file."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from tests.fixtures.shards import make_image

    count, sha = 100_001, "0" * 64
    infos = [ShardInfo(shard_filename("train", i, count), 0, 0, sha) for i in range(count)]
    for i in (0, count - 1):
        name = shard_filename("train", i, count)
        pixels = make_image(i % 2, i, height=8, width=8)
        encoded = tf.io.encode_png(pixels).numpy()
        record = ImageRecord(encoded, "PNG", 8, 8, 3, i % 2, ["cat", "dog"][i % 2],
                             f"/{i}.png", f"{i:064x}")  # fmt: skip
        with tf.io.TFRecordWriter(str(tmp_path / name)) as writer:
            writer.write(serialize_record(record))
        infos[i] = ShardInfo(name, 1, (tmp_path / name).stat().st_size, sha)
    manifest = Manifest(
        label_names=("cat", "dog"),
        splits={"train": SplitInfo(2, tuple(infos))},
        counts=Counts(2, 2, 0, 0),
        image=ImageSpec("png", 8, "none"),
    )
    for name, text in tfds_metadata_files(manifest).items():
        (tmp_path / name).write_text(text)
    builder = tfds.builder_from_directory(str(tmp_path))
    read = list(tfds.as_numpy(builder.as_dataset(split="train", shuffle_files=False)))
    assert [ex["image/filename"].decode() for ex in read] == ["/0.png", f"/{count - 1}.png"]
