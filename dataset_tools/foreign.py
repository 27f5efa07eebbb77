"""Examples written by other tools (TensorFlow's ImageNet converters), read without TensorFlow.

``adopt`` scans such shards once to describe them; ``verify`` reads them again to check an
adopted dataset (``dataset.json`` says so under ``options["adopted"]``) or a bare glob of shards.
Both read each example through ``parse_foreign``, so they agree on its key and label.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from schemas import (
    KEY_ENCODED,
    KEY_FILENAME,
    KEY_FORMAT,
    KEY_HEIGHT,
    KEY_LABEL,
    KEY_SHA256,
    KEY_TEXT,
    KEY_WIDTH,
    Manifest,
    example_proto,
)

__all__ = ["ADOPTED_OPTION", "ForeignRecord", "adopted_label_offset", "parse_foreign"]

# The manifest option that marks an adopted dataset and records how it was adopted.
ADOPTED_OPTION = "adopted"
_KEY_SYNSET = "image/class/synset"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_MAGIC = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"))


@dataclasses.dataclass(frozen=True)
class ForeignRecord:
    """What adoption (and verification of an adopted dataset) reads from one example.

    ``label`` is already shifted by the label offset; None fields were absent.
    """

    key: str
    label: int | None
    text: str | None
    synset: str | None
    uri: str | None
    height: int | None
    width: int | None
    format: str | None
    keys: frozenset[str]


def _one(feature: Any, key: str, kind: str) -> Any:
    if key not in feature or feature[key].WhichOneof("kind") != kind:
        return None
    values = getattr(feature[key], kind).value
    return values[0] if len(values) == 1 else None


def _text(feature: Any, key: str) -> str | None:
    value = _one(feature, key, "bytes_list")
    if value is None:
        return None
    try:
        return value.decode("utf-8") or None
    except UnicodeDecodeError:
        return None


def parse_foreign(payload: bytes, *, label_offset: int = 0, where: str = "record") -> ForeignRecord:
    """Reads a foreign example's fields (TensorFlow's ImageNet keys), without TensorFlow.

    Raises:
      ValueError: naming ``where`` if the payload is not an Example with ``image/encoded``, or
        its label minus ``label_offset`` is negative.
    """
    try:
        example = example_proto.Example.FromString(payload)
    except Exception as e:  # protobuf's DecodeError is not a ValueError
        raise ValueError(f"{where}: not a serialised tf.train.Example ({e})") from e
    feature = example.features.feature
    encoded = _one(feature, KEY_ENCODED, "bytes_list")
    if not encoded:
        raise ValueError(f"{where}: has no {KEY_ENCODED!r} bytes (keys: {sorted(feature)})")
    stored_key = _text(feature, KEY_SHA256)
    key = stored_key if stored_key and _SHA256_RE.match(stored_key) else None
    label = _one(feature, KEY_LABEL, "int64_list")
    if label is not None:
        label = int(label) - label_offset
        if label < 0:
            raise ValueError(
                f"{where}: label {label + label_offset} minus --label_offset {label_offset} is "
                "negative; pass the offset the shards' labels start at"
            )
    fmt = _text(feature, KEY_FORMAT)
    if fmt is None:
        fmt = next((name for magic, name in _MAGIC if encoded.startswith(magic)), None)
    height = _one(feature, KEY_HEIGHT, "int64_list")
    width = _one(feature, KEY_WIDTH, "int64_list")
    return ForeignRecord(
        key=key or hashlib.sha256(encoded).hexdigest(),
        label=label,
        text=_text(feature, KEY_TEXT),
        synset=_text(feature, _KEY_SYNSET),
        uri=_text(feature, KEY_FILENAME),
        height=int(height) if height is not None else None,
        width=int(width) if width is not None else None,
        format=fmt.upper() if fmt else None,
        keys=frozenset(feature),
    )


def adopted_label_offset(manifest: Manifest) -> int | None:
    """The label offset of an adopted dataset, or None for one written by the pipeline."""
    adopted = manifest.options.get(ADOPTED_OPTION)
    return int(adopted.get("label_offset", 0)) if isinstance(adopted, dict) else None
