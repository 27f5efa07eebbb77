"""``python -m tfrecord_io.adopt``, kept working for existing scripts: the command is
``python -m dataset_tools.adopt``."""

import sys

from dataset_tools.adopt import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
