"""``python -m tfrecord_io.service dispatcher|worker`` (``tfrecord-service``): one tf.data
service process.

The processes and their flags are in ``tfrecord_io.service.server``; the client side
(``distribute_dataset``, which ``make_dataset(..., service=...)`` calls) is
``tfrecord_io.service.client``. Like every command module, this one is imported by nothing else
of the project, so ``python -m`` runs it once.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from tfrecord_io.service import server as service_cli

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Runs a dispatcher or worker until SIGTERM/SIGINT, then ends the process with 143/130.

    Bad flags raise ``SystemExit(2)`` as usual. Once a server has run, the process exits with
    its status at once (``os._exit``): the server has stopped, its one line (what was kept, how to
    continue) is logged and the log is flushed, and tearing TensorFlow down in Python takes
    seconds and has nothing left to save (the dispatcher journals every change as it happens).

    Returns:
      Never returns normally after serving; the return type is that of every command's ``main``.
    """
    status = service_cli.main(argv)
    logging.shutdown()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
