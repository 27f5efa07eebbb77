"""The facts writer, reader and tools share, each defined once.

Everything that must agree between the pipeline that writes a dataset, the reader and trainer
that read it, and the tools that check it lives here, at the bottom floor (no imports of the
project, no TensorFlow): the stored encodings and crops, the shard-count limit of the file
names, the split names, and the tool's name and version.
"""

from __future__ import annotations

import importlib.metadata

__all__ = [
    "CROPS",
    "ENCODINGS",
    "MAX_SHARDS",
    "SPLITS",
    "TOOL_NAME",
    "TOOL_VERSION",
    "TRAIN",
    "VALIDATION",
]

TOOL_NAME = "tfrecord-service"


def _installed_version() -> str:
    # The one version literal is pyproject.toml's; a checkout used without installing the
    # package (PYTHONPATH only) has no metadata and says so.
    try:
        return importlib.metadata.version(TOOL_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


#: The version recorded in every ``dataset.json`` (``tool_version``), from package metadata.
TOOL_VERSION = _installed_version()

#: How images are stored in ``image/encoded``.
ENCODINGS = ("jpeg", "png", "raw")
#: How the pipeline crops after resizing the shorter side: keep the aspect ratio, or square.
CROPS = ("none", "center")
#: Shard file names carry five-digit counts (``train-00003-of-00016.tfrecord``).
MAX_SHARDS = 99999
#: The splits the pipeline writes.
TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
