"""One factory from a strategy name to a ``tf.distribute.Strategy`` and its worker layout.

``auto`` resolves from the environment in this order: a multi-task ``TF_CONFIG`` or a Slurm
step with several tasks gives ``multi_worker``; a TPU name gives ``tpu``; several GPUs or
``cpu_replicas > 1`` give ``mirrored``; anything else ``one_device``.

Device configuration (GPU memory growth, splitting the CPU into logical devices) must happen
before TensorFlow initialises its runtime, so ``configure_devices`` runs first, before any
tensor is made.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainer.config import STRATEGIES

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = [
    "Distribution",
    "resolve_strategy_name",
    "configure_devices",
    "create_distribution",
    "precision_policy",
    "slurm_cluster_resolver",
    "split_batch",
    "worker_layout",
]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A strategy with the facts about this process that the loop needs.

    Attributes:
      strategy: the ``tf.distribute.Strategy``.
      name: the resolved strategy name (never ``auto``).
      device_kind: ``CPU``, ``GPU`` or ``TPU``.
      num_workers: hosts that each run this program and build their own input pipeline.
      worker_index: this host's index in ``[0, num_workers)``; the chief is 0.
      is_chief: whether this host writes the checkpoints and summaries.
      local_replicas: replicas (devices) on this host.
      cluster_source: ``tf_config``, ``slurm``, ``tpu`` or None.
    """

    strategy: Any
    name: str
    device_kind: str
    num_workers: int = 1
    worker_index: int = 0
    is_chief: bool = True
    local_replicas: int = 1
    cluster_source: str | None = None

    @property
    def num_replicas(self) -> int:
        """Replicas over all workers: ``num_workers * local_replicas``."""
        return int(self.strategy.num_replicas_in_sync)

    def worker_batch_size(self, global_batch_size: int) -> int:
        """The batch one worker's input pipeline must produce.

        Raises:
          ValueError: if ``global_batch_size`` does not split evenly over the replicas.
        """
        return split_batch(global_batch_size, self.num_workers, self.local_replicas)[0]

    def input_context(self) -> tf.distribute.InputContext:
        """An input context that shards by worker and batches at the per-worker size.

        Each worker is one input pipeline, and the reader divides the global batch by
        ``num_replicas_in_sync``; setting that to the number of workers makes the reader yield
        whole per-worker batches, which the loop then splits among local replicas.
        """
        import tensorflow as tf

        return tf.distribute.InputContext(
            num_input_pipelines=self.num_workers,
            input_pipeline_id=self.worker_index,
            num_replicas_in_sync=self.num_workers,
        )


