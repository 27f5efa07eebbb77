"""The client side of the tf.data service: run an input pipeline on its workers, not here.

The trainer keeps only a thin client: the dataset graph built by the reader is serialised,
shipped to the service's worker processes, run there, and its batches are streamed back over
gRPC. Two ways of reading are offered, both with dynamic sharding
(``ShardingPolicy.DYNAMIC``, tf.data's "distributed_epoch"), in which the dispatcher hands out
the pipeline's source elements (our shard files) one at a time to whichever worker asks next:

* **training** joins a *shared job*. Every trainer process that builds the same pipeline
  derives the same job name, so all of them consume one stream and split the work between
  them instead of each reading a full copy. Dynamic sharding, rather than "parallel_epochs",
  is used because:

  - an epoch keeps its meaning: each shard is read once per epoch across all workers and
    trainers, whatever the number of workers;
  - a seeded pipeline does not turn into duplicates: with "parallel_epochs" every worker
    runs the whole dataset, and with the same seed they would all emit the same order;
  - load balances itself: a slow, new or restarted worker just takes fewer shards.

  The cost is tf.data's at-most-once guarantee on failure: if a worker dies, the rest of the
  shard it was reading is skipped for that epoch. For training that is the right trade.

* **eval** uses an anonymous job per iteration unless a ``job_name`` is given, so each pass
  over the eval set is a fresh job and yields every example exactly once to this consumer.
  With a shared ``job_name`` several consumers split one pass between them.

The pipeline must be made of graph ops only (no ``py_function``): the workers rebuild it
from its serialised graph, in other processes, and must be able to read its files.

Iterators over a service dataset cannot be saved with ``tf.train.Checkpoint``
(tf.data raises "SaveInternal is not yet supported"). A restarted trainer that builds the
same pipeline derives the same job name and so rejoins its job where the job stands, as
long as the dispatcher has not collected it (``--job_gc_timeout_ms`` on the dispatcher).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # TensorFlow is imported lazily: importing it costs seconds.
    import tensorflow as tf

__all__ = [
    "BULK_READ_EXPERIMENTS",
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "DEFAULT_EXAMPLES_PER_MESSAGE",
    "ServiceAddress",
    "ServiceConfig",
    "DistributeOptions",
    "distribute_dataset",
    "enable_bulk_reads",
    "split_message",
    "training_job_name",
]

#: Element compression on the wire. "AUTO" leaves it to tf.data (Snappy in TF 2.21), "SNAPPY"
#: forces Snappy, "NONE" sends raw tensors. Decoded uint8 image batches barely shrink with
#: Snappy, and "NONE" cost the trainer about a third of the CPU of "AUTO" in
#: benchmarks/bench_service.py; "AUTO" pays off only where the network is the bottleneck.
COMPRESSIONS = ("AUTO", "SNAPPY", "NONE")
DEFAULT_COMPRESSION = "AUTO"
#: Examples per message from the service's workers in training (``ServiceConfig``).
DEFAULT_EXAMPLES_PER_MESSAGE = 128

#: gRPC experiments, in the gRPC TensorFlow 2.21 bundles and off by default, with which a
#: socket's reader sleeps until a whole frame has arrived (``SO_RCVLOWAT`` set from the frame
#: header) instead of waking for every few kilobytes of it. See ``enable_bulk_reads``.
BULK_READ_EXPERIMENTS = ("tcp_rcv_lowat", "tcp_frame_size_tuning")

_LOG = logging.getLogger(__name__)
_PROTOCOL = "grpc"
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.\-]*[A-Za-z0-9])?)$")
# Names of traced functions, and of nodes and arguments derived from them, carry process-wide
# counters ("__inference_Dataset_map_decode_372", "map_while_cond_197___redundant_placeholder0").
# Values (file names, seeds, shapes) sit on value lines of the text format and are kept.
_NAME_COUNTER_RE = re.compile(r"_\d+")
_DEVICE_LINE_RE = re.compile(r"^\s*device:")
_VALUE_LINE_RE = re.compile(r"^\s*(string_val|tensor_content|s|i|int64_val|int_val|size):")
_JOB_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/\-]{0,127}$")


@dataclasses.dataclass(frozen=True)
class ServiceAddress:
    """Where a tf.data service dispatcher listens.

    Attributes:
      host: a host name, IPv4 address, or bracketed IPv6 address.
      port: TCP port, 1 to 65535.
    """

    host: str
    port: int

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not _HOST_RE.match(self.host):
            raise ValueError(
                f"dispatcher host must be a host name, IPv4 address or [IPv6] address, got {self.host!r}"
            )
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 < self.port < 65536
        ):
            raise ValueError(f"dispatcher port must be an int in 1..65535, got {self.port!r}")

    @classmethod
    def parse(cls, text: str) -> ServiceAddress:
        """Parses ``"grpc://host:port"``, or ``"host:port"`` with gRPC implied.

        Raises:
          ValueError: naming ``text`` if it is not of that form.
        """
        if not isinstance(text, str):
            raise ValueError(
                f"tf.data service address must be a str like 'grpc://host:port', got {text!r}"
            )
        rest = text.strip()
        if "://" in rest:
            scheme, rest = rest.split("://", 1)
            if scheme != _PROTOCOL:
                raise ValueError(
                    f"tf.data service address {text!r} has protocol {scheme!r}; expected "
                    f"'{_PROTOCOL}://host:port'"
                )
        host, sep, port = rest.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(
                f"tf.data service address {text!r} is not of the form 'grpc://host:port'"
            )
        try:
            return cls(host=host, port=int(port))
        except ValueError as e:
            raise ValueError(f"tf.data service address {text!r}: {e}") from e

    @property
    def host_port(self) -> str:
        """``"host:port"``, as a worker's ``--dispatcher`` flag takes it."""
        return f"{self.host}:{self.port}"

    @property
    def target(self) -> str:
        """``"grpc://host:port"``, as a client's ``service`` argument takes it."""
        return f"{_PROTOCOL}://{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.target


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Where and how a reader runs on the tf.data service: ``make_dataset(service=...)``.

    Attributes:
      service: the dispatcher, ``"grpc://host:port"`` (``"host:port"`` is also accepted).
      job_name: name of the job to share. For training, None derives one from the pipeline's
        graph (``training_job_name``), so trainers building the same pipeline share a job;
        give an explicit name, unique per run, when several runs with the same data, batch
        and seed use one service at the same time. For eval, None gives each iteration its
        own anonymous job.
      compression: one of ``COMPRESSIONS`` (any case), or None for no compression, which is
        how tf.data itself spells it.
      max_outstanding_requests: bounds the messages in flight to this consumer, and so its
        memory (message bytes times this number). None lets tf.data choose.
      examples_per_message: in training, the workers send at least this many examples per
        message, as whole per-replica batches that the trainer splits apart without copying
        (``split_message``). Each message costs the trainer a fixed amount of CPU
        whatever its size, which dominated at small per-replica batches: at a batch of 32,
        one batch per message cost the trainer about three times the CPU per example of 128.
        1 sends each batch by itself. Eval passes always send one batch per message.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    service: str
    job_name: str | None = None
    compression: str | None = DEFAULT_COMPRESSION
    max_outstanding_requests: int | None = None
    examples_per_message: int = DEFAULT_EXAMPLES_PER_MESSAGE

    def __post_init__(self) -> None:
        address = ServiceAddress.parse(self.service)
        object.__setattr__(self, "service", address.target)
        if self.job_name is not None and (
            not isinstance(self.job_name, str) or not _JOB_NAME_RE.match(self.job_name)
        ):
            raise ValueError(
                "job_name must be None or 1-128 characters of letters, digits and ._:/- "
                f"starting with a letter or digit, got {self.job_name!r}"
            )
        compression = "NONE" if self.compression is None else self.compression
        if not isinstance(compression, str) or compression.upper() not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        object.__setattr__(self, "compression", compression.upper())
        limit = self.max_outstanding_requests
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise ValueError(f"max_outstanding_requests must be None or an int >= 1, got {limit!r}")
        per_message = self.examples_per_message
        if not isinstance(per_message, int) or isinstance(per_message, bool) or per_message < 1:
            raise ValueError(f"examples_per_message must be an int >= 1, got {per_message!r}")

    def batches_per_message(self, batch_size: int, training: bool) -> int:
        """Per-replica batches of ``batch_size`` in one message: enough whole batches for
        ``examples_per_message`` examples in training, one in eval."""
        if not training or batch_size >= self.examples_per_message:
            return 1
        return -(-self.examples_per_message // batch_size)


@dataclasses.dataclass(frozen=True)
class DistributeOptions(ServiceConfig):
    """How a dataset is read through the tf.data service: a ``ServiceConfig`` and the kind of
    job.

    Attributes:
      training: True for a shared, endless-if-repeated training job; False for eval passes.
      The others: see ``ServiceConfig``.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    training: bool = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.training, bool):
            raise ValueError(f"training must be a bool, got {self.training!r}")


def enable_bulk_reads(environ: MutableMapping[str, str] | None = None) -> bool:
    """Makes this process's gRPC read large messages in few wakeups (``BULK_READ_EXPERIMENTS``).

    A trainer fed by the service receives each batch as one message of many megabytes (19 MB
    for 128 images of 224x224 RGB). By default gRPC's reader wakes up and reads as each few
    kilobytes arrive; with these experiments it sleeps until the frame is in. In
    ``benchmarks/bench_service.py`` that halved the receive calls, cut the trainer's context
    switches by a quarter and its input CPU by about a quarter.

    gRPC reads ``GRPC_EXPERIMENTS`` once, when the process first uses gRPC (a tf.data service
    client, or the server of a multi-worker strategy), so call this before either; importing
    TensorFlow first is fine.

    Args:
      environ: the environment to change (``os.environ`` by default).

    Returns:
      True if the experiments are requested; False, with nothing changed, if
      ``GRPC_EXPERIMENTS`` already turns one of them off (``-tcp_rcv_lowat``): that choice
      is kept. Other experiments already listed are kept too.
    """
    env = os.environ if environ is None else environ
    listed = [e.strip() for e in env.get("GRPC_EXPERIMENTS", "").split(",") if e.strip()]
    if any(f"-{name}" in listed for name in BULK_READ_EXPERIMENTS):
        return False
    missing = [name for name in BULK_READ_EXPERIMENTS if name not in listed]
    env["GRPC_EXPERIMENTS"] = ",".join(listed + missing)
    return True


def training_job_name(dataset: tf.data.Dataset) -> str:
    """The shared job name that trainers building ``dataset`` agree on without talking.

    It is a digest of the pipeline's serialised graph: its files, batch size, seeds and
    functions. ``Dataset.fingerprint()`` cannot serve: it differs between processes for the
    same pipeline. Names of functions, nodes and arguments, and dataset op metadata, carry
    per-process counters (``..._lambda_134``, ``BatchDatasetV2:7``), and functions carry the
    device and session config of the process that traced them (``/job:worker/task:1``), so
    those are normalised away, and the function library is sorted, before hashing. Trainer processes that build the
    same pipeline with the same seed therefore share one job, and a run with another seed or
    other data gets another.
    """
    import tensorflow as tf
    from google.protobuf import text_format

    serialized = dataset._as_serialized_graph(  # the graph the service itself ships
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN,
        strip_device_assignment=True,
    )
    graph = tf.compat.v1.GraphDef.FromString(serialized.numpy())
    # Each dataset op's "metadata" names it with another process-wide counter, and a call of
    # a function compiled with XLA carries the session config of the process ("config_proto",
    # which names its task).
    for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
        for process_attr in ("metadata", "config_proto"):
            if process_attr in node.attr:
                del node.attr[process_attr]
    texts = [
        "\n".join(
            _without_counters(line)
            for line in text_format.MessageToString(m).splitlines()
            # Functions keep the placement of the process that traced them ("task:1"); the
            # service strips it too.
            if not _DEVICE_LINE_RE.match(line)
        )
        for m in [*graph.library.function, *graph.node]
    ]
    digest = hashlib.sha256("\n".join(sorted(texts)).encode("utf-8")).hexdigest()
    return f"train-{digest[:16]}"


def _without_counters(line: str) -> str:
    return line if _VALUE_LINE_RE.match(line) else _NAME_COUNTER_RE.sub("_N", line)


def distribute_dataset(
    dataset: tf.data.Dataset,
    *,
    service: str,
    training: bool,
    job_name: str | None = None,
    compression: str | None = DEFAULT_COMPRESSION,
    max_outstanding_requests: int | None = None,
) -> tf.data.Dataset:
    """Moves ``dataset`` onto the tf.data service: its elements are produced by the workers.

    Args:
      dataset: the whole input pipeline, built from graph ops only, ending in the batches the
        trainer consumes. Its files must be readable from the worker processes.
      service: the dispatcher, ``"grpc://host:port"`` (``"host:port"`` is also accepted).
      training: see ``DistributeOptions``.
      job_name: see ``DistributeOptions``.
      compression: see ``DistributeOptions``.
      max_outstanding_requests: see ``DistributeOptions``.

    Returns:
      A dataset with the same element spec whose elements come from the service. Creating an
      iterator contacts the dispatcher; it waits for the dispatcher if it is not up yet.

    Raises:
      TypeError: if ``dataset`` is not a ``tf.data.Dataset``.
      ValueError: naming the bad value, if another argument is invalid.
    """
    import tensorflow as tf

    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset, got {type(dataset).__name__}")
    options = DistributeOptions(
        service=service,
        training=training,
        job_name=job_name,
        compression=compression,
        max_outstanding_requests=max_outstanding_requests,
    )
    name = options.job_name
    if name is None and options.training:
        name = training_job_name(dataset)
    _LOG.info(
        "reading %s input through tf.data service %s: job %s, dynamic sharding, compression %s",
        "training" if options.training else "eval",
        options.service,
        name or "(anonymous, one per iteration)",
        options.compression,
    )
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
            service=options.service,
            job_name=name,
            max_outstanding_requests=options.max_outstanding_requests,
            # tf.data spells "no compression" as None.
            compression=None if options.compression == "NONE" else options.compression,
        )
    )


def split_message(parts: tuple[tf.Tensor, ...], batch_size: int) -> tf.data.Dataset:
    """The whole batches of ``batch_size`` in one message of several batches (see
    ``ServiceConfig.examples_per_message``): use it as ``messages.flat_map(lambda *parts:
    split_message(parts, batch_size))``. The examples of a short last message beyond its whole
    batches are dropped.

    Nothing is copied: a full message's slice is the identity, the reshape a view, and
    ``from_tensor_slices`` hands out aligned slices of its tensors as they are (TensorFlow
    copies a slice only when it is not aligned: a few label bytes at most).
    """
    import tensorflow as tf

    whole = tf.shape(parts[0])[0] // batch_size * batch_size
    return tf.data.Dataset.from_tensor_slices(
        tuple(tf.reshape(part[:whole], [-1, batch_size, *part.shape[1:]]) for part in parts)
    )
