"""tf.data service: ``python -m tfrecord_io.service dispatcher|worker``, and the client API.

The processes are described in ``tfrecord_io.service_cli``; the client side
(``distribute_dataset``, which ``make_dataset(..., service=...)`` calls) lives in
``tfrecord_io.service_client`` and is re-exported here. Keeping this module only an entry
point means ``python -m`` runs it without a second copy of the library.
"""

from tfrecord_io.service_client import (
    BULK_READ_EXPERIMENTS,
    COMPRESSIONS,
    DEFAULT_COMPRESSION,
    DistributeOptions,
    ServiceAddress,
    distribute_dataset,
    enable_bulk_reads,
    training_job_name,
)

__all__ = [
    "BULK_READ_EXPERIMENTS",
    "COMPRESSIONS",
    "DEFAULT_COMPRESSION",
    "DistributeOptions",
    "ServiceAddress",
    "distribute_dataset",
    "enable_bulk_reads",
    "training_job_name",
]

if __name__ == "__main__":
    import logging
    import os

    from tfrecord_io.service_cli import main

    status = main()
    # The server has stopped and the log is flushed. Tearing TensorFlow down in Python takes
    # seconds and has nothing left to save (the dispatcher journals every change as it
    # happens), so the process leaves at once.
    logging.shutdown()
    os._exit(status)
