"""Vectorised parsing and per-example decoding of batches of serialised examples.

Everything here is a pure TensorFlow graph function (no ``py_function``), so a pipeline built
from it can be checkpointed, and randomness comes only from per-example seeds passed in, so
augmentation replays exactly after a restore.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from schemas import KEY_ENCODED, KEY_LABEL, KEY_SHA256, feature_spec
from schemas.constants import CROP_PADDING, MEAN_RGB, STDDEV_RGB
from schemas.constants import ENCODINGS as STORED_ENCODINGS

__all__ = [
    "CROP_PADDING",
    "DCT_METHODS",
    "ENCODINGS",
    "MEAN_RGB",
    "OUTPUTS",
    "SHARD_DAMAGE_KEY",
    "STDDEV_RGB",
    "DecodeConfig",
    "decode_batch",
    "decode_one_jpeg",
    "flip_images",
    "flip_mask",
    "normalize",
    "parse_batch",
    "random_window",
    "shard_damage_record",
]

# "auto" (foreign shards): JPEG takes the decode-and-crop fast path, anything else
# tf.io.decode_image reads (PNG, GIF, BMP) takes the generic path.
ENCODINGS = (*STORED_ENCODINGS, "auto")
OUTPUTS = ("uint8", "float32")
DCT_METHODS = ("", "INTEGER_FAST", "INTEGER_ACCURATE")

_FULL_IMAGE_BOX = (((0.0, 0.0, 1.0, 1.0),),)  # [1, 1, 4]: the whole image

# The reader places a record with this key after each shard's last committed record, where
# only a shard that read short reaches it (see ``shard_reading.ShardReader``). Its value names the
# shard; examples never carry the key, and parse it as "".
SHARD_DAMAGE_KEY = "tfrecord_io/damaged_shard"


# The checks of the values the reader's ReadConfig and this module's DecodeConfig share, written
# once: each raises ValueError naming the bad value.


def check_image_size(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"image_size must be a positive int, got {value!r}")


def check_output(value: Any) -> None:
    if value not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {value!r}")


def check_label_offset(value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"label_offset must be an int >= 0, got {value!r}")


def check_jpeg_dct_method(value: Any) -> None:
    if value not in DCT_METHODS:
        raise ValueError(f"jpeg_dct_method must be one of {DCT_METHODS}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """How a batch of serialised examples becomes a batch of images.

    Attributes:
      image_size: output side length; images are ``image_size`` square.
      training: random crops and flips if True, a center crop otherwise.
      encoding: stored encoding, one of ``ENCODINGS``.
      stored_size: side length of stored RAW images (required for ``raw``).
      output: ``uint8`` (normalise on the accelerator) or normalised ``float32``.
      with_keys: also return ``image/key/sha256``.
      strict: parse with the project's strict schema (manifest sources) or the lenient one.
      label_offset: subtracted from stored labels (1 for TensorFlow's ImageNet converters,
        whose labels are 1-based with 0 as background).
      num_classes: if known, labels are checked to be in ``[0, num_classes)``.
      area_range, aspect_ratio_range: the random-resized-crop distribution for training.
      jpeg_dct_method: the libjpeg IDCT; ``INTEGER_FAST`` trades a little accuracy for speed.
    """

    image_size: int
    training: bool
    encoding: str
    stored_size: int | None = None
    output: str = "uint8"
    with_keys: bool = False
    strict: bool = True
    label_offset: int = 0
    num_classes: int | None = None
    area_range: tuple[float, float] = (0.08, 1.0)
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    jpeg_dct_method: str = "INTEGER_FAST"

    def __post_init__(self) -> None:
        check_image_size(self.image_size)
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.encoding == "raw" and not (
            isinstance(self.stored_size, int) and self.stored_size > 0
        ):
            raise ValueError(
                f"RAW decoding needs the stored image size, got stored_size={self.stored_size!r}"
            )
        check_output(self.output)
        check_label_offset(self.label_offset)
        if self.num_classes is not None and self.num_classes <= 0:
            raise ValueError(f"num_classes must be positive or None, got {self.num_classes!r}")
        lo, hi = self.area_range
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"area_range must satisfy 0 < lo <= hi <= 1, got {self.area_range!r}")
        lo, hi = self.aspect_ratio_range
        if not 0.0 < lo <= hi:
            raise ValueError(
                f"aspect_ratio_range must satisfy 0 < lo <= hi, got {self.aspect_ratio_range!r}"
            )
        check_jpeg_dct_method(self.jpeg_dct_method)


def parse_batch(serialized: tf.Tensor, config: DecodeConfig) -> dict[str, tf.Tensor]:
    """Parses a ``[B]`` batch of serialised examples in one vectorised ``parse_example``.

    Only the features the reader needs are parsed: the encoded image, the label and, with keys,
    the SHA-256 key.
    """
    spec = feature_spec(strict=config.strict)
    keys = [KEY_ENCODED, KEY_LABEL] + ([KEY_SHA256] if config.with_keys else [])
    wanted = {k: spec[k] for k in keys}
    wanted[SHARD_DAMAGE_KEY] = tf.io.FixedLenFeature([], tf.string, default_value="")
    return tf.io.parse_example(serialized, wanted)


def shard_damage_record(message: str) -> bytes:
    """A serialised record that parses like an example and makes ``decode_batch`` fail.

    ``decode_batch`` raises ``InvalidArgumentError`` with ``message`` when a batch holds one.
    """
    feature = {
        KEY_ENCODED: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b""])),
        KEY_LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
        KEY_SHA256: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b""])),
        SHARD_DAMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[message.encode()])),
    }
    example = tf.train.Example(features=tf.train.Features(feature=feature))
    # Deterministic: the bytes are part of the pipeline graph, whose digest names a shared
    # tf.data service job, so every trainer process must build the same ones.
    return example.SerializeToString(deterministic=True)


def _checked_for_damage(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """``features`` without the damage key, after checking no record of the batch carries it."""
    features = dict(features)
    damage = features.pop(SHARD_DAMAGE_KEY, None)
    if damage is None:
        return features
    damaged = tf.not_equal(damage, "")
    check = tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(damaged)), [tf.boolean_mask(damage, damaged)], summarize=4
    )
    with tf.control_dependencies([check]):
        return {key: tf.identity(value) for key, value in features.items()}


def normalize(images: tf.Tensor) -> tf.Tensor:
    """uint8 RGB ``[..., W, 3]`` -> float32 ``(pixel - MEAN_RGB) / STDDEV_RGB``.

    The per-channel constants are tiled along whole rows: broadcasting a 3-vector over the
    innermost axis takes Eigen's slow path (about 4x the host CPU of a row-wide multiply-add).
    """
    width = images.shape[-2]
    if width is None:
        mean = tf.constant(MEAN_RGB, tf.float32)
        return (tf.cast(images, tf.float32) - mean) / tf.constant(STDDEV_RGB, tf.float32)
    scale = np.tile(1.0 / np.asarray(STDDEV_RGB, np.float32), width)
    offset = np.tile(-np.asarray(MEAN_RGB, np.float32) / np.asarray(STDDEV_RGB, np.float32), width)
    rows = tf.reshape(tf.cast(images, tf.float32), [-1, width * 3])
    return tf.reshape(rows * tf.constant(scale) + tf.constant(offset), tf.shape(images))


def _element_seed(seed: tf.Tensor, salt: int) -> tf.Tensor:
    """A ``[2]`` stateless seed for one example and one purpose."""
    return tf.stack([seed, tf.constant(salt, tf.int64)])


def _rounded_uint8(resized: tf.Tensor) -> tf.Tensor:
    """A bilinear resize of uint8 pixels back to uint8, rounded.

    No clipping is needed (``saturate_cast`` clipped twice more, about 7 % of a JPEG
    example's host CPU): each output is ``a + (b - a) * t`` of two values in [0, 255] with
    t in [0, 1], applied twice, and IEEE rounding is monotonic, so it never leaves [0, 255].
    """
    return tf.cast(tf.round(resized), tf.uint8)


def _resize_to(image: tf.Tensor, size: int) -> tf.Tensor:
    """Resizes an HWC uint8 image to ``size`` square, skipping the work when it already is."""

    def _resize() -> tf.Tensor:
        resized = tf.image.resize(image, [size, size], method="bilinear", antialias=False)
        return _rounded_uint8(resized)

    shape = tf.shape(image)
    same = tf.logical_and(tf.equal(shape[0], size), tf.equal(shape[1], size))
    out = tf.cond(same, lambda: image, _resize)
    return tf.ensure_shape(out, [size, size, 3])


def random_window(shape: tf.Tensor, seed: tf.Tensor, config: DecodeConfig) -> tf.Tensor:
    """An Inception-style random crop window ``[y, x, h, w]`` for an image of ``shape``."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant(_FULL_IMAGE_BOX, tf.float32),
        seed=_element_seed(seed, 1),
        min_object_covered=0.1,
        aspect_ratio_range=config.aspect_ratio_range,
        area_range=config.area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def _center_window(shape: tf.Tensor, image_size: int) -> tf.Tensor:
    """The eval center-crop window ``[y, x, h, w]``: a square of the shorter side's fraction."""
    height, width = shape[0], shape[1]
    fraction = image_size / (image_size + CROP_PADDING)
    side = tf.cast(tf.round(fraction * tf.cast(tf.minimum(height, width), tf.float32)), tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def decode_one_jpeg(encoded: tf.Tensor, seed: tf.Tensor | None, config: DecodeConfig) -> tf.Tensor:
    """One JPEG decoded straight into its crop (random in training with ``seed``, centred
    otherwise) and resized to ``config.image_size``: ``[size, size, 3]`` uint8."""
    shape = tf.io.extract_jpeg_shape(encoded)
    if config.training:
        window = random_window(shape, seed, config)
    else:
        window = _center_window(shape, config.image_size)
    image = tf.io.decode_and_crop_jpeg(
        encoded, window, channels=3, dct_method=config.jpeg_dct_method
    )
    return _resize_to(image, config.image_size)


def _decode_any(encoded: tf.Tensor, seed: tf.Tensor | None, config: DecodeConfig) -> tf.Tensor:
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    shape = tf.shape(image)
    if config.training:
        window = random_window(shape, seed, config)
    else:
        window = _center_window(shape, config.image_size)
    image = tf.slice(image, [window[0], window[1], 0], [window[2], window[3], 3])
    return _resize_to(image, config.image_size)


def _decode_one(encoded: tf.Tensor, seed: tf.Tensor | None, config: DecodeConfig) -> tf.Tensor:
    if config.encoding == "jpeg":
        return decode_one_jpeg(encoded, seed, config)
    if config.encoding == "png":
        return _decode_any(encoded, seed, config)
    return tf.cond(
        tf.io.is_jpeg(encoded),
        lambda: decode_one_jpeg(encoded, seed, config),
        lambda: _decode_any(encoded, seed, config),
    )


def _decode_raw(encoded: tf.Tensor, seeds: tf.Tensor | None, config: DecodeConfig) -> tf.Tensor:
    """Decodes a batch of RAW images (vectorised) and, in training, crops and flips them."""
    stored, size = config.stored_size, config.image_size
    assert stored is not None  # checked in DecodeConfig
    images = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), [-1, stored, stored, 3])
    if size > stored:
        resized = tf.image.resize(images, [size, size], method="bilinear", antialias=False)
        images = _rounded_uint8(resized)
    elif size < stored and not config.training:
        offset = (stored - size) // 2
        images = images[:, offset : offset + size, offset : offset + size, :]
    elif size < stored:
        images = tf.map_fn(
            lambda args: tf.image.stateless_random_crop(
                args[0], [size, size, 3], seed=_element_seed(args[1], 2)
            ),
            (images, seeds),
            fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8),
        )
    return flip_images(images, flip_mask(seeds)) if config.training else images


