"""A run's checkpoint as a SavedModel that classifies encoded images (``tfrecord-export``).

``export_saved_model(RUN_DIR, OUT_DIR)`` rebuilds the run's model from ``RUN_DIR/run.json``
(``trainer.run_record``), restores its weights from a checkpoint (the latest by default) and
writes ``OUT_DIR`` with two signatures:

* ``serving_default``: ``image_bytes`` (``tf.string [None]``, JPEG, PNG, GIF, BMP or WebP
  files) -> ``scores`` (``float32 [None, num_classes]``, softmax probabilities) and ``classes``
  (``tf.string [None, num_classes]``, ``classes[i, j]`` names ``scores[i, j]``: the layout of
  TensorFlow's classification outputs);
* ``preprocess``: ``image_bytes`` -> ``images``, the batch the model takes, for checking what
  it sees.

Between bytes and model runs ``trainer.serving.preprocess``: what the pipeline and the reader's
evaluation did to the validation images. The class names are also in ``assets/labels.txt``
(one a line, in output order) and everything about the export in ``assets/export.json``. Beside
the SavedModel, ``OUT_DIR/model.keras`` holds the bare Keras model (pixels in, logits out)
when Keras can save it and load it back; a subclassed model without ``get_config`` cannot be.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainer.config import MODELS
from trainer.models import build_model
from trainer.run_record import RunRecord, read_run_record
from trainer.serving import ServingPreprocessing, StoredImages, preprocess
from trainer.user_model import build_checked_model, load_model_fn, parse_model_args

if TYPE_CHECKING:
    import keras

__all__ = [
    "KERAS_FILE",
    "ExportResult",
    "export_saved_model",
    "find_checkpoint",
    "record_without_run_json",
    "restore_model",
]

_log = logging.getLogger(__name__)

#: The Keras file written beside the SavedModel's files.
KERAS_FILE = "model.keras"
_STEP_KEY = "step/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What ``export_saved_model`` wrote.

    Attributes:
      directory: the SavedModel.
      checkpoint: the checkpoint restored.
      step: its training step.
      class_names: the output classes, in order.
      keras_file: the ``.keras`` file, or None.
      keras_note: why there is no ``.keras`` file, or None.
    """

    directory: str
    checkpoint: str
    step: int
    class_names: tuple[str, ...]
    keras_file: str | None
    keras_note: str | None


def _saved_steps(checkpoints: str) -> list[int]:
    import tensorflow as tf

    pattern = os.path.join(checkpoints, "ckpt-*.index")
    return sorted(
        int(m.group(1))
        for path in tf.io.gfile.glob(pattern)
        if (m := re.search(r"ckpt-(\d+)\.index$", path))
    )


def find_checkpoint(run_dir: str, checkpoint: str | None = None) -> str:
    """The checkpoint prefix to restore: the run's latest, its step ``N``, or a path.

    Args:
      run_dir: the run's ``--model_dir``.
      checkpoint: None (the latest), a step number, or a checkpoint prefix
        (``RUN/checkpoints/ckpt-20``).

    Raises:
      ValueError: naming ``--checkpoint`` and the steps the run keeps, if there is no such
        checkpoint.
      FileNotFoundError: if the run has no checkpoint at all.
    """
    import tensorflow as tf

    checkpoints = os.path.join(run_dir, "checkpoints")
    steps = _saved_steps(checkpoints)
    kept = ", ".join(map(str, steps)) or "none"
    if checkpoint is None:
        latest = tf.train.latest_checkpoint(checkpoints)
        if latest is None:
            raise FileNotFoundError(
                f"{run_dir} holds no checkpoint ({checkpoints}/ckpt-*): is it a tfrecord-train "
                "--model_dir, and has the run saved one?"
            )
        return str(latest)
    if checkpoint.isdigit():
        if int(checkpoint) not in steps:
            raise ValueError(
                f"--checkpoint {checkpoint}: {run_dir} keeps no checkpoint of step {checkpoint}; "
                f"it keeps steps {kept}"
            )
        return os.path.join(checkpoints, f"ckpt-{int(checkpoint)}")
    prefix = checkpoint.removesuffix(".index")
    if not tf.io.gfile.exists(f"{prefix}.index"):
        raise ValueError(
            f"--checkpoint {checkpoint!r} is neither a step nor a checkpoint (no {prefix}.index); "
            f"{run_dir} keeps steps {kept}"
        )
    return prefix


