"""Third-party readers read our datasets as they are, through our index files.

Each test reads every example of a pipeline-built dataset with a real reader, using the index
files the shard writer wrote (no ``tfrecord2idx`` step), and checks keys and labels against the
catalog: NVIDIA DALI (CPU only), the ``tfrecord`` package (PyTorch users' reader, single files
and sharded; in a process of its own, as its protos clash with TensorFlow's), and tfds's
``builder_from_directory``. One more reads shards adopted from TensorFlow's converter layout
with DALI.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from catalog.table import read_table
from dataset_tools.adopt import adopt
from schemas import Manifest
from tests.fixtures.shards import write_foreign_shards
from tfrecord_io.source import load_manifest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def dataset(pipeline_dataset: Path) -> Path:
    return pipeline_dataset


def _manifest(root: Path) -> Manifest:
    return load_manifest(root)


def _catalog(root: Path, split: str) -> list[dict]:
    rows = read_table(str(root / f"catalog-{split}.parquet")).to_pylist()
    assert rows, f"split {split} is empty: the dataset is too small to test anything"
    return rows


def _dali_read(
    paths: list[str], index_paths: list[str], *, with_key: bool
) -> list[tuple[str, int, tuple[int, ...]]]:
    """Every example of ``paths`` in order, read by DALI on the CPU: (key, label, image shape)."""
    import numpy as np
    import nvidia.dali.fn as fn
    import nvidia.dali.tfrecord as tfrec
    from nvidia.dali import pipeline_def

    features = {
        "image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
        "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1),
    }
    if with_key:
        features["image/key/sha256"] = tfrec.FixedLenFeature((), tfrec.string, "")

    @pipeline_def(batch_size=4, num_threads=1, device_id=None, seed=1)
    def pipeline():
        inputs = fn.readers.tfrecord(
            path=paths, index_path=index_paths, features=features,
            random_shuffle=False, name="Reader",
        )  # fmt: skip
        images = fn.decoders.image(inputs["image/encoded"], device="cpu")
        key = inputs["image/key/sha256"] if with_key else inputs["image/encoded"]
        return key, inputs["image/class/label"], images

    pipe = pipeline()
    pipe.build()
    total = pipe.epoch_size("Reader")
    read: list[tuple[str, int, tuple[int, ...]]] = []
    while len(read) < total:
        keys, labels, images = pipe.run()
        for i in range(len(labels)):
            raw = np.asarray(keys.at(i)).tobytes()
            key = raw.decode() if with_key else hashlib.sha256(raw).hexdigest()
            read.append((key, int(np.asarray(labels.at(i))[0]), tuple(images.at(i).shape)))
    return read[:total]


def test_dali_reads_every_example_with_our_index_files(dataset):
    manifest = _manifest(dataset)
    for split, info in manifest.splits.items():
        read = _dali_read(
            [str(dataset / s.file) for s in info.shards],
            [str(dataset / s.index.file) for s in info.shards],
            with_key=True,
        )
        rows = _catalog(dataset, split)
        assert [(k, label) for k, label, _ in read] == [(r["key"], r["label"]) for r in rows]
        assert [shape for _, _, shape in read] == [(r["height"], r["width"], 3) for r in rows]


_TFRECORD_PACKAGE_READER = textwrap.dedent(
    """
    import json, sys
    from tfrecord.reader import multi_tfrecord_loader, tfrecord_loader

    root, stems = sys.argv[1], json.loads(sys.argv[2])
    description = {"image/key/sha256": "byte", "image/class/label": "int"}

    def row(example):
        return [bytes(example["image/key/sha256"]).decode(), int(example["image/class/label"][0])]

    single = {
        stem: [row(e) for e in tfrecord_loader(
            f"{root}/{stem}.tfrecord", f"{root}/{stem}.idx", description)]
        for stem in stems
    }
    # Sharded as a DataLoader's workers would (MultiTFRecordDataset's loader): two workers, each
    # reading its part of every shard, found through the index files.
    sharded = [
        [row(e) for e in multi_tfrecord_loader(
            data_pattern=f"{root}/{{}}.tfrecord", index_pattern=f"{root}/{{}}.idx",
            splits={stem: 1.0 for stem in stems}, description=description,
            infinite=False, shard=(worker, 2))]
        for worker in range(2)
    ]
    print(json.dumps({"single": single, "sharded": sharded}))
    """
)


def test_the_tfrecord_package_reads_single_and_sharded(dataset):
    manifest = _manifest(dataset)
    for split, info in manifest.splits.items():
        stems = [s.file.removesuffix(".tfrecord") for s in info.shards]
        done = subprocess.run(
            [sys.executable, "-c", _TFRECORD_PACKAGE_READER, str(dataset), json.dumps(stems)],
            capture_output=True, text=True, timeout=300, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout)
        rows = _catalog(dataset, split)
        for stem, shard in zip(stems, info.shards, strict=True):
            expected = [[r["key"], r["label"]] for r in rows if r["shard"] == shard.file]
            got = out["single"][stem]
            # Without a worker shard it starts at a random record (an index offset) and wraps.
            start = got.index(expected[0]) if expected else 0
            assert got[start:] + got[:start] == expected
        both = out["sharded"][0] + out["sharded"][1]
        assert sorted(map(tuple, both)) == sorted((r["key"], r["label"]) for r in rows)
        assert out["sharded"][0] and out["sharded"][1]


def test_tfds_builder_from_directory_reads_every_example(dataset):
    import tensorflow_datasets as tfds

    manifest = _manifest(dataset)
    builder = tfds.builder_from_directory(str(dataset))
    assert builder.info.features["image/class/label"].names == list(manifest.label_names)
    for split, info in manifest.splits.items():
        assert builder.info.splits[split].num_examples == info.num_examples
        assert builder.info.splits[split].shard_lengths == [s.num_examples for s in info.shards]
        read = [
            (
                ex["image/key/sha256"].decode(),
                int(ex["image/class/label"]),
                ex["image/encoded"].shape,
            )
            for ex in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
        ]
        rows = _catalog(dataset, split)
        assert read == [(r["key"], r["label"], (r["height"], r["width"], 3)) for r in rows]


def test_dali_reads_an_adopted_converter_style_dataset(tmp_path):
    foreign = write_foreign_shards(tmp_path / "shards", num_examples=15, num_shards=3, png_every=4)
    out = tmp_path / "adopted"
    manifest = adopt(str(tmp_path / "shards" / "train-*"), output=str(out), label_offset=1)
    info = manifest.split("train")
    read = _dali_read(
        [str(tmp_path / "shards" / s.file) for s in info.shards],
        [str(out / s.index.file) for s in info.shards],
        with_key=False,
    )
    rows = _catalog(out, "train")
    # DALI gives the stored (1-based) label; the catalog holds it minus --label_offset.
    assert [(k, label - 1) for k, label, _ in read] == [(r["key"], r["label"]) for r in rows]
    assert [shape for _, _, shape in read] == [(r["height"], r["width"], 3) for r in rows]
    assert sorted(r["uri"] for r in rows) == sorted(foreign.labels)
