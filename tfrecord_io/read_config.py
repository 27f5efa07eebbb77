"""The reader's configuration: ``ReadConfig``, the documented options of ``make_dataset``.

Modelled on tensorflow_datasets' ``ReadConfig``: ``make_dataset`` keeps the few arguments almost
every caller sets as keywords (``global_batch_size``, ``training``, ``image_size``, ``seed``,
``input_context``) and takes everything else as one validated object::

    make_dataset(DATA, "train", global_batch_size=256, seed=0,
                 read_config=ReadConfig(with_keys=True, cycle_length=32),
                 service=ServiceConfig("grpc://dispatcher:5050", compression="NONE"))

Each option is checked once, when its config object is built, with an error naming the value.
A new reading option is a new ``ReadConfig`` field (with its check in ``__post_init__``) and
nothing else: ``make_dataset``'s signature does not grow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tfrecord_io.decode import (
    check_image_size,
    check_jpeg_dct_method,
    check_label_offset,
    check_output,
)
from tfrecord_io.delivery import DeliveredSet

__all__ = [
    "DEFAULT_READ_BUFFER_BYTES",
    "EPOCH_ORDERS",
    "SHARDING_POLICIES",
    "ReadConfig",
    "ReaderConfig",
]

# Object stores serve large sequential reads far better than many small ones; 8 MiB per open
# file is what the reference ImageNet input pipelines use for GCS.
DEFAULT_READ_BUFFER_BYTES = 8 * 1024 * 1024
SHARDING_POLICIES = ("files", "records", "auto")
EPOCH_ORDERS = ("buffer", "permutation")


def _positive(name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(
            f"{name} must be a positive int{' or None' if optional else ''}, got {value!r}"
        )


def _flag(name: str, value: Any, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, bool):
        raise ValueError(
            f"{name} must be True or False{' or None' if optional else ''}, got {value!r}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadConfig:
    """How ``make_dataset`` reads, beyond its keyword arguments. Every field has a default.

    Attributes:
      with_keys: also yield each example's ``image/key/sha256`` (empty for foreign shards
        without it).
      deterministic: keep element order under parallelism; None (default) means True when a
        ``seed`` is set or when evaluating.
      cache: None, ``"memory"``, or a file path prefix. The cache holds serialised records and
        sits before shuffling and augmentation, so every epoch still gets fresh crops; with a
        cache the file order is shuffled once, and the record buffer does the mixing.
      output: ``"uint8"`` (normalise on the accelerator) or ``"float32"`` normalised with
        ``decode.MEAN_RGB`` / ``decode.STDDEV_RGB``.
      skip_corrupt: log and count damaged shards (their remaining records are skipped) instead
        of failing. Pass ``make_dataset(corruption_counter=...)`` to read the counts.
      label_offset: subtracted from stored labels. TensorFlow's ImageNet converters write
        1-based labels (0 = background): pass 1 for their shards.
      num_epochs: training passes; None repeats forever (training) or means 1 (eval).
      shuffle_buffer: records in the shuffle buffer; default ~128 MiB worth, at most 10,000
        and at most the pipeline's share of the split. Iterator checkpoints hold the buffer.
      cycle_length: files read concurrently; default min(16, files).
      read_buffer_bytes: read buffer per open file (8 MiB suits object storage).
      sharding: ``"files"`` (error if fewer files than input pipelines), ``"records"`` (every
        pipeline reads every file and keeps every n-th record), or ``"auto"`` (files when
        possible, else records with a warning).
      ram_budget_bytes: tf.data autotune RAM budget (default: TensorFlow's, half the RAM).
      threads: size of a private thread pool for this pipeline (default: the shared pool).
      jpeg_dct_method: libjpeg IDCT method; ``""`` is the library default.
      exclude: exact epochs (``tfrecord_io.epochs``): a ``DeliveredSet`` of the examples
        already trained on. The dataset yields the rest of its epoch, then full epochs (each
        example exactly once per epoch, over all input pipelines, whatever their number), and
        each element also ends with ``positions`` ``[B]`` int64, ``epoch * N + index``, for
        ``DeliveryTracker.add``. ``DeliveredSet.empty(N)`` starts at epoch 0. Needs
        ``dataset.json`` and ``training=True`` without ``cache``; ``sharding`` does not apply
        (pipelines split each epoch by example, evenly), and ``num_epochs`` counts from
        epoch 0.
      symbolic_checkpoint: iterator checkpoints hold positions, not buffered data: tf.data's
        symbolic checkpointing, which recomputes on restore what the parallel decode and the
        prefetch held (decoded batches, several times the encoded records' size). What is
        left is the record shuffle buffer, of encoded records (at most the pipeline's share of
        the split). Needs ``exclude`` and local shards, and not ``skip_corrupt``: it reads
        without ``ignore_errors``, which tf.data cannot checkpoint symbolically, so a record
        whose CRC fails raises TensorFlow's ``DataLossError`` (``corrupted record at N``)
        without the shard's name; a shard that is missing or of another size still fails
        naming it.
      epoch_order: how exact epochs are mixed. ``"buffer"`` (default): records read from the
        shards and mixed in a shuffle buffer, which an iterator checkpoint holds (with
        ``symbolic_checkpoint``, the buffer and positions). ``"permutation"``
        (``tfrecord_io.permuted_epochs``): the split's records are read once, CRC-checked,
        and held in the input graph; each epoch is a keyed permutation of example indices
        computed element by element, so a checkpoint holds positions only (kilobytes) and
        every pipeline's examples come in a uniformly random order. Costs the split's size in
        memory per input pipeline; implies ``symbolic_checkpoint``; needs ``exclude``, not
        ``skip_corrupt`` (a damaged shard fails when the pipeline is built, naming it), and
        no tf.data service. ``shuffle_buffer`` and ``cycle_length`` do not apply.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid.
    """

    with_keys: bool = False
    deterministic: bool | None = None
    cache: str | None = None
    output: str = "uint8"
    skip_corrupt: bool = False
    label_offset: int = 0
    num_epochs: int | None = None
    shuffle_buffer: int | None = None
    cycle_length: int | None = None
    read_buffer_bytes: int = DEFAULT_READ_BUFFER_BYTES
    sharding: str = "files"
    ram_budget_bytes: int | None = None
    threads: int | None = None
    jpeg_dct_method: str = "INTEGER_FAST"
    exclude: DeliveredSet | None = None
    symbolic_checkpoint: bool = False
    epoch_order: str = "buffer"

    def __post_init__(self) -> None:
        _flag("with_keys", self.with_keys)
        _flag("deterministic", self.deterministic, optional=True)
        _flag("skip_corrupt", self.skip_corrupt)
        _flag("symbolic_checkpoint", self.symbolic_checkpoint)
        _positive("num_epochs", self.num_epochs, optional=True)
        _positive("shuffle_buffer", self.shuffle_buffer, optional=True)
        _positive("cycle_length", self.cycle_length, optional=True)
        _positive("read_buffer_bytes", self.read_buffer_bytes)
        _positive("ram_budget_bytes", self.ram_budget_bytes, optional=True)
        _positive("threads", self.threads, optional=True)
        check_output(self.output)
        if self.cache is not None and (not isinstance(self.cache, str) or not self.cache):
            raise ValueError(
                f"cache must be None, 'memory' or a file path prefix, got {self.cache!r}"
            )
        if self.sharding not in SHARDING_POLICIES:
            raise ValueError(f"sharding must be one of {SHARDING_POLICIES}, got {self.sharding!r}")
        check_label_offset(self.label_offset)
        check_jpeg_dct_method(self.jpeg_dct_method)
        if self.exclude is not None:
            if not isinstance(self.exclude, DeliveredSet):
                raise ValueError(
                    f"exclude must be a tfrecord_io.DeliveredSet or None, got "
                    f"{type(self.exclude).__name__}"
                )
            if self.cache is not None:
                raise ValueError(
                    f"exclude (exact epochs) reads without a record cache; got cache={self.cache!r}"
                )
        if self.epoch_order not in EPOCH_ORDERS:
            raise ValueError(f"epoch_order must be one of {EPOCH_ORDERS}, got {self.epoch_order!r}")
        if self.symbolic_checkpoint:
            _check_symbolic(self, "symbolic_checkpoint=True")
        if self.epoch_order == "permutation":
            _check_symbolic(self, "epoch_order='permutation'")

    @property
    def checkpoints_positions(self) -> bool:
        """Whether iterator checkpoints are symbolic (``symbolic_checkpoint`` or
        ``epoch_order="permutation"``)."""
        return self.symbolic_checkpoint or self.epoch_order == "permutation"


def _check_symbolic(config: ReadConfig, option: str) -> None:
    """Checks ``config`` can be checkpointed symbolically, as ``option`` asks.

    Raises:
      ValueError: without ``exclude`` (the plain pipeline's repeated, reshuffled file order
        does not restore symbolically), or with ``skip_corrupt`` (skipping damage needs
        ``ignore_errors``, which cannot).
    """
    if config.exclude is None:
        raise ValueError(f"{option} needs exact epochs (exclude=DeliveredSet...); got exclude=None")
    if config.skip_corrupt:
        raise ValueError(
            f"{option} reads without ignore_errors, so it cannot skip damage; got "
            "skip_corrupt=True (pass symbolic_checkpoint=False and epoch_order='buffer' to "
            "skip damaged shards)"
        )


_READ_FIELDS = frozenset(f.name for f in dataclasses.fields(ReadConfig))


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """Everything one ``make_dataset`` call reads with: its keyword arguments and its
    ``ReadConfig``. ``make_dataset`` builds it; the ``ReadConfig`` fields are also attributes
    of it (``config.cache`` is ``config.read.cache``).

    Attributes:
      global_batch_size, training, image_size, seed: as given to ``make_dataset``.
      read: the ``ReadConfig``.

    Raises:
      ValueError: naming the bad value, if any attribute is invalid or the two disagree.
    """

    global_batch_size: int
    training: bool = True
    image_size: int = 224
    seed: int | None = None
    read: ReadConfig = dataclasses.field(default_factory=ReadConfig)

    def __post_init__(self) -> None:
        _positive("global_batch_size", self.global_batch_size)
        _flag("training", self.training)
        check_image_size(self.image_size)
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0
        ):
            raise ValueError(f"seed must be an int >= 0 or None, got {self.seed!r}")
        if not isinstance(self.read, ReadConfig):
            raise ValueError(
                f"read_config must be a tfrecord_io.ReadConfig, got {type(self.read).__name__}"
            )
        if self.read.exclude is not None and not self.training:
            raise ValueError("exclude (exact epochs) reads training epochs; got training=False")

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not attributes of this class: the read options.
        if name in _READ_FIELDS:
            return getattr(self.read, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def is_deterministic(self) -> bool:
        """Explicit ``deterministic``, else deterministic when seeded or evaluating."""
        if self.read.deterministic is not None:
            return self.read.deterministic
        return self.seed is not None or not self.training