def record_without_run_json(
    run_dir: str, model: str, model_args: Mapping[str, Any] | None = None
) -> RunRecord:
    """A record for a run trained before the trainer wrote ``run.json``: the data and image
    side from its input layout (``checkpoints/input/layout.json``), the classes and image
    preparation from that data's ``dataset.json``, and the model as given.

    Raises:
      ValueError: naming ``--model``, if the layout is missing, or the data has no
        ``dataset.json`` to name the classes.
    """
    import tensorflow as tf

    import tfrecord_io

    layout_path = os.path.join(run_dir, "checkpoints", "input", "layout.json")
    if not tf.io.gfile.exists(layout_path):
        raise ValueError(
            f"{run_dir} has neither run.json nor {layout_path}: export needs a run of "
            "tfrecord-train (rerun it for one step to write run.json)"
        )
    with tf.io.gfile.GFile(layout_path) as f:
        layout = json.load(f)
    source = layout["source"]
    manifest = tfrecord_io.load_manifest(source)
    if manifest is None:
        raise ValueError(
            f"{run_dir} has no run.json and its data {source!r} no dataset.json: the number of "
            "classes is unknown; rerun tfrecord-train for one step to write run.json"
        )
    args = dict(model_args or {})
    return RunRecord(
        model=model,
        model_args=tuple(f"{key}={value!r}" for key, value in sorted(args.items())),
        num_classes=len(manifest.label_names),
        class_names=manifest.label_names,
        preprocessing=ServingPreprocessing(
            image_size=int(layout["image_size"]), stored=StoredImages.from_manifest(manifest)
        ),
        source=source,
    )


def _build(record: RunRecord, model_fn: Callable[..., Any] | None) -> keras.Model:
    """The run's model with fresh weights, in float32 whatever policy it trained under (its
    variables are float32 either way).

    Raises:
      ValueError: naming ``--model``, if the model function cannot be imported or built.
    """
    import keras

    spec = record.preprocessing
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy("float32")
    try:
        if model_fn is None and record.model in MODELS:
            return build_model(
                record.model,
                num_classes=record.num_classes,
                image_size=spec.image_size,
                input_dtype=spec.input_dtype,
            )
        if model_fn is None:
            try:
                model_fn = load_model_fn(record.model)
            except ValueError as e:
                raise ValueError(
                    f"{e}; the run's model is {record.model!r}: pass --model "
                    "package.module:function naming the function that built it"
                ) from e
        return build_checked_model(
            model_fn,
            name=record.model,
            image_size=spec.image_size,
            num_classes=record.num_classes,
            input_dtype=spec.input_dtype,
            model_args=parse_model_args(list(record.model_args)),
        )
    finally:
        keras.mixed_precision.set_dtype_policy(previous)


def restore_model(
    record: RunRecord, checkpoint: str, *, model_fn: Callable[..., Any] | None = None
) -> tuple[keras.Model, int]:
    """The run's model with the weights of ``checkpoint``, and the checkpoint's step.

    Args:
      record: what the run trained (``read_run_record``).
      checkpoint: a checkpoint prefix (``find_checkpoint``).
      model_fn: the function building the model, instead of importing ``record.model``.

    Raises:
      ValueError: naming ``--model``, if the model cannot be built or its variables do not
        match the checkpoint's.
    """
    import tensorflow as tf

    model = _build(record, model_fn)
    try:
        status = tf.train.Checkpoint(model=model).read(checkpoint)
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError) as e:  # a variable missing, or of another shape
        raise ValueError(
            f"{checkpoint} does not hold the weights of model {record.model!r} "
            f"{list(record.model_args)}: {str(e)[:400]}; pass the --model (and --model_arg) "
            "the run trained"
        ) from e
    status.expect_partial()  # the optimiser, step and data position stay in the checkpoint
    reader = tf.train.load_checkpoint(checkpoint)
    step = int(reader.get_tensor(_STEP_KEY)) if reader.has_tensor(_STEP_KEY) else -1
    return model, step


def _class_names(record: RunRecord) -> tuple[str, ...]:
    names = record.class_names or tuple(str(i) for i in range(record.num_classes))
    bad = [name for name in names if "\n" in name or "\r" in name]
    if bad:
        raise ValueError(f"class names {bad!r} hold a line break, which labels.txt cannot")
    return names


