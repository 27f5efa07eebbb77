"""Trainer configuration: frozen dataclasses that check themselves.

The command line (``trainer.train``) is the only place that parses flags; everything below it
takes one of these objects. Each ``__post_init__`` rejects a bad value with an error that names
the field, the value and what was expected.

Each field is written once: its ``flag(...)`` metadata holds the help line, and its default is
the one default, from which ``cliflags.dataclass_flags`` generates the trainer's flags.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from cliflags.dataclass_flags import NO_FLAG, flag
from schemas.constants import TRAIN, VALIDATION

__all__ = [
    "MODELS",
    "MODEL_IMPORT_PATH",
    "STRATEGIES",
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "SERVICE_COMPRESSIONS",
    "DataConfig",
    "OptimConfig",
    "RuntimeConfig",
    "TrainConfig",
]

MODELS = ("small_cnn", "resnet50")
# A model of the user's own: ``package.module:function`` (trainer.user_model).
MODEL_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "cosine")
SERVICE_COMPRESSIONS = ("NONE", "AUTO", "SNAPPY")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _optional_positive_int(name: str, value: object) -> None:
    if value is not None:
        _positive_int(name, value)


def _check_model(model: object, model_args: object) -> None:
    if not isinstance(model, str) or not (model in MODELS or MODEL_IMPORT_PATH.match(model)):
        raise ValueError(
            f"model must be one of {MODELS} or an import path package.module:function, "
            f"got {model!r}"
        )
    if not isinstance(model_args, Mapping) or not all(
        isinstance(k, str) and k.isidentifier() for k in model_args
    ):
        raise ValueError(f"model_args must map identifiers to values, got {model_args!r}")


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the examples come from and how they are read.

    Each field's help is its ``flag`` metadata (``python -m trainer.train --help`` prints it).
    """

    source: str = dataclasses.field(
        metadata=flag(
            "dataset directory or URI holding dataset.json, or a glob of TFRecord files",
            name="data",
        )
    )
    train_split: str = dataclasses.field(default=TRAIN, metadata=flag("split trained on"))
    eval_split: str = dataclasses.field(
        default=VALIDATION,
        metadata=flag(
            "split evaluated on; evaluation is skipped when the dataset has no such split"
        ),
    )
    image_size: int = dataclasses.field(
        default=224,
        metadata=flag(
            "side of the square images fed to the model; foreign or adopted shards, whose "
            "dataset.json cannot tell, get the fallback",
            derived="the side the dataset stores, from dataset.json's image",
        ),
    )
    num_classes: int | None = dataclasses.field(
        default=None,
        metadata=flag(
            "number of classes; only for sources without dataset.json",
            default_text="from dataset.json",
        ),
    )
    data_service: str | None = dataclasses.field(
        default=None,
        metadata=flag(
            "tf.data service dispatcher (grpc://host:port); a resume reads the rest of the "
            "epoch from the checkpoint's delivered set",
            default_text="none (read in-process)",
        ),
    )
    data_service_compression: str = dataclasses.field(
        default="NONE",
        metadata=flag(
            "transfer compression of decoded batches from the tf.data service (NONE costs the "
            "trainer about a third of the CPU of AUTO)",
            choices=SERVICE_COMPRESSIONS,
        ),
    )
    cache: str | None = dataclasses.field(
        default=None,
        metadata=flag(
            "reader cache: 'memory' or a file path prefix (only 'memory' with --data_service, "
            "whose workers would write a file cache concurrently)",
            default_text="none",
        ),
    )
    skip_corrupt: bool = dataclasses.field(
        default=False,
        metadata=flag(
            "train past damaged or missing shards (logged and skipped) instead of stopping; "
            "evaluation never skips, so its totals stay exact; python -m dataset_tools.verify "
            "shows the damage"
        ),
    )

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source:
            raise ValueError(f"data source must be a non-empty path or URI, got {self.source!r}")
        for name in ("train_split", "eval_split"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty split name, got {value!r}")
        _positive_int("image_size", self.image_size)
        if not isinstance(self.skip_corrupt, bool):
            raise ValueError(f"skip_corrupt must be True or False, got {self.skip_corrupt!r}")
        if self.image_size < 8:
            raise ValueError(f"image_size must be >= 8 pixels, got {self.image_size}")
        if self.num_classes is not None:
            _positive_int("num_classes", self.num_classes)
            if self.num_classes < 2:
                raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        if self.data_service is not None and "://" not in self.data_service:
            raise ValueError(
                f"data_service must be a dispatcher address like 'grpc://host:5050', "
                f"got {self.data_service!r}"
            )
        _choice("data_service_compression", self.data_service_compression, SERVICE_COMPRESSIONS)
        if self.data_service is not None and self.cache not in (None, "memory"):
            raise ValueError(
                f"cache {self.cache!r} is a file cache, which service workers sharing a "
                "filesystem would write concurrently; use cache='memory' with data_service"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The optimiser and its learning-rate schedule.

    The peak learning rate follows the linear scaling rule
    ``base_lr * global_batch_size / 256``; it is reached by a linear warm-up over
    ``warmup_steps`` and then held (``constant``) or decayed to zero at the last step
    (``cosine``). The constant schedule does not depend on the number of steps, so extending a
    finished run with a larger ``--steps`` trains exactly as one longer run would.

    Each field's help is its ``flag`` metadata (``python -m trainer.train --help`` prints
    it); ``momentum`` has no flag.
    """

    name: str = dataclasses.field(
        default="sgd",
        metadata=flag("sgd (momentum 0.9) or adam", name="optimizer", choices=OPTIMIZERS),
    )
    base_lr: float = dataclasses.field(
        default=0.1,
        metadata=flag(
            "learning rate for a global batch of 256: the peak is base_lr x global_batch_size / 256"
        ),
    )
    warmup_steps: int = dataclasses.field(
        default=100, metadata=flag("steps of linear warm-up to the peak learning rate; 0: none")
    )
    schedule: str = dataclasses.field(
        default="constant",
        metadata=flag(
            "after the warm-up, hold the peak (constant) or decay it to zero at the last step "
            "(cosine)",
            name="lr_schedule",
            choices=LR_SCHEDULES,
        ),
    )
    # SGD momentum, for callers of the Python API.
    momentum: float = dataclasses.field(default=0.9, metadata=NO_FLAG)

    def __post_init__(self) -> None:
        _choice("optimizer", self.name, OPTIMIZERS)
        _choice("lr_schedule", self.schedule, LR_SCHEDULES)
        if (
            not isinstance(self.base_lr, int | float)
            or not math.isfinite(self.base_lr)
            or self.base_lr <= 0
        ):
            raise ValueError(f"base_lr must be a finite number > 0, got {self.base_lr!r}")
        if (
            not isinstance(self.warmup_steps, int)
            or isinstance(self.warmup_steps, bool)
            or self.warmup_steps < 0
        ):
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")

    def peak_lr(self, global_batch_size: int) -> float:
        """The linear scaling rule: ``base_lr * global_batch_size / 256``."""
        return self.base_lr * global_batch_size / 256.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """Devices and distribution.

    Each field's help is its ``flag`` metadata (``python -m trainer.train --help`` prints it).
    """

    strategy: str = dataclasses.field(
        default="auto",
        metadata=flag(
            "tf.distribute strategy; auto picks from TF_CONFIG, Slurm, a TPU, GPUs and "
            "--cpu_replicas",
            choices=STRATEGIES,
        ),
    )
    cpu_replicas: int = dataclasses.field(
        default=1,
        metadata=flag(
            "split the CPU into N logical devices, so mirrored training runs without a GPU"
        ),
    )
    mixed_precision: bool = dataclasses.field(
        default=False, metadata=flag("mixed_float16 on GPU, mixed_bfloat16 on TPU and CPU")
    )
    jit_compile: bool = dataclasses.field(
        default=False,
        metadata=flag(
            "compile each replica's forward and backward pass with XLA (the model must be "
            "XLA-compatible; the gradient all-reduce stays outside)"
        ),
    )
    tpu: str | None = dataclasses.field(
        default=None,
        metadata=flag(
            "TPU name or address for the TPU cluster resolver ('' = the local TPU VM)",
            default_text="none ($TPU_NAME, if set)",
        ),
    )
    slurm_port_base: int = dataclasses.field(
        default=8888, metadata=flag("first port of the workers when the cluster comes from Slurm")
    )
    keep_freed_memory: bool | None = dataclasses.field(
        default=None,
        metadata=flag(
            "make glibc's malloc reuse freed memory rather than return it to the kernel "
            "(received batches then stop faulting in fresh pages; trainer.host_memory)",
            default_text="on with --data_service",
        ),
    )
    bulk_reads: bool | None = dataclasses.field(
        default=None,
        metadata=flag(
            "have gRPC read large messages in few wakeups (gRPC experiments tcp_rcv_lowat and "
            "tcp_frame_size_tuning)",
            default_text="on with --data_service",
        ),
    )

    def __post_init__(self) -> None:
        _choice("strategy", self.strategy, STRATEGIES)
        if not isinstance(self.jit_compile, bool):
            raise ValueError(f"jit_compile must be True or False, got {self.jit_compile!r}")
        for name in ("keep_freed_memory", "bulk_reads"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or None, got {value!r}")
        _positive_int("cpu_replicas", self.cpu_replicas)
        if not 1024 <= self.slurm_port_base <= 65000:
            raise ValueError(
                f"slurm_port_base must be in [1024, 65000], got {self.slurm_port_base!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything one training run needs.

    Each field's help is its ``flag`` metadata (``python -m trainer.train --help`` prints
    it); ``data``, ``optim`` and ``runtime`` are the configs above.
    """

    model_dir: str = dataclasses.field(
        metadata=flag("checkpoints and TensorBoard logs; rerunning with the same one resumes")
    )
    data: DataConfig
    model: str = dataclasses.field(
        default="small_cnn",
        metadata=flag(
            f"the classifier to train: a built-in ({', '.join(MODELS)}) or your own, as "
            "package.module:function building a Keras model (see trainer.user_model)"
        ),
    )
    # The ``--model_arg key=value`` pairs, passed to an imported model function as keywords
    # (trainer.train adds the repeated flag itself).
    model_args: Mapping[str, Any] = dataclasses.field(default_factory=dict, metadata=NO_FLAG)
    global_batch_size: int = dataclasses.field(
        default=256, metadata=flag("examples per step over all replicas of all workers")
    )
    steps: int | None = dataclasses.field(
        default=None,
        metadata=flag("total steps to reach (a target, not an increment)", one_of="length"),
    )
    epochs: int | None = dataclasses.field(
        default=None,
        metadata=flag("total epochs over the train split (needs dataset.json)", one_of="length"),
    )
    seed: int = dataclasses.field(
        default=0, metadata=flag("seeds the weights, the file and record order and augmentation")
    )
    log_every: int = dataclasses.field(
        default=10, metadata=flag("steps between scalar writes (TensorBoard and the log)")
    )
    checkpoint_every: int = dataclasses.field(
        default=100,
        metadata=flag("steps between checkpoints (one is also saved at the end and on SIGTERM)"),
    )
    keep_checkpoints: int = dataclasses.field(default=3, metadata=flag("checkpoints kept on disk"))
    eval_every: int | None = dataclasses.field(
        default=None,
        metadata=flag(
            "steps between evaluations of the eval split",
            default_text="a fifth of --steps (5 evaluations), and at the end",
        ),
    )
    audit_keys: str | None = dataclasses.field(
        default=None,
        metadata=flag(
            "append the key of every trained example to this file, in order (PATH.worker-<k> "
            "per worker)",
            default_text="none",
        ),
    )
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if not isinstance(self.model_dir, str) or not self.model_dir:
            raise ValueError(f"model_dir must be a non-empty path, got {self.model_dir!r}")
        if not isinstance(self.data, DataConfig):
            raise TypeError(f"data must be a DataConfig, got {type(self.data).__name__}")
        if not isinstance(self.optim, OptimConfig):
            raise TypeError(f"optim must be an OptimConfig, got {type(self.optim).__name__}")
        if not isinstance(self.runtime, RuntimeConfig):
            raise TypeError(f"runtime must be a RuntimeConfig, got {type(self.runtime).__name__}")
        _check_model(self.model, self.model_args)
        _positive_int("global_batch_size", self.global_batch_size)
        if (self.steps is None) == (self.epochs is None):
            raise ValueError(
                f"give exactly one of steps or epochs, got steps={self.steps!r} "
                f"epochs={self.epochs!r}"
            )
        _optional_positive_int("steps", self.steps)
        _optional_positive_int("epochs", self.epochs)
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        _positive_int("log_every", self.log_every)
        _positive_int("checkpoint_every", self.checkpoint_every)
        _positive_int("keep_checkpoints", self.keep_checkpoints)
        _optional_positive_int("eval_every", self.eval_every)
        if self.audit_keys is not None and not self.audit_keys:
            raise ValueError("audit_keys must be a file path or None, got ''")
        if self.global_batch_size % self.runtime.cpu_replicas:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} must be divisible by "
                f"cpu_replicas {self.runtime.cpu_replicas}"
            )
