"""``python -m trainer.train``: distributed training fed by the project's reader.

Rerunning the same command resumes from the last checkpoint in ``--model_dir``, at the exact
data position. SIGTERM (preemption) or Ctrl-C saves a checkpoint before exiting with
128 + the signal number.

Example (the quickstart's run; add ``--cpu_replicas 2`` for MirroredStrategy without a GPU)::

    python -m trainer.train --data out/dataset --model_dir runs/a --model small_cnn \\
        --image_size 64 --global_batch_size 32 --steps 300 --base_lr 0.2 --warmup_steps 20 \\
        --eval_every 50
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from trainer.config import (
    LR_SCHEDULES,
    MODELS,
    OPTIMIZERS,
    STRATEGIES,
    DataConfig,
    OptimConfig,
    RuntimeConfig,
    TrainConfig,
)

__all__ = ["main", "parse_config"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.train",
        description="Train an image classifier on TFRecord shards, with exact resume.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    data = p.add_argument_group("data")
    data.add_argument("--data", required=True, help="dataset directory or URI, or a TFRecord glob")
    data.add_argument("--train_split", default="train")
    data.add_argument("--eval_split", default="validation")
    data.add_argument("--image_size", type=int, default=224, help="training image side")
    data.add_argument(
        "--num_classes", type=int, default=None, help="only for sources without dataset.json"
    )
    data.add_argument(
        "--data_service",
        default=None,
        help="tf.data service dispatcher (grpc://host:port); the data position is then not "
        "checkpointed",
    )
    data.add_argument(
        "--data_service_compression",
        choices=("NONE", "AUTO", "SNAPPY"),
        default="NONE",
        help="transfer compression of decoded batches from the tf.data service (NONE costs the "
        "trainer about a third of the CPU of AUTO)",
    )
    data.add_argument("--cache", default=None, help="reader cache: 'memory' or a file prefix")

    run = p.add_argument_group("run")
    run.add_argument("--model_dir", required=True, help="checkpoints and TensorBoard logs")
    run.add_argument("--model", choices=MODELS, default="small_cnn")
    run.add_argument("--global_batch_size", type=int, default=256)
    length = run.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=int, help="total steps to reach")
    length.add_argument("--epochs", type=int, help="total epochs (needs dataset.json)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--log_every", type=int, default=10, help="steps between scalar writes")
    run.add_argument("--checkpoint_every", type=int, default=100)
    run.add_argument("--keep_checkpoints", type=int, default=3)
    run.add_argument(
        "--eval_every", type=int, default=None, help="steps between evaluations (default: epoch)"
    )
    run.add_argument(
        "--audit_keys",
        default=None,
        help="append the key of every trained example to this file (PATH.worker-<k> per worker)",
    )

    optim = p.add_argument_group("optimiser")
    optim.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    optim.add_argument(
        "--base_lr", type=float, default=0.1, help="LR = base_lr x global_batch_size / 256"
    )
    optim.add_argument("--warmup_steps", type=int, default=100)
    optim.add_argument("--lr_schedule", choices=LR_SCHEDULES, default="constant")

    runtime = p.add_argument_group("runtime")
    runtime.add_argument(
        "--strategy", choices=STRATEGIES, default="auto", help="auto: from TF_CONFIG/Slurm/TPU/GPUs"
    )
    runtime.add_argument(
        "--cpu_replicas", type=int, default=1, help="split the CPU into N logical devices"
    )
    runtime.add_argument(
        "--mixed_precision",
        action="store_true",
        help="mixed_float16 on GPU, mixed_bfloat16 on TPU/CPU",
    )
    runtime.add_argument("--tpu", default=None, help="TPU name or address ('' = local TPU VM)")
    runtime.add_argument("--slurm_port_base", type=int, default=8888)
    runtime.add_argument(
        "--keep_freed_memory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="make glibc's malloc reuse freed memory rather than return it to the kernel "
        "(received batches then stop faulting in fresh pages); default: on with --data_service",
    )
    runtime.add_argument(
        "--bulk_reads",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="have gRPC read large messages in few wakeups (gRPC experiments tcp_rcv_lowat "
        "and tcp_frame_size_tuning); default: on with --data_service",
    )
    runtime.add_argument("--log_level", default="INFO", choices=("DEBUG", "INFO", "WARNING"))
    return p


def parse_config(argv: Sequence[str] | None = None) -> tuple[TrainConfig, str]:
    """Parses flags into a ``TrainConfig`` (and the log level).

    Exits with status 2 and a message naming the bad value, as argparse does.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        config = TrainConfig(
            model_dir=args.model_dir,
            data=DataConfig(
                source=args.data,
                train_split=args.train_split,
                eval_split=args.eval_split,
                image_size=args.image_size,
                num_classes=args.num_classes,
                data_service=args.data_service,
                data_service_compression=args.data_service_compression,
                cache=args.cache,
            ),
            model=args.model,
            global_batch_size=args.global_batch_size,
            steps=args.steps,
            epochs=args.epochs,
            seed=args.seed,
            log_every=args.log_every,
            checkpoint_every=args.checkpoint_every,
            keep_checkpoints=args.keep_checkpoints,
            eval_every=args.eval_every,
            audit_keys=args.audit_keys,
            optim=OptimConfig(
                name=args.optimizer,
                base_lr=args.base_lr,
                warmup_steps=args.warmup_steps,
                schedule=args.lr_schedule,
            ),
            runtime=RuntimeConfig(
                strategy=args.strategy,
                cpu_replicas=args.cpu_replicas,
                mixed_precision=args.mixed_precision,
                tpu=args.tpu,
                slurm_port_base=args.slurm_port_base,
                keep_freed_memory=args.keep_freed_memory,
                bulk_reads=args.bulk_reads,
            ),
        )
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    return config, args.log_level


def _follows_service(setting: bool | None, data_service: str | None) -> bool:
    """Whether a host setting applies: as its flag says, or (unset) with ``--data_service``."""
    return bool(data_service) if setting is None else setting


def main(argv: Sequence[str] | None = None) -> int:
    """Runs training; returns the process exit status."""
    config, log_level = parse_config(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.basicConfig(
        level=log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # TensorFlow's Python logger reports every collective it builds at INFO.
    for noisy in ("tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(log_level)))
    log = logging.getLogger("trainer.train")

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
        from tfrecord_io.service_client import enable_bulk_reads

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

    # Devices are configured before anything else touches TensorFlow's runtime.
    from trainer.inputs import ReaderInputs
    from trainer.loop import run_training
    from trainer.strategy import create_distribution

    try:
        dist = create_distribution(
            config.runtime.strategy,
            cpu_replicas=config.runtime.cpu_replicas,
            tpu=config.runtime.tpu,
            slurm_port_base=config.runtime.slurm_port_base,
        )
        inputs = ReaderInputs.from_config(
            config.data, global_batch_size=config.global_batch_size, seed=config.seed
        )
        if dist.num_workers > 1:
            log.info("this is worker %d of %d", dist.worker_index, dist.num_workers)
        result = run_training(config, dist, inputs)
    except (ValueError, KeyError, FileNotFoundError) as e:
        log.error("%s", e.args[0] if isinstance(e, KeyError) and e.args else e)
        log.debug("where it was raised:", exc_info=True)
        return 2
    except FloatingPointError as e:
        log.error("%s", e)
        return 1
    if result.exit_code == 0:
        log.info(
            "done at step %d; train %s; validation %s; checkpoint %s",
            result.step,
            result.train_metrics,
            result.eval_metrics,
            result.checkpoint,
        )
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
