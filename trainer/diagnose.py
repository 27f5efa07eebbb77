"""``python -m trainer.diagnose MODEL_DIR`` (``tfrecord-diagnose``): training-health checks.

Prints one verdict per training-health check (step-time jitter, input wait, accelerator use,
gradient norm, loss curve, validation, and whether the validation split can be trusted: its
size, leakage from train, noise; see ``trainer.diagnosis``) for a training run's
TensorBoard logs, with the numbers behind it. The exit status is 0 whatever the verdicts, and
non-zero only when the logs cannot be read (2) or Ctrl-C or SIGTERM stopped it (130, 143).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from cliflags import StrictArgumentParser, command_name, quiet_tensorflow
from cliflags.interrupts import run_command
from trainer.diagnosis import (
    WARN,
    LogsUnreadable,
    Thresholds,
    diagnose_run,
    format_table,
    read_scalars,
)
from trainer.validation_trust import read_leakage

__all__ = ["main"]


def _parse_threshold(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    names = {f.name for f in dataclasses.fields(Thresholds)}
    if not sep or name not in names:
        raise argparse.ArgumentTypeError(
            f"expected NAME=VALUE with NAME one of {sorted(names)}, got {text!r}"
        )
    try:
        return name, float(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{name} needs a number, got {value!r}") from e


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the verdict table; returns 0, or 2 when the logs cannot be read."""
    quiet_tensorflow()
    parser = StrictArgumentParser(
        prog=command_name("trainer.diagnose"),
        description="Apply the monitoring table to a training run's TensorBoard logs.",
    )
    parser.add_argument("model_dir", help="the run's --model_dir (or a directory of event files)")
    parser.add_argument("--json", action="store_true", help="print machine-readable verdicts")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        type=_parse_threshold,
        metavar="NAME=VALUE",
        help="override a threshold, e.g. input_wait=0.1 (repeatable)",
    )
    args = parser.parse_args(argv)
    overrides = dict(args.threshold)
    if "min_points" in overrides:
        overrides["min_points"] = int(overrides["min_points"])
    try:
        thresholds = Thresholds(**overrides)
    except ValueError as e:
        parser.error(str(e))
    # Ctrl-C or SIGTERM ends it with one line and 130 or 143; `| head` quietly with 141.
    return run_command(lambda: _report(args.model_dir, thresholds, as_json=args.json))


def _report(model_dir: str, thresholds: Thresholds, *, as_json: bool) -> int:
    """Prints the verdicts for ``model_dir``; returns 0, or 2 when its logs cannot be read."""
    if "tensorflow" not in sys.modules:
        # TensorBoard's own protobuf reader is enough and starts in a fraction of the time
        # TensorFlow takes to import; this is the switch TensorBoard's no-TF build uses.
        import types

        sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("notf"))
    try:
        runs = read_scalars(model_dir)
    except LogsUnreadable as e:
        print(f"diagnose: {e}", file=sys.stderr)
        return 2
    verdicts = diagnose_run(runs, thresholds, leakage=read_leakage(model_dir))
    if as_json:
        print(json.dumps([dataclasses.asdict(v) for v in verdicts], indent=2))
        return 0
    train = runs.get("train", {})
    steps = sorted({s for series in train.values() for s, _ in series})
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no training steps"
    print(f"{model_dir}: {len(steps)} logged training points, {span}")
    print(format_table(verdicts))
    warnings = sum(v.status == WARN for v in verdicts)
    print(f"{warnings} warning(s)" if warnings else "no warnings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
