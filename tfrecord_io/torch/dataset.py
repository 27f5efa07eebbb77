"""``ImageDataset``: a split of our dataset as a ``torch.utils.data.IterableDataset`` of batches.

Each DataLoader worker builds whole batches (``DataLoader(dataset, batch_size=None)``): the
examples of this rank's slice of one global step (``tfrecord_io.torch.order``), read by index
(``tfrecord_io.torch.records``), decoded into one uint8 array that lives in shared memory, so
the batch reaches the training process without a copy. Workers produce the steps of a pass in
turn, the order in which the DataLoader hands batches out, so the batches this rank sees are
its slices of global steps 0, 1, 2 ... whatever the number of workers.

``state_dict`` / ``load_state_dict`` follow ``torchdata``'s ``Stateful`` protocol (see
``tfrecord_io.torch.state``): ``StatefulDataLoader`` saves each worker's state with its own,
and a dataset given any saved state, of any topology, resumes at the first step not
delivered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from schemas.shard_table import split_digest
from tfrecord_io.torch.image import ImageSpec, decode_into, normalize_batch
from tfrecord_io.torch.options import LoaderConfig
from tfrecord_io.torch.order import EpochOrder, Iteration, SplitLayout, iteration
from tfrecord_io.torch.records import RecordReader, SplitFiles
from tfrecord_io.torch.state import (
    MAX_WORKERS,
    STATE_FORMAT,
    SharedProgress,
    check_compatible,
    dataset_states,
)

__all__ = ["ImageDataset"]

_log = logging.getLogger("tfrecord_io.torch")

# Salt of the per-example augmentation seeds (splitmix64 of seed, epoch and index).
_AUGMENT_SALT = 0x5EED_7041


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def augmentation_seeds(seed: int, epochs: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Per-example seeds of crops and flips: a function of (seed, epoch, example) alone, so an
    example gets the same augmentation in an epoch whichever rank or worker reads it."""
    with np.errstate(over="ignore"):
        x = _splitmix64(np.full(indices.shape, seed ^ _AUGMENT_SALT, np.uint64))
        x = _splitmix64(x ^ epochs.astype(np.uint64))
        x = _splitmix64(x ^ indices.astype(np.uint64))
    return (x >> np.uint64(1)).astype(np.int64)


