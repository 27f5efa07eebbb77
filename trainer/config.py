"""Trainer configuration: frozen dataclasses that check themselves.

The command line (``trainer.train``) is the only place that parses flags; everything below it
takes one of these objects. Each ``__post_init__`` rejects a bad value with an error that names
the field, the value and what was expected.
"""

from __future__ import annotations

import dataclasses
import math

from schemas.constants import TRAIN, VALIDATION

__all__ = [
    "MODELS",
    "STRATEGIES",
    "OPTIMIZERS",
    "LR_SCHEDULES",
    "DataConfig",
    "OptimConfig",
    "RuntimeConfig",
    "TrainConfig",
]

MODELS = ("small_cnn", "resnet50")
STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
OPTIMIZERS = ("sgd", "adam")
LR_SCHEDULES = ("constant", "cosine")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


def _optional_positive_int(name: str, value: object) -> None:
    if value is not None:
        _positive_int(name, value)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the examples come from and how they are read.

    Attributes:
      source: a dataset directory or URI holding ``dataset.json``, or a glob of TFRecord files.
      train_split: split trained on.
      eval_split: split evaluated on; evaluation is skipped when the dataset has no such split.
      image_size: side of the square images fed to the model.
      num_classes: number of classes; required only when ``source`` has no manifest.
      data_service: ``grpc://host:port`` of a tf.data service dispatcher, or None to read
        in-process.
      data_service_compression: transfer compression from the service: ``"NONE"``,
        ``"AUTO"`` or ``"SNAPPY"``.
      cache: passed to the reader: None, ``"memory"`` or a file path prefix.
      skip_corrupt: training reads past damaged shards (logged and skipped) instead of
        failing; evaluation never does, so its totals stay exact.
    """

    source: str
    train_split: str = TRAIN
    eval_split: str = VALIDATION
    image_size: int = 224
    num_classes: int | None = None
    data_service: str | None = None
    data_service_compression: str = "NONE"
    cache: str | None = None
    skip_corrupt: bool = False

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
        if self.data_service_compression not in ("NONE", "AUTO", "SNAPPY"):
            raise ValueError(
                "data_service_compression must be one of ('NONE', 'AUTO', 'SNAPPY'), "
                f"got {self.data_service_compression!r}"
            )
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

    Attributes:
      name: ``sgd`` (momentum 0.9) or ``adam``.
      base_lr: learning rate for a global batch of 256.
      warmup_steps: steps of linear warm-up; 0 disables it.
      schedule: ``constant`` or ``cosine``.
      momentum: SGD momentum.
    """

    name: str = "sgd"
    base_lr: float = 0.1
    warmup_steps: int = 100
    schedule: str = "constant"
    momentum: float = 0.9

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

    Attributes:
      strategy: one of ``STRATEGIES``; ``auto`` picks from the environment (TF_CONFIG, Slurm,
        TPU, GPUs, ``cpu_replicas``).
      cpu_replicas: split the host CPU into this many logical devices so that mirrored training
        runs without a GPU.
      mixed_precision: ``mixed_float16`` on GPU, ``mixed_bfloat16`` on TPU and CPU.
      tpu: TPU name or address for the TPU cluster resolver ("" means the local TPU VM).
      slurm_port_base: first port for workers when the cluster comes from Slurm.
      keep_freed_memory: tune glibc's malloc to reuse freed memory (``trainer.host_memory``);
        None applies it exactly when batches come from the tf.data service.
      bulk_reads: have gRPC read large messages in few wakeups
        (``tfrecord_io.service.client.enable_bulk_reads``); None applies it exactly when
        batches come from the tf.data service.
    """

    strategy: str = "auto"
    cpu_replicas: int = 1
    mixed_precision: bool = False
    tpu: str | None = None
    slurm_port_base: int = 8888
    keep_freed_memory: bool | None = None
    bulk_reads: bool | None = None

    def __post_init__(self) -> None:
        _choice("strategy", self.strategy, STRATEGIES)
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

    Attributes:
      model_dir: checkpoints and TensorBoard logs; rerunning with the same ``model_dir``
        resumes.
      model: one of ``MODELS``.
      global_batch_size: examples per step over all replicas of all workers.
      steps: total steps to reach (a target, not an increment); exclusive with ``epochs``.
      epochs: total epochs over the train split; needs a manifest to count examples.
      seed: seeds weights, shuffling and augmentation.
      log_every: steps between TensorBoard scalar writes.
      checkpoint_every: steps between checkpoints (also saved at the end and on SIGTERM).
      keep_checkpoints: checkpoints kept on disk.
      eval_every: steps between evaluations; None evaluates once per epoch and at the end.
      audit_keys: file to which every trained example's key is appended, in order.
    """

    model_dir: str
    data: DataConfig
    model: str = "small_cnn"
    global_batch_size: int = 256
    steps: int | None = None
    epochs: int | None = None
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    eval_every: int | None = None
    audit_keys: str | None = None
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
        _choice("model", self.model, MODELS)
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
