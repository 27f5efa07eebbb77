"""Defaults that fit the data, and errors that name the flag that fixes them.

One small RAW dataset (16 px squares) is written by the real pipeline and read by the real
reader and trainer configuration.
"""

from __future__ import annotations

import logging

import pytest

from beam_pipelines import images_to_tfrecord
from tests.fixtures.images import make_image_tree
from trainer import train
from trainer.config import DataConfig
from trainer.inputs import ReaderInputs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def raw16(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    make_image_tree(root / "images", {"a": 3, "b": 3}, size=(30, 20))
    summary = images_to_tfrecord.run(
        ["--input", str(root / "images"), "--output", str(root / "dataset")]
        + ["--image_size", "16", "--crop", "center", "--encoding", "raw", "--num_shards", "1"]
    )
    assert summary.published
    return root / "dataset"


def test_the_reader_defaults_to_the_stored_size_and_warns_when_scaling_up(raw16, caplog):
    from tfrecord_io import make_dataset

    images, _ = next(iter(make_dataset(raw16, global_batch_size=6, training=False)))
    assert tuple(images.shape) == (6, 16, 16, 3)
    with caplog.at_level(logging.INFO, logger="tfrecord_io.reader"):
        images, _ = next(
            iter(make_dataset(raw16, global_batch_size=6, training=False, image_size=24))
        )
    assert tuple(images.shape) == (6, 24, 24, 3)
    (record,) = [r for r in caplog.records if "differs" in r.getMessage()]
    assert record.levelno == logging.WARNING and "scaled up" in record.getMessage()


def test_the_trainer_defaults_to_the_stored_size_and_says_so(raw16, tmp_path, caplog):
    config, _ = train.parse_config(
        ["--data", str(raw16), "--model_dir", str(tmp_path), "--steps", "3"]
    )
    assert config.data.image_size == 16
    log = logging.getLogger("test")
    with caplog.at_level(logging.INFO):
        train._explain_defaults(config, log)
    messages = [r.getMessage() for r in caplog.records]
    assert "image size 16, as the dataset stores it (16 px RAW, squares)" in messages
    # --warmup_steps 100 (the default) never finishes in 3 steps: warned, naming both flags.
    assert any("--warmup_steps 100 is not below --steps 3" in m for m in messages)
    bigger, _ = train.parse_config(
        ["--data", str(raw16), "--model_dir", str(tmp_path), "--steps", "3", "--image_size", "32"]
    )
    caplog.clear()
    with caplog.at_level(logging.INFO):
        train._explain_defaults(bigger, log)
    # A size other than the stored one is the reader's note (warned above), once per run
    # (tests/test_train_loop.py): not said twice.
    assert not [r for r in caplog.records if "image" in r.getMessage()]


def test_a_batch_larger_than_the_split_names_the_flag_and_a_size_that_fits(raw16):
    with pytest.raises(ValueError, match=r"pass --global_batch_size 4 or less"):
        ReaderInputs.from_config(DataConfig(source=str(raw16)), global_batch_size=256, seed=0)


def test_a_missing_source_is_reported_before_what_it_lacks(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ReaderInputs.from_config(
            DataConfig(source=str(tmp_path / "no_such")), global_batch_size=8, seed=0
        )


def test_a_bad_value_names_its_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_config(
            ["--data", str(tmp_path), "--model_dir", str(tmp_path), "--steps", "3"]
            + ["--global_batch_size", "0"]
        )
    assert exit_info.value.code == 2
    assert "error: --global_batch_size must be an int >= 1, got 0" in capsys.readouterr().err


def test_damaged_shards_have_a_trainer_flag_and_the_reader_names_it(raw16, tmp_path):
    from tfrecord_io import make_dataset

    config, _ = train.parse_config(
        ["--data", str(raw16), "--model_dir", str(tmp_path), "--steps", "3", "--skip_corrupt"]
    )
    assert config.data.skip_corrupt
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in raw16.iterdir():
        (broken / path.name).write_bytes(path.read_bytes())
    (shard,) = broken.glob("train-*.tfrecord")
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(ValueError, match="the trainer's --skip_corrupt"):
        make_dataset(broken, global_batch_size=2, training=False)


def test_a_damaged_record_stops_training_with_one_line_naming_the_shard(raw16, tmp_path, caplog):
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in raw16.iterdir():
        if path.is_file():
            (broken / path.name).write_bytes(path.read_bytes())
    (shard,) = broken.glob("train-*.tfrecord")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside a record's bytes: its CRC fails, its size holds
    shard.write_bytes(bytes(data))
    caplog.set_level("ERROR", logger="trainer.train")
    argv = ["--data", str(broken), "--model_dir", str(tmp_path / "run"), "--steps", "4"]
    status = train.main([*argv, "--global_batch_size", "2", "--eval_every", "100"])
    assert status == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("damaged, missing or unreadable TFRecord shard"), line
    assert str(shard) in line and line.endswith("rerun with --skip_corrupt to train past it")


def test_tensorflows_data_loss_error_gets_the_command_that_names_the_shard() -> None:
    # Positions-only input checkpoints (a small local split) read without tf.data's error
    # skipping, so TensorFlow's own error, which names no file, reaches the trainer.
    import tensorflow as tf

    error = tf.errors.DataLossError(None, None, "corrupted record at 1234")
    message = train._damaged_shard_message(error, "out/photos")
    assert message == (
        "a shard of --data out/photos is damaged (corrupted record at 1234): run "
        "tfrecord-verify out/photos to name it, or pass --skip_corrupt to train past it"
    )
    assert train._damaged_shard_message(ValueError("other"), "out/photos") is None
