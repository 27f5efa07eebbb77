"""Iterator checkpoints: a fresh process restores a saved position and continues exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from tests.fixtures.shards import WrittenDataset
from tfrecord_io import DeliveredSet, ReadConfig, make_dataset

# Runs in a fresh interpreter: rebuilds each pipeline from the same arguments, restores its
# checkpoint and writes the next batches, so nothing from the saving process can leak in.
_RESTORE_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
from tfrecord_io import DeliveredSet, ReadConfig, make_dataset

for case in json.loads(sys.argv[1]):
    kwargs = dict(case["kwargs"])
    read = dict(kwargs.pop("read"))
    if "exclude" in read:  # exact epochs from the start: the split's size
        read["exclude"] = DeliveredSet.empty(read["exclude"])
    kwargs["read_config"] = ReadConfig(**read)
    if case["pipeline"] is not None:
        pipeline_id, pipelines = case["pipeline"]
        kwargs["input_context"] = tf.distribute.InputContext(pipelines, pipeline_id, pipelines)
    iterator = iter(make_dataset(case["source"], case["split"], **kwargs))
    tf.train.Checkpoint(iterator=iterator).read(case["checkpoint"]).assert_consumed()
    batches = [next(iterator) for _ in range(case["batches"])] if case["batches"] else list(iterator)
    np.savez(
        case["output"],
        images=np.concatenate([b[0].numpy() for b in batches]),
        labels=np.concatenate([b[1].numpy() for b in batches]),
        keys=np.concatenate([b[2].numpy() for b in batches]).astype(str),
    )
"""


def _case(
    name: str,
    dataset: WrittenDataset,
    split: str,
    tmp_path: Path,
    *,
    skip: int,
    batches: int | None,
    pipeline: tuple[int, int] | None = None,
    read: dict[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Saves after ``skip`` batches, records what follows; returns the case for the script.

    ``read`` holds the ``ReadConfig`` fields, ``kwargs`` the other ``make_dataset`` arguments.
    """
    kwargs = {"global_batch_size": 4, "image_size": 24, **kwargs}
    kwargs["read"] = {"with_keys": True, **(read or {})}
    context = None
    if pipeline is not None:
        context = tf.distribute.InputContext(pipeline[1], pipeline[0], pipeline[1])
    built = {k: v for k, v in kwargs.items() if k != "read"}
    read = dict(kwargs["read"])
    if "exclude" in read:  # exact epochs from the start: the split's size, as in the script
        read["exclude"] = DeliveredSet.empty(read["exclude"])
    config = ReadConfig(**read)
    iterator = iter(
        make_dataset(dataset.root, split, input_context=context, read_config=config, **built)
    )
    consumed = [next(iterator) for _ in range(skip)]
    checkpoint = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / name / "ckpt"))
    expected = [next(iterator) for _ in range(batches)] if batches else list(iterator)
    return {
        "name": name,
        "source": str(dataset.root),
        "split": split,
        "kwargs": kwargs,
        "pipeline": pipeline,
        "checkpoint": checkpoint,
        "batches": batches,
        "output": str(tmp_path / f"{name}.npz"),
        "consumed_keys": [k.decode() for b in consumed for k in b[2].numpy()],
        "expected": {
            "images": np.concatenate([b[0].numpy() for b in expected]),
            "labels": np.concatenate([b[1].numpy() for b in expected]),
            "keys": [k.decode() for b in expected for k in b[2].numpy()],
        },
    }


@pytest.mark.slow
def test_checkpointed_iterator_continues_exactly_in_a_fresh_process(
    jpeg_dataset: WrittenDataset, raw_dataset: WrittenDataset, tmp_path: Path
) -> None:
    cases = [
        # Training: shuffled files and records, random crops and flips all resume exactly.
        _case("jpeg_train", jpeg_dataset, "train", tmp_path, skip=5, batches=8, seed=7),
        _case(
            "raw_train_float",
            raw_dataset,
            "train",
            tmp_path,
            skip=3,
            batches=6,
            seed=1,
            read={"output": "float32"},
            pipeline=(1, 2),
            global_batch_size=8,
        ),
        # Exact epochs as permutations of the split held in memory: the records are rebuilt
        # from the shards, the checkpoint holds positions only.
        _case(
            "jpeg_permutation",
            jpeg_dataset,
            "train",
            tmp_path,
            skip=3,
            batches=6,
            seed=5,
            read={"epoch_order": "permutation", "exclude": len(jpeg_dataset.keys("train"))},
            pipeline=(0, 2),
        ),
        # Eval, stopped mid-epoch: the rest of the epoch, each example once.
        _case(
            "jpeg_eval",
            jpeg_dataset,
            "train",
            tmp_path,
            skip=2,
            batches=None,
            training=False,
        ),
    ]
    script_cases = [
        {k: v for k, v in c.items() if k not in ("expected", "consumed_keys")} for c in cases
    ]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", _RESTORE_SCRIPT, json.dumps(script_cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for case in cases:
        restored = np.load(case["output"])
        expected = case["expected"]
        assert restored["keys"].tolist() == expected["keys"], case["name"]
        np.testing.assert_array_equal(restored["labels"], expected["labels"], err_msg=case["name"])
        np.testing.assert_array_equal(restored["images"], expected["images"], err_msg=case["name"])
    eval_case = cases[-1]
    seen = eval_case["consumed_keys"] + eval_case["expected"]["keys"]
    assert sorted(seen) == sorted(jpeg_dataset.keys("train"))
