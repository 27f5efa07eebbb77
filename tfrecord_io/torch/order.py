"""Which example goes where: the order of an epoch and its split over ranks and workers.

Everything here is a pure function of a few integers (the split's shard record counts, the
seed, the epoch, the global batch), so every rank and every DataLoader worker computes the same
plan without talking to the others, and a resumed job, on any number of ranks, recomputes it.

* **The stream.** Epoch ``e`` orders the split's ``N`` examples (their global indices: earlier
  shards' record counts plus the position in the shard, as ``dataset.json`` lists them); the
  epochs one after another make one stream, position ``p`` being example
  ``order(p // N)[p % N]``.
* **The order of an epoch** (training): the shards in a permutation drawn from
  ``(seed, epoch)``, cut into windows of ``window_shards`` consecutive shards, and the examples
  of each window in a permutation drawn from ``(seed, epoch, window)``. Every reader of the job
  is in the same window at the same time, so a bucket dataset needs only about two windows of
  shards on local disk, and a window's examples come from all its shards at once. Evaluation
  reads the split in file order.
* **Steps.** From a grid origin ``o`` (0, or the position a job resumed at), global step ``k``
  covers stream positions ``[o + k * G, o + (k + 1) * G)`` for the global batch ``G``; rank
  ``r`` of ``W`` takes the ``r``-th slice of ``G / W``, and DataLoader worker ``w`` of ``n``
  produces the steps ``first + w``, ``first + w + n`` ... of an iteration, which is the order
  in which the DataLoader hands batches out.
* **Iterations.** One pass of the DataLoader is epoch ``e``'s steps. With ``remainder="carry"``
  (the default) they are the steps that start inside epoch ``e``: the epoch's last step is
  filled with the first examples of the next epoch's order, and the next pass starts after
  them, so no example is dropped or seen twice per epoch, every rank takes the same number of
  steps, and a pass that ended resumes at the next one on any grid. With
  ``"drop"`` each epoch starts a grid of its own and those examples are skipped, as
  ``drop_last`` does (different ones each epoch). Evaluation's last step takes the
  ``N mod G`` examples left with it, split as evenly as possible over the ranks (each rank's
  last batch holds at most ``G / W + 1`` examples), so every rank steps the same number of
  times there too.

Nothing here depends on the number of ranks or workers except the assignment of steps, which
is why a position saved on one topology resumes on another.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

__all__ = [
    "REMAINDERS",
    "EpochOrder",
    "Iteration",
    "SplitLayout",
    "iteration",
]

REMAINDERS = ("carry", "drop")

# Salts separating the seeds of the shard permutation and of the window permutations.
_SHARD_SALT = 0x7A01
_WINDOW_SALT = 0x7A02
# Window permutations an EpochOrder keeps: the one being read and the one after it.
_WINDOWS_KEPT = 2


@dataclasses.dataclass(frozen=True, eq=False)
class SplitLayout:
    """A split's record counts per shard, in file order (``dataset.json``).

    Attributes:
      counts: ``[S]`` int64, records of each shard.
      starts: ``[S]`` int64, the global index of each shard's first record.
      num_examples: ``N``, the sum of ``counts``.
    """

    counts: np.ndarray
    starts: np.ndarray
    num_examples: int

    @classmethod
    def from_counts(cls, counts: Sequence[int] | np.ndarray) -> SplitLayout:
        """The layout of shards holding ``counts`` records.

        Raises:
          ValueError: if a count is negative or the split holds no example.
        """
        array = np.asarray(counts, dtype=np.int64).reshape(-1)
        if array.size and int(array.min()) < 0:
            raise ValueError(f"shard record counts must be >= 0, got {int(array.min())}")
        starts = np.zeros_like(array)
        if array.size > 1:
            np.cumsum(array[:-1], out=starts[1:])
        total = int(array.sum())
        if total == 0:
            raise ValueError("the split holds no example")
        return cls(array, starts, total)

    @property
    def num_shards(self) -> int:
        return int(self.counts.size)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, record)`` of global example indices: two int64 arrays."""
        shards = np.searchsorted(self.starts, indices, side="right") - 1
        # Empty shards share their start with the next shard: searchsorted's "right" side
        # already lands on the last shard starting at or before the index, which holds it.
        return shards.astype(np.int64), (indices - self.starts[shards]).astype(np.int64)


