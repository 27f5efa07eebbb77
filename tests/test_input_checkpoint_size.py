"""Iterator checkpoints of exact epochs hold positions, not decoded batches
(``ReadConfig(symbolic_checkpoint=True)``, what the trainer reads with), and still resume
exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures.shards import WrittenDataset, copy_dataset, write_dataset
from tfrecord_io import ReadConfig, make_dataset
from tfrecord_io.delivery import DeliveredSet
from trainer.config import DataConfig
from trainer.inputs import ReaderInputs

N = 96
BATCH = 16
SIZE = 64
# What a checkpoint holds besides the shuffle buffer's records: the positions of every op, and
# TensorFlow's framing of each buffered element (its key and tensor header) beyond the 16 bytes
# a TFRecord frame takes.
_FIXED_BYTES = 32 * 1024
_PER_RECORD_BYTES = 64


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> WrittenDataset:
    """96 train examples of 64 px JPEGs in 4 shards: one decoded batch of 16 (196 KB) is
    about half the split (~400 KB)."""
    return write_dataset(
        tmp_path_factory.mktemp("ckpt_size") / "ds",
        examples={"train": N},
        num_shards={"train": 4},
        image_size=SIZE,
    )


def _split_bytes(dataset: WrittenDataset) -> int:
    return sum(s.num_bytes for s in dataset.manifest.split("train").shards)


def _build(dataset: WrittenDataset, **read: object) -> tf.data.Dataset:
    return make_dataset(
        dataset.root,
        global_batch_size=BATCH,
        image_size=SIZE,
        seed=7,
        read_config=ReadConfig(with_keys=True, exclude=DeliveredSet.empty(N), **read),  # type: ignore[arg-type]
    )


def _checkpoint_bytes(iterator: object, directory: Path) -> tuple[int, str]:
    """Writes ``iterator``'s checkpoint; returns the bytes of its files and its path."""
    path = tf.train.Checkpoint(iterator=iterator).write(str(directory / "ckpt"))
    return sum(f.stat().st_size for f in directory.glob("ckpt*")), path


def test_a_symbolic_checkpoint_is_no_bigger_than_the_split(dataset, tmp_path):
    split = _split_bytes(dataset)
    iterator = iter(_build(dataset, symbolic_checkpoint=True))
    for _ in range(2):
        next(iterator)
    size, _ = _checkpoint_bytes(iterator, tmp_path / "symbolic")
    # The record shuffle buffer (the whole split here, as encoded records) and positions; no
    # decoded batch (196 KB each), which the explicit checkpoint holds several of.
    assert size <= split + _PER_RECORD_BYTES * N + _FIXED_BYTES, (size, split)
    # Without a shuffle buffer only positions remain: kilobytes.
    iterator = iter(_build(dataset, symbolic_checkpoint=True, shuffle_buffer=1))
    next(iterator)
    positions_only, _ = _checkpoint_bytes(iterator, tmp_path / "positions")
    assert positions_only <= _FIXED_BYTES, positions_only


def test_a_symbolic_checkpoint_resumes_exactly(dataset, tmp_path):
    iterator = iter(_build(dataset, symbolic_checkpoint=True))
    for _ in range(4):  # of 6 batches an epoch: what follows crosses into the next epoch
        next(iterator)
    _, path = _checkpoint_bytes(iterator, tmp_path)
    expected = [next(iterator) for _ in range(4)]
    restored = iter(_build(dataset, symbolic_checkpoint=True))
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    for want, got in zip(expected, (next(restored) for _ in range(4)), strict=True):
        np.testing.assert_array_equal(want[0].numpy(), got[0].numpy())  # augmentation too
        np.testing.assert_array_equal(want[2].numpy(), got[2].numpy())  # keys
        np.testing.assert_array_equal(want[3].numpy(), got[3].numpy())  # positions
    assert set((np.concatenate([e[3].numpy() for e in expected]) // N).tolist()) == {0, 1}


def test_a_damaged_record_still_fails_without_ignore_errors(dataset, tmp_path):
    damaged = copy_dataset(dataset, tmp_path / "ds")
    shard = damaged.root / damaged.manifest.split("train").shards[0].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: the build-time size check passes
    shard.write_bytes(bytes(data))
    with pytest.raises((tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
        for _ in _build(damaged, symbolic_checkpoint=True, num_epochs=1):
            pass


@pytest.mark.parametrize(
    ("read", "match"),
    [
        ({"symbolic_checkpoint": True}, "needs exact epochs"),
        (
            {"symbolic_checkpoint": True, "exclude": DeliveredSet.empty(N), "skip_corrupt": True},
            "cannot skip damage; got skip_corrupt=True",
        ),
        ({"symbolic_checkpoint": "yes"}, "symbolic_checkpoint"),
    ],
)
def test_symbolic_checkpoint_rejects_what_it_cannot_save(read, match):
    with pytest.raises(ValueError, match=match):
        ReadConfig(**read)


def test_the_trainer_checkpoints_positions_where_it_can(dataset):
    def inputs(**data: object) -> ReaderInputs:
        config = DataConfig(source=str(dataset.root), **data)  # type: ignore[arg-type]
        return ReaderInputs.from_config(config, global_batch_size=BATCH, seed=1)

    # The split (~350 KB) is smaller than four decoded batches of 16 at 64 px (786 KB)...
    plain = inputs(image_size=SIZE)
    assert plain.symbolic_checkpoint and plain.layout()["input_checkpoint"] == "positions"
    # ... but not than four of 16 at 32 px (197 KB): an explicit checkpoint is the smaller.
    assert inputs(image_size=32).layout()["input_checkpoint"] == "buffers"
    skipping = inputs(skip_corrupt=True)
    assert not skipping.symbolic_checkpoint
    assert skipping.layout()["input_checkpoint"] == "buffers"
    assert not inputs(cache="memory").symbolic_checkpoint  # no exact epochs
