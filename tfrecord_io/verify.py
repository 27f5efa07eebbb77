"""``python -m tfrecord_io.verify``, kept working for existing scripts: the command is
``python -m dataset_tools.verify``."""

import sys

from dataset_tools.verify.__main__ import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
