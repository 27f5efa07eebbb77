"""make_dataset: order, coverage, sharding, augmentation, sources, corrupt data, options."""

from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures.shards import (
    ForeignShards,
    WrittenDataset,
    copy_dataset,
    write_dataset,
    write_foreign_shards,
)
from tfrecord_io import (
    CorruptionCounter,
    ReadConfig,
    label_names,
    load_manifest,
    make_dataset,
    num_classes,
    resolve_source,
)
from tfrecord_io.decode import MEAN_RGB, STDDEV_RGB


def _collect(ds: tf.data.Dataset) -> tuple[list[np.ndarray], list[int], list[str], list[int]]:
    """Images, labels, keys and batch sizes of a finite dataset with keys."""
    images, labels, keys, sizes = [], [], [], []
    for batch_images, batch_labels, batch_keys in ds:
        images.extend(batch_images.numpy())
        labels.extend(batch_labels.numpy().tolist())
        keys.extend(k.decode() for k in batch_keys.numpy())
        sizes.append(int(batch_images.shape[0]))
    return images, labels, keys, sizes


def _context(pipeline_id: int, pipelines: int = 2) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines,
        input_pipeline_id=pipeline_id,
        num_replicas_in_sync=pipelines,
    )


@pytest.mark.parametrize("fixture", ["jpeg_dataset", "raw_dataset", "png_dataset"])
def test_eval_epoch_yields_every_example_exactly_once(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    dataset: WrittenDataset = request.getfixturevalue(fixture)
    ds = make_dataset(
        dataset.root,
        "validation",
        global_batch_size=4,
        training=False,
        image_size=24,
        read_config=ReadConfig(with_keys=True),
    )
    images, labels, keys, sizes = _collect(ds)
    assert collections.Counter(keys) == collections.Counter(dataset.keys("validation"))
    assert sizes == [4, 4, 2]  # 10 examples: the last partial batch is kept
    truth = dataset.labels("validation")
    assert labels == [truth[k] for k in keys]
    assert all(image.shape == (24, 24, 3) and image.dtype == np.uint8 for image in images)
    # A second pass over the same dataset object gives the same ordered epoch.
    assert _collect(ds)[2] == keys


def test_eval_center_crop_of_raw_is_the_stored_center(raw_dataset: WrittenDataset) -> None:
    ds = make_dataset(
        raw_dataset.root,
        "validation",
        global_batch_size=16,
        training=False,
        image_size=24,
        read_config=ReadConfig(with_keys=True),
    )
    images, _, keys, _ = _collect(ds)
    stored = {
        r.sha256: np.frombuffer(r.encoded, np.uint8).reshape(32, 32, 3)
        for r in raw_dataset.records["validation"]
    }
    for image, key in zip(images, keys, strict=True):
        np.testing.assert_array_equal(image, stored[key][4:28, 4:28])


def test_float32_output_is_normalised(raw_dataset: WrittenDataset) -> None:
    common = dict(global_batch_size=16, training=False, image_size=32)
    as_uint8 = _collect(
        make_dataset(
            raw_dataset.root, "validation", read_config=ReadConfig(with_keys=True), **common
        )
    )[0]
    float32 = ReadConfig(with_keys=True, output="float32")
    as_float = _collect(make_dataset(raw_dataset.root, "validation", read_config=float32, **common))
    expected = (np.stack(as_uint8).astype(np.float32) - MEAN_RGB) / STDDEV_RGB
    np.testing.assert_allclose(np.stack(as_float[0]), expected, rtol=1e-5, atol=1e-5)
    assert as_float[0][0].dtype == np.float32


@pytest.mark.parametrize("training", [False, True])
def test_two_input_pipelines_are_disjoint_cover_everything_with_per_replica_batches(
    jpeg_dataset: WrittenDataset, training: bool
) -> None:
    seen = []
    for pipeline_id in range(2):
        ds = make_dataset(
            jpeg_dataset.root,
            "train",
            global_batch_size=8,
            input_context=_context(pipeline_id),
            training=training,
            image_size=24,
            seed=1,
            read_config=ReadConfig(
                with_keys=True, num_epochs=1, shuffle_buffer=1 if training else None
            ),
        )
        _, _, keys, sizes = _collect(ds)
        assert sizes and all(size == 4 for size in sizes[:-1])  # 8 global / 2 replicas
        assert sizes[-1] <= 4
        seen.append(keys)
    if training:
        # Full batches only in training: at most one partial batch's worth is dropped per pipeline.
        assert not set(seen[0]) & set(seen[1])
        assert len(seen[0]) + len(seen[1]) >= len(jpeg_dataset.keys("train")) - 2 * 3
    else:
        assert not set(seen[0]) & set(seen[1])
        assert collections.Counter(seen[0] + seen[1]) == collections.Counter(
            jpeg_dataset.keys("train")
        )
    # File sharding: each shard is read whole by exactly one pipeline.
    shard_of = jpeg_dataset.shard_of("train")
    files = [{shard_of[k] for k in keys} for keys in seen]
    assert not files[0] & files[1]
    if not training:
        for keys, own in zip(seen, files, strict=True):
            assert sorted(keys) == sorted(k for k, f in shard_of.items() if f in own)


def test_fewer_files_than_pipelines_is_a_clear_error_with_a_record_fallback(
    jpeg_dataset: WrittenDataset,
) -> None:
    with pytest.raises(ValueError, match=r"2 shard file\(s\) but there are 4 input pipelines"):
        make_dataset(
            jpeg_dataset.root,
            "validation",
            global_batch_size=4,
            input_context=_context(0, pipelines=4),
            training=False,
        )
    seen = []
    for pipeline_id in range(4):
        ds = make_dataset(
            jpeg_dataset.root,
            "validation",
            global_batch_size=4,
            input_context=_context(pipeline_id, pipelines=4),
            training=False,
            image_size=16,
            read_config=ReadConfig(with_keys=True, sharding="records"),
        )
        _, _, keys, sizes = _collect(ds)
        assert all(size == 1 for size in sizes)
        seen.extend(keys)
    assert collections.Counter(seen) == collections.Counter(jpeg_dataset.keys("validation"))


def test_global_batch_not_divisible_by_replicas_is_an_error(jpeg_dataset: WrittenDataset) -> None:
    with pytest.raises(ValueError, match="7"):
        make_dataset(jpeg_dataset.root, global_batch_size=7, input_context=_context(0))


def _train_keys_and_images(dataset: WrittenDataset, seed: int | None, batches: int = 6) -> Any:
    ds = make_dataset(
        dataset.root,
        "train",
        global_batch_size=4,
        image_size=24,
        seed=seed,
        read_config=ReadConfig(with_keys=True),
    )
    out = list(itertools.islice(ds, batches))
    keys = [k.decode() for _, _, batch in out for k in batch.numpy()]
    images = np.concatenate([images.numpy() for images, _, _ in out])
    return keys, images


@pytest.mark.parametrize("fixture", ["jpeg_dataset", "raw_dataset"])
def test_seeded_runs_reproduce_order_and_augmentation(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    dataset: WrittenDataset = request.getfixturevalue(fixture)
    keys_a, images_a = _train_keys_and_images(dataset, seed=11)
    keys_b, images_b = _train_keys_and_images(dataset, seed=11)
    keys_c, _ = _train_keys_and_images(dataset, seed=12)
    assert keys_a == keys_b
    np.testing.assert_array_equal(images_a, images_b)
    assert keys_a != keys_c


def test_training_reshuffles_file_order_every_epoch(jpeg_dataset: WrittenDataset) -> None:
    shard_of = jpeg_dataset.shard_of("train")
    epochs, per_epoch = 6, len(shard_of)
    ds = make_dataset(
        jpeg_dataset.root,
        "train",
        global_batch_size=per_epoch,
        image_size=16,
        seed=3,
        read_config=ReadConfig(with_keys=True, num_epochs=epochs, shuffle_buffer=1, cycle_length=1),
    )
    orders = []
    for _, _, keys in ds:
        files = [shard_of[k.decode()] for k in keys.numpy()]
        orders.append(tuple(f for f, _ in itertools.groupby(files)))
    assert len(orders) == epochs
    assert all(sorted(order) == sorted(set(shard_of.values())) for order in orders)
    assert len(set(orders)) > 1, f"file order never changed across {epochs} epochs: {orders[0]}"


def test_training_augments_each_epoch_differently(jpeg_dataset: WrittenDataset) -> None:
    ds = make_dataset(
        jpeg_dataset.root,
        "validation",
        global_batch_size=10,
        image_size=24,
        seed=5,
        read_config=ReadConfig(with_keys=True, num_epochs=2, shuffle_buffer=1),
    )
    (images_1, _, keys_1), (images_2, _, keys_2) = list(ds)
    by_key_1 = dict(zip(keys_1.numpy(), images_1.numpy(), strict=True))
    by_key_2 = dict(zip(keys_2.numpy(), images_2.numpy(), strict=True))
    assert by_key_1.keys() == by_key_2.keys()
    differing = sum(not np.array_equal(by_key_1[k], by_key_2[k]) for k in by_key_1)
    assert differing >= 8  # random crop and flip give new views of (almost) every image


@pytest.mark.parametrize("cache", ["memory", "file"])
def test_cache_keeps_every_epoch_complete(
    jpeg_dataset: WrittenDataset, cache: str, tmp_path: Path
) -> None:
    target = "memory" if cache == "memory" else str(tmp_path / "cache" / "train")
    if cache == "file":
        (tmp_path / "cache").mkdir()
    ds = make_dataset(
        jpeg_dataset.root,
        "validation",
        global_batch_size=5,
        image_size=16,
        seed=2,
        read_config=ReadConfig(with_keys=True, num_epochs=3, cache=target),
    )
    _, _, keys, sizes = _collect(ds)
    assert sizes == [5] * 6
    assert collections.Counter(keys) == collections.Counter(jpeg_dataset.keys("validation") * 3)
    if cache == "file":
        assert any(p.name.startswith("train") for p in (tmp_path / "cache").iterdir())


def test_foreign_imagenet_converter_shards_are_read(foreign_shards: ForeignShards) -> None:
    assert load_manifest(foreign_shards.glob) is None
    assert label_names(foreign_shards.glob) is None and num_classes(foreign_shards.glob) is None
    assert resolve_source(foreign_shards.glob).paths == [str(p) for p in foreign_shards.paths]
    ds = make_dataset(
        foreign_shards.glob,
        global_batch_size=5,
        training=False,
        image_size=24,
        read_config=ReadConfig(label_offset=foreign_shards.label_offset),
    )
    labels, count = [], 0
    for images, batch_labels in ds:
        assert images.shape[1:] == (24, 24, 3)
        labels.extend(batch_labels.numpy().tolist())
        count += int(images.shape[0])
    assert count == len(foreign_shards.labels)
    assert collections.Counter(labels) == collections.Counter(foreign_shards.labels.values())
    # Training reads them too (random crops over JPEG and the PNG ones).
    train = make_dataset(
        foreign_shards.glob,
        global_batch_size=4,
        image_size=24,
        seed=0,
        read_config=ReadConfig(label_offset=1),
    )
    images, batch_labels = next(iter(train))
    assert images.shape == (4, 24, 24, 3) and set(batch_labels.numpy()) <= {0, 1, 2}


def test_foreign_labels_below_the_offset_fail_with_a_hint(foreign_shards: ForeignShards) -> None:
    ds = make_dataset(
        foreign_shards.glob,
        global_batch_size=12,
        training=False,
        image_size=16,
        read_config=ReadConfig(label_offset=2),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_offset=2"):
        list(ds)


def test_manifest_source_exposes_labels(jpeg_dataset: WrittenDataset) -> None:
    assert label_names(jpeg_dataset.root) == ("cat", "dog", "fish")
    assert num_classes(jpeg_dataset.root / "dataset.json") == 3
    assert load_manifest(str(jpeg_dataset.root)) == jpeg_dataset.manifest


def _flip_byte(path: Path, where: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_damaged_shard_fails_naming_the_file(
    jpeg_dataset: WrittenDataset, tmp_path: Path, damage: str
) -> None:
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard = dataset.shard_paths("validation")[1]
    # Damage after building: the pipeline itself must notice (a file can vanish mid-training).
    ds = make_dataset(dataset.root, "validation", global_batch_size=4, training=False)
    if damage == "flip":
        _flip_byte(shard)
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    else:
        shard.unlink()
    with pytest.raises(tf.errors.InvalidArgumentError, match=str(shard)):
        list(ds)
    if damage == "missing":
        with pytest.raises(FileNotFoundError, match=str(shard)):
            make_dataset(dataset.root, "validation", global_batch_size=4, training=False)


def test_shard_resized_before_reading_fails_naming_it(
    jpeg_dataset: WrittenDataset, tmp_path: Path
) -> None:
    # A whole extra record appended, valid CRCs and all: reading stops at the committed count,
    # so the size is what tells this file is not the one committed.
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    shard, other = dataset.shard_paths("validation")[0], dataset.shard_paths("validation")[1]
    shard.write_bytes(shard.read_bytes() + other.read_bytes())
    with pytest.raises(ValueError, match=f"shard {shard} is .* bytes, but its manifest entry"):
        make_dataset(dataset.root, "validation", global_batch_size=4, training=False)
    counter = CorruptionCounter()
    ds = make_dataset(
        dataset.root,
        "validation",
        global_batch_size=4,
        training=False,
        corruption_counter=counter,
        read_config=ReadConfig(with_keys=True, skip_corrupt=True),
    )
    _, _, keys, _ = _collect(ds)
    assert counter.as_dict()["damaged_shards"] == 1
    shard_of = dataset.shard_of("validation")
    assert sorted(keys) == sorted(k for k, f in shard_of.items() if f != shard.name)


def test_skip_corrupt_logs_and_counts(
    jpeg_dataset: WrittenDataset,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    dataset = copy_dataset(jpeg_dataset, tmp_path / "ds")
    damaged, missing = dataset.shard_paths("train")[0], dataset.shard_paths("train")[2]
    _flip_byte(damaged, 0.6)
    missing.unlink()
    shards = dataset.manifest.split("train").shards
    counter = CorruptionCounter()
    ds = make_dataset(
        dataset.root,
        "train",
        global_batch_size=4,
        training=False,
        image_size=16,
        corruption_counter=counter,
        read_config=ReadConfig(with_keys=True, skip_corrupt=True),
    )
    _, _, keys, _ = _collect(ds)
    counts = counter.as_dict()
    assert counts["damaged_shards"] == 2
    assert counts["records_skipped"] == len(dataset.keys("train")) - len(keys)
    assert 0 < counts["bytes_skipped"] <= shards[0].num_bytes + shards[2].num_bytes
    assert len(keys) == len(set(keys)) < len(dataset.keys("train"))
    # Damage found while reading is printed by the pipeline; a shard missing at build is logged.
    assert str(damaged) in capfd.readouterr().err
    assert str(missing) in caplog.text


def test_foreign_shard_truncated_mid_record_fails_naming_it(tmp_path: Path) -> None:
    shards = write_foreign_shards(tmp_path / "foreign", num_examples=6, num_shards=2)
    victim = shards.paths[1]
    victim.write_bytes(victim.read_bytes()[:-7])
    ds = make_dataset(
        shards.glob, global_batch_size=6, training=False, read_config=ReadConfig(label_offset=1)
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=str(victim)):
        list(ds)


@pytest.mark.parametrize(
    ("kwargs", "read", "message"),
    [
        ({"global_batch_size": 0}, None, "global_batch_size must be a positive int"),
        ({"global_batch_size": 4, "image_size": 0}, None, "image_size must be a positive int"),
        ({"global_batch_size": 4}, {"output": "float16"}, "output must be one of"),
        ({"global_batch_size": 4}, {"cache": ""}, "cache must be None"),
        ({"global_batch_size": 4}, {"sharding": "rows"}, "sharding must be one of"),
        ({"global_batch_size": 4, "seed": -1}, None, "seed must be an int >= 0"),
        ({"global_batch_size": 4}, {"jpeg_dct_method": "FAST"}, "jpeg_dct_method"),
        ({"global_batch_size": 4}, {"with_keys": "yes"}, "with_keys must be True or False"),
        ({"global_batch_size": 4}, {"cycle_length": 0}, "cycle_length must be a positive int"),
        (
            {"global_batch_size": 4, "corruption_counter": "x"},
            None,
            "only used with skip_corrupt=True",
        ),
        ({"global_batch_size": 4, "service": 5050}, None, "service must be a dispatcher address"),
        ({"global_batch_size": 4, "service": "http://h:1"}, None, "protocol 'http'"),
        (
            {"global_batch_size": 4, "read_config": {"with_keys": True}},
            None,
            "read_config must be a tfrecord_io.ReadConfig",
        ),
    ],
)
def test_bad_options_are_named(
    jpeg_dataset: WrittenDataset,
    kwargs: dict[str, object],
    read: dict[str, object] | None,
    message: str,
) -> None:
    with pytest.raises(ValueError, match=message):
        if read is not None:
            kwargs = {**kwargs, "read_config": ReadConfig(**read)}  # type: ignore[arg-type]
        make_dataset(jpeg_dataset.root, **kwargs)  # type: ignore[arg-type]


def test_read_config_takes_keywords_only_and_is_shared_unchanged(
    jpeg_dataset: WrittenDataset,
) -> None:
    with pytest.raises(TypeError):
        ReadConfig(True)  # type: ignore[misc]
    config = ReadConfig(with_keys=True)
    ds = make_dataset(
        jpeg_dataset.root, "validation", global_batch_size=4, training=False, read_config=config
    )
    assert len(ds.element_spec) == 3
    assert config == ReadConfig(with_keys=True)


def test_bad_sources_are_named(jpeg_dataset: WrittenDataset, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        make_dataset(tmp_path / "nope", global_batch_size=4)
    with pytest.raises(FileNotFoundError, match="has no dataset.json"):
        make_dataset(tmp_path, global_batch_size=4)
    with pytest.raises(FileNotFoundError, match="no TFRecord files match"):
        make_dataset(str(tmp_path / "*.tfrecord"), global_batch_size=4)
    with pytest.raises(KeyError, match="'test' not in dataset"):
        make_dataset(jpeg_dataset.root, "test", global_batch_size=4)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dataset.json").write_text("{}")
    with pytest.raises(ValueError, match="dataset.json is missing field"):
        make_dataset(broken, global_batch_size=4)


def test_raw_stored_larger_than_output_is_cropped_randomly(tmp_path: Path) -> None:
    dataset = write_dataset(
        tmp_path / "raw48",
        encoding="raw",
        image_size=48,
        examples={"train": 8},
        num_shards={"train": 2},
    )
    ds = make_dataset(
        dataset.root,
        global_batch_size=8,
        image_size=32,
        seed=0,
        read_config=ReadConfig(num_epochs=1),
    )
    images, labels = next(iter(ds))
    assert images.shape == (8, 32, 32, 3)
    stored = [
        np.frombuffer(r.encoded, np.uint8).reshape(48, 48, 3) for r in dataset.records["train"]
    ]
    offsets = set()
    for image in images.numpy():
        for candidate in stored:
            for flip in (image, image[:, ::-1]):
                match = [
                    (y, x)
                    for y in range(17)
                    for x in range(17)
                    if np.array_equal(candidate[y : y + 32, x : x + 32], flip)
                ]
                offsets.update(match)
    assert len(offsets) > 1  # crops come from different places


def test_raw_training_flips_about_half_and_otherwise_returns_the_stored_pixels(
    raw_dataset: WrittenDataset,
) -> None:
    stored = {
        r.sha256: np.frombuffer(r.encoded, np.uint8).reshape(32, 32, 3)
        for r in raw_dataset.records["train"]
    }
    ds = make_dataset(
        raw_dataset.root,
        global_batch_size=8,
        image_size=32,
        seed=3,
        read_config=ReadConfig(with_keys=True, num_epochs=10),
    )
    flipped = kept = 0
    for images, _, keys in ds:
        for image, key in zip(images.numpy(), keys.numpy(), strict=True):
            original = stored[key.decode()]
            if np.array_equal(image, original):
                kept += 1
            else:
                assert np.array_equal(image, original[:, ::-1]), "neither stored nor mirrored"
                flipped += 1
    assert flipped + kept == 240
    assert 80 <= flipped <= 160  # Binomial(240, 1/2): 120 +- 40 is over 5 standard deviations


@pytest.mark.parametrize("batch", [1, 5, 16])
def test_flip_follows_its_mask_and_flips_each_position_half_the_time(batch: int) -> None:
    from tfrecord_io.decode import flip_images, flip_mask

    images = tf.reshape(tf.range(batch * 3 * 4 * 3) % 251, [batch, 3, 4, 3])
    images = tf.cast(images, tf.uint8)
    counts = np.zeros(batch)
    together = 0
    draws = 600
    for seeds in tf.data.Dataset.random(seed=7).batch(batch).take(draws):
        mask = flip_mask(seeds).numpy()
        expected = np.where(mask[:, None, None, None], images.numpy()[:, :, ::-1], images.numpy())
        np.testing.assert_array_equal(flip_images(images, mask).numpy(), expected)
        counts += mask
        together += int(batch > 1 and mask[0] == mask[-1])
    # Every position is flipped with probability 1/2, independently of the others.
    assert np.all(np.abs(counts / draws - 0.5) < 0.09), counts / draws
    if batch > 1:
        assert abs(together / draws - 0.5) < 0.09, together / draws
