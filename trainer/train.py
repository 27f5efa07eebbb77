"""``python -m trainer.train``: distributed training fed by the project's reader.

Rerunning the same command resumes from the last checkpoint in ``--model_dir``, at the exact
data position. Ctrl-C (SIGINT) or SIGTERM (preemption) during training finishes the step,
saves a checkpoint and exits with one line saying so (status 130 or 143, 128 + the signal's
number); before the first step it exits at once, naming the checkpoint a rerun resumes from.

Example (the quickstart's run; add ``--cpu_replicas 2`` for MirroredStrategy without a GPU)::

    python -m trainer.train --data out/dataset --model_dir runs/a --model small_cnn \\
        --image_size 64 --global_batch_size 32 --steps 300 --base_lr 0.2 --warmup_steps 20 \\
        --eval_every 50
"""

from __future__ import annotations

import argparse
import glob
import importlib
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from cliflags import StrictArgumentParser, command_name, quiet_tensorflow
from cliflags.dataclass_flags import add_dataclass_flags, flag_values
from cliflags.interrupts import run_command, signal_name
from trainer.config import (
    MODELS,
    DataConfig,
    OptimConfig,
    RuntimeConfig,
    TrainConfig,
)
from trainer.user_model import load_model_fn, parse_model_args

__all__ = ["build_parser", "main", "parse_config"]

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING")


def _stored_image_size(source: str) -> tuple[int, str] | None:
    """The side a dataset stores its images at, with how (``96 px RAW, centre crop``), or None.

    RAW and centre-cropped datasets store ``image_size`` squares; JPEG/PNG without a crop store
    the shorter side at ``image_size``. Either way that is the side to train at by default: no
    image is scaled up, and random crops keep the stored detail.
    """
    from tfrecord_io.source import load_manifest

    try:
        manifest = load_manifest(source)
    except (OSError, ValueError):
        return None  # reported, in order, when the run starts
    if manifest is None or isinstance(manifest.options.get("adopted"), dict):
        return None  # foreign or adopted shards: images of any size
    image = manifest.image
    how = "squares" if image.crop == "center" else "shorter side"
    return image.image_size, f"{image.image_size} px {image.encoding.upper()}, {how}"


def _name_the_flag(message: str, parser: argparse.ArgumentParser) -> str:
    # Config errors start with the field's name; on the command line the flag fixes them.
    first = message.split(" ", 1)[0].split("=", 1)[0]
    if f"--{first}" in parser._option_string_actions:
        return f"--{message}"
    return message


class _ShortUsageParser(StrictArgumentParser):
    """Prints a two-line usage and the error, not the whole usage block (30 lines of flags,
    which hide the one line that matters); ``--help`` prints everything."""

    def format_usage(self) -> str:
        return f"usage: {self.prog} --data DATA --model_dir DIR (--steps N | --epochs N) [flags]\n"

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        # An unknown flag's message carries its own second line (a suggestion, or what to do).
        hinted = "--help" in message or message.startswith("unrecognized flag")
        hint = "" if hinted or "did you mean" in message else f"\nsee {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message}{hint}\n")


# Flags a user brings from elsewhere (the pipeline's --resume, other trainers' resume flags):
# this trainer resumes whenever --model_dir holds a checkpoint.
_RESUME_HINT = (
    "training needs no resume flag: rerun the same command (the same --model_dir) to resume "
    "from the last checkpoint there"
)
_FLAGS_FROM_ELSEWHERE = {
    "--resume": _RESUME_HINT,
    "--resume_from_checkpoint": _RESUME_HINT,
    "--restore": _RESUME_HINT,
}


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from the config dataclasses, one help group each."""
    p = _ShortUsageParser(
        prog=command_name("trainer.train"),
        description="Train an image classifier on TFRecord shards, with exact resume.",
    )
    p.flag_hints.update(_FLAGS_FROM_ELSEWHERE)
    add_dataclass_flags(p.add_argument_group("data"), DataConfig)
    run = p.add_argument_group("run")
    add_dataclass_flags(run, TrainConfig)
    run.add_argument(
        "--model_arg",
        dest="model_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument for the function --model imports; repeat for more (a value "
        "is read as a Python literal when it is one, else as a string) (default: none)",
    )
    add_dataclass_flags(p.add_argument_group("optimiser"), OptimConfig)
    runtime = p.add_argument_group("runtime")
    add_dataclass_flags(runtime, RuntimeConfig)
    runtime.add_argument(
        "--log_level",
        default="INFO",
        choices=_LOG_LEVELS,
        help="the least severe log messages shown (default: %(default)s)",
    )
    runtime.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's start-up lines and C++ logs, hidden unless TF_CPP_MIN_LOG_LEVEL "
        "is set (default: off)",
    )
    return p


def parse_config(argv: Sequence[str] | None = None) -> tuple[TrainConfig, str]:
    """Parses flags into a ``TrainConfig`` (and the log level).

    Exits with status 2 and a message naming the bad value, as argparse does.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        data = flag_values(DataConfig, args)
        if "image_size" not in data:
            # Not given: the side the dataset stores, else DataConfig's fallback.
            stored = _stored_image_size(args.data)
            if stored is not None:
                data["image_size"] = stored[0]
        config = TrainConfig(
            data=DataConfig(**data),
            optim=OptimConfig(**flag_values(OptimConfig, args)),
            runtime=RuntimeConfig(**flag_values(RuntimeConfig, args)),
            model_args=parse_model_args(args.model_args),
            **flag_values(TrainConfig, args),
        )
        if config.model_args and config.model in MODELS:
            raise ValueError(
                f"--model_arg {', '.join(sorted(config.model_args))}: a keyword for a model "
                f"function of your own; the built-in {config.model!r} takes none"
            )
    except (ValueError, TypeError) as e:
        parser.error(_name_the_flag(str(e), parser))
    return config, args.log_level


