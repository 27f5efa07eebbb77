"""A subclassed ``keras.Model`` (built on its first call) and functions that do not fit, for
``--model tests.models.subclassed:...``."""

import keras


class TinyNet(keras.Model):
    """Normalise, one convolution, pool, classify."""

    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__()
        self.normalise = keras.layers.Rescaling(1 / 127.5, offset=-1)
        self.conv = keras.layers.Conv2D(width, 3, strides=2, activation="relu")
        self.pool = keras.layers.GlobalAveragePooling2D()
        self.logits = keras.layers.Dense(num_classes, dtype="float32")

    def call(self, images, training=False):
        return self.logits(self.pool(self.conv(self.normalise(images))))


def build(num_classes: int, width: int = 8) -> keras.Model:
    return TinyNet(num_classes, width)


def wrong_classes(num_classes: int) -> keras.Model:
    """One logit too many: the trainer refuses it before training."""
    return TinyNet(num_classes + 1, 4)


def needs_depth(num_classes: int, depth: int) -> keras.Model:
    """Needs ``--model_arg depth=N``."""
    return TinyNet(num_classes, depth)


NOT_A_FUNCTION = 3


class Branchy(TinyNet):
    def call(self, images, training=False):
        # A Python branch on a tensor's value: fine eagerly, refused once traced.
        if keras.ops.mean(keras.ops.cast(images, "float32")) > 300.0:
            images = images // 2
        return super().call(images, training)


def branches_on_a_tensor(num_classes: int) -> keras.Model:
    """Branches in Python on a tensor: the steps, traced without AutoGraph, refuse it."""
    return Branchy(num_classes, 4)
