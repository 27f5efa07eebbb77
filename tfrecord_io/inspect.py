"""``python -m tfrecord_io.inspect``, kept working for existing scripts: the command is
``python -m dataset_tools.inspect``."""

import sys

from dataset_tools.inspect.__main__ import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
