"""Iterator checkpoints of exact epochs hold positions, not the split: kilobytes with
``ReadConfig(epoch_order="permutation")`` (what the trainer reads a small split with), the
record shuffle buffer and positions with ``symbolic_checkpoint=True``; both resume exactly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import trainer.inputs
from tests.fixtures.shards import WrittenDataset, copy_dataset, write_dataset
from tfrecord_io import ReadConfig, make_dataset
from tfrecord_io.delivery import DeliveredSet
from trainer.config import DataConfig
from trainer.inputs import ReaderInputs, keep_recorded_kind

N = 96
BATCH = 16
SIZE = 64
# What a checkpoint holds besides the shuffle buffer's records: the positions of every op, and
# TensorFlow's framing of each buffered element (its key and tensor header) beyond the 16 bytes
# a TFRecord frame takes.
_FIXED_BYTES = 32 * 1024
_PER_RECORD_BYTES = 64
# A permutation checkpoint: the positions of each op, nothing per example. Measured 2.7 KB.
_PERMUTATION_BYTES = 8 * 1024


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


def test_a_permutation_checkpoint_is_kilobytes_whatever_the_split(dataset, tmp_path):
    split = _split_bytes(dataset)
    iterator = iter(_build(dataset, epoch_order="permutation"))
    for _ in range(2):
        next(iterator)
    size, _ = _checkpoint_bytes(iterator, tmp_path / "permutation")
    # Buffered reading holds about the split (1.04x); the permutation holds positions only.
    assert size <= _PERMUTATION_BYTES, (size, split)
    assert size * 40 < split, (size, split)


@pytest.mark.parametrize(
    "read", [{"symbolic_checkpoint": True}, {"epoch_order": "permutation"}], ids=str
)
def test_a_positions_checkpoint_resumes_exactly(dataset, tmp_path, read):
    iterator = iter(_build(dataset, **read))
    for _ in range(4):  # of 6 batches an epoch: what follows crosses into the next epoch
        next(iterator)
    _, path = _checkpoint_bytes(iterator, tmp_path)
    expected = [next(iterator) for _ in range(4)]
    restored = iter(_build(dataset, **read))
    tf.train.Checkpoint(iterator=restored).read(path).assert_consumed()
    for want, got in zip(expected, (next(restored) for _ in range(4)), strict=True):
        np.testing.assert_array_equal(want[0].numpy(), got[0].numpy())  # augmentation too
        np.testing.assert_array_equal(want[2].numpy(), got[2].numpy())  # keys
        np.testing.assert_array_equal(want[3].numpy(), got[3].numpy())  # positions
    assert set((np.concatenate([e[3].numpy() for e in expected]) // N).tolist()) == {0, 1}


def _damaged(dataset: WrittenDataset, directory: Path) -> tuple[WrittenDataset, Path]:
    damaged = copy_dataset(dataset, directory)
    shard = damaged.root / damaged.manifest.split("train").shards[0].file
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: the build-time size check passes
    shard.write_bytes(bytes(data))
    return damaged, shard


def test_a_damaged_record_still_fails_without_ignore_errors(dataset, tmp_path):
    damaged, _ = _damaged(dataset, tmp_path / "ds")
    with pytest.raises((tf.errors.DataLossError, tf.errors.InvalidArgumentError)):
        for _ in _build(damaged, symbolic_checkpoint=True, num_epochs=1):
            pass


def test_a_damaged_record_fails_the_permutation_build_naming_its_shard(dataset, tmp_path):
    damaged, shard = _damaged(dataset, tmp_path / "ds")
    with pytest.raises(ValueError, match=f"{shard.name}.*CRC mismatch"):
        _build(damaged, epoch_order="permutation")


@pytest.mark.parametrize(
    ("read", "match"),
    [
        ({"symbolic_checkpoint": True}, "needs exact epochs"),
        (
            {"symbolic_checkpoint": True, "exclude": DeliveredSet.empty(N), "skip_corrupt": True},
            "cannot skip damage; got skip_corrupt=True",
        ),
        ({"symbolic_checkpoint": "yes"}, "symbolic_checkpoint"),
        ({"epoch_order": "permutation"}, "epoch_order='permutation' needs exact epochs"),
        (
            {"epoch_order": "permutation", "exclude": DeliveredSet.empty(N), "skip_corrupt": True},
            "epoch_order='permutation' reads without ignore_errors",
        ),
        ({"epoch_order": "random"}, "epoch_order must be one of"),
    ],
)
def test_symbolic_checkpoint_rejects_what_it_cannot_save(read, match):
    with pytest.raises(ValueError, match=match):
        ReadConfig(**read)


def test_the_trainer_checkpoints_positions_where_it_can(dataset, monkeypatch):
    def inputs(**data: object) -> ReaderInputs:
        config = DataConfig(source=str(dataset.root), **data)  # type: ignore[arg-type]
        return ReaderInputs.from_config(config, global_batch_size=BATCH, seed=1)

    # A split it can hold (~350 KB): permutations, whose checkpoints are kilobytes.
    plain = inputs(image_size=SIZE)
    assert plain.symbolic_checkpoint and plain.layout()["input_checkpoint"] == "permutation"
    skipping = inputs(skip_corrupt=True)
    assert not skipping.symbolic_checkpoint
    assert skipping.layout()["input_checkpoint"] == "buffers"
    assert not inputs(cache="memory").symbolic_checkpoint  # no exact epochs
    # A split too large to hold: symbolic where it is smaller than four decoded batches of 16
    # at 64 px (786 KB), explicit where it is not (four of 16 at 32 px, 197 KB).
    monkeypatch.setattr(trainer.inputs, "HELD_SPLIT_BYTES", 1024)
    assert inputs(image_size=SIZE).layout()["input_checkpoint"] == "positions"
    assert inputs(image_size=32).layout()["input_checkpoint"] == "buffers"


def test_a_resumed_run_keeps_the_kind_it_began_with(dataset):
    config = DataConfig(source=str(dataset.root), image_size=SIZE)
    plain = ReaderInputs.from_config(config, global_batch_size=BATCH, seed=1)
    older = plain.keeping_checkpoint_kind("positions")
    assert older.layout()["input_checkpoint"] == "positions" and older.symbolic_checkpoint
    context = tf.distribute.InputContext(1, 0, 1)
    read = older.train_dataset(context, with_keys=False, exclude=DeliveredSet.empty(N))
    assert len(read.element_spec) == 3  # images, labels, positions
    assert plain.keeping_checkpoint_kind("permutation") is plain
    assert plain.keeping_checkpoint_kind(None) is plain
    assert plain.keeping_checkpoint_kind("unknown") is plain
    skipping = ReaderInputs.from_config(
        DataConfig(source=str(dataset.root), skip_corrupt=True), global_batch_size=BATCH, seed=1
    )
    # It cannot read symbolically while skipping damage: it resumes from the delivered set.
    assert skipping.keeping_checkpoint_kind("positions") is skipping


def test_the_trainer_reads_the_kind_a_run_recorded(dataset, tmp_path):
    inputs = ReaderInputs.from_config(
        DataConfig(source=str(dataset.root), image_size=SIZE), global_batch_size=BATCH, seed=1
    )
    assert keep_recorded_kind(inputs, str(tmp_path)) is inputs  # a new run
    layout = tmp_path / "checkpoints" / "input" / "layout.json"
    layout.parent.mkdir(parents=True)
    layout.write_text(json.dumps({**inputs.layout(), "input_checkpoint": "positions"}))
    kept = keep_recorded_kind(inputs, str(tmp_path))
    assert kept.layout() == {**inputs.layout(), "input_checkpoint": "positions"}