class ImageDataset(IterableDataset):
    """A split of a dataset, read as batches for one rank (build it with
    ``tfrecord_io.torch.dataset``).

    Attributes:
      config: the options.
      files: the split's shard files.
      rank, world_size: this process's place among the training processes.
      batch_size: examples per batch on this rank (``global_batch_size / world_size``).
      image_spec: how each image is decoded.
      num_classes: labels are checked to be in ``[0, num_classes)``.
    """

    def __init__(
        self,
        *,
        config: LoaderConfig,
        files: SplitFiles,
        rank: int,
        world_size: int,
        image_spec: ImageSpec,
        num_classes: int,
        cache: Any = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.files = files
        self.rank, self.world_size = rank, world_size
        self.batch_size = config.global_batch_size // world_size
        self.image_spec = image_spec
        self.num_classes = num_classes
        self._cache = cache
        self.layout = SplitLayout.from_counts(files.counts)
        self._identity = {
            "split": split_digest(zip(files.files, files.counts, strict=True)),
            "seed": config.order_seed,
            "window_shards": config.window_shards,
            "training": config.training,
            "remainder": config.remainder,
        }
        if config.global_batch_size > self.layout.num_examples and config.training:
            raise ValueError(
                f"global_batch_size={config.global_batch_size} is larger than split "
                f"{files.split!r} ({self.layout.num_examples} examples): a step could not be "
                "filled without repeating examples"
            )
        self._progress = SharedProgress()
        self._progress.set_all(epoch=0, origin=0)
        self._resume_step: dict[int, tuple[int, int]] = {}  # worker -> (epoch, next step)
        self._position: dict[str, Any] | None = None
        self._reader: RecordReader | None = None
        self._orders: dict[int, EpochOrder] = {}
        self._announced: tuple[int, int] | None = None

    # -- epochs and length -------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass reads, for every worker (as ``DistributedSampler``'s); each
        pass otherwise reads the epoch after the previous one."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        origin = self._progress.origin(0)
        self._progress.set_all(epoch=epoch, origin=origin)

    @property
    def epoch(self) -> int:
        """The epoch the next pass of this process (or its first worker) reads."""
        return self._progress.next_epoch(0)

    def _iteration(self, epoch: int, origin: int) -> Iteration:
        return iteration(
            epoch=epoch,
            origin=origin,
            num_examples=self.layout.num_examples,
            global_batch=self.config.global_batch_size,
            training=self.config.training,
            remainder=self.config.remainder,
        )

    def __len__(self) -> int:
        """Batches this rank gets in the next pass."""
        plan = self._iteration(self._progress.next_epoch(0), self._progress.origin(0))
        steps = plan.num_steps
        if plan.tail:
            start, stop = plan.rank_slice(plan.stop, self.rank, self.world_size)
            steps -= start == stop
        return steps

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This process's position: in a DataLoader worker, the pass it is producing and the
        steps it has produced; elsewhere the pass it reads next (or is reading)."""
        state = {"format": STATE_FORMAT, **self._identity}
        if self._position is not None:
            return {**state, **self._position}
        epoch, origin = self._progress.next_epoch(0), self._progress.origin(0)
        plan = self._iteration(epoch, origin)
        return {
            **state,
            "epoch": epoch,
            "origin": origin,
            "global_batch": self.config.global_batch_size,
            "world_size": self.world_size,
            "workers": 0,
            "worker": 0,
            "next_step": None,
            "delivered": plan.start_position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resumes at a saved position: a state from ``state_dict``, or a whole
        ``StatefulDataLoader.state_dict()`` (any rank's; any number of ranks and workers).

        Raises:
          ValueError: if ``state`` holds no dataset state, or was taken on another split or
            order (naming what differs).
        """
        states = dataset_states(state)
        if not states:
            raise ValueError(
                "the saved state holds no tfrecord_io.torch dataset state (pass the dict that "
                "StatefulDataLoader.state_dict() or this dataset's state_dict() returned)"
            )
        for saved in states:
            check_compatible(saved, self._identity)
        info = get_worker_info()
        if info is not None and len(states) == 1 and self._continues(states[0], info):
            saved = states[0]
            self._progress.set_worker(info.id, epoch=saved["epoch"], origin=saved["origin"])
            if saved["next_step"] is not None:
                self._resume_step[info.id] = (saved["epoch"], saved["next_step"])
            return
        if info is not None:
            _log.warning(
                "resuming a DataLoader worker from one worker's state of another topology: "
                "only a lower bound of the delivered position is known (load the whole "
                "StatefulDataLoader state into the dataset before building the loader)"
            )
        epoch, delivered = self._furthest(states)
        self._progress.set_all(epoch=epoch, origin=delivered)
        self._resume_step.clear()

    def _continues(self, saved: Mapping[str, Any], info: Any) -> bool:
        """Whether ``saved`` is this worker's own state on the same topology (any rank)."""
        return (
            saved["workers"] == info.num_workers
            and saved["worker"] == info.id
            and saved["world_size"] == self.world_size
            and saved["global_batch"] == self.config.global_batch_size
        )

    def _furthest(self, states: list[dict[str, Any]]) -> tuple[int, int]:
        """The epoch to read next and the stream position delivered up to, over every part of
        a saved state."""
        best = max(states, key=lambda s: (s["delivered"], s["epoch"]))
        epoch, delivered = int(best["epoch"]), int(best["delivered"])
        plan = iteration(
            epoch=epoch,
            origin=int(best["origin"]),
            num_examples=self.layout.num_examples,
            global_batch=int(best["global_batch"]),
            training=self.config.training,
            remainder=self.config.remainder,
        )
        last = plan.stop if plan.tail else plan.stop - 1
        finished = plan.num_steps == 0 or delivered >= plan.end_of(last)
        if not finished:
            return epoch, delivered
        if not self.config.training:
            return epoch + 1, 0
        return epoch + 1, delivered

    # -- reading -------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if worker >= MAX_WORKERS:
            raise ValueError(f"at most {MAX_WORKERS} DataLoader workers, got {workers}")
        if info is not None:
            # One image at a time per worker, as torch sets its own threads in workers: OpenCV's
            # resize would otherwise start a thread per core in every worker.
            cv2.setNumThreads(1)
        epoch, origin = self._progress.next_epoch(worker), self._progress.origin(worker)
        plan = self._iteration(epoch, origin)
        resume = self._resume_step.pop(worker, None)
        resume_at = resume[1] if resume is not None and resume[0] == epoch else None
        steps = plan.worker_steps(worker, workers, resume_at)
        self._progress.set_worker(
            worker, epoch=epoch + 1, origin=origin if self.config.training else 0
        )
        self._position = {
            "epoch": epoch,
            "origin": origin,
            "global_batch": self.config.global_batch_size,
            "world_size": self.world_size,
            "workers": workers if info is not None else 0,
            "worker": worker,
            "next_step": steps.start,
            "delivered": plan.start_position,
        }
        return self._batches(plan, steps)

    def _batches(self, plan: Iteration, steps: range) -> Iterator[tuple[Any, ...]]:
        assert self._position is not None
        for step in steps:
            batch = self._batch(plan, step)
            self._position["next_step"] = step + steps.step
            self._position["delivered"] = plan.end_of(step)
            if batch is not None:
                yield batch

    def _order(self, epoch: int) -> EpochOrder:
        order = self._orders.get(epoch)
        if order is None:
            order = EpochOrder(
                self.layout,
                seed=self.config.order_seed,
                epoch=epoch,
                window_shards=self.config.window_shards,
                shuffle=self.config.training,
            )
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return order

    def _indices(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The epochs and global example indices of stream positions ``[start, stop)``."""
        n = self.layout.num_examples
        epochs, parts = [], []
        position = start
        while position < stop:
            epoch, offset = divmod(position, n)
            take = min(stop - position, n - offset)
            order = self._order(epoch)
            parts.append(order.indices(offset, offset + take))
            epochs.append(np.full(take, epoch, np.int64))
            if self._cache is not None:
                self._announce(order, offset)
            position += take
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(epochs), np.concatenate(parts)

    def _announce(self, order: EpochOrder, offset: int) -> None:
        """Asks the shard cache for this window's and the next window's shards, once a window."""
        where = (order.epoch, order.window_at(offset))
        if where != self._announced:
            self._announced = where
            self._records().announce(order.shards_of_window_at(offset))

    def _records(self) -> RecordReader:
        if self._reader is None:
            self._reader = RecordReader(
                self.files, self._cache, open_shards=2 * self.config.window_shards
            )
        return self._reader

    def _batch(self, plan: Iteration, step: int) -> tuple[Any, ...] | None:
        start, stop = plan.rank_slice(step, self.rank, self.world_size)
        if start == stop:
            return None
        epochs, indices = self._indices(start, stop)
        shards, records = self.layout.locate(indices)
        seeds = augmentation_seeds(self.config.order_seed, epochs, indices)
        size = self.image_spec.image_size
        images = _batch_buffer((len(indices), size, size, 3))
        pixels = images.numpy()
        labels = np.empty(len(indices), np.int64)
        keys: list[str] = []
        reader = self._records()
        with_key = self.config.with_keys
        for i in range(len(indices)):
            fields = reader.read(int(shards[i]), int(records[i]), with_key=with_key)
            decode_into(fields.encoded, pixels[i], seed=int(seeds[i]), spec=self.image_spec)
            labels[i] = fields.label
            keys.append(fields.key)
        labels -= self.config.label_offset
        self._check_labels(labels, shards, records)
        out: list[Any] = [self._arrange(images), torch.from_numpy(labels)]
        if self.config.with_keys:
            out.append(keys)
        if self.config.with_index:
            out.append(torch.from_numpy(indices))
        return tuple(out)

    def _arrange(self, images: torch.Tensor) -> torch.Tensor:
        if self.config.output == "float32":
            count, size = images.shape[0], images.shape[1]
            shape = (count, 3, size, size) if self.config.layout == "CHW" else tuple(images.shape)
            out = _batch_buffer(shape, torch.float32)
            return normalize_batch(images, layout=self.config.layout, out=out)
        if self.config.layout == "CHW":
            return images.permute(0, 3, 1, 2)
        return images

    def _check_labels(self, labels: np.ndarray, shards: np.ndarray, records: np.ndarray) -> None:
        bad = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"{self.files.path(int(shards[i]))}: record {int(records[i])} has label "
                f"{int(labels[i]) + self.config.label_offset}, outside [0, {self.num_classes}) "
                f"after label_offset={self.config.label_offset} (pass the offset its writer "
                "used: 1 for TensorFlow's ImageNet converters)"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # open files stay with the process that opened them
        state["_orders"] = {}
        return state


def _batch_buffer(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """A tensor for a batch: in shared memory inside a DataLoader worker, so handing it to the
    training process copies nothing. ``UntypedStorage._new_shared`` is what torch's own
    ``default_collate`` allocates worker batches with; no public call allocates shared memory
    without a copy (``share_memory_()`` copies), and a test names the change if it goes."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    count = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(count * dtype.itemsize)
    strides = torch.empty(shape, device="meta").stride()
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)
