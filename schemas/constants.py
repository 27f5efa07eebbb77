"""The facts writer, reader and tools share, each defined once.

Everything that must agree between the pipeline that writes a dataset, the reader and trainer
that read it, and the tools that check it lives here, at the bottom floor (no imports of the
project, no TensorFlow): the stored encodings and crops, the shard-count limit of the file
names, the split names, and the tool's name and version.
"""

from __future__ import annotations

import importlib.metadata

__all__ = [
    "CROP_PADDING",
    "CROPS",
    "ENCODINGS",
    "FIVE_DIGIT_SHARDS",
    "MAX_SHARDS",
    "MEAN_RGB",
    "STDDEV_RGB",
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

#: Per-channel ImageNet statistics in 0-255 units: the readers' float32 output (TensorFlow's and
#: torch's) is (pixel - mean) / stddev.
MEAN_RGB = (123.675, 116.28, 103.53)
STDDEV_RGB = (58.395, 57.12, 57.375)
#: The readers' eval centre crop keeps image_size / (image_size + CROP_PADDING) of the shorter
#: side, the convention of the reference ImageNet pipelines (224 of 256).
CROP_PADDING = 32

#: How images are stored in ``image/encoded``.
ENCODINGS = ("jpeg", "png", "raw")
#: How the pipeline crops after resizing the shorter side: keep the aspect ratio, or square.
CROPS = ("none", "center")
#: The most shards a split may have whose names carry five-digit numbers
#: (``train-00003-of-00016.tfrecord``); past it both numbers widen together
#: (``train-000003-of-100000.tfrecord``), as tfds names them.
FIVE_DIGIT_SHARDS = 99_999
#: The most shards a split may have: nine-digit names. A billion images of 100 KB in shards of
#: 256 MB are about 400,000 shards; this leaves room for shards of a few kilobytes.
MAX_SHARDS = 999_999_999
#: The splits the pipeline writes.
TRAIN = "train"
VALIDATION = "validation"
SPLITS = (TRAIN, VALIDATION)
