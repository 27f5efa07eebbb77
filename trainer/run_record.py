"""``MODEL_DIR/run.json``: what a run trained, so that its checkpoints can be used without the
command line that made them.

The trainer's chief writes it at every start, before the first step: the model (a built-in name
or the import path of the user's function, and its ``--model_arg`` values), the model's input
(side and dtype), the class names (the model's output ``i`` is ``class_names[i]``) and the
preprocessing an exported model must repeat (``trainer.serving``: the reader's evaluation and
how the pipeline prepared the images, from ``dataset.json``). ``tfrecord-export RUN_DIR`` reads
it and nothing else of the run but a checkpoint.

Only JSON is written: ``--model_arg`` values are kept as the Python literals the command line
takes (``repr``), so ``parse_model_args`` reads them back as they were given.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

from trainer.config import TrainConfig
from trainer.serving import ServingPreprocessing, StoredImages

__all__ = [
    "RUN_RECORD",
    "RunRecord",
    "read_run_record",
    "record_run",
    "write_run_record",
]

_log = logging.getLogger(__name__)

#: The file name, in the run directory.
RUN_RECORD = "run.json"
_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunRecord:
    """What a run trained.

    Attributes:
      model: a built-in model name (``trainer.config.MODELS``), or ``module:qualname`` of the
        function building the model.
      model_args: the ``--model_arg`` pairs, ``key=repr(value)``.
      num_classes: the width of the model's output.
      class_names: the name of each output, or None when the data had no ``dataset.json``.
      label_offset: what the reader subtracted from the stored labels (adopted shards).
      preprocessing: what an exported model does to an encoded image (``trainer.serving``).
      source: the dataset the run read.
      eval_split: the split it evaluated on.
    """

    model: str
    model_args: tuple[str, ...] = ()
    num_classes: int
    class_names: tuple[str, ...] | None = None
    label_offset: int = 0
    preprocessing: ServingPreprocessing
    source: str = ""
    eval_split: str = "validation"

    def __post_init__(self) -> None:
        # Any name: a model function defined where nothing can import it (a script's
        # ``__main__``, a closure) is recorded as ``describe`` names it, and export says so.
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty name, got {self.model!r}")
        if not all(isinstance(pair, str) and "=" in pair for pair in self.model_args):
            raise ValueError(f"model_args must be 'key=value' strings, got {self.model_args!r}")
        if not isinstance(self.num_classes, int) or self.num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {self.num_classes!r}")
        if self.class_names is not None and len(self.class_names) != self.num_classes:
            raise ValueError(
                f"class_names has {len(self.class_names)} names for {self.num_classes} classes"
            )
        if not isinstance(self.preprocessing, ServingPreprocessing):
            raise TypeError(f"preprocessing must be ServingPreprocessing, got {self.preprocessing}")

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _VERSION,
                "model": self.model,
                "model_args": list(self.model_args),
                "num_classes": self.num_classes,
                "class_names": None if self.class_names is None else list(self.class_names),
                "label_offset": self.label_offset,
                "preprocessing": self.preprocessing.to_dict(),
                "source": self.source,
                "eval_split": self.eval_split,
            },
            indent=2,
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str, *, where: str = RUN_RECORD) -> RunRecord:
        """Raises ``ValueError`` naming ``where`` for a file that is not a run record."""
        try:
            data = json.loads(text)
            if data.get("version") != _VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {_VERSION}")
            names = data.get("class_names")
            return cls(
                model=data["model"],
                model_args=tuple(data.get("model_args", ())),
                num_classes=data["num_classes"],
                class_names=None if names is None else tuple(names),
                label_offset=data.get("label_offset", 0),
                preprocessing=ServingPreprocessing.from_dict(data["preprocessing"]),
                source=data.get("source", ""),
                eval_split=data.get("eval_split", "validation"),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{where} is not a run record the trainer wrote: {e}") from e


def record_run(config: TrainConfig, *, model: str, num_classes: int, input_dtype: str) -> RunRecord:
    """The record of a run of ``config``, with the class names and image preparation of its
    dataset's ``dataset.json`` when it has one.

    Args:
      config: the run.
      model: the built-in name or the model function's ``module:qualname``.
      num_classes: the model's output width.
      input_dtype: what the model takes, ``uint8`` or ``float32``.
    """
    import tfrecord_io
    from tfrecord_io.read_config import ReadConfig

    try:
        manifest = tfrecord_io.load_manifest(config.data.source)
    except (OSError, ValueError) as e:  # a source the inputs read without one (a test's arrays)
        _log.debug("run record without dataset.json: %s", e)
        manifest = None
    stored, names, offset = None, None, 0
    if manifest is not None:
        stored = StoredImages.from_manifest(manifest)
        names = manifest.label_names if len(manifest.label_names) == num_classes else None
        adopted = manifest.options.get("adopted")
        if isinstance(adopted, dict):
            offset = int(adopted.get("label_offset", 0))
    return RunRecord(
        model=model,
        model_args=tuple(f"{key}={value!r}" for key, value in sorted(config.model_args.items())),
        num_classes=num_classes,
        class_names=names,
        label_offset=offset,
        preprocessing=ServingPreprocessing(
            image_size=config.data.image_size,
            input_dtype=input_dtype,
            stored=stored,
            # What the trainer's evaluation reads with (trainer.inputs: the default).
            jpeg_dct_method=ReadConfig().jpeg_dct_method,
        ),
        source=config.data.source,
        eval_split=config.data.eval_split,
    )


def write_run_record(model_dir: str, record: RunRecord) -> str:
    """Writes ``record`` to ``model_dir/run.json`` whole or not at all; returns the path."""
    import tensorflow as tf

    path = os.path.join(model_dir, RUN_RECORD)
    tf.io.gfile.makedirs(model_dir)
    partial = f"{path}.partial"
    with tf.io.gfile.GFile(partial, "w") as f:
        f.write(record.to_json() + "\n")
    tf.io.gfile.rename(partial, path, overwrite=True)
    return path


def read_run_record(model_dir: str) -> RunRecord | None:
    """The run record of ``model_dir``, or None when it has none (a run of an earlier trainer).

    Raises:
      ValueError: naming the file, if it is not a run record.
    """
    import tensorflow as tf

    path = os.path.join(model_dir, RUN_RECORD)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return RunRecord.from_json(f.read(), where=path)
