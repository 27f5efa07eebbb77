"""The image example layout shared by the writer and the reader.

Keys follow TensorFlow's ImageNet convention (``image/encoded``, ``image/class/label``…) so
that existing tools read our shards and our reader reads theirs. The layout is versioned:
``SCHEMA_VERSION`` is recorded in every ``dataset.json`` and bumped on any change that an
older reader could misread.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from schemas import example_proto

if TYPE_CHECKING:  # TensorFlow is imported lazily: importing it costs seconds.
    import tensorflow as tf

__all__ = [
    "SCHEMA_VERSION",
    "FORMATS",
    "KEY_ENCODED",
    "KEY_FORMAT",
    "KEY_HEIGHT",
    "KEY_WIDTH",
    "KEY_CHANNELS",
    "KEY_LABEL",
    "KEY_TEXT",
    "KEY_FILENAME",
    "KEY_SHA256",
    "ImageRecord",
    "build_example",
    "serialize_record",
    "feature_spec",
    "validate_example",
    "record_from_example",
]

SCHEMA_VERSION = 1

KEY_ENCODED = "image/encoded"
KEY_FORMAT = "image/format"
KEY_HEIGHT = "image/height"
KEY_WIDTH = "image/width"
KEY_CHANNELS = "image/channels"
KEY_LABEL = "image/class/label"
KEY_TEXT = "image/class/text"
KEY_FILENAME = "image/filename"
KEY_SHA256 = "image/key/sha256"

FORMATS = ("JPEG", "PNG", "RAW")
_CHANNELS = (1, 3)
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

_BYTES_KEYS = (KEY_ENCODED, KEY_FORMAT, KEY_TEXT, KEY_FILENAME, KEY_SHA256)
_INT_KEYS = (KEY_HEIGHT, KEY_WIDTH, KEY_CHANNELS, KEY_LABEL)


@dataclasses.dataclass(frozen=True)
class ImageRecord:
    """One example, as the writer produces it and the reader can recover it.

    Attributes:
      encoded: the stored image: JPEG or PNG bytes, or uint8 HWC pixels for RAW.
      format: one of ``FORMATS``.
      height, width, channels: the stored image's dimensions.
      label: 0-based index into the dataset's label names.
      text: the class name.
      filename: the source URI.
      sha256: hex SHA-256 of the source file's bytes (the example's key).

    Raises:
      ValueError: on construction, if any field breaks the schema.
    """

    encoded: bytes
    format: str
    height: int
    width: int
    channels: int
    label: int
    text: str
    filename: str
    sha256: str

    def __post_init__(self) -> None:
        if not isinstance(self.encoded, bytes) or not self.encoded:
            raise ValueError(
                f"{KEY_ENCODED} must be non-empty bytes, got {type(self.encoded).__name__} of length {len(self.encoded) if hasattr(self.encoded, '__len__') else '?'}"
            )
        if self.format not in FORMATS:
            raise ValueError(f"{KEY_FORMAT} must be one of {FORMATS}, got {self.format!r}")
        for key, value in ((KEY_HEIGHT, self.height), (KEY_WIDTH, self.width)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{key} must be a positive int, got {value!r}")
        if self.channels not in _CHANNELS:
            raise ValueError(f"{KEY_CHANNELS} must be one of {_CHANNELS}, got {self.channels!r}")
        if not isinstance(self.label, int) or isinstance(self.label, bool) or self.label < 0:
            raise ValueError(f"{KEY_LABEL} must be an int >= 0, got {self.label!r}")
        if not isinstance(self.text, str) or not self.text:
            raise ValueError(f"{KEY_TEXT} must be a non-empty str, got {self.text!r}")
        if not isinstance(self.filename, str) or not self.filename:
            raise ValueError(f"{KEY_FILENAME} must be a non-empty str, got {self.filename!r}")
        if not isinstance(self.sha256, str) or not _SHA256_RE.match(self.sha256):
            raise ValueError(f"{KEY_SHA256} must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.format == "RAW":
            expected = self.height * self.width * self.channels
            if len(self.encoded) != expected:
                raise ValueError(
                    f"RAW {KEY_ENCODED} must hold height*width*channels = "
                    f"{self.height}*{self.width}*{self.channels} = {expected} bytes, got {len(self.encoded)}"
                )


def _fill(example: Any, record: ImageRecord) -> Any:
    # ``example`` is a tf.train.Example or schemas.example_proto.Example: the same message.
    feature = example.features.feature
    for key, value in (
        (KEY_ENCODED, record.encoded),
        (KEY_FORMAT, record.format.encode("ascii")),
        (KEY_TEXT, record.text.encode("utf-8")),
        (KEY_FILENAME, record.filename.encode("utf-8")),
        (KEY_SHA256, record.sha256.encode("ascii")),
    ):
        feature[key].bytes_list.value.append(value)
    for key, number in (
        (KEY_HEIGHT, record.height),
        (KEY_WIDTH, record.width),
        (KEY_CHANNELS, record.channels),
        (KEY_LABEL, record.label),
    ):
        feature[key].int64_list.value.append(number)
    return example


def build_example(record: ImageRecord) -> tf.train.Example:
    """Builds the ``tf.train.Example`` for a record (already validated by construction)."""
    import tensorflow as tf

    return _fill(tf.train.Example(), record)


def serialize_record(record: ImageRecord) -> bytes:
    """Serialises a record to the bytes of one TFRecord entry, without importing TensorFlow.

    The bytes are those of ``build_example(record).SerializeToString(deterministic=True)``.
    Serialisation is deterministic: the same record always gives the same bytes, which is what
    makes regenerated shards byte-identical.
    """
    return _fill(example_proto.Example(), record).SerializeToString(deterministic=True)


def feature_spec(*, strict: bool = True) -> dict[str, Any]:
    """The ``tf.io.parse_example`` spec for our layout.

    Args:
      strict: if True every key is required, as in shards this project writes. If False only
        ``image/encoded`` and ``image/class/label`` are required and the rest default to empty
        or zero, so that shards written by other tools (TensorFlow's ImageNet converters) parse.
    """
    import tensorflow as tf

    spec: dict[str, Any] = {}
    for key in _BYTES_KEYS:
        required = strict or key == KEY_ENCODED
        spec[key] = tf.io.FixedLenFeature([], tf.string, default_value=None if required else "")
    for key in _INT_KEYS:
        required = strict or key == KEY_LABEL
        spec[key] = tf.io.FixedLenFeature([], tf.int64, default_value=None if required else 0)
    return spec


def _single_value(features: Any, key: str, kind: str) -> Any:
    """The one value of feature ``key``, a ``kind`` (``"bytes"`` or ``"int64"``) list.

    Raises:
      ValueError: if the feature is missing, of another kind, or holds other than one value.
    """
    if key not in features or features[key].WhichOneof("kind") != f"{kind}_list":
        raise ValueError(f"missing {kind} feature {key!r}; expected keys {_BYTES_KEYS + _INT_KEYS}")
    items = getattr(features[key], f"{kind}_list").value
    if len(items) != 1:
        raise ValueError(f"feature {key!r} must hold exactly 1 value, got {len(items)}")
    return int(items[0]) if kind == "int64" else items[0]


def record_from_example(example: tf.train.Example | bytes) -> ImageRecord:
    """Recovers and validates the record held by an example of our layout.

    Args:
      example: a ``tf.train.Example`` (or ``schemas.example_proto.Example``) or its serialised
        bytes, which are parsed without TensorFlow.

    Returns:
      The validated ``ImageRecord``.

    Raises:
      ValueError: if a key is missing, has the wrong type or length, or a value breaks the schema.
    """
    if isinstance(example, bytes):
        try:
            example = example_proto.Example.FromString(example)
        except Exception as e:  # protobuf raises DecodeError, which is not a ValueError
            raise ValueError(f"not a serialised tf.train.Example: {e}") from e
    features = example.features.feature
    values = {key: _single_value(features, key, "bytes") for key in _BYTES_KEYS}
    values.update((key, _single_value(features, key, "int64")) for key in _INT_KEYS)
    try:
        return ImageRecord(
            encoded=values[KEY_ENCODED],
            format=values[KEY_FORMAT].decode("ascii"),
            height=values[KEY_HEIGHT],
            width=values[KEY_WIDTH],
            channels=values[KEY_CHANNELS],
            label=values[KEY_LABEL],
            text=values[KEY_TEXT].decode("utf-8"),
            filename=values[KEY_FILENAME].decode("utf-8"),
            sha256=values[KEY_SHA256].decode("ascii"),
        )
    except UnicodeDecodeError as e:
        raise ValueError(f"a text feature is not valid UTF-8/ASCII: {e}") from e


def validate_example(example: tf.train.Example | bytes) -> None:
    """Raises ``ValueError`` naming the problem if ``example`` breaks the schema."""
    record_from_example(example)
