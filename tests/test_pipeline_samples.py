"""The bundled sample set, and the quickstart's pipeline run over a small version of it."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from beam_pipelines import images_to_tfrecord, samples
from beam_pipelines.image.prepare import sniff_format
from schemas.image_example import record_from_example
from tfrecord_io.source import load_manifest


def test_sample_set_layout_and_odd_files(tmp_path):
    counts = samples.write_sample_set(tmp_path, per_class=3, size=(64, 48))
    assert counts == {"images": 12, "bad": 3, "duplicates": 1, "near_duplicates": 2}
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(samples.SAMPLE_CLASSES)
    assert any(" " in n for n in names) and any(not n.isascii() for n in names)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 12 + 3 + 1 + 2
    png_named_jpeg = [
        p for p in files if p.suffix == ".JPEG" and sniff_format(p.read_bytes()) == "PNG"
    ]
    assert len(png_named_jpeg) == len(samples.SAMPLE_CLASSES)
    jpegs = [p for p in files if sniff_format(p.read_bytes()) == "JPEG"]
    rotated = [p for p in jpegs if Image.open(p).getexif().get(0x0112) == 6]
    assert len(rotated) == len(samples.SAMPLE_CLASSES)


def test_sample_set_is_deterministic(tmp_path):
    samples.write_sample_set(tmp_path / "a", per_class=3, size=(32, 24))
    samples.write_sample_set(tmp_path / "b", per_class=3, size=(32, 24))
    a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*.*")}
    b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*.*")}
    assert a == b


def test_imagenet_like_jpegs_are_about_100_kb():
    sizes = [len(samples.imagenet_like_jpeg(seed)) for seed in range(4)]
    assert all(60_000 < s < 160_000 for s in sizes), sizes
    assert len(set(sizes)) == 4


def test_classes_are_told_apart_by_colour(tmp_path):
    # The quickstart trains a small CNN on these; their mean colours must differ clearly.
    means = {
        name: samples.textured_rgb((64, 48), seed=1, colour=style.colour).mean(axis=(0, 1))
        for name, style in samples.SAMPLE_CLASSES.items()
    }
    values = list(means.values())
    gaps = [np.abs(a - b).max() for i, a in enumerate(values) for b in values[i + 1 :]]
    assert min(gaps) > 40


def test_cli_rejects_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        samples.main(["--output", "x", "--size", "big"])
    assert "500x375" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        samples.main(["--output", "x", "--per_class", "2"])


@pytest.mark.slow
def test_quickstart_flow_on_a_small_sample_set(tmp_path, capsys):
    images = tmp_path / "images"
    assert samples.main(["--output", str(images), "--per_class", "6", "--size", "96x72"]) == 0
    output = tmp_path / "dataset"
    # 3 bad of 30 files is above the default 1%, as the small set is 1/16 of the default one.
    argv = ["--input", str(images), "--output", str(output), "--validation_fraction", "0.2"]
    assert images_to_tfrecord.main([*argv, "--overwrite", "--max_bad_fraction", "0.15"]) == 0
    out = capsys.readouterr().out
    # images/s is over the 28 images: the empty file and the text file are not images.
    assert "30 inputs (28 images) in " in out and ": 26 written, 3 rejected, 1 duplicate" in out
    rows = [json.loads(x) for x in (output / "rejected.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rows) == ["empty_file", "not_an_image", "truncated"]
    manifest = json.loads((output / "dataset.json").read_text(encoding="utf-8"))
    assert manifest["label_names"] == sorted(samples.SAMPLE_CLASSES)
    import tensorflow as tf

    heights = set()
    for shard in load_manifest(output).all_shards():
        for raw in tf.data.TFRecordDataset(str(output / shard.file)):
            record = record_from_example(bytes(raw.numpy()))
            heights.add(min(Image.open(io.BytesIO(record.encoded)).size))
    assert heights == {256}


def test_sample_set_plants_a_leakage_and_a_cross_class_near_duplicate(tmp_path):
    import hashlib

    from beam_pipelines.image.prepare import ImageOptions, prepare_image
    from beam_pipelines.output.shards import assign_split
    from catalog.near_duplicates import DEFAULT_THRESHOLD
    from catalog.phash import hamming

    samples.write_sample_set(tmp_path, per_class=12, size=(160, 120))

    def split(path):
        return assign_split(hashlib.sha256(path.read_bytes()).hexdigest(), 0.2)

    def phash(path):
        return prepare_image(path.read_bytes(), ImageOptions()).phash

    (reencoded,) = tmp_path.rglob("*_reencoded.JPEG")
    original = reencoded.with_name(reencoded.name.replace("_reencoded", ""))
    assert (split(original), split(reencoded)) == ("validation", "train")
    assert reencoded.read_bytes() != original.read_bytes()
    assert hamming(phash(original), phash(reencoded)) <= DEFAULT_THRESHOLD

    (near,) = tmp_path.rglob("near_copy_of_*.JPEG")
    source = next(tmp_path.rglob(near.name.removeprefix("near_copy_of_")))
    assert near.parent.name != source.parent.name
    assert Image.open(near).width == Image.open(source).width // 2
    assert hamming(phash(source), phash(near)) <= DEFAULT_THRESHOLD
