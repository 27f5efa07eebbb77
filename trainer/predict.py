"""``python -m trainer.predict MODEL_DIR IMAGE_OR_DIR...`` (``tfrecord-predict``): classify image
files with a SavedModel written by ``tfrecord-export``.

One line per image on standard output, in the order of the arguments (a directory's images
sorted): ``path<TAB>class<TAB>score``, the most probable class; ``--top_k K`` gives K
class/score pairs on the line, most probable first; ``--json`` one JSON object per line
(``{"path": ..., "classes": [...], "scores": [...]}``). A directory is walked recursively for
files whose extension is one Pillow opens (hidden ones skipped); a file named on the command
line is tried whatever its name. A file that cannot be read or decoded gets one line on
standard error and the others are still classified; the exit status is then 1. Exit 0 when
every file was classified, 2 for a bad flag or model directory, 130 or 143 after Ctrl-C or
SIGTERM, 141 when the output is closed (``| head``).

The model is called through its ``serving_default`` signature, as TensorFlow Serving calls it;
what is done to a file first is in ``trainer.prediction``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from cliflags import StrictArgumentParser, add_verbose_flag, command_name, quiet_tensorflow
from cliflags.interrupts import run_command

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = StrictArgumentParser(
        prog=command_name("trainer.predict"),
        description="Classify image files with a SavedModel written by tfrecord-export: one "
        "line per image, path<TAB>class<TAB>score.",
    )
    p.add_argument(
        "model_dir", metavar="MODEL_DIR", help="the SavedModel (tfrecord-export's OUT_DIR)"
    )
    p.add_argument(
        "paths",
        metavar="IMAGE_OR_DIR",
        nargs="+",
        help="image files, and directories walked recursively for files with an image extension",
    )
    p.add_argument(
        "--top_k",
        type=_positive_int,
        default=1,
        help="class/score pairs per line, most probable first (default: %(default)s)",
    )
    p.add_argument(
        "--json", action="store_true", help="one JSON object per line: path, classes, scores"
    )
    p.add_argument(
        "--batch_size",
        type=_positive_int,
        default=32,
        help="images per call of the model (default: %(default)s)",
    )
    add_verbose_flag(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Prints a line per image; returns 0, 1 when a file could not be classified, or 2.

    Raises:
      SystemExit: with status 2 on a bad flag.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_tensorflow(verbose=args.verbose)
    quiet = os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "2"  # quiet_tensorflow's level
    if quiet and "tensorflow" not in sys.modules:
        # TensorFlow's C++ side logs libjpeg's complaint about a damaged file as an error line,
        # besides the exception that the file's own line reports: level 3 keeps it out.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return run_command(lambda: _predict(args, parser.prog))


def _predict(args: argparse.Namespace, prog: str) -> int:
    from trainer.prediction import Failure, list_images, load_classifier, predict_files

    try:
        classifier = load_classifier(args.model_dir)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    if args.top_k > classifier.num_classes:
        print(
            f"{prog}: error: --top_k {args.top_k}: the model has {classifier.num_classes} "
            f"classes; pass --top_k {classifier.num_classes} or less",
            file=sys.stderr,
        )
        return 2
    paths = list_images(args.paths)
    if not paths:
        print(
            f"{prog}: error: no image files in {', '.join(args.paths)} (a directory's files are "
            "taken by their extension: those Pillow opens)",
            file=sys.stderr,
        )
        return 2
    failed = 0
    for result in predict_files(classifier, paths, batch_size=args.batch_size, top_k=args.top_k):
        if isinstance(result, Failure):
            failed += 1
            print(f"{prog}: {result.path}: {result.reason}", file=sys.stderr)
        elif args.json:
            record = {
                "path": result.path,
                "classes": list(result.classes),
                "scores": list(result.scores),
            }
            print(json.dumps(record, ensure_ascii=False))
        else:
            pairs = (
                f"{name}\t{score:.4f}"
                for name, score in zip(result.classes, result.scores, strict=True)
            )
            print("\t".join([result.path, *pairs]))
    if failed:
        print(f"{prog}: {failed} of {len(paths)} files not classified", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
