"""The user's own model, loss and metrics: what ``--model package.module:function`` names.

A model function builds a Keras model from what the trainer knows, by keyword::

    def build(image_size: int, num_classes: int, input_dtype: str, **model_args) -> keras.Model

It may leave out any of ``image_size``, ``num_classes`` and ``input_dtype`` it does not use,
and takes every ``--model_arg key=value`` as a keyword argument. The model maps
``[batch, image_size, image_size, 3]`` images (``input_dtype``: uint8 pixels, or float32 already
normalised) to ``[batch, num_classes]`` logits; float32 logits keep the loss at full precision
under a mixed-precision policy.

Everything is checked before the first step, with errors naming the flag that fixes it: the
import path (``--model``), the function's signature (``--model_arg``) and the model's output
(``--model``, against the dataset's number of classes).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainer.config import MODEL_IMPORT_PATH

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = [
    "Objective",
    "build_checked_model",
    "check_signature",
    "describe",
    "is_import_path",
    "load_model_fn",
    "parse_model_args",
]

_KNOWN = ("image_size", "num_classes", "input_dtype")


def is_import_path(model: str) -> bool:
    """Whether ``model`` names a function by import path rather than a built-in model."""
    return bool(MODEL_IMPORT_PATH.match(model))


def parse_model_args(pairs: Sequence[str]) -> dict[str, Any]:
    """``["width=32", "act=gelu"]`` -> ``{"width": 32, "act": "gelu"}``.

    A value is read as a Python literal (``32``, ``0.5``, ``True``, ``(3, 3)``, ``'x'``) when it
    is one, else kept as a string.

    Raises:
      ValueError: naming ``--model_arg``, for a pair without ``=``, a key that is not a Python
        identifier, or a key given twice.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise ValueError(
                f"--model_arg {pair!r} must be key=value with a Python identifier as key"
            )
        if key in out:
            raise ValueError(f"--model_arg {key} is given twice")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def load_model_fn(path: str) -> Callable[..., Any]:
    """Imports the function ``package.module:function`` names.

    Raises:
      ValueError: naming ``--model``, if the path is malformed, the module cannot be imported,
        it has no such attribute, or the attribute is not callable.
    """
    if not is_import_path(path):
        raise ValueError(
            f"--model {path!r} is neither a built-in model nor an import path "
            "package.module:function"
        )
    module_name, _, attribute = path.partition(":")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(
            f"--model {path}: cannot import module {module_name!r} ({e}); is its directory on "
            "PYTHONPATH (the current directory is, with python -m)?"
        ) from e
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise ValueError(f"--model {path}: {module_name!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not callable(value):
        raise ValueError(f"--model {path}: {attribute!r} is a {type(value).__name__}, not callable")
    return value


def _call_arguments(
    fn: Callable[..., Any], name: str, known: Mapping[str, Any], model_args: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword arguments to call ``fn`` with: the known values it accepts, and every model
    argument.

    Raises:
      ValueError: naming ``--model_arg``, if a model argument collides with a known value,
        ``fn`` does not accept one, or ``fn`` requires one that is not given.
    """
    clash = sorted(set(model_args) & set(known))
    if clash:
        raise ValueError(
            f"--model_arg {clash[0]}: the trainer passes {', '.join(_KNOWN)} itself "
            "(--image_size, the dataset's classes, the reader's dtype)"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return {**known, **model_args}  # a builtin or C function: call it and see
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    arguments = {k: v for k, v in known.items() if takes_any or k in params}
    arguments.update(model_args)
    try:
        signature.bind(**arguments)
    except TypeError as e:
        raise ValueError(
            f"--model {name}: its signature {signature} does not fit the call "
            f"{name.rsplit(':', 1)[-1]}({', '.join(f'{k}=...' for k in arguments)}): {e}. It "
            f"may take any of {', '.join(_KNOWN)}, and one keyword per --model_arg"
        ) from e
    return arguments


def check_signature(
    model_fn: Callable[..., Any], *, name: str, model_args: Mapping[str, Any] | None = None
) -> None:
    """Checks that ``model_fn`` can be called with what the trainer passes, before anything is
    read or written.

    Raises:
      ValueError: naming ``--model`` or ``--model_arg``, as ``build_checked_model``.
    """
    _call_arguments(model_fn, name, dict.fromkeys(_KNOWN), model_args or {})


def build_checked_model(
    model_fn: Callable[..., Any],
    *,
    name: str,
    image_size: int,
    num_classes: int,
    input_dtype: str,
    model_args: Mapping[str, Any] | None = None,
) -> keras.Model:
    """Calls the user's model function and checks the model on one batch of zeros.

    Call it inside ``strategy.scope()`` after setting the dtype policy; the call on the zeros
    also builds a subclassed model's variables, which the optimiser and the checkpoint need.

    Args:
      model_fn: the function (``load_model_fn``), or any callable returning a Keras model.
      name: how errors name it (the ``--model`` value).
      image_size, num_classes, input_dtype: what the trainer knows.
      model_args: the ``--model_arg`` values.

    Returns:
      The model, built.

    Raises:
      ValueError: naming the flag, if the signature does not fit, the function does not
        return a ``keras.Model``, the model fails on a batch of images, or its output is not
        ``[batch, num_classes]``.
    """
    import keras
    import numpy as np

    known = {"image_size": image_size, "num_classes": num_classes, "input_dtype": input_dtype}
    arguments = _call_arguments(model_fn, name, known, model_args or {})
    model = model_fn(**arguments)
    if not isinstance(model, keras.Model):
        raise ValueError(f"--model {name} returned a {type(model).__name__}, not a keras.Model")
    images = np.zeros([2, image_size, image_size, 3], dtype=input_dtype)
    try:
        logits = model(images, training=False)
    except Exception as e:  # whatever the user's model raises: say where
        raise ValueError(
            f"--model {name}: the model fails on a batch of {input_dtype} images "
            f"[2, {image_size}, {image_size}, 3]: {type(e).__name__}: {e}"
        ) from e
    shape = tuple(getattr(logits, "shape", ()))
    if len(shape) != 2 or shape[1] != num_classes:
        raise ValueError(
            f"--model {name}: the model's output has shape {shape}, expected (batch, "
            f"{num_classes}): one logit per class of the dataset"
        )
    return model


@dataclasses.dataclass(frozen=True)
class Objective:
    """What a step minimises and what it measures besides loss and accuracy.

    Attributes:
      loss: ``loss(labels, logits) -> [batch]`` per-example losses, or a ``keras.losses.Loss``
        (its unreduced values are used); None means sparse categorical cross-entropy on
        logits. The step averages it over the global batch, whatever the replicas.
      metrics: name -> ``fn(labels, logits) -> [batch]`` per-example values (for example
        ``functools.partial(keras.metrics.sparse_top_k_categorical_accuracy, k=2,
        from_sorted_ids=False)``); each is averaged over a logging window and over the eval
        split, and written to TensorBoard under its name.

    Raises:
      ValueError: if a metric is named like a built-in scalar, or is not callable.
    """

    loss: Any = None
    metrics: Mapping[str, Callable[..., Any]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        from trainer.metrics import EXAMPLES, TAGS

        if self.loss is not None and not callable(self.loss):
            raise ValueError(f"loss must be callable, got {type(self.loss).__name__}")
        for metric_name, fn in self.metrics.items():
            if not isinstance(metric_name, str) or not re.match(r"^\w+$", metric_name):
                raise ValueError(f"metric names must be words, got {metric_name!r}")
            if metric_name in (*TAGS, EXAMPLES):
                raise ValueError(f"metric {metric_name!r} is a scalar the trainer writes itself")
            if not callable(fn):
                raise ValueError(f"metric {metric_name!r} must be callable, got {fn!r}")
        object.__setattr__(self, "metrics", dict(self.metrics))

    @property
    def metric_names(self) -> list[str]:
        return list(self.metrics)

    def per_example_loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        """``[batch]`` float32 losses.

        Raises:
          ValueError: (while tracing) if the loss does not give one value per example.
        """
        import keras
        import tensorflow as tf

        if self.loss is None:
            values = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        elif isinstance(self.loss, keras.losses.Loss):
            values = self.loss.call(labels, logits)
        else:
            values = self.loss(labels, logits)
        values = tf.cast(values, tf.float32)
        if values.shape.rank != 1:
            raise ValueError(
                f"the loss must return one value per example (shape [batch]), got shape "
                f"{values.shape}; return the unreduced losses"
            )
        return values

    def metric_values(self, labels: tf.Tensor, logits: tf.Tensor) -> list[tf.Tensor]:
        """One ``[batch]`` float32 tensor per metric, in ``metric_names`` order.

        Raises:
          ValueError: (while tracing) if a metric does not give one value per example.
        """
        import tensorflow as tf

        out = []
        for metric_name, fn in self.metrics.items():
            values = tf.cast(fn(labels, logits), tf.float32)
            if values.shape.rank != 1:
                raise ValueError(
                    f"metric {metric_name!r} must return one value per example (shape [batch]), "
                    f"got shape {values.shape}"
                )
            out.append(values)
        return out


def describe(model_fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function, as errors and logs name it."""
    module = getattr(model_fn, "__module__", None) or "?"
    return f"{module}:{getattr(model_fn, '__qualname__', type(model_fn).__name__)}"