def split_batch(global_batch_size: int, num_workers: int, local_replicas: int) -> tuple[int, int]:
    """``(per_worker, per_replica)`` batch sizes for a global batch.

    Feeding every replica the global batch multiplies its memory by the number of replicas, a
    common cause of out-of-memory failures; here the global batch is divided, once, by the
    number of workers and then by the replicas on each.

    Raises:
      ValueError: if the global batch does not split evenly over all replicas.
    """
    for name, value in (
        ("global_batch_size", global_batch_size),
        ("num_workers", num_workers),
        ("local_replicas", local_replicas),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    replicas = num_workers * local_replicas
    if global_batch_size % replicas:
        raise ValueError(
            f"global_batch_size {global_batch_size} must be divisible by the {replicas} "
            f"replicas in sync ({num_workers} workers x {local_replicas} local replicas)"
        )
    per_worker = global_batch_size // num_workers
    return per_worker, per_worker // local_replicas


def _tf_config_tasks(environ: Mapping[str, str]) -> int:
    raw = environ.get("TF_CONFIG")
    if not raw:
        return 0
    try:
        cluster = json.loads(raw).get("cluster", {})
    except (json.JSONDecodeError, AttributeError) as e:
        raise ValueError(f"TF_CONFIG is not a JSON object with a 'cluster': {raw!r}") from e
    return sum(len(cluster.get(job, [])) for job in ("chief", "worker"))


def _slurm_tasks(environ: Mapping[str, str]) -> int:
    if "SLURM_PROCID" not in environ:
        return 0
    raw = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or "1"
    try:
        return int(raw)
    except ValueError as e:
        raise ValueError(f"SLURM_STEP_NUM_TASKS must be an integer, got {raw!r}") from e


def resolve_strategy_name(
    requested: str,
    *,
    environ: Mapping[str, str],
    num_gpus: int,
    cpu_replicas: int = 1,
    tpu: str | None = None,
) -> tuple[str, str | None]:
    """Resolves ``auto`` and checks that the requested strategy fits the environment.

    Args:
      requested: one of ``STRATEGIES``.
      environ: the process environment (``TF_CONFIG``, ``SLURM_*``, ``TPU_NAME``).
      num_gpus: physical GPUs visible to this process.
      cpu_replicas: logical CPU devices asked for.
      tpu: the ``--tpu`` flag, if given.

    Returns:
      ``(name, cluster_source)``: the strategy name and, for multi-worker or TPU, where the
      cluster comes from (``tf_config``, ``slurm``, ``tpu``), else None.

    Raises:
      ValueError: ``Unrecognized Distribution Strategy: 'x'`` for an unknown name, or a
        combination that cannot work (for example ``cpu_replicas`` with a TPU).
    """
    if requested not in STRATEGIES:
        raise ValueError(
            f"Unrecognized Distribution Strategy: {requested!r} (expected one of {STRATEGIES})"
        )
    tf_config_tasks = _tf_config_tasks(environ)
    slurm_tasks = _slurm_tasks(environ)
    has_tpu = tpu is not None or bool(environ.get("TPU_NAME"))
    if requested == "auto":
        if tf_config_tasks > 1 or slurm_tasks > 1:
            requested = "multi_worker"
        elif has_tpu:
            requested = "tpu"
        elif num_gpus > 1 or cpu_replicas > 1:
            requested = "mirrored"
        else:
            requested = "one_device"
    if cpu_replicas > 1 and requested != "mirrored":
        raise ValueError(
            f"cpu_replicas={cpu_replicas} splits the CPU for the 'mirrored' strategy; it cannot "
            f"be used with strategy {requested!r}"
        )
    if cpu_replicas > 1 and num_gpus > 0:
        raise ValueError(
            f"cpu_replicas={cpu_replicas} is for machines without a GPU, but {num_gpus} GPU(s) "
            "are visible; mirrored already uses every GPU"
        )
    source: str | None = None
    if requested == "multi_worker":
        if tf_config_tasks:
            source = "tf_config"
        elif slurm_tasks:
            source = "slurm"
    elif requested == "tpu":
        source = "tpu"
    return requested, source


def precision_policy(device_kind: str, mixed_precision: bool) -> str:
    """The Keras dtype policy: ``mixed_float16`` on GPU, ``mixed_bfloat16`` on TPU and CPU.

    Raises:
      ValueError: if ``device_kind`` is not CPU, GPU or TPU.
    """
    if device_kind not in ("CPU", "GPU", "TPU"):
        raise ValueError(f"device_kind must be CPU, GPU or TPU, got {device_kind!r}")
    if not mixed_precision:
        return "float32"
    return "mixed_float16" if device_kind == "GPU" else "mixed_bfloat16"


def configure_devices(cpu_replicas: int = 1) -> int:
    """Turns on GPU memory growth and splits the CPU into ``cpu_replicas`` logical devices.

    Memory growth stops TensorFlow from reserving all GPU memory up front, which is what lets
    the input pipeline and other processes share the device.

    Args:
      cpu_replicas: logical CPU devices to create (1 leaves the CPU as it is).

    Returns:
      The number of physical GPUs.

    Raises:
      RuntimeError: if TensorFlow's runtime is already initialised, so devices can no longer
        be configured.
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    try:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if cpu_replicas > 1:
            cpu = tf.config.list_physical_devices("CPU")[0]
            current = tf.config.get_logical_device_configuration(cpu)
            if current is None or len(current) != cpu_replicas:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(cpu_replicas)]
                )
    except RuntimeError as e:
        raise RuntimeError(
            f"devices must be configured before TensorFlow initialises (cpu_replicas="
            f"{cpu_replicas}); call configure_devices first in a fresh process: {e}"
        ) from e
    return len(gpus)


def _expand_tasks_per_node(spec: str) -> list[int]:
    """Expands Slurm's ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"`` -> ``[2, 2, 2, 1]``)."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE has a bad entry {part!r} in {spec!r}")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def slurm_cluster_resolver(
    *, port_base: int, num_gpus: int, environ: Mapping[str, str] | None = None
) -> tf.distribute.cluster_resolver.SlurmClusterResolver:
    """A ``SlurmClusterResolver`` that also works on CPU-only nodes.

    TensorFlow's resolver asks ``nvidia-smi`` for GPUs and, with none, divides by zero when it
    allocates GPUs to tasks. On CPU nodes we give it one notional device per task and tell it
    not to touch ``CUDA_VISIBLE_DEVICES``.

    Args:
      port_base: port of the first task on each node.
      num_gpus: GPUs on this node (0 for CPU-only).
      environ: the environment to read ``SLURM_STEP_TASKS_PER_NODE`` from.

    Raises:
      ValueError: if the Slurm variables are malformed.
    """
    import tensorflow as tf

    environ = os.environ if environ is None else environ
    if num_gpus > 0:
        return tf.distribute.cluster_resolver.SlurmClusterResolver(port_base=port_base)
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    max_tasks = max(_expand_tasks_per_node(spec))
    return tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=max_tasks, gpus_per_task=1, auto_set_gpu=False
    )