def flip_mask(seeds: tf.Tensor) -> tf.Tensor:
    """Which examples of a batch are flipped left-right: ``[B]`` bool, one bit of each seed.

    The bit is independent of the bits the example's crop hashes, so each example is flipped
    with probability 1/2, independently of its crop and of the other examples.
    """
    return tf.equal(tf.bitwise.bitwise_and(tf.bitwise.right_shift(seeds, 11), 1), 1)


@tf.function(jit_compile=True, autograph=False)
def flip_images(images: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
    """Flips left-right the images of an NHWC batch where ``mask`` is True.

    Compiled with XLA, the reversal and the select are one vectorised pass over the batch. On
    RAW batches that costs about a third of TensorFlow's own kernels: its reversal of 3-byte
    pixels copies one pixel at a time (about 17 times a plain copy), and putting the flipped
    images back into the batch copies it again.
    """
    return tf.where(mask[:, None, None, None], tf.reverse(images, axis=[2]), images)


def _checked_labels(labels: tf.Tensor, config: DecodeConfig) -> tf.Tensor:
    if config.label_offset:
        labels = labels - config.label_offset
    hint = (
        f" (stored label minus label_offset={config.label_offset})"
        if config.label_offset
        else " (TensorFlow's ImageNet converters store 1-based labels: pass label_offset=1)"
    )
    checks = [tf.debugging.assert_non_negative(labels, message="negative class label" + hint)]
    if config.num_classes is not None:
        checks.append(
            tf.debugging.assert_less(
                labels,
                tf.constant(config.num_classes, tf.int64),
                message=f"class label >= num_classes={config.num_classes}" + hint,
            )
        )
    with tf.control_dependencies(checks):
        return tf.cast(tf.identity(labels), tf.int32)


def decode_batch(
    features: dict[str, tf.Tensor], seeds: tf.Tensor | None, config: DecodeConfig
) -> tuple[Any, ...]:
    """Decodes a parsed batch into ``(images, labels)`` or ``(images, labels, keys)``.

    Args:
      features: the output of ``parse_batch``.
      seeds: ``[B]`` int64 per-example seeds (training), or None (eval).
      config: the decode configuration.

    Returns:
      images ``[B, S, S, 3]`` (uint8 or normalised float32), labels ``[B]`` int32, and, with
      keys, ``[B]`` string SHA-256 keys.

    Raises:
      tf.errors.InvalidArgumentError: (when run) a record of the batch is the reader's marker
        of a shard that read short; the error names the shard.
    """
    features = _checked_for_damage(features)
    encoded = features[KEY_ENCODED]
    if config.training and seeds is None:
        raise ValueError("training decode needs per-example seeds")
    if config.encoding == "raw":
        images = _decode_raw(encoded, seeds, config)
    else:
        size = config.image_size
        if config.training:
            images = tf.map_fn(
                lambda args: _decode_one(args[0], args[1], config),
                (encoded, seeds),
                fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8),
            )
            images = flip_images(images, flip_mask(seeds))
        else:
            images = tf.map_fn(
                lambda e: _decode_one(e, None, config),
                encoded,
                fn_output_signature=tf.TensorSpec([size, size, 3], tf.uint8),
            )
    if config.output == "float32":
        images = normalize(images)
    labels = _checked_labels(features[KEY_LABEL], config)
    if config.with_keys:
        return images, labels, features[KEY_SHA256]
    return images, labels
