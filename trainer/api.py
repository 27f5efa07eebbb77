"""``trainer.fit``: the trainer's loop for a model, loss and metrics of the caller's own.

It runs what ``python -m trainer.train`` runs (that command is a thin layer over ``fit``): the
per-replica batch from the global batch, linear learning-rate scaling and warm-up, mixed
precision, checkpoints holding the exact data position, resume by calling it again with the
same ``model_dir`` (on any number of workers), TensorBoard scalars that
``python -m trainer.diagnose MODEL_DIR`` reads, and evaluation on the eval split::

    import functools, keras
    from trainer import DataConfig, TrainConfig, fit

    def build(image_size, num_classes):
        return keras.Sequential([keras.Input((image_size, image_size, 3)),
                                 keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                                 keras.layers.Dense(num_classes)])

    result = fit(
        build,
        TrainConfig(model_dir="runs/a", data=DataConfig(source="out/dataset"), steps=300),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics={"top2": functools.partial(
            keras.metrics.sparse_top_k_categorical_accuracy, k=2, from_sorted_ids=False)},
    )
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trainer.config import MODELS, TrainConfig
from trainer.user_model import Objective, load_model_fn

if TYPE_CHECKING:
    from trainer.inputs import Inputs
    from trainer.loop import TrainResult
    from trainer.strategy import Distribution

__all__ = ["fit"]


def fit(
    model: str | Callable[..., Any],
    config: TrainConfig,
    *,
    loss: Any = None,
    metrics: Mapping[str, Callable[..., Any]] | None = None,
    distribution: Distribution | None = None,
    inputs: Inputs | None = None,
) -> TrainResult:
    """Trains ``model`` as ``config`` says, resuming from ``config.model_dir`` if it holds a
    checkpoint.

    Args:
      model: a function building the Keras model (``trainer.user_model``: it takes any of
        ``image_size``, ``num_classes``, ``input_dtype`` and ``config.model_args`` by
        keyword), its import path ``package.module:function``, or a built-in name.
        ``config.model`` is ignored.
      config: the run (data, batch, length, optimiser, strategy, checkpoints).
      loss: ``loss(labels, logits) -> [batch]`` per-example losses, or a
        ``keras.losses.Loss``; None is sparse categorical cross-entropy on logits.
      metrics: name -> ``fn(labels, logits) -> [batch]`` per-example values, averaged and
        written to TensorBoard beside loss and accuracy (train and validation).
      distribution: the strategy and this worker's place (``create_distribution``); None
        creates it from ``config.runtime`` (TF_CONFIG, Slurm, GPUs, ``cpu_replicas``). Create
        it before anything else touches TensorFlow's devices.
      inputs: the data; None reads ``config.data`` with the project's reader.

    Returns:
      How the run ended (``exit_code`` 128 + the signal's number when SIGTERM stopped it
      after saving a checkpoint).

    Raises:
      ValueError: if the model cannot be imported or built, does not fit the data, or a loss
        or metric does not return one value per example; or as ``run_training``.
      KeyError, FileNotFoundError: if the data has no such split, or does not exist.
      FloatingPointError: if the loss becomes NaN or infinite.
    """
    from trainer.loop import run_training

    objective = Objective(loss=loss, metrics=metrics or {})
    if isinstance(model, str):
        if model in MODELS:
            if config.model_args:
                raise ValueError(
                    f"model_args {sorted(config.model_args)} are for a model function of your "
                    f"own; the built-in {model!r} takes none"
                )
            model_fn = None
            if model != config.model:
                import dataclasses

                config = dataclasses.replace(config, model=model)
        else:
            model_fn = load_model_fn(model)  # before anything slow: a typo fails at once
    elif callable(model):
        model_fn = model
    else:
        raise TypeError(f"model must be a function or a name, got {type(model).__name__}")
    if distribution is None:
        from trainer.strategy import create_distribution

        distribution = create_distribution(
            config.runtime.strategy,
            cpu_replicas=config.runtime.cpu_replicas,
            tpu=config.runtime.tpu,
            slurm_port_base=config.runtime.slurm_port_base,
        )
    if inputs is None:
        from trainer.inputs import ReaderInputs

        inputs = ReaderInputs.from_config(
            config.data, global_batch_size=config.global_batch_size, seed=config.seed
        )
    return run_training(config, distribution, inputs, model_fn=model_fn, objective=objective)
