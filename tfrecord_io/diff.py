"""``python -m tfrecord_io.diff``, kept working for existing scripts: the command is
``python -m dataset_tools.diff``."""

import sys

from dataset_tools.diff import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
