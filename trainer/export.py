"""``python -m trainer.export RUN_DIR OUT_DIR`` (``tfrecord-export``): a run's checkpoint as a
SavedModel that classifies encoded images.

The model, its input and classes and the preprocessing to repeat come from ``RUN_DIR/run.json``
(written by ``tfrecord-train``), the weights from the run's latest checkpoint or
``--checkpoint N``. ``OUT_DIR``'s ``serving_default`` signature takes ``image_bytes`` (a batch
of encoded images) and returns ``scores`` and ``classes``; ``trainer.saved_model`` says what it
holds and ``trainer.serving`` what it does to an image. Exit 0 when written, 2 for a bad flag,
run or checkpoint (nothing written), 130 or 143 after Ctrl-C or SIGTERM.

Example::

    python -m trainer.export runs/a exported/a/1
    python -m trainer.predict exported/a/1 photos/
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

from cliflags import StrictArgumentParser, add_verbose_flag, command_name, quiet_tensorflow
from cliflags.interrupts import run_command
from trainer.config import MODELS

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = StrictArgumentParser(
        prog=command_name("trainer.export"),
        description="Write a training run's checkpoint as a SavedModel that takes encoded "
        "images (serving_default: image_bytes -> scores, classes).",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run's tfrecord-train --model_dir")
    p.add_argument(
        "out_dir",
        metavar="OUT_DIR",
        help="the SavedModel directory to write (for TensorFlow Serving: BASE/<version>)",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="STEP_OR_PATH",
        help="a step the run keeps, or a checkpoint prefix (default: the latest)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="the model as trained, a built-in or package.module:function: for a run without "
        "run.json, or whose recorded function cannot be imported here (default: run.json's)",
    )
    p.add_argument(
        "--model_arg",
        dest="model_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword for --model's function; repeat for more (default: run.json's)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an OUT_DIR that holds files")
    add_verbose_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Exports; returns the exit status.

    Raises:
      SystemExit: with status 2 on a bad flag.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_tensorflow(verbose=args.verbose)
    from trainer.user_model import is_import_path, parse_model_args

    if args.model is not None and args.model not in MODELS and not is_import_path(args.model):
        parser.error(f"--model {args.model!r}: expected one of {MODELS} or package.module:function")
    try:
        model_args = parse_model_args(args.model_args)
    except ValueError as e:
        parser.error(str(e))
    if model_args and args.model in MODELS:
        parser.error(f"--model_arg: the built-in {args.model!r} takes none")
    if not args.verbose:
        # TensorFlow's Python logger reports every function it saves at INFO and WARNING.
        logging.getLogger("tensorflow").setLevel(logging.ERROR)
    return run_command(lambda: _export(args, parser.prog, model_args))


def _export(args: argparse.Namespace, prog: str, model_args: dict[str, object]) -> int:
    """Writes the SavedModel and prints what it is; returns 0, or 2 for a bad run."""
    import tensorflow as tf

    from trainer.run_record import read_run_record
    from trainer.saved_model import export_saved_model, record_without_run_json

    try:
        record = read_run_record(args.run_dir)
        if record is None:
            if not tf.io.gfile.isdir(args.run_dir):
                raise FileNotFoundError(f"{args.run_dir} is not a directory (RUN_DIR)")
            if args.model is None:
                raise ValueError(
                    f"{args.run_dir} has no run.json (trained before the trainer wrote it): "
                    "pass --model (and --model_arg) as the run was trained"
                )
            record = record_without_run_json(args.run_dir, args.model, model_args)
        elif args.model is not None:
            pairs = tuple(f"{key}={value!r}" for key, value in sorted(model_args.items()))
            record = dataclasses.replace(record, model=args.model, model_args=pairs)
        result = export_saved_model(
            args.run_dir,
            args.out_dir,
            checkpoint=args.checkpoint,
            record=record,
            overwrite=args.overwrite,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    k = len(result.class_names)
    print(f"exported step {result.step} ({result.checkpoint}) to {result.directory}")
    print(
        f"serving_default: image_bytes string [None] -> scores float32 [None, {k}], "
        f"classes string [None, {k}]"
    )
    print(f"classes: {', '.join(result.class_names)}")
    if result.keras_file:
        print(f"keras model (pixels in, logits out): {result.keras_file}")
    else:
        print(
            f"no model.keras: Keras cannot save this model and load it back ({result.keras_note})"
        )
    predict = "tfrecord-predict" if prog.startswith("tfrecord-") else "python -m trainer.predict"
    print(f"try: {predict} {result.directory} IMAGE_OR_DIR...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
