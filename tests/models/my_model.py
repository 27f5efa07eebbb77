"""A model of your own, for ``python -m trainer.train --model tests.models.my_model:build``.

docs/training.md shows this file; tests/test_own_model.py trains it.
"""

import keras


def build(image_size: int, num_classes: int, width: int = 16) -> keras.Model:
    """A small Sequential convnet; ``--model_arg width=32`` widens it."""
    return keras.Sequential(
        [
            keras.Input((image_size, image_size, 3), dtype="uint8"),
            keras.layers.Rescaling(1 / 127.5, offset=-1),
            keras.layers.Conv2D(width, 3, strides=2, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes, dtype="float32"),  # float32 logits
        ]
    )
