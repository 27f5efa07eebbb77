"""``python -m tfrecord_io.verify DATASET [--deep] [--json] [--no-progress]``.

Checks every shard of a dataset against its ``dataset.json``; see ``tfrecord_io.verification``.
The entry point lives apart from the library so that running it as ``-m`` does not re-import
a module the package has already loaded.
"""

import sys

from tfrecord_io.verification import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
