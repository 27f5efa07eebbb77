"""``dataset_info.json`` and ``features.json``: what ``tfds.builder_from_directory(DST)`` needs.

Written as JSON by us, from the manifest alone, so that the pipeline's workers and launcher never
import TensorFlow or tfds. The JSON is what ``tfds.folder_dataset.write_metadata`` produces for
the same features (tensorflow-datasets 4.9), and ``tests/test_tfds_metadata.py`` reads a dataset
with the real ``tfds.builder_from_directory`` to keep it so.

The features describe our example layout (``schemas.image_example``): ``image/encoded`` as an
``Image`` (JPEG or PNG; RAW pixels as a ``string`` tensor), ``image/class/label`` as a
``ClassLabel`` over ``label_names`` (its names in ``image.class.label.labels.txt``), the other
strings as ``Text`` and the integers as ``int64`` tensors. Splits carry their shard lengths and a
file template tfds accepts for our shard names (``{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from schemas.framing import FRAME_OVERHEAD
from schemas.image_example import (
    KEY_CHANNELS,
    KEY_ENCODED,
    KEY_FILENAME,
    KEY_FORMAT,
    KEY_HEIGHT,
    KEY_LABEL,
    KEY_SHA256,
    KEY_TEXT,
    KEY_WIDTH,
)
from schemas.manifest import Manifest

__all__ = [
    "DATASET_INFO_NAME",
    "FEATURES_NAME",
    "OUR_KEYS",
    "LABELS_FILE",
    "filepath_template",
    "tfds_metadata_files",
]

DATASET_INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
# tfds names a ClassLabel's names file after the feature's path, "/" replaced by ".".
LABELS_FILE = KEY_LABEL.replace("/", ".") + ".labels.txt"
OUR_KEYS = (
    KEY_ENCODED,
    KEY_FORMAT,
    KEY_HEIGHT,
    KEY_WIDTH,
    KEY_CHANNELS,
    KEY_LABEL,
    KEY_TEXT,
    KEY_FILENAME,
    KEY_SHA256,
)
_TEXT_KEYS = (KEY_FORMAT, KEY_TEXT, KEY_FILENAME, KEY_SHA256)
_INT_KEYS = (KEY_HEIGHT, KEY_WIDTH, KEY_CHANNELS, KEY_LABEL)
_PY = "tensorflow_datasets.core.features."
_TEMPLATES = (
    (re.compile(r"^(?P<split>[a-z][a-z0-9_]*)-\d{5,}-of-\d{5,}\.tfrecord$"),
     "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"),
    (re.compile(r"^(?P<split>[a-z][a-z0-9_]*)-\d{5,}-of-\d{5,}$"), "{SPLIT}-{SHARD_X_OF_Y}"),
)  # fmt: skip


def filepath_template(split: str, shard_files: Sequence[str]) -> str | None:
    """The tfds file template that names these shards of ``split``, or None if none does.

    ``train-00003-of-00016.tfrecord`` (ours) and ``train-00003-of-01024`` (TensorFlow's
    converters) are both names tfds can read; the shards must also sit in the dataset directory.
    """
    for pattern, template in _TEMPLATES:
        if shard_files and all(
            "/" not in f and (m := pattern.match(f)) and m["split"] == split for f in shard_files
        ):
            return template
    return None


def _tensor(dtype: str) -> dict[str, Any]:
    return {
        "pythonClassName": _PY + "tensor_feature.Tensor",
        "tensor": {"dtype": dtype, "encoding": "none", "shape": {}},
    }


def _feature(key: str, manifest: Manifest, class_label: bool) -> dict[str, Any]:
    if key == KEY_ENCODED:
        if manifest.image.encoding == "raw":
            return _tensor("string")  # RAW pixels are not an encoded image tfds can decode
        return {
            "image": {
                "dtype": "uint8",
                "encodingFormat": manifest.image.encoding,
                "shape": {"dimensions": ["-1", "-1", "3"]},
            },
            "pythonClassName": _PY + "image_feature.Image",
        }
    if key == KEY_LABEL and class_label:
        return {
            "classLabel": {"numClasses": str(len(manifest.label_names))},
            "pythonClassName": _PY + "class_label_feature.ClassLabel",
        }
    if key in _TEXT_KEYS:
        return {"pythonClassName": _PY + "text_feature.Text", "text": {}}
    if key in _INT_KEYS:
        return _tensor("int64")
    raise ValueError(f"no tfds feature for key {key!r}; known keys are {OUR_KEYS}")


def _dumps(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def tfds_metadata_files(
    manifest: Manifest,
    *,
    name: str = "images",
    keys: Sequence[str] = OUR_KEYS,
    class_label: bool = True,
    description: str = "Images written as TFRecord shards by tfrecord-service.",
) -> Mapping[str, str]:
    """The tfds metadata files for a dataset, by file name.

    Args:
      manifest: the dataset's manifest.
      name: the dataset name tfds reports.
      keys: the example keys to describe (every key our layout has by default; fewer for
        adopted shards that lack some).
      class_label: describe ``image/class/label`` as a ``ClassLabel`` over the label names
        (False: a plain ``int64``, for adopted shards whose stored labels are offset).

    Returns:
      ``{"dataset_info.json": ..., "features.json": ..., LABELS_FILE: ...}`` (the last only
      with ``class_label``).

    Raises:
      ValueError: if a split's shard names fit no template tfds reads, or the dataset's
        shards are not next to its metadata (``shard_root``), naming the split.
    """
    if manifest.shard_root is not None:
        raise ValueError(
            "tfds reads shards only from the directory that holds its metadata, and these are "
            f"in {manifest.shard_root}"
        )
    splits = []
    for split_name, split in sorted(manifest.splits.items()):
        if not split.shards:
            continue
        names = [s.file for s in split.shards]
        template = filepath_template(split_name, names)
        if template is None:
            raise ValueError(
                f"split {split_name!r}: shard names like {names[0]!r} fit no file template "
                "tfds reads ('<split>-NNNNN-of-NNNNN[.tfrecord]')"
            )
        splits.append(
            {
                "filepathTemplate": template,
                "name": split_name,
                "numBytes": str(
                    sum(s.num_bytes - FRAME_OVERHEAD * s.num_examples for s in split.shards)
                ),
                "shardLengths": [str(s.num_examples) for s in split.shards],
            }
        )
    info = {
        "description": description,
        "fileFormat": "tfrecord",
        "name": name,
        "splits": splits,
        "version": "1.0.0",
    }
    features = {
        "featuresDict": {
            "features": {key: _feature(key, manifest, class_label) for key in sorted(keys)}
        },
        "pythonClassName": _PY + "features_dict.FeaturesDict",
    }
    files = {DATASET_INFO_NAME: _dumps(info), FEATURES_NAME: _dumps(features)}
    if class_label and KEY_LABEL in keys:
        if any("\n" in n or "\r" in n for n in manifest.label_names):
            raise ValueError(
                f"tfds keeps class names one per line; these hold a line break: "
                f"{[n for n in manifest.label_names if chr(10) in n or chr(13) in n]}"
            )
        files[LABELS_FILE] = "".join(f"{n}\n" for n in manifest.label_names)
    return files
