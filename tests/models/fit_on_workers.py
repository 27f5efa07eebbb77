"""Keras ``model.fit`` on several workers (``MultiWorkerMirroredStrategy``, ``TF_CONFIG``) with
``BackupAndRestore`` and ``trainer.keras_fit.ExactEpochs``:
``python -m tests.models.fit_on_workers DATA RUN_DIR EPOCHS`` on each worker
(docs/training.md shows the same lines). Each worker keeps its own backup and delivered sets
under ``RUN_DIR/worker-K``: Keras' ``BackupAndRestore`` writes to one directory per worker.
Each trained batch waits a little, so a test can kill it mid-epoch.
"""

import logging
import sys
import time
from pathlib import Path

import keras
import tensorflow as tf

from tests.models.my_model import build
from trainer.keras_fit import ExactEpochs


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        print(f"trained batch {batch}", flush=True)
        time.sleep(0.3)


def main(data: str, run: Path, epochs: int) -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tensorflow").setLevel(logging.WARNING)  # a line per collective
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    own = run / f"worker-{strategy.cluster_resolver.task_id}"
    exact = ExactEpochs(
        str(own / "delivered"),
        checkpoint=str(own / "backup" / "latest.weights.h5"),
        source=data,
        global_batch_size=2,
        seed=7,
        save_freq=2,
        audit=str(own / "positions"),
        strategy=strategy,
    )
    # The dataset first: the reader's exact epochs cannot be built under a global seed.
    dataset = exact.dataset()
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = build(image_size=32, num_classes=3, width=4)
        model.compile(
            optimizer=keras.optimizers.SGD(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        exact.attach(model)  # after compile, before fit, under the scope
        backup = keras.callbacks.BackupAndRestore(str(own / "backup"), save_freq=2)
        model.fit(
            dataset,
            epochs=epochs,
            steps_per_epoch=exact.steps_per_epoch,
            callbacks=[exact, backup, Slow()],  # ExactEpochs first, the same save_freq
            verbose=0,
        )
    print("fit done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
