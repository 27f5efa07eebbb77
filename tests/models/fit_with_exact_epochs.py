"""Keras ``model.fit`` with ``BackupAndRestore`` and ``trainer.keras_fit.ExactEpochs``:
``python -m tests.models.fit_with_exact_epochs DATA RUN_DIR EPOCHS [model_checkpoint]``
(docs/training.md shows the same lines). With ``model_checkpoint`` a
``keras.callbacks.ModelCheckpoint`` also keeps a weights file per save, named by epoch and
batch. Each trained batch waits a little, so a test can kill it mid-epoch.
"""

import logging
import sys
import time
from pathlib import Path

import keras

from tests.models.my_model import build
from trainer.keras_fit import ExactEpochs


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"trained batch {batch}", flush=True)
        time.sleep(0.3)


def main(data: str, run: Path, epochs: int, model_checkpoint: bool = False) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    exact = ExactEpochs(
        str(run / "delivered"),
        checkpoint=str(run / "backup" / "latest.weights.h5"),
        source=data,
        global_batch_size=2,
        seed=7,
        save_freq=2,
        audit=str(run / "positions"),
    )
    # The dataset first: the reader's exact epochs cannot be built under a global seed.
    dataset = exact.dataset()
    keras.utils.set_random_seed(0)
    model = build(image_size=32, num_classes=3, width=4)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    # ExactEpochs first, with the same save_freq: it saves just before the checkpoints.
    callbacks: list[keras.callbacks.Callback] = [exact]
    if model_checkpoint:
        weights = run / "checkpoints" / "model-{epoch:02d}-{batch:02d}.weights.h5"
        callbacks.append(
            keras.callbacks.ModelCheckpoint(str(weights), save_weights_only=True, save_freq=2)
        )
    callbacks.append(keras.callbacks.BackupAndRestore(str(run / "backup"), save_freq=2))
    model.fit(
        dataset,
        epochs=epochs,
        steps_per_epoch=exact.steps_per_epoch,
        callbacks=[*callbacks, Slow()],
        verbose=0,
    )
    print("fit done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["model_checkpoint"])
