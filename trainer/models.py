"""Keras models the trainer can build, randomly initialised.

By default a model takes uint8 images and normalises them itself, on the accelerator: the host
only moves bytes, which is the cheapest thing it can do (float32 inputs, normalised by the input
pipeline, are accepted too). The classifier returns float32 logits even
under a mixed-precision policy, so the loss is computed at full precision.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.config import MODELS

if TYPE_CHECKING:
    import keras

__all__ = ["build_model"]


def _normalised_input(
    image_size: int, input_dtype: str
) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    import keras

    inputs = keras.Input(shape=(image_size, image_size, 3), dtype=input_dtype, name="image")
    if input_dtype == "uint8":
        # Rescaling casts to the policy's compute dtype before scaling: [0, 255] -> [-1, 1].
        return inputs, keras.layers.Rescaling(1.0 / 127.5, offset=-1.0, name="normalise")(inputs)
    # Already normalised on the host (the reader's output="float32", or another pipeline).
    return inputs, keras.layers.Identity(name="normalised")(inputs)


def _small_cnn(image_size: int, num_classes: int, input_dtype: str) -> keras.Model:
    """Four strided conv blocks and a linear classifier: about 0.1 M parameters.

    Small enough to train on a CPU in a test, deep enough to tell colours and patterns apart.
    """
    import keras

    inputs, x = _normalised_input(image_size, input_dtype)
    for i, filters in enumerate((16, 32, 64, 128)):
        x = keras.layers.Conv2D(
            filters, 3, strides=2, padding="same", use_bias=False, name=f"conv{i}"
        )(x)
        x = keras.layers.BatchNormalization(name=f"bn{i}")(x)
        x = keras.layers.ReLU(name=f"relu{i}")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def _resnet50(image_size: int, num_classes: int, input_dtype: str) -> keras.Model:
    import keras

    inputs, x = _normalised_input(image_size, input_dtype)
    backbone = keras.applications.ResNet50(
        include_top=False,
        weights=None,
        input_shape=(image_size, image_size, 3),
        pooling="avg",
    )
    x = backbone(x)
    outputs = keras.layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet50")


def build_model(
    name: str, *, num_classes: int, image_size: int, input_dtype: str = "uint8"
) -> keras.Model:
    """Builds a model that maps ``[batch, size, size, 3]`` images to float32 logits.

    Call it inside ``strategy.scope()`` and after setting the dtype policy.

    Args:
      name: one of ``MODELS``.
      num_classes: width of the logits.
      image_size: side of the square input.
      input_dtype: ``uint8`` pixels, normalised by the model, or ``float32`` pixels already
        normalised by the input pipeline.

    Returns:
      An uncompiled ``keras.Model`` with random weights.

    Raises:
      ValueError: for an unknown name, fewer than 2 classes, or an image too small for the
        model (ResNet50 needs at least 32 pixels).
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    if input_dtype not in ("uint8", "float32"):
        raise ValueError(f"input_dtype must be 'uint8' or 'float32', got {input_dtype!r}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if name == "resnet50":
        if image_size < 32:
            raise ValueError(f"resnet50 needs image_size >= 32, got {image_size}")
        return _resnet50(image_size, num_classes, input_dtype)
    if image_size < 8:
        raise ValueError(f"small_cnn needs image_size >= 8, got {image_size}")
    return _small_cnn(image_size, num_classes, input_dtype)