def _serving_module(
    model: keras.Model,
    names: tuple[str, ...],
    spec: ServingPreprocessing,
    assets: Mapping[str, str],
) -> Any:
    """A ``tf.Module`` holding the model, the signatures' functions and the asset files."""
    import tensorflow as tf

    module = tf.Module()
    module.model = model
    for name, path in assets.items():
        setattr(module, name, tf.saved_model.Asset(path))
    image_bytes = tf.TensorSpec([None], tf.string, name="image_bytes")

    # Traced without AutoGraph, as the trainer's steps are: the preprocessing branches with
    # tf.cond and tf.switch_case only.
    @tf.function(input_signature=[image_bytes], autograph=False)
    def preprocess_images(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"images": preprocess(image_bytes, spec)}

    @tf.function(input_signature=[image_bytes], autograph=False)
    def classify(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = module.model(preprocess(image_bytes, spec), training=False)
        scores = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
        classes = tf.tile(tf.constant(names)[tf.newaxis], [tf.shape(scores)[0], 1])
        return {"scores": scores, "classes": classes}

    module.serving_default = classify
    module.preprocess = preprocess_images
    return module


def export_saved_model(
    run_dir: str,
    out_dir: str,
    *,
    checkpoint: str | None = None,
    record: RunRecord | None = None,
    model_fn: Callable[..., Any] | None = None,
    keras_file: bool = True,
    overwrite: bool = False,
) -> ExportResult:
    """Writes the SavedModel of a run's checkpoint to ``out_dir``.

    Args:
      run_dir: the run's ``--model_dir``.
      out_dir: the SavedModel directory (for TensorFlow Serving, a numbered version directory
        under the model's base path).
      checkpoint: None (the latest), a step, or a checkpoint prefix (``find_checkpoint``).
      record: what the run trained; None reads ``run_dir/run.json``.
      model_fn: the function building the model, instead of importing the record's.
      keras_file: also write ``model.keras`` when the model allows.
      overwrite: replace what ``out_dir`` holds, once the model is restored; otherwise an
        ``out_dir`` that holds files is refused.

    Raises:
      ValueError: naming the flag, if ``out_dir`` holds files, or the run, checkpoint or model
        does not fit; nothing is written then.
      FileNotFoundError: if the run has no checkpoint.
    """
    import tensorflow as tf

    if not overwrite and tf.io.gfile.exists(out_dir) and tf.io.gfile.listdir(out_dir):
        raise ValueError(
            f"{out_dir} already holds files; pass --overwrite to replace them, or another "
            "OUT_DIR (a new version directory)"
        )
    if record is None:
        record = read_run_record(run_dir)
        if record is None:
            raise ValueError(
                f"{run_dir} has no run.json (trained before the trainer wrote it): pass --model "
                "(and --model_arg) as the run was trained"
            )
    path = find_checkpoint(run_dir, checkpoint)
    model, step = restore_model(record, path, model_fn=model_fn)
    names = _class_names(record)
    info = {
        "run_dir": run_dir,
        "checkpoint": path,
        "step": step,
        "model": record.model,
        "model_args": list(record.model_args),
        "class_names": list(names),
        "label_offset": record.label_offset,
        "source": record.source,
        "preprocessing": record.preprocessing.to_dict(),
        "tensorflow": tf.__version__,
    }
    if tf.io.gfile.exists(out_dir):
        tf.io.gfile.rmtree(out_dir)  # empty, or --overwrite
    _save(model, names, record.preprocessing, info, out_dir)
    keras_path, note = (
        _write_keras_file(model, out_dir, record.preprocessing) if keras_file else (None, None)
    )
    return ExportResult(out_dir, path, step, names, keras_path, note)


def _save(
    model: keras.Model,
    names: tuple[str, ...],
    spec: ServingPreprocessing,
    info: Mapping[str, Any],
    out_dir: str,
) -> None:
    """Writes the SavedModel, with ``labels.txt`` and ``export.json`` (``info``) as assets."""
    import tensorflow as tf

    with tempfile.TemporaryDirectory() as staging:
        assets = {
            "labels": os.path.join(staging, "labels.txt"),
            "export_info": os.path.join(staging, "export.json"),
        }
        with open(assets["labels"], "w", encoding="utf-8") as f:
            f.write("".join(f"{name}\n" for name in names))
        with open(assets["export_info"], "w", encoding="utf-8") as f:
            f.write(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
        module = _serving_module(model, names, spec, assets)
        signatures = {"serving_default": module.serving_default, "preprocess": module.preprocess}
        tf.saved_model.save(module, out_dir, signatures=signatures)


def _write_keras_file(
    model: keras.Model, out_dir: str, spec: ServingPreprocessing
) -> tuple[str | None, str | None]:
    """Saves ``model`` as ``out_dir/model.keras`` and checks that it loads back and computes
    the same logits; returns its path, or None and why when Keras cannot (a subclassed model
    without ``get_config``, say)."""
    import keras
    import numpy as np
    import tensorflow as tf

    path = os.path.join(out_dir, KERAS_FILE)
    sample = np.random.default_rng(0).integers(0, 256, [2, spec.image_size, spec.image_size, 3])
    sample = sample.astype(spec.input_dtype)
    try:
        model.save(path)
        loaded = keras.saving.load_model(path)
        np.testing.assert_allclose(
            np.asarray(loaded(sample, training=False)),
            np.asarray(model(sample, training=False)),
            rtol=1e-4,
            atol=1e-5,
        )
    except Exception as e:  # whatever Keras raises for a model it cannot serialise
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
        note = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        _log.debug("no %s", KERAS_FILE, exc_info=True)
        return None, note
    return path, None
