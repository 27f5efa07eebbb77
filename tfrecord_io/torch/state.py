"""The torch loader's position: its saved form, and what its processes share.

**The saved state** (``ImageDataset.state_dict()``) is a small dict of integers and short
strings, the same size for any split (about 270 bytes as JSON, at a million examples or a
billion). It names the split (a digest of its shard names and record counts), the order
(seed, window, training, remainder), and the position: the epoch, the grid origin and global
batch, and how far the stream was delivered. In a DataLoader worker it also says which steps
that worker had produced, which ``StatefulDataLoader`` hands back to the same worker to
continue exactly.

**Resuming elsewhere.** Whatever saved it (``StatefulDataLoader.state_dict()`` of any rank,
whatever its number of workers, or the dataset's own ``state_dict()``), the stream position
``delivered`` is the largest of the positions its parts know were delivered: ranks step
together, and a DataLoader hands batches out in step order, so the last batch handed out is
the furthest. A dataset given that position (``load_state_dict``) starts a new grid of steps
there, with its own global batch and number of ranks and workers.

**Shared with the workers.** The epoch each worker's next pass reads and the grid origin live
in a small shared-memory array created with the dataset, so ``set_epoch`` and
``load_state_dict`` in the main process reach workers started before or after, persistent or
not, and a worker that finishes a pass moves its own slot to the next epoch.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = [
    "MAX_WORKERS",
    "STATE_FORMAT",
    "SharedProgress",
    "check_compatible",
    "dataset_states",
]

STATE_FORMAT = "tfrecord_io.torch/1"
# DataLoader workers per rank that the shared array has slots for.
MAX_WORKERS = 256
_ORDER_KEYS = ("split", "seed", "window_shards", "training", "remainder")


def check_compatible(state: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Checks a saved state orders the same examples the same way as this dataset.

    Raises:
      ValueError: naming the first field that differs (a different split, seed, window,
        mode or remainder would resume at a position in another order), or an unknown format.
    """
    if state.get("format") != STATE_FORMAT:
        raise ValueError(
            f"not a tfrecord_io.torch state: format {state.get('format')!r}, expected "
            f"{STATE_FORMAT!r}"
        )
    for key in _ORDER_KEYS:
        if state.get(key) != expected[key]:
            raise ValueError(
                f"the saved state was taken with {key}={state.get(key)!r}, this dataset reads "
                f"with {key}={expected[key]!r}: its position does not apply (pass the same "
                f"{key} to resume)"
            )


def dataset_states(saved: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every ``tfrecord_io.torch`` dataset state inside ``saved``: the state itself, or the
    dataset states a ``StatefulDataLoader.state_dict()`` holds (one per worker)."""
    found: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, Mapping):
            if value.get("format") == STATE_FORMAT:
                found.append(dict(value))
                return
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(saved)
    return found


class SharedProgress:
    """Per-worker slots, in shared memory: the epoch of the next pass and the grid origin.

    Slot ``w`` belongs to DataLoader worker ``w`` (the main process, without workers, is 0).
    Pickled while a worker process is being started, it is the same memory; pickled any other
    way, it becomes a private copy of the values.
    """

    def __init__(self, values: np.ndarray | None = None) -> None:
        self._array = multiprocessing.RawArray("q", 2 * MAX_WORKERS)
        if values is not None:
            self._view()[:] = values

    def _view(self) -> np.ndarray:
        return np.frombuffer(self._array, dtype=np.int64).reshape(2, MAX_WORKERS)

    def __reduce__(self) -> tuple[Any, ...]:
        if multiprocessing.context.get_spawning_popen() is not None:
            return (_from_shared, (self._array,))
        return (SharedProgress, (self._view().copy(),))

    def set_all(self, *, epoch: int, origin: int) -> None:
        view = self._view()
        view[0, :] = epoch
        view[1, :] = origin

    def next_epoch(self, worker: int) -> int:
        return int(self._view()[0, worker])

    def origin(self, worker: int) -> int:
        return int(self._view()[1, worker])

    def set_worker(self, worker: int, *, epoch: int, origin: int | None = None) -> None:
        view = self._view()
        view[0, worker] = epoch
        if origin is not None:
            view[1, worker] = origin

    def slots(self) -> Iterator[tuple[int, int]]:
        view = self._view()
        for worker in range(MAX_WORKERS):
            yield int(view[0, worker]), int(view[1, worker])


def _from_shared(array: Any) -> SharedProgress:
    progress = SharedProgress.__new__(SharedProgress)
    progress._array = array
    return progress