def _rng(*words: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([w & 0xFFFFFFFFFFFFFFFF for w in words]))


class EpochOrder:
    """The order of one epoch's examples, computed a window at a time.

    Args:
      layout: the split.
      seed: the shuffle seed (ignored without ``shuffle``).
      epoch: the epoch number, from 0.
      window_shards: shards per window (training).
      shuffle: the training order; False reads the split in file order.
    """

    def __init__(
        self, layout: SplitLayout, *, seed: int, epoch: int, window_shards: int, shuffle: bool
    ) -> None:
        self.layout = layout
        self.epoch = epoch
        self._seed, self._epoch, self._shuffle = seed, epoch, shuffle
        self._window_shards = window_shards
        self._windows: OrderedDict[int, np.ndarray] = OrderedDict()
        if shuffle:
            self._shard_order = _rng(seed, _SHARD_SALT, epoch).permutation(layout.num_shards)
            counts = layout.counts[self._shard_order]
            num_windows = -(-layout.num_shards // window_shards)
            padded = np.zeros(num_windows * window_shards, np.int64)
            padded[: counts.size] = counts
            sizes = padded.reshape(num_windows, window_shards).sum(axis=1)
            self._window_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def indices(self, start: int, stop: int) -> np.ndarray:
        """The global indices at epoch offsets ``[start, stop)``: ``[stop - start]`` int64.

        Raises:
          ValueError: if the range is not inside the epoch.
        """
        n = self.layout.num_examples
        if not 0 <= start <= stop <= n:
            raise ValueError(f"epoch offsets [{start}, {stop}) are outside [0, {n})")
        if not self._shuffle:
            return np.arange(start, stop, dtype=np.int64)
        out = np.empty(stop - start, np.int64)
        first = int(np.searchsorted(self._window_starts, start, side="right")) - 1
        filled, window = 0, first
        while filled < out.size:
            lo = int(self._window_starts[window])
            members = self._window(window)
            take = members[start + filled - lo : stop - lo]
            out[filled : filled + take.size] = take
            filled += take.size
            window += 1
        return out

    def window_at(self, offset: int) -> int:
        """The window holding epoch offset ``offset`` (evaluation: its shard)."""
        if not self._shuffle:
            return int(self.layout.locate(np.array([offset]))[0][0])
        return int(np.searchsorted(self._window_starts, offset, side="right")) - 1

    def shards_of_window_at(self, offset: int) -> np.ndarray:
        """The shards (file-order numbers) of the window holding epoch offset ``offset`` and of
        the window after it, in the order they are read: what to fetch ahead."""
        window = self.window_at(offset)
        if not self._shuffle:
            return np.arange(window, min(window + 2, self.layout.num_shards), dtype=np.int64)
        k = self._window_shards
        return self._shard_order[window * k : (window + 2) * k]

    def _window(self, window: int) -> np.ndarray:
        """The global indices of ``window``'s examples in their shuffled order."""
        cached = self._windows.get(window)
        if cached is not None:
            self._windows.move_to_end(window)
            return cached
        k = self._window_shards
        shards = self._shard_order[window * k : (window + 1) * k]
        members = np.concatenate(
            [
                np.arange(s, s + c, dtype=np.int64)
                for s, c in zip(self.layout.starts[shards], self.layout.counts[shards], strict=True)
            ]
        )
        members = members[
            _rng(self._seed, _WINDOW_SALT, self._epoch, window).permutation(members.size)
        ]
        self._windows[window] = members
        while len(self._windows) > _WINDOWS_KEPT:
            self._windows.popitem(last=False)
        return members


@dataclasses.dataclass(frozen=True)
class Iteration:
    """One pass of the DataLoader over epoch ``epoch``: its global steps, on one grid.

    Step ``k`` (``first <= k < stop``) covers stream positions
    ``[origin + k * global_batch, origin + (k + 1) * global_batch)``; in evaluation a last
    step ``stop`` may cover another number, ``tail``, split evenly over the ranks.

    Attributes:
      epoch: the epoch this pass belongs to.
      origin: the grid origin, a stream position.
      global_batch: ``G``.
      first, stop: the full steps of this pass.
      tail: examples of an uneven last step (evaluation), else 0.
    """

    epoch: int
    origin: int
    global_batch: int
    first: int
    stop: int
    tail: int = 0

    @property
    def num_steps(self) -> int:
        """Steps of this pass, the tail one included."""
        return max(0, self.stop - self.first) + (1 if self.tail else 0)

    def step_start(self, step: int) -> int:
        """The stream position where ``step`` starts."""
        return self.origin + step * self.global_batch

    @property
    def start_position(self) -> int:
        """The stream position at which this pass starts: everything before it is behind."""
        return self.step_start(self.first)

    def end_of(self, step: int) -> int:
        """The stream position just after ``step``: everything before it was delivered once
        this step was."""
        if self.tail and step == self.stop:
            return self.step_start(step) + self.tail
        return self.step_start(step + 1)

    def rank_slice(self, step: int, rank: int, world: int) -> tuple[int, int]:
        """The stream positions ``[start, stop)`` of ``rank``'s share of ``step``."""
        start = self.step_start(step)
        if self.tail and step == self.stop:
            return start + rank * self.tail // world, start + (rank + 1) * self.tail // world
        per_rank = self.global_batch // world
        return start + rank * per_rank, start + (rank + 1) * per_rank

    def worker_steps(self, worker: int, workers: int, resume_at: int | None = None) -> range:
        """The steps DataLoader worker ``worker`` of ``workers`` produces, in order: every
        ``workers``-th from ``first + worker`` (from ``resume_at`` when given, which must be one
        of them)."""
        last = self.stop + (1 if self.tail else 0)
        begin = self.first + worker if resume_at is None else resume_at
        return range(begin, max(begin, last), workers)


def iteration(
    *,
    epoch: int,
    origin: int,
    num_examples: int,
    global_batch: int,
    training: bool,
    remainder: str = "carry",
) -> Iteration:
    """The steps of epoch ``epoch``'s pass on the grid from ``origin``.

    Args:
      epoch: the epoch, from 0.
      origin: where the grid starts (a stream position; 0 for a job that never resumed on
        another global batch).
      num_examples: ``N``.
      global_batch: ``G``.
      training: training passes (``remainder`` applies); False gives evaluation's single pass
        over ``[origin, N)``, whose last step takes the examples left.
      remainder: ``"carry"`` or ``"drop"`` (see the module docstring).

    Raises:
      ValueError: on a remainder policy not in ``REMAINDERS``.
    """
    if remainder not in REMAINDERS:
        raise ValueError(f"remainder must be one of {REMAINDERS}, got {remainder!r}")
    n, g = num_examples, global_batch
    if not training:
        full, rest = divmod(max(0, n - origin), g)
        if rest and full:  # the last full step takes the rest: no rank goes without
            return Iteration(epoch, origin, g, 0, full - 1, g + rest)
        return Iteration(epoch, origin, g, 0, full, rest)
    begin, end = epoch * n, (epoch + 1) * n
    if remainder == "drop":
        grid = max(origin, begin)
        return Iteration(epoch, grid, g, 0, max(0, (end - grid) // g))
    # carry: the steps that start in [begin, end); the last one ends in the next epoch's order.
    first = -(-(begin - origin) // g) if begin > origin else 0
    stop = -(-(end - origin) // g) if end > origin else 0
    return Iteration(epoch, origin, g, first, max(first, stop))