def worker_layout(cluster_spec: Mapping[str, Any], task_type: str, task_id: int) -> tuple[int, int]:
    """``(num_workers, worker_index)`` for a task, numbering the chief (if any) first.

    This is the numbering ``MultiWorkerMirroredStrategy`` uses for replica ids, so the input
    shard of worker ``i`` lines up with its replicas.

    Raises:
      ValueError: if the task is not a chief or worker of the cluster.
    """
    chiefs = len(cluster_spec.get("chief", []))
    workers = len(cluster_spec.get("worker", []))
    if task_type == "chief" and 0 <= task_id < chiefs:
        return chiefs + workers, 0
    if task_type == "worker" and 0 <= task_id < workers:
        return chiefs + workers, chiefs + task_id
    raise ValueError(
        f"task {task_type!r}:{task_id} is not a chief or worker of cluster {dict(cluster_spec)!r}"
    )


def create_distribution(
    name: str,
    *,
    cpu_replicas: int = 1,
    tpu: str | None = None,
    slurm_port_base: int = 8888,
    environ: Mapping[str, str] | None = None,
) -> Distribution:
    """Configures devices and builds the strategy.

    Args:
      name: one of ``STRATEGIES`` (``auto`` resolves from the environment).
      cpu_replicas: logical CPU devices for ``mirrored`` on a machine without GPU.
      tpu: TPU name or address ("" for the local TPU VM); implies ``tpu`` under ``auto``.
      slurm_port_base: first port of the workers when the cluster comes from Slurm.
      environ: the environment to resolve from (defaults to ``os.environ``).

    Returns:
      The ``Distribution``.

    Raises:
      ValueError: ``Unrecognized Distribution Strategy: 'x'``, or an impossible combination.
      RuntimeError: if devices can no longer be configured in this process.
    """
    if name not in STRATEGIES:
        raise ValueError(
            f"Unrecognized Distribution Strategy: {name!r} (expected one of {STRATEGIES})"
        )
    import tensorflow as tf

    environ = os.environ if environ is None else environ
    num_gpus = len(tf.config.list_physical_devices("GPU"))
    resolved, source = resolve_strategy_name(
        name, environ=environ, num_gpus=num_gpus, cpu_replicas=cpu_replicas, tpu=tpu
    )
    if resolved != "tpu":
        configure_devices(cpu_replicas)
    if resolved == "one_device":
        device, kind = ("/gpu:0", "GPU") if num_gpus else ("/cpu:0", "CPU")
        return Distribution(tf.distribute.OneDeviceStrategy(device), resolved, kind)
    if resolved == "mirrored":
        return _mirrored(num_gpus, cpu_replicas)
    if resolved == "multi_worker":
        return _multi_worker(
            num_gpus, source=source, slurm_port_base=slurm_port_base, environ=environ
        )
    return _tpu(tpu if tpu is not None else environ.get("TPU_NAME", ""))


def _mirrored(num_gpus: int, cpu_replicas: int) -> Distribution:
    """``MirroredStrategy`` over every GPU, or over ``cpu_replicas`` logical CPUs."""
    import tensorflow as tf

    if num_gpus:
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(cpu_replicas)])
    return Distribution(
        strategy,
        "mirrored",
        "GPU" if num_gpus else "CPU",
        local_replicas=int(strategy.num_replicas_in_sync),
    )


def _multi_worker(
    num_gpus: int, *, source: str | None, slurm_port_base: int, environ: Mapping[str, str]
) -> Distribution:
    """``MultiWorkerMirroredStrategy`` over the cluster of ``TF_CONFIG`` or Slurm.

    Raises:
      ValueError: if this task is not a chief or worker of its cluster, or Slurm's variables
        are malformed.
    """
    import tensorflow as tf

    if source == "slurm":
        resolver = slurm_cluster_resolver(
            port_base=slurm_port_base, num_gpus=num_gpus, environ=environ
        )
    else:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec().as_dict()
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
        ),
    )
    if cluster:
        num_workers, worker_index = worker_layout(
            cluster, resolver.task_type, int(resolver.task_id)
        )
    else:
        _log.warning("multi_worker without TF_CONFIG or Slurm: running as a single worker")
        num_workers, worker_index = 1, 0
    local = int(strategy.num_replicas_in_sync) // num_workers
    return Distribution(
        strategy,
        "multi_worker",
        "GPU" if num_gpus else "CPU",
        num_workers=num_workers,
        worker_index=worker_index,
        is_chief=worker_index == 0,
        local_replicas=local,
        cluster_source=source or "tf_config",
    )


def _tpu(tpu: str) -> Distribution:
    """``TPUStrategy``: one host feeds all its cores; the cluster comes from the TPU resolver."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    return Distribution(
        strategy,
        "tpu",
        "TPU",
        local_replicas=int(strategy.num_replicas_in_sync),
        cluster_source="tpu",
    )