def _follows_service(setting: bool | None, data_service: str | None) -> bool:
    """Whether a host setting applies: as its flag says, or (unset) with ``--data_service``."""
    return bool(data_service) if setting is None else setting


def main(argv: Sequence[str] | None = None) -> int:
    """Runs training; returns the process exit status (130 or 143 after Ctrl-C or SIGTERM).

    Raises:
      SystemExit: with status 2 on a bad flag.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # Importing tfrecord_io quiets TensorFlow (once, as the package loads): --verbose undoes
    # that after it, and before anything imports TensorFlow (reading the flags may).
    importlib.import_module("tfrecord_io")
    quiet_tensorflow(verbose="--verbose" in argv)
    root = logging.getLogger()
    ours = not root.handlers  # a caller's logging (a test's, an application's) is left alone
    if ours:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    model_dir: list[str] = []  # known once the flags are read

    def body() -> int:
        config, log_level = parse_config(argv)
        model_dir.append(config.model_dir)
        if ours:
            root.setLevel(log_level)
        return _train(config, log_level)

    return run_command(
        body, on_interrupt=lambda signum: _interrupted(signum, model_dir[0] if model_dir else None)
    )


def _interrupted(signum: int, model_dir: str | None, step: int | None = None) -> str:
    """The one line after a signal: what the run kept, and how to continue.

    Args:
      signum: the signal.
      model_dir: the run's directory, or None when the flags were not read yet.
      step: the step just saved, or None when the run stopped before it could save (the
        latest checkpoint on disk is then what a rerun resumes from).
    """
    stopped = f"interrupted by {signal_name(signum)}"
    start_again = f"{stopped} before the first checkpoint; rerun the same command to start again"
    if model_dir is None:  # the flags were not read yet: nothing was written
        return start_again
    if step is not None:
        return (
            f"{stopped}; saved step {step} in {model_dir}; rerun the same command to resume "
            f"from step {step}"
        )
    if "://" in model_dir:
        return (
            f"{stopped}; rerun the same command to resume from the last checkpoint in {model_dir}"
        )
    saved = [
        int(m.group(1))
        for path in glob.glob(os.path.join(glob.escape(model_dir), "checkpoints", "ckpt-*.index"))
        if (m := re.search(r"ckpt-(\d+)\.index$", path))
    ]
    if not saved:
        return start_again
    return (
        f"{stopped}; the last checkpoint, step {max(saved)}, is in {model_dir}; rerun the same "
        f"command to resume from step {max(saved)}"
    )


def _train(config: TrainConfig, log_level: str) -> int:
    """Sets up the host and devices and trains; returns the exit status.

    Raises:
      KeyboardInterrupt: on Ctrl-C or SIGTERM before the first step (``run_command`` turns it
        into the exit status and one line).
    """
    # TensorFlow's Python logger reports every collective it builds at INFO.
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(log_level)))
    log = logging.getLogger("trainer.train")
    _explain_defaults(config, log)
    _configure_host(config, log)

    # Devices are configured before anything else touches TensorFlow's runtime.
    from trainer.api import fit
    from trainer.strategy import create_distribution

    try:
        if config.model not in MODELS:
            load_model_fn(config.model)  # a wrong import path fails before the devices start
        dist = create_distribution(
            config.runtime.strategy,
            cpu_replicas=config.runtime.cpu_replicas,
            tpu=config.runtime.tpu,
            slurm_port_base=config.runtime.slurm_port_base,
        )
        if dist.num_workers > 1:
            log.info("this is worker %d of %d", dist.worker_index, dist.num_workers)
        result = fit(config.model, config, distribution=dist)
    except (ValueError, KeyError, FileNotFoundError) as e:
        damaged = _damaged_shard_message(e, config.data.source)  # read before the first step
        log.error("%s", damaged or (e.args[0] if isinstance(e, KeyError) and e.args else e))
        log.debug("where it was raised:", exc_info=True)
        _quiet_teardown()
        return 2
    except FloatingPointError as e:
        log.error("%s", e)
        _quiet_teardown()
        return 1
    except Exception as e:
        message = _damaged_shard_message(e, config.data.source) or _tensor_branch_message(
            e, config.model
        )
        if message is None:
            raise
        log.error("%s", message)
        _quiet_teardown()
        return 2
    if result.exit_code == 0:
        log.info(
            "done at step %d; train: %s; validation: %s; checkpoint %s",
            result.step,
            _metrics_text(result.train_metrics),
            _metrics_text(result.eval_metrics),
            result.checkpoint or "none written",
        )
    else:
        # Stopped by a signal after saving: printed, not logged, so --log_level cannot hide it.
        signum = result.exit_code - 128
        print(_interrupted(signum, config.model_dir, result.step), file=sys.stderr)
        _quiet_teardown()
    return result.exit_code


def _configure_host(config: TrainConfig, log: logging.Logger) -> None:
    """The allocator and gRPC settings, before TensorFlow starts a thread or gRPC."""
    service = config.data.data_service
    if _follows_service(config.runtime.keep_freed_memory, service):
        # Before TensorFlow starts any thread (see trainer/host_memory.py).
        from trainer.host_memory import keep_freed_memory

        if keep_freed_memory():
            log.info("malloc keeps freed memory for reuse (one arena, no trimming)")
        else:
            log.warning("--keep_freed_memory needs glibc; the allocator is left as it is")

    if _follows_service(config.runtime.bulk_reads, service):
        # Before this process first uses gRPC (a multi-worker strategy's server, the service).
        from tfrecord_io.service.client import enable_bulk_reads

        if enable_bulk_reads():
            log.info(
                "gRPC reads large messages in bulk (GRPC_EXPERIMENTS=%s)",
                os.environ["GRPC_EXPERIMENTS"],
            )
        else:
            log.warning(
                "--bulk_reads: GRPC_EXPERIMENTS=%s turns it off; left as it is",
                os.environ.get("GRPC_EXPERIMENTS"),
            )


def _explain_defaults(config: TrainConfig, log: logging.Logger) -> None:
    """Logs that the image size is the stored one, and warns of a warm-up the run never
    finishes. A size that differs from the stored one the reader notes, once per run."""
    stored = _stored_image_size(config.data.source)
    if stored is not None and stored[0] == config.data.image_size:
        log.info("image size %d, as the dataset stores it (%s)", stored[0], stored[1])
    warmup = config.optim.warmup_steps
    if config.steps is not None and warmup >= config.steps:
        log.warning(
            "--warmup_steps %d is not below --steps %d: the learning rate never reaches its "
            "peak; pass fewer, e.g. --warmup_steps %d (a tenth of the run)",
            warmup,
            config.steps,
            config.steps // 10,
        )


def _metrics_text(metrics: dict[str, float] | None) -> str:
    if not metrics:
        return "-"
    return ", ".join(f"{name} {value:.4g}" for name, value in sorted(metrics.items()))


_DAMAGED = "damaged, missing or unreadable TFRecord shard"


def _tensor_branch_message(error: Exception, model: str) -> str | None:
    """One line for a model that branches in Python on a tensor, or None for any other error.

    The steps are traced without AutoGraph, as Keras 3's ``fit`` traces its own, so a Python
    ``if`` on a tensor's value raises ``OperatorNotAllowedInGraphError`` at the first step.
    The line names the model's source line: the last frame outside TensorFlow and Keras,
    wherever the model's module is installed.
    """
    import tensorflow as tf

    if not isinstance(error, tf.errors.OperatorNotAllowedInGraphError):
        return None
    frameworks = {"tensorflow", "keras"}
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not frameworks & set(Path(f.filename).parts)
    ]
    where = f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})" if frames else ""
    return (
        f"--model {model}: the model branches in Python on a tensor's value{where}; the train "
        "and eval steps are traced without AutoGraph, as Keras' fit traces them: use tf.cond, "
        "tf.where or keras.ops.cond"
    )


def _damaged_shard_message(error: Exception, data: str) -> str | None:
    """One line for an input error that says a shard is damaged, or None for any other error.

    The reader's own check names the shard (an assertion inside a tf.data function, raised as
    ``InvalidArgumentError``); a small local split read with positions-only input checkpoints
    cannot use that check, and TensorFlow's ``DataLossError`` names no file.
    """
    text = str(error)
    if _DAMAGED in text:
        named = text[text.index(_DAMAGED) :].split("]\n", 1)[0].split("\n", 1)[0]
        return f"{named.rstrip(']')}; rerun with --skip_corrupt to train past it"
    if type(error).__name__ == "DataLossError":
        first = text.splitlines()[0] if text else type(error).__name__
        return (
            f"a shard of --data {data} is damaged ({first}): run tfrecord-verify {data} to "
            "name it, or pass --skip_corrupt to train past it"
        )
    return None


def _quiet_teardown() -> None:
    # After an error, TensorFlow's objects warn as they are collected (a checkpoint that was
    # not restored, say): the error above is what the user needs to read last.
    for name in ("tensorflow", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
