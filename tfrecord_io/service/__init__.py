"""The tf.data service: dispatcher and worker processes (``tfrecord_io.service.server``, run by
``python -m tfrecord_io.service``), and the client side that trainers use
(``tfrecord_io.service.client``). The client's names are also ``tfrecord_io``'s."""

from tfrecord_io.service.client import (
    BULK_READ_EXPERIMENTS,
    COMPRESSIONS,
    DistributeOptions,
    ServiceAddress,
    ServiceConfig,
    distribute_dataset,
    enable_bulk_reads,
    training_job_name,
)

__all__ = [
    "BULK_READ_EXPERIMENTS",
    "COMPRESSIONS",
    "DistributeOptions",
    "ServiceAddress",
    "ServiceConfig",
    "distribute_dataset",
    "enable_bulk_reads",
    "training_job_name",
]
