"""The serving preprocessing: encoded image bytes to the images the trained model was evaluated on.

A model trained by the trainer saw images the pipeline had prepared (decoded, made RGB, resized
to ``dataset.json``'s ``image_size``, encoded as stored) and the reader had then decoded for
evaluation (a centre crop resized to the trainer's ``--image_size``). ``preprocess`` repeats
both in one TensorFlow graph, so an exported model (``trainer.saved_model``) applied to a source
image sees what the validation split's copy of it gave the model during training, pixel for
pixel (``tests/test_export_predict.py``):

1. decode: JPEG at the DCT scale the pipeline's decoder (Pillow's ``draft``) picks for the
   stored side, with libjpeg's accurate IDCT as Pillow's; other formats with
   ``tf.io.decode_image`` (PNG, GIF, BMP, WebP);
2. RGB: grey replicated, alpha composited over the dataset's ``--background`` (Pillow's
   ``alpha_composite`` arithmetic);
3. the pipeline's resize, Pillow's bicubic resampler reproduced bit for bit (its coefficients,
   fixed-point weights and 8-bit rounding between the horizontal and vertical pass) over the
   same source box: the centre square with ``--crop center``, the centre of an over-long side
   with ``--out_of_bounds crop``, to the side ``--small_images`` gives;
4. encoded as stored (JPEG at the recorded ``--jpeg_quality`` with Pillow's settings, PNG, or
   RAW pixels);
5. the reader's evaluation decode of those bytes (``tfrecord_io.decode.decode_batch``, the
   function the trainer's evaluation runs), and for a model taking float32 the reader's
   normalisation (``MEAN_RGB``/``STDDEV_RGB``); the trainer's own reader gives uint8, which its
   models normalise themselves.

What the graph cannot do: read EXIF orientation or ICC profiles (TensorFlow's decoders ignore
both; ``trainer.prediction`` applies them with Pillow before sending the bytes), reduce a huge
non-JPEG the way the pipeline does above 16 MP before resizing (the resize of the whole image
stands in), refuse what the pipeline would have rejected (a too-small or too-long image is
resized anyway), or ``--high_bit_depth stretch`` (16-bit samples keep their high byte, as
``shift``). Shards without a pipeline manifest (foreign or adopted) skip steps 1 to 4: their
images are whatever they hold, so the bytes go straight to the reader's decode.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from schemas import KEY_ENCODED, KEY_LABEL
from schemas.constants import CROPS, ENCODINGS

if TYPE_CHECKING:
    import tensorflow as tf

    from schemas.manifest import Manifest

__all__ = ["ServingPreprocessing", "StoredImages", "preprocess"]

_SMALL_IMAGES = ("reject", "keep", "upscale")
_OUT_OF_BOUNDS = ("reject", "crop")
_JPEG_MAX_SIDE = 65_500  # libjpeg's limit on either side: the pipeline caps a stored side there
_DCT_METHODS = ("", "INTEGER_FAST", "INTEGER_ACCURATE")
# The model's input: the reader's uint8 pixels, or its normalised float32 (``output``).
_INPUT_DTYPES = ("uint8", "float32")


def _positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be an int > 0, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoredImages:
    """How the pipeline prepared a dataset's images, from its ``dataset.json``.

    Attributes:
      encoding: ``jpeg``, ``png`` or ``raw``.
      image_size: the stored shorter side (the square's side with ``crop="center"``).
      crop: ``none`` or ``center``.
      jpeg_quality: the JPEG encoder's quality.
      background: the RGB colour transparent pixels were composited over.
      small_images: ``--small_images``: ``keep`` stored a source below ``min_source_side`` at
        its own size; ``reject`` and ``upscale`` resize every image to ``image_size``.
      min_source_side: ``--min_source_side``.
      max_aspect_ratio: ``--max_aspect_ratio``.
      max_output_pixels: ``--max_output_pixels``.
      out_of_bounds: ``crop`` kept the centre of an over-long side; ``reject`` stored no such
        image (served whole).
    """

    encoding: str
    image_size: int
    crop: str
    jpeg_quality: int = 90
    background: tuple[int, int, int] = (255, 255, 255)
    small_images: str = "upscale"
    min_source_side: int = 0
    max_aspect_ratio: float = 10.0
    max_output_pixels: int = 67_108_864
    out_of_bounds: str = "reject"

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got {self.encoding!r}")
        if self.crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, got {self.crop!r}")
        if self.encoding == "raw" and self.crop != "center":
            raise ValueError("encoding 'raw' needs crop 'center' (RAW images are squares)")
        _positive_int("image_size", self.image_size)
        if not isinstance(self.jpeg_quality, int) or not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be an int in [1, 100], got {self.jpeg_quality!r}")
        if (
            not isinstance(self.background, tuple)
            or len(self.background) != 3
            or not all(isinstance(c, int) and 0 <= c <= 255 for c in self.background)
        ):
            raise ValueError(f"background must be 3 ints in [0, 255], got {self.background!r}")
        if self.small_images not in _SMALL_IMAGES:
            raise ValueError(
                f"small_images must be one of {_SMALL_IMAGES}, got {self.small_images!r}"
            )
        if not isinstance(self.min_source_side, int) or self.min_source_side < 0:
            raise ValueError(f"min_source_side must be an int >= 0, got {self.min_source_side!r}")
        if not isinstance(self.max_aspect_ratio, int | float) or self.max_aspect_ratio < 1:
            raise ValueError(f"max_aspect_ratio must be >= 1, got {self.max_aspect_ratio!r}")
        _positive_int("max_output_pixels", self.max_output_pixels)
        if self.out_of_bounds not in _OUT_OF_BOUNDS:
            raise ValueError(
                f"out_of_bounds must be one of {_OUT_OF_BOUNDS}, got {self.out_of_bounds!r}"
            )

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> StoredImages | None:
        """The preparation ``manifest`` records, or None for adopted shards (images as found).

        Options a manifest written before they existed lacks take the behaviour of that time:
        every image resized to ``image_size``, none cut.

        Raises:
          ValueError: if the manifest's options are malformed.
        """
        options = manifest.options
        if isinstance(options.get("adopted"), dict):
            return None
        image = manifest.image
        known = {
            name: options[name]
            for name in (
                "jpeg_quality",
                "small_images",
                "min_source_side",
                "max_aspect_ratio",
                "max_output_pixels",
                "out_of_bounds",
            )
            if name in options
        }
        if "max_aspect_ratio" in known:
            known["max_aspect_ratio"] = float(known["max_aspect_ratio"])
        background = options.get("background", "#ffffff")
        return cls(
            encoding=image.encoding,
            image_size=image.image_size,
            crop=image.crop,
            background=_parse_colour(background),
            **known,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"background": list(self.background)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoredImages:
        """Raises ``ValueError`` for a malformed or unknown field."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"stored images: unknown fields {unknown}; known: {sorted(fields)}")
        values = dict(data)
        if "background" in values:
            values["background"] = tuple(values["background"])
        return cls(**values)


def _parse_colour(value: object) -> tuple[int, int, int]:
    text = str(value).lstrip("#")
    if len(text) != 6:
        raise ValueError(f"background colour must look like '#ffffff', got {value!r}")
    try:
        return (int(text[0:2], 16), int(text[2:4], 16), int(text[4:6], 16))
    except ValueError as e:
        raise ValueError(f"background colour must look like '#ffffff', got {value!r}") from e


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServingPreprocessing:
    """Everything ``preprocess`` needs: the trainer's input and the dataset's preparation.

    Attributes:
      image_size: the trainer's ``--image_size``, the side of the model's square input.
      input_dtype: the model's input, ``uint8`` pixels (the trainer's reader) or ``float32``
        normalised as the reader's ``output="float32"`` does.
      stored: how the pipeline prepared the images, or None for shards it did not write.
      jpeg_dct_method: the reader's IDCT for the stored JPEGs.
    """

    image_size: int
    input_dtype: str = "uint8"
    stored: StoredImages | None = None
    jpeg_dct_method: str = "INTEGER_FAST"

    def __post_init__(self) -> None:
        _positive_int("image_size", self.image_size)
        if self.input_dtype not in _INPUT_DTYPES:
            raise ValueError(
                f"input_dtype must be one of {_INPUT_DTYPES}, got {self.input_dtype!r}"
            )
        if self.stored is not None and not isinstance(self.stored, StoredImages):
            raise TypeError(f"stored must be StoredImages or None, got {self.stored!r}")
        if self.jpeg_dct_method not in _DCT_METHODS:
            raise ValueError(
                f"jpeg_dct_method must be one of {_DCT_METHODS}, got {self.jpeg_dct_method!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "image_size": self.image_size,
            "input_dtype": self.input_dtype,
            "stored": None if self.stored is None else self.stored.to_dict(),
            "jpeg_dct_method": self.jpeg_dct_method,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingPreprocessing:
        """Raises ``ValueError`` for a malformed field."""
        stored = data.get("stored")
        return cls(
            image_size=data["image_size"],
            input_dtype=data.get("input_dtype", "uint8"),
            stored=None if stored is None else StoredImages.from_dict(stored),
            jpeg_dct_method=data.get("jpeg_dct_method", "INTEGER_FAST"),
        )


def preprocess(image_bytes: tf.Tensor, spec: ServingPreprocessing) -> tf.Tensor:
    """A ``[B]`` batch of encoded images -> the ``[B, S, S, 3]`` batch the model takes.

    A graph function of TensorFlow ops alone, so it runs wherever the SavedModel is loaded.

    Raises:
      tf.errors.InvalidArgumentError: (when run) for bytes that do not decode.
    """
    import tensorflow as tf

    from tfrecord_io.decode import DecodeConfig, decode_batch, normalize

    stored = spec.stored
    output = "float32" if spec.input_dtype == "float32" else "uint8"
    if stored is not None and stored.encoding == "raw":
        side = stored.image_size
        images = tf.map_fn(
            lambda data: _as_stored_pixels(data, stored),
            image_bytes,
            fn_output_signature=tf.TensorSpec([side, side, 3], tf.uint8),
        )
        images = _raw_eval(images, side, spec.image_size)
        return normalize(images) if output == "float32" else images
    if stored is None:
        encoded, encoding = image_bytes, "auto"
    else:
        encoding = stored.encoding
        encoded = tf.map_fn(
            lambda data: _encode_as_stored(_as_stored_pixels(data, stored), stored),
            image_bytes,
            fn_output_signature=tf.TensorSpec([], tf.string),
        )
    config = DecodeConfig(
        image_size=spec.image_size,
        training=False,
        encoding=encoding,
        stored_size=None if stored is None else stored.image_size,
        output=output,
        strict=False,
        jpeg_dct_method=spec.jpeg_dct_method,
    )
    labels = tf.zeros(tf.shape(image_bytes), tf.int64)  # the reader's decode checks labels
    images, _ = decode_batch({KEY_ENCODED: encoded, KEY_LABEL: labels}, None, config)
    return images


def _raw_eval(images: tf.Tensor, stored: int, size: int) -> tf.Tensor:
    """The reader's evaluation of RAW squares of side ``stored`` (``tfrecord_io.decode``): a
    bilinear upscale when ``size`` is larger, else the centred ``size`` square."""
    import tensorflow as tf

    if size > stored:
        resized = tf.image.resize(images, [size, size], method="bilinear", antialias=False)
        return tf.cast(tf.round(resized), tf.uint8)
    offset = (stored - size) // 2
    return images[:, offset : offset + size, offset : offset + size, :]


def _as_stored_pixels(data: tf.Tensor, stored: StoredImages) -> tf.Tensor:
    """One source image's bytes -> the ``[h, w, 3]`` uint8 pixels the pipeline stored."""
    import tensorflow as tf

    def jpeg() -> tf.Tensor:
        # The stored side first: it sets the scale the JPEG is decoded at.
        side = _stored_side(tf.io.extract_jpeg_shape(data)[:2], stored)
        return _resize_as_stored(_decode_jpeg_drafted(data, side), side, stored)

    def other() -> tf.Tensor:
        image = _decode_other(data, stored.background)
        return _resize_as_stored(image, _stored_side(tf.shape(image)[:2], stored), stored)

    return tf.cond(tf.io.is_jpeg(data), jpeg, other)


def _stored_side(source_shape: tf.Tensor, stored: StoredImages) -> tf.Tensor:
    """The stored shorter side for a source of ``[height, width]``: ``image_size``, or a small
    source's own under ``--small_images keep``."""
    import tensorflow as tf

    if stored.small_images != "keep":
        return tf.constant(stored.image_size, tf.int32)
    short = tf.reduce_min(source_shape)
    threshold = min(stored.min_source_side, stored.image_size)
    return tf.where(short >= threshold, stored.image_size, tf.minimum(short, stored.image_size))


def _decode_jpeg_drafted(data: tf.Tensor, side: tf.Tensor) -> tf.Tensor:
    """A JPEG decoded at the scale Pillow's ``draft(None, (side, side))`` picks: the largest of
    1/8, 1/4, 1/2 keeping both sides at least ``side``. The pipeline resizes from the drafted
    size, as this image's own (``decode_srgb``'s size after ``draft``)."""
    import tensorflow as tf

    scale = tf.reduce_min(tf.io.extract_jpeg_shape(data)[:2] // tf.maximum(side, 1))
    branch = tf.where(scale >= 8, 0, tf.where(scale >= 4, 1, tf.where(scale >= 2, 2, 3)))
    decoders = [
        # Pillow decodes with libjpeg's default, the accurate integer IDCT.
        lambda ratio=ratio: tf.io.decode_jpeg(
            data, channels=3, ratio=ratio, dct_method="INTEGER_ACCURATE"
        )
        for ratio in (8, 4, 2, 1)
    ]
    return tf.switch_case(branch, decoders)


def _decode_other(data: tf.Tensor, background: tuple[int, int, int]) -> tf.Tensor:
    """PNG, GIF, BMP or WebP decoded to RGB (grey replicated, alpha composited over
    ``background``)."""
    import tensorflow as tf

    image = tf.io.decode_image(data, channels=0, dtype=tf.uint8, expand_animations=False)
    channels = tf.shape(image)[2]

    def grey(values: tf.Tensor) -> tf.Tensor:
        return tf.tile(values[:, :, :1], [1, 1, 3])

    branches = [
        lambda: grey(image),
        lambda: _composite(grey(image), image[:, :, 1:2], background),
        lambda: image[:, :, :3],
        lambda: _composite(image[:, :, :3], image[:, :, 3:4], background),
    ]
    return tf.switch_case(tf.clip_by_value(channels, 1, 4) - 1, branches)


def _composite(rgb: tf.Tensor, alpha: tf.Tensor, background: tuple[int, int, int]) -> tf.Tensor:
    """``rgb`` over an opaque ``background``, rounded as Pillow's ``alpha_composite``."""
    import tensorflow as tf

    a = tf.cast(alpha, tf.float32)
    mixed = tf.cast(rgb, tf.float32) * a + tf.constant(background, tf.float32) * (255.0 - a)
    return tf.cast(tf.floor(mixed / 255.0 + 0.5), tf.uint8)


def _resize_as_stored(image: tf.Tensor, side: tf.Tensor, stored: StoredImages) -> tf.Tensor:
    """The pipeline's ``resize_and_crop`` of the decoded (perhaps drafted) ``image``: the box it
    keeps resized to the stored size, in double precision as Python computes it; the image as
    it is when it already has that size."""
    import tensorflow as tf

    shape = tf.shape(image)[:2]
    height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
    size = tf.cast(side, tf.float64)
    short, long = tf.minimum(height, width), tf.maximum(height, width)
    if stored.crop == "center":
        box = tf.stack([(height - short) / 2, (width - short) / 2, short, short])
        target = tf.stack([side, side])
    else:
        kept = _kept_long_side(short, long, size, stored)
        cut = kept < long
        wide = width > height
        box_long = tf.where(cut, kept, long)
        zero = tf.zeros([], tf.float64)
        offset = tf.where(cut, (long - kept) / 2, zero)
        box = tf.where(
            wide,
            tf.stack([zero, offset, height, box_long]),
            tf.stack([offset, zero, box_long, width]),
        )
        # Python's round, half to even, as tf.round.
        stored_long = tf.cast(tf.maximum(tf.round(box_long * size / short), 1.0), tf.int32)
        target = tf.where(wide, tf.stack([side, stored_long]), tf.stack([stored_long, side]))
    same = tf.reduce_all(tf.equal(shape, target))
    if stored.crop == "none":
        # Pillow returns a whole image of the target size as it is; a cut one is resampled.
        same = tf.logical_and(same, tf.reduce_all(tf.equal(box[2:], tf.stack([height, width]))))
    return tf.cond(same, lambda: image, lambda: _bicubic_box(image, box, target))


def _kept_long_side(
    short: tf.Tensor, long: tf.Tensor, size: tf.Tensor, stored: StoredImages
) -> tf.Tensor:
    """How much of the longer side the pipeline kept: all of it, or with ``--out_of_bounds
    crop`` its centre within ``--max_aspect_ratio`` and the output bounds
    (``check_output_bounds``)."""
    import tensorflow as tf

    if stored.out_of_bounds != "crop":
        return long
    limit = tf.constant(float(stored.max_aspect_ratio), tf.float64)
    ratio = tf.where(long > limit * short, limit, long / short)
    longest = tf.math.floordiv(tf.constant(float(stored.max_output_pixels), tf.float64), size)
    if stored.encoding == "jpeg":
        longest = tf.minimum(longest, float(_JPEG_MAX_SIDE))
    ratio = tf.where(tf.maximum(tf.round(ratio * size), 1.0) > longest, longest / size, ratio)
    return tf.minimum(long, ratio * short)


# Pillow's 8-bit resampler keeps its weights in fixed point with this many fractional bits.
_PRECISION_BITS = 32 - 8 - 2


def _bicubic_box(image: tf.Tensor, box: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """Pillow's ``resize(target, BICUBIC, box)`` of 8-bit pixels, bit for bit: the horizontal
    pass, rounded and clipped to 8 bits, then the vertical one (``Resample.c``).

    ``box`` is ``[top, left, height, width]``, float64; ``target`` ``[height, width]``."""
    import tensorflow as tf

    shape = tf.shape(image)
    # Each pass gathers whole rows of its axis moved first: several times faster than
    # gathering along an inner axis.
    columns = _resample(_swap_axes(image), _coefficients(shape[1], box[1], box[3], target[1]))
    rows = _resample(_swap_axes(columns), _coefficients(shape[0], box[0], box[2], target[0]))
    return tf.cast(rows, tf.uint8)


def _swap_axes(pixels: tf.Tensor) -> tf.Tensor:
    """``[n, m, 3]`` 8-bit values (uint8 or int32) -> ``[m, n, 3]`` int32.

    Transposed as float32: oneDNN logs an error line for a transpose of integers on a CPU
    without AVX-512 ("supports DT_INT32 only on platforms with AVX-512"), and grappler would
    move a plain cast to float behind the transpose (a transpose of the smaller type), so the
    ``maximum``, a no-op on these values, keeps it in front.
    """
    import tensorflow as tf

    values = tf.maximum(tf.cast(pixels, tf.float32), 0.0)
    return tf.cast(tf.transpose(values, [1, 0, 2]), tf.int32)


def _keys_cubic(x: tf.Tensor) -> tf.Tensor:
    """Pillow's ``bicubic_filter``: Keys' cubic convolution with a = -0.5."""
    import tensorflow as tf

    a, x = -0.5, tf.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
    return tf.where(x < 1.0, near, tf.where(x < 2.0, far, tf.zeros_like(x)))


def _coefficients(
    in_size: tf.Tensor, start: tf.Tensor, length: tf.Tensor, out_size: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Pillow's ``precompute_coeffs`` and ``normalize_coeffs_8bpc`` for one axis: for each output
    pixel the input indices of its taps, ``[out, ksize]``, and their fixed-point weights (zero
    past the pixel's span)."""
    import tensorflow as tf

    end = start + length  # Pillow takes the box's two edges and subtracts them
    scale = (end - start) / tf.cast(out_size, tf.float64)
    filterscale = tf.maximum(scale, 1.0)
    support = 2.0 * filterscale  # the bicubic filter's support, widened when shrinking
    ksize = tf.cast(tf.math.ceil(support), tf.int32) * 2 + 1
    centers = start + (tf.cast(tf.range(out_size), tf.float64) + 0.5) * scale
    # C casts truncate toward zero, as tf.cast does.
    first = tf.maximum(tf.cast(centers - support + 0.5, tf.int32), 0)
    count = tf.minimum(tf.cast(centers + support + 0.5, tf.int32), in_size) - first
    taps = tf.range(ksize)
    index = first[:, tf.newaxis] + taps[tf.newaxis, :]
    offsets = tf.cast(index, tf.float64) - centers[:, tf.newaxis] + 0.5
    weights = _keys_cubic(offsets * (1.0 / filterscale))
    weights = tf.where(taps[tf.newaxis, :] < count[:, tf.newaxis], weights, tf.zeros_like(weights))
    weights = tf.math.divide_no_nan(weights, tf.reduce_sum(weights, axis=1, keepdims=True))
    fixed = weights * float(1 << _PRECISION_BITS)
    fixed = tf.cast(tf.where(weights < 0, fixed - 0.5, fixed + 0.5), tf.int64)
    return tf.minimum(index, in_size - 1), fixed


def _resample(pixels: tf.Tensor, coefficients: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
    """One pass of Pillow's resampler along the first axis of int32 8-bit ``[n, m, 3]`` pixels:
    a tap at a time (the memory of one output, whatever the number of taps), rounded and
    clipped to 8 bits.

    int32 holds every sum exactly, as Pillow's C ints do: a tap adds at most 255 times its
    weight of 2**22, and the positive weights of a pixel add up to less than 1.1 (the cubic's
    negative lobes take the rest), so no partial sum passes 1.2e9 < 2**31.
    """
    import tensorflow as tf

    index, fixed = coefficients
    fixed = tf.cast(fixed, tf.int32)
    out_shape = tf.concat([tf.shape(index)[:1], tf.shape(pixels)[1:]], axis=0)

    def tap(k: tf.Tensor, total: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        taken = tf.gather(pixels, index[:, k])
        return k + 1, total + taken * fixed[:, k, tf.newaxis, tf.newaxis]

    start = tf.fill(out_shape, tf.constant(1 << (_PRECISION_BITS - 1), tf.int32))
    _, total = tf.while_loop(lambda k, _: k < tf.shape(index)[1], tap, (tf.constant(0), start))
    return tf.clip_by_value(tf.bitwise.right_shift(tf.maximum(total, 0), _PRECISION_BITS), 0, 255)


def _encode_as_stored(pixels: tf.Tensor, stored: StoredImages) -> tf.Tensor:
    """The stored bytes: JPEG at the recorded quality (Pillow's defaults: 4:2:0 chroma,
    baseline), or PNG."""
    import tensorflow as tf

    if stored.encoding == "jpeg":
        return tf.io.encode_jpeg(pixels, format="rgb", quality=stored.jpeg_quality)
    return tf.io.encode_png(pixels, compression=1)
